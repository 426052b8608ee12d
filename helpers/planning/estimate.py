"""The planner's core: what a layout holds per device, what it sends over each axis, and how
long a step takes, every collective priced by ``helpers.measuring.cost_model``.

**Placement.** The mesh axes nest ``pp`` (outermost), ``dp``, ``ep``, ``cp``, ``tp`` (innermost;
``helpers.planning.layout``), and a launcher fills nodes with consecutive ranks
(``node_counts``): a group sits on the nodes its members' ranks fall in, so a group of up
to ``per_node`` consecutive ranks stays in one node unless it straddles a boundary. An axis
*crosses* when one of its groups spans nodes. A spanning group runs on the NICs of its
members on its least-filled node (``cost_model.group_network``: one NIC per member);
inside a node it runs on NVLink. The plan names the axes that cross.

**Time, per axis.** A micro-batch's forward and backward pass on the busiest pipeline stage
cost their matmuls at the chip's measured matmul rate (MAMF, ``helpers.planning.hardware``),
attention's two matmuls likewise (half of them with fused attention under a causal mask,
which skips the masked blocks; the fused backward does 5 matmuls for the forward's 2), and
the memory-bound kernels between them (norms, activation functions, residual adds,
dropout, rotary embeddings, the softmax of an unfused attention) at HBM bandwidth. To that
each axis adds what cannot hide, as Megatron-LM runs it:

- ``tp``: per layer, the forward's two all-reduces (with sequence parallelism: two
  all-gathers and two reduce-scatters, the same bytes) wait; in the backward pass the
  input gradient's reduction hides behind the weight-gradient matmuls (Megatron-LM's
  asynchronous reduction), and with sequence parallelism the output gradient's two
  all-gathers wait. ``tp_overlap`` hides them all behind the matmuls (TransformerEngine's
  userbuffer overlap). Full recompute repeats the forward's.
- ``cp``: ring attention passes each device's keys and values around the ``cp`` ring
  (and their gradients back): ``cp - 1`` sends per layer, hidden behind that layer's
  attention, the excess waiting.
- ``ep``: two all-to-alls per expert layer forward (dispatch, combine) and two backward,
  waiting; across nodes each token goes once to each node holding one of its experts
  (``cost_model.moe_all_to_all_time``: DeepEP's dispatch, the scaling book's count;
  Megatron-LM's plain all-to-all dispatcher sends every copy and is slower), and its
  experts sit on ``moe_nodes_per_token`` nodes (default 1, the least a balanced router
  allows).
- ``pp``: each micro-batch sends its activations to the next stage and the gradient back,
  waiting (a blocking send per model chunk); and the schedule idles ``(pp - 1) / v`` of a
  micro-batch's time (1F1B, interleaved with ``v`` chunks per device; Narayanan et al.
  2021, arXiv:2104.04473, Section 2.2).
- ``dp`` (with ``cp`` and, for the dense weights, ``ep``: the data-parallel group): ZeRO-0's
  gradient all-reduce, ZeRO-1's reduce-scatter, can hide behind the *last* micro-batch's
  backward only, since a weight's gradient is complete only then (the scaling book's GPU
  chapter, "Pipeline Parallelism": "we can't AllReduce or ReduceScatter the gradients
  until the last microbatch has passed a given stage"); ZeRO-2 reduce-scatters after every
  micro-batch, behind its backward; ZeRO-1/2's all-gather of the updated weights hides
  behind the next step's first forward (Megatron-LM's ``--overlap-param-gather``); ZeRO-3
  gathers every micro-batch's weights behind its forward, gathers them again (unless
  ``keep_gathered``) and reduce-scatters behind its backward (``cost_model.comm_time``).
- the optimizer step reads and writes Adam's state from HBM (``cost_model.optimizer_bytes``:
  28 bytes per parameter, in mixed precision an f32 master, a bf16 gradient and two f32
  moments read, the master, the moments and the bf16 weight copy written).

**Latency, per collective as the frameworks issue them.** Every collective pays NCCL's
latency once (``cost_model.collective_time``, NCCL 2.27's tuning model,
``helpers.planning.hardware``): a ring's grows with the ring's length (a hop per step), so
an all-gather or reduce-scatter over 512 H100s pays about 2.4 ms however few its bytes; an
all-reduce across nodes takes NCCL's tree when that is faster for its bytes, whose latency
grows with ``log2`` of the nodes. Tensor, context, expert and pipeline parallelism issue
their collectives per layer and micro-batch, as counted above. The data-parallel group
issues as its framework does (``Layout.dp_issue``, ``dp_collectives``): one per layer and
pass (FSDP's wrapped unit, the default), one per bucket (PyTorch DDP's 25 MiB,
Megatron-core's ``max(40M, 1M x dp)`` parameters), one per parameter tensor, or one for the
whole buffer (Megatron-LM 2021). The latency hides behind compute as the bytes do. At a
fixed global batch, more data parallelism leaves each device fewer tokens per collective
while each collective's latency grows, so the optimistic MFU falls once the latency no
longer hides (``tests/test_plan_latency.py``; a published strong-scaling series,
``helpers.planning.runs.MEGATRON21_TABLE2_SERIES``, is in the calibration).

A step is ``(m + (pp-1)/v) x`` the slowest stage's micro-batch time, plus the data-parallel
remainder and the optimizer step. The **optimistic MFU** (short for *optimistic estimate of
MFU*: what the step would reach if every assumption of this model held at its best) is PaLM's
model FLOPs (6 per matmul parameter and token plus attention's ``12 L H Q T``, the unpadded
vocabulary) over that step time and the datasheet peak. Nothing in it runs slower than the
best measured matmul, the datasheet links and HBM, or overlaps less than the frameworks above
do, and no published run in ``helpers.planning.runs`` beat it (counted as its source
counts MFU). Yet it is **not an upper
bound**, for two reasons:

- overlap can hide more than this model assumes: without ``tp_overlap`` (the default) the
  forward's tensor-parallel collectives wait, while TransformerEngine's userbuffer overlap
  can hide them, so the step time is not a lower bound;
- the FLOPs count the whole score matrix (PaLM's convention) while the time counts fused
  attention's causal half, so at long sequences the figure can pass the share of the peak
  the chip's matmuls reach: 91.4% for Llama-3-8B on 64 A100s (ZeRO-3, 8,192 tokens) against
  the A100's MAMF, 86.9% of its peak (``tests/test_plan.py`` asserts it).

``helpers.planning.calibration`` turns it into an expected MFU.

**Memory** is the fullest device's: parameters, gradients and Adam's state split by tp,
pp, ep and then ZeRO over the data-parallel group; ZeRO-3's gathered weights (two layers,
or the whole stage with ``keep_gathered``); activations per ``helpers.planning.activations``
for the micro-batches in flight (1F1B: ``min(m, pp - stage)``; interleaved: Megatron-LM's
``1 + (pp-1)/(pp v)`` penalty, ``megatron/training/theoretical_memory_usage.py``), one layer's
whole activations while ``"op"`` or ``"full"`` recompute it, and on the last stage the final
norm's f32 input (``4 s b h``, as ``theoretical_memory_usage.py`` counts it) and the loss over
the vocabulary at its backward, per token and (padded) vocabulary entry over ``tp``
(``loss_bytes``): Megatron-LM's fused vocab-parallel cross-entropy keeps the f32 softmax,
writes its gradient in place and hands back a copy in the activations' dtype (4 + 2 bytes,
``megatron/core/tensor_parallel/cross_entropy.py``); logits cast to f32 before an unfused
cross-entropy (torchtitan at pytorch/torchtitan@9dec370, ``train.py``'s
``cross_entropy(pred.flatten(0, 1).float(), ...)``) hold the log-softmax's output, its
incoming and its outgoing gradient in f32 (12); an unfused one in the activations' dtype,
three such copies. *Fits* means fits with the margin that ``helpers.planning.margins``
calibrates per ZeRO stage and recompute schedule on measured peaks (``memory_verdict``).
"""

from __future__ import annotations

import collections
import functools
import itertools
import math
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple, Protocol

from helpers.measuring import cost_model
from helpers.planning.activations import kv_heads_per_rank, layer_activation_bytes
from helpers.planning.hardware import Hardware
from helpers.planning.layout import AXES, Layout, check_layout, stage_layers
from helpers.planning.models import ModelSpec

#: The last-resort margin: what ``estimate`` uses when it is given no margin, and what
#: ``helpers.planning.margins`` falls back on for a runtime with no calibration point at all
#: (both runtimes it knows have some, so a calibrated plan never gets it). It is a stated
#: round number, not a calibration: the top of XLA:CPU's temporaries over the planner's
#: gradients + activations in notebook 13's (now 13a's) DP and ZeRO-1 compiles of the
#: series' Transformer, rounded (commit 66643e9), before the planner counted the loss at its
#: backward; 13a no longer takes a margin from those compiles. ``margins.margin_for``
#: says which margin a plan got and why; ``--margin`` sets one of your own.
ACTIVATION_MARGIN = 1.5

#: What can overlap on each axis, as the step time assumes (see the module docstring).
AXIS_OVERLAP: dict[str, str] = {
    "tp": "forward collectives wait (tp_overlap hides them); backward: the input-gradient "
    "reductions (with SP, and the all-gathers of the inputs again) hide behind the "
    "weight-gradient matmuls, SP's output-gradient all-gathers wait",
    "cp": "the K/V ring hides behind each layer's attention; the excess waits",
    "ep": "all-to-all dispatch and combine wait",
    "pp": "sends to the next stage wait; the schedule idles (pp-1)/v of a micro-batch",
    "dp": "ZeRO-0/1: gradients hide behind the last micro-batch's backward only; ZeRO-2 behind "
    "each; ZeRO-1/2's weight all-gather behind the next forward; ZeRO-3's gathers behind each "
    "micro-batch's forward and backward",
}

# weights, optimizer state, activations; "bf16" is pure bf16 (both Adam moments in bf16)
_PRECISION_BYTES = {"mixed": (2, 12, 2), "f32": (4, 8, 4), "bf16": (2, 4, 2)}


def loss_bytes(loss: str, act: int) -> float:
    """Bytes per token and vocabulary entry (over ``tp``) the loss holds at its backward
    (see the module docstring): "fused" 4 + act, "upcast" 12, "plain" 3 x act."""
    return {"fused": 4.0 + act, "upcast": 12.0, "plain": 3.0 * act}[loss]


@dataclass
class Plan:
    """What ``plan_model`` predicts; ``to_json()`` is what ``--json`` writes (``JSON_KEYS``)."""

    model: str
    hardware: str
    n_params: int
    active_params: int
    degrees: dict[str, int]
    zero: int
    precision: str
    micro_batch: int
    seq: int
    grad_accum: int
    remat: str
    options: dict[str, Any]
    per_device_bytes: dict[str, float]
    hbm_bytes: float
    margin: float
    fits: bool
    memory_verdict: str
    comm_bytes_per_step: dict[str, float]
    comm_seconds_per_step: dict[str, float]
    exposed_seconds_per_step: dict[str, float]
    crossing_axes: list[str]
    time_breakdown: dict[str, float]
    step_time_s: float
    mfu: float
    mfu_expected: float | None
    mfu_error: float | None
    tokens_per_step: int
    notes: list[str] = field(default_factory=list)
    margin_floor: float = 1.0
    margin_source: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def bytes_with_margin(self) -> float:
        """The fullest device's bytes with the margin (``_with_margin``), the figure the
        verdict sets against ``hbm_bytes``."""
        return _with_margin(self.per_device_bytes, self.margin)


# ---------------------------------------------------------------------------
# Placement
# ---------------------------------------------------------------------------


def node_counts(degrees: dict[str, int], axes: tuple[str, ...], per_node: int) -> set[tuple]:
    """How a launcher places the groups spanning ``axes``: for each group, how many of its
    members sit on each node it touches (largest first; one tuple per distinct pattern).

    Ranks fill nodes in order, ``per_node`` to a node, and the mesh axes nest ``pp``
    (outermost) to ``tp`` (innermost): the device at coordinates ``c`` has rank
    ``sum(c[a] x stride[a])``, ``stride[a]`` the product of the degrees inside ``a``, and sits
    on node ``rank // per_node``. A group of at most ``per_node`` consecutive ranks thus
    fits in one node unless it straddles a boundary; a group's pattern depends only on
    where its first rank falls in its node.
    """
    return set(_node_counts(tuple(degrees[a] for a in AXES), tuple(axes), per_node))


@functools.lru_cache(maxsize=4096)
def _node_counts(degrees: tuple[int, ...], axes: tuple[str, ...], per_node: int) -> frozenset:
    deg = dict(zip(AXES, degrees, strict=True))
    stride, inner = {}, 1
    for a in reversed(AXES):
        stride[a], inner = inner, inner * deg[a]
    members = [
        sum(c * stride[a] for c, a in zip(cs, axes, strict=True))
        for cs in itertools.product(*(range(deg[a]) for a in axes))
    ]
    others = [a for a in AXES if a not in axes]
    seen, patterns = set(), set()
    for cs in itertools.product(*(range(deg[a]) for a in others)):
        first = sum(c * stride[a] for c, a in zip(cs, others, strict=True))
        if first % per_node in seen:
            continue
        seen.add(first % per_node)
        nodes = collections.Counter((first + r) // per_node for r in members)
        patterns.add(tuple(sorted(nodes.values(), reverse=True)))
    return frozenset(patterns)


def in_node_counts(degrees: dict[str, int], per_node: int) -> dict[str, int]:
    """For each axis, the fewest members of one of its groups that share a node: the
    axis's degree when every group fits in one node (``node_counts``)."""
    return {a: min(c[-1] for c in node_counts(degrees, (a,), per_node)) for a in AXES}


class _Net:
    """The groups of a layout and the network each one sees."""

    def __init__(self, layout: Layout, hardware: Hardware) -> None:
        self.degrees = layout.degrees
        self.base = hardware.network()
        self.per_node = hardware.per_node
        self.in_node = in_node_counts(self.degrees, hardware.per_node)
        # one tier (a TPU pod's ICI): no group leaves the "node", whatever its size divides
        self.crossing = [
            a for a in AXES if hardware.node_bw is not None and self.degrees[a] > self.in_node[a]
        ]

    def group(self, axes: tuple[str, ...]) -> tuple[int, cost_model.Network]:
        """``(devices, network)`` of one group spanning ``axes``: inside one node, NVLink;
        across nodes, the NICs of its members on its least-filled node (the ring's
        bottleneck; ``cost_model.group_network``)."""
        n = math.prod(self.degrees[a] for a in axes)
        if self.base.node_bw is None or n == 1:
            return n, cost_model.group_network(self.base, max(n, 1))
        spread = [c for c in node_counts(self.degrees, axes, self.per_node) if len(c) > 1]
        if not spread:
            return n, cost_model.group_network(self.base, n)
        fewest = min(c[-1] for c in spread)
        if all(len(set(c)) == 1 for c in spread) and n % fewest == 0:
            return n, cost_model.group_network(self.base, fewest)
        # uneven: the NICs of the least-filled node; NVLink and NCCL's hop count as if the
        # group filled whole nodes of ``g`` (the largest divisor of n up to that count)
        g = max(d for d in range(1, fewest + 1) if n % d == 0)
        share = self.base.node_bw * fewest / self.per_node
        return n, self.base._replace(node_bw=share, gpus_per_node=g)

    def collective(self, kind: str, nbytes: float, axes: tuple[str, ...], n_ops: int = 1) -> float:
        """Seconds of ``n_ops`` collectives moving ``nbytes`` in all over one group spanning
        ``axes``, each paying NCCL's latency on the algorithm NCCL would pick (a ring; an
        all-reduce across nodes on the tree when faster: ``cost_model.collective_time``)."""
        n, net = self.group(axes)
        return 0.0 if n == 1 else float(cost_model.collective_time(kind, nbytes, n, net, n_ops))

    def algorithm(self, kind: str, nbytes: float, axes: tuple[str, ...]) -> str:
        """The algorithm, "ring" or "tree", one collective of ``nbytes`` over ``axes`` runs on."""
        n, net = self.group(axes)
        return "ring" if n == 1 else cost_model.collective_algorithm(kind, nbytes, n, net)

    def crosses(self, axis: str) -> bool:
        return axis in self.crossing


# ---------------------------------------------------------------------------
# One layer, one micro-batch, on one device
# ---------------------------------------------------------------------------


class LayerCost(NamedTuple):
    """Seconds of one layer for one micro-batch on one device, and what it sends."""

    fwd: float  # compute: matmuls, attention, memory-bound kernels
    bwd: float  # the same, backward (and any recompute)
    fwd_wait: float  # communication on the critical path, forward
    bwd_wait: float
    sent: dict[str, float]  # bytes sent per axis
    comm: dict[str, float]  # seconds of collectives per axis, hidden or not
    wait: dict[str, float]  # of which on the critical path


def _local_matmul_params(model: ModelSpec, tp: int, moe: bool) -> float:
    """Matmul parameters one tensor-parallel rank multiplies each token by, in one layer."""
    if model.mla:
        attn = model.layer_matmul_params(False) - model.mlp_matrices * model.hidden * model.ffn
        attn /= tp
    else:
        heads = model.n_heads / tp
        attn = model.hidden * heads * (model.qk_dim() + model.v_dim())
        attn += model.hidden * kv_heads_per_rank(model, tp) * (model.qk_dim() + model.v_dim())
    if not moe:
        return attn + model.mlp_matrices * model.hidden * model.ffn / tp
    experts = model.top_k * model.mlp_matrices * model.hidden * model.expert_ffn
    experts += model.mlp_matrices * model.hidden * model.shared_ffn
    return attn + experts / tp + model.router_params()


def _op_recomputed_params(model: ModelSpec, tp: int, moe: bool) -> float:
    """Matmul parameters per token torchtitan's per-op policy recomputes in one layer (its
    even-numbered matmuls: k, the out projection, and up (gated) or down; see
    ``activations.op_terms``); a MoE layer's grouped expert matmuls are all saved."""
    h = model.hidden
    recomputed = h * kv_heads_per_rank(model, tp) * model.qk_dim()
    recomputed += model.n_heads / tp * model.v_dim() * h
    width = model.shared_ffn if moe else model.ffn
    return recomputed + h * width / tp


def _elementwise_bytes(model: ModelSpec, layout: Layout, moe: bool, act: int) -> tuple:
    """HBM bytes per token of one layer's memory-bound kernels, forward: (all, scores only).

    Each reads its input and writes its output once: the norms, the two residual adds
    (with dropout, their masks), the activation function, rotary embeddings on q and k, a
    MoE layer's token permutation, and without fused attention the softmax (and dropout)
    over the scores. The backward pass counts twice the forward's bytes.
    """
    if not layout.elementwise:
        return 0.0, 0.0
    tp, h = layout.tp, model.hidden
    sp = tp if layout.sp else 1
    heads = model.n_heads / tp
    total = act * (2 * model.norms_per_layer * h + 6 * h) / sp
    total += 2 * h / sp if model.dropout else 0.0
    width = model.top_k * model.expert_ffn + model.shared_ffn if moe else model.ffn
    total += act * (model.mlp_matrices * width) / tp
    if model.family not in ("gpt2", "opt", "bloom", "mpt", "series"):
        total += 2 * act * (heads + kv_heads_per_rank(model, tp)) * model.qk_dim()
    if moe:
        total += 4 * act * model.top_k * h
    scores = 0.0
    if not layout.flash_attention:
        per = 2 * act + ((2 * act + 1) if model.dropout else 0)
        scores = per * heads * layout.seq
    return total + scores, scores


def layer_cost(
    model: ModelSpec, layout: Layout, hardware: Hardware, net: _Net, moe: bool
) -> LayerCost:
    """One layer's compute and communication for one micro-batch on one device."""
    act = _PRECISION_BYTES[layout.precision][2]
    tok = layout.micro_batch * layout.seq / layout.cp
    rate = hardware.matmul_flops
    mm = 2 * tok * _local_matmul_params(model, layout.tp, moe)
    causal = 0.5 if (layout.causal and layout.flash_attention) else 1.0
    heads = model.n_heads / layout.tp
    attn = 2 * tok * layout.seq * heads * (model.qk_dim() + model.v_dim()) * causal
    attn_bwd = attn * (2.5 if layout.flash_attention else 2.0)
    elem, scores = _elementwise_bytes(model, layout, moe, act)
    elem_t, scores_t = elem * tok / hardware.hbm_bw, scores * tok / hardware.hbm_bw
    fwd = (mm + attn) / rate + elem_t
    bwd = (2 * mm + attn_bwd) / rate + 2 * elem_t
    if layout.remat == "full":
        bwd += fwd
    elif layout.remat == "selective" and not layout.flash_attention:
        bwd += attn / rate + scores_t
    elif layout.remat == "op":  # the matmuls it does not save, and every memory-bound kernel
        bwd += 2 * tok * _op_recomputed_params(model, layout.tp, moe) / rate + elem_t
    cost = {"fwd": fwd, "bwd": bwd, "fwd_wait": 0.0, "bwd_wait": 0.0}
    sent: dict[str, float] = {}
    comm: dict[str, float] = {}
    wait: dict[str, float] = {}
    _tp_comm(model, layout, net, tok, act, mm / rate, cost, sent, comm, wait)
    _cp_comm(model, layout, net, tok, act, (attn / rate, attn_bwd / rate), cost, sent, comm, wait)
    if moe:
        _ep_comm(model, layout, net, tok, act, cost, sent, comm, wait)
    return LayerCost(cost["fwd"], cost["bwd"], cost["fwd_wait"], cost["bwd_wait"], sent, comm, wait)


def _add(d: dict[str, float], key: str, value: float) -> None:
    d[key] = d.get(key, 0.0) + value


def _tp_comm(model, layout, net, tok, act, mm_fwd_s, cost, sent, comm, wait) -> None:  # noqa: ANN001
    """Tensor parallelism's collectives of one layer (see the module docstring)."""
    tp = layout.tp
    if tp == 1:
        return
    a = tok * model.hidden * act  # one micro-batch's activations, gathered
    ag = net.collective("all-gather", a, ("tp",))
    ar = net.collective("all-reduce", a, ("tp",))
    unit = a * (tp - 1) / tp  # bytes each rank sends for one all-gather or reduce-scatter
    if layout.sp:
        fwd_wait, bwd_wait, bwd_hide = 4 * ag, 2 * ag, 4 * ag
        fwd_bytes, bwd_bytes = 4 * unit, 6 * unit
    else:
        fwd_wait, bwd_wait, bwd_hide = 2 * ar, 0.0, 2 * ar
        fwd_bytes, bwd_bytes = 4 * unit, 4 * unit
    if layout.remat == "full":
        bwd_wait += fwd_wait
        bwd_bytes += fwd_bytes
    elif layout.remat == "op" and layout.sp:  # the two all-gathers are not saved: run again
        bwd_wait += 2 * ag
        bwd_bytes += 2 * unit
    fwd_hide = 0.0
    if layout.tp_overlap:
        fwd_hide, fwd_wait, bwd_hide, bwd_wait = fwd_wait, 0.0, bwd_hide + bwd_wait, 0.0
    # the hidden part hides behind the forward matmuls, or the weight-gradient half of the
    # backward's (each as long as the forward's)
    extra = max(0.0, fwd_hide - mm_fwd_s) + max(0.0, bwd_hide - mm_fwd_s)
    cost["fwd_wait"] += fwd_wait
    cost["bwd_wait"] += bwd_wait + extra
    _add(sent, "tp", fwd_bytes + bwd_bytes)
    _add(comm, "tp", fwd_wait + bwd_wait + fwd_hide + bwd_hide)
    _add(wait, "tp", fwd_wait + bwd_wait + extra)


def _cp_comm(model, layout, net, tok, act, attn_s, cost, sent, comm, wait) -> None:  # noqa: ANN001
    """Ring attention's K/V passes of one layer, hidden behind its attention."""
    cp = layout.cp
    if cp == 1:
        return
    kv = tok * kv_heads_per_rank(model, layout.tp) * (model.qk_dim() + model.v_dim()) * act
    _, network = net.group(("cp",))
    step = cost_model.send_time(kv, network, across_nodes=net.crosses("cp"))
    fwd, bwd = (cp - 1) * step, 2 * (cp - 1) * step
    if layout.remat == "full":
        bwd += fwd
    fwd_wait, bwd_wait = max(0.0, fwd - attn_s[0]), max(0.0, bwd - attn_s[1])
    cost["fwd_wait"] += fwd_wait
    cost["bwd_wait"] += bwd_wait
    _add(sent, "cp", (cp - 1) * kv * (3 + (1 if layout.remat == "full" else 0)))
    _add(comm, "cp", fwd + bwd)
    _add(wait, "cp", fwd_wait + bwd_wait)


def _ep_comm(model, layout, net, tok, act, cost, sent, comm, wait) -> None:  # noqa: ANN001
    """Expert parallelism's all-to-alls of one expert layer: dispatch and combine."""
    ep = layout.ep
    if ep == 1:
        return
    per_rank = tok / (layout.tp if layout.sp else 1)
    copy = per_rank * model.hidden * act  # one copy of this device's tokens
    n, network = net.group(("ep",))
    one = cost_model.moe_all_to_all_time(
        copy, model.top_k, n, network, nodes_per_token=layout.moe_nodes_per_token
    )
    fwd, bwd = 2 * one, 2 * one * (2 if layout.remat == "full" else 1)
    buf = copy * model.top_k
    cost["fwd_wait"] += fwd
    cost["bwd_wait"] += bwd
    _add(sent, "ep", (fwd + bwd) / one * buf * (ep - 1) / ep)
    _add(comm, "ep", fwd + bwd)
    _add(wait, "ep", fwd + bwd)


# ---------------------------------------------------------------------------
# Stages: parameters, memory and time
# ---------------------------------------------------------------------------


def padded_vocab(model: ModelSpec, layout: Layout) -> int:
    """The vocabulary padded to a multiple of ``vocab_multiple x tp`` (Megatron-LM's
    ``make_vocab_size_divisible_by``, 128 by default, times the tensor-parallel size)."""
    unit = (model.vocab_multiple or layout.vocab_multiple) * layout.tp
    return math.ceil(model.vocab / unit) * unit


class _Params(NamedTuple):
    """One device's parameters before ZeRO: replicated over the dense data-parallel group
    (``dp x ep x cp``) and over the experts' (``dp x cp``)."""

    dense: float
    experts: float
    largest_layer: float


def _layer_params_local(model: ModelSpec, tp: int, ep: int, moe: bool) -> tuple[float, float]:
    """(dense, expert) parameters of one layer on one device."""
    if model.mla:
        attn = model.attn_params() / tp
    else:
        heads = model.n_heads / tp
        qo = model.hidden * heads * (model.qk_dim() + model.v_dim())
        kv = model.hidden * kv_heads_per_rank(model, tp) * (model.qk_dim() + model.v_dim())
        bias = model.attn_params() - model.hidden * model.n_heads * 2 * model.head_dim
        bias -= 2 * model.hidden * model.n_kv_heads * model.head_dim
        attn = qo + kv + bias / tp
    dense = attn + model.norm_params()
    if not moe:
        return dense + model.mlp_params(model.ffn) / tp, 0.0
    dense += model.shared_params() / tp + model.router_params()
    return dense, model.n_experts / ep * model.mlp_params(model.expert_ffn) / tp


def stage_params(model: ModelSpec, layout: Layout, stage: int, layers: tuple[int, int]) -> _Params:
    """Parameters of pipeline ``stage`` holding ``layers`` = (dense, expert) layers."""
    tp, ep, pp = layout.tp, layout.ep, layout.pp
    d_dense, _ = _layer_params_local(model, tp, ep, False)
    m_dense, m_exp = _layer_params_local(model, tp, ep, True) if model.is_moe else (0.0, 0.0)
    dense = layers[0] * d_dense + layers[1] * m_dense
    width = model.embed_proj or model.hidden
    vocab = padded_vocab(model, layout) * width / tp
    if stage == 0:
        dense += vocab + model.positions * model.hidden
        dense += model.norm_vectors * model.hidden * (1 if model.embed_norm else 0)
        dense += 2 * width * model.hidden if model.embed_proj else 0
    if stage == pp - 1:
        dense += model.norm_vectors * model.hidden * int(model.final_norm)
        dense += vocab if (not model.tied or pp > 1) else 0.0
    largest = max(d_dense if layers[0] else 0.0, (m_dense + m_exp) if layers[1] else 0.0)
    return _Params(dense, layers[1] * m_exp, largest)


def split_layers(model: ModelSpec, layout: Layout) -> list[tuple[int, int]]:
    """Each stage's (dense, expert) layer counts; a model's dense layers come first."""
    out, start = [], 0
    for count in stage_layers(model, layout):
        dense = max(0, min(model.n_layers - model.moe_layers - start, count))
        out.append((dense, count - dense))
        start += count
    return out


def _bytes_per_param(layout: Layout) -> tuple[int, int, int]:
    """(weights, gradients, optimizer state) bytes per parameter."""
    w_b, opt_b, _ = _PRECISION_BYTES[layout.precision]
    g_b = 4 if (layout.precision == "f32" or layout.grad_dtype == "fp32") else 2
    return w_b, g_b, opt_b


def _groups(layout: Layout) -> tuple[int, int]:
    """Sizes of the data-parallel groups of the dense weights and of the experts."""
    return layout.dp * layout.ep * layout.cp, layout.dp * layout.cp


def _states(layout: Layout, params: _Params) -> dict[str, float]:
    """Bytes of parameters, gradients, optimizer state and ZeRO-3's gathered weights."""
    w_b, g_b, opt_b = _bytes_per_param(layout)
    dense_n, exp_n = _groups(layout)
    z = layout.zero

    def split(b: int, stage: int) -> float:
        return b * (
            params.dense / (dense_n if z >= stage else 1)
            + params.experts / (exp_n if z >= stage else 1)
        )

    gathered = 0.0
    if z == 3:
        whole = params.dense * (1 - 1 / dense_n) + params.experts * (1 - 1 / exp_n)
        gathered = w_b * (whole if layout.keep_gathered else min(whole, 2 * params.largest_layer))
    return {
        "params": split(w_b, 3),
        "grads": split(g_b, 2),
        "optimizer": split(opt_b, 1),
        "gathered": gathered,
    }


def _in_flight(layout: Layout, stage: int) -> float:
    """Micro-batches whose activations stage ``stage`` holds at the peak (1F1B; interleaved:
    Megatron-LM's penalty ``1 + (pp-1)/(pp v)``)."""
    p, v, m = layout.pp, layout.virtual_stages, layout.grad_accum
    flight = min(m, p - stage)
    if v > 1:
        flight *= 1 + (p - 1) / (p * v)
    return float(flight)


def _activations(model: ModelSpec, layout: Layout, stage: int, layers: tuple[int, int]) -> float:
    """Bytes of activations stage ``stage`` holds at its peak."""
    act = _PRECISION_BYTES[layout.precision][2]
    kw = dict(seq=layout.seq, micro_batch=layout.micro_batch, tp=layout.tp, cp=layout.cp,
              sequence_parallel=layout.sp, flash_attention=layout.flash_attention,
              act_bytes=act)  # fmt: skip
    per_mb = sum(
        n * layer_activation_bytes(model, remat=layout.remat, moe=moe, **kw)
        for n, moe in ((layers[0], False), (layers[1], True))
        if n
    )
    total = per_mb * _in_flight(layout, stage)
    if layout.remat in ("op", "full"):  # the layer being recomputed holds all of its activations
        total += max(
            layer_activation_bytes(model, remat="none", moe=moe, **kw)
            for n, moe in ((layers[0], False), (layers[1], True))
            if n
        )
    tok = layout.micro_batch * layout.seq / layout.cp
    sp = layout.tp if layout.sp else 1
    if stage == 0 and model.dropout:
        total += tok * model.hidden / sp * _in_flight(layout, 0)
    if stage == layout.pp - 1:  # final norm's f32 input, and the loss at its backward
        vocab = padded_vocab(model, layout) / layout.tp
        total += tok * (4 * model.hidden / sp + loss_bytes(layout.loss, act) * vocab)
    return total


class _Stage(NamedTuple):
    fwd: float  # compute seconds per micro-batch
    bwd: float
    fwd_wait: float  # seconds on the critical path per micro-batch (tp, cp, ep, pp)
    bwd_wait: float
    params: _Params
    layers: tuple[int, int]
    comm: dict[str, float]  # per micro-batch
    waits: dict[str, float]
    sent: dict[str, float]


def _stage_cost(
    model: ModelSpec, layout: Layout, hardware: Hardware, net: _Net, stage: int,
    layers: tuple[int, int], costs: dict[bool, LayerCost],
) -> _Stage:  # fmt: skip
    """One stage's compute and waits for one micro-batch."""
    fwd = bwd = fwd_wait = bwd_wait = 0.0
    comm: dict[str, float] = {}
    waits: dict[str, float] = {}
    sent: dict[str, float] = {}
    for n, moe in ((layers[0], False), (layers[1], True)):
        if not n:
            continue
        c = costs[moe]
        fwd, bwd = fwd + n * c.fwd, bwd + n * c.bwd
        fwd_wait, bwd_wait = fwd_wait + n * c.fwd_wait, bwd_wait + n * c.bwd_wait
        for axis in c.comm:
            _add(comm, axis, n * c.comm[axis])
            _add(waits, axis, n * c.wait[axis])
            _add(sent, axis, n * c.sent[axis])
    if stage == layout.pp - 1:  # the output head and the cross-entropy over its logits
        tok = layout.micro_batch * layout.seq / layout.cp
        logits = tok * padded_vocab(model, layout) / layout.tp
        head = 2 * logits * (model.embed_proj or model.hidden) / hardware.matmul_flops
        ce = 2 * logits * _PRECISION_BYTES[layout.precision][2] / hardware.hbm_bw
        ce = ce if layout.elementwise else 0.0
        fwd, bwd = fwd + head + ce / 2, bwd + 2 * head + ce / 2
    params = stage_params(model, layout, stage, layers)
    if layout.pp > 1:
        tok = layout.micro_batch * layout.seq / layout.cp
        act = (
            tok
            * model.hidden
            * _PRECISION_BYTES[layout.precision][2]
            / (layout.tp if layout.sp else 1)
        )
        _, network = net.group(("pp",))
        send = cost_model.send_time(act, network, across_nodes=net.crosses("pp"))
        p2p = 2 * layout.virtual_stages * send
        fwd_wait, bwd_wait = fwd_wait + p2p / 2, bwd_wait + p2p / 2
        _add(comm, "pp", p2p)
        _add(waits, "pp", p2p)
        _add(sent, "pp", 2 * layout.virtual_stages * act)
    return _Stage(fwd, bwd, fwd_wait, bwd_wait, params, layers, comm, waits, sent)


#: Families whose attention holds q, k and v in one matrix (GPT-2's ``c_attn``, BLOOM's and
#: GPT-NeoX's ``query_key_value``, MPT's ``Wqkv``): two attention matrices, not four.
_FUSED_QKV = ("gpt2", "gpt_neox", "bloom", "mpt", "falcon")


def tensors_per_layer(model: ModelSpec, moe: bool, ep: int = 1) -> int:
    """Parameter tensors one device holds of one layer (weights, biases and norm vectors,
    each its own tensor): what a framework that fetches per parameter issues per layer."""
    if model.mla:
        attn = 5 + 2  # q down and up, kv down and up, output; the two latent norms
    else:
        attn = 2 if model.family in _FUSED_QKV else 4
    linear = attn + model.mlp_matrices
    count = linear + model.norms_per_layer * model.norm_vectors + (2 if model.qk_norm else 0)
    count += linear if model.bias else (3 if model.qkv_bias else 0)
    if moe:
        count += 1 + model.mlp_matrices * (model.n_experts // ep - 1)  # router, experts
        count += model.mlp_matrices if model.shared_ffn else 0
    return count


def dp_collectives(
    model: ModelSpec, layout: Layout, layers: tuple[int, int], grad_bytes: float,
    experts: bool = False,
) -> int:  # fmt: skip
    """How many collectives the data-parallel group issues for one pass over a stage's
    weights (``layout.dp_issue``, ``helpers.planning.layout.DP_ISSUES``): one per layer,
    per ``bucket_mib`` MiB of the ``grad_bytes`` the pass reduces, per parameter tensor, or
    one for the whole buffer. Each pays NCCL's latency once. ``experts``: count the expert
    weights' group (its tensors are the experts alone)."""
    issue = layout.dp_issue
    if issue == "whole":
        return 1
    if issue == "bucket":
        return max(1, math.ceil(grad_bytes / (layout.bucket_mib * 2**20)))
    if model.params_only or issue == "layer":
        return max(1, sum(layers))
    if experts:
        return max(1, layers[1] * model.mlp_matrices * (model.n_experts // layout.ep))
    per = tensors_per_layer(model, False), tensors_per_layer(model, True, layout.ep)
    moe_dense = per[1] - model.mlp_matrices * (model.n_experts // layout.ep)
    return max(1, layers[0] * per[0] + layers[1] * moe_dense)


class _DataParallel(NamedTuple):
    per_mb: float  # seconds on the critical path per micro-batch (ZeRO-2's, ZeRO-3's)
    once: float  # seconds on the critical path once per step (ZeRO-0's, ZeRO-1's, gathers)
    comm: float  # seconds of data-parallel collectives per step, hidden or not
    sent: float  # bytes each device sends per step


def _dp_phases(
    model: ModelSpec, layout: Layout, net: _Net, st: _Stage
) -> tuple[float, float, float, float, float]:
    """Seconds of the stage's data-parallel collectives, summed over its two groups (dense,
    experts): (ZeRO-3 forward, ZeRO-3 backward, all-reduce, reduce-scatter, all-gather),
    and the bytes each device sends per pass of each (in ``_dp_cost``)."""
    w_b, g_b, _ = _bytes_per_param(layout)
    out = [0.0] * 5
    for axes, params in ((("dp", "ep", "cp"), st.params.dense), (("dp", "cp"), st.params.experts)):
        n, network = net.group(axes)
        if n == 1 or not params:
            continue
        n_ops = dp_collectives(model, layout, st.layers, params * g_b, experts=axes == ("dp", "cp"))
        if layout.zero == 3:
            ph = cost_model.comm_time(
                "fsdp", round(params), n, network, w_b, keep_gathered=layout.keep_gathered,
                n_ops=n_ops,
            )  # fmt: skip
            out[0], out[1] = out[0] + ph.forward, out[1] + ph.backward
        elif layout.zero == 0:
            out[2] += cost_model.comm_time(
                "dp", round(params), n, network, g_b, n_ops=n_ops
            ).backward
        else:
            out[3] += net.collective("reduce-scatter", params * g_b, axes, n_ops)
            out[4] += net.collective("all-gather", params * w_b, axes, n_ops)
    return tuple(out)  # type: ignore[return-value]


def _dp_cost(model: ModelSpec, layout: Layout, net: _Net, st: _Stage) -> _DataParallel:
    """What the data-parallel group adds to a stage's step (see the module docstring)."""
    f3, b3, ar, rs, ag = _dp_phases(model, layout, net, st)
    w_b, g_b, _ = _bytes_per_param(layout)
    m, z = layout.grad_accum, layout.zero
    dense_n, exp_n = _groups(layout)
    units = st.params.dense * (dense_n - 1) / dense_n + st.params.experts * (exp_n - 1) / exp_n
    fwd_window, bwd_window = st.fwd + st.fwd_wait, st.bwd + st.bwd_wait
    if z == 3:
        gathers = 1 if layout.keep_gathered else 2
        per_mb = max(0.0, f3 - fwd_window) + max(0.0, b3 - bwd_window)
        return _DataParallel(per_mb, 0.0, m * (f3 + b3), m * units * w_b * (gathers + 1))
    if z == 0:
        return _DataParallel(0.0, max(0.0, ar - bwd_window), ar, 2 * units * g_b)
    gather = max(0.0, ag - fwd_window)
    if z == 1:
        once = max(0.0, rs - bwd_window) + gather
        return _DataParallel(0.0, once, rs + ag, units * (g_b + w_b))
    return _DataParallel(max(0.0, rs - bwd_window), gather, m * rs + ag, units * (m * g_b + w_b))


def _dp_issue_options(model: ModelSpec, layout: Layout, net: _Net, st: _Stage) -> dict:
    """The plan's record of how the dense weights' data-parallel group issues its
    collectives: the setting, how many per pass on the slowest stage, and the algorithm
    one of them runs on (ZeRO-0's all-reduce can take NCCL's tree; the rest ring)."""
    _, g_b, _ = _bytes_per_param(layout)
    grads = st.params.dense * g_b
    count = dp_collectives(model, layout, st.layers, grads)
    kind = "all-reduce" if layout.zero == 0 else "reduce-scatter"
    algorithm = net.algorithm(kind, grads / count, ("dp", "ep", "cp"))
    return {"dp_issue": layout.dp_issue, "bucket_mib": layout.bucket_mib,
            "dp_collectives": count, "dp_algorithm": algorithm}  # fmt: skip


def _optimizer_s(layout: Layout, hardware: Hardware, params: _Params) -> float:
    """Seconds of Adam's reads and writes of its state in HBM (ZeRO-1+: its shard only)."""
    strategy = "fsdp" if layout.zero >= 1 else "dp"
    dense_n, exp_n = _groups(layout)
    total = cost_model.optimizer_bytes(strategy, round(params.dense), dense_n)
    total += cost_model.optimizer_bytes(strategy, round(params.experts), exp_n)
    return total / hardware.hbm_bw


# ---------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------


def _params_only_stage(model: ModelSpec, layout: Layout, hardware: Hardware) -> _Stage:
    """A model known by its count alone: 6 FLOPs per parameter and token, one "layer"."""
    tok = layout.micro_batch * layout.seq
    fwd = 2 * tok * model.param_count() / hardware.matmul_flops
    params = _Params(float(model.param_count()), 0.0, 0.0)  # layers unknown: none gathered
    return _Stage(fwd, 2 * fwd, 0.0, 0.0, params, (1, 0), {}, {}, {})


def _memory(model: ModelSpec, layout: Layout, stages: list[_Stage]) -> tuple[dict[str, float], int]:
    """The fullest device's bytes by kind, and its stage."""
    best: dict[str, float] = {}
    fullest = 0
    for i, st in enumerate(stages):
        parts = _states(layout, st.params)
        parts["activations"] = (
            0.0 if model.params_only else _activations(model, layout, i, st.layers)
        )
        parts["total"] = sum(parts.values())
        if not best or parts["total"] > best["total"]:
            best, fullest = parts, i
    return best, fullest


def _with_margin(per_device: dict[str, float], margin: float) -> float:
    """A device's bytes with its gradients and activations times ``margin``: the count's
    ``total`` plus ``(margin - 1)`` times those two, the figure a verdict sets against HBM."""
    return per_device["total"] + (margin - 1) * (per_device["grads"] + per_device["activations"])


def memory_verdict(
    per_device: dict[str, float], hbm: float, margin: float, floor: float = 1.0
) -> tuple[bool, str]:
    """(fits with the margin, verdict): "fits" (the count, its gradients and activations
    times ``margin``, within ``hbm``), "out of memory" (not even with them times ``floor``,
    the smallest factor a measured peak of the plan's class showed; 1, the count alone, where
    none was measured), or "tight" between the two: measure it. ``helpers.planning.margins``
    gives both factors."""
    if _with_margin(per_device, margin) <= hbm:
        return True, "fits"
    low = _with_margin(per_device, min(floor, margin))
    return False, "tight" if low <= hbm else "out of memory"


def _notes(model: ModelSpec, layout: Layout, net: _Net, counts: tuple[int, ...]) -> list[str]:
    notes = []
    if net.crossing:
        notes.append(
            f"{', '.join(net.crossing)} cross{'es' if len(net.crossing) == 1 else ''} nodes "
            f"({net.base.gpus_per_node} devices each, {net.base.cross_node} rings)"
        )
    if layout.pp > 1 and len(set(counts)) > 1:
        notes.append(f"uneven stages: {list(counts)} layers")
    if layout.pp > 1 and layout.zero >= 2:
        notes.append(
            f"ZeRO-{layout.zero} with a pipeline: DeepSpeed refuses it (deepspeed/runtime/pipe/"
            "engine.py asserts ZeRO < 2); MaxText allows FSDP with one (docs/explanations/"
            "sharding.md, 'PP + FSDP/DP'); torchtitan too"
        )
    if not layout.flash_attention:
        notes.append("attention unfused: the score matrix is stored and softmaxed in HBM")
    if model.is_moe and layout.ep == 1:
        notes.append("every device holds every expert (--ep splits them)")
    if not model.params_only and model.n_kv_heads < layout.tp:
        notes.append(f"each key/value head replicated over {layout.tp // model.n_kv_heads} ranks")
    return notes


def estimate(
    model: ModelSpec, hardware: Hardware, layout: Layout, *, gpus: int | None = None,
    margin: float | _MarginLike | None = None,
) -> Plan:  # fmt: skip
    """Plan ``layout`` for ``model`` on ``hardware`` (see the module docstring); the expected
    MFU is left to ``helpers.planning.plan.plan_model``. ``margin``: a number is used as given
    (with no floor: below it, "tight"); a calibrated margin (``helpers.planning.margins.
    margin_for``, which ``plan_model``, ``search_layouts`` and the calibration pass) brings its
    floor and source; None takes ``ACTIVATION_MARGIN``, the stated default. This module does
    not import ``margins``, which plans its points with it.

    Raises:
      PlanError: a layout that cannot run (one line naming the flag and why).
    """
    check_layout(model, layout, gpus, hardware.max_devices)
    net = _Net(layout, hardware)
    if model.params_only:
        stages, counts = [_params_only_stage(model, layout, hardware)], (1,)
    else:
        costs = {False: layer_cost(model, layout, hardware, net, False)}
        if model.is_moe:
            costs[True] = layer_cost(model, layout, hardware, net, True)
        split = split_layers(model, layout)
        counts = tuple(d + e for d, e in split)
        cache: dict[tuple, _Stage] = {}
        stages = []
        for i, layers in enumerate(split):
            key = (layers, i == 0, i == layout.pp - 1)
            if key not in cache:
                cache[key] = _stage_cost(model, layout, hardware, net, i, layers, costs)
            stages.append(cache[key])
    dps = [_dp_cost(model, layout, net, st) for st in stages]
    per_mb = [
        st.fwd + st.bwd + st.fwd_wait + st.bwd_wait + d.per_mb
        for st, d in zip(stages, dps, strict=True)
    ]
    slow = max(range(len(stages)), key=per_mb.__getitem__)
    return _assemble(model, hardware, layout, net, stages, dps, slow, per_mb[slow], counts, margin)


def _assemble(
    model: ModelSpec, hardware: Hardware, layout: Layout, net: _Net, stages: list[_Stage],
    dps: list[_DataParallel], slow: int, t_mb: float, counts: tuple[int, ...],
    margin: float | None,
) -> Plan:  # fmt: skip
    m, p, v = layout.grad_accum, layout.pp, layout.virtual_stages
    st, dp = stages[slow], dps[slow]
    bubble = (p - 1) / v * t_mb
    once = max(d.once for d in dps)
    optimizer = max(_optimizer_s(layout, hardware, s.params) for s in stages)
    step = m * t_mb + bubble + once + optimizer
    tokens = layout.micro_batch * layout.seq * m * layout.dp * layout.ep
    flops = tokens * model.model_flops_per_token(layout.seq)
    mfu = flops / (step * layout.devices * hardware.peak_flops)
    per_device, _ = _memory(model, layout, stages)
    margin, floor, source = _margin(margin)
    fits, verdict = memory_verdict(per_device, hardware.hbm_bytes, margin, floor)
    sent = {a: m * b for a, b in st.sent.items()}
    comm = {a: m * s for a, s in st.comm.items()}
    waits = {a: m * s for a, s in st.waits.items()}
    if dp.sent:
        sent["dp"], comm["dp"], waits["dp"] = dp.sent, dp.comm, m * dp.per_mb + once
    breakdown = {
        "compute": m * (st.fwd + st.bwd),
        "waits (tp, cp, ep, pp)": m * (st.fwd_wait + st.bwd_wait),
        "data-parallel waits": m * dp.per_mb + once,
        "pipeline bubble": bubble,
        "optimizer step": optimizer,
    }
    options = {
        "sequence_parallel": layout.sp, "virtual_stages": v, "pp_layers": list(counts),
        "keep_gathered": layout.keep_gathered, "grad_dtype": layout.grad_dtype,
        "flash_attention": layout.flash_attention, "tp_overlap": layout.tp_overlap,
        "vocab": padded_vocab(model, layout) if not model.params_only else 0,
        "cross_node": net.base.cross_node, "matmul_flops": hardware.matmul_flops,
        "loss": layout.loss,
        **_dp_issue_options(model, layout, net, st),
    }  # fmt: skip
    return Plan(
        model=model.name, hardware=hardware.name, n_params=model.param_count(),
        active_params=model.active_params(), degrees=layout.degrees, zero=layout.zero,
        precision=layout.precision, micro_batch=layout.micro_batch, seq=layout.seq,
        grad_accum=m, remat=layout.remat, options=options, per_device_bytes=per_device,
        hbm_bytes=hardware.hbm_bytes, margin=margin, fits=fits, memory_verdict=verdict,
        comm_bytes_per_step=sent, comm_seconds_per_step=comm, exposed_seconds_per_step=waits,
        crossing_axes=list(net.crossing), time_breakdown=breakdown, step_time_s=step, mfu=mfu,
        mfu_expected=None, mfu_error=None, tokens_per_step=tokens,
        notes=_notes(model, layout, net, counts), margin_floor=floor, margin_source=source,
    )  # fmt: skip


class _MarginLike(Protocol):
    """What ``helpers.planning.margins.Margin`` carries into a plan."""

    margin: float
    floor: float
    source: str


def _margin(margin: float | _MarginLike | None) -> tuple[float, float, str]:
    """(margin, floor, where they come from): the default, given, or calibrated."""
    if margin is None:
        return ACTIVATION_MARGIN, 1.0, "the stated default (estimate.ACTIVATION_MARGIN)"
    if isinstance(margin, int | float):
        return float(margin), 1.0, "given"
    return float(margin.margin), float(margin.floor), margin.source


__all__ = [
    "ACTIVATION_MARGIN", "AXIS_OVERLAP", "LayerCost", "Plan", "estimate", "in_node_counts",
    "loss_bytes", "node_counts",
    "dp_collectives", "layer_cost", "memory_verdict", "padded_vocab", "split_layers",
    "stage_params", "tensors_per_layer",
]  # fmt: skip
