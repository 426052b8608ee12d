"""DP against FSDP (or any other strategy): step time, memory, collectives and MFU, in one run.

``compare_strategies`` trains the series' ``MLPStack`` for a few steps under each
strategy on the same devices, the same batch and the same initial parameters, and
measures, per strategy:

* compile time (lowering + XLA compilation of the training step);
* step time over the timed steps after warm-up (median, min, max), each step ended with
  ``jax.block_until_ready`` and nothing else synchronising with the host in the loop;
* throughput (tokens per second of the median step);
* per-device bytes from ``step_memory`` and, on a GPU, the allocator's peak;
* the compiled step's collectives (``collective_stats``);
* FLOPs per step from the model's formula and from XLA's ``cost_analysis()``;
* MFU: formula FLOPs / (median step time x devices x the device's dense bf16 peak).

The same runs from a shell, with only jax, flax, optax, numpy (and matplotlib for
``--plot``) installed::

    PYTHONPATH=. python -m helpers.profile --strategies dp fsdp --preset tiny --json out.json

Also here: a cost model that projects N-GPU step times from a one-device compute time
plus collective bytes / interconnect bandwidth, and the scaling-book condition for
FSDP to stay compute-bound. matplotlib is imported only inside the plotting functions.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import platform as _platform
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from helpers import compat
from helpers.devices import make_mesh, use_simulated_devices
from helpers.measure import collective_stats, format_bytes, memory_per_device, step_memory
from helpers.models import ModelConfig, synthetic_batch
from helpers.sharding import LOGICAL_RULES, logical_rules
from helpers.train import (
    ShardedState,
    init_sharded,
    make_train_step,
    opt_state_shardings,
    param_shardings,
)

P = PartitionSpec

# ---------------------------------------------------------------------------
# Presets. ``batch`` is PER DEVICE here: the run multiplies it by the size of the mesh's
# "data" axis (weak scaling: each device keeps the same amount of work as devices are added).
# ---------------------------------------------------------------------------

PRESETS: dict[str, ModelConfig] = {
    # Seconds on simulated CPU devices; f32, because bf16 matmuls on a CPU are emulated.
    "tiny": ModelConfig(d_model=128, d_ff=512, n_layers=2, n_classes=16, batch=4, seq=16),
    # A GPU with < 40 GB (L4, T4, A100-40GB): 134 M parameters, bf16 compute, f32 weights.
    "gpu_small": ModelConfig(
        d_model=2048, d_ff=8192, n_layers=4, n_classes=128, batch=4, seq=1024, dtype=jnp.bfloat16
    ),
    # An H100/H200-class GPU: 537 M parameters, bf16 compute with f32 master weights (MLPStack
    # keeps param_dtype float32; the Dense layers cast kernels to bf16 for the matmuls).
    # Every dimension is a multiple of 128 and each device sees 8 x 2048 = 16,384 tokens, so
    # the step is dominated by (16384 x 4096) @ (4096 x 16384) matmuls. Compiled for CPU
    # (`--dry-run`), DP's step plans about 27 GiB per device: it fits an 80 GB GPU with room.
    "gpu": ModelConfig(
        d_model=4096, d_ff=16384, n_layers=4, n_classes=128, batch=8, seq=2048, dtype=jnp.bfloat16
    ),
}

#: ``preset="auto"`` picks ``gpu_small`` below this much accelerator memory per device.
SMALL_GPU_BYTES = 40 * 2**30

# ---------------------------------------------------------------------------
# Peak FLOP/s and interconnect bandwidth
# ---------------------------------------------------------------------------

# Dense (no 2:4 sparsity) bf16 tensor-core peak FLOP/s per device, from NVIDIA's product
# datasheets, which list the sparse figure; dense is half of it:
#   H100 SXM5 and H200 SXM: 1,979 TFLOPS sparse -> 989; H100 NVL and H200 NVL: 1,671 -> 835;
#   H100 PCIe: 1,513 -> 756; A100 (SXM4 and PCIe, 40 and 80 GB): 312 dense;
#   L4: 242 sparse -> 121; T4: 65 TFLOPS FP16 (Turing has no bf16 tensor cores, so a bf16
#   model runs on the T4 far below this figure).
# The first pattern that matches ``device.device_kind`` (case-insensitive) wins.
PEAK_BF16_FLOPS: tuple[tuple[str, str, float], ...] = (
    (r"H200.*NVL", "H200 NVL", 835e12),
    (r"H200", "H200 SXM", 989e12),
    (r"H100.*NVL", "H100 NVL", 835e12),
    (r"H100.*PCIe", "H100 PCIe", 756e12),
    (r"H100", "H100 SXM", 989e12),
    (r"A100", "A100", 312e12),
    (r"\bL4\b", "L4", 121e12),
    (r"\bT4\b", "T4 (FP16 peak)", 65e12),
)

# Interconnect bandwidth per GPU and PER DIRECTION, the figure a ring collective runs at,
# from NVIDIA's datasheets (which quote the bidirectional total):
NVLINK4 = 450e9  # H100/H200 SXM, NVLink 4: 900 GB/s total
NVLINK3 = 300e9  # A100 SXM, NVLink 3: 600 GB/s total
PCIE5_X16 = 64e9  # PCIe Gen5 x16: 128 GB/s total (H100 PCIe, H200 NVL host link)
PCIE4_X16 = 32e9  # PCIe Gen4 x16: 64 GB/s total (A100 PCIe, L4)
INTERCONNECTS: dict[str, float] = {
    "NVLink 4 (H100/H200 SXM)": NVLINK4,
    "NVLink 3 (A100 SXM)": NVLINK3,
    "PCIe Gen5 x16": PCIE5_X16,
    "PCIe Gen4 x16": PCIE4_X16,
}

MFU_SOURCE = "formula"
MFU_NOTE = (
    "MFU = model FLOPs per step (formula 6 x tokens x matmul parameters) / "
    "(median step time x devices x dense bf16 peak per device)"
)


def peak_flops(device_kind: str) -> tuple[str, float] | None:
    """``(name, dense bf16 FLOP/s)`` of a device from ``PEAK_BF16_FLOPS``, or None if unknown.

    >>> peak_flops("NVIDIA H100 80GB HBM3")
    ('H100 SXM', 989000000000000.0)
    """
    for pattern, name, flops in PEAK_BF16_FLOPS:
        if re.search(pattern, device_kind, re.IGNORECASE):
            return name, flops
    return None


def mfu(flops_per_step: float, step_s: float, n_devices: int, peak: float | None) -> float | None:
    """Model FLOPs utilisation: ``flops_per_step / (step_s * n_devices * peak)``; None without a peak."""
    if peak is None or step_s <= 0:
        return None
    return flops_per_step / (step_s * n_devices * peak)


# ---------------------------------------------------------------------------
# Choosing a preset, reading the allocator
# ---------------------------------------------------------------------------


def _memory_stats(device: Any) -> dict[str, Any] | None:
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - some backends do not implement it
        return None
    return stats or None


def allocator_peak(devices: Sequence[Any]) -> int | None:
    """The largest ``memory_stats()['peak_bytes_in_use']`` over ``devices``; None on a CPU.

    This is the allocator's high-water mark since the process started: it never goes down.
    """
    peaks = [
        s["peak_bytes_in_use"]
        for s in map(_memory_stats, devices)
        if s and "peak_bytes_in_use" in s
    ]
    return int(max(peaks)) if peaks else None


def choose_preset(devices: Sequence[Any]) -> str:
    """``tiny`` on CPU devices; on accelerators ``gpu``, or ``gpu_small`` with < 40 GiB each."""
    if devices[0].platform == "cpu":
        return "tiny"
    limits = [s["bytes_limit"] for s in map(_memory_stats, devices) if s and "bytes_limit" in s]
    if limits and min(limits) < SMALL_GPU_BYTES:
        return "gpu_small"
    return "gpu"


def resolve_preset(preset: str | ModelConfig, devices: Sequence[Any]) -> tuple[str, ModelConfig]:
    """``(name, per-device config)`` for a preset name, ``"auto"`` or a ``ModelConfig``."""
    if isinstance(preset, ModelConfig):
        return "custom", preset
    name = choose_preset(devices) if preset == "auto" else preset
    if name not in PRESETS:
        raise ValueError(
            f"preset={preset!r} is not one of {['auto', *PRESETS]} (or a ModelConfig)."
        )
    return name, PRESETS[name]


def config_dict(cfg: ModelConfig) -> dict[str, Any]:
    """A ``ModelConfig`` as JSON-ready values, with parameter count and compute/param dtypes."""
    out = dataclasses.asdict(cfg)
    out["dtype"] = jnp.dtype(cfg.dtype).name
    out["param_dtype"] = jnp.dtype(cfg.model().param_dtype).name
    out["param_count"] = cfg.param_count()
    return out


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
class StrategyResult:
    """Everything ``compare_strategies`` measured for one strategy. ``to_dict()`` for JSON.

    Byte counts are per device. ``flops_formula`` is the whole step (all devices);
    ``flops_hlo_per_device`` is XLA's ``cost_analysis()`` of the compiled SPMD program,
    which is the program ONE device runs: 1/N of the step's work unless devices repeat work.
    Timing fields are None after a ``dry_run`` (compiled, never run).
    """

    strategy: str
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
    mfu_source: str = MFU_SOURCE
    losses: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["mesh_shape"] = list(self.mesh_shape)
        return out


def _log_to(progress: bool | Callable[[str], None]) -> Callable[[str], None]:
    if callable(progress):
        return progress
    if progress:
        return lambda msg: print(f"[profile] {msg}", flush=True)
    return lambda msg: None


def _mesh_for(devices: Sequence[Any], mesh_shape: tuple[int, int] | None) -> Any:
    shape = (len(devices), 1) if mesh_shape is None else tuple(mesh_shape)
    return make_mesh(shape, ("data", "model"), devices=devices)


def _compile(
    strategy: str, model: Any, cfg: ModelConfig, mesh: Any, optimizer: Any, batch_abs: Any
) -> dict:
    """Compile one strategy's step from abstract arguments: nothing is allocated yet."""
    rules = logical_rules(strategy)
    x_init = jnp.zeros((mesh.shape["data"], 1, cfg.d_model), jnp.float32)
    shardings = param_shardings(model, x_init, mesh, rules)
    abstract = jax.eval_shape(lambda: model.init(jax.random.key(0), x_init)["params"])
    abstract = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        nn.meta.unbox(abstract),
        shardings,
    )
    opt_shardings = opt_state_shardings(optimizer, abstract, shardings, mesh)
    opt_abs = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        jax.eval_shape(optimizer.init, abstract),
        opt_shardings,
    )
    spec = ShardedState(None, None, shardings, opt_shardings)
    step = make_train_step(model, optimizer, mesh, spec, rules)
    t0 = time.perf_counter()
    compiled = step.lower(abstract, opt_abs, *batch_abs).compile()
    compile_s = time.perf_counter() - t0
    return {"compiled": compiled, "compile_s": compile_s, "x_init": x_init, "rules": rules}


def compare_strategies(
    strategies: Sequence[str] = ("dp", "fsdp"),
    preset: str | ModelConfig = "auto",
    steps: int = 10,
    warmup: int = 3,
    devices: Sequence[Any] | None = None,
    progress: bool | Callable[[str], None] = True,
    *,
    batch_per_device: int | None = None,
    mesh_shape: tuple[int, int] | None = None,
    dry_run: bool = False,
    seed: int = 0,
) -> list[StrategyResult]:
    """Train the same model under each strategy on the same devices and measure each, side by side.

    Args:
      strategies: names from ``LOGICAL_RULES`` (``dp``, ``fsdp``, ``fsdp_all``, ``tp``,
        ``hybrid``, ``fsdp_tp``).
      preset: ``"tiny"``, ``"gpu_small"``, ``"gpu"``, ``"auto"`` (by what ``devices`` holds:
        see ``choose_preset``) or a ``ModelConfig`` whose ``batch`` is per device.
      steps: timed steps per strategy, after ``warmup`` untimed ones.
      devices: the devices to use (default: all of ``jax.devices()``).
      progress: print a flushed line per phase (or pass a callable that takes the line).
      batch_per_device: overrides the preset's per-device batch.
      mesh_shape: the ("data", "model") mesh; default ``(len(devices), 1)``. The global
        batch is ``batch_per_device`` times the "data" axis size.
      dry_run: compile and analyse only; allocate nothing and run no step.
      seed: the same key initialises every strategy, so their losses can be compared.

    Every strategy is compiled first; they then run in order of the compiled step's memory,
    smallest first, so that on a GPU each one can raise the allocator's high-water mark
    (``device_peak_raised`` says whether it did). Results come back in the order asked.
    """
    if steps < 1 or warmup < 0:
        raise ValueError(
            f"compare_strategies: steps={steps} must be >= 1 and warmup={warmup} >= 0."
        )
    if len(set(strategies)) != len(strategies):
        raise ValueError(f"compare_strategies: strategies {tuple(strategies)} repeat a name.")
    for s in strategies:
        if s not in LOGICAL_RULES:
            raise ValueError(
                f"compare_strategies: strategy {s!r} is not one of {sorted(LOGICAL_RULES)}."
            )
    log = _log_to(progress)
    devices = list(jax.devices() if devices is None else devices)
    name, base = resolve_preset(preset, devices)
    per_device = base.batch if batch_per_device is None else batch_per_device
    kind = devices[0].device_kind
    peak = peak_flops(kind)
    optimizer = optax.adam(1e-3)

    compiled: dict[str, dict] = {}
    for strategy in strategies:
        mesh = _mesh_for(devices, mesh_shape)
        cfg = dataclasses.replace(base, batch=per_device * mesh.shape["data"])
        if strategy == strategies[0]:
            log(
                f"preset '{name}': {cfg.param_count() / 1e6:,.1f} M parameters "
                f"({jnp.dtype(cfg.dtype).name} compute), {len(devices)} x {kind} "
                f"({devices[0].platform}), mesh {tuple(mesh.shape.values())} (data, model), "
                f"global batch {cfg.batch} x seq {cfg.seq}"
            )
        model = cfg.model()
        data = NamedSharding(mesh, P("data"))
        batch_abs = (
            jax.ShapeDtypeStruct((cfg.batch, cfg.seq, cfg.d_model), jnp.float32, sharding=data),
            jax.ShapeDtypeStruct((cfg.batch, cfg.seq), jnp.int32, sharding=data),
        )
        log(f"{strategy}: compiling the training step")
        c = _compile(strategy, model, cfg, mesh, optimizer, batch_abs)
        c.update(mesh=mesh, cfg=cfg, model=model, optimizer=optimizer)
        stats = collective_stats(c["compiled"])
        c["result"] = StrategyResult(
            strategy=strategy,
            preset=name,
            config=config_dict(cfg),
            batch_per_device=per_device,
            n_devices=len(devices),
            mesh_shape=tuple(mesh.shape.values()),
            platform=devices[0].platform,
            device_kind=kind,
            tokens_per_step=cfg.batch * cfg.seq,
            n_params=cfg.param_count(),
            compile_s=c["compile_s"],
            step_memory=step_memory(c["compiled"]),
            collectives=stats,
            comm_bytes_per_device=float(sum(s["sent_per_device"] for s in stats.values())),
            flops_formula=cfg.train_flops_per_step(),
            flops_hlo_per_device=compat.cost_flops(c["compiled"]),
            program_fingerprint=program_fingerprint(c["compiled"]),
            peak_name=None if peak is None else peak[0],
            peak_flops_per_device=None if peak is None else peak[1],
        )
        log(
            f"{strategy}: compiled in {c['compile_s']:.2f} s; step needs "
            f"{format_bytes(c['result'].step_memory['total'])} per device"
        )
        compiled[strategy] = c

    if dry_run:
        return [compiled[s]["result"] for s in strategies]

    order = sorted(strategies, key=lambda s: compiled[s]["result"].step_memory["total"])
    batches: dict[Any, Any] = {}
    for strategy in order:
        c = compiled[strategy]
        _run(strategy, c, steps, warmup, seed, devices, batches, log)
    return [compiled[s]["result"] for s in strategies]


def _run(
    strategy: str,
    c: dict,
    steps: int,
    warmup: int,
    seed: int,
    devices: list,
    batches: dict,
    log: Callable[[str], None],
) -> None:
    res: StrategyResult = c["result"]
    cfg, mesh, model = c["cfg"], c["mesh"], c["model"]
    key = (cfg.batch, cfg.seq, cfg.d_model, tuple(mesh.devices.flat))
    if key not in batches:  # one batch per mesh, shared by the strategies that use it
        data = NamedSharding(mesh, P("data"))
        make = jax.jit(lambda k: synthetic_batch(k, cfg), out_shardings=(data, data))
        batches[key] = make(jax.random.key(seed + 1))
    x, labels = batches[key]
    peak_before = allocator_peak(devices)
    log(f"{strategy}: initialising parameters and optimizer state on the mesh")
    state = init_sharded(model, c["x_init"], mesh, c["rules"], jax.random.key(seed), c["optimizer"])
    per_dev = memory_per_device((state.params, state.opt_state))
    res.state_bytes_per_device = max(per_dev.values())
    params, opt_state = state.params, state.opt_state
    del state
    run = c["compiled"]
    log(f"{strategy}: {warmup} warm-up + {steps} timed steps")
    for _ in range(warmup):
        params, opt_state, loss = run(params, opt_state, x, labels)
    jax.block_until_ready((params, opt_state))
    times, losses = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        params, opt_state, loss = run(params, opt_state, x, labels)
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
    peak_after = allocator_peak(devices)
    res.device_peak_bytes = peak_after
    if peak_after is not None:
        res.device_peak_raised = peak_before is None or peak_after > peak_before
    del params, opt_state, loss, losses
    mfu_text = "n/a" if res.mfu is None else f"{res.mfu:.1%}"
    log(f"{strategy}: median step {_fmt_time(res.step_median_s)}, MFU {mfu_text}")


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


def _fmt_collectives(stats: dict[str, dict[str, float]]) -> str:
    if not stats:
        return "none"
    return ", ".join(f"{k} x{int(v['ops'])}" for k, v in stats.items())


def format_table(results: Sequence[StrategyResult]) -> str:
    """The results as text: one column per strategy, one row per measurement, then notes."""
    if not results:
        return "no results"
    r0 = results[0]
    cpu = r0.platform == "cpu"
    header = (
        f"preset '{r0.preset}' ({r0.n_params / 1e6:,.1f} M parameters, {r0.config['dtype']} compute, "
        f"{r0.config['param_dtype']} parameters) on {r0.n_devices} x {r0.device_kind} ({r0.platform}), "
        f"mesh {r0.mesh_shape} (data, model)\n"
        f"global batch {r0.config['batch']} x seq {r0.config['seq']} = {r0.tokens_per_step:,} tokens per step"
        + (
            f"; {r0.steps} timed step(s) after {r0.warmup} warm-up"
            if r0.steps
            else "; dry run: compiled only"
        )
    )

    def row(label: str, fn: Callable[[StrategyResult], str]) -> tuple[str, ...]:
        return (label, *(fn(r) for r in results))

    def peak_text(r: StrategyResult) -> str:
        if r.device_peak_bytes is None:
            return "n/a"
        return ("" if r.device_peak_raised else "<= ") + format_bytes(r.device_peak_bytes)

    rows = [
        ("", *(r.strategy for r in results)),
        row("compile time", lambda r: _fmt_time(r.compile_s)),
        row("step time (median)", lambda r: _fmt_time(r.step_median_s)),
        row(
            "step time (min - max)",
            lambda r: (
                "-"
                if r.step_min_s is None
                else f"{_fmt_time(r.step_min_s)} - {_fmt_time(r.step_max_s)}"
            ),
        ),
        row("tokens / s", lambda r: "-" if r.tokens_per_s is None else f"{r.tokens_per_s:,.0f}"),
        row("step memory / device", lambda r: format_bytes(r.step_memory["total"])),
        row("  arguments", lambda r: format_bytes(r.step_memory["argument"])),
        row("  temporaries", lambda r: format_bytes(r.step_memory["temp"])),
        row(
            "params + Adam / device",
            lambda r: (
                "-" if r.state_bytes_per_device is None else format_bytes(r.state_bytes_per_device)
            ),
        ),
        row("allocator peak / device", peak_text),
        row("collectives", lambda r: _fmt_collectives(r.collectives)),
        row("sent / device (ring)", lambda r: format_bytes(r.comm_bytes_per_device)),
        row("FLOPs / step (formula)", lambda r: _fmt_flops(r.flops_formula)),
        row("FLOPs / device (XLA)", lambda r: _fmt_flops(r.flops_hlo_per_device)),
        row("MFU (formula FLOPs)", lambda r: "n/a" if r.mfu is None else f"{r.mfu:.1%}"),
        row("loss (last step)", lambda r: f"{r.losses[-1]:.5f}" if r.losses else "-"),
    ]
    widths = [max(len(rw[i]) for rw in rows) for i in range(len(rows[0]))]
    lines = [header, ""]
    lines += [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(rw, widths, strict=True))
        )
        for rw in rows
    ]
    lines.append("")
    timed = [r for r in results if r.step_median_s]
    if len(timed) > 1:
        base = timed[0]
        ratios = ", ".join(
            f"{r.strategy}/{base.strategy} = {r.step_median_s / base.step_median_s:.2f}"
            for r in timed[1:]
        )
        lines.append(f"median step time ratios, same run: {ratios}")
    if r0.peak_flops_per_device is None:
        lines.append(f"MFU: n/a, no bf16 peak is known for '{r0.device_kind}'.")
    else:
        lines.append(
            f"{MFU_NOTE}; peak {r0.peak_name} = {r0.peak_flops_per_device / 1e12:.0f} TFLOP/s."
        )
    lines.append(
        "FLOPs / device (XLA): cost_analysis() of the per-device SPMD program "
        "(1/N of the step unless devices repeat work)."
    )
    if r0.device_peak_bytes is not None:
        lines.append(
            "allocator peak: high-water mark since the process started; '<=' marks a strategy "
            "that did not raise it."
        )
    if cpu:
        lines.append(
            "These are simulated CPU devices sharing this machine's cores: NOT GPU timings. "
            "Read the ratios and the bytes, not the milliseconds."
        )
    return "\n".join(lines)


def environment(devices: Sequence[Any] | None = None) -> dict[str, Any]:
    """Versions and devices, for the JSON record."""
    import flax

    devices = list(jax.devices() if devices is None else devices)
    return {
        "jax": jax.__version__,
        "jaxlib": _jaxlib_version(),
        "flax": flax.__version__,
        "optax": optax.__version__,
        "numpy": np.__version__,
        "python": _platform.python_version(),
        "platform": devices[0].platform,
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
    }


def _jaxlib_version() -> str | None:
    try:
        import jaxlib

        return jaxlib.__version__
    except ImportError:  # pragma: no cover - jaxlib ships with every jax install
        return None


def report_dict(
    results: Sequence[StrategyResult], devices: Sequence[Any] | None = None
) -> dict[str, Any]:
    """Everything, JSON-ready: environment, preset config, notes and one entry per strategy."""
    r0 = results[0]
    return {
        "environment": environment(devices),
        "preset": r0.preset,
        "config": r0.config,
        "batch_per_device": r0.batch_per_device,
        "steps": r0.steps,
        "warmup": r0.warmup,
        "mfu_flops_source": MFU_SOURCE,
        "notes": {
            "mfu": MFU_NOTE,
            "flops_hlo_per_device": (
                "XLA cost_analysis() of the per-device SPMD program "
                "(1/N of the step unless devices repeat work)"
            ),
            "bytes": "per device",
            "simulated": r0.platform == "cpu",
        },
        "results": [r.to_dict() for r in results],
    }


def plot_results(results: Sequence[StrategyResult], axes: Any = None) -> Any:
    """Bar chart: median step time (min-max whiskers) and per-device memory, per strategy.

    Draws on ``axes`` (two matplotlib Axes) if given; returns the Figure.
    """
    import matplotlib.pyplot as plt

    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), layout="constrained")
    else:
        fig = axes[0].figure
    names = [r.strategy for r in results]
    xs = np.arange(len(results))
    ax_t, ax_m = axes
    med = np.array([(r.step_median_s or 0) * 1e3 for r in results])
    lo = med - np.array([(r.step_min_s or 0) * 1e3 for r in results])
    hi = np.array([(r.step_max_s or 0) * 1e3 for r in results]) - med
    ax_t.bar(xs, med, yerr=[lo, hi], capsize=6, color="#4c72b0")
    for x, m in zip(xs, med, strict=True):
        ax_t.annotate(f"{m:.1f} ms", (x, m / 2), ha="center", color="white", fontweight="bold")
    ax_t.set(
        xticks=xs, xticklabels=names, ylabel="ms per step", title="step time (median, min-max)"
    )
    arg_b = np.array([r.step_memory["argument"] for r in results], dtype=float)
    tmp_b = np.array([r.step_memory["temp"] for r in results], dtype=float)
    unit, scale = ("GiB", 2**30) if max(arg_b + tmp_b) >= 2**31 else ("MiB", 2**20)
    arg, tmp = arg_b / scale, tmp_b / scale
    ax_m.bar(xs, arg, color="#55a868", label="arguments (params, Adam, batch)")
    ax_m.bar(xs, tmp, bottom=arg, color="#c44e52", label="temporaries")
    for x, total in zip(xs, arg + tmp, strict=True):
        ax_m.annotate(
            f"{total:.1f} {unit}",
            (x, total),
            xytext=(0, 3),
            textcoords="offset points",
            ha="center",
        )
    peaks = [r.device_peak_bytes for r in results]
    if all(p is not None for p in peaks):
        ax_m.scatter(
            xs, np.array(peaks) / scale, marker="_", s=600, color="k", label="allocator peak"
        )
    ax_m.set(
        xticks=xs,
        xticklabels=names,
        ylabel=f"{unit} per device",
        title="memory per device (compiled step)",
    )
    ax_m.legend(fontsize=8, loc="upper right")
    top = max(max(arg + tmp), max((p or 0) / scale for p in peaks))
    ax_m.set_ylim(0, top * 1.4)
    r0 = results[0]
    where = f"{r0.n_devices} x {r0.device_kind}" + (
        " (simulated: not GPU timings)" if r0.platform == "cpu" else ""
    )
    fig.suptitle(f"preset '{r0.preset}' on {where}")
    return fig


# ---------------------------------------------------------------------------
# Cost model: N-GPU projection and the compute-bound condition
# ---------------------------------------------------------------------------


def collective_bytes_per_device(
    strategy: str, n_params: int, n_devices: int, bytes_per_param: float = 4
) -> float:
    """Bytes each device sends per step, with bandwidth-optimal ring collectives.

    ``dp``: one all-reduce of the gradients, ``2 * P * b * (N-1)/N``.
    ``fsdp``: all-gather of the parameters (forward, and again for the backward pass when
    they are not kept) and a reduce-scatter of the gradients, ``3 * P * b * (N-1)/N``.
    (On CPU, XLA keeps the gathered weights and all-reduces the gradients instead: one
    all-gather plus an all-reduce, the same three units.) ``b`` is the bytes per parameter
    moved: 4 for the f32 master weights this series keeps, 2 if the wire carries bf16.
    """
    ring = (n_devices - 1) / n_devices
    units = {"dp": 2, "fsdp": 3, "fsdp_all": 3}
    if strategy not in units:
        raise ValueError(
            f"collective_bytes_per_device: no cost model for strategy {strategy!r}; use {sorted(units)}."
        )
    return units[strategy] * n_params * bytes_per_param * ring


def project_step_time(
    compute_s: float, comm_bytes_per_device: float, bandwidth: float, overlap: bool = True
) -> float:
    """Step time from compute time and bytes sent per device over ``bandwidth`` (bytes/s, one way).

    With ``overlap`` the collectives hide behind compute (what XLA's scheduler aims for):
    ``max(compute, comm)``; without, ``compute + comm``.
    """
    comm_s = comm_bytes_per_device / bandwidth
    return max(compute_s, comm_s) if overlap else compute_s + comm_s


def project_n_devices(
    compute_s: float,
    n_params: int,
    n_devices: int,
    bandwidth: float,
    strategies: Sequence[str] = ("dp", "fsdp"),
    bytes_per_param: float = 4,
) -> dict[str, dict[str, float]]:
    """Per strategy: projected step time on ``n_devices`` from a measured one-device step.

    Weak scaling: each device keeps the one-device batch, so compute per device stays
    ``compute_s``; collectives add ``collective_bytes_per_device / bandwidth``.
    Returns ``compute_s, comm_s, step_s`` (overlapped), ``step_s_serial`` (not overlapped)
    and ``compute_bound`` per strategy.
    """
    out = {}
    for s in strategies:
        comm_b = collective_bytes_per_device(s, n_params, n_devices, bytes_per_param)
        comm_s = comm_b / bandwidth
        out[s] = {
            "compute_s": compute_s,
            "comm_s": comm_s,
            "step_s": project_step_time(compute_s, comm_b, bandwidth, overlap=True),
            "step_s_serial": project_step_time(compute_s, comm_b, bandwidth, overlap=False),
            "compute_bound": compute_s >= comm_s,
        }
    return out


def config_from_dict(d: dict[str, Any]) -> ModelConfig:
    """The ``ModelConfig`` back from ``config_dict`` (or a result's ``config``)."""
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    kwargs = {k: v for k, v in d.items() if k in names}
    kwargs["dtype"] = jnp.dtype(kwargs.get("dtype", "float32"))
    return ModelConfig(**kwargs)


@dataclass(frozen=True)
class ProjectionBase:
    """What an N-GPU projection starts from: a model, its one-GPU step compute and FLOP/s."""

    cfg: ModelConfig  # batch is per device
    compute_s: float
    flops_per_s: float
    source: str


REFERENCE_GPU = "NVIDIA H100 80GB HBM3"


def projection_base(
    result: StrategyResult | None = None, reference: str = REFERENCE_GPU
) -> ProjectionBase:
    """The measured one-accelerator step of ``result``, or else the ``gpu`` preset at ``reference``'s peak.

    A measurement counts only when it ran on one accelerator (not CPU): its median step is
    the compute time and its formula FLOPs / median the achieved FLOP/s. Anything else (no
    result, CPU devices, several GPUs whose step includes communication) falls back to the
    scaling book's assumption: the ``gpu`` preset computing at 100% of the reference peak.
    """
    if (
        result is not None
        and result.platform != "cpu"
        and result.n_devices == 1
        and result.step_median_s
    ):
        cfg = dataclasses.replace(config_from_dict(result.config), batch=result.batch_per_device)
        return ProjectionBase(
            cfg,
            result.step_median_s,
            result.flops_formula / result.step_median_s,
            f"measured: preset '{result.preset}' on this {result.device_kind}",
        )
    found = peak_flops(reference)
    if found is None:
        raise ValueError(f"projection_base: no bf16 peak is known for reference={reference!r}.")
    cfg = PRESETS["gpu"]
    return ProjectionBase(
        cfg,
        cfg.train_flops_per_step() / found[1],
        found[1],
        f"assumed: preset 'gpu' on an {reference} at 100% of its bf16 peak",
    )


def compute_bound_tokens(peak_flops_per_s: float, bandwidth: float) -> float:
    """The scaling-book condition: FSDP stays compute-bound while tokens per device > C / W.

    From ``6 * T * P`` FLOPs per step against ``3 * P * 2`` bf16 bytes of collectives: the
    ``6P`` cancels, leaving ``T > C / W`` (peak FLOP/s over one-way bandwidth per device).
    """
    return peak_flops_per_s / bandwidth


def projection_curve(
    cfg: ModelConfig,
    tokens_per_device: Any,
    n_devices: int,
    flops_per_s: float,
    bandwidth: float,
    strategy: str,
    bytes_per_param: float = 4,
) -> np.ndarray:
    """Projected step time (s, overlapped) against tokens per device, for one strategy.

    Compute: ``cfg``'s formula FLOPs for that many tokens at ``flops_per_s`` (peak x MFU);
    communication: ``collective_bytes_per_device`` over ``bandwidth``, independent of batch.
    """
    tokens = np.asarray(tokens_per_device, dtype=float)
    flops_per_token = cfg.train_flops_per_step() / (cfg.batch * cfg.seq)
    compute = tokens * flops_per_token / flops_per_s
    comm = (
        collective_bytes_per_device(strategy, cfg.param_count(), n_devices, bytes_per_param)
        / bandwidth
    )
    return np.maximum(compute, comm)


def knee_tokens(
    cfg: ModelConfig,
    n_devices: int,
    flops_per_s: float,
    bandwidth: float,
    strategy: str,
    bytes_per_param: float = 4,
) -> float:
    """Tokens per device below which ``strategy``'s step is communication-bound (compute = comm)."""
    flops_per_token = cfg.train_flops_per_step() / (cfg.batch * cfg.seq)
    comm_s = (
        collective_bytes_per_device(strategy, cfg.param_count(), n_devices, bytes_per_param)
        / bandwidth
    )
    return comm_s * flops_per_s / flops_per_token


def plot_projection(
    cfg: ModelConfig,
    n_devices: int,
    flops_per_s: float,
    bandwidths: dict[str, float],
    strategies: Sequence[str] = ("dp", "fsdp"),
    bytes_per_param: float = 4,
    tokens: Any = None,
    scaling_book: float | None = None,
    ax: Any = None,
) -> Any:
    """Projected step time against tokens per device, per strategy and interconnect. Returns the Axes.

    Solid lines for the first interconnect, dashed for the next ones; the grey line is
    compute alone. A dotted vertical line marks each strategy's knee on the first
    interconnect, and ``scaling_book`` (tokens) draws the scaling-book threshold.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 4.5), layout="constrained")
    tokens = np.geomspace(128, 131072, 64) if tokens is None else np.asarray(tokens, dtype=float)
    flops_per_token = cfg.train_flops_per_step() / (cfg.batch * cfg.seq)
    ax.plot(
        tokens,
        tokens * flops_per_token / flops_per_s * 1e3,
        color="0.6",
        lw=4,
        alpha=0.6,
        label="compute alone",
    )
    colours = {"dp": "#4c72b0", "fsdp": "#dd8452", "fsdp_all": "#c44e52"}
    for i, (bw_name, bw) in enumerate(bandwidths.items()):
        style = "-" if i == 0 else "--"
        for j, s in enumerate(strategies):
            y = projection_curve(cfg, tokens, n_devices, flops_per_s, bw, s, bytes_per_param) * 1e3
            ax.plot(tokens, y, style, color=colours.get(s), label=f"{s}, {bw_name}")
            if i == 0:  # knees on the first link, labelled low on the right, one above another
                k = knee_tokens(cfg, n_devices, flops_per_s, bw, s, bytes_per_param)
                ax.axvline(k, color=colours.get(s), ls=":", lw=1)
                ax.annotate(
                    f"{s} knee: {k:,.0f} tokens",
                    (k, 0.04 + 0.08 * j),
                    xycoords=("data", "axes fraction"),
                    xytext=(3, 0),
                    textcoords="offset points",
                    fontsize=8,
                    bbox={"fc": "white", "ec": "none", "alpha": 0.85, "pad": 1},
                    color=colours.get(s),
                )
    if scaling_book is not None:
        ax.axvline(scaling_book, color="k", ls="-.", lw=1)
        ax.annotate(
            f"scaling book C/W: {scaling_book:,.0f} tokens",
            (scaling_book, 0.04 + 0.08 * len(strategies)),
            xycoords=("data", "axes fraction"),
            xytext=(3, 0),
            textcoords="offset points",
            fontsize=8,
            bbox={"fc": "white", "ec": "none", "alpha": 0.85, "pad": 1},
        )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="tokens per device per step (batch x seq)",
        ylabel="projected step time (ms)",
        title=f"{cfg.param_count() / 1e6:,.0f} M parameters on {n_devices} GPUs, "
        f"{flops_per_s / 1e12:,.0f} TFLOP/s per GPU, {bytes_per_param:g} B/param on the wire",
    )
    ax.title.set_fontsize(10)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, which="both", alpha=0.2)
    return ax


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m helpers.profile",
        description="Compare DP and FSDP (or other strategies): step time, memory, collectives, MFU.",
    )
    p.add_argument("--strategies", nargs="+", default=["dp", "fsdp"], choices=sorted(LOGICAL_RULES))
    p.add_argument("--preset", default="auto", choices=["auto", *PRESETS])
    p.add_argument("--steps", type=int, default=10, help="timed steps per strategy (default 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    p.add_argument(
        "--devices",
        type=int,
        default=None,
        help="simulated CPU devices when there is no GPU (default $NUM_DEVICES or 8)",
    )
    p.add_argument("--batch-per-device", type=int, default=None, help="override the preset's batch")
    p.add_argument("--dry-run", action="store_true", help="compile and analyse only; run no step")
    p.add_argument(
        "--json", metavar="PATH", help="write every measurement, versions and config here"
    )
    p.add_argument(
        "--plot", metavar="PATH", help="save a bar chart of step time and memory (matplotlib)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    devices = use_simulated_devices(args.devices, real_accelerators="auto")
    results = compare_strategies(
        args.strategies,
        preset=args.preset,
        steps=args.steps,
        warmup=args.warmup,
        devices=devices,
        progress=not args.quiet,
        batch_per_device=args.batch_per_device,
        dry_run=args.dry_run,
    )
    print(format_table(results), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report_dict(results, devices), f, indent=2)
        print(f"wrote {args.json}", flush=True)
    if args.plot:
        if args.dry_run:
            print("--plot skipped: a dry run has no step times", flush=True)
        else:
            fig = plot_results(results)
            fig.savefig(args.plot, dpi=120)
            print(f"wrote {args.plot}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
