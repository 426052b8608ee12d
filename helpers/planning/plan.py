"""Plan a real model before renting the GPUs: memory per device, traffic per axis, step time.

``plan_model(...)`` takes a decoder-only Transformer (dense or mixture-of-experts), the degree of
each parallelism, the ZeRO stage, the precision, the batch, remat and the hardware, and
returns a ``Plan``: the parameter count, the bytes each device holds (parameters,
gradients, optimizer state, activations), whether that fits in HBM, the bytes each device
sends per step over each mesh axis, and an estimated step time and MFU. It is arithmetic
only (no jax): the notebook 13 checks it against what XLA compiles.

``python -m helpers.plan --help`` is the command line; ``--json PATH`` writes the plan.

Model states (Rajbhandari et al. 2019, "ZeRO", arXiv:1910.02054, Section 3.1 and Fig. 1):
with mixed-precision Adam each parameter costs 2 bytes (bf16 weights) + 2 (bf16 gradients)
+ K = 12 (f32 master weights, momentum and variance). Over a data-parallel degree N_d,
ZeRO-1 divides the K bytes by N_d, ZeRO-2 the gradients too, ZeRO-3 (FSDP) everything.
Tensor and pipeline parallelism divide the parameters first (Megatron-LM, Shoeybi et al.
2019, arXiv:1909.08053; Narayanan et al. 2021, arXiv:2104.04473); expert parallelism
divides the experts.

Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", arXiv:2205.05198, Section 4), counted tensor by tensor for a
LLaMA-style block (RMSNorm, grouped-query attention, SwiGLU MLP) in the compute dtype;
with ``flash_attention`` the score matrix is not stored (Dao et al. 2022, arXiv:2205.14135).
The mesh order is ``pp`` (outermost), ``dp``, ``ep``, ``cp``, ``tp`` (innermost, on the
fastest links); an axis whose group spans more than one node runs at the network's
bandwidth instead of the node's.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from helpers.cli import OneLineParser, writable_path
from helpers.measuring import cost_model

# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    """The shapes of a decoder-only Transformer, LLaMA-style (dense) or Mixtral-style (MoE).

    ``n_experts == 1`` is a dense model. ``head_dim`` defaults to ``hidden // n_heads``.
    ``mlp_matrices`` is 3 for SwiGLU (gate, up, down), 2 for a GELU MLP (the series'
    ``TransformerLM``); ``norm_vectors`` is 1 for RMSNorm (a scale), 2 for LayerNorm.
    ``params_only`` marks a model known only by its parameter count (``--params``): its
    layers are unknown, so only model states and data parallelism can be planned.
    """

    name: str
    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn: int
    vocab: int
    tied: bool = False
    n_experts: int = 1
    top_k: int = 1
    head_dim: int = 0
    params_only: int = 0
    mlp_matrices: int = 3
    norm_vectors: int = 1

    def __post_init__(self) -> None:
        if self.params_only:
            return
        for key in ("hidden", "n_layers", "n_heads", "n_kv_heads", "ffn", "vocab", "n_experts"):
            if getattr(self, key) < 1:
                raise ValueError(f"ModelSpec: {key}={getattr(self, key)} must be at least 1.")
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError(
                f"ModelSpec: top_k={self.top_k} must be between 1 and n_experts={self.n_experts}."
            )
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"ModelSpec: n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads}."
            )
        if not self.head_dim:
            if self.hidden % self.n_heads:
                raise ValueError(
                    f"ModelSpec: n_heads={self.n_heads} must divide hidden={self.hidden} "
                    "(or give head_dim)."
                )
            object.__setattr__(self, "head_dim", self.hidden // self.n_heads)

    # Parameters, in pieces -------------------------------------------------
    def attn_params(self) -> int:
        """Per layer: the query and output projections, and the (fewer) key/value heads."""
        q = self.hidden * self.n_heads * self.head_dim
        return 2 * q + 2 * self.hidden * self.n_kv_heads * self.head_dim

    def expert_params(self) -> int:
        """Per layer, all experts' MLPs: ``mlp_matrices`` x hidden x ffn each."""
        return self.n_experts * self.mlp_matrices * self.hidden * self.ffn

    def router_params(self) -> int:
        return self.hidden * self.n_experts if self.n_experts > 1 else 0

    def layer_params(self) -> int:
        """One decoder layer: attention, MLP (or experts and router), two RMSNorm scales."""
        norms = 2 * self.norm_vectors * self.hidden
        return self.attn_params() + self.expert_params() + self.router_params() + norms

    def embed_params(self) -> int:
        """Input embedding, plus the output head unless tied, plus the final norm."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.norm_vectors * self.hidden

    def param_count(self) -> int:
        """All parameters (for a ``--params`` model, that count)."""
        if self.params_only:
            return self.params_only
        return self.n_layers * self.layer_params() + self.embed_params()

    def active_params(self) -> int:
        """Parameters one token goes through: ``top_k`` of the experts (all, when dense)."""
        if self.params_only:
            return self.params_only
        inactive = (self.n_experts - self.top_k) * self.mlp_matrices * self.hidden * self.ffn
        return self.param_count() - self.n_layers * inactive


def spec_of_series_model(cfg: Any, name: str = "series Transformer") -> ModelSpec:
    """The ``ModelSpec`` of a ``helpers.placing.models.TransformerConfig``: multi-head attention
    (as many key/value heads as heads), a two-matrix GELU MLP, LayerNorms (scale and
    bias), an untied output head over the padded vocabulary."""
    return ModelSpec(
        name, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_heads, cfg.d_ff, cfg.padded_vocab,
        head_dim=cfg.head_dim, mlp_matrices=2, norm_vectors=2,
    )  # fmt: skip


# Published shapes (each model's Hugging Face config.json) and published totals.
NAMED_MODELS: dict[str, ModelSpec] = {
    # meta-llama/Meta-Llama-3-8B config.json; Llama 3 paper (arXiv:2407.21783), Table 3.
    "llama3-8b": ModelSpec("llama3-8b", 4096, 32, 32, 8, 14336, 128256),
    # meta-llama/Meta-Llama-3-70B config.json; same table.
    "llama3-70b": ModelSpec("llama3-70b", 8192, 80, 64, 8, 28672, 128256),
    # mistralai/Mixtral-8x7B-v0.1 config.json; Jiang et al. 2024 (arXiv:2401.04088), Table 1.
    "mixtral-8x7b": ModelSpec("mixtral-8x7b", 4096, 32, 32, 8, 14336, 32000, n_experts=8, top_k=2),
}

# Published parameter totals, and where they are published.
PUBLISHED_PARAMS: dict[str, tuple[float, str]] = {
    "llama3-8b": (8.03e9, "huggingface.co/meta-llama/Meta-Llama-3-8B: 'Model size 8.03B params'"),
    "llama3-70b": (
        70.6e9,
        "huggingface.co/meta-llama/Meta-Llama-3-70B: 'Model size 70.6B params'",
    ),
    "mixtral-8x7b": (
        46.7e9,
        "mistral.ai/news/mixtral-of-experts: '46.7B total parameters but only uses 12.9B "
        "parameters per token'",
    ),
}

HF_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
)


def model_from_hf_config(config: Mapping[str, Any], name: str = "config.json") -> ModelSpec:
    """A ``ModelSpec`` from a Hugging Face ``config.json`` (LLaMA- or Mixtral-style).

    Reads ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
    ``num_key_value_heads``, ``intermediate_size``, ``vocab_size``, and, if present,
    ``tie_word_embeddings`` (default False), ``head_dim``, and ``num_local_experts`` /
    ``num_experts_per_tok`` for a mixture of experts.

    Raises:
      ValueError: a key it needs is missing (the message names it), or is not a positive
        integer.
    """
    if not isinstance(config, Mapping):
        raise ValueError(f"{name}: expected a JSON object, got {type(config).__name__}.")
    values: dict[str, int] = {}
    for key in HF_KEYS:
        if key not in config:
            raise ValueError(f"{name}: missing key '{key}' (a LLaMA-style config.json has it).")
        values[key] = config[key]
    experts = config.get("num_local_experts", 1) or 1
    top_k = config.get("num_experts_per_tok", 1 if experts == 1 else None)
    if experts > 1 and top_k is None:
        raise ValueError(f"{name}: missing key 'num_experts_per_tok' (it has num_local_experts).")
    values["num_local_experts"], values["num_experts_per_tok"] = experts, top_k
    head_dim = config.get("head_dim") or 0
    for key, value in [*values.items(), ("head_dim", head_dim)]:
        if isinstance(value, bool) or not isinstance(value, int) or value < (key != "head_dim"):
            raise ValueError(f"{name}: key '{key}' must be a positive integer, got {value!r}.")
    return ModelSpec(
        name=str(config.get("_name_or_path") or name),
        hidden=values["hidden_size"],
        n_layers=values["num_hidden_layers"],
        n_heads=values["num_attention_heads"],
        n_kv_heads=values["num_key_value_heads"],
        ffn=values["intermediate_size"],
        vocab=values["vocab_size"],
        tied=bool(config.get("tie_word_embeddings", False)),
        n_experts=experts,
        top_k=top_k,
        head_dim=head_dim,
    )


# ---------------------------------------------------------------------------
# Hardware
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Hardware:
    """One accelerator: dense bf16 peak, HBM, and the one-way bandwidth per device within a
    node (``link_bw``, over ``per_node`` devices) and across nodes (``network_bw``)."""

    name: str
    peak_flops: float
    hbm_bytes: float
    link_bw: float
    per_node: int
    network_bw: float
    source: str


def _peak(kind: str) -> float:
    found = cost_model.peak_flops(kind)
    assert found is not None
    return found[1]


HARDWARE: dict[str, Hardware] = {
    # Peaks and NVLink figures: helpers.measuring.cost_model (NVIDIA datasheets). HBM: the datasheets
    # (H100 SXM 80 GB, H200 SXM 141 GB, A100 SXM 80 GB). Network: one 400 Gb/s
    # ConnectX-7 NIC per GPU in a DGX H100/H200 (50 GB/s), one 200 Gb/s HDR NIC per GPU in
    # a DGX A100 (25 GB/s), eight GPUs per node.
    "h100": Hardware(
        "H100 SXM",
        _peak("H100"),
        80e9,
        cost_model.NVLINK4,
        8,
        50e9,
        "NVIDIA H100 datasheet: 1,979 TFLOPS bf16 sparse (989 dense), 80 GB, NVLink 900 GB/s; "
        "DGX H100: 8x 400 Gb/s ConnectX-7",
    ),
    "h200": Hardware(
        "H200 SXM",
        _peak("H200"),
        141e9,
        cost_model.NVLINK4,
        8,
        50e9,
        "NVIDIA H200 datasheet: 1,979 TFLOPS bf16 sparse (989 dense), 141 GB, NVLink 900 GB/s; "
        "DGX H200: 8x 400 Gb/s ConnectX-7",
    ),
    "a100": Hardware(
        "A100 SXM 80GB",
        _peak("A100"),
        80e9,
        cost_model.NVLINK3,
        8,
        25e9,
        "NVIDIA A100 datasheet: 312 TFLOPS bf16 dense, 80 GB, NVLink 600 GB/s; "
        "DGX A100: 8x 200 Gb/s HDR",
    ),
    # Google Cloud's TPU v5p page: 459 TFLOPS bf16, 95 GB HBM, 4,800 Gbps ICI per chip;
    # the scaling book ("How to think about TPUs") gives 9e10 bytes/s one way per ICI link,
    # and a v5p pod's 8,960 chips all sit on ICI (no slower network inside a slice).
    "tpu-v5p": Hardware(
        "TPU v5p",
        459e12,
        95e9,
        9e10,
        8960,
        9e10,
        "cloud.google.com/tpu/docs/v5p: 459 TFLOPS bf16, 95 GB HBM2e, 4,800 Gbps ICI; "
        "jax-ml.github.io/scaling-book/tpus: 9e10 B/s one way per ICI link",
    ),
}

# ---------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------

AXES = ("pp", "dp", "ep", "cp", "tp")  # outermost to innermost


class PlanError(ValueError):
    """A configuration that cannot run; ``str()`` is one line naming the setting."""


@dataclass
class Plan:
    """What ``plan`` predicts; ``to_json()`` is what ``--json`` writes (see ``JSON_KEYS``)."""

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
    per_device_bytes: dict[str, float]
    hbm_bytes: float
    fits: bool
    comm_bytes_per_step: dict[str, float]
    step_time_s: float
    mfu: float
    tokens_per_step: int
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


JSON_KEYS: dict[str, str] = {
    "model": "the model's name",
    "hardware": "the accelerator's name",
    "n_params": "total parameters",
    "active_params": "parameters each token goes through (fewer than n_params for MoE)",
    "degrees": "the degree of each axis: pp, dp, ep, cp, tp (their product is the device count)",
    "zero": "ZeRO stage over dp: 0 replicates, 1 shards the optimizer state, 2 also the "
    "gradients, 3 also the parameters (FSDP)",
    "precision": "'mixed' (bf16 compute, f32 master weights and Adam) or 'f32'",
    "micro_batch": "sequences per data-parallel rank per micro-batch",
    "seq": "tokens per sequence",
    "grad_accum": "micro-batches per step",
    "remat": "'none' or 'full' (each layer's activations recomputed in the backward pass)",
    "per_device_bytes": "bytes on the fullest device: params, grads, optimizer, "
    "activations, total (activations are 0 for a --params model)",
    "hbm_bytes": "the accelerator's HBM",
    "fits": "per_device_bytes.total <= hbm_bytes",
    "comm_bytes_per_step": "bytes each device sends per step over each axis whose degree is >1",
    "step_time_s": "estimated seconds per step (helpers.measuring.cost_model's overlap model)",
    "mfu": "model FLOPs per step / (step_time_s x peak FLOP/s); an upper bound, since the "
    "estimate runs every matmul at the peak",
    "tokens_per_step": "tokens in one step over all devices",
    "notes": "what the estimate assumed or left out",
}


class _Flops:
    """The ``cost_model.SizedModel`` view of one micro-batch on one device."""

    def __init__(self, batch: int, seq: int, flops: float) -> None:
        self.batch, self.seq, self._flops = batch, seq, flops

    def param_count(self) -> int:  # pragma: no cover - the protocol asks for it
        return 0

    def train_flops_per_step(self) -> float:
        return self._flops


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"{name} must be a positive integer, got {value!r}.")
    return value


def _divides(flag: str, degree: int, what: str, size: int) -> None:
    if size % degree:
        raise PlanError(f"{flag}={degree} does not divide {what} ({size}).")


def _resolve(model: ModelSpec | str, hardware: Hardware | str) -> tuple[ModelSpec, Hardware]:
    """The model and hardware a name stands for (or the objects given)."""
    if isinstance(model, str):
        if model not in NAMED_MODELS:
            raise PlanError(f"--config: unknown model {model!r}; named: {sorted(NAMED_MODELS)}.")
        model = NAMED_MODELS[model]
    if isinstance(hardware, str):
        if hardware not in HARDWARE:
            raise PlanError(f"--hardware: unknown {hardware!r}; one of {sorted(HARDWARE)}.")
        hardware = HARDWARE[hardware]
    return model, hardware


def _check_degrees(degrees: dict[str, int], gpus: int | None) -> int:
    """Each degree positive and, when ``gpus`` is given, their product equal to it."""
    for axis, d in degrees.items():
        _positive(f"--{axis}", d)
    n_dev = math.prod(degrees.values())
    if gpus is not None and _positive("--gpus", gpus) != n_dev:
        product = " x ".join(f"{a} {d}" for a, d in degrees.items() if d > 1) or "1"
        raise PlanError(f"--gpus={gpus} is not the product of the degrees ({product} = {n_dev}).")
    return n_dev


def _check_choices(zero: int, precision: str, remat: str) -> None:
    """The settings that take one of a few values."""
    if zero not in (0, 1, 2, 3):
        raise PlanError(f"--zero must be 0, 1, 2 or 3, got {zero!r}.")
    if precision not in ("mixed", "f32"):
        raise PlanError(f"--precision must be 'mixed' or 'f32', got {precision!r}.")
    if remat not in ("none", "full"):
        raise PlanError(f"--remat must be 'none' or 'full', got {remat!r}.")


def _check_shapes(model: ModelSpec, degrees: dict[str, int], seq: int) -> None:
    """Each model-parallel degree divides the dimension it splits (or needs shapes at all)."""
    if model.params_only:
        for axis in ("tp", "pp", "cp", "ep"):
            if degrees[axis] > 1:
                raise PlanError(
                    f"--{axis}={degrees[axis]} needs the model's shapes (--config); --params "
                    "gives only a count."
                )
        return
    pp, tp = degrees["pp"], degrees["tp"]
    _divides("--pp", pp, "the number of layers", model.n_layers)
    _divides("--tp", tp, "the number of key/value heads", model.n_kv_heads)
    _divides("--tp", tp, "the MLP width", model.ffn)
    _divides("--tp", tp, "the vocabulary", model.vocab)
    _divides("--cp", degrees["cp"], "the sequence length", seq)
    _divides("--ep", degrees["ep"], "the number of experts", model.n_experts)


def _local_params(model: ModelSpec, degrees: dict[str, int]) -> float:
    """Parameters held by the fullest device before ZeRO.

    tp and pp split them, ep splits the experts; norms and the router stay whole within a
    tp group.
    """
    if model.params_only:
        return float(model.param_count())
    tp, pp, ep = degrees["tp"], degrees["pp"], degrees["ep"]
    layers = model.n_layers // pp
    per_layer = (model.attn_params() + model.expert_params() / ep) / tp
    per_layer += model.router_params() + 2 * model.norm_vectors * model.hidden
    embed = model.vocab * model.hidden / tp
    edge = embed * (1 if model.tied or pp > 1 else 2) + model.norm_vectors * model.hidden
    return layers * per_layer + edge


def _state_bytes(
    local: float, dp: int, zero: int, w_b: int, g_b: int, opt_b: int
) -> dict[str, float]:
    """Bytes of parameters, gradients and optimizer state per device, after ZeRO's split."""
    return {
        "params": local * w_b / (dp if zero >= 3 else 1),
        "grads": local * g_b / (dp if zero >= 2 else 1),
        "optimizer": local * opt_b / (dp if zero >= 1 else 1),
    }


def _activation_note(flash_attention: bool, pp: int) -> str:
    """The plan's note on how activations were counted."""
    return (
        "activations: LLaMA-style block, "
        + ("fused (flash) attention, no score matrix" if flash_attention else "scores stored")
        + (", 1F1B keeps pp micro-batches in flight" if pp > 1 else "")
    )


def _step_flops(
    model: ModelSpec, degrees: dict[str, int], tokens: int, seq: int
) -> tuple[float, float]:
    """(FLOPs per micro-batch on one device, the whole model's FLOPs per micro-batch).

    PaLM's count: 6 per active matmul parameter per token plus attention's 12 L H Q T,
    split by tp and cp, and over pp stages.
    """
    n_active = model.active_params()
    if model.params_only:
        flops = 6.0 * tokens * n_active
        return flops, flops
    attn = 12 * model.n_layers * model.n_heads * model.head_dim * seq
    matmul = n_active - model.embed_params() + model.vocab * model.hidden
    model_flops = tokens * (6.0 * matmul + attn)
    return model_flops / (degrees["tp"] * degrees["cp"] * degrees["pp"]), model_flops


def _axis_bandwidths(degrees: dict[str, int], hardware: Hardware) -> dict[str, float]:
    """Each axis's bandwidth: the fast link while the axes inside it fit one node."""
    bw: dict[str, float] = {}
    inner = 1
    for axis in reversed(AXES):
        d = degrees[axis]
        bw[axis] = hardware.link_bw if inner * d <= hardware.per_node else hardware.network_bw
        inner *= d
    return bw


def _dp_phases(local: float, dp: int, zero: int, g_b: int, m: int) -> cost_model.Phases:
    """The data-parallel axis's bytes per step, forward and backward."""
    strategy = "fsdp" if zero == 3 else "dp"
    # ZeRO-3 frees each layer's gathered weights after its forward pass and gathers them
    # again for the backward one (1.5x DP's traffic, the ZeRO paper's Section 7.2.2): the
    # cost model's textbook FSDP.
    dp_bytes = cost_model.comm_bytes(strategy, round(local), dp, g_b)
    # With micro-batches, a device that keeps only a slice of the gradients (ZeRO-2, -3)
    # reduce-scatters them after every micro-batch, and ZeRO-3 gathers the weights again
    # for every one; DP and ZeRO-1 accumulate whole gradients and reduce them once.
    if zero == 3:
        dp_bytes = cost_model.Phases(m * dp_bytes.forward, m * dp_bytes.backward)
    elif zero == 2:
        dp_bytes = cost_model.Phases(0.0, (m + 1) * dp_bytes.backward / 2)
    return dp_bytes


def _model_parallel_comm(
    model: ModelSpec,
    degrees: dict[str, int],
    local_tokens: int,
    act_b: int,
    remat: str,
    m: int,
    bw: dict[str, float],
    comm: dict[str, float],
) -> tuple[float, float]:
    """Fill ``comm`` for tp, cp, ep and pp; return the (forward, backward) serial seconds."""
    fwd_serial = bwd_serial = 0.0
    tp, cp, ep, pp = degrees["tp"], degrees["cp"], degrees["ep"], degrees["pp"]
    h, act_tok = model.hidden, local_tokens * act_b
    layers = model.n_layers // pp
    recompute = 2 if remat == "full" else 1
    if tp > 1:  # Megatron: two all-reduces of the activations per layer and direction
        unit = 2 * (tp - 1) / tp * act_tok * h
        fwd, bwd = 2 * layers * unit, 2 * layers * unit * recompute
        comm["tp"] = m * (fwd + bwd)
        fwd_serial += fwd / bw["tp"]
        bwd_serial += bwd / bw["tp"]
    if cp > 1:  # ring attention: K and V gathered, their gradients reduce-scattered
        kv = 2 * model.n_kv_heads * model.head_dim * act_tok * (cp - 1)
        comm["cp"] = m * layers * kv * (1 + recompute)
    if ep > 1:  # all-to-all to the experts and back, each top_k copies of the tokens
        a2a = 2 * act_tok * h * model.top_k * (ep - 1) / ep
        fwd, bwd = layers * a2a, layers * a2a * recompute
        comm["ep"] = m * (fwd + bwd)
        fwd_serial += fwd / bw["ep"]
        bwd_serial += bwd / bw["ep"]
    if pp > 1:  # one activation forward and one gradient back per micro-batch
        comm["pp"] = m * 2 * act_tok * h
    return fwd_serial, bwd_serial


def _step_seconds(
    m: int,
    pp: int,
    local_tokens: int,
    per_token: cost_model.Phases,
    serial: tuple[float, float],
    dp_bytes: cost_model.Phases,
    dp_bw: float,
    hardware: Hardware,
) -> float:
    """Seconds per step: compute plus serial collectives, stretched by the bubble, and dp's."""
    fwd_c = m * (local_tokens * per_token.forward / hardware.peak_flops + serial[0])
    bwd_c = m * (local_tokens * per_token.backward / hardware.peak_flops + serial[1])
    bubble = (m + pp - 1) / m
    dp_time = cost_model.Phases(dp_bytes.forward / dp_bw, dp_bytes.backward / dp_bw)
    step = cost_model.StepCost(cost_model.Phases(fwd_c * bubble, bwd_c * bubble), dp_time)
    return float(step.step_s)


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
    remat: str = "none",
    flash_attention: bool = True,
) -> Plan:
    """Plan ``model`` on ``hardware``; see the module docstring for the model of each number.

    ``grad_accum`` defaults to 1, or ``4 x pp`` with a pipeline (so the bubble,
    ``(pp-1)/(grad_accum+pp-1)``, stays small).

    Raises:
      PlanError: a configuration that cannot run (degrees whose product is not ``gpus``, a
        dimension a degree does not divide, an unknown model or hardware, ...); the message
        is one line naming the setting.
    """
    model, hardware = _resolve(model, hardware)
    degrees = {"pp": pp, "dp": dp, "ep": ep, "cp": cp, "tp": tp}
    n_dev = _check_degrees(degrees, gpus)
    _check_choices(zero, precision, remat)
    _positive("--micro-batch", micro_batch)
    _positive("--seq", seq)
    m = _positive("--grad-accum", grad_accum if grad_accum is not None else 4 * pp if pp > 1 else 1)
    _check_shapes(model, degrees, seq)

    mixed = precision == "mixed"
    w_b, g_b, opt_b = (2, 2, 12) if mixed else (4, 4, 8)
    act_b = 2 if mixed else 4
    notes: list[str] = []

    local = _local_params(model, degrees)
    per_device = _state_bytes(local, dp, zero, w_b, g_b, opt_b)
    tokens = micro_batch * seq  # per data-parallel rank per micro-batch
    local_tokens = tokens // cp
    act = 0.0
    if model.params_only:
        notes.append("--params: model states only; no activations, no tensor/pipeline axes.")
    else:
        act = _activation_bytes(model, local_tokens, seq // cp, micro_batch, tp, ep, act_b,
                                remat, flash_attention, pp, m)  # fmt: skip
        notes.append(_activation_note(flash_attention, pp))
    total = per_device["params"] + per_device["grads"] + per_device["optimizer"] + act
    per_device["activations"] = act
    per_device["total"] = total
    flops, model_flops = _step_flops(model, degrees, tokens, seq)
    per_token = cost_model.flops_per_token(_Flops(1, local_tokens, flops), remat=remat == "full")

    # Communication per axis, per micro-batch (tp, cp, ep, pp) or per step (dp).
    comm: dict[str, float] = {}
    bw = _axis_bandwidths(degrees, hardware)
    dp_bytes = _dp_phases(local, dp, zero, g_b, m)
    fwd_serial = bwd_serial = 0.0
    if not model.params_only:
        fwd_serial, bwd_serial = _model_parallel_comm(
            model, degrees, local_tokens, act_b, remat, m, bw, comm
        )
    if dp > 1:
        comm["dp"] = float(dp_bytes.total)

    step_s = _step_seconds(
        m, pp, local_tokens, per_token, (fwd_serial, bwd_serial), dp_bytes, bw["dp"], hardware
    )
    total_tokens = tokens * dp * ep * m
    flops_step = model_flops * dp * ep * m
    mfu = flops_step / (step_s * n_dev * hardware.peak_flops)
    if pp > 1:
        notes.append(f"pipeline bubble (pp-1)/(grad_accum+pp-1) = {(pp - 1) / (m + pp - 1):.3f}")
    notes.append("tp and ep collectives wait on the critical path; dp's overlap within a phase")
    return Plan(
        model=model.name, hardware=hardware.name, n_params=model.param_count(),
        active_params=model.active_params(), degrees=degrees, zero=zero, precision=precision,
        micro_batch=micro_batch, seq=seq, grad_accum=m, remat=remat,
        per_device_bytes=per_device, hbm_bytes=hardware.hbm_bytes,
        fits=total <= hardware.hbm_bytes, comm_bytes_per_step=comm, step_time_s=step_s,
        mfu=mfu, tokens_per_step=total_tokens, notes=notes,
    )  # fmt: skip


def activation_terms(
    model: ModelSpec, tp: int = 1, flash_attention: bool = True
) -> dict[str, float]:
    """Elements stored per token per layer for the backward pass, tensor by tensor.

    Korthikanti et al. 2022 count a GPT block; this is the same count for a LLaMA block:
    each norm's input (replicated over tp), the normed input the projections read, q, k, v
    and the attention output (split by tp), the MLP's gate, up and gated product (split by
    tp), and the router's logits. Without fused attention, the softmax output (heads x
    seq per token, split by tp) is added by the caller.
    """
    kv = model.n_kv_heads * model.head_dim
    q = model.n_heads * model.head_dim
    routed = model.top_k if model.n_experts > 1 else 1
    return {
        "norm inputs (2 x hidden)": 2.0 * model.hidden,
        "normed inputs (2 x hidden)": 2.0 * model.hidden,
        "q, attention output": 2.0 * q / tp,
        "k, v": 2.0 * kv / tp,
        "MLP hidden (gate, up, gated; or pre- and post-GELU)": model.mlp_matrices
        * model.ffn
        * routed
        / tp,
        "router logits": float(model.n_experts if model.n_experts > 1 else 0),
    }


def _activation_bytes(
    model: ModelSpec, tokens: int, seq: int, batch: int, tp: int, ep: int, act_b: int,
    remat: str, flash: bool, pp: int, m: int,
) -> float:  # fmt: skip
    """Activations on the fullest device (the first pipeline stage), in bytes."""
    del ep  # the tokens each device's experts receive balance out to top_k x tokens
    per_tok = sum(activation_terms(model, tp, flash).values())
    layer = tokens * per_tok * act_b
    if not flash:
        layer += batch * model.n_heads / tp * seq * seq * act_b
    layers = model.n_layers // pp
    in_flight = min(pp, m)
    if remat == "full":
        stored = layers * tokens * model.hidden * act_b * in_flight + layer
    else:
        stored = layers * layer * in_flight
    logits = tokens * model.vocab / tp * 4  # f32 logits and their gradient, last stage
    return stored + (2 * logits if pp == 1 else 0)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


class _OneLineParser(OneLineParser):
    """The planner's ``OneLineParser`` (``helpers.cli``): every refusal is one line, exit 2."""


def _count(text: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {text!r}")
    return int(value)


def _parser() -> _OneLineParser:
    keys = "\n".join(f"  {k:<20} {v}" for k, v in JSON_KEYS.items())
    p = _OneLineParser(
        prog="python -m helpers.plan",
        description="Plan a decoder-only Transformer's training: memory per device, traffic "
        "per axis, step time and MFU. A configuration that cannot run prints one line and "
        "exits with code 2.",
        epilog=f"Keys of --json:\n{keys}\n\nNamed models: {', '.join(NAMED_MODELS)}.\n"
        "Hardware: " + "; ".join(f"{k}: {h.source}" for k, h in HARDWARE.items()) + ".",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--config", help="a named model, or a Hugging Face config.json file")
    what.add_argument("--params", type=_count, help="a parameter count (model states only)")
    p.add_argument("--hardware", default="h100", help=f"one of {', '.join(HARDWARE)}")
    p.add_argument("--gpus", type=_count, help="device count (default: product of the degrees)")
    for axis, text in [("dp", "data"), ("tp", "tensor"), ("pp", "pipeline"),
                       ("cp", "context"), ("ep", "expert")]:  # fmt: skip
        p.add_argument(f"--{axis}", type=_count, default=1, help=f"{text}-parallel degree")
    p.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=0, help="ZeRO stage over dp")
    p.add_argument("--precision", choices=("mixed", "f32"), default="mixed")
    p.add_argument("--micro-batch", type=_count, default=1, help="sequences per dp rank")
    p.add_argument("--seq", type=_count, default=4096, help="tokens per sequence")
    p.add_argument("--grad-accum", type=_count, help="micro-batches per step")
    p.add_argument("--remat", choices=("none", "full"), default="none")
    p.add_argument("--no-flash", action="store_true", help="store the attention score matrix")
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


def _gb(n: float) -> str:
    return f"{n / 1e9:9.2f} GB"


def format_plan(p: Plan) -> str:
    """The plan as a short table (GB = 10^9 bytes)."""
    deg = ", ".join(f"{a} {d}" for a, d in p.degrees.items() if d > 1) or "1 device"
    rows = [
        f"{p.model} on {math.prod(p.degrees.values())} x {p.hardware} ({deg}; ZeRO-{p.zero}, "
        f"{p.precision}, micro-batch {p.micro_batch} x {p.seq}, remat {p.remat})",
        f"parameters        {p.n_params / 1e9:9.2f} B (active per token {p.active_params / 1e9:.2f} B)",
    ]
    for key in ("params", "grads", "optimizer", "activations", "total"):
        rows.append(f"{key:<17} {_gb(p.per_device_bytes[key])}  per device")
    verdict = "fits" if p.fits else "does NOT fit"
    rows.append(f"HBM               {_gb(p.hbm_bytes)}  -> {verdict}")
    for axis, sent in p.comm_bytes_per_step.items():
        rows.append(f"sent over {axis:<7} {_gb(sent)}  per device per step")
    rows.append(
        f"step time         {p.step_time_s:9.3f} s   MFU at most {p.mfu:.1%} "
        "(an upper bound: every matmul at peak)"
    )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit code (2 for a configuration that cannot run)."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        model = (
            _load_model(args.config)
            if args.config
            else ModelSpec(
                f"{args.params:.3g} parameters", 0, 0, 0, 0, 0, 0, params_only=args.params
            )
        )
        result = plan_model(
            model, args.hardware, gpus=args.gpus, dp=args.dp, zero=args.zero, tp=args.tp,
            pp=args.pp, cp=args.cp, ep=args.ep, precision=args.precision,
            micro_batch=args.micro_batch, seq=args.seq, grad_accum=args.grad_accum,
            remat=args.remat, flash_attention=not args.no_flash,
        )  # fmt: skip
    except (PlanError, ValueError) as err:
        parser.error(" ".join(str(err).split()))
    if args.json == "-":
        json.dump(result.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(format_plan(result))
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(result.to_json(), indent=2) + "\n")
        except OSError as err:
            parser.error(f"--json: cannot write {args.json}: {err.strerror or err}")
    return 0


__all__ = [
    "HARDWARE", "JSON_KEYS", "NAMED_MODELS", "PUBLISHED_PARAMS", "Hardware", "ModelSpec",
    "Plan", "PlanError", "activation_terms", "format_plan", "main", "model_from_hf_config",
    "plan_model",
    "spec_of_series_model",
]  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
