"""Latency per collective as the frameworks issue them (issue 53, "Latency at scale").

``helpers.measuring.cost_model`` prices each collective's latency with NCCL 2.27's tuning
model (NVIDIA/nccl ``src/graph/tuning.cc`` at v2.27.7-1): a ring's grows with the ring's
length, the tree's (all-reduce across nodes) with ``log2`` of the nodes, and NCCL takes the
tree when it is faster for the bytes. The planner charges it once per collective as the data-
parallel group's framework issues them (``Layout.dp_issue``). At a fixed global batch, more
data parallelism then costs MFU.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.measuring import cost_model as cm
from helpers.planning.estimate import dp_collectives, tensors_per_layer
from helpers.planning.hardware import HARDWARE
from helpers.planning.layout import Layout, PlanError, check_layout
from helpers.planning.models import NAMED_MODELS
from helpers.planning.plan import plan_model

ROOT = Path(__file__).resolve().parents[1]
US = 1e-6
H100 = HARDWARE["h100"]
NET = H100.network()  # NVLink 4 inside, 8 x 400 Gb/s out, NCCL 2.27's latencies
GiB, MiB = 2**30, 2**20


def test_the_h100_latencies_are_nccl_2_27s_simple_protocol() -> None:
    """baseLat 8.4; hwLat Ring/Simple NVLink 3.4, NET 14; Tree/Simple NVLink 4.0, NET 14 (us)."""
    assert NET.latency == pytest.approx((8.4 * US, 3.4 * US, 14 * US))
    assert NET.tree == pytest.approx((8.4 * US, 4.0 * US, 14 * US))
    assert HARDWARE["tpu-v5p"].network().tree is None  # a TPU pod: rings only


@pytest.mark.parametrize("kind, f", [("all-gather", 1), ("reduce-scatter", 1), ("all-reduce", 2)])
def test_ring_latency_grows_with_the_ring_as_nccl_counts_it(kind: str, f: int) -> None:
    """``baseLat + (nsteps - nInterSteps) x 3.4 + nInterSteps x 14`` us, nsteps f (N-1),
    nInterSteps f (M-1): linear in the ring's length."""
    previous = 0.0
    for nodes in (1, 2, 4, 8, 64, 512):
        n = 8 * nodes
        by_hand = (8.4 + (f * (n - 1) - f * (nodes - 1)) * 3.4 + f * (nodes - 1) * 14) * US
        latency = cm.ring_time(kind, 0.0, n, NET)
        assert latency == pytest.approx(by_hand)
        assert latency > previous
        previous = latency
    # 4,096 GPUs pay about 8x the latency of 512: the ring's length, not its log
    assert cm.ring_time(kind, 0.0, 4096, NET) / cm.ring_time(kind, 0.0, 512, NET) > 7.5


def test_tree_latency_grows_with_log2_of_the_nodes() -> None:
    """``baseLat + 2 ((G-1) x 4 + log2i(M) x 14)`` us: each doubling of the nodes adds two
    network hops, 28 us, whatever the count."""
    steps = [cm.tree_latency(8 * 2**k, NET) for k in range(11)]
    assert steps[0] == pytest.approx((8.4 + 2 * 7 * 4.0) * US)
    for a, b in itertools.pairwise(steps):
        assert b - a == pytest.approx(28 * US)
    with pytest.raises(ValueError, match="no tree"):
        cm.tree_latency(16, NET._replace(tree=None))


def test_an_all_reduce_takes_the_tree_where_nccl_would() -> None:
    """Inside a node, a ring; across 8 nodes a 25 MiB bucket takes the tree (latency 148 us
    against the ring's 585), 4 GiB the ring (the tree moves 0.92 of its bandwidth)."""
    assert cm.collective_algorithm("all-reduce", 25 * MiB, 8, NET) == "ring"
    assert cm.ring_time("all-reduce", 0.0, 64, NET) == pytest.approx(585.2 * US)
    assert cm.tree_latency(64, NET) == pytest.approx(148.4 * US)
    assert cm.collective_algorithm("all-reduce", 25 * MiB, 64, NET) == "tree"
    assert cm.collective_algorithm("all-reduce", 4 * GiB, 64, NET) == "ring"
    assert cm.collective_algorithm("all-gather", 25 * MiB, 64, NET) == "ring"  # ring only
    tree = cm.collective_time("all-reduce", 25 * MiB, 64, NET)
    assert tree < cm.ring_time("all-reduce", 25 * MiB, 64, NET)


def test_n_collectives_pay_n_latencies_and_the_same_bytes() -> None:
    one = cm.collective_time("reduce-scatter", GiB, 64, NET)
    many = cm.collective_time("reduce-scatter", GiB, 64, NET, n_ops=100)
    assert many - one == pytest.approx(99 * cm.ring_time("reduce-scatter", 0.0, 64, NET))
    with pytest.raises(ValueError, match="n_ops"):
        cm.collective_time("reduce-scatter", GiB, 64, NET, n_ops=0)


def test_how_a_framework_issues_its_collectives_counts_them() -> None:
    model = NAMED_MODELS["llama3-8b"]
    grads = 2 * model.param_count()  # bf16 gradients
    layers = (model.n_layers, 0)
    count = {
        issue: dp_collectives(model, Layout(dp=64, dp_issue=issue), layers, grads)
        for issue in ("layer", "bucket", "tensor", "whole")
    }
    assert count["layer"] == 32 and count["whole"] == 1
    assert count["bucket"] == math.ceil(grads / (25 * MiB))  # PyTorch DDP's 25 MiB: 613
    assert count["tensor"] == 32 * tensors_per_layer(model, False) == 32 * 9
    bigger = Layout(dp=64, dp_issue="bucket", bucket_mib=100.0)
    assert dp_collectives(model, bigger, layers, grads) == math.ceil(count["bucket"] / 4)


def test_more_collectives_wait_longer_at_scale() -> None:
    """ZeRO-1 of Llama-3-8B on 512 H100s, 2 micro-batches: 613 reduce-scatters and
    all-gathers of 25 MiB each pay a 512-GPU ring's 2.4 ms; 32, one per layer, hide."""
    plans = {
        issue: plan_model("llama3-8b", "h100", dp=512, zero=1, global_batch=1024, dp_issue=issue)
        for issue in ("layer", "bucket")
    }
    assert (
        plans["bucket"].exposed_seconds_per_step["dp"]
        > 10 * plans["layer"].exposed_seconds_per_step["dp"]
    )
    assert plans["bucket"].mfu < plans["layer"].mfu
    assert plans["bucket"].options["dp_collectives"] == 613


def _fsdp(dp: int, hardware=H100):  # noqa: ANN001, ANN202
    return plan_model("llama3-8b", hardware, dp=dp, zero=3, global_batch=1024, seq=4096)


def test_at_a_fixed_global_batch_the_expected_mfu_falls_as_dp_grows() -> None:
    """Llama-3-8B under FSDP (one gather and reduce-scatter per layer), 1,024 sequences of
    4,096 tokens per step: from 128 GPUs on, each micro-batch's layer computes for less
    than the 1,024-GPU ring's latency, and the expected MFU falls; without latency the
    same plans stay where 8 GPUs are (the bytes still hide)."""
    dps = (8, 32, 128, 512, 1024)
    expected = [_fsdp(d).mfu_expected for d in dps]
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(expected))
    assert expected[-1] < 0.6 * expected[0]
    no_latency = dataclasses.replace(H100, latency=(0.0, 0.0, 0.0), tree_latency=None)
    flat = [_fsdp(d, no_latency).mfu for d in dps]
    assert max(flat) - min(flat) < 1e-9


def test_the_plan_says_how_its_data_parallel_collectives_run() -> None:
    plan = plan_model("llama3-8b", "h100", dp=64, zero=0, global_batch=256, dp_issue="bucket")
    o = plan.options
    assert (o["dp_issue"], o["bucket_mib"], o["dp_algorithm"]) == ("bucket", 25.0, "tree")
    assert o["dp_collectives"] == 613


@pytest.mark.parametrize(
    "kwargs, flag",
    [({"dp_issue": "per-op"}, "--dp-issue"), ({"dp_issue": "bucket", "bucket_mib": 0.0}, "--bucket-mib"),
     ({"bucket_mib": 50.0}, "--bucket-mib needs --dp-issue bucket")],
)  # fmt: skip
def test_bad_issue_settings_are_refused_in_one_line(kwargs: dict, flag: str) -> None:
    with pytest.raises(PlanError, match=flag) as err:
        check_layout(NAMED_MODELS["llama3-8b"], Layout(dp=8, **kwargs), None, 0)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "args", [["--dp-issue", "per-op"], ["--dp-issue", "bucket", "--bucket-mib", "-1"],
             ["--bucket-mib", "50"]],
)  # fmt: skip
def test_the_command_line_refuses_them_with_exit_code_2(args: list[str]) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "helpers.plan", "--config", "llama3-8b", "--dp", "8", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and ("dp-issue" in lines[0] or "bucket-mib" in lines[0]), out.stderr
