"""From the optimistic MFU to an expected MFU, calibrated on published training runs.

``helpers.planning.runs`` holds measured runs (each with its citation). For each run that
trained, ``plan_published_run`` plans the run's own layout, and the ratio of its achieved
MFU to the planner's optimistic MFU (``helpers.planning.estimate``: every assumption at its
best, not an upper bound) is what that estimate leaves out: matmuls below the best measured
rate, kernels it does not list, collectives below the datasheet bandwidth, imperfect
overlap. The **expected MFU** is the optimistic MFU times the geometric mean of those
ratios; its **error** is the largest leave-one-out miss: for each run, the factor fitted on
all the others, applied to that run's optimistic MFU, against what the run achieved.

``runs_table`` rows carry it as ``"optimistic"``; ``"bound"``, its old name, stays as an
alias with the same value, for code written before issue 53.

A run whose source gives hardware FLOP/s that count recomputation carries its conversion
to model FLOPs in ``mfu_note`` (full recompute runs every forward twice: model FLOPs are
3/4 of the hardware's).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from helpers.planning.estimate import Plan, estimate
from helpers.planning.hardware import HARDWARE, HARDWARE_ALIASES, Hardware
from helpers.planning.layout import Layout, PlanError
from helpers.planning.margins import margin_for
from helpers.planning.models import model_from_hf_config


def published_runs() -> tuple[Any, ...]:
    """``helpers.planning.runs.PUBLISHED_RUNS``, or () where that file is absent."""
    try:
        from helpers.planning import runs
    except ImportError:
        return ()
    return tuple(runs.PUBLISHED_RUNS)


def run_hardware(run: Any) -> Hardware:
    key = HARDWARE_ALIASES.get(run.hardware, run.hardware)
    if key not in HARDWARE:
        raise PlanError(
            f"run {run.key}: unknown hardware {run.hardware!r}; one of {sorted(HARDWARE)}."
        )
    return HARDWARE[key]


def run_layout(run: Any) -> Layout:
    """The planner's ``Layout`` of a published run.

    Where ``tp x pp x dp x cp`` alone makes up the GPU count and ``ep > 1``, the source
    carved expert parallelism out of data parallelism (Megatron-LM's convention): the
    planner's ``dp`` is then ``dp / ep``. The micro-batches per step are the global batch
    over ``micro_batch x`` the data-parallel ranks.
    """
    dp, ep = run.dp, run.ep
    product = run.tp * run.pp * run.cp * dp * ep
    if product != run.gpus:
        if ep > 1 and run.tp * run.pp * run.cp * dp == run.gpus and dp % ep == 0:
            dp //= ep
        else:
            raise PlanError(f"run {run.key}: the degrees make {product} GPUs, not {run.gpus}.")
    ranks = dp * ep * run.micro_batch
    if run.global_batch % ranks:
        raise PlanError(
            f"run {run.key}: global batch {run.global_batch} is not a multiple of micro-batch "
            f"x data-parallel ranks ({ranks})."
        )
    precision = "f32" if str(run.precision).startswith(("fp32", "f32")) else "mixed"
    precision = "bf16" if str(run.precision) == "bf16 pure" else precision
    return Layout(
        pp=run.pp, dp=dp, ep=ep, cp=run.cp, tp=run.tp, zero=run.zero,
        micro_batch=run.micro_batch, grad_accum=run.global_batch // ranks, seq=run.seq,
        remat=run.remat, flash_attention=run.flash_attention,
        sequence_parallel=run.sequence_parallel if run.tp > 1 else False,
        virtual_stages=run.virtual_stages, pp_layers=tuple(run.pp_layers),
        precision=precision, grad_dtype=getattr(run, "grad_dtype", "bf16"),
        keep_gathered=getattr(run, "keep_gathered", False), loss=getattr(run, "loss", "fused"),
        dp_issue=getattr(run, "dp_issue", "layer"), bucket_mib=getattr(run, "bucket_mib", 25.0),
    )  # fmt: skip


def plan_published_run(run: Any) -> Plan:
    """The planner's plan of a published run's own layout (no expected MFU)."""
    model = model_from_hf_config(run.model, run.key)
    hardware, layout = run_hardware(run), run_layout(run)
    return estimate(model, hardware, layout, margin=margin_for(hardware, layout.zero, layout.remat))


def optimistic_as_published(run: Any, plan: Plan | None = None) -> float:
    """The planner's optimistic MFU for ``run``, counted the way the run's source counts MFU:
    PaLM's full score matrix (the planner's own convention), or its causal half where the
    run says ``attention_flops == "causal"``."""
    plan = plan or plan_published_run(run)
    if getattr(run, "attention_flops", "full") != "causal":
        return plan.mfu
    model = model_from_hf_config(run.model, run.key)
    return (
        plan.mfu
        * model.model_flops_per_token(run.seq, causal=True)
        / (model.model_flops_per_token(run.seq))
    )


@dataclass(frozen=True)
class Calibration:
    """The factor from optimistic to expected MFU and how well it predicts, leave-one-out."""

    factor: float  # geometric mean of achieved / optimistic MFU
    error: float  # the largest leave-one-out relative miss
    rms_error: float
    runs: tuple[str, ...]
    loo: dict[str, float]  # run key -> its leave-one-out expected MFU
    bounds: dict[str, float]  # run key -> its optimistic MFU (as published)
    achieved: dict[str, float]

    def note(self) -> str:
        return (
            f"expected = optimistic x {self.factor:.3f}, the geometric mean of achieved / "
            f"optimistic over {len(self.runs)} published runs (helpers.planning.runs); the largest leave-one-out "
            f"miss was {self.error:.0%} (rms {self.rms_error:.0%})"
        )


def calibrate(runs: tuple[Any, ...]) -> Calibration | None:
    """Fit the factor on the runs that trained and published an MFU; None with fewer than 3."""
    bounds, achieved = {}, {}
    for run in runs:
        if run.outcome != "trained" or not run.achieved_mfu:
            continue
        bounds[run.key] = optimistic_as_published(run)
        achieved[run.key] = float(run.achieved_mfu)
    keys = tuple(bounds)
    if len(keys) < 3:
        return None
    logs = {k: math.log(achieved[k] / bounds[k]) for k in keys}
    factor = math.exp(sum(logs.values()) / len(keys))
    loo, misses = {}, []
    for k in keys:
        others = [logs[o] for o in keys if o != k]
        loo[k] = bounds[k] * math.exp(sum(others) / len(others))
        misses.append(achieved[k] / loo[k] - 1)
    error = max(abs(e) for e in misses)
    rms = math.sqrt(sum(e * e for e in misses) / len(misses))
    return Calibration(factor, error, rms, keys, loo, bounds, achieved)


NOT_JUDGED = "not judged"  # runs_table's memory verdict for a run whose recompute is not stated


def runs_table(runs: tuple[Any, ...] | None = None) -> list[dict[str, Any]]:
    """One row per published run: its key, name, source, outcome, achieved MFU, the planner's
    optimistic MFU (``"optimistic"``, in the run's own MFU convention; ``"bound"`` is the
    same value under its old name), its leave-one-out expected MFU, the memory verdict (with
    the calibrated margin), the source's statement that it ran near its memory's limit
    (``"memory_edge"``, empty if none) and what it says of this run's configuration
    (``"memory_edge_says"``), and the optimistic MFU's ratio to the achieved MFU. A run whose
    source states no recompute setting (``"remat_stated"`` False) gets ``NOT_JUDGED`` as its
    memory verdict: its plan's verdict would judge the planner's choice, not the run;
    ``"memory_edge_own"`` says whether the memory note speaks of this run's own configuration."""
    runs = published_runs() if runs is None else runs
    cal = calibrate(runs)
    rows = []
    for run in runs:
        plan = plan_published_run(run)
        bound = optimistic_as_published(run, plan)
        achieved = run.achieved_mfu
        stated = getattr(run, "remat_stated", True)
        rows.append({
            "key": run.key, "name": run.name, "source": run.source, "outcome": run.outcome,
            "hardware": run.hardware, "achieved": achieved,
            "optimistic": bound, "bound": bound,
            "expected": cal.loo.get(run.key) if cal else None,
            "memory_verdict": plan.memory_verdict if stated else NOT_JUDGED,
            "remat_stated": stated, "memory_edge": getattr(run, "memory_edge", ""),
            "memory_edge_says": getattr(run, "memory_edge_says", ""),
            "memory_edge_own": getattr(run, "memory_edge_own", False),
            "ratio": bound / achieved if achieved else None,
        })  # fmt: skip
    return rows


@functools.lru_cache(maxsize=1)
def default_calibration() -> Calibration | None:
    """``calibrate`` on every published run (computed once per process)."""
    return calibrate(published_runs())


__all__ = [
    "Calibration", "calibrate", "default_calibration", "optimistic_as_published", "plan_published_run",
    "published_runs", "run_hardware", "run_layout", "runs_table",
]  # fmt: skip
