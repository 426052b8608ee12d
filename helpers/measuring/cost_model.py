"""The cost model: what a training step should cost on N GPUs, from formulas alone.

``helpers.measuring.profile`` measures a step; this module predicts one, so that a notebook can set
the two side by side. It holds the hardware figures (dense bf16 peaks, link bandwidths),
the FLOPs per token, the bytes each device sends, the time they take, and where a step
stops being compute-bound (its *knee*). It is plain arithmetic: no jax, no plotting.

A step has two phases, and each collective can hide only behind the compute of its own
phase: FSDP's all-gather of the weights behind the forward pass (a third of the step's
FLOPs: 2 per matmul parameter and token), the gradient reduction behind the backward pass
(two thirds: 4 per matmul parameter and token, or 6 when ``remat`` recomputes the
forward). A Transformer's attention matmuls (scores and weighted sum) have no parameters
but split the same way, one third forward and two thirds backward. With ring collectives over ``N`` devices, one *unit*
is what each device sends to all-gather (or reduce-scatter) every parameter once:
``P x b x (N-1)/N`` bytes, for ``P`` parameters and ``b`` bytes per parameter on the
wire. An all-reduce is a reduce-scatter plus an all-gather, two units. Per step:

==============================  ================  ==========================================
strategy                        forward           backward
==============================  ================  ==========================================
``dp``                          0                 2 (all-reduce of the gradients)
``fsdp`` (ZeRO-3, textbook)     1 (all-gather)    2 (the weights, freed after the forward
                                                  pass, gathered again; then the gradients
                                                  reduce-scattered)
``fsdp``, ``keep_gathered``     1                 1 (the forward's gathered copy is kept
                                                  for the backward pass: reduce-scatter)
``hsdp``                        1 inside the      2 inside the node (gather again,
                                node (all-gather) reduce-scatter), then an all-reduce (2) of
                                                  each GPU's 1/G shard across nodes
==============================  ================  ==========================================

Textbook FSDP (ZeRO-3) frees each layer's gathered weights after use, so it sends 3 units,
1.5x DP (Rajbhandari et al. 2019, arXiv:1910.02054, Section 7.2.2). Keeping the gathered
copy from the forward to the backward pass saves a unit and costs the whole model's
weights in memory during the step: that is what XLA compiles for the series' jitted
FSDP step on the CPU (notebook 03). ``remat`` recomputes activations; it changes the
FLOPs (``flops_per_token``), not what a strategy sends.
With ``reduce_scatter=False`` FSDP's gradients cost an all-reduce (2) instead of a
reduce-scatter (1): that is what XLA's CPU backend compiles (see notebook 04).
The overlap inside a phase is an assumption (XLA's GPU latency-hiding scheduler aims for
it); the projections here are not measurements.

**Two tiers.** A ``Network`` has an intra-node tier (NVLink, per GPU) and an inter-node
tier (the node's NICs, all of them together). A ring collective that spans ``M`` nodes of
``G`` GPUs moves ``(G-1)/G`` of the array over NVLink and, out of each node, ``(M-1)/M``
of it (``cross_node="hierarchical"``: the scaling book's idealised model, where a node
sends each byte out once) or ``(N-1)/N`` of it (``cross_node="flat"``: one ring through
all ``N = G x M`` GPUs, as NCCL's ring algorithm runs, each crossing link carrying a
block per step); it takes as long as the slower of the two (the scaling book's GPU chapter,
https://jax-ml.github.io/scaling-book/gpus/, "Cross-node collectives": an all-gather of
``B`` bytes beyond the node costs about ``B / W_node egress``, and its "2-way AllGather"
answer takes the max of the node-level and the cross-node cost). **HSDP** (hybrid
sharding: FSDP inside each node, DP across nodes) keeps its gathers on NVLink and sends
only the gradient all-reduce out of the node.

**Latency.** Each collective also pays a fixed start cost and one hop per ring step, as
NCCL's own tuning model counts them (``src/graph/tuning.cc`` in NVIDIA/nccl v2.27.7-1:
``baseLat + (nsteps - nInterSteps) * intraLat + nInterSteps * interLat``, with ``N-1``
steps for an all-gather or reduce-scatter and ``2(N-1)`` for an all-reduce). So a small
message is never free. A ring's latency grows with its length; where a ``Network`` carries
NCCL's tree latencies too (``tree``), an all-reduce that spans nodes runs on NCCL's tree
when that is faster for its bytes, whose latency grows with ``log2`` of the nodes
(``tree_latency``, ``collective_time``). ``ring_time`` stays the ring alone.

**More than rings.** ``group_network`` gives a mesh axis's group its share of a node's
NICs (each GPU of a DGX has its own), ``all_to_all_time`` prices expert parallelism's
all-to-all, ``send_time`` a pipeline's point-to-point send: the planner
(``helpers.planning``) prices every axis with these and ``ring_time``.

**The optimizer step.** Adam reads the parameters, gradients and both moments and writes
back the parameters and moments: 28 bytes per parameter from and to HBM, read two ways
(``ADAM_BYTES_PER_PARAM``): 7 arrays of f32 when training in f32, or, in mixed precision,
an f32 master copy, a bf16 gradient and two f32 moments read, the master, the moments and
the bf16 weight copy written. DP does that for every parameter on every device; FSDP for
its 1/N (HSDP 1/G).
"""

from __future__ import annotations

import math
import re
from typing import Any, NamedTuple, Protocol

# numpy is imported only where an array is passed (``_np``): with plain numbers the cost
# model runs on the standard library alone, as the planner must (a bare Python, Pyodide).


def _np() -> Any:
    import numpy

    return numpy


def _is_array(x: Any) -> bool:
    return hasattr(x, "shape") or isinstance(x, (list, tuple))


def _maximum(a: Any, b: Any) -> Any:
    """``max`` of two numbers, elementwise when either is an array."""
    if _is_array(a) or _is_array(b):
        return _np().maximum(a, b)
    return max(a, b)


def _scalar_or_array(out: Any) -> Any:
    if _is_array(out) and _np().ndim(out) > 0:
        return out
    return float(out)


# ---------------------------------------------------------------------------
# Hardware figures
# ---------------------------------------------------------------------------


class Peak(NamedTuple):
    """One accelerator's dense bf16 peak: the pattern its ``device.device_kind`` matches,
    its name, the FLOP/s, and where the figure comes from."""

    pattern: str
    name: str
    flops: float
    source: str


_NVIDIA = "NVIDIA's datasheet lists the 2:4-sparse figure; dense is half of it"
_TPU_DOCS = "Google Cloud's TPU documentation, the chip's 'Peak compute per chip (bf16)'"

#: The one table of dense (no 2:4 sparsity) bf16 peak FLOP/s per device: the MFU's
#: denominator, for the profile (``peak_flops``) and the planner (``helpers.planning.
#: hardware`` reads its peaks from here). The first pattern that matches
#: ``device.device_kind`` (case-insensitive) wins, so the narrower names come first.
PEAKS: tuple[Peak, ...] = (
    Peak(r"H200.*NVL", "H200 NVL", 835e12, f"NVIDIA H200 NVL: 1,671 TFLOPS bf16 sparse; {_NVIDIA}"),
    Peak(r"H200", "H200 SXM", 989e12, f"NVIDIA H200 SXM: 1,979 TFLOPS bf16 sparse; {_NVIDIA}"),
    Peak(r"H100.*NVL", "H100 NVL", 835e12, f"NVIDIA H100 NVL: 1,671 TFLOPS bf16 sparse; {_NVIDIA}"),
    Peak(r"H100.*PCIe", "H100 PCIe", 756e12, f"NVIDIA H100 PCIe: 1,513 TFLOPS bf16 sparse; {_NVIDIA}"),
    Peak(r"H100", "H100 SXM", 989e12, f"NVIDIA H100 SXM5: 1,979 TFLOPS bf16 sparse; {_NVIDIA}"),
    Peak(r"B200", "B200", 2.25e15,
         "NVIDIA DGX B200: 72 PFLOPS FP8 training for 8 GPUs, 2.25 PFLOPS dense bf16 each "
         "(the scaling book's GPU table, jax-ml.github.io/scaling-book/gpus)"),
    Peak(r"A100", "A100", 312e12, "NVIDIA A100 datasheet: 312 TFLOPS bf16 dense (SXM4 and PCIe)"),
    Peak(r"V100", "V100 (FP16 peak)", 125e12,
         "NVIDIA V100 SXM2 datasheet: 125 TFLOPS fp16 tensor (Volta has no bf16)"),
    Peak(r"MI300X", "MI300X", 1307.4e12, "AMD Instinct MI300X datasheet: 1,307.4 TFLOPS bf16 dense"),
    Peak(r"\bL4\b", "L4", 121e12, f"NVIDIA L4: 242 TFLOPS bf16 sparse; {_NVIDIA}"),
    Peak(r"\bT4\b", "T4 (FP16 peak)", 65e12,
         "NVIDIA T4 datasheet: 65 TFLOPS fp16 (Turing has no bf16 tensor cores, so a bf16 "
         "model runs far below this figure)"),
    Peak(r"TPU v2", "TPU v2", 46e12,
         "Jouppi et al., 'A Domain-Specific Supercomputer for Training Deep Neural Networks', "
         "CACM 2020 (dl.acm.org/doi/10.1145/3360307, which cloud.google.com/tpu/docs/v2 cites): "
         "46 TFLOPS bf16 per chip"),
    Peak(r"TPU v3", "TPU v3", 123e12, f"{_TPU_DOCS}, cloud.google.com/tpu/docs/v3: 123 teraflops"),
    Peak(r"TPU v4", "TPU v4", 275e12, f"{_TPU_DOCS}, cloud.google.com/tpu/docs/v4: 275 teraflops"),
    Peak(r"TPU v5 ?lite|TPU v5e", "TPU v5e", 197e12,
         f"{_TPU_DOCS}, cloud.google.com/tpu/docs/v5e: 197 TFLOPs (JAX names the chip 'TPU v5 lite')"),
    Peak(r"TPU v5p|TPU v5$", "TPU v5p", 459e12,
         f"{_TPU_DOCS}, cloud.google.com/tpu/docs/v5p: 459 TFLOPs"),
    Peak(r"TPU v6 ?lite|TPU v6e|Trillium", "TPU v6e", 918e12,
         f"{_TPU_DOCS}, cloud.google.com/tpu/docs/v6e: 918 TFLOPs"),
)  # fmt: skip

#: ``(pattern, name, FLOP/s)`` of every entry of ``PEAKS``, the form older code reads.
PEAK_BF16_FLOPS: tuple[tuple[str, str, float], ...] = tuple(
    (p.pattern, p.name, p.flops) for p in PEAKS
)


# Interconnect bandwidth per GPU and PER DIRECTION, from NVIDIA's datasheets (which quote
# the bidirectional total). These are the links' datasheet rates: what a ring collective
# achieves (NCCL's "bus bandwidth") is measured, and lower.
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


# The inter-node tier: one 400 Gb/s NDR InfiniBand NIC moves 50 GB/s per direction. A DGX
# H100 node has 8 of them (NVIDIA DGX H100 datasheet: "8x single-port NVIDIA ConnectX-7
# VPI, up to 400Gb/s InfiniBand/Ethernet"), 400 GB/s out of the node: the scaling book's
# "node egress bandwidth" of 400e9 for H100 (https://jax-ml.github.io/scaling-book/gpus/).
IB_NDR_400 = 400e9 / 8
DGX_H100_NODE = 8 * IB_NDR_400

# HBM bandwidth per GPU, from NVIDIA's datasheets (H100 SXM 3.35 TB/s, H200 SXM 4.8 TB/s,
# A100 80GB SXM 2,039 GB/s): what the optimizer step's reads and writes run at.
HBM_BANDWIDTH: dict[str, float] = {"H100 SXM": 3.35e12, "H200 SXM": 4.8e12, "A100": 2.039e12}

# Adam's HBM traffic per parameter, the same 28 bytes read two ways. Training in f32
# (notebook 04): parameter, gradient and both moments read (4 x 4 bytes), parameter and both
# moments written (3 x 4). Mixed precision (the planner's default, bf16 gradients): f32
# master, bf16 gradient and two f32 moments read (4 + 2 + 4 + 4), master, moments and the
# bf16 weight copy written (4 + 4 + 4 + 2).
ADAM_BYTES_PER_PARAM = 28

# NCCL's ring latencies for its "Simple" protocol, in seconds: (per collective, per step
# inside a node over NVLink, per step that crosses nodes): NCCL_RING_LATENCY_2_27 below, the
# table the planner uses too. (Before v2.18.1-1 a step across nodes had 9.6 us, not 14; the
# first two figures are unchanged.) An order of magnitude, not a prediction.
#: NCCL's tuning model as of v2.27.7-1 (NVIDIA/nccl ``src/graph/tuning.cc`` at commit
#: 593de54e52679b51428571c13271e2ea9f91b1b1, lines 134-156 and 329-361), Simple protocol
#: (the one NCCL picks for the megabytes a training step's collectives move), in seconds:
#: ``(baseLat, hwLat NVLink, hwLat NET)`` of the ring, and of the tree (all-reduce only).
#: Ring: ``baseLat + (nsteps - nInterSteps) x intra + nInterSteps x inter``, ``nsteps`` =
#: ``N-1`` (all-gather, reduce-scatter) or ``2(N-1)`` (all-reduce), ``nInterSteps`` = ``M-1``
#: or ``2(M-1)`` over ``M`` nodes. Tree: ``baseLat + 2 ((N/M - 1) x intra + log2i(M) x
#: inter)``. Left out: the network's own latency (``latencyInter``, 0 unless the network
#: plugin reports one; Simple adds it twice), the floor that a ring spanning nodes puts
#: under every intra-node step (``max(intra, 3 x getNetOverhead())`` for Simple: 3 us on
#: Intel x86 and other CPUs, below NVLink's 3.4; 6 us on AMD x86, above it), the LL and
#: LL128 protocols (lower latency, lower bandwidth: NCCL picks them for messages of
#: kilobytes), and NVLS, CollNet and PAT.
NCCL_RING_LATENCY_2_27 = (8.4e-6, 3.4e-6, 14.0e-6)
NCCL_RING_LATENCY = NCCL_RING_LATENCY_2_27
NCCL_TREE_LATENCY_2_27 = (8.4e-6, 4.0e-6, 14.0e-6)
#: NCCL's tree all-reduce reaches at most 0.92 of the ring's bus bandwidth
#: (``busBw = std::min(busBw*.92, ...)`` for Tree in the same function).
TREE_BANDWIDTH = 0.92


class Network(NamedTuple):
    """Where a collective runs: an intra-node tier and, optionally, an inter-node tier.

    ``gpu_bw``: bytes/s one way per GPU inside a node (NVLink, or PCIe).
    ``node_bw``: bytes/s one way out of a whole node (the sum of its NICs), or None for a
    single tier where every link runs at ``gpu_bw``.
    ``gpus_per_node``: ``G``; a ring over more devices spans ``N / G`` nodes.
    ``latency``: seconds per collective, per ring step inside a node, per ring step across
    nodes (see ``NCCL_RING_LATENCY``); zeros leave latency out.
    ``cross_node``: what a collective over ``M`` nodes sends out of each node:
    ``"hierarchical"``, ``(M-1)/M`` of the array (the scaling book's model), or ``"flat"``,
    ``(N-1)/N`` of it (one NCCL ring through every GPU; priced at ``node_bw``, which
    assumes as many rings, NCCL channels, as NICs).
    ``tree``: NCCL's tree latencies (per collective, per hop inside a node, per hop across
    nodes; ``NCCL_TREE_LATENCY_2_27``), or None: every collective runs on a ring.
    """

    gpu_bw: float
    node_bw: float | None = None
    gpus_per_node: int = 8
    latency: tuple[float, float, float] = (0.0, 0.0, 0.0)
    cross_node: str = "hierarchical"
    tree: tuple[float, float, float] | None = None


CROSS_NODE = ("hierarchical", "flat")

#: A DGX H100 node: NVLink 4 inside, 8 x 400 Gb/s InfiniBand out, NCCL's latencies.
DGX_H100 = Network(NVLINK4, DGX_H100_NODE, 8, NCCL_RING_LATENCY)


def as_network(bandwidth: float | Network) -> Network:
    """A ``Network`` as given, or one tier at ``bandwidth`` bytes/s with no latency."""
    net = bandwidth if isinstance(bandwidth, Network) else Network(float(bandwidth))
    if not net.gpu_bw > 0 or (net.node_bw is not None and not net.node_bw > 0):
        raise ValueError(f"bandwidth: every tier needs a positive bytes/s; got {net}.")
    if net.gpus_per_node < 1 or any(t < 0 for t in net.latency) or len(net.latency) != 3:
        raise ValueError(
            f"bandwidth: gpus_per_node must be >= 1 and latency three seconds >= 0; got {net}."
        )
    if net.tree is not None and (len(net.tree) != 3 or any(not t >= 0 for t in net.tree)):
        raise ValueError(f"bandwidth: tree must be None or three seconds >= 0; got {net}.")
    if net.cross_node not in CROSS_NODE:
        raise ValueError(f"bandwidth: cross_node must be one of {CROSS_NODE}; got {net}.")
    return net


def node_split(n_devices: int, network: float | Network) -> tuple[int, int]:
    """``(G, M)``: devices per node a ring of ``n_devices`` uses, and nodes it spans.

    One tier (``node_bw`` None): ``(N, 1)``. Two tiers: ``(N, 1)`` within a node, else
    ``(G, N / G)``; ``N`` must then be a multiple of ``G`` (whole nodes).
    """
    net = as_network(network)
    if n_devices < 1 or int(n_devices) != n_devices:
        raise ValueError(f"n_devices must be a whole number >= 1; got {n_devices!r}.")
    n_devices = int(n_devices)
    g = net.gpus_per_node
    if net.node_bw is None or n_devices <= g:
        return n_devices, 1
    if n_devices % g:
        raise ValueError(
            f"n_devices={n_devices} spans nodes of {g} GPUs but is not a multiple of {g}; "
            "give whole nodes."
        )
    return g, n_devices // g


_KINDS = {"all-gather": 1, "reduce-scatter": 1, "all-reduce": 2}


def _ring_parts(kind: str, nbytes: Any, n_devices: int, network: float | Network) -> tuple:
    """``(seconds on NVLink, seconds on the NICs, latency seconds)`` of one ring collective."""
    if kind not in _KINDS:
        raise ValueError(f"kind={kind!r} is not one of {sorted(_KINDS)}.")
    net = as_network(network)
    g, m = node_split(n_devices, net)
    if _is_array(nbytes):
        nbytes = _np().asarray(nbytes, dtype=float)
        negative = bool((nbytes < 0).any())
    else:
        nbytes = float(nbytes)
        negative = nbytes < 0
    if negative:
        raise ValueError(f"nbytes must be >= 0; got {nbytes}.")
    if g * m == 1:
        return 0.0, 0.0, 0.0
    f = _KINDS[kind]
    intra = f * nbytes * (g - 1) / g / net.gpu_bw
    out_share = (m - 1) / m if net.cross_node == "hierarchical" else (g * m - 1) / (g * m)
    inter = f * nbytes * out_share / net.node_bw if m > 1 else 0.0
    base, hop_in, hop_out = net.latency
    steps, inter_steps = f * (g * m - 1), f * (m - 1)
    return intra, inter, base + (steps - inter_steps) * hop_in + inter_steps * hop_out


def ring_time(kind: str, nbytes: Any, n_devices: int, network: float | Network) -> Any:
    """Seconds for one ring collective of an array of ``nbytes`` over ``n_devices``.

    Bandwidth: ``f x nbytes x (G-1)/G`` over ``gpu_bw`` inside the node and
    ``f x nbytes x (M-1)/M`` (or ``(N-1)/N``, ``cross_node="flat"``) over ``node_bw`` out
    of it, whichever takes longer (``f`` = 1
    for an all-gather or reduce-scatter, 2 for an all-reduce). Latency: NCCL's
    ``base + intra steps x intra hop + inter steps x inter hop``. One device: 0.
    """
    intra, inter, latency = _ring_parts(kind, nbytes, n_devices, network)
    return _scalar_or_array(_maximum(intra, inter) + latency)


def tree_latency(n_devices: int, network: float | Network) -> float:
    """Seconds of latency of one all-reduce on NCCL's tree over ``n_devices`` (``G`` per
    node, ``M`` nodes): ``base + 2 ((G-1) x intra + log2i(M) x inter)``, the tree's
    ``network.tree`` latencies (``NCCL_TREE_LATENCY_2_27``; ``log2i`` is NCCL's, rounded
    down). It grows with the log of the nodes where a ring's grows with their number.

    Raises:
      ValueError: a network without tree latencies (``tree`` None).
    """
    net = as_network(network)
    if net.tree is None:
        raise ValueError("tree_latency: this network has no tree latencies (tree=None).")
    g, m = node_split(n_devices, net)
    if g * m == 1:
        return 0.0
    base, hop_in, hop_out = net.tree
    return float(base + 2 * ((g - 1) * hop_in + (m.bit_length() - 1) * hop_out))


def _collective_parts(
    kind: str, nbytes: Any, n_devices: int, network: float | Network, n_ops: int = 1
) -> tuple:
    """``(NVLink s, NICs s, latency s, algorithm)`` of ``n_ops`` collectives of ``kind`` that
    together move ``nbytes`` (``nbytes / n_ops`` each), each run as NCCL's tuning model
    would: all-gathers and reduce-scatters on a ring; an all-reduce over more than one node
    of a network with ``tree`` latencies on the tree when one such collective is faster
    there (the tree's bandwidth ``TREE_BANDWIDTH`` of the ring's, its latency
    ``tree_latency``), else on a ring. ``algorithm``: "ring", "tree", or "ring/tree" for an
    array of sizes that takes both."""
    intra, inter, lat = _ring_parts(kind, nbytes, n_devices, network)
    net = as_network(network)
    ring = (intra, inter, n_ops * lat, "ring")
    if kind != "all-reduce" or net.tree is None or node_split(n_devices, net)[1] == 1:
        return ring
    t_lat = tree_latency(n_devices, net)
    wire = _maximum(intra, inter) / n_ops
    tree = _np().less(wire / TREE_BANDWIDTH + t_lat, wire + lat) if _is_array(wire) else None
    if tree is None:
        if wire / TREE_BANDWIDTH + t_lat >= wire + lat:
            return ring
        return intra / TREE_BANDWIDTH, inter / TREE_BANDWIDTH, n_ops * t_lat, "tree"
    np = _np()
    scale = np.where(tree, 1 / TREE_BANDWIDTH, 1.0)
    name = "tree" if tree.all() else "ring" if not tree.any() else "ring/tree"
    return intra * scale, inter * scale, n_ops * np.where(tree, t_lat, lat), name


def collective_time(
    kind: str, nbytes: Any, n_devices: int, network: float | Network, n_ops: int = 1
) -> Any:
    """Seconds for ``n_ops`` collectives of ``kind`` moving ``nbytes`` in all, each on the
    algorithm NCCL's tuning model picks (``_collective_parts``: a ring, or for an all-reduce
    across nodes the tree when faster). With ``network.tree`` None it is ``ring_time``'s
    bandwidth plus ``n_ops`` rings' latency."""
    if n_ops < 1 or int(n_ops) != n_ops:
        raise ValueError(f"n_ops must be a whole number >= 1; got {n_ops!r}.")
    intra, inter, latency, _ = _collective_parts(kind, nbytes, n_devices, network, int(n_ops))
    return _scalar_or_array(_maximum(intra, inter) + latency)


def collective_algorithm(kind: str, nbytes: float, n_devices: int, network: float | Network) -> str:
    """The algorithm, "ring" or "tree", that ``collective_time`` runs one collective of
    ``nbytes`` on."""
    return _collective_parts(kind, float(nbytes), n_devices, network)[3]


def group_network(network: float | Network, per_node: int) -> Network:
    """The ``Network`` one collective group sees when it has ``per_node`` members in each
    node it spans and every GPU of the node runs such a collective at the same time.

    A mesh axis outside others (data parallelism outside tensor parallelism, say) forms
    ``gpus_per_node / per_node`` groups in each node, side by side; in a rail-optimised
    node (one NIC per GPU, as in a DGX) each group gets its own ``per_node`` NICs, so its
    share of the node's egress is ``node_bw x per_node / gpus_per_node`` (the scaling book's
    "reductions when array is sharded over a separate axis", GPU chapter). One tier, or a
    group that fills the node: the network unchanged but for its size.
    """
    net = as_network(network)
    if per_node < 1 or int(per_node) != per_node:
        raise ValueError(f"group_network: per_node must be a whole number >= 1; got {per_node!r}.")
    if net.node_bw is None:
        return net
    share = min(per_node, net.gpus_per_node) / net.gpus_per_node
    return net._replace(node_bw=net.node_bw * share, gpus_per_node=int(per_node))


def all_to_all_time(nbytes_per_device: float, n_devices: int, network: float | Network) -> float:
    """Seconds for an all-to-all in which each of ``n_devices`` sends its ``nbytes_per_device``
    buffer, split evenly over every device (its own share stays).

    Inside a node every GPU sends ``(G-1)/N`` of its buffer over NVLink; across ``M`` nodes
    it sends ``(M-1)/M`` of it through its share of the NICs (``node_bw / G`` per GPU), as
    the scaling book counts an all-to-all (GPU chapter, "AllToAlls": ``B (M-1) / (M^2
    W_node)`` for ``B`` bytes over ``M`` nodes, a quarter of an all-gather's bandwidth
    within one H100 node); it takes the slower of the two, plus NCCL's latency for
    ``N - 1`` peers. One device: 0.
    """
    net = as_network(network)
    g, m = node_split(n_devices, net)
    if nbytes_per_device < 0:
        raise ValueError(f"nbytes_per_device must be >= 0; got {nbytes_per_device}.")
    n = g * m
    if n == 1:
        return 0.0
    intra = nbytes_per_device * (g - 1) / n / net.gpu_bw
    inter = 0.0
    if m > 1:
        assert net.node_bw is not None  # node_split gives m > 1 only with two tiers
        inter = nbytes_per_device * (m - 1) / m / (net.node_bw / g)
    base, hop_in, hop_out = net.latency
    return float(max(intra, inter) + base + (g - 1) * hop_in + (m - 1) * hop_out)


def moe_all_to_all_time(
    nbytes_per_copy: float,
    top_k: int,
    n_devices: int,
    network: float | Network,
    *,
    dedup: bool = True,
    nodes_per_token: float = 0.0,
) -> float:
    """Seconds for a mixture of experts' dispatch (or combine): each device sends ``top_k``
    copies of its tokens (``nbytes_per_copy`` each) to the experts chosen for them, spread
    evenly over ``n_devices`` (a balanced router).

    Inside a node the copies cross NVLink: ``top_k x (G-1)/G`` of a copy per GPU. Across
    ``M`` nodes, ``dedup`` sends each token once to each node that holds one of its experts
    and forwards it there over NVLink (DeepSeek's DeepEP; the scaling book's MoE all-to-all,
    GPU chapter "Expert Parallelism", cheaper by ``min(8k/Z, 1)``): a token reaches
    ``(M-1) x (1 - (1 - 1/M)^top_k)`` other nodes on average (the book's "expected number
    of distinct outcomes"); without it, all ``top_k x (M-1)/M`` of its remote copies leave
    the node. ``nodes_per_token`` > 0 says how many nodes a token's experts sit on instead
    (a router limited to that many nodes, as DeepSeek-V3's is to 4; 1 is the least a
    balanced router allows): ``nodes_per_token x (M-1)/M`` of a copy leaves the node. Each
    GPU's share of the NICs is ``node_bw / G``.
    """
    net = as_network(network)
    g, m = node_split(n_devices, net)
    if nbytes_per_copy < 0 or top_k < 1:
        raise ValueError(
            f"nbytes_per_copy must be >= 0 and top_k >= 1; got {nbytes_per_copy}, {top_k}."
        )
    if g * m == 1:
        return 0.0
    intra = nbytes_per_copy * top_k * (g - 1) / g / net.gpu_bw
    inter = 0.0
    if m > 1:
        assert net.node_bw is not None
        if not dedup:
            remote = top_k * (m - 1) / m
        elif nodes_per_token > 0:
            remote = min(nodes_per_token, top_k, m) * (m - 1) / m
        else:
            remote = (m - 1) * (1 - (1 - 1 / m) ** top_k)
        inter = nbytes_per_copy * remote / (net.node_bw / g)
    base, hop_in, hop_out = net.latency
    return float(max(intra, inter) + base + (g - 1) * hop_in + (m - 1) * hop_out)


def send_time(nbytes: float, network: float | Network, *, across_nodes: bool = False) -> float:
    """Seconds for one point-to-point send of ``nbytes`` (a pipeline stage's activations):
    over NVLink inside a node, or through one GPU's share of its node's NICs
    (``node_bw / gpus_per_node``) across nodes, plus NCCL's latency for one hop."""
    net = as_network(network)
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0; got {nbytes}.")
    base, hop_in, hop_out = net.latency
    if across_nodes and net.node_bw is not None:
        return float(nbytes / (net.node_bw / net.gpus_per_node) + base + hop_out)
    return float(nbytes / net.gpu_bw + base + hop_in)


def optimizer_bytes(
    strategy: str,
    n_params: int,
    n_devices: int,
    network: float | Network | None = None,
    bytes_per_param: float = ADAM_BYTES_PER_PARAM,
) -> float:
    """Bytes of HBM traffic per device for the optimizer step (Adam: 28 per parameter, in f32
    or in mixed precision, ``ADAM_BYTES_PER_PARAM``).

    DP updates every parameter on every device; FSDP its ``1/N``; HSDP its ``1/G`` (the
    shard within its node, ``G`` from ``network``).
    """
    _check_strategy(strategy)
    if n_params < 0 or n_devices < 1:
        raise ValueError(f"n_params must be >= 0 and n_devices >= 1; got {n_params}, {n_devices}.")
    total = n_params * bytes_per_param
    if strategy == "dp":
        return float(total)
    if strategy == "hsdp":
        return float(total / node_split(n_devices, network or Network(1.0))[0])
    return float(total / n_devices)


def peak_flops(device_kind: str) -> tuple[str, float] | None:
    """``(name, dense bf16 FLOP/s)`` of a device from ``PEAKS``, or None if unknown.

    >>> peak_flops("NVIDIA H100 80GB HBM3")
    ('H100 SXM', 989000000000000.0)
    """
    found = peak_of(device_kind)
    return None if found is None else (found.name, found.flops)


def peak_of(device_kind: str) -> Peak | None:
    """The ``PEAKS`` entry of a device (its name, dense bf16 FLOP/s and source), or None.

    >>> peak_of("TPU v5 lite").name
    'TPU v5e'
    """
    for peak in PEAKS:
        if re.search(peak.pattern, device_kind.strip(), re.IGNORECASE):
            return peak
    return None


# ---------------------------------------------------------------------------
# FLOPs and bytes, per phase
# ---------------------------------------------------------------------------


class Phases(NamedTuple):
    """A quantity split over a step's forward and backward pass (numbers or numpy arrays)."""

    forward: Any
    backward: Any

    @property
    def total(self) -> Any:
        return self.forward + self.backward


class SizedModel(Protocol):
    """What the cost model reads from a model config (``helpers.placing.models.ModelConfig`` and
    ``TransformerConfig`` have it)."""

    batch: int
    seq: int

    def param_count(self) -> int: ...

    def train_flops_per_step(self) -> float: ...


def flops_per_token(cfg: SizedModel, *, remat: bool = False) -> Phases:
    """Training FLOPs per token, per phase: a third of ``cfg.train_flops_per_step()``
    forward, two thirds backward.

    Every matmul ``y = x W`` costs 2 FLOPs per multiply-add forward and twice that backward
    (the gradients of ``x`` and of ``W``). For the MLP the step is 6 x tokens x matmul
    parameters: 2 forward, 4 backward. A Transformer adds attention's two matmuls
    (``q k^T`` and the weighted sum of ``v``), whose second operand is an activation, not a
    parameter: PaLM's ``12·L·H·Q·T`` per token (arXiv:2204.02311, Appendix B), which also
    splits 4 forward and 8 backward. So the split holds for both, although attention's
    FLOPs are not 6 x any parameter count. With ``remat`` the backward pass first
    recomputes the forward: it costs the whole step's FLOPs, not two thirds. Model FLOPs
    (and so MFU) do not count the recompute, whatever the hardware does.

    The FLOPs per token depend on ``cfg.seq`` (attention's grow with it), so a token count
    passed to ``step_cost`` or ``knee_tokens`` means more sequences of this length.
    """
    third = cfg.train_flops_per_step() / (3 * cfg.batch * cfg.seq)
    return Phases(third, (3 if remat else 2) * third)


_UNITS = {"dp": (0, 2), "fsdp": (1, 1), "fsdp_all": (1, 1)}
STRATEGIES = (*_UNITS, "hsdp")


def _check_strategy(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(
            f"no cost model for strategy={strategy!r}; use one of {sorted(STRATEGIES)}. "
            "(tp, hybrid and fsdp_tp move activations, whose size depends on the batch.)"
        )


def comm_units(
    strategy: str, *, keep_gathered: bool = False, reduce_scatter: bool = True
) -> Phases:
    """Ring units each device sends per step, per phase, on one ring over all devices (see
    the module's table): FSDP as ZeRO-3 runs it (freed after the forward pass, gathered
    again), or with ``keep_gathered`` (one gather, the copy held until the backward pass).
    HSDP's collectives run on two rings of different sizes: its time is ``comm_time``'s."""
    if strategy not in _UNITS:
        _check_strategy(strategy)
        raise ValueError(
            f"comm_units: strategy={strategy!r} runs rings of two sizes (inside and across "
            "nodes); use comm_time, which knows them."
        )
    forward, backward = _UNITS[strategy]
    if strategy != "dp":
        backward += (0 if keep_gathered else 1) + (0 if reduce_scatter else 1)
    return Phases(forward, backward)


def comm_bytes(
    strategy: str,
    n_params: int,
    n_devices: int,
    bytes_per_param: float = 4,
    *,
    keep_gathered: bool = False,
    reduce_scatter: bool = True,
) -> Phases:
    """Bytes each device sends per step, per phase: units x ``P x b x (N-1)/N``.

    ``bytes_per_param`` is what the wire carries: 4 for the f32 master weights this series
    keeps, 2 if the collectives move bf16.
    """
    unit = n_params * bytes_per_param * (n_devices - 1) / n_devices
    units = comm_units(strategy, keep_gathered=keep_gathered, reduce_scatter=reduce_scatter)
    return Phases(units.forward * unit, units.backward * unit)


def comm_time(
    strategy: str,
    n_params: int,
    n_devices: int,
    bandwidth: float | Network,
    bytes_per_param: float = 4,
    *,
    keep_gathered: bool = False,
    reduce_scatter: bool = True,
    n_ops: int = 1,
) -> Phases:
    """Seconds of communication per step, per phase (``keep_gathered``: see ``comm_units``).

    ``bandwidth`` is one tier's bytes/s one way (the flat ring of ``comm_bytes``, no
    latency), or a ``Network`` with two tiers and latencies (``ring_time`` per collective;
    an all-reduce across nodes on NCCL's tree where the network has ``tree`` latencies and
    the tree is faster, ``collective_time``). ``n_ops`` splits each collective into that
    many (say one per layer): the bytes stay, the latency is paid ``n_ops`` times. Within a
    phase, collectives on one tier queue and those on different tiers overlap (HSDP's
    reduce-scatter inside the node beside its all-reduce across nodes, layer by layer);
    every collective pays its latency.
    """
    _check_strategy(strategy)
    if n_params < 0 or not bytes_per_param > 0 or n_ops < 1:
        raise ValueError(
            f"comm_time: n_params={n_params} must be >= 0, bytes_per_param="
            f"{bytes_per_param} > 0 and n_ops={n_ops} >= 1."
        )
    net = as_network(bandwidth)
    g, m = node_split(n_devices, net)
    size = n_params * bytes_per_param
    grads = "reduce-scatter" if reduce_scatter else "all-reduce"
    inside = net._replace(node_bw=None)  # a node's own ring: NVLink only
    # every GPU all-reduces its 1/G shard with its peers in the other nodes: G rings side
    # by side share the node's NICs, 2 (M-1)/M of the array out of the node
    tree = None if net.tree is None else (net.tree[0], 0.0, net.tree[2])
    across = Network(math.inf, net.node_bw, 1, (net.latency[0], 0.0, net.latency[2]), tree=tree)
    if strategy == "dp":
        rings: tuple[list, list] = ([], [("all-reduce", n_devices, net)])
    elif strategy != "hsdp":
        rings = ([("all-gather", n_devices, net)], [(grads, n_devices, net)])
        if not keep_gathered:
            rings[1].append(("all-gather", n_devices, net))
    else:
        rings = ([("all-gather", g, inside)], [(grads, g, inside)])
        if not keep_gathered:
            rings[1].append(("all-gather", g, inside))
        if m > 1:
            rings[1].append(("all-reduce", m, across))

    def phase(collectives: list) -> Any:
        """Collectives of one phase queue on a tier and overlap across tiers: the slower
        tier's total, plus every collective's latency (``n_ops`` times; an all-reduce on
        NCCL's tree where ``_collective_parts`` picks it)."""
        intra = inter = latency = 0.0
        for kind, devices, over in collectives:
            a, b, lat, _ = _collective_parts(kind, size, devices, over, n_ops)
            intra, inter, latency = intra + a, inter + b, latency + lat
        return _scalar_or_array(_maximum(intra, inter) + latency)

    return Phases(phase(rings[0]), phase(rings[1]))


# ---------------------------------------------------------------------------
# A step, its knee, and the scaling-book rule
# ---------------------------------------------------------------------------


class StepCost(NamedTuple):
    """A predicted step on one device: compute and communication seconds, per phase, and
    the optimizer step's memory traffic (after the backward pass, hidden behind nothing)."""

    compute: Phases
    comm: Phases
    optimizer: Any = 0.0

    @property
    def step_s(self) -> Any:
        """Communication hidden behind compute within each phase: sum of per-phase maxima,
        plus the optimizer step."""
        return (
            _maximum(self.compute.forward, self.comm.forward)
            + _maximum(self.compute.backward, self.comm.backward)
            + self.optimizer
        )

    @property
    def serial_s(self) -> Any:
        """No overlap at all: compute plus communication plus the optimizer step."""
        return self.compute.total + self.comm.total + self.optimizer

    @property
    def compute_bound(self) -> Any:
        """True where each phase's compute takes at least as long as its communication."""
        return (self.compute.forward >= self.comm.forward) & (
            self.compute.backward >= self.comm.backward
        )


def step_cost(
    cfg: SizedModel,
    strategy: str,
    n_devices: int,
    flops_per_s: float,
    bandwidth: float | Network,
    bytes_per_param: float = 4,
    *,
    tokens: Any = None,
    remat: bool = False,
    keep_gathered: bool = False,
    hbm_bandwidth: float | None = None,
    n_ops: int = 1,
) -> StepCost:
    """Predicted step of ``strategy`` with ``tokens`` per device (default ``cfg``'s batch x seq;
    more tokens are more sequences of ``cfg.seq`` tokens).

    Weak scaling: each device keeps its own batch, so compute per device does not change
    with ``n_devices``; communication does not depend on the batch. ``flops_per_s`` is what
    one device sustains (a peak, or a measured rate). ``tokens`` may be a numpy array.
    ``bandwidth``: one tier's bytes/s, or a ``Network`` (see ``comm_time``). With
    ``hbm_bandwidth`` (bytes/s) the optimizer step's traffic (``optimizer_bytes``) is added.
    """
    if not flops_per_s > 0:
        raise ValueError(f"flops_per_s must be > 0; got {flops_per_s}.")
    if tokens is None:
        tokens = cfg.batch * cfg.seq
    elif _is_array(tokens):
        tokens = _np().asarray(tokens, dtype=float)
    else:
        tokens = float(tokens)
    per_token = flops_per_token(cfg, remat=remat)
    compute = Phases(
        tokens * per_token.forward / flops_per_s, tokens * per_token.backward / flops_per_s
    )
    comm = comm_time(
        strategy,
        cfg.param_count(),
        n_devices,
        bandwidth,
        bytes_per_param,
        keep_gathered=keep_gathered,
        n_ops=n_ops,
    )
    optimizer = 0.0
    if hbm_bandwidth is not None:
        if not hbm_bandwidth > 0:
            raise ValueError(f"hbm_bandwidth must be > 0 bytes/s; got {hbm_bandwidth}.")
        sent = optimizer_bytes(strategy, cfg.param_count(), n_devices, bandwidth)
        optimizer = sent / hbm_bandwidth
    return StepCost(compute, comm, optimizer)


def knee_tokens(
    cfg: SizedModel,
    strategy: str,
    n_devices: int,
    flops_per_s: float,
    bandwidth: float | Network,
    bytes_per_param: float = 4,
    *,
    remat: bool = False,
    keep_gathered: bool = False,
    n_ops: int = 1,
) -> float:
    """Tokens per device below which some phase of the step waits for the interconnect.

    Each phase is compute-bound while its compute time, linear in the tokens, covers its
    communication time (latency included); the knee is the larger of the two phases'
    break-even points.
    """
    per_token = step_cost(
        cfg,
        strategy,
        n_devices,
        flops_per_s,
        bandwidth,
        bytes_per_param,
        tokens=1.0,
        remat=remat,
        keep_gathered=keep_gathered,
        n_ops=n_ops,
    )
    return float(
        max(
            per_token.comm.forward / per_token.compute.forward,
            per_token.comm.backward / per_token.compute.backward,
        )
    )


def compute_bound_tokens(peak_flops_per_s: float, bandwidth: float) -> float:
    """The scaling book's rule of thumb: tokens per device must exceed C / W.

    FLOP/s over one-way bandwidth per device. It is ``knee_tokens`` for bf16 on the wire
    (``b = 2``) and a model whose parameters are all in matmuls and whose FLOPs are all
    6 x those parameters (no attention), as ``N`` grows: the forward
    all-gather sends ``2 P`` bytes against ``2 P`` FLOPs per token, the DP all-reduce
    ``4 P`` bytes against ``4 P`` FLOPs per token, and the ``P`` cancels.
    """
    return peak_flops_per_s / bandwidth
