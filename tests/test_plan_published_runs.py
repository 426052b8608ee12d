"""The planner against published, measured training runs (``helpers.planning.runs``).

For each run: the planner calls "fits" every configuration that trained, unless its source
says this configuration ran near its memory's limit (``memory_edge`` quoted with its link and
``memory_edge_own``: Llama 3 405B's two 8K runs, "tight") or states no recompute setting
(``remat_stated`` False: the 128K run, "not judged" in ``runs_table``), and "out of memory" the two its source says did not fit (GPT 530B under
ZeRO-3 counts 83.3 GB against the 85.9e9 bytes an A100 80GB reports, and with its gradients and
activations times the floor of ZeRO-3 with full recompute, x1.13 from torchtitan's measured
peaks, it needs more; issue 53); its optimistic MFU (counted as the
source counts MFU) is at least the achieved MFU and at most 1.6 times it; and its expected MFU,
fitted on the other runs only, is within the error it states.

Three runs are outside the 1.6x band, each for a reason the planner cannot honestly model;
they are marked ``xfail(strict=True)`` with that reason, so that a model change that brings
them in (or a data change) is noticed:

- ``megatron21-zero3-gpt3-175b``: DeepSpeed's ZeRO-3 of 2021 at 384 GPUs. Its gathers hide
  behind compute by the bandwidth count (175B x 2 bytes over a DGX A100 node's 200 GB/s:
  1.75 s against 10.6 s of forward matmuls per micro-batch), so the optimistic MFU is the
  compute alone (62.5%); the run reached 34.7%. The framework's own cost is what is missing, and
  the paper does not itemise it.
- ``mosaic-mpt-7b-8-h100``: FSDP on one node, everything hidden; optimistic 75.9%, achieved
  46.4% (1.63x). The stack's efficiency (a Triton attention kernel on H100, eager
  PyTorch) is again what is missing.
- ``llama3-405b-128k-cp16``: 128K tokens, where attention is 57% of PaLM's model FLOPs. The
  planner runs fused attention over the causal half of the scores and counts MFU over the
  whole matrix (PaLM's convention): optimistic 83% against 38% (2.2x). Table 4 of the Llama 3
  paper does not say how it counts attention; counted over the causal half, the optimistic
  MFU is 59% (1.56x), and the run's efficiency (achieved / optimistic) is then that of the 8K runs.
"""

from __future__ import annotations

import pytest

from helpers.planning.calibration import (
    calibrate,
    optimistic_as_published,
    plan_published_run,
    runs_table,
)
from helpers.planning.runs import PUBLISHED_RUNS

RUNS = {run.key: run for run in PUBLISHED_RUNS}
TRAINED = [k for k, r in RUNS.items() if r.outcome == "trained" and r.achieved_mfu]
OUT_OF_BAND = {
    "megatron21-zero3-gpt3-175b": "DeepSpeed ZeRO-3's overhead (2021) is not in the optimistic MFU",
    "mosaic-mpt-7b-8-h100": "the stack's kernels are not in the optimistic MFU (1.63x)",
    "llama3-405b-128k-cp16": "MFU convention unknown: 2.2x over the full score matrix, "
    "1.56x over its causal half",
}
CALIBRATION = calibrate(PUBLISHED_RUNS)


def test_the_runs_cover_what_the_issue_asks() -> None:
    runs = PUBLISHED_RUNS
    assert len(runs) >= 12
    assert len({r.independent_source for r in runs}) >= 4
    assert {r.hardware for r in runs} >= {"a100-80gb", "h100"}
    moe = [r for r in runs if r.ep > 1]
    assert moe and any(r.ep == 1 for r in runs)
    assert any(r.tp > 1 for r in runs) and any(r.pp > 1 for r in runs)
    assert any(r.virtual_stages > 1 for r in runs) and any(r.cp > 1 for r in runs)
    assert any(r.zero == 1 for r in runs) and any(r.zero == 3 for r in runs)
    assert any(r.outcome == "oom" for r in runs)
    for r in runs:
        assert r.source and (r.outcome == "oom" or r.mfu_note)


@pytest.mark.parametrize("key", sorted(RUNS))
def test_the_memory_verdict_agrees_with_the_source(key: str) -> None:
    """Issue 53: no run that trained is "tight" or "out of memory" unless its source says it
    ran at the edge (then "tight" at most); every run that did not fit is "out of memory"."""
    run = RUNS[key]
    plan = plan_published_run(run)
    if run.outcome == "oom":
        assert plan.memory_verdict == "out of memory", (key, plan.per_device_bytes)
    elif run.memory_edge_own:
        assert plan.memory_verdict in ("fits", "tight"), (key, plan.per_device_bytes)
    elif run.remat_stated:
        assert plan.memory_verdict == "fits", (key, plan.per_device_bytes, plan.margin_source)


def _unsourced(rows: list[dict]) -> list[str]:
    """The rule notebooks 13a and 13b assert: a run that trained and is not "fits" is either
    "not judged" because its source states no recompute setting, or has a source about its own
    configuration saying it ran at the edge (a note about a sibling run does not count)."""
    return [
        r["key"]
        for r in rows
        if r["outcome"] == "trained"
        and r["memory_verdict"] != "fits"
        and not (r["memory_verdict"] == "not judged" and not r["remat_stated"])
        and not (r["memory_edge_own"] and r["memory_edge"])
    ]


def test_no_trained_run_is_tight_without_a_source_about_that_run() -> None:
    rows = runs_table()
    assert _unsourced(rows) == []
    assert all((r["memory_verdict"] == "not judged") == (not r["remat_stated"]) for r in rows)
    assert {r["key"] for r in rows if r["memory_verdict"] == "not judged"} == {
        "llama3-405b-128k-cp16"
    }


def test_the_rule_rejects_a_note_about_a_sibling_run() -> None:
    """The 128K run's note quotes the paper on 8K tokens: had its recompute setting been
    taken as stated ("none"), it would be tight with a note not about itself, and the rule
    fails."""
    import dataclasses

    run = dataclasses.replace(RUNS["llama3-405b-128k-cp16"], remat_stated=True)
    assert run.memory_edge and not run.memory_edge_own
    row = runs_table((run,))[0]
    assert row["memory_verdict"] == "tight" and _unsourced([row]) == [run.key]


@pytest.mark.parametrize("key", sorted(k for k, r in RUNS.items() if r.memory_edge_own))
def test_an_own_edge_needs_a_note_that_states_something(key: str) -> None:
    says = RUNS[key].memory_edge_says
    assert RUNS[key].memory_edge and "states no" not in says and "8K" in says
    assert RUNS[key].seq == 8192


@pytest.mark.parametrize("key", sorted(k for k, r in RUNS.items() if r.memory_edge))
def test_a_run_at_the_edge_quotes_its_source_with_a_link(key: str) -> None:
    edge = RUNS[key].memory_edge
    assert "https://" in edge and edge.count("'") >= 2 and "memory" in edge
    assert RUNS[key].outcome == "trained"


@pytest.mark.parametrize("key", sorted(k for k, r in RUNS.items() if r.memory_edge))
def test_what_the_edge_says_is_about_the_run_itself(key: str) -> None:
    """Issue 53: notebook 13a prints ``memory_edge_says`` as the run's source. Its quotation
    is the source's (in ``memory_edge``); a quotation about 8K tokens is not printed as the
    statement about a longer sequence without saying that the source states nothing for it."""
    run = RUNS[key]
    says = run.memory_edge_says
    quoted = says[says.index("'") + 1 : says.rindex("'")]
    assert quoted and quoted in run.memory_edge
    if "8K tokens" in quoted and run.seq > 8192:
        assert "states no" in says and f"{run.seq // 1024}K" in says.split(";")[0], says
    row = next(r for r in runs_table() if r["key"] == key)
    assert row["memory_edge_says"] == says


def test_the_530b_zero3_run_that_did_not_fit_is_out_of_memory_only_by_the_floor() -> None:
    """Its count alone fits the A100's 85.9e9 bytes; its class's measured floor does not."""
    plan = plan_published_run(RUNS["megatron21-zero3-530b-oom"])
    b = plan.per_device_bytes
    assert b["total"] < plan.hbm_bytes and plan.margin_floor > 1
    assert b["total"] + (plan.margin_floor - 1) * (b["grads"] + b["activations"]) > plan.hbm_bytes
    assert plan.memory_verdict == "out of memory"


@pytest.mark.parametrize(
    "key",
    [
        pytest.param(k, marks=pytest.mark.xfail(strict=True, reason=OUT_OF_BAND[k]))
        if k in OUT_OF_BAND
        else k
        for k in sorted(TRAINED)
    ],
)
def test_the_optimistic_mfu_is_above_the_achieved_mfu_and_within_1_6x(key: str) -> None:
    run = RUNS[key]
    optimistic = optimistic_as_published(run)
    assert optimistic >= run.achieved_mfu, (key, optimistic, run.achieved_mfu)
    assert optimistic <= 1.6 * run.achieved_mfu, (key, optimistic, run.achieved_mfu)


def test_the_optimistic_helper_has_no_bound_in_its_name() -> None:
    """Issue 53: the optimistic MFU is not a bound, so no helper is named one."""
    import helpers

    assert helpers.optimistic_as_published is optimistic_as_published
    assert not hasattr(helpers, "bound_as_published")


@pytest.mark.parametrize("key", sorted(TRAINED))
def test_the_optimistic_mfu_is_never_below_what_a_run_achieved(key: str) -> None:
    """The first half of the band holds for every run, the out-of-band ones too."""
    run = RUNS[key]
    assert optimistic_as_published(run) >= run.achieved_mfu


@pytest.mark.parametrize("key", sorted(TRAINED))
def test_the_expected_mfu_is_within_its_stated_error_leave_one_out(key: str) -> None:
    assert CALIBRATION is not None
    predicted = CALIBRATION.loo[key]  # fitted on every other run
    achieved = RUNS[key].achieved_mfu
    assert abs(achieved / predicted - 1) <= CALIBRATION.error + 1e-12


def test_the_stated_error_is_the_worst_leave_one_out_miss_and_says_something() -> None:
    assert CALIBRATION is not None and set(CALIBRATION.runs) == set(TRAINED)
    misses = [abs(CALIBRATION.achieved[k] / CALIBRATION.loo[k] - 1) for k in TRAINED]
    assert max(misses) == pytest.approx(CALIBRATION.error)
    assert CALIBRATION.rms_error < CALIBRATION.error < 0.5
    assert 0.5 < CALIBRATION.factor < 1  # real steps are slower than the optimistic MFU


def test_causal_counting_is_applied_where_the_source_counts_so() -> None:
    causal = [r for r in PUBLISHED_RUNS if getattr(r, "attention_flops", "full") == "causal"]
    assert causal
    for run in causal:
        assert optimistic_as_published(run) < plan_published_run(run).mfu


def test_the_128k_run_is_within_the_band_when_only_the_causal_half_is_counted() -> None:
    """The module docstring's 1.56x: Llama 3 405B at 128K, the optimistic MFU over the causal
    half."""
    import dataclasses

    run = RUNS["llama3-405b-128k-cp16"]
    full = optimistic_as_published(run)
    causal = optimistic_as_published(dataclasses.replace(run, attention_flops="causal"))
    assert full / run.achieved_mfu > 1.6
    assert 1.5 < causal / run.achieved_mfu < 1.6
