"""What ``helpers.measuring.profile`` measures for one strategy, and the numbers read off it.

This module sits below both ``helpers.measuring.profile`` (which fills a ``StrategyResult``) and
``helpers.drawing.draw_profile`` (which plots them), so that neither imports the other's module
for it: the helpers' import graph has no cycle (``tests/test_import_graph.py``). It needs
no jax. ``helpers.measuring.profile`` re-exports every name, so ``from helpers.measuring.profile import
StrategyResult`` keeps working.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = ["StrategyResult", "ratio_range", "spread"]


@dataclass
class StrategyResult:
    """Everything ``compare_strategies`` measured for one strategy. ``to_dict()`` for JSON.

    Byte counts are per device. ``flops_formula`` is the whole step (all devices);
    ``flops_hlo_per_device`` is XLA's ``cost_analysis()`` of the compiled SPMD program,
    which is the program ONE device runs: 1/N of the step's work unless devices repeat work.
    Timing fields are None after a ``dry_run`` (compiled, never run).
    """

    strategy: str
    model: str  # "mlp" or "transformer"
    preset: str
    config: dict[str, Any]
    batch_per_device: int
    n_devices: int
    mesh_shape: tuple[int, ...]
    platform: str
    device_kind: str
    tokens_per_step: int
    n_params: int
    compile_s: float
    step_memory: dict[str, int]
    collectives: dict[str, dict[str, float]]
    comm_bytes_per_device: float
    flops_formula: float
    flops_hlo_per_device: float | None
    program_fingerprint: str
    peak_name: str | None
    peak_flops_per_device: float | None
    remat: bool = False
    resized: str = ""
    compiler_options: dict[str, Any] = field(default_factory=dict)
    steps: int = 0
    warmup: int = 0
    step_times_s: list[float] = field(default_factory=list)
    step_median_s: float | None = None
    step_min_s: float | None = None
    step_max_s: float | None = None
    tokens_per_s: float | None = None
    state_bytes_per_device: int | None = None
    device_peak_bytes: int | None = None
    device_peak_raised: bool | None = None
    mfu: float | None = None
    losses: list[float] = field(default_factory=list)
    trace_dir: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["mesh_shape"] = list(self.mesh_shape)
        return out


def spread(r: StrategyResult) -> float | None:
    """(slowest - fastest) / median of a strategy's timed steps; None after a dry run."""
    if not r.step_median_s:
        return None
    return (r.step_max_s - r.step_min_s) / r.step_median_s


def ratio_range(r: StrategyResult, base: StrategyResult) -> tuple[float, float, float]:
    """``r``'s median step over ``base``'s, and the lowest and highest ratio any two of their
    timed steps give: ``(median ratio, fastest r / slowest base, slowest r / fastest base)``."""
    return (
        r.step_median_s / base.step_median_s,
        r.step_min_s / base.step_max_s,
        r.step_max_s / base.step_min_s,
    )
