"""DP against FSDP (or any other strategy): step time, memory, collectives and MFU, in one run.

``compare_strategies`` trains one of the series' models for a few steps under each
strategy on the same devices, the same batch and the same initial parameters: the
``MLPStack`` of notebooks 03-06 (``model="mlp"``, the default) or the ``TransformerLM``
of notebook 08 (``model="transformer"``). It measures, per strategy:

* compile time (lowering + XLA compilation of the training step);
* step time over the timed steps after warm-up (median, min, max), each step ended with
  ``jax.block_until_ready`` and nothing else synchronising with the host in the loop;
* throughput (tokens per second of the median step);
* per-device bytes from ``step_memory`` and, on a GPU or TPU, the allocator's peak
  (``device_peak_bytes``, kept in the JSON; the table leaves it out, since nothing there
  says how it relates to XLA's planned bytes);
* the compiled step's collectives (``collective_stats``);
* FLOPs per step from the model's formula and from XLA's ``cost_analysis()``;
* MFU: formula FLOPs / (median step time x devices x the device's dense bf16 peak). The
  formula is the model's own ``train_flops_per_step()``: 6 x tokens x matmul parameters for
  the MLP; for the Transformer the same plus attention's score and weighted-sum matmuls,
  counted as PaLM does (Chowdhery et al. 2022, arXiv:2204.02311, Appendix B).

The same runs from a shell, with only jax, flax, optax, numpy (and matplotlib for
``--plot``) installed::

    PYTHONPATH=. python -m helpers.profile --strategies dp fsdp --preset tiny --json out.json
    PYTHONPATH=. python -m helpers.profile --model transformer --preset tiny

``compile_step`` compiles the same step without running it, for a strategy or for logical
rules of your own, and returns the executable and the parameters' shardings: what a
notebook reads the HLO, the schedule (``helpers.measuring.trace.hlo_schedule``) and the
``PartitionSpec`` s from.

What a step *should* cost (FLOPs per token, bytes per device, knees, N-GPU projections)
is ``helpers.measuring.cost_model``; the two figures are ``helpers.drawing.draw_profile``; what is trained
(the presets, resized to the mesh, and ``workload_for``, the one place that maps a model
choice to what is built and fed) is ``helpers.measuring.workload``. This module measures.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import platform as _platform
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec

from helpers import compat
from helpers.cli import OneLineParser, refuse, whole_number, writable_path
from helpers.measuring.cost_model import peak_flops
from helpers.measuring.measure import collective_stats, format_bytes, memory_per_device, step_memory
from helpers.measuring.results import StrategyResult, ratio_range, spread
from helpers.measuring.workload import (
    AXES,
    GPU_PRESETS,
    MODEL_PRESETS,
    PRESET_MULTIPLE,
    PRESETS,
    SMALL_GPU_BYTES,
    TRANSFORMER_PRESETS,
    Workload,
    choose_preset,
    config_dict,
    config_from_dict,
    degenerate,
    describe,
    device_memory_stats,
    fit_to_mesh,
    model_of,
    resolve_preset,
    workload_for,
)
from helpers.placing.devices import make_mesh, use_simulated_devices
from helpers.placing.models import ModelConfig, TransformerConfig
from helpers.placing.sharding import LOGICAL_RULES, logical_rules
from helpers.placing.train import (
    ShardedState,
    init_sharded,
    make_train_step,
    opt_state_shardings,
    param_shardings,
)

#: The public names; those of helpers.measuring.workload (what is trained) are re-exported here.
__all__ = [
    "AXES",
    "FLOPS_FORMULA",
    "GPU_COMPILER_OPTIONS",
    "GPU_PRESETS",
    "MODEL_PRESETS",
    "PRESETS",
    "PRESET_MULTIPLE",
    "CompiledStep",
    "ProjectionBase",
    "REFERENCE_GPU",
    "SMALL_GPU_BYTES",
    "StrategyResult",
    "TRANSFORMER_PRESETS",
    "Workload",
    "XLA_FLOPS_NOTE",
    "allocator_peak",
    "build_parser",
    "choose_preset",
    "compare_strategies",
    "compile_step",
    "config_dict",
    "config_from_dict",
    "degenerate",
    "describe",
    "device_memory_stats",
    "environment",
    "fit_to_mesh",
    "format_table",
    "gpu_compiler_options",
    "main",
    "mfu",
    "mfu_note",
    "model_of",
    "program_fingerprint",
    "projection_base",
    "reference_measurement",
    "ratio_range",
    "report_dict",
    "resolve_preset",
    "spread",
    "workload_for",
]

P = PartitionSpec

#: XLA options for every GPU step the profile compiles. The latency-hiding scheduler, which
#: moves collectives to overlap them with compute, is off by default in XLA
#: (xla/debug_options_flags.cc); JAX's GPU performance tips list it first for overlapping
#: communication (https://docs.jax.dev/en/latest/gpu_performance_tips.html). Their other
#: flags (combine thresholds, memory slop factor) are tuning knobs left at XLA's defaults.
#: Passed to ``Lowered.compile``: no restart needed, and a flag set in ``$XLA_FLAGS`` wins.
GPU_COMPILER_OPTIONS: dict[str, Any] = {"xla_gpu_enable_latency_hiding_scheduler": True}

XLA_FLOPS_NOTE = (
    "XLA cost_analysis() of the per-device SPMD program "
    "(1/N of the step unless devices repeat work)"
)
#: What each model's formula FLOPs count (its ``train_flops_per_step()``).
FLOPS_FORMULA = {
    "mlp": "6 x tokens x matmul parameters",
    "transformer": (
        "tokens x (6 x matmul parameters + 12 x layers x heads x head_dim x seq): attention "
        "included, as PaLM counts it, arXiv:2204.02311 Appendix B"
    ),
}


def mfu_note(model: str = "mlp") -> str:
    """The sentence that says what MFU divides, for ``model`` ("mlp" or "transformer")."""
    return (
        f"MFU = model FLOPs per step (formula {FLOPS_FORMULA[model]}) / "
        "(median step time x devices x dense bf16 peak per device)"
    )


def gpu_compiler_options() -> dict[str, Any]:
    """``GPU_COMPILER_OPTIONS`` without the flags already set in ``$XLA_FLAGS`` (yours win)."""
    env = os.environ.get("XLA_FLAGS", "")
    return {k: v for k, v in GPU_COMPILER_OPTIONS.items() if f"--{k}" not in env}


def mfu(flops_per_step: float, step_s: float, n_devices: int, peak: float | None) -> float | None:
    """Model FLOPs utilisation: ``flops_per_step / (step_s * n_devices * peak)``; None without a peak."""
    if peak is None or step_s <= 0:
        return None
    return flops_per_step / (step_s * n_devices * peak)


# ---------------------------------------------------------------------------
# Reading the allocator
# ---------------------------------------------------------------------------


def allocator_peak(devices: Sequence[Any]) -> int | None:
    """The largest ``memory_stats()['peak_bytes_in_use']`` over ``devices``; None on a CPU.

    This is the allocator's high-water mark since the process started: it never goes down.
    """
    peaks = [
        s["peak_bytes_in_use"]
        for s in map(device_memory_stats, devices)
        if s and "peak_bytes_in_use" in s
    ]
    return int(max(peaks)) if peaks else None


# ---------------------------------------------------------------------------
# One strategy
# ---------------------------------------------------------------------------


def program_fingerprint(compiled: Any) -> str:
    """A hash of the compiled step's HLO without names, metadata and sharding annotations.

    Two strategies with the same fingerprint run the same program: on one device DP and
    FSDP differ only in the (trivial) sharding annotations, which are removed here.
    """
    lines = compiled.as_text().splitlines()
    # Keep the computations only: drop "HloModule <name>, ..." and the source-location
    # tables (FileNames, FileLocations, ...) that newer jax prints before them.
    start = next((i for i, line in enumerate(lines) if line.startswith(("%", "ENTRY"))), len(lines))
    text = "\n".join(lines[start:])
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    text = re.sub(r",?\s*(?:frontend_attributes|metadata)=\{[^{}]*\}", "", text)
    return hashlib.sha256(_drop_shardings(text).encode()).hexdigest()[:16]


def _drop_shardings(text: str) -> str:
    """Remove every ``sharding={...}`` annotation (braces may nest) from HLO text."""
    out, i = [], 0
    for m in re.finditer(r",?\s*sharding=\{", text):
        if m.start() < i:
            continue
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        out.append(text[i : m.start()])
        i = j
    out.append(text[i:])
    return "".join(out)


@dataclass
class _Compiled:
    """One strategy's compiled step, and what ``_run`` needs to feed it."""

    step: Any  # the compiled executable
    rules: tuple[tuple[str, Any], ...]
    result: StrategyResult


def _log_to(progress: bool | Callable[[str], None]) -> Callable[[str], None]:
    if callable(progress):
        return progress
    if progress:
        return lambda msg: print(f"[profile] {msg}", flush=True)
    return lambda msg: None


def _abstract(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shardings
    )


def _compile(
    rules: tuple[tuple[str, Any], ...],
    wl: Workload,
    mesh: Any,
    optimizer: Any,
    options: dict[str, Any],
) -> tuple[Any, Any, float]:
    """Compile the step of one layout (logical rules) from abstract arguments (nothing is
    allocated yet): ``(compiled, abstract parameters with their shardings, seconds)``."""
    model, x_init = wl.model(), wl.x_init(mesh)
    shardings = param_shardings(model, x_init, mesh, rules)
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), x_init)["params"])
    params = _abstract(nn.meta.unbox(params), shardings)
    opt_shardings = opt_state_shardings(optimizer, params, shardings, mesh)
    opt_state = _abstract(jax.eval_shape(optimizer.init, params), opt_shardings)
    spec = ShardedState(None, None, shardings, opt_shardings)
    step = make_train_step(model, optimizer, mesh, spec, rules)
    t0 = time.perf_counter()
    compiled = step.lower(params, opt_state, *wl.abstract_batch(mesh)).compile(options or None)
    return compiled, params, time.perf_counter() - t0


def _refuse(
    strategies: Sequence[str],
    wl: Workload,
    devices: Sequence[Any],
    shape: tuple[int, int],
    steps: int,
    warmup: int,
    dry_run: bool,
    allow_cpu: bool,
) -> None:
    """Raise ``ValueError`` for a request that would measure nothing meaningful."""
    if steps < 1 or warmup < 0:
        raise ValueError(
            f"compare_strategies: steps={steps} must be >= 1 and warmup={warmup} >= 0."
        )
    if len(set(strategies)) != len(strategies):
        raise ValueError(f"compare_strategies: strategies {tuple(strategies)} repeat a name.")
    for s in strategies:
        logical_rules(s)  # a clear ValueError for an unknown name
    if math.prod(shape) != len(devices):
        raise ValueError(
            f"compare_strategies: mesh_shape={shape} holds {math.prod(shape)} devices, but "
            f"{len(devices)} are in use; give a shape whose sizes multiply to {len(devices)}."
        )
    problems = [p for p in (degenerate(s, shape) for s in strategies) if p]
    if problems:
        raise ValueError("compare_strategies: " + " ".join(problems))
    if devices[0].platform == "cpu" and wl.name in GPU_PRESETS and not dry_run and not allow_cpu:
        raise ValueError(
            f"preset {wl.name!r} of model {wl.model_name!r} is sized for a GPU "
            f"({wl.flops_per_step / 1e12:.1f} TFLOP per "
            f"step on {len(devices)} devices), but JAX sees only CPU devices here. On a machine with an NVIDIA GPU, "
            "install a CUDA build of jax (README, 'On a GPU') and check that jax.devices() "
            "lists it. To compile without running use --dry-run (dry_run=True); to run on the "
            "CPU anyway, --allow-cpu (allow_cpu=True)."
        )


def compare_strategies(
    strategies: Sequence[str] = ("dp", "fsdp"),
    preset: str | ModelConfig | TransformerConfig = "auto",
    steps: int = 10,
    warmup: int = 3,
    devices: Sequence[Any] | None = None,
    progress: bool | Callable[[str], None] = True,
    *,
    model: str | None = None,
    batch_per_device: int | None = None,
    mesh_shape: tuple[int, int] | None = None,
    remat: bool = False,
    dry_run: bool = False,
    allow_cpu: bool = False,
    seed: int = 0,
    trace_dir: str | os.PathLike[str] | None = None,
    trace_steps: int = 2,
    compiler_options: dict[str, Any] | None = None,
) -> list[StrategyResult]:
    """Train the same model under each strategy on the same devices and measure each, side by side.

    Args:
      strategies: names from ``LOGICAL_RULES`` (``dp``, ``fsdp``, ``fsdp_all``, ``tp``,
        ``hybrid``, ``fsdp_tp``, ``tp_sp``).
      preset: ``"tiny"``, ``"gpu_small"``, ``"gpu"``, ``"auto"`` (by what ``devices`` holds:
        see ``choose_preset``) or a ``ModelConfig`` / ``TransformerConfig`` whose ``batch``
        is per device. A preset's widths are rounded up to fit the mesh (``fit_to_mesh``);
        a config is not.
      steps: timed steps per strategy, after ``warmup`` untimed ones.
      devices: the devices to use (default: all of ``jax.devices()``).
      model: whose preset: ``"mlp"`` (default; ``PRESETS``) or ``"transformer"``
        (``TRANSFORMER_PRESETS``: the ``TransformerLM`` of notebook 08, trained on
        ``synthetic_tokens``). A config given as ``preset`` is its own model.
      progress: print a flushed line per phase (or pass a callable that takes the line).
      batch_per_device: overrides the preset's per-device batch.
      mesh_shape: the ("data", "model") mesh, using every device; default
        ``(len(devices), 1)``. The global batch is ``batch_per_device`` times the "data" size.
      remat: wrap the model in ``nn.remat``: the backward pass recomputes the forward.
      dry_run: compile and analyse only; allocate nothing and run no step.
      allow_cpu: run a GPU preset on CPU devices anyway (it is refused otherwise).
      seed: the same key initialises every strategy, so their losses can be compared.
      trace_dir: after the timed steps, run ``trace_steps`` more under ``jax.profiler``
        (``compat.profiler_trace``) and write the trace to ``trace_dir/<strategy>``
        (``StrategyResult.trace_dir``; read it with ``helpers.measuring.trace``). The timed steps are
        never traced.
      compiler_options: XLA options for every compile, instead of the default
        (``gpu_compiler_options()`` on a GPU, none elsewhere); ``{}`` compiles with XLA's
        defaults.

    Raises:
      ValueError: ``trace_dir`` with ``dry_run``, ``trace_steps`` < 1, an unknown or
        repeated strategy, an unknown model (or one that ``preset``
        contradicts), a mesh that does not use every device, a strategy the mesh leaves
        degenerate (see ``degenerate``), or a GPU preset about to run on CPU devices.

    On a GPU every step is compiled with ``gpu_compiler_options()``. Every strategy is
    compiled first; they then run in order of the compiled step's memory, smallest first,
    so that on a GPU each one can raise the allocator's high-water mark
    (``device_peak_raised`` says whether it did). Results come back in the order asked.
    """
    log = _log_to(progress)
    if trace_dir is not None and dry_run:
        raise ValueError(
            "compare_strategies: trace_dir needs steps that run, but dry_run=True only "
            "compiles; drop one of them."
        )
    if trace_steps < 1:
        raise ValueError(f"compare_strategies: trace_steps={trace_steps} must be >= 1.")
    devices = list(jax.devices() if devices is None else devices)
    shape = (len(devices), 1) if mesh_shape is None else tuple(mesh_shape)
    wl = workload_for(preset, strategies, devices, shape, batch_per_device, remat, model)
    _refuse(strategies, wl, devices, shape, steps, warmup, dry_run, allow_cpu)
    kind, platform = devices[0].device_kind, devices[0].platform
    peak = peak_flops(kind)
    if compiler_options is not None:
        options = dict(compiler_options)
    else:
        options = gpu_compiler_options() if platform == "gpu" else {}
    mesh = make_mesh(shape, AXES, devices=devices)
    optimizer = optax.adam(1e-3)
    log(
        f"model '{wl.model_name}', preset '{wl.name}': {describe(wl.cfg)}; "
        f"{wl.cfg.param_count() / 1e6:,.1f} M parameters "
        f"({jnp.dtype(wl.cfg.dtype).name} compute{', remat' if wl.remat else ''}), "
        f"{len(devices)} x {kind} ({platform}), mesh {shape} (data, model), "
        f"global batch {wl.cfg.batch} x seq {wl.cfg.seq}"
        + (f"; resized: {wl.resized}" if wl.resized else "")
    )
    compiled: dict[str, _Compiled] = {}
    for strategy in strategies:
        compiled[strategy] = _compile_strategy(
            strategy, wl, mesh, optimizer, options, len(devices), shape, (kind, platform), peak, log
        )

    if not dry_run:
        batch = wl.batch(jax.random.key(seed + 1), mesh)  # one batch, shared by every strategy
        for c in sorted(compiled.values(), key=lambda c: c.result.step_memory["total"]):
            where = None if trace_dir is None else os.path.join(trace_dir, c.result.strategy)
            _run(c, wl, mesh, optimizer, batch, steps, warmup, seed, devices, log, where,
                 trace_steps)  # fmt: skip
    return [compiled[s].result for s in strategies]


def _compile_strategy(
    strategy: str,
    wl: Workload,
    mesh: Any,
    optimizer: Any,
    options: dict[str, Any],
    n_devices: int,
    shape: tuple[int, ...],
    where: tuple[str, str],
    peak: tuple[str, float] | None,
    log: Callable[[str], None],
) -> _Compiled:
    """Compile ``strategy``'s training step and fill in all that compiling tells."""
    kind, platform = where
    log(f"{strategy}: compiling the training step")
    rules = logical_rules(strategy)
    step, _, compile_s = _compile(rules, wl, mesh, optimizer, options)
    stats = collective_stats(step)
    result = StrategyResult(
        strategy=strategy,
        model=wl.model_name,
        preset=wl.name,
        config=config_dict(wl.cfg),
        batch_per_device=wl.batch_per_device,
        n_devices=n_devices,
        mesh_shape=shape,
        platform=platform,
        device_kind=kind,
        tokens_per_step=wl.tokens_per_step,
        n_params=wl.cfg.param_count(),
        compile_s=compile_s,
        step_memory=step_memory(step),
        collectives=stats,
        comm_bytes_per_device=float(sum(s["sent_per_device"] for s in stats.values())),
        flops_formula=wl.flops_per_step,
        flops_hlo_per_device=compat.cost_flops(step),
        program_fingerprint=program_fingerprint(step),
        peak_name=None if peak is None else peak[0],
        peak_flops_per_device=None if peak is None else peak[1],
        remat=wl.remat,
        resized=wl.resized,
        compiler_options=dict(options),
    )
    log(
        f"{strategy}: compiled in {compile_s:.2f} s; step needs "
        f"{format_bytes(result.step_memory['total'])} per device"
    )
    return _Compiled(step, rules, result)


@dataclass(frozen=True)
class CompiledStep:
    """One layout's training step, compiled and never run (``compile_step``)."""

    compiled: Any  # the executable: .as_text(), .memory_analysis(), collective_stats(...)
    params: Any  # the parameters as abstract arrays: .shape, .dtype, .sharding (.spec)
    logical: Any  # the same tree of each parameter's logical names, as PartitionSpecs
    workload: Workload
    rules: tuple[tuple[str, Any], ...]


def _check_rules(rules: Any) -> tuple[tuple[str, Any], ...]:
    """``rules`` as a tuple of (logical name, mesh axes) pairs, or a ValueError naming it."""

    def axes_ok(entry: Any) -> bool:
        names = (entry,) if isinstance(entry, str) else entry
        return entry is None or (isinstance(names, tuple | list) and all(a in AXES for a in names))

    try:
        pairs = tuple((name, entry) for name, entry in rules)
    except (TypeError, ValueError):
        pairs = None
    if not pairs or not all(isinstance(n, str) and axes_ok(e) for n, e in pairs):
        raise ValueError(
            f"compile_step: layout={rules!r} is neither a strategy of LOGICAL_RULES "
            f"({', '.join(sorted(LOGICAL_RULES))}) nor logical rules: pairs of a logical name "
            f"and None, a mesh axis of {AXES} or a tuple of them."
        )
    return pairs


def compile_step(
    layout: str | Sequence[tuple[str, Any]] = "fsdp",
    preset: str | ModelConfig | TransformerConfig = "auto",
    *,
    devices: Sequence[Any] | None = None,
    mesh_shape: tuple[int, int] | None = None,
    batch_per_device: int | None = None,
    remat: bool = False,
    model: str | None = None,
    compiler_options: dict[str, Any] | None = None,
    resize_for: Sequence[str] | None = None,
) -> CompiledStep:
    """Compile the training step ``compare_strategies`` would time, and run nothing.

    ``layout`` is a strategy of ``LOGICAL_RULES`` (``"dp"``, ``"fsdp"``, ...) or logical
    rules of your own: pairs of a logical name and the mesh axes it splits over (None to
    keep it whole), as ``LOGICAL_RULES`` holds them. The model, mesh, optimizer and
    compiler options are ``compare_strategies``'s for the same arguments. A preset's
    widths are rounded up to fit the mesh (``fit_to_mesh``) for the strategies named in
    ``resize_for`` (default: ``layout`` when it is a name): ``compare_strategies`` rounds
    them for every strategy it compares, so pass the same strategies to compile the same
    model. With rules of your own, give a ``ModelConfig`` whose split widths the mesh
    divides, or ``resize_for``. Read the program with
    ``collective_stats(step.compiled)``, ``step_memory(step.compiled)`` or
    ``hlo_schedule(step.compiled)``; each parameter's ``PartitionSpec`` is
    ``step.params[...].sharding.spec``, its logical names ``step.logical[...]``.

    Raises:
      ValueError: an unknown strategy, rules that are not (name, mesh axes) pairs, a mesh
        that does not use every device or leaves the strategy degenerate.
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = (len(devices), 1) if mesh_shape is None else tuple(mesh_shape)
    rules = logical_rules(layout) if isinstance(layout, str) else _check_rules(layout)
    strategies = (layout,) if isinstance(layout, str) else ()
    if resize_for is not None:
        for name in resize_for:
            logical_rules(name)  # a clear ValueError for an unknown name
    fit = strategies if resize_for is None else tuple(resize_for)
    wl = workload_for(preset, fit, devices, shape, batch_per_device, remat, model)
    _refuse(strategies, wl, devices, shape, 1, 0, True, False)
    if compiler_options is not None:
        options = dict(compiler_options)
    else:
        options = gpu_compiler_options() if devices[0].platform == "gpu" else {}
    mesh = make_mesh(shape, AXES, devices=devices)
    compiled, params, _ = _compile(rules, wl, mesh, optax.adam(1e-3), options)
    boxed = jax.eval_shape(lambda: wl.model().init(jax.random.key(0), wl.x_init(mesh))["params"])
    return CompiledStep(compiled, params, nn.get_partition_spec(boxed), wl, rules)


def _run(
    c: _Compiled,
    wl: Workload,
    mesh: Any,
    optimizer: Any,
    batch: tuple[jax.Array, jax.Array],
    steps: int,
    warmup: int,
    seed: int,
    devices: Sequence[Any],
    log: Callable[[str], None],
    trace_dir: str | None = None,
    trace_steps: int = 2,
) -> None:
    res, run = c.result, c.step
    peak_before = allocator_peak(devices)
    log(f"{res.strategy}: initialising parameters and optimizer state on the mesh")
    state = init_sharded(
        wl.model(), wl.x_init(mesh), mesh, c.rules, jax.random.key(seed), optimizer
    )
    res.state_bytes_per_device = max(memory_per_device((state.params, state.opt_state)).values())
    params, opt_state = state.params, state.opt_state
    del state
    log(f"{res.strategy}: {warmup} warm-up + {steps} timed steps")
    for _ in range(warmup):
        params, opt_state, loss = run(params, opt_state, *batch)
    jax.block_until_ready((params, opt_state))
    times, losses = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        params, opt_state, loss = run(params, opt_state, *batch)
        jax.block_until_ready((params, opt_state, loss))
        times.append(time.perf_counter() - t0)
        losses.append(loss)
    res.steps, res.warmup = steps, warmup
    res.losses = [float(v) for v in losses]  # read back only after the timed loop
    res.step_times_s = times
    res.step_median_s = statistics.median(times)
    res.step_min_s, res.step_max_s = min(times), max(times)
    res.tokens_per_s = res.tokens_per_step / res.step_median_s
    res.mfu = mfu(res.flops_formula, res.step_median_s, res.n_devices, res.peak_flops_per_device)
    res.device_peak_bytes = allocator_peak(devices)
    if res.device_peak_bytes is not None:
        res.device_peak_raised = peak_before is None or res.device_peak_bytes > peak_before
    if trace_dir is not None:
        log(f"{res.strategy}: {trace_steps} more steps under jax.profiler -> {trace_dir}")
        with compat.profiler_trace(trace_dir):
            for i in range(trace_steps):
                with jax.profiler.StepTraceAnnotation("train_step", step_num=i):
                    params, opt_state, loss = run(params, opt_state, *batch)
                    jax.block_until_ready((params, opt_state, loss))
        res.trace_dir = trace_dir
    del params, opt_state, loss, losses
    mfu_text = "n/a" if res.mfu is None else f"{res.mfu:.1%}"
    log(f"{res.strategy}: median step {_fmt_time(res.step_median_s)}, MFU {mfu_text}")


# ---------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------


def _fmt_time(s: float | None) -> str:
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} us"


def _fmt_flops(f: float | None) -> str:
    if f is None:
        return "n/a"
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if abs(f) >= scale:
            return f"{f / scale:.2f} {unit}"
    return f"{f:.0f} FLOP"


def format_table(results: Sequence[StrategyResult]) -> str:
    """The results as text: one column per strategy, one row per measurement, then notes."""
    if not results:
        return "no results"
    rows = _table_rows(results)
    widths = [max(len(rw[i]) for rw in rows) for i in range(len(rows[0]))]
    lines = [_table_header(results[0]), ""]
    lines += [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(rw, widths, strict=True))
        )
        for rw in rows
    ]
    lines.append("")
    lines += _table_notes(results)
    return "\n".join(lines)


def _table_header(r0: StrategyResult) -> str:
    """The table's opening lines: model, devices, mesh, batch and what was timed."""
    return (
        f"model '{r0.model}', preset '{r0.preset}' ({r0.n_params / 1e6:,.1f} M parameters, "
        f"{r0.config['dtype']} compute, "
        f"{r0.config['param_dtype']} parameters{', remat' if r0.remat else ''}) on "
        f"{r0.n_devices} x {r0.device_kind} ({r0.platform}), mesh {r0.mesh_shape} (data, model)\n"
        f"{describe(config_from_dict(r0.config, r0.model))}\n"
        f"global batch {r0.config['batch']} x seq {r0.config['seq']} = {r0.tokens_per_step:,} tokens per step"
        + (
            f"; {r0.steps} timed step(s) after {r0.warmup} warm-up"
            if r0.steps
            else "; dry run: compiled only"
        )
        + (f"\nresized to fit the mesh: {r0.resized}" if r0.resized else "")
    )


def _table_rows(results: Sequence[StrategyResult]) -> list[tuple[str, ...]]:
    """The table's rows: a label, then one cell per strategy."""

    def row(label: str, fn: Callable[[StrategyResult], str]) -> tuple[str, ...]:
        return (label, *(fn(r) for r in results))

    def opt(value: Any, fmt: Callable[[Any], str]) -> str:
        return "-" if value is None else fmt(value)

    return [
        ("", *(r.strategy for r in results)),
        row("compile time", lambda r: _fmt_time(r.compile_s)),
        row("step time (median)", lambda r: _fmt_time(r.step_median_s)),
        row(
            "step time (min - max)",
            lambda r: opt(r.step_min_s, lambda s: f"{_fmt_time(s)} - {_fmt_time(r.step_max_s)}"),
        ),
        row("spread (max-min)/median", lambda r: opt(spread(r), lambda s: f"{s:.0%}")),
        row("tokens / s", lambda r: opt(r.tokens_per_s, lambda t: f"{t:,.0f}")),
        row("step memory / device", lambda r: format_bytes(r.step_memory["total"])),
        row("  arguments", lambda r: format_bytes(r.step_memory["argument"])),
        row("  temporaries", lambda r: format_bytes(r.step_memory["temp"])),
        row("params + Adam / device", lambda r: opt(r.state_bytes_per_device, format_bytes)),
        row(
            "collectives",
            lambda r: (
                ", ".join(f"{k} x{int(v['ops'])}" for k, v in r.collectives.items()) or "none"
            ),
        ),
        row("sent / device (ring)", lambda r: format_bytes(r.comm_bytes_per_device)),
        row("FLOPs / step (formula)", lambda r: _fmt_flops(r.flops_formula)),
        row("FLOPs / device (XLA)", lambda r: _fmt_flops(r.flops_hlo_per_device)),
        row("MFU (formula FLOPs)", lambda r: "n/a" if r.mfu is None else f"{r.mfu:.1%}"),
        row("loss (last step)", lambda r: f"{r.losses[-1]:.5f}" if r.losses else "-"),
    ]


def _table_notes(results: Sequence[StrategyResult]) -> list[str]:
    """The lines under the table: ratios, what MFU and FLOPs mean, and caveats."""
    r0 = results[0]
    lines: list[str] = []
    timed = [r for r in results if r.step_median_s]
    if len(timed) > 1:
        base = timed[0]
        ratios = "; ".join(
            f"{r.strategy}/{base.strategy} = {m:.2f} (any two steps: {lo:.2f} to {hi:.2f})"
            for r in timed[1:]
            for m, lo, hi in [ratio_range(r, base)]
        )
        lines.append(f"median step time ratios, same run: {ratios}")
    if r0.peak_flops_per_device is None:
        lines.append(
            f"MFU: n/a, no bf16 peak is known for '{r0.device_kind}'. "
            f"FLOPs / step (formula): {FLOPS_FORMULA[r0.model]}."
        )
    else:
        lines.append(
            f"{mfu_note(r0.model)}; peak {r0.peak_name} = {r0.peak_flops_per_device / 1e12:.0f} TFLOP/s."
        )
    lines.append(f"FLOPs / device: {XLA_FLOPS_NOTE}.")
    if r0.compiler_options:
        flags = ", ".join(f"{k}={str(v).lower()}" for k, v in r0.compiler_options.items())
        lines.append(
            f"compiled with {flags}: XLA may overlap collectives with compute; this table does "
            "not show whether it did."
        )
    if r0.n_devices == 1:
        lines.append(
            "One device: every strategy compiles to the same one-device program, with no "
            "collectives; the table measures the step, not the strategies."
        )
    if r0.platform == "cpu":
        lines.append(
            "These are simulated CPU devices sharing this machine's cores: NOT GPU timings, "
            "and their ratios change from run to run. Read the bytes and the collectives."
        )
    return lines


def environment(devices: Sequence[Any] | None = None) -> dict[str, Any]:
    """Versions and devices, for the JSON record."""
    import flax
    import jaxlib

    devices = list(jax.devices() if devices is None else devices)
    return {
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "flax": flax.__version__,
        "optax": optax.__version__,
        "numpy": np.__version__,
        "python": _platform.python_version(),
        "platform": devices[0].platform,
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def report_dict(
    results: Sequence[StrategyResult], devices: Sequence[Any] | None = None
) -> dict[str, Any]:
    """Everything, JSON-ready: environment, preset config, notes and one entry per strategy."""
    r0 = results[0]
    return {
        "environment": environment(devices),
        "model": r0.model,
        "preset": r0.preset,
        "config": r0.config,
        "batch_per_device": r0.batch_per_device,
        "steps": r0.steps,
        "warmup": r0.warmup,
        "notes": {
            "mfu": mfu_note(r0.model),
            "flops_hlo_per_device": XLA_FLOPS_NOTE,
            "bytes": "per device",
            "simulated": r0.platform == "cpu",
        },
        "results": [r.to_dict() for r in results],
    }


# ---------------------------------------------------------------------------
# Where a projection starts
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ProjectionBase:
    """What an N-GPU projection starts from: a model, its one-GPU step compute and FLOP/s."""

    cfg: ModelConfig | TransformerConfig  # batch is per device
    compute_s: float
    flops_per_s: float
    source: str


REFERENCE_GPU = "NVIDIA H100 80GB HBM3"


def reference_measurement(chip: str = "tpu_v5e") -> dict[str, Any]:
    """A profile measured on a real accelerator and committed with the package
    (``helpers/measuring/reference_<chip>.json``, written by ``.ci/accelerator_reference.py
    --collect``): the chip, the date, the versions, each model's profile, the levers, the
    trace, and what that call did not measure.

    Raises:
      ValueError: no reference is recorded for ``chip`` (the message lists those that are).
    """
    from pathlib import Path

    here = Path(__file__).parent
    path = here / f"reference_{chip}.json"
    if not isinstance(chip, str) or not path.exists():
        have = sorted(p.stem.removeprefix("reference_") for p in here.glob("reference_*.json"))
        raise ValueError(
            f"reference_measurement: chip={chip!r} has no reference; there are {have}."
        )
    return json.loads(path.read_text(encoding="utf-8"))


def projection_base(
    result: StrategyResult | None = None, reference: str = REFERENCE_GPU
) -> ProjectionBase:
    """The measured one-accelerator step of ``result``, or else the ``gpu`` preset at ``reference``'s peak.

    A measurement counts only when it ran on one accelerator (not CPU): its median step is
    the compute time and its formula FLOPs / median the achieved FLOP/s. Anything else (no
    result, CPU devices, several GPUs whose step includes communication) falls back to the
    scaling book's assumption: the ``gpu`` preset of ``result``'s model (the MLP's without
    a result) computing at 100% of the reference peak.
    """
    if (
        result is not None
        and result.platform != "cpu"
        and result.n_devices == 1
        and result.step_median_s
    ):
        cfg = dataclasses.replace(
            config_from_dict(result.config, result.model), batch=result.batch_per_device
        )
        return ProjectionBase(
            cfg,
            result.step_median_s,
            result.flops_formula / result.step_median_s,
            f"measured: model '{result.model}', preset '{result.preset}' on this "
            f"{result.device_kind}",
        )
    found = peak_flops(reference)
    if found is None:
        raise ValueError(f"projection_base: no bf16 peak is known for reference={reference!r}.")
    model = "mlp" if result is None else result.model
    cfg = MODEL_PRESETS[model]["gpu"]
    return ProjectionBase(
        cfg,
        cfg.train_flops_per_step() / found[1],
        found[1],
        f"assumed: model '{model}', preset 'gpu' on an {reference} at 100% of its bf16 peak",
    )


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def _mesh_shape(text: str) -> tuple[int, int]:
    try:
        shape = tuple(int(s) for s in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 2 or min(shape) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give the (data, model) mesh as two positive sizes, e.g. 2,4"
        )
    return shape  # type: ignore[return-value]


def build_parser() -> argparse.ArgumentParser:
    """The command line. Every flag's value is checked while parsing (``helpers.cli``)."""
    p = OneLineParser(
        prog="python -m helpers.profile",
        description="Compare DP and FSDP (or other strategies) on the MLP stack or a Transformer "
        "language model: step time, memory, collectives, MFU.",
    )
    _add_model_flags(p)
    _add_run_flags(p)
    _add_output_flags(p)
    return p


def _add_model_flags(p: argparse.ArgumentParser) -> None:
    """What to train: the strategies, the model and its size."""
    p.add_argument("--strategies", nargs="+", default=["dp", "fsdp"], choices=sorted(LOGICAL_RULES))
    p.add_argument(
        "--model",
        default="mlp",
        choices=list(MODEL_PRESETS),
        help="mlp: the MLP stack of notebooks 03-06 (default); transformer: notebook 08's "
        "decoder-only language model on generated tokens, its FLOPs counted with attention "
        "(PaLM, Appendix B)",
    )
    p.add_argument(
        "--preset",
        default="auto",
        choices=["auto", *dict.fromkeys(n for presets in MODEL_PRESETS.values() for n in presets)],
        help="the model's size: tiny (CPU, f32), gpu_small (a GPU < 40 GB), gpu (H100/H200); "
        "auto: tiny on CPU devices, else by the GPU's memory",
    )


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    """How to run it: steps, devices, mesh, batch, remat, dry run."""
    p.add_argument(
        "--steps",
        type=whole_number(1, 100_000),
        default=10,
        help="timed steps per strategy (default 10)",
    )
    p.add_argument(
        "--warmup", type=whole_number(0, 100_000), default=3, help="untimed steps first (default 3)"
    )
    p.add_argument(
        "--devices",
        type=whole_number(1, 4096),
        default=None,
        help="simulated CPU devices when there is no GPU (default: the mesh's size, else "
        "$NUM_DEVICES or 8)",
    )
    p.add_argument(
        "--mesh-shape",
        type=_mesh_shape,
        default=None,
        metavar="DATA,MODEL",
        help="the (data, model) mesh, e.g. 2,4 for hybrid, tp or fsdp_tp (default: N,1). "
        "A strategy the mesh leaves degenerate (tp on N,1; dp on 4,2) is refused",
    )
    p.add_argument(
        "--batch-per-device", type=whole_number(1), default=None, help="override the preset's batch"
    )
    p.add_argument(
        "--remat",
        action="store_true",
        help="wrap the model in nn.remat (the transformer: each of its blocks)",
    )
    p.add_argument("--dry-run", action="store_true", help="compile and analyse only; run no step")
    p.add_argument(
        "--allow-cpu",
        action="store_true",
        help="run a GPU preset (gpu, gpu_small) on CPU devices anyway; refused otherwise",
    )


def _add_output_flags(p: argparse.ArgumentParser) -> None:
    """Where the results go."""
    p.add_argument(
        "--json",
        metavar="PATH",
        type=writable_path,
        help="write every measurement, versions and config here",
    )
    p.add_argument(
        "--plot",
        metavar="PATH",
        type=writable_path,
        help="save a chart of step times and memory (matplotlib)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def parse_args(
    argv: Sequence[str] | None = None, parser: argparse.ArgumentParser | None = None
) -> argparse.Namespace:
    """Parse and check the command line: a bad value exits with code 2 and one line naming
    its flag, before any device is touched."""
    parser = parser or build_parser()
    args = parser.parse_args(argv)
    if len(set(args.strategies)) != len(args.strategies):
        refuse(parser, "--strategies", f"each strategy once, got {' '.join(args.strategies)}")
    if args.devices is not None and args.mesh_shape is not None:
        if math.prod(args.mesh_shape) != args.devices:
            refuse(parser, "--mesh-shape", f"a mesh of all --devices ({args.devices}), got "
                   f"{','.join(map(str, args.mesh_shape))}")  # fmt: skip
    if args.plot and args.json and os.path.abspath(args.plot) == os.path.abspath(args.json):
        refuse(parser, "--plot", "a different file from --json")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parse_args(argv, parser)
    count = args.devices
    if count is None and args.mesh_shape is not None:
        count = math.prod(args.mesh_shape)
    devices = use_simulated_devices(count, real_accelerators="auto")
    try:
        results = compare_strategies(
            args.strategies,
            preset=args.preset,
            model=args.model,
            steps=args.steps,
            warmup=args.warmup,
            devices=devices,
            progress=not args.quiet,
            batch_per_device=args.batch_per_device,
            mesh_shape=args.mesh_shape,
            remat=args.remat,
            dry_run=args.dry_run,
            allow_cpu=args.allow_cpu,
        )
    except ValueError as err:  # a refusal is one sentence, not a usage page
        print(f"{parser.prog}: {err}", file=sys.stderr)
        return 2
    print(format_table(results), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report_dict(results, devices), f, indent=2)
        print(f"wrote {args.json}", flush=True)
    if args.plot:
        if args.dry_run:
            print("--plot skipped: a dry run has no step times", flush=True)
        else:
            from helpers.drawing.draw_profile import plot_results

            plot_results(results).savefig(args.plot, dpi=120)
            print(f"wrote {args.plot}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
