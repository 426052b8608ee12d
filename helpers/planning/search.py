"""Search the layouts of a GPU count: every degree of tp, pp, cp, ep and dp that the model
allows, each with every ZeRO stage, micro-batch and recompute setting, at one global batch;
keep the best setting of each layout that fits (with the margin), rank them by optimistic MFU
(``helpers.planning.estimate``). Ties in optimistic MFU go to the plan with more headroom (HBM
left with the margin), within a layout as across layouts: ZeRO-2 over ZeRO-1 when both hide.

Each layout appears once in the ranking (its best settings), so that a top list shows
different ways to cut the model, not one way with five ZeRO stages.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from helpers.planning.calibration import default_calibration
from helpers.planning.estimate import Plan, estimate
from helpers.planning.hardware import Hardware
from helpers.planning.layout import Layout, PlanError
from helpers.planning.margins import margin_for
from helpers.planning.models import ModelSpec


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def default_global_batch(gpus: int, seq: int) -> int:
    """About a million tokens per step, rounded up to a multiple of the GPU count."""
    sequences = max(1, math.ceil(2**20 / seq))
    return math.ceil(sequences / gpus) * gpus


@dataclass(frozen=True)
class SearchResult:
    """The ranked layouts, and how many settings were planned to find them."""

    plans: list[Plan]
    planned: int
    refused: int
    global_batch: int


def _degrees(model: ModelSpec, hardware: Hardware, gpus: int, seq: int) -> Iterator[dict]:
    """Every (tp, cp, ep, pp, dp) whose product is ``gpus`` and that the model allows."""
    tps = [t for t in _divisors(gpus) if t <= hardware.per_node]
    cps = [c for c in _divisors(gpus) if c == 1 or (seq >= 16384 and c <= 16)]
    eps = [e for e in _divisors(gpus) if e == 1 or (model.is_moe and model.n_experts % e == 0)]
    for tp in tps:
        for cp in cps:
            for ep in eps:
                rest = gpus // (tp * cp * ep) if gpus % (tp * cp * ep) == 0 else 0
                for pp in _divisors(rest) if rest else []:
                    if pp <= model.n_layers:
                        yield {"tp": tp, "cp": cp, "ep": ep, "pp": pp, "dp": rest // pp}


def search_layouts(
    model: ModelSpec,
    hardware: Hardware,
    gpus: int,
    *,
    seq: int = 4096,
    global_batch: int | None = None,
    micro_batches: Sequence[int] = (1, 2, 4),
    zeros: Sequence[int] = (0, 1, 2, 3),
    remats: Sequence[str] = ("none", "full"),
    flash_attention: bool = True,
    margin: float | None = None,
    top: int = 10,
) -> SearchResult:
    """Rank the layouts of ``gpus`` devices for ``model`` (see the module docstring).
    ``margin`` None gives each setting the margin calibrated for its ZeRO stage and remat
    (``helpers.planning.margins``); a number gives every setting that one.

    Raises:
      PlanError: no layout fits, or a setting that is not allowed.
    """
    if gpus < 1:
        raise PlanError(f"--gpus must be a positive integer, got {gpus!r}.")
    batch = global_batch or default_global_batch(gpus, seq)
    best: dict[tuple, Plan] = {}
    planned = refused = 0
    for deg in _degrees(model, hardware, gpus, seq):
        for layout in _settings(deg, batch, seq, micro_batches, zeros, remats, flash_attention):
            planned += 1
            try:
                given = (
                    margin_for(hardware, layout.zero, layout.remat) if margin is None else margin
                )
                plan = estimate(model, hardware, layout, margin=given)
            except PlanError:
                refused += 1
                continue
            key = tuple(deg[a] for a in ("pp", "dp", "ep", "cp", "tp"))
            if plan.fits and (key not in best or _better(plan, best[key])):
                best[key] = plan
    if not best:
        raise PlanError(
            f"--search: no layout of {gpus} x {hardware.name} fits {model.name} at "
            f"{batch} sequences of {seq} (with the margin); try more --gpus."
        )
    ranked = sorted(best.values(), key=lambda p: (-p.mfu, -_headroom(p)))[:top]
    cal = default_calibration()
    for p in ranked:
        if cal is not None:
            p.mfu_expected, p.mfu_error = p.mfu * cal.factor, cal.error
    return SearchResult(ranked, planned, refused, batch)


def _headroom(plan: Plan) -> float:
    """The bytes of HBM a plan leaves free once its gradients and activations are scaled by
    its margin (negative: over)."""
    return plan.hbm_bytes - plan.bytes_with_margin


def _better(plan: Plan, kept: Plan) -> bool:
    """A faster plan wins; at the same optimistic MFU (within one part in 10^9, as ZeRO-1 and
    ZeRO-2 tie when their data-parallel traffic hides), the one with more headroom."""
    if math.isclose(plan.mfu, kept.mfu, rel_tol=1e-9):
        return _headroom(plan) > _headroom(kept)
    return plan.mfu > kept.mfu


def _settings(
    deg: dict, batch: int, seq: int, micro_batches: Sequence[int], zeros: Sequence[int],
    remats: Sequence[str], flash: bool,
) -> Iterator[Layout]:  # fmt: skip
    """Every setting of one layout at ``batch`` sequences per step."""
    ranks = deg["dp"] * deg["ep"]
    for mb in micro_batches:
        if batch % (ranks * mb):
            continue
        m = batch // (ranks * mb)
        vs = [1] + ([2] if deg["pp"] > 1 and m % deg["pp"] == 0 else [])
        for zero in zeros:
            for keep in (False, True) if zero == 3 else (False,):
                for remat in remats:
                    for v in vs:
                        yield Layout(
                            **deg, zero=zero, micro_batch=mb, grad_accum=m, seq=seq,
                            remat=remat, flash_attention=flash, virtual_stages=v,
                            keep_gathered=keep,
                        )  # fmt: skip


def format_search(result: SearchResult, seconds: float | None = None) -> str:
    """The ranking as a table, one layout a line."""
    first = result.plans[0]
    took = f" in {seconds:.1f} s" if seconds is not None else ""
    rows = [
        f"{first.model} on {math.prod(first.degrees.values())} x {first.hardware}, "
        f"{result.global_batch} sequences of {first.seq} per step: {result.planned} settings "
        f"planned{took} ({result.refused} refused); each layout once, at its best setting "
        "that fits with "
        + (
            f"the margin x{first.margin:g}"
            if first.margin_source == "given"
            else "its margin (column x: calibrated per ZeRO stage and remat on the peaks of its "
            "class where it has some, else the nearest schedule's, floor x1)"
        )
        + (
            "; one that fits only without it ('tight': measure it) is left out, and "
            "--margin 1 ranks it."
            if first.margin > 1 or first.margin_source != "given"
            else "."
        ),
        f"{'layout':<26} {'ZeRO':>4} {'mb':>3} {'remat':<5} {'x':>4} {'GB/dev, no margin':>17} "
        f"{'step s':>7} {'optimistic':>10} {'expected':>8}  crosses nodes",
    ]
    for p in result.plans:
        deg = " ".join(f"{a}{d}" for a, d in p.degrees.items() if d > 1) or "1 device"
        if p.options["virtual_stages"] > 1:
            deg += f" v{p.options['virtual_stages']}"
        zero = f"{p.zero}{'k' if p.options['keep_gathered'] else ''}"
        expected = f"{p.mfu_expected:8.1%}" if p.mfu_expected is not None else f"{'-':>8}"
        rows.append(
            f"{deg:<26} {zero:>4} {p.micro_batch:>3} {p.remat:<5} {p.margin:4.2f} "
            f"{p.per_device_bytes['total'] / 1e9:17.1f} {p.step_time_s:7.2f} {p.mfu:10.1%} "
            f"{expected}  {', '.join(p.crossing_axes) or '-'}"
        )
    if any(p.options["keep_gathered"] for p in result.plans):
        rows.append("ZeRO '3k': ZeRO-3 keeping the gathered weights from forward to backward.")
    return "\n".join(rows)


__all__ = ["SearchResult", "default_global_batch", "format_search", "search_layouts"]
