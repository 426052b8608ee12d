"""Property-based tests of helpers.cost_model: units, bytes, times, steps and knees agree."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.cost_model import (
    comm_bytes,
    comm_time,
    comm_units,
    compute_bound_tokens,
    flops_per_token,
    knee_tokens,
    peak_flops,
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
def test_units_follow_the_table(strategy, remat, reduce_scatter):
    u = comm_units(strategy, remat=remat, reduce_scatter=reduce_scatter)
    if strategy == "dp":
        assert (u.forward, u.backward) == (0, 2)
    else:
        assert u.forward == 1
        assert u.backward == 1 + remat + (not reduce_scatter)


@given(strategies, st.integers(1, 10**10), counts, wire, links, st.booleans())
def test_bytes_are_units_times_one_ring_and_time_is_bytes_over_bandwidth(s, p, n, b, w, remat):
    unit = p * b * (n - 1) / n
    sent = comm_bytes(s, p, n, b, remat=remat)
    units = comm_units(s, remat=remat)
    assert sent.forward == pytest.approx(units.forward * unit)
    assert sent.backward == pytest.approx(units.backward * unit)
    t = comm_time(s, p, n, w, b, remat=remat)
    assert t.total * w == pytest.approx(sent.total)
    if n == 1:
        assert sent.total == 0


@given(models, st.booleans())
def test_flops_per_token_are_6_per_parameter_or_8_with_remat(cfg, remat):
    f = flops_per_token(cfg, remat=remat)
    assert f.forward == pytest.approx(2 * cfg.params)
    assert f.backward == pytest.approx((6 if remat else 4) * cfg.params)


@given(models, strategies, counts, rates, links, wire, st.booleans(), st.floats(1, 10**7))
def test_a_step_lies_between_full_overlap_and_none(cfg, s, n, c, w, b, remat, tokens):
    step = step_cost(cfg, s, n, c, w, b, tokens=tokens, remat=remat)
    lower = max(step.compute.total, step.comm.total)
    assert lower * (1 - 1e-9) <= step.step_s <= step.serial_s * (1 + 1e-9)
    if step.compute_bound:
        assert step.step_s == pytest.approx(step.compute.total)


@given(models, strategies, st.integers(2, 4096), rates, links, wire, st.booleans())
def test_the_knee_is_where_the_step_stops_waiting(cfg, s, n, c, w, b, remat):
    knee = knee_tokens(cfg, s, n, c, w, b, remat=remat)
    assert knee > 0
    above = step_cost(cfg, s, n, c, w, b, tokens=knee * 1.001, remat=remat)
    below = step_cost(cfg, s, n, c, w, b, tokens=knee * 0.999, remat=remat)
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


@given(st.text(max_size=8).filter(lambda s: s not in ("dp", "fsdp", "fsdp_all")))
def test_strategies_without_a_cost_model_are_refused_by_name(strategy):
    with pytest.raises(ValueError, match="no cost model for strategy"):
        comm_units(strategy)
