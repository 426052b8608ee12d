"""Plan a real model before renting the GPUs: memory per device, traffic per axis, step time.

``plan_model(...)`` takes a decoder-only Transformer (dense or mixture-of-experts, any
``config.json`` family of ``helpers.planning.models``), the degree of each parallelism, the
ZeRO stage, precision, batch, recompute and the hardware, and returns a ``Plan``: the
parameter count, the bytes the fullest device holds, whether that fits in HBM with the
stated margin, the bytes and seconds each axis sends and how much of them waits, which axes
cross nodes, a step time, an **optimistic** MFU (every assumption at its best; not an upper
bound, ``helpers.planning.estimate`` says why) and an **expected** MFU with its error. It is
arithmetic on the standard library alone (no jax, no numpy): ``python -m helpers.plan``
runs in a bare Python; notebook 13a checks it against what XLA compiles.

Where each number comes from (each module's docstring has the details and sources):

- model states: Rajbhandari et al. 2019 ("ZeRO", arXiv:1910.02054, Section 3.1, Fig. 1):
  2 bytes of bf16 weights, 2 of gradients (4 with ``grad_dtype="fp32"``, Megatron-LM's
  main gradients) and K = 12 of f32 Adam state per parameter, divided by ZeRO's stage over
  the data-parallel group; tensor, pipeline and expert parallelism divide the parameters
  first (Megatron-LM, arXiv:1909.08053 and 2104.04473);
- activations: Korthikanti et al. 2022 (arXiv:2205.05198), tensor by tensor
  (``helpers.planning.activations``), with sequence parallelism, recompute (Megatron-LM's
  selective, torchtitan's per-op policy, or full), fused attention, and the loss over the
  vocabulary at its backward;
- the memory margin: ``helpers.planning.margins``, calibrated per runtime, ZeRO stage and
  recompute schedule on measured peaks (``helpers.planning.peaks``), with their spread;
- time: ``helpers.planning.estimate``, every collective priced by
  ``helpers.measuring.cost_model`` on two tiers (``helpers.planning.hardware``: NVLink inside
  a node, the node's NICs across nodes, NCCL's flat rings by default);
- expected MFU: ``helpers.planning.calibration``, fitted on the published runs of
  ``helpers.planning.runs``, with its leave-one-out error.

``python -m helpers.plan --help`` is the command line; ``--json PATH`` writes the plan;
``--search`` ranks layouts for a GPU count.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from helpers.cli import OneLineParser, whole_number, writable_path
from helpers.planning.activations import REMAT_ORIGINS, REMATS, activation_terms
from helpers.planning.calibration import default_calibration
from helpers.planning.estimate import AXIS_OVERLAP, Plan, estimate
from helpers.planning.hardware import (
    CROSS_NODE,
    HARDWARE,
    HARDWARE_ALIASES,
    Hardware,
    hardware_with,
)
from helpers.planning.layout import (
    DDP_BUCKET_MIB,
    DP_ISSUES,
    GRAD_DTYPES,
    LOSSES,
    PRECISIONS,
    Layout,
    PlanError,
)
from helpers.planning.margins import margin_for
from helpers.planning.models import (
    FAMILIES,
    HF_KEYS,
    NAMED_MODELS,
    PUBLISHED_PARAMS,
    ModelSpec,
    model_from_hf_config,
    spec_of_series_model,
)

JSON_KEYS: dict[str, str] = {
    "model": "the model's name",
    "hardware": "the accelerator's name",
    "n_params": "total parameters",
    "active_params": "parameters each token goes through (fewer than n_params for MoE)",
    "degrees": "the degree of each axis: pp, dp, ep, cp, tp (their product is the device count)",
    "zero": "ZeRO stage over the data-parallel group: 0 replicates, 1 shards the optimizer "
    "state, 2 also the gradients, 3 also the parameters (FSDP)",
    "precision": "'mixed' (bf16 compute, f32 master weights and Adam), 'f32', or 'bf16' "
    "(pure bf16: weights, gradients and Adam's moments, no f32 copy)",
    "micro_batch": "sequences per data-parallel rank per micro-batch",
    "seq": "tokens per sequence",
    "grad_accum": "micro-batches per step",
    "remat": "; ".join(f"'{k}': {v}" for k, v in REMAT_ORIGINS.items()),
    "options": "the other settings: sequence_parallel, virtual_stages, pp_layers (layers per "
    "stage), keep_gathered, grad_dtype, flash_attention, tp_overlap, vocab (padded), "
    "cross_node, matmul_flops, loss, dp_issue and bucket_mib (how the data-parallel group issues "
    "its collectives), dp_collectives (how many per pass over the slowest stage's weights) "
    "and dp_algorithm (NCCL's ring or tree for one of them)",
    "per_device_bytes": "bytes on the fullest device: params, grads, optimizer, gathered "
    "(ZeRO-3's all-gathered weights), activations, total (activations 0 for a --params model)",
    "hbm_bytes": "the accelerator's HBM in bytes as the device reports it (nvidia-smi's total; "
    "for a TPU the compiler's available bytes), not the vendor's round GB",
    "margin": "the factor on gradients + activations that 'fits' asks room for: the largest "
    "ratio measured peak / count of the plan's class (runtime, ZeRO stage, remat; "
    "helpers.planning.margins), or --margin",
    "fits": "total, with gradients + activations times the margin, <= hbm_bytes",
    "memory_verdict": "'fits', 'out of memory' (not even with gradients + activations times "
    "margin_floor) or 'tight' between the two: measure it",
    "comm_bytes_per_step": "bytes each device sends per step over each axis",
    "comm_seconds_per_step": "seconds of each axis's collectives per step, hidden or not",
    "exposed_seconds_per_step": "of which on the critical path (see AXIS_OVERLAP)",
    "crossing_axes": "the axes whose groups span more than one node",
    "time_breakdown": "the step time's parts: compute, waits, data-parallel waits, pipeline "
    "bubble, optimizer step",
    "step_time_s": "estimated seconds per step, every assumption at its best (not a lower "
    "bound: see helpers.planning.estimate)",
    "mfu": "the optimistic MFU (an optimistic estimate, not an upper bound: see "
    "helpers.planning.estimate): PaLM's model FLOPs per step / (step_time_s x devices x peak)",
    "mfu_expected": "the optimistic MFU times the factor fitted on published runs (None "
    "without them)",
    "mfu_error": "the largest leave-one-out relative miss of that fit",
    "tokens_per_step": "tokens in one step over all devices",
    "notes": "what the estimate assumed, and settings worth knowing about",
    "margin_floor": "the smallest ratio measured in the plan's class (1, the count alone, where "
    "none was measured or --margin is given)",
    "margin_source": "where the margin comes from: the class, its points and their spread",
}


def _resolve(model: ModelSpec | str, hardware: Hardware | str) -> tuple[ModelSpec, Hardware]:
    """The model and hardware a name stands for (or the objects given)."""
    if isinstance(model, str):
        if model not in NAMED_MODELS:
            raise PlanError(f"--config: unknown model {model!r}; named: {sorted(NAMED_MODELS)}.")
        model = NAMED_MODELS[model]
    if isinstance(hardware, str):
        key = HARDWARE_ALIASES.get(hardware, hardware)
        if key not in HARDWARE:
            raise PlanError(f"--hardware: unknown {hardware!r}; one of {sorted(HARDWARE)}.")
        hardware = HARDWARE[key]
    return model, hardware


def _grad_accum(
    grad_accum: int | None, global_batch: int | None, pp: int, ranks: int, micro_batch: int
) -> int:
    """Micro-batches per step: given, or from the global batch, or 1 (``4 x pp`` with a
    pipeline, so that its bubble stays small)."""
    if global_batch is not None:
        if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
            raise PlanError(f"--global-batch must be a positive integer, got {global_batch!r}.")
        per_step = ranks * micro_batch
        if global_batch % per_step:
            raise PlanError(
                f"--global-batch={global_batch} is not a multiple of micro-batch x data-parallel "
                f"ranks (dp x ep = {ranks}, x {micro_batch} = {per_step})."
            )
        derived = global_batch // per_step
        if grad_accum is not None and grad_accum != derived:
            raise PlanError(f"--grad-accum={grad_accum} contradicts --global-batch ({derived}).")
        return derived
    if grad_accum is not None:
        return grad_accum
    return 4 * pp if pp > 1 else 1


def plan_model(
    model: ModelSpec | str,
    hardware: Hardware | str = "h100",
    *,
    gpus: int | None = None,
    dp: int = 1,
    zero: int = 0,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    ep: int = 1,
    precision: str = "mixed",
    micro_batch: int = 1,
    seq: int = 4096,
    grad_accum: int | None = None,
    global_batch: int | None = None,
    remat: str = "none",
    flash_attention: bool = True,
    sequence_parallel: bool | None = None,
    virtual_stages: int = 1,
    pp_layers: Sequence[int] = (),
    keep_gathered: bool = False,
    grad_dtype: str = "bf16",
    tp_overlap: bool = False,
    vocab_multiple: int = 128,
    moe_nodes_per_token: float = 1.0,
    margin: float | None = None,
    causal: bool = True,
    elementwise: bool = True,
    loss: str = "fused",
    dp_issue: str = "layer",
    bucket_mib: float = DDP_BUCKET_MIB,
) -> Plan:
    """Plan ``model`` on ``hardware``; see the module docstring for the model of each number.

    ``grad_accum`` defaults to 1, or ``4 x pp`` with a pipeline; ``global_batch`` (sequences
    per step) sets it instead. ``sequence_parallel`` defaults to on with ``tp > 1``.
    ``margin`` None (the default) takes the margin calibrated on measured peaks for the
    plan's runtime, ZeRO stage and remat (``helpers.planning.margins``); a number replaces it.
    ``loss`` is how the last stage computes the loss (``helpers.planning.layout.LOSSES``).
    ``causal=False`` counts attention over the whole score matrix and ``elementwise=False``
    leaves out the memory-bound kernels, as ``cost_model.step_cost`` (notebook 04's
    projection) does: with both, a data-parallel plan's step time is that projection's.
    ``dp_issue`` says how many collectives the data-parallel group issues, each paying
    NCCL's latency (``helpers.planning.layout.DP_ISSUES``: per layer, per ``bucket_mib`` MiB
    bucket, per parameter tensor, or one).

    Raises:
      PlanError: a configuration that cannot run (degrees whose product is not ``gpus``, a
        dimension a degree does not divide, an unknown model or hardware, ...); the message
        is one line naming the setting.
    """
    model, hardware = _resolve(model, hardware)
    if margin is not None and not (isinstance(margin, int | float) and margin >= 1):
        raise PlanError(f"--margin must be a number >= 1, got {margin!r}.")
    layout = Layout(
        pp=pp, dp=dp, ep=ep, cp=cp, tp=tp, zero=zero, micro_batch=micro_batch,
        grad_accum=_grad_accum(grad_accum, global_batch, pp, dp * ep, micro_batch), seq=seq,
        remat=remat, flash_attention=flash_attention, sequence_parallel=sequence_parallel,
        virtual_stages=virtual_stages, pp_layers=tuple(pp_layers), keep_gathered=keep_gathered,
        precision=precision, grad_dtype=grad_dtype, tp_overlap=tp_overlap,
        vocab_multiple=vocab_multiple, moe_nodes_per_token=moe_nodes_per_token, causal=causal,
        elementwise=elementwise, loss=loss, dp_issue=dp_issue, bucket_mib=bucket_mib,
    )  # fmt: skip
    calibrated = margin_for(hardware, layout.zero, layout.remat) if margin is None else margin
    plan = estimate(model, hardware, layout, gpus=gpus, margin=calibrated)
    cal = default_calibration()
    if cal is not None:
        plan.mfu_expected = plan.mfu * cal.factor
        plan.mfu_error = cal.error
        plan.notes.append(cal.note())
    else:
        plan.notes.append("no published runs to calibrate an expected MFU on")
    if hardware.matmul_flops == hardware.peak_flops:
        plan.notes.append(
            "no measured matmul rate for this chip: the optimistic MFU runs matmuls at peak"
        )
    return plan


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------


def _gb(n: float) -> str:
    return f"{n / 1e9:9.2f} GB"


def _axis_lines(p: Plan) -> list[str]:
    """Per axis: bytes sent, seconds of collectives, seconds waited, what overlaps."""
    rows = []
    for axis in ("tp", "cp", "ep", "pp", "dp"):
        if axis not in p.comm_bytes_per_step:
            continue
        crosses = " (crosses nodes)" if axis in p.crossing_axes else ""
        rows.append(
            f"axis {axis:<3} sends {_gb(p.comm_bytes_per_step[axis])}, "
            f"{p.comm_seconds_per_step.get(axis, 0):7.3f} s of collectives, "
            f"{p.exposed_seconds_per_step.get(axis, 0):7.3f} s waited{crosses}"
        )
        rows.append(f"          {AXIS_OVERLAP[axis]}")
        if axis == "dp" and "dp_collectives" in p.options:
            o = p.options
            unit = (
                f"{o['bucket_mib']:g} MiB buckets" if o["dp_issue"] == "bucket" else o["dp_issue"]
            )
            rows.append(
                f"          {o['dp_collectives']} collectives per pass ({unit}), each paying "
                f"NCCL's latency; one runs on a {o['dp_algorithm']}"
            )
    return rows


def format_plan(p: Plan) -> str:
    """The plan as a short table (GB = 10^9 bytes)."""
    deg = ", ".join(f"{a} {d}" for a, d in p.degrees.items() if d > 1) or "1 device"
    o = p.options
    extras = [
        "SP" if o["sequence_parallel"] else "",
        f"v {o['virtual_stages']}" if o["virtual_stages"] > 1 else "",
        "keep gathered" if o["keep_gathered"] else "",
    ]
    rows = [
        f"{p.model} on {math.prod(p.degrees.values())} x {p.hardware} ({deg}; ZeRO-{p.zero}, "
        f"{p.precision}, micro-batch {p.micro_batch} x {p.seq}, {p.grad_accum} per step, remat "
        f"{p.remat}{''.join(', ' + e for e in extras if e)})",
        f"parameters        {p.n_params / 1e9:9.2f} B (active per token {p.active_params / 1e9:.2f} B)",
    ]
    for key in ("params", "grads", "optimizer", "gathered", "activations", "total"):
        rows.append(f"{key:<17} {_gb(p.per_device_bytes[key])}  on the fullest device")
    need = p.bytes_with_margin
    rows.append(
        f"HBM               {_gb(p.hbm_bytes)}  as the device reports it -> {p.memory_verdict}: "
        f"with the margin (x{p.margin:g} on gradients + activations) it needs {need / 1e9:.1f} GB"
    )
    rows.append(f"margin            {p.margin_source or 'given'}")
    rows += _axis_lines(p)
    parts = ", ".join(f"{k} {v:.3f}" for k, v in p.time_breakdown.items() if v)
    rows.append(f"step time         {p.step_time_s:9.3f} s   ({parts} s)")
    expected = (
        f"expected {p.mfu_expected:.1%} (the published runs missed theirs, leave-one-out, by up to {p.mfu_error:.0%})"
        if p.mfu_expected is not None
        else "no expected MFU (no published runs)"
    )
    rows.append(
        f"MFU               optimistic {p.mfu:.1%} (matmuls at the chip's best measured "
        f"rate, waits as counted above); {expected}"
    )
    rows += [f"note: {n}" for n in p.notes]
    return "\n".join(rows)


__all__ = [
    "AXIS_OVERLAP", "FAMILIES", "GRAD_DTYPES", "HARDWARE", "HF_KEYS", "JSON_KEYS",
    "NAMED_MODELS", "PRECISIONS", "PUBLISHED_PARAMS", "REMATS", "Hardware", "ModelSpec", "Plan",
    "PlanError", "activation_terms", "format_plan", "hardware_with", "main",
    "model_from_hf_config", "plan_model", "spec_of_series_model",
]  # fmt: skip


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def _count(text: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {text!r}")
    return int(value)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number > 0, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"a number > 0, got {text!r}")
    return value


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number >= 0, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"a number >= 0, got {text!r}")
    return value


def _at_least_one(text: str) -> float:
    value = _positive_float(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"a number >= 1, got {text!r}")
    return value


def _layers(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated layer counts, got {text!r}") from None
    if not counts or any(c < 1 for c in counts):
        raise argparse.ArgumentTypeError(f"comma-separated layer counts >= 1, got {text!r}")
    return counts


def _add_layout_flags(p: argparse.ArgumentParser) -> None:
    for axis, text in [("dp", "data"), ("tp", "tensor"), ("pp", "pipeline"),
                       ("cp", "context"), ("ep", "expert")]:  # fmt: skip
        p.add_argument(f"--{axis}", type=_count, default=1, help=f"{text}-parallel degree")
    p.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=0, help="ZeRO stage over dp")
    p.add_argument("--keep-gathered", action="store_true",
                   help="ZeRO-3 keeps the gathered weights from forward to backward (2 units, "
                   "more memory; PyTorch's reshard_after_forward=False)")  # fmt: skip
    p.add_argument("--precision", choices=PRECISIONS, default="mixed",
                   help="mixed (bf16 compute, f32 master weights and Adam), f32, or bf16 (pure "
                   "bf16: weights, gradients and Adam's moments)")  # fmt: skip
    p.add_argument("--grad-dtype", choices=GRAD_DTYPES, default="bf16",
                   help="gradient buffers' dtype in mixed precision (fp32: Megatron-LM's main "
                   "gradients)")  # fmt: skip
    p.add_argument("--micro-batch", type=_count, default=1, help="sequences per dp rank")
    p.add_argument("--seq", type=_count, default=4096, help="tokens per sequence")
    p.add_argument("--grad-accum", type=_count, help="micro-batches per step")
    p.add_argument("--global-batch", type=_count, help="sequences per step (sets --grad-accum)")
    _add_recompute_flags(p)
    p.add_argument("--no-flash", action="store_true", help="unfused attention: scores stored")
    sp = p.add_mutually_exclusive_group()
    sp.add_argument(
        "--sequence-parallel",
        dest="sp",
        action="store_true",
        default=None,
        help="Megatron's sequence parallelism (default: on with --tp > 1)",
    )
    sp.add_argument("--no-sequence-parallel", dest="sp", action="store_false")
    p.add_argument(
        "--virtual-stages",
        type=_count,
        default=1,
        help="interleaved pipeline: model chunks per pipeline rank",
    )
    p.add_argument(
        "--pp-layers",
        type=_layers,
        default=(),
        help="layers per pipeline stage, e.g. 7,8,8,...,7 (default: even)",
    )
    p.add_argument(
        "--tp-overlap",
        action="store_true",
        help="tensor-parallel collectives hidden behind the matmuls",
    )
    p.add_argument(
        "--vocab-multiple",
        type=_count,
        default=128,
        help="pad the vocabulary to a multiple of this x tp (Megatron's 128)",
    )
    p.add_argument("--moe-nodes-per-token", type=_non_negative, default=1.0,
                   help="nodes one token's experts sit on when ep crosses nodes (1: the "
                   "least a balanced router allows; 0: unlimited)")  # fmt: skip


def _add_recompute_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--remat",
        choices=REMATS,
        default="none",
        help="recompute: none; selective (Megatron-LM's: attention's scores); op "
        "(torchtitan's per-op policy: every second matmul and all else recomputed); full",
    )
    p.add_argument("--loss", choices=LOSSES, default="fused",
                   help="the loss over the vocabulary: fused (Megatron-LM's vocab-parallel "
                   "cross-entropy), upcast (logits cast to f32, unfused) or plain (unfused, "
                   "in the activations' dtype)")  # fmt: skip


def _add_issue_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dp-issue", choices=DP_ISSUES, default="layer",
                   help="how the data-parallel group issues its collectives, each paying "
                   "NCCL's latency: one per layer (FSDP), per bucket (DDP), per parameter "
                   "tensor, or one for the whole buffer")  # fmt: skip
    p.add_argument("--bucket-mib", type=_positive_float, default=DDP_BUCKET_MIB,
                   help="MiB of gradients per bucket with --dp-issue bucket (PyTorch DDP's "
                   "25)")  # fmt: skip


def _add_hardware_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--hardware",
        default="h100",
        help=f"one of {', '.join(HARDWARE)} (also {', '.join(HARDWARE_ALIASES)})",
    )
    p.add_argument(
        "--link-gbps",
        type=_positive_float,
        help="GB/s one way per device inside a node (default: the datasheet's)",
    )
    p.add_argument(
        "--node-gbps",
        type=_positive_float,
        help="GB/s out of a node across nodes, all NICs together",
    )
    p.add_argument("--per-node", type=_count, help="devices per node")
    p.add_argument(
        "--matmul-tflops",
        type=_positive_float,
        help="the matmul rate the optimistic MFU runs at (default: the measured MAMF)",
    )
    p.add_argument(
        "--cross-node",
        choices=CROSS_NODE,
        default=None,
        help="what a collective across M nodes sends out of each: flat ((N-1)/N, "
        "NCCL's ring; the default) or hierarchical ((M-1)/M, the scaling book's)",
    )
    p.add_argument(
        "--margin",
        type=_at_least_one,
        default=None,
        help="factor on gradients + activations that 'fits' keeps room for (default: "
        "calibrated on measured peaks per runtime, ZeRO stage and remat, with their spread: "
        "helpers.planning.margins)",
    )


def _parser() -> OneLineParser:
    keys = "\n".join(f"  {k:<24} {v}" for k, v in JSON_KEYS.items())
    p = OneLineParser(
        prog="python -m helpers.plan",
        description="Plan a decoder-only Transformer's training: memory per device, traffic "
        "per axis, step time, optimistic and expected MFU; or --search the layouts of a GPU "
        "count. A configuration that cannot run prints one line and exits with code 2.",
        epilog=f"Keys of --json:\n{keys}\n\nNamed models: {', '.join(NAMED_MODELS)}. "
        f"config.json families: {', '.join(FAMILIES)}.\n"
        "Hardware: "
        + "; ".join(f"{k}: {h.source}; HBM {h.hbm_source}" for k, h in HARDWARE.items())
        + ".",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--config", help="a named model, or a Hugging Face config.json file")
    what.add_argument("--params", type=_count, help="a parameter count (model states only)")
    p.add_argument("--gpus", type=_count, help="device count (default: product of the degrees)")
    p.add_argument(
        "--search",
        action="store_true",
        help="rank every layout of --gpus devices (each once, at its best setting)",
    )
    p.add_argument("--top", type=whole_number(1, 1000), default=10, help="layouts --search lists")
    _add_layout_flags(p)
    _add_issue_flags(p)
    _add_hardware_flags(p)
    p.add_argument(
        "--json", metavar="PATH", type=writable_path, help="write the plan as JSON ('-': stdout)"
    )
    return p


def _load_model(config: str) -> ModelSpec:
    if config in NAMED_MODELS:
        return NAMED_MODELS[config]
    path = Path(config)
    if not config.endswith(".json"):
        raise PlanError(f"--config: unknown model {config!r}; named: {sorted(NAMED_MODELS)}.")
    try:
        data = json.loads(path.read_text())
    except OSError as err:
        raise PlanError(f"--config: cannot read {config}: {err.strerror or err}.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise PlanError(f"--config: {config} is not JSON: {err}.") from None
    try:
        return model_from_hf_config(data, path.name)
    except ValueError as err:
        raise PlanError(f"--config {err}") from None


def _cli_hardware(args: argparse.Namespace) -> Hardware:
    _, hardware = _resolve(NAMED_MODELS["llama3-8b"], args.hardware)
    if args.matmul_tflops and args.matmul_tflops * 1e12 > hardware.peak_flops:
        raise PlanError(
            f"--matmul-tflops={args.matmul_tflops:g} is above {hardware.name}'s dense peak "
            f"({hardware.peak_flops / 1e12:g} TFLOP/s)."
        )
    try:
        return hardware_with(
            hardware,
            link_bw=args.link_gbps * 1e9 if args.link_gbps else None,
            node_bw=args.node_gbps * 1e9 if args.node_gbps else None,
            per_node=args.per_node,
            matmul_flops=args.matmul_tflops * 1e12 if args.matmul_tflops else None,
            cross_node=args.cross_node,
        )
    except ValueError as err:
        raise PlanError(f"--hardware: {err}") from None


def _search(args: argparse.Namespace, model: ModelSpec, hardware: Hardware) -> str:
    import time

    from helpers.planning.search import format_search, search_layouts

    if args.gpus is None:
        raise PlanError("--search needs --gpus: the number of devices to lay out.")
    start = time.perf_counter()
    result = search_layouts(
        model, hardware, args.gpus, seq=args.seq, global_batch=args.global_batch,
        flash_attention=not args.no_flash, margin=args.margin, top=args.top,
    )  # fmt: skip
    if args.json:
        return json.dumps([p.to_json() for p in result.plans], indent=2) + "\n"
    return format_search(result, time.perf_counter() - start)


def _run(args: argparse.Namespace) -> tuple[Plan | None, str]:
    """The plan (or the search's table) the arguments ask for."""
    model = (
        _load_model(args.config)
        if args.config
        else ModelSpec(f"{args.params:.3g} parameters", 0, 0, 0, 0, 0, 0, params_only=args.params)
    )
    hardware = _cli_hardware(args)
    if args.search:
        return None, _search(args, model, hardware)
    plan = plan_model(
        model, hardware, gpus=args.gpus, dp=args.dp, zero=args.zero, tp=args.tp, pp=args.pp,
        cp=args.cp, ep=args.ep, precision=args.precision, micro_batch=args.micro_batch,
        seq=args.seq, grad_accum=args.grad_accum, global_batch=args.global_batch,
        remat=args.remat, flash_attention=not args.no_flash, sequence_parallel=args.sp,
        virtual_stages=args.virtual_stages, pp_layers=args.pp_layers,
        keep_gathered=args.keep_gathered, grad_dtype=args.grad_dtype, tp_overlap=args.tp_overlap,
        vocab_multiple=args.vocab_multiple, moe_nodes_per_token=args.moe_nodes_per_token,
        margin=args.margin, loss=args.loss, dp_issue=args.dp_issue, bucket_mib=args.bucket_mib,
    )  # fmt: skip
    return plan, format_plan(plan)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit code (2 for a configuration that cannot run).

    A reader that leaves early (``python -m helpers.plan ... | head``) ends it quietly, with
    exit code 1 and no traceback, as Python's ``signal`` docs advise for a broken pipe.
    """
    try:
        return _main(argv)
    except BrokenPipeError:
        try:  # the interpreter's own flush at exit would raise again: point stdout nowhere
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, io.UnsupportedOperation):
            pass
        return 1


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        plan, text = _run(args)
    except (PlanError, ValueError) as err:
        parser.error(" ".join(str(err).split()))
    if plan is None:  # --search
        if args.json and args.json != "-":
            _write(parser, args.json, text)
        else:
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return 0
    if args.json == "-":
        json.dump(plan.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(text)
    if args.json:
        _write(parser, args.json, json.dumps(plan.to_json(), indent=2) + "\n")
    return 0


def _write(parser: OneLineParser, path: str, text: str) -> None:
    try:
        Path(path).write_text(text)
    except OSError as err:
        parser.error(f"--json: cannot write {path}: {err.strerror or err}")


if __name__ == "__main__":
    raise SystemExit(main())
