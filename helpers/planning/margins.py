"""The memory margin, calibrated per runtime, ZeRO stage and recompute schedule on measured peaks.

The planner counts what a device must hold (``helpers.planning.estimate``); a real step
holds more: the allocator's slack, workspaces, communication buffers, temporaries a
compiler or an autograd engine keeps. For each measured point of ``helpers.planning.peaks``
this module plans the point's own layout and takes the ratio

    (peak - parameters - optimizer state - gathered weights) / (gradients + activations)

the factor by which the real step exceeded the planner's count of what changes during a
step. Points are grouped into **classes**: the runtime (``"gpu"``, PyTorch's caching
allocator; ``"tpu"``, XLA:TPU's compiler), the ZeRO stage and the recompute schedule. A
class's **margin** is its largest ratio, rounded up (so each point's count, gradients and
activations times the margin, is at least its peak; that is not "fits": on the hardware a
point records, its verdict may still be "tight" or "out of memory"), and never less than 1:
a margin never grants "fits" to a plan whose count alone overflows HBM, even where a class's
peaks fell below the count (the one step measured on a TPU v5e chip, ratio 0.711, planned
with 2 bytes per parameter more than its program held).
Its **floor** is its smallest ratio: a plan whose count, with its gradients and activations
times the floor, exceeds HBM is "out of memory" (``estimate.memory_verdict``), between the
two "tight".

A class with no measured point says so and falls back: the margin to the largest ratio of
the nearest recompute schedule calibrated on the same runtime (any ZeRO stage; schedules in the
order none, selective, op, full, the later on a tie), the floor to 1 (the count alone);
a runtime with no point at all falls back to ``estimate.ACTIVATION_MARGIN``. The ratios
depend on the framework (torchtitan's eager PyTorch, torch.compile, XLA:TPU): read the
spread, and measure your own step's peak for a margin of your own (``--margin``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any

from helpers.planning.activations import REMATS
from helpers.planning.estimate import ACTIVATION_MARGIN, Plan, estimate
from helpers.planning.hardware import HARDWARE, Hardware
from helpers.planning.layout import Layout
from helpers.planning.models import ModelSpec, model_from_hf_config
from helpers.planning.peaks import PEAK_POINTS, REPORTED_OUTCOMES

__all__ = [
    "Margin", "margin_for", "memory_calibration", "margin_table", "plan_point", "point_hardware",
    "point_ratio", "runtime_of",
]  # fmt: skip

_STAGES = {0: "ZeRO-0 (DP)", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}


@dataclass(frozen=True)
class Margin:
    """A class's margin and floor, the ratios they come from (point key -> ratio), and one
    line saying so (``source``)."""

    margin: float
    floor: float
    source: str
    ratios: tuple[tuple[str, float], ...] = ()

    @property
    def spread(self) -> tuple[float, float] | None:
        """The smallest and largest ratio of the class's own points (None: no point)."""
        values = [r for _, r in self.ratios]
        return (min(values), max(values)) if values else None


def _up(ratio: float) -> float:
    """A ratio rounded up to two decimals (the margin then covers the point it comes from)."""
    return math.ceil(ratio * 100 - 1e-9) / 100


def runtime_of(hardware: Hardware) -> str:
    """``"tpu"`` for a TPU (XLA's compiler lays the step out), else ``"gpu"``."""
    return "tpu" if hardware.name.startswith("TPU") else "gpu"


def point_model(point: Any) -> ModelSpec:
    """The ``ModelSpec`` of a point of ``helpers.planning.peaks``."""
    if "spec" in point.model:
        return ModelSpec(**point.model["spec"])
    return model_from_hf_config(point.model, point.key)


def point_layout(point: Any) -> Layout:
    """The planner's ``Layout`` of a point: one micro-batch per step (a peak does not
    depend on how many run one after another without a pipeline)."""
    return Layout(
        dp=point.dp, tp=point.tp, cp=point.cp, zero=point.zero, micro_batch=point.micro_batch,
        seq=point.seq, remat=point.remat, precision=point.precision,
        flash_attention=point.flash_attention, loss=point.loss,
    )  # fmt: skip


def point_hardware(point: Any) -> Hardware:
    """The hardware a point ran on: ``HARDWARE[point.hardware]``, with the bytes the run's
    device had where the point records them (``ran_on_hbm``: torchtitan's 96 GB H100s)."""
    hardware = HARDWARE[point.hardware]
    if point.ran_on_hbm is None:
        return hardware
    return replace(
        hardware, hbm_bytes=point.ran_on_hbm, hbm_marketed=point.ran_on_hbm, hbm_source=point.ran_on
    )


def plan_point(point: Any) -> Plan:
    """The planner's count for a point's layout (margin 1: the count alone)."""
    return estimate(point_model(point), point_hardware(point), point_layout(point), margin=1.0)


def point_ratio(point: Any, plan: Plan | None = None) -> float:
    """(peak - parameters - optimizer - gathered) / (gradients + activations)."""
    b = (plan or plan_point(point)).per_device_bytes
    states = b["params"] + b["optimizer"] + b["gathered"]
    return (point.peak_bytes - states) / (b["grads"] + b["activations"])


@functools.lru_cache(maxsize=1)
def memory_calibration() -> dict[tuple[str, int, str], tuple[tuple[str, float], ...]]:
    """Each class (runtime, ZeRO stage, remat) -> its points' (key, ratio)."""
    classes: dict[tuple[str, int, str], list[tuple[str, float]]] = {}
    for point in PEAK_POINTS:
        key = (point.runtime, point.zero, point.remat)
        classes.setdefault(key, []).append((point.key, point_ratio(point)))
    return {k: tuple(v) for k, v in classes.items()}


def _fallback(runtime: str, zero: int, remat: str) -> Margin:
    """No point in the class: the points of the runtime whose schedule is nearest (in the
    order none, selective, op, full; the later on a tie), any ZeRO stage; floor 1."""
    classes = {k: v for k, v in memory_calibration().items() if k[0] == runtime}
    what = f"no calibration point for {_STAGES[zero]} with remat {remat} on a {runtime.upper()}"
    if not classes:
        return Margin(ACTIVATION_MARGIN, 1.0, f"x{ACTIVATION_MARGIN:g}: {what}, nor any other "
                      "class of it; the stated default (estimate.ACTIVATION_MARGIN)")  # fmt: skip
    order = REMATS.index(remat)
    near = min(
        {r for _, _, r in classes}, key=lambda r: (abs(REMATS.index(r) - order), -REMATS.index(r))
    )
    ratios = [x for (_, _, r), pts in classes.items() if r == near for _, x in pts]
    top = max(ratios)
    margin = max(1.0, _up(top))  # never below the count alone
    return Margin(
        margin, 1.0,
        f"x{margin:.2f}: {what}; the largest ratio of the nearest schedule calibrated, remat "
        f"{near} ({len(ratios)} points, {min(ratios):.3f} to {top:.3f}); floor x1, the count alone",
    )  # fmt: skip


def margin_for(hardware: Hardware, zero: int, remat: str) -> Margin:
    """The margin and floor for a plan on ``hardware`` with ``zero`` and ``remat``; the
    margin is at least 1 (the count alone), the floor may be below it."""
    runtime = runtime_of(hardware)
    points = memory_calibration().get((runtime, zero, remat))
    if not points:
        return _fallback(runtime, zero, remat)
    values = [r for _, r in points]
    lo, hi = min(values), max(values)
    what = (
        f"the largest of {len(values)} measured peaks' ratios"
        if hi >= 1
        else f"the count alone (no margin below 1), above the {len(values)} measured peaks' ratios"
    )
    margin, floor = max(1.0, _up(hi)), math.floor(lo * 100) / 100  # margin: never below 1
    return Margin(
        margin, floor,
        f"x{margin:.2f}: {what} for "
        f"{_STAGES[zero]} with remat {remat} on a {runtime.upper()}, {lo:.3f} to {hi:.3f} "
        f"(helpers.planning.peaks); below x{floor:.2f}, out of memory",
        tuple(points),
    )  # fmt: skip


def margin_table() -> list[dict[str, Any]]:
    """One row per class with measured points and per outcome-only point: what the CLI's
    ``--margins`` prints (notebook 13a prints the same classes)."""
    rows = []
    for (runtime, zero, remat), points in sorted(memory_calibration().items()):
        m = margin_for(HARDWARE["tpu-v5p" if runtime == "tpu" else "h100"], zero, remat)
        rows.append({"runtime": runtime, "zero": zero, "remat": remat, "points": len(points),
                     "min": m.floor, "max": m.margin, "keys": [k for k, _ in points]})  # fmt: skip
    return rows


def outcome_verdicts() -> dict[str, tuple[str, str]]:
    """Each outcome-only point of ``peaks.REPORTED_OUTCOMES`` -> (what its source reports, the
    planner's verdict with the calibrated margin)."""
    out = {}
    for point in REPORTED_OUTCOMES:
        model, hardware = point_model(point), point_hardware(point)
        layout = point_layout(point)
        plan = estimate(
            model, hardware, layout, margin=margin_for(hardware, layout.zero, layout.remat)
        )
        out[point.key] = (point.outcome, plan.memory_verdict)
    return out
