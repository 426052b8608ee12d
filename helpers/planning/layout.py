"""A training layout: the degree of each parallelism and every setting that changes what a
device holds or sends, with the checks that refuse what cannot run (one line each, naming
the flag and why).

The mesh axes, outermost to innermost, are ``pp``, ``dp``, ``ep``, ``cp``, ``tp``: Megatron-LM's
default order ("tp-cp-ep-dp-pp" in ``megatron/core/parallel_state.py``), so that the axes
that talk most (tensor, then context parallelism) sit on the fastest links, inside a node.
``ep`` here is an axis of its own whose ranks see different data, as ``dp``'s do: attention
and the dense layers are replicated over ``dp x ep`` (and ``cp``), the experts over ``dp``
(and ``cp``) only, which is Megatron-LM's expert-data-parallel group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from helpers.planning.activations import REMATS
from helpers.planning.models import ModelSpec

AXES = ("pp", "dp", "ep", "cp", "tp")  # outermost to innermost
PRECISIONS = ("mixed", "f32", "bf16")
GRAD_DTYPES = ("bf16", "fp32")
#: How the last stage computes the loss over the vocabulary (``helpers.planning.estimate``
#: counts what each holds at the loss's backward, per token and vocabulary entry).
LOSSES = ("fused", "upcast", "plain")
#: How the data-parallel group issues its collectives, one pass over a stage's weights:
#: "layer", one per Transformer layer (PyTorch FSDP wrapping each block, torchtitan, FSDP2);
#: "bucket", one per ``bucket_mib`` MiB of gradients (PyTorch DDP's ``bucket_cap_mb``, 25 by
#: default; Megatron-core's ``max(40M, 1M x dp)`` parameters; DeepSpeed's reduce buckets);
#: "tensor", one per parameter tensor (DeepSpeed ZeRO-3's parameter fetch); "whole", one for
#: the whole gradient buffer (Megatron-LM 2021's local DDP, ``allreduce_gradients``).
DP_ISSUES = ("layer", "bucket", "tensor", "whole")
DDP_BUCKET_MIB = 25.0


class PlanError(ValueError):
    """A configuration that cannot run; ``str()`` is one line naming the setting."""


@dataclass(frozen=True)
class Layout:
    """Degrees and settings of one training run (see ``plan_model`` for each field).

    ``sequence_parallel`` None means Megatron-LM's recommendation: on whenever ``tp > 1``.
    ``pp_layers`` gives each pipeline stage's layer count (default: as even as possible,
    the remainder on the middle stages, which do not hold the embedding or the head).
    ``moe_nodes_per_token``: how many nodes one token's experts sit on when expert
    parallelism crosses nodes: 1 (default) is the least a balanced router allows, the
    optimistic MFU's assumption; DeepSeek-V3 limits its router to 4; 0 means unlimited (uniform).
    ``precision``: "mixed" (bf16 compute, f32 master weights and Adam), "f32", or "bf16"
    (pure bf16: weights, gradients and both Adam moments in bf16, no f32 copy).
    ``loss``: "fused" (Megatron-LM's vocab-parallel cross-entropy), "upcast" (logits cast to
    f32, then an unfused cross-entropy) or "plain" (unfused, in the activations' dtype).
    ``dp_issue`` and ``bucket_mib``: how many collectives the data-parallel group issues
    (``DP_ISSUES``), each paying NCCL's latency.
    """

    pp: int = 1
    dp: int = 1
    ep: int = 1
    cp: int = 1
    tp: int = 1
    zero: int = 0
    micro_batch: int = 1
    grad_accum: int = 1
    seq: int = 4096
    remat: str = "none"
    flash_attention: bool = True
    sequence_parallel: bool | None = None
    virtual_stages: int = 1
    pp_layers: tuple[int, ...] = ()
    keep_gathered: bool = False
    precision: str = "mixed"
    grad_dtype: str = "bf16"
    tp_overlap: bool = False
    vocab_multiple: int = 128
    moe_nodes_per_token: float = 1.0
    causal: bool = True
    elementwise: bool = True
    loss: str = "fused"
    dp_issue: str = "layer"
    bucket_mib: float = DDP_BUCKET_MIB

    @property
    def degrees(self) -> dict[str, int]:
        return {"pp": self.pp, "dp": self.dp, "ep": self.ep, "cp": self.cp, "tp": self.tp}

    @property
    def devices(self) -> int:
        return math.prod(self.degrees.values())

    @property
    def sp(self) -> bool:
        """Sequence parallelism, resolved (on with tensor parallelism unless turned off)."""
        return self.tp > 1 if self.sequence_parallel is None else self.sequence_parallel


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"{name} must be a positive integer, got {value!r}.")
    return value


def _divides(flag: str, degree: int, what: str, size: int) -> None:
    if size % degree:
        raise PlanError(f"{flag}={degree} does not divide {what} ({size}).")


def check_layout(model: ModelSpec, layout: Layout, gpus: int | None, max_devices: int) -> None:
    """Refuse a layout that cannot run, in one line naming the flag and the reason."""
    for axis, d in layout.degrees.items():
        _positive(f"--{axis}", d)
    n = layout.devices
    if gpus is not None and _positive("--gpus", gpus) != n:
        product = " x ".join(f"{a} {d}" for a, d in layout.degrees.items() if d > 1) or "1"
        raise PlanError(f"--gpus={gpus} is not the product of the degrees ({product} = {n}).")
    if max_devices and n > max_devices:
        raise PlanError(
            f"--gpus={n} is more than one pod ({max_devices} chips): beyond it chips talk over "
            "the data-center network, which the planner does not model."
        )
    _check_choices(layout)
    for name in ("micro_batch", "grad_accum", "seq", "virtual_stages", "vocab_multiple"):
        _positive("--" + name.replace("_", "-"), getattr(layout, name))
    if model.params_only:
        _check_params_only(layout)
        return
    _check_tp(model, layout)
    _check_pp(model, layout)
    if layout.cp > 1 and layout.seq % (2 * layout.cp):
        raise PlanError(
            f"--cp={layout.cp} needs --seq divisible by 2 x cp ({2 * layout.cp}): each device "
            f"takes two chunks of the sequence for a balanced causal mask; --seq={layout.seq}."
        )
    if layout.ep > 1 and not model.is_moe:
        raise PlanError(f"--ep={layout.ep} needs a mixture of experts; this model is dense.")
    _divides("--ep", layout.ep, "the number of experts", model.n_experts)


def _check_choices(layout: Layout) -> None:
    if layout.zero not in (0, 1, 2, 3):
        raise PlanError(f"--zero must be 0, 1, 2 or 3, got {layout.zero!r}.")
    if layout.precision not in PRECISIONS:
        raise PlanError(f"--precision must be one of {PRECISIONS}, got {layout.precision!r}.")
    if layout.grad_dtype not in GRAD_DTYPES:
        raise PlanError(f"--grad-dtype must be one of {GRAD_DTYPES}, got {layout.grad_dtype!r}.")
    if layout.remat not in REMATS:
        raise PlanError(f"--remat must be one of {REMATS}, got {layout.remat!r}.")
    if layout.loss not in LOSSES:
        raise PlanError(f"--loss must be one of {LOSSES}, got {layout.loss!r}.")
    if layout.keep_gathered and layout.zero != 3:
        raise PlanError(
            "--keep-gathered needs --zero 3: only ZeRO-3 (FSDP) frees the gathered weights "
            "that it could keep."
        )
    if layout.sequence_parallel and layout.tp == 1:
        raise PlanError(
            "--sequence-parallel needs --tp > 1: it splits the norm and dropout regions over "
            "the tensor-parallel group."
        )
    if not layout.moe_nodes_per_token >= 0:  # NaN too
        raise PlanError(f"--moe-nodes-per-token must be >= 0, got {layout.moe_nodes_per_token!r}.")
    if layout.virtual_stages > 1 and layout.pp == 1:
        raise PlanError("--virtual-stages needs --pp > 1: it interleaves pipeline stages.")
    if layout.dp_issue not in DP_ISSUES:
        raise PlanError(f"--dp-issue must be one of {DP_ISSUES}, got {layout.dp_issue!r}.")
    if not (isinstance(layout.bucket_mib, int | float) and layout.bucket_mib > 0):  # NaN too
        raise PlanError(f"--bucket-mib must be a number > 0, got {layout.bucket_mib!r}.")
    if layout.bucket_mib != DDP_BUCKET_MIB and layout.dp_issue != "bucket":
        raise PlanError(
            f"--bucket-mib needs --dp-issue bucket: with {layout.dp_issue!r} the data-parallel "
            "collectives are not cut into buckets."
        )


def _check_params_only(layout: Layout) -> None:
    for axis in ("tp", "pp", "cp", "ep"):
        if layout.degrees[axis] > 1:
            raise PlanError(
                f"--{axis}={layout.degrees[axis]} needs the model's shapes (--config); "
                "--params gives only a count."
            )


def _check_tp(model: ModelSpec, layout: Layout) -> None:
    tp = layout.tp
    _divides("--tp", tp, "the number of query heads", model.n_heads)
    if model.n_kv_heads % tp and tp % model.n_kv_heads:
        raise PlanError(
            f"--tp={tp} neither divides the {model.n_kv_heads} key/value heads nor is a "
            "multiple of them (to replicate each head over tp / heads ranks)."
        )
    _divides("--tp", tp, "the MLP width", model.ffn)
    if model.is_moe:
        _divides("--tp", tp, "the experts' width", model.expert_ffn)
    if model.shared_ffn:
        _divides("--tp", tp, "the shared experts' width", model.shared_ffn)


def stage_layers(model: ModelSpec, layout: Layout) -> tuple[int, ...]:
    """Layers per pipeline stage: ``pp_layers`` if given, else as even as possible with the
    remainder on the middle stages (the first holds the embedding, the last the head)."""
    pp, n = layout.pp, model.n_layers
    if layout.pp_layers:
        return tuple(layout.pp_layers)
    base, extra = divmod(n, pp)
    counts = [base] * pp
    order = list(range(1, pp - 1)) + [0, pp - 1] if pp > 2 else list(range(pp))
    for i in order[:extra]:
        counts[i] += 1
    return tuple(counts)


def _check_pp(model: ModelSpec, layout: Layout) -> None:
    pp, v = layout.pp, layout.virtual_stages
    if pp > model.n_layers:
        raise PlanError(f"--pp={pp} is more than the {model.n_layers} layers.")
    if layout.pp_layers:
        counts = layout.pp_layers
        if len(counts) != pp or any(c < 1 for c in counts) or sum(counts) != model.n_layers:
            raise PlanError(
                f"--pp-layers must give {pp} stages of at least one layer summing to "
                f"{model.n_layers}, got {list(counts)}."
            )
    if v > 1:
        # Each stage holds v slices of one layer or more, except that the first stage's first
        # slice may hold the embedding alone and the last stage's last slice the head alone
        # (Llama 3's balancing: arXiv:2407.21783, Section 3.3.2).
        counts = stage_layers(model, layout)
        room = [c + (i == 0) + (i == pp - 1) for i, c in enumerate(counts)]
        if v > min(room):
            i = room.index(min(room))
            raise PlanError(
                f"--virtual-stages={v} does not fit stage {i}, which holds {counts[i]} layer(s): "
                f"every stage must hold {v} slices of layers (the first and last may have one "
                "slice of only the embedding or the head)."
            )
        if layout.grad_accum % pp:
            raise PlanError(
                f"--virtual-stages={v} needs --grad-accum divisible by --pp={pp} (Megatron-LM's "
                f"interleaved schedule runs micro-batches in groups of pp); got {layout.grad_accum}."
            )


__all__ = [
    "DDP_BUCKET_MIB", "DP_ISSUES", "GRAD_DTYPES", "LOSSES", "PRECISIONS", "Layout", "PlanError",
    "check_layout", "stage_layers",
]  # fmt: skip
