"""A published strong-scaling series against the planner (issue 53, "Scaling at a fixed
global batch").

Narayanan et al. 2021 (arXiv:2104.04473), Table 2, PTD Parallelism rows of the 174.6B GPT-3:
model-parallel size 96, a global batch of 1,536 sequences, micro-batch 1, on 384, 768 and
1,536 A100s: 153, 149 and 141 teraFLOP/s per GPU (``helpers.planning.runs``, series
``MEGATRON21_TABLE2_SERIES``). Each doubling halves the micro-batches per pipeline (384,
192, 96), so the pipeline's bubble and the data-parallel all-reduce weigh more. The series
is part of the calibration; each point's expected MFU, fitted on every other run, is within
the error the planner states.
"""

from __future__ import annotations

import itertools

import pytest

from helpers.planning.calibration import calibrate, plan_published_run
from helpers.planning.runs import MEGATRON21_TABLE2_SERIES, PUBLISHED_RUNS

SERIES = sorted(
    (r for r in PUBLISHED_RUNS if r.series == MEGATRON21_TABLE2_SERIES), key=lambda r: r.gpus
)
CALIBRATION = calibrate(PUBLISHED_RUNS)


def test_the_series_is_one_model_and_one_batch_on_more_gpus() -> None:
    assert [r.gpus for r in SERIES] == [384, 768, 1536]
    assert [r.achieved_tflops_per_gpu for r in SERIES] == [153.0, 149.0, 141.0]
    first = SERIES[0]
    for run in SERIES:
        assert (run.model, run.global_batch, run.micro_batch) == (first.model, 1536, 1)
        assert run.tp * run.pp == 96 and run.tp * run.pp * run.dp == run.gpus
        assert "Table 2" in run.source and run.outcome == "trained"


def test_the_published_rates_agree_with_the_tables_training_times() -> None:
    """Table 2's last column, days for 300B tokens: 84, 43, 23. Eq. 4, 8 T P / (n X), with
    P = 174.6e9, gives them from the per-GPU rates to within 3%."""
    for run, days in zip(SERIES, (84, 43, 23), strict=True):
        seconds = 8 * 300e9 * 174.6e9 / (run.gpus * run.achieved_tflops_per_gpu * 1e12)
        assert seconds / 86400 == pytest.approx(days, rel=0.03)


def test_published_and_planned_mfu_both_fall_as_the_gpus_grow() -> None:
    published = [r.achieved_mfu for r in SERIES]
    optimistic = [plan_published_run(r).mfu for r in SERIES]
    assert all(b < a for a, b in itertools.pairwise(published))
    assert all(b < a for a, b in itertools.pairwise(optimistic))


@pytest.mark.parametrize("run", SERIES, ids=lambda r: r.key)
def test_each_point_is_within_the_stated_error_leave_one_out(run) -> None:  # noqa: ANN001
    assert CALIBRATION is not None and run.key in CALIBRATION.runs
    expected = CALIBRATION.loo[run.key]  # fitted on every other published run
    assert abs(run.achieved_mfu / expected - 1) <= CALIBRATION.error


def test_the_planner_sees_the_fixed_batch_in_its_step() -> None:
    """At a fixed batch the compute per GPU halves with each doubling; the pipeline bubble
    (11 of the stage's micro-batch times over v = 4) does not."""
    plans = [plan_published_run(r) for r in SERIES]
    compute = [p.time_breakdown["compute"] for p in plans]
    bubble = [p.time_breakdown["pipeline bubble"] for p in plans]
    assert compute[0] / compute[2] == pytest.approx(4.0)
    assert bubble[0] == pytest.approx(bubble[2])
    assert [p.grad_accum for p in plans] == [384, 192, 96]
