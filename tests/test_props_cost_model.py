"""Property-based tests of helpers.measuring.cost_model: units, bytes, times, steps and knees agree."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.measuring.cost_model import (
    NCCL_RING_LATENCY,
    Network,
    comm_bytes,
    comm_time,
    comm_units,
    compute_bound_tokens,
    flops_per_token,
    knee_tokens,
    optimizer_bytes,
    peak_flops,
    ring_time,
    step_cost,
)


@dataclass(frozen=True)
class Sized:
    """A model whose parameters are all matmul parameters (what the scaling book assumes)."""

    params: int
    batch: int = 8
    seq: int = 128

    def param_count(self) -> int:
        return self.params

    def train_flops_per_step(self) -> float:
        return 6.0 * self.batch * self.seq * self.params


strategies = st.sampled_from(["dp", "fsdp", "fsdp_all"])
models = st.builds(Sized, st.integers(1, 10**10), st.integers(1, 64), st.integers(1, 4096))
counts = st.integers(1, 4096)
rates = st.floats(1e9, 1e16)
links = st.floats(1e8, 1e13)
wire = st.sampled_from([2, 4])


@given(strategies, st.booleans(), st.booleans())
def test_units_follow_the_table(strategy, keep, reduce_scatter):
    u = comm_units(strategy, keep_gathered=keep, reduce_scatter=reduce_scatter)
    if strategy == "dp":
        assert (u.forward, u.backward) == (0, 2)
    else:
        assert u.forward == 1
        assert u.backward == 1 + (not keep) + (not reduce_scatter)


@given(strategies, st.integers(1, 10**10), counts, wire, links, st.booleans())
def test_bytes_are_units_times_one_ring_and_time_is_bytes_over_bandwidth(s, p, n, b, w, keep):
    unit = p * b * (n - 1) / n
    sent = comm_bytes(s, p, n, b, keep_gathered=keep)
    units = comm_units(s, keep_gathered=keep)
    assert sent.forward == pytest.approx(units.forward * unit)
    assert sent.backward == pytest.approx(units.backward * unit)
    t = comm_time(s, p, n, w, b, keep_gathered=keep)
    assert t.total * w == pytest.approx(sent.total)
    if n == 1:
        assert sent.total == 0


@given(models, st.booleans())
def test_flops_per_token_are_6_per_parameter_or_8_with_remat(cfg, remat):
    f = flops_per_token(cfg, remat=remat)
    assert f.forward == pytest.approx(2 * cfg.params)
    assert f.backward == pytest.approx((6 if remat else 4) * cfg.params)


@given(
    models, strategies, counts, rates, links, wire, st.booleans(), st.booleans(), st.floats(1, 1e7)
)
def test_a_step_lies_between_full_overlap_and_none(cfg, s, n, c, w, b, remat, keep, tokens):
    step = step_cost(cfg, s, n, c, w, b, tokens=tokens, remat=remat, keep_gathered=keep)
    lower = max(step.compute.total, step.comm.total)
    assert lower * (1 - 1e-9) <= step.step_s <= step.serial_s * (1 + 1e-9)
    if step.compute_bound:
        assert step.step_s == pytest.approx(step.compute.total)


@given(models, strategies, st.integers(2, 4096), rates, links, wire, st.booleans(), st.booleans())
def test_the_knee_is_where_the_step_stops_waiting(cfg, s, n, c, w, b, remat, keep):
    kw = {"remat": remat, "keep_gathered": keep}
    knee = knee_tokens(cfg, s, n, c, w, b, **kw)
    assert knee > 0
    above = step_cost(cfg, s, n, c, w, b, tokens=knee * 1.001, **kw)
    below = step_cost(cfg, s, n, c, w, b, tokens=knee * 0.999, **kw)
    assert above.compute_bound and not below.compute_bound


@given(models, st.sampled_from(["dp", "fsdp"]), rates, links)
def test_the_scaling_book_rule_is_the_knee_for_bf16_on_many_devices(cfg, s, c, w):
    n = 10**6  # (N-1)/N -> 1
    assert knee_tokens(cfg, s, n, c, w, 2) == pytest.approx(compute_bound_tokens(c, w), rel=1e-5)


@given(st.text(max_size=12), st.text(max_size=12))
def test_peak_flops_knows_only_listed_devices(prefix, suffix):
    for name, peak in (("H100", 989e12), ("A100", 312e12)):
        got = peak_flops(f"NVIDIA {name} 80GB")
        assert got is not None and got[1] == peak
    kind = prefix + suffix
    found = peak_flops(kind)
    if found is not None:
        assert found[1] > 0 and isinstance(found[0], str)


@given(st.text(max_size=8).filter(lambda s: s not in ("dp", "fsdp", "fsdp_all", "hsdp")))
def test_strategies_without_a_cost_model_are_refused_by_name(strategy):
    with pytest.raises(ValueError, match="no cost model for strategy"):
        comm_units(strategy)


# --- two tiers, HSDP, latency, the optimizer step -------------------------------------

kinds = st.sampled_from(["all-gather", "reduce-scatter", "all-reduce"])
nodes = st.integers(1, 64)
per_node = st.sampled_from([1, 2, 4, 8])
sizes = st.floats(0, 1e12)


@st.composite
def networks(draw):
    cross = draw(st.sampled_from(["hierarchical", "flat"]))
    return Network(draw(links), draw(links), draw(per_node), NCCL_RING_LATENCY, cross)


@given(kinds, sizes, nodes, networks())
def test_a_flat_ring_never_leaves_a_node_faster_than_a_hierarchical_one(kind, nbytes, m, net):
    n = m * net.gpus_per_node
    flat = ring_time(kind, nbytes, n, net._replace(cross_node="flat"))
    hier = ring_time(kind, nbytes, n, net._replace(cross_node="hierarchical"))
    assert flat >= hier * (1 - 1e-9)


@given(kinds, sizes, nodes, networks())
def test_two_tiers_are_never_faster_than_either_tier_alone(kind, nbytes, m, net):
    n = m * net.gpus_per_node
    both = ring_time(kind, nbytes, n, net)
    # the node's own ring (NVLink only, same latency) ...
    inside = ring_time(kind, nbytes, net.gpus_per_node, net._replace(node_bw=None))
    # ... and the cross-node ring alone (one GPU per node, NICs only)
    across = ring_time(kind, nbytes, m, Network(float("inf"), net.node_bw, 1, (0, 0, 0)))
    if net.cross_node == "flat":  # one ring through all n GPUs: (n-1)/n out of each node
        across *= (n - 1) / n * m / (m - 1) if m > 1 else 1
    assert both >= inside * (1 - 1e-9) and both >= across * (1 - 1e-9)
    # without latency, it is exactly the slower of the two
    bare = net._replace(latency=(0.0, 0.0, 0.0))
    inside0 = ring_time(kind, nbytes, net.gpus_per_node, bare._replace(node_bw=None))
    assert ring_time(kind, nbytes, n, bare) == pytest.approx(max(inside0, across), rel=1e-12)


@given(kinds, st.integers(2, 64), networks())
def test_latency_vanishes_as_the_message_grows(kind, m, net):
    n = m * net.gpus_per_node
    bare = net._replace(latency=(0.0, 0.0, 0.0))
    ratios = [ring_time(kind, b, n, net) / ring_time(kind, b, n, bare) for b in (1e3, 1e9, 1e15)]
    assert ratios[0] >= ratios[1] >= ratios[2] >= 1
    assert ratios[2] == pytest.approx(1, rel=1e-3)
    # and a tiny message is never free
    assert ring_time(kind, 1.0, n, net) >= NCCL_RING_LATENCY[0]


@given(models, nodes, networks(), wire, st.booleans())
def test_hsdp_sends_no_more_across_nodes_than_fsdp_and_equals_it_inside_a_node(
    cfg, m, net, b, keep
):
    bare = net._replace(latency=(0.0, 0.0, 0.0))
    one_node = comm_time("hsdp", cfg.params, net.gpus_per_node, bare, b, keep_gathered=keep)
    fsdp = comm_time("fsdp", cfg.params, net.gpus_per_node, bare, b, keep_gathered=keep)
    assert one_node.forward == pytest.approx(fsdp.forward)
    assert one_node.backward == pytest.approx(fsdp.backward)
    n = m * net.gpus_per_node
    # HSDP's forward gather stays on NVLink, so it is never slower than FSDP's
    h = comm_time("hsdp", cfg.params, n, bare, b, keep_gathered=keep)
    f = comm_time("fsdp", cfg.params, n, bare, b, keep_gathered=keep)
    assert h.forward <= f.forward * (1 + 1e-9)


@given(st.sampled_from(["dp", "fsdp", "hsdp"]), st.integers(0, 10**10), nodes, per_node)
def test_optimizer_traffic_is_dp_over_the_shard_count(s, p, m, g):
    net = Network(1e9, 1e9, g)
    n = m * g
    dp = optimizer_bytes("dp", p, n, net)
    assert dp == 28 * p
    shard = {"dp": 1, "fsdp": n, "hsdp": g}[s]
    assert optimizer_bytes(s, p, n, net) == pytest.approx(dp / shard)


@given(models, st.sampled_from(["dp", "fsdp", "hsdp"]), nodes, rates, networks(), wire)
def test_the_knee_with_two_tiers_and_latency_is_still_where_the_step_stops_waiting(
    cfg, s, m, c, net, b
):
    n = m * net.gpus_per_node
    knee = knee_tokens(cfg, s, n, c, net, b)
    if n == 1:
        assert knee == 0
        return
    above = step_cost(cfg, s, n, c, net, b, tokens=knee * 1.001)
    below = step_cost(cfg, s, n, c, net, b, tokens=knee * 0.999)
    assert above.compute_bound and not below.compute_bound
