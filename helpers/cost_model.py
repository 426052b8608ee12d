"""The cost model: what a training step should cost on N GPUs, from formulas alone.

``helpers.profile`` measures a step; this module predicts one, so that a notebook can set
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

========================  ================  ============================================
strategy                  forward           backward
========================  ================  ============================================
``dp``                    0                 2 (all-reduce of the gradients)
``fsdp``                  1 (all-gather)    1 (reduce-scatter of the gradients)
``fsdp``, ``remat``       1                 2 (the weights are gathered again, then
                                            reduce-scatter)
========================  ================  ============================================

With ``reduce_scatter=False`` FSDP's gradients cost an all-reduce (2) instead of a
reduce-scatter (1): that is what XLA's CPU backend compiles (see notebook 04).
The overlap inside a phase is an assumption (XLA's GPU latency-hiding scheduler aims for
it); the projections here are not measurements.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple, Protocol

import numpy as np

# ---------------------------------------------------------------------------
# Hardware figures
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


def peak_flops(device_kind: str) -> tuple[str, float] | None:
    """``(name, dense bf16 FLOP/s)`` of a device from ``PEAK_BF16_FLOPS``, or None if unknown.

    >>> peak_flops("NVIDIA H100 80GB HBM3")
    ('H100 SXM', 989000000000000.0)
    """
    for pattern, name, flops in PEAK_BF16_FLOPS:
        if re.search(pattern, device_kind, re.IGNORECASE):
            return name, flops
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
    """What the cost model reads from a model config (``helpers.models.ModelConfig`` and
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


def comm_units(strategy: str, *, remat: bool = False, reduce_scatter: bool = True) -> Phases:
    """Ring units each device sends per step, per phase (see the module's table)."""
    if strategy not in _UNITS:
        raise ValueError(
            f"comm_units: no cost model for strategy={strategy!r}; use one of {sorted(_UNITS)}. "
            "(tp, hybrid and fsdp_tp move activations, whose size depends on the batch.)"
        )
    forward, backward = _UNITS[strategy]
    if strategy != "dp":
        backward += (1 if remat else 0) + (0 if reduce_scatter else 1)
    return Phases(forward, backward)


def comm_bytes(
    strategy: str,
    n_params: int,
    n_devices: int,
    bytes_per_param: float = 4,
    *,
    remat: bool = False,
    reduce_scatter: bool = True,
) -> Phases:
    """Bytes each device sends per step, per phase: units x ``P x b x (N-1)/N``.

    ``bytes_per_param`` is what the wire carries: 4 for the f32 master weights this series
    keeps, 2 if the collectives move bf16.
    """
    unit = n_params * bytes_per_param * (n_devices - 1) / n_devices
    units = comm_units(strategy, remat=remat, reduce_scatter=reduce_scatter)
    return Phases(units.forward * unit, units.backward * unit)


def comm_time(
    strategy: str,
    n_params: int,
    n_devices: int,
    bandwidth: float,
    bytes_per_param: float = 4,
    *,
    remat: bool = False,
    reduce_scatter: bool = True,
) -> Phases:
    """Seconds of communication per step, per phase, at ``bandwidth`` (bytes/s, one way)."""
    sent = comm_bytes(
        strategy, n_params, n_devices, bytes_per_param, remat=remat, reduce_scatter=reduce_scatter
    )
    return Phases(sent.forward / bandwidth, sent.backward / bandwidth)


# ---------------------------------------------------------------------------
# A step, its knee, and the scaling-book rule
# ---------------------------------------------------------------------------


class StepCost(NamedTuple):
    """A predicted step on one device: compute and communication seconds, per phase."""

    compute: Phases
    comm: Phases

    @property
    def step_s(self) -> Any:
        """Communication hidden behind compute within each phase: sum of per-phase maxima."""
        return np.maximum(self.compute.forward, self.comm.forward) + np.maximum(
            self.compute.backward, self.comm.backward
        )

    @property
    def serial_s(self) -> Any:
        """No overlap at all: compute plus communication."""
        return self.compute.total + self.comm.total

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
    bandwidth: float,
    bytes_per_param: float = 4,
    *,
    tokens: Any = None,
    remat: bool = False,
) -> StepCost:
    """Predicted step of ``strategy`` with ``tokens`` per device (default ``cfg``'s batch x seq;
    more tokens are more sequences of ``cfg.seq`` tokens).

    Weak scaling: each device keeps its own batch, so compute per device does not change
    with ``n_devices``; communication does not depend on the batch. ``flops_per_s`` is what
    one device sustains (a peak, or a measured rate). ``tokens`` may be a numpy array.
    """
    tokens = cfg.batch * cfg.seq if tokens is None else np.asarray(tokens, dtype=float)
    per_token = flops_per_token(cfg, remat=remat)
    compute = Phases(
        tokens * per_token.forward / flops_per_s, tokens * per_token.backward / flops_per_s
    )
    comm = comm_time(
        strategy, cfg.param_count(), n_devices, bandwidth, bytes_per_param, remat=remat
    )
    return StepCost(compute, comm)


def knee_tokens(
    cfg: SizedModel,
    strategy: str,
    n_devices: int,
    flops_per_s: float,
    bandwidth: float,
    bytes_per_param: float = 4,
    *,
    remat: bool = False,
) -> float:
    """Tokens per device below which some phase of the step waits for the interconnect.

    Each phase is compute-bound while its compute time, linear in the tokens, covers its
    communication time; the knee is the larger of the two phases' break-even points.
    """
    per_token = step_cost(
        cfg, strategy, n_devices, flops_per_s, bandwidth, bytes_per_param, tokens=1.0, remat=remat
    )
    return max(
        per_token.comm.forward / per_token.compute.forward,
        per_token.comm.backward / per_token.compute.backward,
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
