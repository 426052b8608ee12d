"""Activation memory, the way Megatron counts it, tensor by tensor.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
arXiv:2205.05198, Section 4 and Table 2) count the bytes one GPT layer keeps for its
backward pass, for ``s`` tokens per sequence, ``b`` sequences, width ``h``, ``a`` heads
and ``t``-way tensor parallelism, 16-bit activations and 1-byte dropout masks:

==============================================  =====================
configuration                                   bytes per layer
==============================================  =====================
no parallelism                                  sbh (34 + 5as/h)
tensor parallel                                 sbh (10 + 24/t + 5as/(ht))
tensor + sequence parallel                      sbh (34/t + 5as/(ht))
tensor parallel + selective recompute           sbh (10 + 24/t)
tensor + sequence parallel + selective          sbh (34/t)
full recompute                                  sbh (2)
==============================================  =====================

Their Section 4.1 itemises it: attention keeps its input to the LayerNorm (2sbh), the
normed input the q, k, v projection reads (2sbh), q and k (4sbh), the softmax output
(2as^2b), its dropout mask (as^2b), the dropped-out probabilities (2as^2b), v (2sbh), the
output projection's input (2sbh) and a dropout mask (sbh); the MLP keeps its LayerNorm's
input (2sbh), the first matmul's input (2sbh), the GELU's input (8sbh), the second matmul's
input (8sbh) and a mask (sbh). Tensor parallelism splits all but the 10sbh of the norms,
the normed inputs and the masks; sequence parallelism (Megatron's, along the sequence
inside the norm and dropout regions) splits those too. Selective recompute drops the
5as^2b of the score matrix and recomputes it; full recompute keeps each layer's input only.

``activation_terms`` generalises that list to any ``ModelSpec``: grouped-query attention
(fewer k and v heads), gated MLPs (three ``ffn``-wide tensors), no dropout (no masks), one
shared norm (Falcon's parallel attention), mixtures of experts (each token's ``top_k``
expert inputs and hidden tensors, the router's f32 logits), and **fused (flash) attention**
(Dao et al. 2022, arXiv:2205.14135): no score matrix at all, only the softmax's f32
log-sum-exp per head and token, since the backward pass recomputes the scores block by
block. ``korthikanti_table`` is the closed form above; the tests hold the two equal.

**Recompute schedules** (``REMATS``):

- ``"none"``: every tensor above is kept.
- ``"selective"`` is **Megatron-LM's** (Korthikanti et al., Section 5; ``--recompute-granularity
  selective``): only attention's core, QK^T, softmax, dropout and the product with V, is
  recomputed, so only the score matrix is dropped. With fused attention there is no score
  matrix to drop, and it keeps what ``"none"`` keeps.
- ``"op"`` is **torchtitan's** per-op selective activation checkpointing
  (``mode = "selective"``, ``selective_ac_option = "op"``: ``_save_list`` and its policy in
  ``torchtitan/parallelisms/parallelize_llama.py`` at pytorch/torchtitan@9dec370, the commit of
  its Llama 3.1 benchmarks, and ``SelectiveAC`` in
  ``torchtitan/distributed/activation_checkpoint.py`` at pytorch/torchtitan@b5bcd76): each block
  is wrapped in a checkpoint whose policy saves the outputs of the matmuls, of fused attention
  and of reduce-scatters (and of ``abs`` and ``max``, "for low precision training"), "except
  every second mm", and recomputes everything else in the backward pass. A Llama block's
  matmuls run q, k, v, out, gate, up, down, so it keeps the layer's input, q, v, the
  attention's output and log-sum-exp, the gate's output and the down projection's output (a
  two-matrix MLP: its up projection's); k, the out projection, the up
  projection, the norms, rotary embeddings and the activation function are recomputed
  (``op_terms``). With tensor and sequence parallelism it also keeps the two reduce-scatters'
  outputs. Mixture-of-experts layers keep every grouped expert matmul's output (the current
  policy saves every compute-intensive op but mm, which it counts) and recompute the router.
  Its counting follows torchtitan's Llama block (separate q, k and v projections); other
  blocks are counted as if they were laid out so.
- ``"full"``: each layer keeps its input only and recomputes the rest.

``"op"`` and ``"full"`` recompute a whole layer in the backward pass, which holds that
layer's activations meanwhile (``helpers.planning.estimate`` adds one layer's ``"none"``).
"""

from __future__ import annotations

from helpers.planning.models import ModelSpec

REMATS = ("none", "selective", "op", "full")

#: Whose schedule each name is (the CLI's help and ``JSON_KEYS`` quote it).
REMAT_ORIGINS: dict[str, str] = {
    "none": "every activation kept",
    "selective": "Megatron-LM's (Korthikanti et al. 2022): attention's scores recomputed",
    "op": "torchtitan's per-op policy: matmul outputs kept but every second one's, the rest "
    "recomputed",
    "full": "each layer's input kept, the rest recomputed",
}

KORTHIKANTI_ROWS = (
    "no parallelism",
    "tensor parallel",
    "tensor + sequence parallel",
    "tensor parallel + selective recompute",
    "tensor + sequence parallel + selective recompute",
    "full recompute",
)


def korthikanti_table(s: int, b: int, h: int, a: int, t: int) -> dict[str, float]:
    """Korthikanti et al.'s Table 2: bytes of activations per GPT layer, for each row."""
    sbh = s * b * h
    scores = 5 * a * s / h
    return {
        "no parallelism": sbh * (34 + scores),
        "tensor parallel": sbh * (10 + 24 / t + scores / t),
        "tensor + sequence parallel": sbh * (34 / t + scores / t),
        "tensor parallel + selective recompute": sbh * (10 + 24 / t),
        "tensor + sequence parallel + selective recompute": sbh * (34 / t),
        "full recompute": sbh * 2,
    }


def kv_heads_per_rank(model: ModelSpec, tp: int) -> float:
    """Key/value heads each tensor-parallel rank holds: ``n_kv_heads / tp``, or one
    replicated head when ``tp`` exceeds them (Megatron-LM replicates each KV head over
    ``tp / n_kv_heads`` ranks)."""
    return max(model.n_kv_heads / tp, 1.0)


def _attention_terms(
    model: ModelSpec, tp: int, seq: int, flash: bool, sp: float, act: int, remat: str
) -> dict[str, float]:
    """Bytes per token the attention block keeps (``sp``: the divisor of the norm region)."""
    heads = model.n_heads / tp
    kv = kv_heads_per_rank(model, tp)
    terms = {
        "layer input (attention norm's input)": act * model.hidden / sp,
        "normed input read by q, k, v": act * model.hidden / sp,
        "q, k, v": act * (heads * model.qk_dim() + kv * (model.qk_dim() + model.v_dim())),
        "attention output (out-projection input)": act * heads * model.v_dim(),
    }
    if model.dropout:
        terms["attention dropout mask"] = model.hidden / sp
    if flash:
        terms["softmax log-sum-exp (flash, f32)"] = 4.0 * heads
    elif remat != "selective":
        per_score = act + (1 + act if model.dropout else 0)  # softmax out, mask, dropped out
        terms["scores: softmax (and dropout) over s keys"] = per_score * heads * seq
    return terms


def _mlp_terms(model: ModelSpec, tp: int, moe: bool, sp: float, act: int) -> dict[str, float]:
    """Bytes per token the MLP block (dense, or experts) keeps."""
    h = model.hidden
    terms = {"MLP norm input": act * h / sp} if model.norms_per_layer > 1 else {}
    terms["normed input read by the MLP"] = act * h / sp if model.norms_per_layer > 1 else 0.0
    if not moe:
        terms["MLP hidden (gate, up, product; or pre- and post-GELU)"] = (
            act * model.mlp_matrices * model.ffn / tp
        )
    else:
        k = model.top_k
        terms["router logits (f32)"] = 4.0 * model.n_experts / sp
        terms["expert inputs (top_k copies)"] = act * k * h
        terms["expert hidden (top_k)"] = act * k * model.mlp_matrices * model.expert_ffn / tp
        if model.shared_ffn:
            terms["shared expert hidden"] = act * model.mlp_matrices * model.shared_ffn / tp
    if model.dropout:
        terms["MLP dropout mask"] = h / sp
    return {k: v for k, v in terms.items() if v}


def op_terms(
    model: ModelSpec, tp: int, moe: bool, sp: float, act: int, *, seq: int = 0, flash: bool = True
) -> dict[str, float]:
    """Bytes per token one layer keeps under torchtitan's per-op policy (``remat="op"``; see
    the module docstring): the outputs of the odd-numbered matmuls of q, k, v, out, gate, up,
    down (q, k, v, out, up, down for a two-matrix MLP), fused attention's output, the
    reduce-scatters' outputs, and the layer's input. Unfused attention keeps its score matrix
    (the softmax's output) instead of the log-sum-exp."""
    heads = model.n_heads / tp
    h = model.hidden
    terms = {
        "layer input (attention norm's input)": act * h / sp,
        "q projection (1st matmul)": act * heads * model.qk_dim(),
        "v projection (3rd matmul)": act * kv_heads_per_rank(model, tp) * model.v_dim(),
        "attention output (out-projection input)": act * heads * model.v_dim(),
    }
    if flash:
        terms["softmax log-sum-exp (flash, f32)"] = 4.0 * heads
    else:
        terms["scores: softmax over s keys"] = act * heads * seq
    if tp > 1 and sp > 1:
        terms["reduce-scatter outputs (attention, MLP)"] = 2 * act * h / sp
    if not moe:
        if model.mlp_matrices == 3:
            terms["gate projection (5th matmul)"] = act * model.ffn / tp
            terms["down projection (7th matmul, before its reduction)"] = act * h
        else:
            terms["up projection (5th matmul)"] = act * model.ffn / tp
        return terms
    terms["expert matmul outputs (every one)"] = (
        act * model.top_k * ((model.mlp_matrices - 1) * model.expert_ffn / tp + h)
    )
    if model.shared_ffn:
        terms["shared expert: gate and down outputs"] = act * (model.shared_ffn / tp + h)
    return terms


def activation_terms(
    model: ModelSpec,
    tp: int = 1,
    flash_attention: bool = True,
    *,
    seq: int = 0,
    sequence_parallel: bool = False,
    remat: str = "none",
    act_bytes: int = 2,
    moe: bool | None = None,
) -> dict[str, float]:
    """Bytes one layer keeps per token (of this device's tokens) for the backward pass,
    tensor by tensor (see the module docstring). ``seq`` (tokens per sequence) is needed
    for the score matrix when ``flash_attention`` is off; ``moe`` picks an expert layer
    (default: the model's kind); ``act_bytes`` is 2 for bf16/fp16 activations, 4 for f32.

    Raises:
      ValueError: an unknown ``remat``, or no ``seq`` where the scores need it.
    """
    if remat not in REMATS:
        raise ValueError(f"--remat must be one of {REMATS}, got {remat!r}.")
    if not flash_attention and seq < 1:
        raise ValueError("activation_terms: seq (tokens per sequence) is needed without flash.")
    sp = tp if sequence_parallel else 1
    if remat == "full":
        return {"layer input (attention norm's input)": act_bytes * model.hidden / sp}
    moe = model.is_moe if moe is None else moe
    if remat == "op":
        return op_terms(model, tp, moe, sp, act_bytes, seq=seq, flash=flash_attention)
    terms = _attention_terms(model, tp, seq, flash_attention, sp, act_bytes, remat)
    terms.update(_mlp_terms(model, tp, moe, sp, act_bytes))
    return terms


def layer_activation_bytes(
    model: ModelSpec,
    *,
    seq: int,
    micro_batch: int = 1,
    tp: int = 1,
    cp: int = 1,
    sequence_parallel: bool = False,
    remat: str = "none",
    flash_attention: bool = True,
    act_bytes: int = 2,
    moe: bool | None = None,
) -> float:
    """Bytes one layer keeps for one micro-batch on one device: ``activation_terms`` times
    the device's tokens, ``micro_batch x seq / cp`` (context parallelism splits the
    sequence; each device's queries still see all ``seq`` keys)."""
    terms = activation_terms(
        model, tp, flash_attention, seq=seq, sequence_parallel=sequence_parallel, remat=remat,
        act_bytes=act_bytes, moe=moe,
    )  # fmt: skip
    return sum(terms.values()) * micro_batch * seq / cp


__all__ = [
    "KORTHIKANTI_ROWS", "REMATS", "REMAT_ORIGINS", "activation_terms", "korthikanti_table",
    "kv_heads_per_rank", "layer_activation_bytes", "op_terms",
]  # fmt: skip
