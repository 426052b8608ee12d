"""The accelerators the planner knows, each with its sources, and the network between them.

A ``Hardware`` holds what the planner's time model reads: the dense bf16 peak (the MFU's
denominator), the fastest matmul ever measured on the chip (its *MAMF*, the optimistic
MFU's compute rate), HBM size and bandwidth, and two tiers of network: ``link_bw`` per device
one way inside a node (NVLink, Infinity Fabric, or one TPU ICI axis), and ``node_bw`` out of
a whole node across nodes (the sum of its NICs), or None for one tier (a TPU pod's ICI).
``network()`` hands those to ``helpers.measuring.cost_model`` as a ``Network``, which prices
every collective the planner counts.

**Across nodes, which model.** A collective over ``M`` nodes sends out of each node either
``(M-1)/M`` of the array (``"hierarchical"``: reduce inside the node first, the scaling
book's idealised two-level model, GPU chapter "Cross-node collectives") or ``(N-1)/N`` of it
(``"flat"``: one ring through all ``N`` GPUs). The planner's default is **flat**, because
that is what NCCL runs for the all-gathers and reduce-scatters that ZeRO and FSDP send:
its tuning model tunes only the ring algorithm for them (the tree and CollNet algorithms
serve all-reduce) and prices a ring at ``nbytes x (nRanks-1)/nRanks`` over a bus bandwidth
set by the inter-node speed (``ncclTopoTuneModel`` in NVIDIA/nccl ``src/graph/tuning.cc``
at 01afd20a: ``ratio = nRanks / nsteps`` with ``nsteps = nRanks - 1``; later versions add
NVLink SHARP and a one-GPU-per-node algorithm for special cases). The two models differ
only when few nodes are spanned (2 nodes: 15/16 against 1/2 of the array);
``--cross-node hierarchical`` chooses the book's.

**Latency.** Each collective on a GPU pays NCCL's latency as its tuning model counts it
(``cost_model.NCCL_RING_LATENCY_2_27`` and ``NCCL_TREE_LATENCY_2_27``: NVIDIA/nccl
``src/graph/tuning.cc`` at v2.27.7-1, the Simple protocol; RCCL's own table is not used for
the MI300X, NCCL's stands in). All-gathers and reduce-scatters run on a ring, whose latency
grows with its length; an all-reduce across nodes runs on NCCL's tree when that is faster
for its bytes (its latency grows with ``log2`` of the nodes; ``cost_model.collective_time``).
On a DGX node's NVLink and NICs that means: inside one node a ring; across two or more nodes
the tree for a bucket of tens of MB, the ring again for about a GB or more at a few nodes.
A TPU pod's ICI has one small latency per hop and no tree.

**MAMF.** Stas Bekman's measured "Maximum Achievable Matmul FLOPS" table
(github.com/stas00/ml-engineering, ``compute/accelerator/README.md``), the best of a
brute-force search over matmul shapes: A100 SXM 271.2 of 312 TFLOPS, H100 SXM 794.5 of 989
("H200 is the same"), B200 1745 of 2250, MI300X 781.9 of 1307 (ROCm 6.2; a later run
measured 668.4). It is the best rate that search found on the chip, so the planner's optimistic
MFU runs every matmul at it rather than at a datasheet peak no matmul reaches; the MFU is still
counted against the datasheet peak, as every published MFU is. Where no
measurement is published (V100, TPUs) the peak stands in, and the plan says so.

**HBM: what the device reports, not the marketing figure.** ``hbm_bytes`` is the capacity
the device itself reports, in bytes; ``hbm_marketed`` keeps the vendor's round figure
(decimal GB as printed, often close to GiB), and ``hbm_source`` says where the bytes come
from. An "80 GB" H100 reports 81,559 MiB (85.52e9 bytes) to ``nvidia-smi``, 6.9% more than
80e9: NVIDIA's figure is a round number, not a count of bytes (Modal's table of NVML's
totals, thundergolfer.com/blog/nvidia-gpu-memory-capacity; the same bytes, 85,520,809,984,
in modal-labs/modal-client pull request 2797). For a GPU this is NVML's total
(``nvidia-smi --query-gpu=memory.total``); CUDA's ``totalGlobalMem`` is a few hundred MiB
less (178.35 GiB against nvidia-smi's 179.06 on a B200, pytorch/ao pull request 4002), and
the CUDA context, NCCL's buffers and the allocator's fragments take more: the planner's
margin, not these bytes, keeps room for them. For a TPU it is what XLA may use on
one chip: the compiler's "available HBM" (libtpu's refusal of a program that does not fit,
``helpers.measuring.topology.tpu_out_of_memory``; ``tests/test_topology.py`` compiles one
for each TPU here), a little under the GiB Google quotes for v5e and v6e. On a chip,
``jax.Device.memory_stats()['bytes_limit']`` is the figure to read; a v5e chip's run in issue
51 ("14.7 GiB of the chip's 15.75") agrees, v5p and v6e were not read on a chip here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from helpers.measuring import cost_model

CROSS_NODE = cost_model.CROSS_NODE
DEFAULT_CROSS_NODE = "flat"


@dataclass(frozen=True)
class Hardware:
    """One accelerator and its node: dense bf16 peak and measured matmul rate (FLOP/s),
    HBM (bytes, bytes/s), one-way bandwidth per device inside a node (``link_bw``, over
    ``per_node`` devices) and out of a node (``node_bw``: all its NICs; None: one tier),
    NCCL-style latencies (``latency``: the ring's; ``tree_latency``: the tree's, None where
    every collective runs on a ring), and the sources of every figure. ``hbm_bytes`` is the
    capacity the device reports (see the module: NVML's total for a GPU, the compiler's
    available bytes for a TPU), ``hbm_marketed`` the vendor's round figure (bytes, as
    decimal GB), and ``hbm_source`` where each comes from."""

    name: str
    peak_flops: float
    hbm_bytes: float
    link_bw: float
    per_node: int
    node_bw: float | None
    source: str
    matmul_flops: float = 0.0
    hbm_bw: float = 2e12
    latency: tuple[float, float, float] = cost_model.NCCL_RING_LATENCY_2_27
    cross_node: str = DEFAULT_CROSS_NODE
    max_devices: int = 0
    hbm_marketed: float = 0.0
    hbm_source: str = ""
    tree_latency: tuple[float, float, float] | None = cost_model.NCCL_TREE_LATENCY_2_27

    def __post_init__(self) -> None:
        if not self.matmul_flops:
            object.__setattr__(self, "matmul_flops", self.peak_flops)
        for key in ("peak_flops", "hbm_bytes", "link_bw", "hbm_bw", "matmul_flops"):
            if not getattr(self, key) > 0:
                raise ValueError(f"Hardware: {key} must be > 0, got {getattr(self, key)!r}.")
        if self.node_bw is not None and not self.node_bw > 0:
            raise ValueError(f"Hardware: node_bw must be > 0 or None, got {self.node_bw!r}.")
        if self.cross_node not in CROSS_NODE:
            raise ValueError(f"Hardware: cross_node must be one of {CROSS_NODE}.")

    @property
    def network_bw(self) -> float:
        """One device's share of the node's egress (the old single figure)."""
        return self.node_bw / self.per_node if self.node_bw else self.link_bw

    def network(self) -> cost_model.Network:
        """The two tiers, as ``helpers.measuring.cost_model`` prices collectives on them."""
        return cost_model.Network(
            self.link_bw,
            self.node_bw,
            self.per_node,
            self.latency,
            self.cross_node,
            self.tree_latency,
        )


def _peak(kind: str) -> float:
    """The dense bf16 peak of ``kind`` from the one table, ``cost_model.PEAKS``."""
    found = cost_model.peak_of(kind)
    assert found is not None, kind
    return found.flops


_MAMF = "MAMF: github.com/stas00/ml-engineering compute/accelerator/README.md"
_DGX_H100 = "DGX H100/H200: 8 GPUs, 8x 400 Gb/s ConnectX-7 (400 GB/s out of a node)"
_MIB, _GIB = 2**20, 2**30
#: Modal's table of the totals NVML reports (nvidia-smi), beside NVIDIA's product sizes.
_MODAL = "nvidia-smi's total, Modal's table (thundergolfer.com/blog/nvidia-gpu-memory-capacity)"
#: What libtpu's compiler (0.0.42.1) says is available on one chip when it refuses a program
#: too big for it ("exceeds available HBM (15.75G)", G = 2**30, two decimals).
_XLA_TPU = "libtpu 0.0.42.1's compiler, 'available HBM' on one chip"

HARDWARE: dict[str, Hardware] = {
    "h100": Hardware(
        "H100 SXM", _peak("H100"), 81559 * _MIB, cost_model.NVLINK4, 8, cost_model.DGX_H100_NODE,
        "NVIDIA H100 datasheet: 1,979 TFLOPS bf16 with sparsity (989 dense), 80 GB HBM3 "
        f"(marketed) at 3.35 TB/s, NVLink 900 GB/s (450 each way); {_DGX_H100}; {_MAMF}: "
        "794.5 TFLOPS",
        matmul_flops=794.5e12, hbm_bw=cost_model.HBM_BANDWIDTH["H100 SXM"], hbm_marketed=80e9,
        hbm_source=f"81,559 MiB (85.52e9 bytes), {_MODAL}; 85,520,809,984 bytes in "
        "modal-labs/modal-client pull request 2797; NVIDIA markets 80 GB",
    ),
    "h200": Hardware(
        "H200 SXM", _peak("H200"), 143771 * _MIB, cost_model.NVLINK4, 8,
        cost_model.DGX_H100_NODE,
        "NVIDIA H200 datasheet: 1,979 TFLOPS bf16 with sparsity (989 dense), 141 GB HBM3e "
        f"(marketed) at 4.8 TB/s, NVLink 900 GB/s; {_DGX_H100}; {_MAMF}: 'H200 is the same' as "
        "H100, 794.5",
        matmul_flops=794.5e12, hbm_bw=cost_model.HBM_BANDWIDTH["H200 SXM"], hbm_marketed=141e9,
        hbm_source=f"143,771 MiB (150.75e9 bytes), {_MODAL}; NVIDIA markets 141 GB",
    ),
    "a100-80gb": Hardware(
        "A100 SXM 80GB", _peak("A100"), 81920 * _MIB, cost_model.NVLINK3, 8, 8 * 25e9,
        "NVIDIA A100 datasheet: 312 TFLOPS bf16 dense, 80 GB HBM2e (marketed) at 2,039 GB/s, "
        "NVLink 600 GB/s (300 each way); DGX A100: 8x 200 Gb/s HDR InfiniBand (200 GB/s out); "
        f"{_MAMF}: 271.2 TFLOPS",
        matmul_flops=271.2e12, hbm_bw=cost_model.HBM_BANDWIDTH["A100"], hbm_marketed=80e9,
        hbm_source=f"81,920 MiB (80 GiB, 85.90e9 bytes), {_MODAL}; NVIDIA markets 80 GB",
    ),
    "a100-40gb": Hardware(
        "A100 SXM 40GB", _peak("A100"), 40960 * _MIB, cost_model.NVLINK3, 8, 8 * 25e9,
        "NVIDIA A100 datasheet: 312 TFLOPS bf16 dense, 40 GB HBM2 (marketed) at 1,555 GB/s, "
        "NVLink 600 GB/s; DGX A100 (40 GB): 8x 200 Gb/s HDR InfiniBand; "
        f"{_MAMF}: A100 SXM 271.2 TFLOPS",
        matmul_flops=271.2e12, hbm_bw=1.555e12, hbm_marketed=40e9,
        hbm_source=f"40,960 MiB (40 GiB, 42.95e9 bytes), {_MODAL}; NVIDIA markets 40 GB",
    ),
    "v100": Hardware(
        "V100 SXM2 32GB", _peak("V100"), 32768 * _MIB, 150e9, 8, 4 * 12.5e9,
        "NVIDIA V100 datasheet: 125 TFLOPS fp16 tensor (Volta has no bf16), 32 GB HBM2 "
        "(marketed) at 900 GB/s, NVLink 300 GB/s (150 each way); DGX-1: 8 GPUs, 4x 100 Gb/s "
        "EDR InfiniBand; no published MAMF: the peak stands in",
        hbm_bw=900e9, hbm_marketed=32e9,
        hbm_source="32,768 MiB (32 GiB, 34.36e9 bytes): nvidia-smi's total for a Tesla "
        "V100-SXM2 (github.com/Wan-Video/Wan2.1/issues/5); NVIDIA markets 32 GB",
    ),
    "b200": Hardware(
        "B200", _peak("B200"), 183359 * _MIB, 900e9, 8, 8 * cost_model.IB_NDR_400,
        "NVIDIA DGX B200 datasheet: 72 PFLOPS FP8 training for 8 GPUs (2.25 PFLOPS dense bf16 "
        "each, the scaling book's GPU table), 1,440 GB HBM3e (180 GB each, marketed) at 64 TB/s, "
        "NVLink 5 1.8 TB/s (900 GB/s each way), 8x 400 Gb/s ConnectX-7 (400 GB/s out, the "
        f"scaling book's node egress); {_MAMF}: 1,745 TFLOPS",
        matmul_flops=1745e12, hbm_bw=8e12, hbm_marketed=180e9,
        hbm_source="183,359 MiB (179.06 GiB, 192.27e9 bytes): nvidia-smi's total for an NVIDIA "
        "B200 (1000 W; github.com/NVIDIA/TensorRT-LLM/issues/10278); docs.vultr.com's HGX B200 hardware "
        "overview lists '179 GB' from nvidia-smi's memory.total; CUDA's totalGlobalMem reads "
        "178.35 GiB (pytorch/ao pull request 4002); NVIDIA markets 180 GB (DGX B200), 192 GB "
        "elsewhere",
    ),
    "mi300x": Hardware(
        "MI300X", _peak("MI300X"), 201310208 * 1024, 448e9, 8, 8 * cost_model.IB_NDR_400,
        "AMD Instinct MI300X datasheet: 1,307.4 TFLOPS bf16 dense, 192 GB HBM3 (marketed) at "
        "5.3 TB/s, 7 Infinity Fabric links of 64 GB/s each way to the 7 peers (896 GB/s both "
        "ways in all; 448 each way, reached only when all peers are sent to at once); 8 GPUs a "
        "node and, assumed, one 400 Gb/s NIC per GPU (the rail network of AMD's MI3XX cluster "
        "reference design, instinct.docs.amd.com; the platform leaves NICs to the server "
        f"maker); {_MAMF}: 781.9 TFLOPS (ROCm 6.2)",
        matmul_flops=781.9e12, hbm_bw=5.3e12, hbm_marketed=192e9,
        hbm_source="201,310,208 KB (206.14e9 bytes, 192 GiB less 16 MiB): rocminfo's GPU pool size "
        "on an 8x MI300X node (github.com/stas00/ml-engineering, compute/accelerator/amd/"
        "debug.md); AMD markets 192 GB",
    ),
    # TPUs: the scaling book's TPU chapter (jax-ml.github.io/scaling-book/tpus), its table of
    # chips (bf16 FLOP/s, HBM, HBM bandwidth) and of ICI bandwidth: one mesh axis with a
    # wraparound ring runs at the *bidirectional* figure. A pod is one tier of ICI. HBM:
    # what XLA may use on one chip (the module's docstring).
    "tpu-v5p": Hardware(
        "TPU v5p", _peak("TPU v5p"), 95.74 * _GIB, 1.8e11, 8960, None,
        "cloud.google.com/tpu/docs/v5p: 459 TFLOPS bf16, 95 GB HBM2e (marketed); the scaling "
        "book's TPU chapter: 2.8e12 B/s HBM, ICI 9e10 B/s one way per link, 1.8e11 "
        "bidirectional per axis, 8,960 chips per pod (16x20x28); no published MAMF: the peak "
        "stands in",
        hbm_bw=2.8e12, latency=(1e-6, 1e-6, 1e-6), tree_latency=None,
        max_devices=8960, hbm_marketed=95e9,
        hbm_source=f"95.74 GiB (102.8e9 bytes), {_XLA_TPU} (topology v5p:2x2x1); Google "
        "markets 95 GB (cloud.google.com/tpu/docs/v5p)",
    ),
    "tpu-v5e": Hardware(
        "TPU v5e", _peak("TPU v5 lite"), 15.75 * _GIB, 9e10, 256, None,
        "the scaling book's TPU chapter: 1.97e14 bf16 FLOP/s, 16 GB HBM (marketed) at 8.1e11 "
        "B/s, ICI 4.5e10 B/s one way per link (9e10 bidirectional per axis), 16x16 pods; no "
        "published MAMF: the peak stands in",
        hbm_bw=8.1e11, latency=(1e-6, 1e-6, 1e-6), tree_latency=None,
        max_devices=256, hbm_marketed=16e9,
        hbm_source=f"15.75 GiB (16,911,433,728 bytes), {_XLA_TPU} (v5e:1x1; the same bytes in "
        "helpers/measuring/tpu_programs.json for v5e:2x4); Google: 16 GiB HBM per chip "
        "(docs.cloud.google.com/tpu/docs/v5e), 16 GB in some of its pages",
    ),
    "tpu-v6e": Hardware(
        "TPU v6e (Trillium)", _peak("TPU v6e"), 31.25 * _GIB, 1.8e11, 256, None,
        "cloud.google.com/tpu/docs/v6e: 918 TFLOPS bf16, 32 GB HBM (marketed) at 1.6 TB/s; the "
        "scaling book's TPU chapter: ICI 9e10 B/s one way per link (1.8e11 bidirectional per "
        "axis), 16x16 pods; no published MAMF: the peak stands in",
        hbm_bw=1.6e12, latency=(1e-6, 1e-6, 1e-6), tree_latency=None,
        max_devices=256, hbm_marketed=32e9,
        hbm_source=f"31.25 GiB (33.55e9 bytes), {_XLA_TPU} (v6e:1x1); Google markets 32 GB "
        "(docs.cloud.google.com/tpu/docs/v6e)",
    ),
}  # fmt: skip

#: Old or short names for the entries above.
HARDWARE_ALIASES: dict[str, str] = {"a100": "a100-80gb", "h100-sxm": "h100", "v5p": "tpu-v5p"}


def hardware_with(
    hardware: Hardware,
    *,
    link_bw: float | None = None,
    node_bw: float | None = None,
    per_node: int | None = None,
    matmul_flops: float | None = None,
    cross_node: str | None = None,
) -> Hardware:
    """``hardware`` with some figures replaced (a cluster with fewer NICs, a measured
    all-reduce bandwidth, a measured matmul rate); the source says what changed.

    Raises:
      ValueError: a figure that is not positive, or an unknown ``cross_node``.
    """
    changes = {
        k: v
        for k, v in dict(
            link_bw=link_bw, node_bw=node_bw, per_node=per_node, matmul_flops=matmul_flops,
            cross_node=cross_node,
        ).items()
        if v is not None
    }  # fmt: skip
    if not changes:
        return hardware
    said = ", ".join(
        f"{k}={v:.4g}" if not isinstance(v, str) else f"{k}={v}" for k, v in changes.items()
    )
    return replace(hardware, **changes, source=f"{hardware.source}; set here: {said}")


__all__ = [
    "DEFAULT_CROSS_NODE", "HARDWARE", "HARDWARE_ALIASES", "Hardware",
    "hardware_with",
]  # fmt: skip
