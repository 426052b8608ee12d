"""One cost model: the planner prices every collective with helpers.measuring.cost_model's two
tiers, places the inner axes inside a node, and gives notebook 04's projection's step time
for the same layout."""

from __future__ import annotations

import dataclasses
import math

import pytest

from helpers.measuring import cost_model as cm
from helpers.planning.estimate import in_node_counts, node_counts
from helpers.planning.hardware import HARDWARE, Hardware, hardware_with
from helpers.planning.models import spec_of_series_model
from helpers.planning.plan import plan_model

BOOK = cm.Network(450e9, 400e9, 8)  # the scaling book's H100 node, no latency


def test_group_network_gives_a_group_its_share_of_the_nics() -> None:
    assert cm.group_network(BOOK, 8) == BOOK
    one = cm.group_network(BOOK, 1)  # one member per node: that GPU's NIC
    assert one.node_bw == 50e9 and one.gpus_per_node == 1
    assert cm.group_network(cm.Network(1e9), 3) == cm.Network(1e9)  # one tier: unchanged
    with pytest.raises(ValueError, match="per_node"):
        cm.group_network(BOOK, 0)


def test_all_to_all_matches_the_scaling_books_counts() -> None:
    """GPU chapter, 'AllToAlls': B (N-1) / (W N^2) in a node, B (M-1) / (M^2 W_node) across."""
    b = 8e9  # bytes over all devices
    assert cm.all_to_all_time(b / 8, 8, BOOK) == pytest.approx(b * 7 / (450e9 * 64))
    assert cm.all_to_all_time(b / 16, 16, BOOK) == pytest.approx(b * 1 / (4 * 400e9))
    assert cm.all_to_all_time(1e9, 1, BOOK) == 0.0


def test_moe_dispatch_sends_a_token_once_per_node() -> None:
    copy = 1e9  # one copy of a device's tokens
    plain = cm.moe_all_to_all_time(copy, 8, 64, BOOK, dedup=False)
    random = cm.moe_all_to_all_time(copy, 8, 64, BOOK)
    one_node = cm.moe_all_to_all_time(copy, 8, 64, BOOK, nodes_per_token=1)
    assert plain > random > one_node
    assert one_node == pytest.approx(copy * 7 / 8 / 50e9)  # (M-1)/M of one copy per NIC
    assert random == pytest.approx(copy * 7 * (1 - (7 / 8) ** 8) / 50e9)
    inside = cm.moe_all_to_all_time(copy, 2, 8, BOOK)
    assert inside == pytest.approx(cm.all_to_all_time(2 * copy, 8, BOOK))


def test_send_time_crosses_on_one_nic() -> None:
    assert cm.send_time(50e9, BOOK, across_nodes=True) == pytest.approx(1.0)
    assert cm.send_time(450e9, BOOK) == pytest.approx(1.0)


def test_the_inner_axes_sit_inside_a_node_and_the_planner_names_the_one_that_crosses() -> None:
    deg = {"pp": 2, "dp": 4, "ep": 1, "cp": 1, "tp": 2}
    assert in_node_counts(deg, 8) == {"tp": 2, "cp": 1, "ep": 1, "dp": 4, "pp": 1}
    p = plan_model("llama3-70b", tp=2, dp=4, pp=2, zero=1, grad_accum=8)
    assert p.crossing_axes == ["pp"]
    q = plan_model("llama3-70b", tp=8, dp=4, zero=3, grad_accum=8)
    assert q.crossing_axes == ["dp"]
    assert plan_model("llama3-8b", tp=8).crossing_axes == []


def test_groups_sit_where_a_launcher_puts_their_ranks() -> None:
    """Ranks fill nodes in order: a group of consecutive ranks fits in a node unless it
    straddles one; otherwise each node holds as many members as its ranks."""
    one = {"pp": 1, "dp": 6, "ep": 1, "cp": 1, "tp": 1}
    assert node_counts(one, ("dp",), 8) == {(6,)} and in_node_counts(one, 8)["dp"] == 6
    two = {"pp": 2, "dp": 6, "ep": 1, "cp": 1, "tp": 1}  # ranks 0-5 and 6-11
    assert node_counts(two, ("dp",), 8) == {(6,), (4, 2)} and in_node_counts(two, 8)["dp"] == 2
    odd = {"pp": 1, "dp": 63, "ep": 1, "cp": 1, "tp": 1}  # 7 full nodes and one of 7
    assert node_counts(odd, ("dp",), 8) == {(8,) * 7 + (7,)}
    strided = {"pp": 2, "dp": 8, "ep": 1, "cp": 1, "tp": 4}  # dp's stride is tp's 4
    assert node_counts(strided, ("dp",), 8) == {(2, 2, 2, 2)}
    assert node_counts(strided, ("dp", "tp"), 8) == {(8, 8, 8, 8)}


def test_six_gpus_of_one_node_do_not_cross_nodes() -> None:
    """A data-parallel group of 6 inside one 8-GPU node runs on NVLink: its optimistic MFU lies
    between dp 4's and dp 8's, and no note says it crosses."""
    mfu = {d: plan_model("llama3-8b", dp=d, zero=3) for d in (4, 6, 8)}
    assert mfu[6].crossing_axes == [] and not any("cross" in n for n in mfu[6].notes)
    assert mfu[4].mfu < mfu[6].mfu < mfu[8].mfu
    assert mfu[6].exposed_seconds_per_step.get("dp", 0.0) == 0.0


def test_63_gpus_are_priced_as_8_nodes_not_63() -> None:
    """dp 63 fills 7 nodes and 7 GPUs of an eighth: its ring runs on the 7 NICs of the
    least-filled node, about as fast as dp 64's, not on one NIC per rank."""
    no_latency = dataclasses.replace(HARDWARE["h100"], latency=(0.0, 0.0, 0.0))
    p63 = plan_model("llama3-8b", no_latency, dp=63, zero=0)
    nics = 2 * p63.n_params * 2 * 62 / 63 / (400e9 * 7 / 8)  # the all-reduce on 7 NICs
    assert p63.comm_seconds_per_step["dp"] == pytest.approx(nics, rel=0.01)
    p64 = plan_model("llama3-8b", no_latency, dp=64, zero=0)
    assert p63.comm_seconds_per_step["dp"] < 1.2 * p64.comm_seconds_per_step["dp"]
    a = plan_model("llama3-70b", gpus=63, dp=63, zero=3, remat="full", global_batch=315)
    b = plan_model("llama3-70b", gpus=64, dp=64, zero=3, remat="full", global_batch=320)
    assert a.mfu == pytest.approx(b.mfu, rel=0.05)


def test_a_crossing_axis_runs_at_node_egress_not_one_nic() -> None:
    """Issue 39, item 1: a DP ring over 2 x 8 H100s, the whole node's 400 GB/s."""
    no_latency = dataclasses.replace(HARDWARE["h100"], latency=(0.0, 0.0, 0.0))
    p = plan_model("llama3-8b", no_latency, dp=16, zero=0)
    n, local = 16, p.n_params * 2  # bf16 gradients, every parameter on every device
    flat = 2 * local * (n - 1) / n / 400e9  # one ring through 16 GPUs (NCCL), the NICs bind
    assert p.comm_seconds_per_step["dp"] == pytest.approx(flat, rel=0.01)


def test_the_planner_and_notebook_04s_projection_give_the_same_step() -> None:
    """One source per number: DP and FSDP on 16 H100s of the profile's Transformer preset,
    planned with notebook 04's assumptions (every FLOP at one rate, the whole score matrix,
    no memory-bound kernels), take the time ``cost_model.step_cost`` projects."""
    from helpers.measuring.workload import MODEL_PRESETS

    cfg = MODEL_PRESETS["transformer"]["gpu"]
    spec = spec_of_series_model(cfg)
    rate = 989e12
    hw = Hardware("H100 at one rate", rate, 80e9, cm.NVLINK4, 8, cm.DGX_H100_NODE, "test",
                  matmul_flops=rate, hbm_bw=cm.HBM_BANDWIDTH["H100 SXM"],
                  cross_node="hierarchical")  # fmt: skip
    for strategy, zero, keep in (("dp", 0, False), ("fsdp", 3, True), ("fsdp", 3, False)):
        plan = plan_model(
            spec, hw, dp=16, zero=zero, keep_gathered=keep, precision="f32", seq=cfg.seq,
            micro_batch=cfg.batch, flash_attention=False, causal=False, elementwise=False,
            vocab_multiple=1,
        )  # fmt: skip
        projected = cm.step_cost(
            cfg, strategy, 16, rate, cm.DGX_H100, 4, keep_gathered=keep,
            hbm_bandwidth=cm.HBM_BANDWIDTH["H100 SXM"], n_ops=cfg.n_layers,
        )  # fmt: skip
        assert plan.step_time_s == pytest.approx(float(projected.step_s), rel=1e-9), strategy


def test_the_default_cross_node_model_is_nccls_flat_ring() -> None:
    assert HARDWARE["h100"].cross_node == "flat"
    no_latency = dataclasses.replace(HARDWARE["h100"], latency=(0.0, 0.0, 0.0))
    flat = plan_model("llama3-8b", no_latency, dp=16).comm_seconds_per_step["dp"]
    book = plan_model(
        "llama3-8b", hardware_with(no_latency, cross_node="hierarchical"), dp=16
    ).comm_seconds_per_step["dp"]
    # 2 nodes: NVLink's 7/8 / 450 GB/s binds the book's model; the flat ring's 15/16 / 400
    assert flat / book == pytest.approx((15 / 16 / 400e9) / (7 / 8 / 450e9), rel=0.01)


def test_a_tpu_pod_is_one_tier() -> None:
    p = plan_model("llama3-8b", "tpu-v5p", dp=256, zero=3)
    assert p.crossing_axes == []
    # a group whose size does not divide the pod's 8,960 chips crosses nothing either
    # (the scaling book's LLaMA-3-70B layout: 1024-way data x 2-way sequence x 4-way TP)
    book = plan_model("llama3-70b", "tpu-v5p", dp=1024, cp=2, tp=4, zero=3, global_batch=1024)
    assert book.crossing_axes == [] and not any("cross" in n for n in book.notes)
    v5e = dataclasses.replace(HARDWARE["tpu-v5e"])
    assert v5e.node_bw is None and math.isclose(v5e.link_bw, 9e10)
