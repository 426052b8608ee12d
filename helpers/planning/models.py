"""The models the planner knows: their shapes, parameter counts and FLOPs, and how to read a
Hugging Face ``config.json`` of each family.

A ``ModelSpec`` is a decoder-only Transformer: LLaMA-style (SwiGLU MLP with three matrices,
RMSNorm, rotary positions, no biases) or GPT-style (a two-matrix GELU MLP, LayerNorm with
a bias, biases on every linear layer, learned positions), dense or a mixture of experts
(routed experts, optional shared experts, dense layers among the expert ones), with
grouped-query, multi-query or multi-head latent attention (DeepSeek-V2's MLA).

``model_from_hf_config`` reads the families below. Each family's key names are those of
its configuration class in Hugging Face transformers (``src/transformers/models/<family>/
configuration_<family>.py``; read at huggingface/transformers commit 01ae98ae for GPT-2 and
5fd8edad for Falcon), and of DeepSeek's own ``configuration_deepseek.py`` (shipped with
deepseek-ai/deepseek-moe-16b-base) for ``model_type`` "deepseek":

================  ==========================================================================
model_type        what the planner reads (and the family's defaults)
================  ==========================================================================
llama, mistral    hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
                  intermediate_size, vocab_size, head_dim, tie_word_embeddings (False)
qwen2             as llama, plus biases on q, k and v
gemma             as llama; GeGLU (three matrices), head_dim, tie_word_embeddings (True)
mixtral           as llama, plus num_local_experts, num_experts_per_tok
qwen3             as llama, plus RMSNorms on each head's q and k
qwen2_moe         as qwen2, plus num_experts, num_experts_per_tok, moe_intermediate_size,
                  shared_expert_intermediate_size (with its sigmoid gate),
                  decoder_sparse_step, mlp_only_layers
qwen3_moe         as qwen3, with qwen2_moe's expert keys (no shared expert)
deepseek          as llama, plus n_routed_experts, num_experts_per_tok, n_shared_experts,
                  moe_intermediate_size, first_k_dense_replace, moe_layer_freq
deepseek_v2, _v3  as deepseek, plus MLA: q_lora_rank, kv_lora_rank, qk_nope_head_dim,
                  qk_rope_head_dim, v_head_dim
gpt2              n_embd, n_layer, n_head, n_inner (4 x n_embd), vocab_size, n_positions
                  (learned), resid_pdrop / attn_pdrop; LayerNorm, biases, tied (True)
gpt_neox          hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
                  vocab_size, hidden_dropout / attention_dropout; LayerNorm, biases
                  (attention_bias True), untied (tie_word_embeddings False)
bloom             hidden_size (or n_embed), n_layer, n_head, vocab_size; MLP 4 x hidden,
                  ALiBi, an extra LayerNorm after the embedding, biases, tied
mpt               d_model, n_heads, n_layers, expansion_ratio, vocab_size, no_bias (True);
                  ALiBi, LayerNorm without bias when no_bias, tied
opt               hidden_size, num_hidden_layers, num_attention_heads, ffn_dim, vocab_size,
                  max_position_embeddings (learned, 2 rows of offset), word_embed_proj_dim,
                  enable_bias (True), dropout; LayerNorm, ReLU MLP, tied
falcon            hidden_size (or n_embed), num_hidden_layers (n_layer), num_attention_heads
                  (n_head), num_kv_heads / multi_query / new_decoder_architecture,
                  ffn_hidden_size (4 x hidden), bias (False), parallel_attn; tied
================  ==========================================================================

An unknown ``model_type`` with LLaMA's keys is read as LLaMA (the plan says so); anything
else is refused, naming the key it lacks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelSpec:
    """The shapes of a decoder-only Transformer.

    ``n_experts == 1`` is a dense model. ``head_dim`` defaults to ``hidden // n_heads``.
    ``mlp_matrices`` is 3 for a gated MLP (SwiGLU, GeGLU), 2 for a plain one (GELU, ReLU);
    ``norm_vectors`` is 1 for RMSNorm (or a LayerNorm without bias), 2 for LayerNorm.
    ``params_only`` marks a model known only by its parameter count (``--params``): its
    layers are unknown, so only model states and data parallelism can be planned.

    Mixture of experts: ``n_experts`` routed experts of width ``expert_ffn`` (default
    ``ffn``), ``top_k`` of them per token; ``shared_ffn`` is the total width of the shared
    experts every token goes through (0: none), ``shared_gate`` Qwen2-MoE's gate on them;
    ``dense_layers`` of the ``n_layers`` keep a dense MLP of width ``ffn``.
    ``vocab_multiple`` pads the vocabulary to a multiple of it times ``tp`` (0: the plan's
    setting, Megatron-LM's 128; 1: the vocabulary is padded already, as the series' is).
    ``mla`` is DeepSeek-V2's multi-head latent attention: ``(q_lora_rank, kv_lora_rank,
    qk_nope_head_dim, qk_rope_head_dim, v_head_dim)``, ``q_lora_rank`` 0 for none.
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
    family: str = "llama"
    bias: bool = False
    qkv_bias: bool = False
    positions: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0
    shared_gate: bool = False
    dense_layers: int = 0
    norms_per_layer: int = 2
    dropout: bool = False
    embed_norm: bool = False
    embed_proj: int = 0
    qk_norm: bool = False
    final_norm: bool = True
    vocab_multiple: int = 0
    mla: tuple[int, int, int, int, int] | None = None

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
        if not 0 <= self.dense_layers <= self.n_layers:
            raise ValueError(
                f"ModelSpec: dense_layers={self.dense_layers} is not in [0, n_layers]."
            )
        if not self.head_dim:
            if self.hidden % self.n_heads:
                raise ValueError(
                    f"ModelSpec: n_heads={self.n_heads} must divide hidden={self.hidden} "
                    "(or give head_dim)."
                )
            object.__setattr__(self, "head_dim", self.hidden // self.n_heads)
        if not self.expert_ffn:
            object.__setattr__(self, "expert_ffn", self.ffn)

    # Shapes -----------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.n_experts > 1

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts."""
        return self.n_layers - self.dense_layers if self.is_moe else 0

    def qk_dim(self) -> int:
        """Width of one head's query and key (MLA: its no-rotary and rotary parts)."""
        return self.mla[2] + self.mla[3] if self.mla else self.head_dim

    def v_dim(self) -> int:
        """Width of one head's value."""
        return self.mla[4] if self.mla else self.head_dim

    # Parameters, in pieces -------------------------------------------------
    def attn_params(self) -> int:
        """Per layer: the query, key, value and output projections (and their biases)."""
        h, heads = self.hidden, self.n_heads
        if self.mla:
            q_rank, kv_rank, _, rope, v_dim = self.mla
            qk = self.qk_dim()
            q = h * q_rank + q_rank + q_rank * heads * qk if q_rank else h * heads * qk
            kv = h * (kv_rank + rope) + kv_rank + kv_rank * heads * (qk - rope + v_dim)
            return q + kv + heads * v_dim * h
        q = h * heads * self.head_dim
        kv = 2 * h * self.n_kv_heads * self.head_dim
        biases = 0
        if self.bias or self.qkv_bias:
            biases = (heads + 2 * self.n_kv_heads) * self.head_dim
        if self.bias:
            biases += h
        return 2 * q + kv + biases

    def mlp_params(self, width: int) -> int:
        """One MLP of inner width ``width``: ``mlp_matrices`` matrices (and their biases)."""
        biases = (self.mlp_matrices - 1) * width + self.hidden if self.bias else 0
        return self.mlp_matrices * self.hidden * width + biases

    def expert_params(self) -> int:
        """Per expert layer, all routed experts' MLPs."""
        return self.n_experts * self.mlp_params(self.expert_ffn) if self.is_moe else 0

    def shared_params(self) -> int:
        """Per expert layer, the shared experts (and Qwen2-MoE's gate on them)."""
        if not self.shared_ffn:
            return 0
        return self.mlp_params(self.shared_ffn) + (self.hidden if self.shared_gate else 0)

    def router_params(self) -> int:
        return self.hidden * self.n_experts if self.is_moe else 0

    def norm_params(self) -> int:
        """Per layer: the norms' scales (and biases)."""
        qk = 2 * self.head_dim if self.qk_norm else 0
        return self.norms_per_layer * self.norm_vectors * self.hidden + qk

    def layer_params(self, moe: bool | None = None) -> int:
        """One decoder layer (an expert layer if ``moe``; default: the model's kind)."""
        moe = self.is_moe if moe is None else moe
        mlp = self.expert_params() + self.shared_params() + self.router_params()
        return self.attn_params() + self.norm_params() + (mlp if moe else self.mlp_params(self.ffn))

    def embed_params(self) -> int:
        """Input embedding (and learned positions, OPT's projections, BLOOM's embedding norm),
        plus the output head unless tied, plus the final norm."""
        width = self.embed_proj or self.hidden
        table = self.vocab * width
        extra = self.positions * self.hidden + (2 * width * self.hidden if self.embed_proj else 0)
        extra += self.norm_vectors * self.hidden * (int(self.embed_norm) + int(self.final_norm))
        return table * (1 if self.tied else 2) + extra

    def param_count(self) -> int:
        """All parameters (for a ``--params`` model, that count)."""
        if self.params_only:
            return self.params_only
        dense = self.n_layers - self.moe_layers
        layers = dense * self.layer_params(False) + self.moe_layers * self.layer_params(True)
        return layers + self.embed_params()

    def active_params(self) -> int:
        """Parameters one token goes through: ``top_k`` of the experts (all, when dense)."""
        if self.params_only:
            return self.params_only
        idle = (self.n_experts - self.top_k) * self.mlp_params(self.expert_ffn)
        return self.param_count() - self.moe_layers * idle

    # FLOPs -------------------------------------------------------------------
    def layer_matmul_params(self, moe: bool) -> int:
        """Per layer, the parameters that multiply each token's activations (biases, norms
        and the idle experts left out; the router is a matmul too)."""
        attn = self.attn_params()
        if self.bias or self.qkv_bias:
            attn -= (self.n_heads + 2 * self.n_kv_heads) * self.head_dim + (
                self.hidden if self.bias else 0
            )
        if not moe:
            return attn + self.mlp_matrices * self.hidden * self.ffn
        routed = self.top_k * self.mlp_matrices * self.hidden * self.expert_ffn
        shared = self.mlp_matrices * self.hidden * self.shared_ffn
        return attn + routed + shared + self.router_params()

    def matmul_params(self) -> int:
        """Every layer's matmul parameters and the output head (the embedding is a lookup)."""
        if self.params_only:
            return self.params_only
        dense = self.n_layers - self.moe_layers
        layers = dense * self.layer_matmul_params(False)
        layers += self.moe_layers * self.layer_matmul_params(True)
        return layers + self.vocab * (self.embed_proj or self.hidden)

    def attention_flops_per_token(self, seq: int, causal: bool = False) -> float:
        """Training FLOPs of attention's two matmuls per token, over all layers, counted over
        the whole score matrix as PaLM does (Chowdhery et al. 2022, arXiv:2204.02311,
        Appendix B: ``12 L H Q T``; here ``6 L H (Q_qk + Q_v) T``), or over its causal half
        (``causal``: what NeMo's and some other MFU counts use)."""
        if self.params_only:
            return 0.0
        full = 6.0 * self.n_layers * self.n_heads * (self.qk_dim() + self.v_dim()) * seq
        return full / 2 if causal else full

    def model_flops_per_token(self, seq: int, causal: bool = False) -> float:
        """PaLM's model FLOPs per token: 6 per matmul parameter plus attention's."""
        return 6.0 * self.matmul_params() + self.attention_flops_per_token(seq, causal)


def spec_of_series_model(cfg: Any, name: str = "series Transformer") -> ModelSpec:
    """The ``ModelSpec`` of a ``helpers.placing.models.TransformerConfig``: multi-head attention
    (as many key/value heads as heads), a two-matrix GELU MLP, LayerNorms (scale and
    bias), an untied output head over the padded vocabulary, no biases on the kernels."""
    return ModelSpec(
        name, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_heads, cfg.d_ff, cfg.padded_vocab,
        head_dim=cfg.head_dim, mlp_matrices=2, norm_vectors=2, family="series", vocab_multiple=1,
    )  # fmt: skip


# Published shapes (each model's Hugging Face config.json) and published totals.
NAMED_MODELS: dict[str, ModelSpec] = {
    # meta-llama/Meta-Llama-3-8B config.json; Llama 3 paper (arXiv:2407.21783), Table 3.
    "llama3-8b": ModelSpec("llama3-8b", 4096, 32, 32, 8, 14336, 128256),
    # meta-llama/Meta-Llama-3-70B config.json; same table.
    "llama3-70b": ModelSpec("llama3-70b", 8192, 80, 64, 8, 28672, 128256),
    # meta-llama/Llama-3.1-405B config.json; same table: 126 layers, 16,384 wide.
    "llama3-405b": ModelSpec("llama3-405b", 16384, 126, 128, 8, 53248, 128256),
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
    "llama3-405b": (405e9, "Llama 3 paper (arXiv:2407.21783), Table 3: the 405B model"),
    "mixtral-8x7b": (
        46.7e9,
        "mistral.ai/news/mixtral-of-experts: '46.7B total parameters but only uses 12.9B "
        "parameters per token'",
    ),
}


# ---------------------------------------------------------------------------
# Hugging Face config.json
# ---------------------------------------------------------------------------

LLAMA_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
)
HF_KEYS = LLAMA_KEYS  # the keys a LLaMA-style config.json must have

#: model_type -> {planner field: the config.json key, or a tuple of aliases tried in order}
FAMILY_KEYS: dict[str, dict[str, Any]] = {
    "llama": {"hidden": "hidden_size", "n_layers": "num_hidden_layers",
              "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads",
              "ffn": "intermediate_size", "vocab": "vocab_size"},
    "gpt2": {"hidden": ("n_embd", "hidden_size"), "n_layers": ("n_layer", "num_hidden_layers"),
             "n_heads": ("n_head", "num_attention_heads"), "vocab": "vocab_size"},
    "gpt_neox": {"hidden": "hidden_size", "n_layers": "num_hidden_layers",
                 "n_heads": "num_attention_heads", "ffn": "intermediate_size",
                 "vocab": "vocab_size"},
    "bloom": {"hidden": ("hidden_size", "n_embed"), "n_layers": ("n_layer", "num_hidden_layers"),
              "n_heads": ("n_head", "num_attention_heads"), "vocab": "vocab_size"},
    "mpt": {"hidden": ("d_model", "hidden_size"), "n_layers": ("n_layers", "num_hidden_layers"),
            "n_heads": ("n_heads", "num_attention_heads"), "vocab": "vocab_size"},
    "opt": {"hidden": "hidden_size", "n_layers": "num_hidden_layers",
            "n_heads": "num_attention_heads", "ffn": "ffn_dim", "vocab": "vocab_size"},
    "falcon": {"hidden": ("hidden_size", "n_embed"), "n_layers": ("num_hidden_layers", "n_layer"),
               "n_heads": ("num_attention_heads", "n_head"), "vocab": "vocab_size"},
}  # fmt: skip
LLAMA_LIKE = {
    "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "mixtral", "qwen2_moe",
    "qwen3_moe", "deepseek", "deepseek_v2", "deepseek_v3",
}  # fmt: skip
FAMILIES = tuple(sorted(LLAMA_LIKE | set(FAMILY_KEYS)))


def _get(config: Mapping[str, Any], key: Any, name: str, family: str) -> Any:
    keys = key if isinstance(key, tuple) else (key,)
    for k in keys:
        if config.get(k) is not None:
            return config[k]
    raise ValueError(f"{name}: missing key '{keys[0]}' (a {family} config.json has it).")


def _whole(name: str, key: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: key '{key}' must be a positive integer, got {value!r}.")
    return value


def _dropout(config: Mapping[str, Any], *keys: str) -> bool:
    return any(float(config.get(k) or 0.0) > 0 for k in keys)


def _core(config: Mapping[str, Any], family: str, name: str) -> dict[str, int]:
    """The family's required shapes, as planner fields."""
    keys = FAMILY_KEYS["llama" if family in LLAMA_LIKE else family]
    out = {}
    for field, key in keys.items():
        label = key if isinstance(key, str) else key[0]
        out[field] = _whole(name, label, _get(config, key, name, family))
    return out


def _llama_like(config: Mapping[str, Any], family: str, name: str) -> dict[str, Any]:
    core = _core(config, family, name)
    head_dim = config.get("head_dim") or 0
    if head_dim:
        _whole(name, "head_dim", head_dim)
    out: dict[str, Any] = {**core, "head_dim": head_dim, "family": family}
    out["tied"] = bool(config.get("tie_word_embeddings", family.startswith("gemma")))
    out["qkv_bias"] = family in ("qwen2", "qwen2_moe") or bool(config.get("attention_bias"))
    out["dropout"] = _dropout(config, "attention_dropout")
    out["qk_norm"] = family in ("qwen3", "qwen3_moe")
    out.update(_experts(config, family, name))
    if family in ("deepseek_v2", "deepseek_v3"):
        out.update(_mla(config, name))
    return out


def _experts(config: Mapping[str, Any], family: str, name: str) -> dict[str, Any]:
    """Routed experts, shared experts and dense layers, as each MoE family names them."""
    routed = config.get("num_local_experts") or config.get("num_experts")
    routed = routed or config.get("n_routed_experts") or 1
    _whole(name, "num_local_experts", routed)
    if routed == 1:
        return {}
    top_k = config.get("num_experts_per_tok")
    if top_k is None:
        raise ValueError(f"{name}: missing key 'num_experts_per_tok' (it has {routed} experts).")
    out: dict[str, Any] = {"n_experts": routed, "top_k": _whole(name, "num_experts_per_tok", top_k)}
    width = config.get("moe_intermediate_size")
    if width:
        out["expert_ffn"] = _whole(name, "moe_intermediate_size", width)
    layers = _whole(name, "num_hidden_layers", config["num_hidden_layers"])
    if family in ("qwen2_moe", "qwen3_moe"):
        shared = config.get("shared_expert_intermediate_size") or 0
        out.update(shared_ffn=shared, shared_gate=bool(shared))
        step = config.get("decoder_sparse_step") or 1
        only = set(config.get("mlp_only_layers") or ())
        out["dense_layers"] = sum(1 for i in range(layers) if i in only or (i + 1) % step)
    elif family.startswith("deepseek"):
        shared = (config.get("n_shared_experts") or 0) * (width or config["intermediate_size"])
        freq = config.get("moe_layer_freq") or 1
        first = config.get("first_k_dense_replace") or 0
        out["shared_ffn"] = shared
        out["dense_layers"] = sum(1 for i in range(layers) if i < first or (i - first) % freq)
    return out


def _mla(config: Mapping[str, Any], name: str) -> dict[str, Any]:
    keys = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    values = []
    for key in keys:
        value = config.get(key)
        if value is None and key != "q_lora_rank":
            raise ValueError(f"{name}: missing key '{key}' (a DeepSeek-V2 config.json has it).")
        values.append(_whole(name, key, value or 0, minimum=0))
    return {"mla": tuple(values), "n_kv_heads": config["num_attention_heads"]}


def _gpt_style(config: Mapping[str, Any], family: str, name: str) -> dict[str, Any]:
    """GPT-2, GPT-NeoX, BLOOM, MPT, OPT and Falcon: GELU (or ReLU) MLPs of two matrices,
    LayerNorm, multi-head attention (Falcon: multi-query or grouped)."""
    core = _core(config, family, name)
    h = core["hidden"]
    out: dict[str, Any] = {**core, "family": family, "mlp_matrices": 2, "norm_vectors": 2}
    out.setdefault("ffn", h * 4)
    out["n_kv_heads"] = core["n_heads"]
    out["tied"] = bool(config.get("tie_word_embeddings", family != "gpt_neox"))
    out["bias"] = True
    if family == "gpt2":
        out["ffn"] = config.get("n_inner") or 4 * h
        out["positions"] = config.get("n_positions") or config.get("max_position_embeddings", 0)
        out["dropout"] = _dropout(config, "resid_pdrop", "attn_pdrop")
    elif family == "gpt_neox":
        out["dropout"] = _dropout(config, "hidden_dropout", "attention_dropout")
    elif family == "bloom":
        out.update(embed_norm=True, dropout=_dropout(config, "hidden_dropout", "attention_dropout"))
    elif family == "mpt":
        no_bias = config.get("no_bias", True)
        out.update(bias=not no_bias, norm_vectors=1 if no_bias else 2)
        out["ffn"] = int(config.get("expansion_ratio", 4) * h)
    elif family == "opt":
        out["bias"] = bool(config.get("enable_bias", True))
        out["positions"] = (config.get("max_position_embeddings") or 2048) + 2
        proj = config.get("word_embed_proj_dim") or h
        out["embed_proj"] = proj if proj != h else 0
        out["dropout"] = _dropout(config, "dropout", "attention_dropout")
        out["final_norm"] = bool(config.get("do_layer_norm_before", True))
    elif family == "falcon":
        out.update(_falcon(config, core, name))
    return out


def _falcon(config: Mapping[str, Any], core: dict[str, int], name: str) -> dict[str, Any]:
    heads = core["n_heads"]
    if config.get("new_decoder_architecture"):
        kv = config.get("num_kv_heads") or heads
        norms = config.get("num_ln_in_parallel_attn") or 2
    else:
        kv = 1 if config.get("multi_query", True) else heads
        norms = 1 if config.get("parallel_attn", True) else 2
    return {
        "n_kv_heads": _whole(name, "num_kv_heads", kv),
        "norms_per_layer": norms,
        "bias": bool(config.get("bias", False)),
        "ffn": config.get("ffn_hidden_size") or 4 * core["hidden"],
        "dropout": _dropout(config, "hidden_dropout", "attention_dropout"),
    }


def model_from_hf_config(config: Mapping[str, Any], name: str = "config.json") -> ModelSpec:
    """A ``ModelSpec`` from a Hugging Face ``config.json`` of any family in the module's table.

    ``model_type`` picks the family (missing: LLaMA's keys are expected). An unknown
    ``model_type`` is read as LLaMA if it has LLaMA's keys.

    Raises:
      ValueError: a key it needs is missing (the message names it), or is not a positive
        integer.
    """
    if not isinstance(config, Mapping):
        raise ValueError(f"{name}: expected a JSON object, got {type(config).__name__}.")
    family = str(config.get("model_type") or "llama")
    if family not in FAMILY_KEYS and family not in LLAMA_LIKE:
        family = "llama"  # read as LLaMA; a missing key is named below
    values = (
        _llama_like(config, family, name)
        if family in LLAMA_LIKE
        else _gpt_style(config, family, name)
    )
    values["name"] = str(config.get("_name_or_path") or name)
    if family == "gemma" or family == "gemma2":
        values["mlp_matrices"] = 3
    try:
        return ModelSpec(**values)
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None


__all__ = [
    "FAMILIES", "FAMILY_KEYS", "HF_KEYS", "NAMED_MODELS", "PUBLISHED_PARAMS", "ModelSpec",
    "model_from_hf_config", "spec_of_series_model",
]  # fmt: skip
