"""Published, measured training runs: the data the planner is checked against (issue 39).

Pure data, standard library only (no jax, numpy or other helpers modules), so that the planner
and its test can import it in a bare Python or in Pyodide. ``PUBLISHED_RUNS`` holds 25 runs from
four independent organisations (NVIDIA, Meta, MosaicML, BigScience): A100-80GB and H100, dense
and mixture-of-experts, TP, PP (interleaved too), CP, EP, ZeRO-1, FSDP and ZeRO-3, two
configurations that their source reports did not fit in memory, and one strong-scaling
series (``series``: the same model and global batch on 384, 768 and 1,536 GPUs, Narayanan et
al. 2021's Table 2). Each run's ``source`` says
where its numbers are; ``assumptions`` says every setting the source leaves out and what was
chosen; ``mfu_note`` says how ``achieved_mfu`` was obtained. For the memory verdict (issue 53),
``loss`` says how a run computes its loss over the vocabulary, ``precision`` "bf16 pure" marks
a run whose weights and Adam state are bf16 (NeMo Automodel's, read in its model code), and
``memory_edge`` quotes, with its link, a source that says a run was near its memory's limit
(Llama 3's three runs), ``memory_edge_own`` is True only where that source speaks of this
run's own configuration (Llama 3's two 8K runs): only such a run that trained may be called
"tight"; ``memory_edge_says`` is the part of it about that run's own configuration (for the
128K run, that the paper states no recompute setting). ``remat_stated`` is False where the
source states no recompute setting (the 128K run): the planner plans the chosen one for its
MFU, but gives no memory verdict ("not judged" in ``runs_table``).

How the numbers were checked:

- Papers (Narayanan et al. 2021, Korthikanti et al. 2022, the Llama 3 paper): read in full-text
  transcriptions of the papers (the arXiv PDFs were not opened here), and cross-checked against
  the authors' own copies where there is one: Narayanan's Table 1 against the table image the
  authors put in NVIDIA/Megatron-LM (``images/cases_april2021.png`` before commit 2e90a342) and
  against their reproduction scripts (``examples/sc21/`` at de7dc40f, which also give the
  micro-batch sizes, the virtual stages, ``--fp16`` and ``--checkpoint-activations``);
  Korthikanti's Table 5 against the MFU/HFU table of the Megatron-LM README at 2e90a342; the
  Llama 3 Table 4 in three transcriptions (one of which misprints a DP degree, see that run);
  Narayanan's Table 2 (the strong-scaling series) in two transcriptions, and against the
  table's own last column (days for 300B tokens, which Eq. 4 gives from its teraFLOP/s).
- Benchmark pages and logs: read in the repositories at the pinned commit named in ``source``
  (mosaicml/llm-foundry, NVIDIA-NeMo/Automodel, bigscience-workshop/bigscience), together with
  the configuration files that produced them at the same commit.
- Model shapes: the model's ``config.json`` on Hugging Face where the model was released (read
  in copies of it: the search index holds copies, not the original pages; the copies agree,
  except Llama 3.1 405B's ``num_key_value_heads``, 16 in early copies and 8 in later ones and in
  the paper's Table 3: 8 recorded), otherwise the paper's table or the benchmark's YAML. Each dict uses the key names of its
  family's ``config.json`` (``n_embd`` for GPT-2, ``d_model`` for MPT, ``n_layer`` for BLOOM,
  ``num_hidden_layers`` for LLaMA, ...).

Conversions: Narayanan et al. (2021) and BigScience count teraFLOP/s with full activation
recomputation (hardware FLOPs, Narayanan's Eq. 3: ``96*B*s*l*h^2*(1 + s/(6h) + V/(16lh))``);
model FLOPs are Korthikanti's Eq. 7, ``72*B*s*l*h^2*(1 + s/(6h) + V/(12lh))``, so MFU =
published TFLOP/s x (Eq. 7 / Eq. 3) / 312 (A100 dense BF16/FP16 peak, TFLOP/s). The ratio is
0.750-0.762 for these models, not exactly 3/4, because the logit layer is not recomputed. Other
sources publish MFU (Korthikanti, Llama 3, MosaicML) or model TFLOP/s that the source itself
divides by 989 (H100 SXM dense BF16 peak) for its MFU (NeMo Automodel).

``dp`` is the number of data-parallel replicas of the dense part, so ``gpus == tp*pp*cp*dp``;
expert parallelism (``ep``) is carved out of the ``dp*cp`` ranks in both MoE sources (Megatron's
and NeMo Automodel's convention) and does not multiply the GPU count. ``global_batch`` counts
sequences, ``dp * micro_batch * micro-batches``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MEGATRON21_TABLE2_SERIES", "PUBLISHED_RUNS", "PublishedRun"]


@dataclass(frozen=True)
class PublishedRun:
    """One published training configuration and what its source measured (see the module)."""

    key: str
    name: str
    source: str
    model: dict
    hardware: str
    gpus: int
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    virtual_stages: int = 1
    pp_layers: tuple = ()
    zero: int = 0
    sequence_parallel: bool = False
    micro_batch: int = 1
    global_batch: int = 1
    seq: int = 2048
    remat: str = "none"
    precision: str = "bf16 mixed"
    flash_attention: bool = True
    outcome: str = "trained"
    achieved_mfu: float | None = None
    achieved_tflops_per_gpu: float | None = None
    mfu_note: str = ""
    assumptions: str = ""
    independent_source: str = ""
    # Added by the planner (the schema lets it add fields with defaults): how the source's
    # MFU counts attention's FLOPs, "full" (PaLM's 12 L H Q T, the whole score matrix) or
    # "causal" (half of it, the causal mask's).
    attention_flops: str = "full"
    # Added for the memory verdict (issue 53): how the run computes its loss over the
    # vocabulary ("fused", "upcast", "plain"; helpers.planning.layout.LOSSES), and, where the
    # source says the run was near its memory's limit, that statement quoted with its place.
    # No run that trained may be called "tight" or "out of memory" without one
    # (tests/test_plan_margins.py).
    loss: str = "fused"
    memory_edge: str = ""
    # What the source says about this run's own memory, in one sentence: the words of
    # ``memory_edge`` that are about this configuration, quoted, or that it states nothing
    # for it (Llama 3's 128K run: the paper's sentence is about 8K tokens). Empty where
    # ``memory_edge`` is.
    memory_edge_says: str = ""
    # True only where ``memory_edge``'s source speaks of this run's own configuration (its
    # sequence length and layout), not of a sibling run's.
    memory_edge_own: bool = False
    # False where the source states no recompute setting: ``remat`` is then a choice, and the
    # planner gives no memory verdict for the run ("not judged", ``runs_table``).
    remat_stated: bool = True
    # How the run's framework issues its data-parallel collectives (the planner's
    # ``helpers.planning.layout.DP_ISSUES``: "layer", "bucket" of ``bucket_mib`` MiB,
    # "tensor", "whole"), where the source or its code says; "layer" otherwise.
    dp_issue: str = "layer"
    bucket_mib: float = 25.0
    # Runs of one published series share this tag (a strong-scaling series: the same model
    # and global batch on more GPUs).
    series: str = ""


# ---------------------------------------------------------------------------
# Model shapes
# ---------------------------------------------------------------------------


def _megatron_gpt(layers: int, hidden: int, heads: int) -> dict:
    """A GPT of Narayanan 2021 / Korthikanti 2022 in GPT-2's config.json keys: LayerNorm, learned
    positions, GELU MLP of 4h with two matrices, biases, input embedding tied to the logit layer;
    vocabulary 51,200 and sequence 2,048 for every model in both papers."""
    return {
        "model_type": "gpt2",
        "n_embd": hidden,
        "n_layer": layers,
        "n_head": heads,
        "n_inner": 4 * hidden,
        "n_positions": 2048,
        "vocab_size": 51200,
        "tie_word_embeddings": True,
    }


def _llama3_405b() -> dict:
    """Llama 3 405B: the paper's Table 3 (126 layers, 16,384, FFN 53,248, 128 heads, 8 KV heads,
    RoPE theta 500,000) and meta-llama/Llama-3.1-405B config.json for the rest."""
    return {
        "model_type": "llama",
        "hidden_size": 16384,
        "num_hidden_layers": 126,
        "num_attention_heads": 128,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 53248,
        "hidden_act": "silu",
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
    }


def _mpt(d_model: int, n_heads: int, n_layers: int) -> dict:
    """An MPT of llm-foundry's ``scripts/train/yamls/pretrain/mpt-*.yaml`` with MPTConfig's
    defaults (learned positions, biases, LayerNorm, tied embeddings, no ALiBi): the benchmark's
    NumParams column equals that architecture's count exactly (tests/test_runs_data.py)."""
    return {
        "model_type": "mpt",
        "d_model": d_model,
        "n_heads": n_heads,
        "n_layers": n_layers,
        "expansion_ratio": 4,
        "max_seq_len": 2048,
        "vocab_size": 50368,
        "learned_pos_emb": True,
        "no_bias": False,
        "norm_type": "low_precision_layernorm",
        "attn_config": {"attn_impl": "triton", "alibi": False},
        "tie_word_embeddings": True,
    }


def _bloom_176b() -> dict:
    """bigscience/bloom: 70 layers, 14,336, 112 heads, vocabulary 250,880 (the 250,680-token
    tokenizer padded for TP). Its config.json spells hidden and heads ``n_embed`` and
    ``num_attention_heads`` (older names that BloomConfig still reads); written here with
    BloomConfig's own names."""
    return {
        "model_type": "bloom",
        "hidden_size": 14336,
        "n_layer": 70,
        "n_head": 112,
        "vocab_size": 250880,
        "apply_residual_connection_post_layernorm": False,
        "pretraining_tp": 4,
        "tie_word_embeddings": True,
    }


def _qwen3_30b_a3b() -> dict:
    """Qwen/Qwen3-30B-A3B config.json: 48 layers, 128 experts of 768, 8 routed per token, no
    shared expert, every layer MoE (``decoder_sparse_step`` 1, no ``mlp_only_layers``)."""
    return {
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "hidden_act": "silu",
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
    }


def _deepseek_v3() -> dict:
    """deepseek-ai/DeepSeek-V3 config.json: multi-head latent attention, 61 layers of which the
    first 3 dense (FFN 18,432), 256 routed experts of 2,048 plus 1 shared, 8 routed per token,
    one multi-token-prediction layer (``num_nextn_predict_layers``)."""
    return {
        "model_type": "deepseek_v3",
        "hidden_size": 7168,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 3,
        "moe_layer_freq": 1,
        "num_nextn_predict_layers": 1,
        "hidden_act": "silu",
        "vocab_size": 129280,
        "max_position_embeddings": 163840,
        "tie_word_embeddings": False,
    }


# ---------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------

_NARAYANAN = "Narayanan et al. 2021, arXiv:2104.04473"
_SC21 = (
    "NVIDIA/Megatron-LM examples/sc21/run_table_1.sh and CONFIG.sh "
    "@ de7dc40f883ceed06344051c3c7ebd57da59cc53"
)
_KORTHIKANTI = "Korthikanti et al. 2022, arXiv:2205.05198"
_LLAMA3 = "Llama Team (Dubey et al.) 2024, arXiv:2407.21783, Section 3.3.2, Table 4"
_FOUNDRY = (
    "mosaicml/llm-foundry scripts/train/benchmarking/README.md "
    "@ 5e85bd62d4ec9e13353ca95877477602ab538e5b"
)
_AUTOMODEL = (
    "NVIDIA-NeMo/Automodel docs/performance-summary.md "
    "@ 8d9bfb90e3d8a45d45ab1a9f12ece42b9d1bb6a9 (pre-training, DGX-H100, BF16)"
)

_MEGATRON21_DDP = (
    "Data-parallel collectives: Megatron-LM's local DDP at de7dc40f (megatron/model/"
    "distributed.py, allreduce_gradients) all-reduces each dtype's whole gradient buffer once, "
    "after the backward pass (dp_issue 'whole'); with DDP=torch, PyTorch DDP's 25 MiB buckets."
)
_DEEPSPEED_Z3 = (
    "dp_issue 'tensor': one collective per parameter tensor, the granularity at which "
    "DeepSpeed's ZeRO-3 fetches a sub-module's parameters; assumed, not read in its 2021 code."
)
#: Narayanan et al. 2021, Table 2: the PTD-P rows of the 174.6B model at a fixed global batch
#: of 1536 on 384, 768 and 1536 GPUs (a strong-scaling series: the same model and batch on
#: more GPUs, each with fewer micro-batches), teraFLOP/s per GPU 153, 149, 141 (hardware
#: FLOPs, Eq. 3; the table's training times for 300B tokens, 84, 43 and 23 days, agree with
#: Eq. 4 at those rates).
#: The same table's ZeRO-3 rows at the same batch (144, 88, 44 teraFLOP/s: MFU 34.7, 21.2,
#: 10.6%) are not a series here: the planner, even charging NCCL's latency once per parameter
#: tensor, gives 62.5, 61.8 and 23.3%; what ZeRO-3 lost there at scale (DeepSpeed's overhead in
#: 2021, or cross-node gathers that did not hide as the planner assumes: not isolated) is not in
#: its model (the 384-GPU row is in, outside the 1.6x band: tests/test_plan_published_runs.py).
MEGATRON21_TABLE2_SERIES = "narayanan21-table2-ptdp-175b"
_PTDP_175B = ((384, 153.0, 0.3681), (768, 149.0, 0.3585), (1536, 141.0, 0.3392))

_A100 = "A100 dense FP16/BF16 peak 312 TFLOP/s"
_H100 = "H100 SXM dense BF16 peak 989 TFLOP/s"

_MEGATRON21_MFU = (
    "Table 1's teraFLOP/s per GPU count full recomputation (Eq. 3, hardware FLOPs); MFU = "
    "published x (Korthikanti Eq. 7 / Narayanan Eq. 3) / 312 ({ratio} for this shape); " + _A100
)
_MEGATRON21_COMMON = (
    "Micro-batch, virtual stages, --fp16 (loss scale 8192) and --checkpoint-activations from "
    "the authors' sc21 script for this row; seq 2048, vocabulary 51,200 (Section 5.1). No "
    "sequence parallelism (introduced in 2022) and no flash attention (Megatron's fused "
    "softmax; FlashAttention appeared in 2022). zero=0: Megatron-LM of 2021 had no "
    "distributed optimizer. Measured end to end, not trained to convergence (Section 5.1)."
)
_KORTHIKANTI_COMMON = (
    "Table 3 gives TP, PP, GPUs, global and micro batch; Section 6: seq 2048, vocabulary "
    "51,200, interleaving with three stages for the 175B and 530B models only, mixed precision "
    "(fp16 or bf16 not stated: recorded as bf16, the bytes are the same), no data parallelism "
    "in Tables 3-5. 'Present work' = sequence parallelism + selective recomputation. Flash "
    "attention: no (selective recomputation exists to drop the stored attention scores). "
    "Appendix B's output-tensor deallocation is used in all results."
)
_LLAMA3_COMMON = (
    "Table 4: GPUs, TP, CP, PP, DP, sequence, batch per DP (sequences), 16M tokens per batch. "
    "Section 3.3.2: FSDP 'shards optimizer states and gradients, but for model shards we do "
    "not reshard after forward computation': parameters are sharded at rest, gathered once "
    "per step and kept from forward to backward (PyTorch FSDP's reshard_after_forward=False); "
    "recorded as zero=2 (gradients and optimizer states sharded, parameters whole in the "
    "step); "
    "FP32 gradient accumulation and FP32 reduce-scatter; interleaved schedule with V stages "
    "per rank, one Transformer layer removed from the first and the last stage so that 'the "
    "first model chunk on the first stage has only the embedding': with one layer per chunk, "
    "V = (126 + 2) / 16 = 8 (inferred, the paper gives no V) and pp_layers (7, 8 x 14, 7). "
    "Micro-batch not stated: 1 chosen. Flash attention not stated: True chosen. Sequence "
    "parallelism not stated: True chosen because the paper cites Korthikanti et al. for TP. "
    "H100 SXM 80GB HBM3 at 700 W (Section 3.3.1)."
)
_LLAMA3_EDGE = (
    "Llama Team (Dubey et al.) 2024, https://arxiv.org/abs/2407.21783, Section 3.3.2, "
    "'Pipeline parallelism improvements': 'Finally, to reduce memory cost, "
    "based on detailed memory allocation profiling, we proactively deallocate tensors that "
    "will not be used for future computation, including the input and output tensors of each "
    "pipeline stage, that will not be used for future computation. With these optimizations, "
    "we could pre-train Llama 3 on sequences of 8K tokens without activation checkpointing.' "
    "(this course's reading: memory profiled and trimmed, after which the 8K step ran without "
    "recomputation)"
)
_LLAMA3_EDGE_8K = (
    "'With these optimizations, we could pre-train Llama 3 on sequences of 8K tokens without "
    "activation checkpointing.'"
)
_LLAMA3_EDGE_128K = (
    "the paper states no activation-checkpointing setting for 128K tokens; its sentence is "
    "about 8K: " + _LLAMA3_EDGE_8K
)
_FOUNDRY_COMMON = (
    "Columns: MicroBatchSize, GradAccum, GlobalBatchSize, Precision amp_bf16, MP Mode DEFAULT "
    "(Composer's FSDP mixed-precision preset, not expanded here), Sharding Strategy "
    "FULL_SHARD (PyTorch FSDP, which re-shards after forward; sweep.sh's image is PyTorch "
    "2.1), Activation Checkpointing (recorded as full: the README's HFU is 4/3 of its MFU, "
    "one extra forward), Activation CPUOffload False. attn_impl "
    "'triton' (a Triton FlashAttention kernel, submit_benchmarks.py's default) and no ALiBi: "
    "the yamls leave alibi unset, and the NumParams column counts a learned position table. "
    "These are not the released mosaicml/mpt-7b/30b architectures (those use ALiBi, no "
    "biases). MFU as the README defines it: (6 N seq + 3 x n_layers x 4 d_model seq^2) x "
    "sequences/s / (GPUs x peak), N = NumParams (embedding and position tables included), "
    "attention not halved for causality. The embedding is tied to the output layer, so the "
    "planner's matmul count holds it once too; only the position table (0.1-0.2% of N) is "
    "not in the planner's count: not adjusted."
)
_AUTOMODEL_COMMON = (
    "Benchmark with mock data, 'fake balanced gate' (ideal expert routing), no gradient "
    "clipping (the page's notes). FSDP2 through nemo_automodel/components/moe/parallelizer.py "
    "at the same commit: reshard_after_forward=False (gathered parameters kept from forward "
    "to backward: recorded as zero=2, as Llama 3), MixedPrecisionPolicy(param_dtype=bf16, "
    "reduce_dtype=fp32), activation checkpointing wraps every block (remat 'full'); with "
    "EP over every FSDP rank the experts are left out of FSDP (ignored_params). Attention "
    "by Transformer Engine (fused/flash), DeepEP all-to-all. Optimizer torch.optim.Adam. "
    "Pure bf16 (precision 'bf16 pure'): the model is built in bf16 (initialize_weights' "
    "default dtype=torch.bfloat16, then self.to(dtype), in nemo_automodel/components/models/"
    "*/model.py, called by components/checkpoint/checkpointing.py), so the parameters, their "
    "gradients and Adam's two moments (torch.optim.Adam allocates them like the parameter) "
    "are bf16, with no f32 copy: 8 bytes per parameter. Loss: the yaml's MaskedCrossEntropy "
    "with fp32_upcast false, an unfused cross-entropy in bf16 (loss 'plain')."
)


# ---------------------------------------------------------------------------
# The runs
# ---------------------------------------------------------------------------

PUBLISHED_RUNS: tuple[PublishedRun, ...] = (
    # -- Narayanan et al. 2021 (NVIDIA), Table 1: weak scaling on Selene, A100-80GB ----------
    PublishedRun(
        key="megatron21-gpt-1.7b",
        dp_issue="bucket",  # DDP=torch in the sc21 script: PyTorch DDP, 25 MiB buckets
        name="GPT 1.7B, 32 A100, DP 32 (Megatron 2021)",
        source=f"{_NARAYANAN}, Table 1 row '1.7' (p. 8); micro-batch from {_SC21}",
        model=_megatron_gpt(24, 2304, 24),
        hardware="a100-80gb",
        gpus=32,
        dp=32,
        micro_batch=16,
        global_batch=512,
        remat="full",
        precision="fp16 mixed",
        flash_attention=False,
        achieved_mfu=0.3346,
        achieved_tflops_per_gpu=137.0,
        mfu_note=_MEGATRON21_MFU.format(ratio="0.7620") + "; published 44% of peak is HFU.",
        assumptions=_MEGATRON21_COMMON + " sc21 script: MBS 16, GBS 512, DDP torch, 4 nodes.",
        independent_source="NVIDIA",
    ),
    PublishedRun(
        key="megatron21-gpt-18b",
        dp_issue="bucket",  # DDP=torch in the sc21 script: PyTorch DDP, 25 MiB buckets
        name="GPT 18B, 256 A100, TP 8 x DP 32 (Megatron 2021)",
        source=f"{_NARAYANAN}, Table 1 row '18.4' (p. 8); micro-batch from {_SC21}",
        model=_megatron_gpt(40, 6144, 48),
        hardware="a100-80gb",
        gpus=256,
        tp=8,
        dp=32,
        micro_batch=8,
        global_batch=1024,
        remat="full",
        precision="fp16 mixed",
        flash_attention=False,
        achieved_mfu=0.3258,
        achieved_tflops_per_gpu=135.0,
        mfu_note=_MEGATRON21_MFU.format(ratio="0.7530") + "; published 43% of peak is HFU.",
        assumptions=_MEGATRON21_COMMON + " sc21 script: MBS 8, GBS 1024, 32 nodes.",
        independent_source="NVIDIA",
    ),
    PublishedRun(
        key="megatron21-gpt-145b",
        dp_issue="whole",  # DDP=local: one all-reduce per gradient buffer (_MEGATRON21_DDP)
        name="GPT 145B, 1536 A100, TP 8 x PP 8 x DP 24 (Megatron 2021)",
        source=f"{_NARAYANAN}, Table 1 row '145.6' (p. 8); micro-batch, virtual stages from {_SC21}",
        model=_megatron_gpt(80, 12288, 96),
        hardware="a100-80gb",
        gpus=1536,
        tp=8,
        pp=8,
        dp=24,
        virtual_stages=2,
        micro_batch=2,
        global_batch=2304,
        remat="full",
        precision="fp16 mixed",
        flash_attention=False,
        achieved_mfu=0.3561,
        achieved_tflops_per_gpu=148.0,
        mfu_note=_MEGATRON21_MFU.format(ratio="0.7508") + "; published 47% of peak is HFU.",
        assumptions=_MEGATRON21_COMMON
        + " sc21 script: MBS 2, GBS 2304, --num-layers-per-virtual-pipeline-stage 5 (10 layers"
        " per stage: 2 virtual stages), 192 nodes. Interleaved schedule with scatter/gather"
        " (Section 5.1).",
        independent_source="NVIDIA",
    ),
    PublishedRun(
        key="megatron21-gpt-530b",
        dp_issue="whole",  # DDP=local: one all-reduce per gradient buffer (_MEGATRON21_DDP)
        name="GPT 530B, 2520 A100, TP 8 x PP 35 x DP 9 (Megatron 2021)",
        source=f"{_NARAYANAN}, Table 1 row '529.6' (p. 8); micro-batch, virtual stages from {_SC21}",
        model=_megatron_gpt(105, 20480, 128),
        hardware="a100-80gb",
        gpus=2520,
        tp=8,
        pp=35,
        dp=9,
        virtual_stages=3,
        micro_batch=1,
        global_batch=2520,
        remat="full",
        precision="fp16 mixed",
        flash_attention=False,
        achieved_mfu=0.3920,
        achieved_tflops_per_gpu=163.0,
        mfu_note=_MEGATRON21_MFU.format(ratio="0.7504") + "; published 52% of peak is HFU.",
        assumptions=_MEGATRON21_COMMON
        + " sc21 script: MBS 1, GBS 2520, --num-layers-per-virtual-pipeline-stage 1 (3 layers"
        " per stage: 3 virtual stages), 315 nodes.",
        independent_source="NVIDIA",
    ),
    PublishedRun(
        key="megatron21-gpt-1t",
        dp_issue="whole",  # DDP=local: one all-reduce per gradient buffer (_MEGATRON21_DDP)
        name="GPT 1T, 3072 A100, TP 8 x PP 64 x DP 6 (Megatron 2021)",
        source=f"{_NARAYANAN}, Table 1 row '1008.0' (p. 8); micro-batch from {_SC21}",
        model=_megatron_gpt(128, 25600, 160),
        hardware="a100-80gb",
        gpus=3072,
        tp=8,
        pp=64,
        dp=6,
        micro_batch=1,
        global_batch=3072,
        remat="full",
        precision="fp16 mixed",
        flash_attention=False,
        achieved_mfu=0.3920,
        achieved_tflops_per_gpu=163.0,
        mfu_note=_MEGATRON21_MFU.format(ratio="0.7502") + "; published 52% of peak is HFU.",
        assumptions=_MEGATRON21_COMMON
        + " sc21 script: MBS 1, GBS 3072, 384 nodes, and no virtual-stage flag for this row,"
        " so virtual_stages=1, although Section 5.1 says Table 1 uses the interleaved"
        " schedule (the script is the more specific source).",
        independent_source="NVIDIA",
    ),
    # -- Narayanan et al. 2021, Table 2: ZeRO-3 without model parallelism (DeepSpeed) --------
    PublishedRun(
        key="megatron21-zero3-gpt3-175b",
        dp_issue="tensor",  # assumed: one collective per parameter tensor (_DEEPSPEED_Z3)
        name="GPT-3 175B, 384 A100, ZeRO-3 DP 384 (Megatron 2021)",
        source=f"{_NARAYANAN}, Table 2, ZeRO-3 row '174.6', 384 GPUs (p. 9)",
        model=_megatron_gpt(96, 12288, 96),
        hardware="a100-80gb",
        gpus=384,
        dp=384,
        zero=3,
        micro_batch=4,
        global_batch=1536,
        remat="full",
        precision="fp16 mixed",
        flash_attention=False,
        achieved_mfu=0.3465,
        achieved_tflops_per_gpu=144.0,
        mfu_note=_MEGATRON21_MFU.format(ratio="0.7507")
        + "; assumes Table 2 counts FLOP/s as Table 1 does (Eq. 3), which the paper implies by"
        " comparing the two in the same units.",
        assumptions="Table 2: model-parallel size 1, batch 1536, 384 GPUs, microbatch 4, "
        "'ZeRO-3 without Model Parallelism', integrated with the DeepSpeed library (Section "
        "5.2). GPT-3 architecture (96 layers, 96 heads, 12288; Section 5.3.2). Not stated, "
        "chosen as in the paper's other runs: activation recomputation (full), fp16, seq 2048, "
        "vocabulary 51,200, no flash attention. DeepSpeed ZeRO-3 re-gathers parameters in the "
        "backward pass by default (textbook ZeRO-3).",
        independent_source="NVIDIA",
    ),
    PublishedRun(
        key="megatron21-zero3-530b-oom",
        dp_issue="tensor",  # assumed: one collective per parameter tensor (_DEEPSPEED_Z3)
        name="GPT 530B, 560 A100, ZeRO-3 micro-batch 4: out of memory (Megatron 2021)",
        source=f"{_NARAYANAN}, Table 2 caption (p. 9): 'The 530-billion-parameter GPT model "
        "did not fit on 560 GPUs when using a microbatch size of 4 with ZeRO-3'",
        model=_megatron_gpt(105, 20480, 128),
        hardware="a100-80gb",
        gpus=560,
        dp=560,
        zero=3,
        micro_batch=4,
        global_batch=2240,
        remat="full",
        precision="fp16 mixed",
        flash_attention=False,
        outcome="oom",
        mfu_note="Out of memory: no MFU.",
        assumptions="Global batch 2240: the batch of the 530B rows of Table 2 at 560, 1120 and "
        "2240 GPUs (the caption's replacement run used 640 GPUs and 2560 = 640 x 4, one "
        "micro-batch of 4 per GPU); 2240 = 560 x 4 x 1. Model: Table 1's 529.6B row (105 "
        "layers, 128 heads, 20480). Recomputation, fp16, no flash attention as in the "
        "ZeRO-3 175B run.",
        independent_source="NVIDIA",
    ),
    # -- Narayanan et al. 2021, Table 2: PTD-P at a fixed global batch (strong scaling) --------
    *(
        PublishedRun(
            key=f"megatron21-ptdp-gpt3-175b-{gpus}",
            name=f"GPT-3 175B, {gpus} A100, TP 8 x PP 12 x DP {gpus // 96}, global batch 1536 "
            "(Megatron 2021, strong scaling)",
            source=f"{_NARAYANAN}, Table 2, PTD Parallelism row '174.6', {gpus} GPUs (p. 9): "
            f"model-parallel size 96, batch 1536, microbatch 1, {tflops:g} teraFLOP/s per GPU",
            model=_megatron_gpt(96, 12288, 96),
            hardware="a100-80gb",
            gpus=gpus,
            tp=8,
            pp=12,
            dp=gpus // 96,
            virtual_stages=4,
            micro_batch=1,
            global_batch=1536,
            remat="full",
            precision="fp16 mixed",
            flash_attention=False,
            achieved_mfu=mfu,
            achieved_tflops_per_gpu=tflops,
            mfu_note=_MEGATRON21_MFU.format(ratio="0.7507")
            + "; Table 2 counts FLOP/s as Table 1 does (its training times follow Eq. 4).",
            assumptions="Table 2 gives the model-parallel size (96), batch, GPUs and microbatch "
            "only. The split TP 8 x PP 12 and the interleaved schedule with 2 layers per virtual "
            "stage (v = 4) are the authors' own for this model on 96 GPUs (examples/sc21/"
            "run_figure_12.sh and run_figure_18.sh at de7dc40f: TP=8, PP=12, "
            "--num-layers-per-virtual-pipeline-stage 2), and Section 5.1 says the end-to-end "
            "runs use the interleaved schedule; the non-interleaved one (v = 1) is not ruled "
            "out. Recomputation (Eq. 4's 8TP/nX assumes it), fp16, seq 2048, vocabulary "
            "51,200, no flash attention and no sequence parallelism as in Table 1. "
            + _MEGATRON21_DDP
            + " DDP=local, as every sc21 script with a pipeline.",
            independent_source="NVIDIA",
            dp_issue="whole",
            series=MEGATRON21_TABLE2_SERIES,
        )
        for gpus, tflops, mfu in _PTDP_175B
    ),
    # -- Korthikanti et al. 2022 (NVIDIA): sequence parallelism + selective recompute --------
    PublishedRun(
        key="korthikanti22-gpt-22b",
        name="GPT 22B, 8 A100, TP 8, SP + selective (Korthikanti 2022)",
        source=f"{_KORTHIKANTI}, Table 3 row '22B' and Table 5 row '22B' (MFU 41.5%, HFU 43.7%)",
        model=_megatron_gpt(48, 6144, 64),
        hardware="a100-80gb",
        gpus=8,
        tp=8,
        sequence_parallel=True,
        micro_batch=4,
        global_batch=4,
        remat="selective",
        flash_attention=False,
        achieved_mfu=0.415,
        mfu_note="As published (Table 5, 'Present work'); " + _A100 + ".",
        assumptions=_KORTHIKANTI_COMMON,
        independent_source="NVIDIA",
    ),
    PublishedRun(
        key="korthikanti22-gpt3-175b",
        name="GPT-3 175B, 64 A100, TP 8 x PP 8, SP + selective (Korthikanti 2022)",
        source=f"{_KORTHIKANTI}, Table 3 row '175B (GPT-3)' and Table 5 row '175B' "
        "(MFU 51.4%, HFU 52.8%)",
        model=_megatron_gpt(96, 12288, 96),
        hardware="a100-80gb",
        gpus=64,
        tp=8,
        pp=8,
        virtual_stages=3,
        sequence_parallel=True,
        micro_batch=1,
        global_batch=64,
        remat="selective",
        flash_attention=False,
        achieved_mfu=0.514,
        mfu_note="As published (Table 5, 'Present work'); " + _A100 + ".",
        assumptions=_KORTHIKANTI_COMMON,
        independent_source="NVIDIA",
    ),
    PublishedRun(
        key="korthikanti22-gpt3-175b-tp-only-oom",
        name="GPT-3 175B, 64 A100, TP 8 x PP 8, no SP, no recompute: would not fit, "
        "its source says (Korthikanti 2022)",
        source=f"{_KORTHIKANTI}, Section 6.1: 'Without the memory savings provided by sequence "
        "parallelism and selective recompute together, none of the these models will fit into "
        "memory' (the models of Table 3)",
        model=_megatron_gpt(96, 12288, 96),
        hardware="a100-80gb",
        gpus=64,
        tp=8,
        pp=8,
        virtual_stages=3,
        micro_batch=1,
        global_batch=64,
        remat="none",
        flash_attention=False,
        outcome="oom",
        mfu_note="Out of memory: no MFU.",
        assumptions=_KORTHIKANTI_COMMON
        + " This is the 175B layout of Table 3 with neither technique and no recomputation "
        "(the 'tensor parallel (baseline)' row of Table 2, all activations stored), the "
        "configuration the quoted sentence says does not fit; the paper measured it only with "
        "full recomputation (Table 5, 'Full Recompute').",
        independent_source="NVIDIA",
    ),
    PublishedRun(
        key="korthikanti22-mtnlg-530b",
        name="MT-NLG 530B, 280 A100, TP 8 x PP 35, SP + selective (Korthikanti 2022)",
        source=f"{_KORTHIKANTI}, Table 3 row '530B (MT-NLG)' and Table 5 row '530B' "
        "(MFU 56.0%, HFU 57.0%)",
        model=_megatron_gpt(105, 20480, 128),
        hardware="a100-80gb",
        gpus=280,
        tp=8,
        pp=35,
        virtual_stages=3,
        sequence_parallel=True,
        micro_batch=1,
        global_batch=280,
        remat="selective",
        flash_attention=False,
        achieved_mfu=0.560,
        mfu_note="As published (Table 5, 'Present work'); " + _A100 + ".",
        assumptions=_KORTHIKANTI_COMMON,
        independent_source="NVIDIA",
    ),
    PublishedRun(
        key="korthikanti22-mtnlg-530b-dp8",
        dp_issue="whole",  # Megatron-LM's local DDP, not overlapped (Section 6.3)
        name="MT-NLG 530B, 2240 A100, TP 8 x PP 35 x DP 8, SP + selective (Korthikanti 2022)",
        source=f"{_KORTHIKANTI}, abstract and Section 6.3: 8-way data parallelism (2240 GPUs), "
        "batch multiplied by 8, 39.15 s per iteration, MFU 54.2%",
        model=_megatron_gpt(105, 20480, 128),
        hardware="a100-80gb",
        gpus=2240,
        tp=8,
        pp=35,
        dp=8,
        virtual_stages=3,
        sequence_parallel=True,
        micro_batch=1,
        global_batch=2240,
        remat="selective",
        flash_attention=False,
        achieved_mfu=0.542,
        mfu_note="As published (Section 6.3 and the abstract); " + _A100 + ".",
        assumptions=_KORTHIKANTI_COMMON
        + " Section 6.3: the 530B layout of Table 3 with 8-way data parallelism, 'batch size "
        "per model instance constant' (280 x 8 = 2240), and 'we do not use any overlapping of "
        "gradient all-reduces with back-propagation' (the DP all-reduce is exposed).",
        independent_source="NVIDIA",
    ),
    PublishedRun(
        key="korthikanti22-gpt-1t",
        name="GPT 1T, 512 A100, TP 8 x PP 64, SP + selective (Korthikanti 2022)",
        source=f"{_KORTHIKANTI}, Table 3 row '1T' and Table 5 row '1T' (MFU 56.3%, HFU 57.0%)",
        model=_megatron_gpt(128, 25600, 160),
        hardware="a100-80gb",
        gpus=512,
        tp=8,
        pp=64,
        sequence_parallel=True,
        micro_batch=1,
        global_batch=512,
        remat="selective",
        flash_attention=False,
        achieved_mfu=0.563,
        mfu_note="As published (Table 5, 'Present work'); " + _A100 + ".",
        assumptions=_KORTHIKANTI_COMMON + " Not interleaved (only 175B and 530B are).",
        independent_source="NVIDIA",
    ),
    # -- Llama 3 405B (Meta), Table 4: H100 --------------------------------------------------
    PublishedRun(
        key="llama3-405b-8k-gpus",
        name="Llama 3 405B, 8192 H100, TP 8 x PP 16 x DP 64 (Llama 3)",
        source=f"{_LLAMA3} row '8,192'",
        model=_llama3_405b(),
        hardware="h100",
        gpus=8192,
        tp=8,
        pp=16,
        dp=64,
        virtual_stages=8,
        pp_layers=(7,) + (8,) * 14 + (7,),
        zero=2,
        sequence_parallel=True,
        micro_batch=1,
        global_batch=2048,
        seq=8192,
        achieved_mfu=0.43,
        achieved_tflops_per_gpu=430.0,
        mfu_note="BF16 MFU as published (Table 4; 430/989 = 0.435); " + _H100 + ".",
        assumptions=_LLAMA3_COMMON
        + " Global batch 32 x 64 = 2048 sequences of 8192 (16.8M tokens, Table 4's '16M'). "
        "No activation checkpointing at 8K (Section 3.3.2).",
        memory_edge=_LLAMA3_EDGE,
        memory_edge_says=_LLAMA3_EDGE_8K,
        memory_edge_own=True,
        independent_source="Meta",
    ),
    PublishedRun(
        key="llama3-405b-16k-gpus",
        name="Llama 3 405B, 16384 H100, TP 8 x PP 16 x DP 128 (Llama 3)",
        source=f"{_LLAMA3} row '16,384' with CP 1",
        model=_llama3_405b(),
        hardware="h100",
        gpus=16384,
        tp=8,
        pp=16,
        dp=128,
        virtual_stages=8,
        pp_layers=(7,) + (8,) * 14 + (7,),
        zero=2,
        sequence_parallel=True,
        micro_batch=1,
        global_batch=2048,
        seq=8192,
        achieved_mfu=0.41,
        achieved_tflops_per_gpu=400.0,
        mfu_note="BF16 MFU as published (Table 4; 400/989 = 0.404); " + _H100 + ".",
        assumptions=_LLAMA3_COMMON
        + " Global batch 16 x 128 = 2048 sequences of 8192. No activation checkpointing at 8K "
        "(Section 3.3.2).",
        memory_edge=_LLAMA3_EDGE,
        memory_edge_says=_LLAMA3_EDGE_8K,
        memory_edge_own=True,
        independent_source="Meta",
    ),
    PublishedRun(
        key="llama3-405b-128k-cp16",
        name="Llama 3 405B, 16384 H100, TP 8 x CP 16 x PP 16 x DP 8, 128K tokens (Llama 3)",
        source=f"{_LLAMA3} row '16,384' with CP 16, sequence 131,072",
        model=_llama3_405b(),
        hardware="h100",
        gpus=16384,
        tp=8,
        pp=16,
        dp=8,
        cp=16,
        virtual_stages=8,
        pp_layers=(7,) + (8,) * 14 + (7,),
        zero=2,
        sequence_parallel=True,
        micro_batch=1,
        global_batch=128,
        seq=131072,
        achieved_mfu=0.38,
        achieved_tflops_per_gpu=380.0,
        mfu_note="BF16 MFU as published (Table 4; 380/989 = 0.384); " + _H100 + ".",
        assumptions=_LLAMA3_COMMON
        + " DP: one transcription of Table 4 reads 4 here, two read 8; 8 x 16 x 16 x 8 = 16,384 "
        "GPUs and 16 x 8 x 131,072 = 16.8M tokens ('16M') agree only with 8. Global batch "
        "16 x 8 = 128 sequences. CP all-gathers K and V (Section 3.3.2, 'Context parallelism'), "
        "the sequence cut in 2 x CP chunks. Activation checkpointing at 128K not stated: 'none' "
        "chosen for the MFU, as at 8K (each CP rank holds 8,192 tokens); no memory verdict "
        "(remat_stated False).",
        memory_edge=_LLAMA3_EDGE
        + "; with CP 16 each rank holds 8,192 of the 131,072 tokens, the 8K runs' "
        "activations per layer",
        memory_edge_says=_LLAMA3_EDGE_128K,
        remat_stated=False,
        independent_source="Meta",
    ),
    # -- MosaicML llm-foundry benchmarks: FSDP FULL_SHARD ------------------------------------
    PublishedRun(
        key="mosaic-mpt-70b-512-h100",
        name="MPT 70B, 512 H100, FSDP 512 (MosaicML)",
        source=f"{_FOUNDRY}, table 'H100 80GB BF16 (Large Scale, >= 128 GPUs)', row 70b / 2048 "
        "/ 512",
        model=_mpt(8192, 64, 80),
        hardware="h100",
        gpus=512,
        dp=512,
        zero=3,
        micro_batch=8,
        global_batch=4096,
        remat="full",
        achieved_mfu=0.4125,
        achieved_tflops_per_gpu=408.0,
        mfu_note="As published (MFU 41.25, HFU 55.0, Model TFLOP 408; 408/989 = 0.4125); "
        + _H100
        + ".",
        assumptions=_FOUNDRY_COMMON
        + " Row: MicroBatchSize 8, GradAccum 1, GlobalBatchSize 4096, 1007 tokens/s/GPU, "
        "NumParams 64,862,437,376.",
        independent_source="MosaicML",
    ),
    PublishedRun(
        key="mosaic-mpt-7b-8-h100",
        name="MPT 7B, 8 H100, FSDP 8, no remat (MosaicML)",
        source=f"{_FOUNDRY}, table 'H100 80GB BF16', row 7b / 2048 / 8",
        model=_mpt(4096, 32, 32),
        hardware="h100",
        gpus=8,
        dp=8,
        zero=3,
        micro_batch=6,
        global_batch=48,
        remat="none",
        achieved_mfu=0.4644,
        achieved_tflops_per_gpu=459.0,
        mfu_note="As published (MFU 46.44 = HFU, Model TFLOP 459); " + _H100 + ".",
        assumptions=_FOUNDRY_COMMON
        + " Row: MicroBatchSize 6, GradAccum 1, GlobalBatchSize 48, Activation Checkpointing "
        "False, 10643 tokens/s/GPU, NumParams 6,658,859,008.",
        independent_source="MosaicML",
    ),
    PublishedRun(
        key="mosaic-mpt-30b-8-a100",
        name="MPT 30B, 8 A100-80GB, FSDP 8 (MosaicML)",
        source=f"{_FOUNDRY}, table 'A100 80GB with 1600 Gbps node-node interconnect (RoCE)', "
        "row 30b / 2048 / 8",
        model=_mpt(7168, 56, 48),
        hardware="a100-80gb",
        gpus=8,
        dp=8,
        zero=3,
        micro_batch=3,
        global_batch=504,
        remat="full",
        achieved_mfu=0.553,
        achieved_tflops_per_gpu=172.0,
        mfu_note="As published (MFU 55.3, HFU 73.74, Model TFLOP 172); " + _A100 + ".",
        assumptions=_FOUNDRY_COMMON
        + " Row: MicroBatchSize 3, GradAccum 21, GlobalBatchSize 504, 916 tokens/s/GPU, "
        "NumParams 29,975,214,080.",
        independent_source="MosaicML",
    ),
    # -- BigScience BLOOM 176B: the training log ---------------------------------------------
    PublishedRun(
        key="bloom-176b",
        name="BLOOM 176B, 384 A100, TP 4 x PP 12 x DP 8, ZeRO-1 (BigScience)",
        source="bigscience-workshop/bigscience train/tr11-176B-ml/README.md "
        "@ 39ed8110482e9eb87d0e094ede05e4d02c40e298: 'Replica setup' (TP=4, PP=12, DP=8, "
        "MBS=2) and the log line of iteration 85376 (end of epoch one): global batch size "
        "2048, 104.70 s per iteration, 19.561 samples/s, 'TFLOPs: 149.77'",
        model=_bloom_176b(),
        hardware="a100-80gb",
        gpus=384,
        tp=4,
        pp=12,
        dp=8,
        pp_layers=(5,) + (6,) * 10 + (5,),
        zero=1,
        micro_batch=2,
        global_batch=2048,
        remat="full",
        flash_attention=False,
        achieved_mfu=0.3618,
        achieved_tflops_per_gpu=149.77,
        mfu_note="The log's TFLOPs are hardware FLOPs with full recomputation ('Throughput': "
        "'the 4*2 co-efficient'); 149.77 is Narayanan's Eq. 3 at V = 250,880 (recomputed: "
        "149.76). MFU = 149.77 x (Eq. 7 / Eq. 3 = 0.7538) / 312; " + _A100 + ".",
        assumptions="README: 384 of 416 A100 80GB, 8 per node, 4 Omni-Path links per node; "
        "bf16 with DeepSpeed's BF16_Optimizer, which 'implements its own ZeRO Stage 1' "
        "(ZERO_STAGE=0 in the DeepSpeed config); seq 2048; GELU; pipeline partition "
        "'type:transformer|embedding' puts the tied embedding on the first and the last "
        "stage, 5 blocks there and 6 elsewhere. train/tr11-176B-ml/tr11-176B-ml.slurm at the "
        "same commit: --position-embedding-type alibi, --embed-layernorm (a LayerNorm after "
        "the embedding), --pad-vocab-size-to 250880, --checkpoint-activations, --bf16, "
        "MICRO_BATCH_SIZE=2, GLOBAL_BATCH_SIZE=2048. Not stated, chosen: no sequence "
        "parallelism and no flash attention (Megatron-DeepSpeed's fused softmax, 2022). "
        "Megatron-DeepSpeed @ ds_ckpt_reshape, PyTorch 1.11.",
        independent_source="BigScience",
    ),
    # -- NVIDIA NeMo Automodel: MoE pre-training benchmarks on H100 --------------------------
    PublishedRun(
        key="automodel-qwen3-30b-a3b-8-h100",
        name="Qwen3-30B-A3B (MoE), 8 H100, FSDP 8 x EP 8 (NeMo Automodel)",
        source=f"{_AUTOMODEL}, row 'Qwen3 MoE 30B'; configuration "
        "examples/benchmark/configs/qwen3_moe_30b_te_deepep.yaml at the same commit",
        model=_qwen3_30b_a3b(),
        hardware="h100",
        gpus=8,
        dp=8,
        ep=8,
        zero=2,
        micro_batch=4,
        global_batch=512,
        seq=4096,
        remat="full",
        achieved_mfu=0.2801,
        achieved_tflops_per_gpu=277.0,
        mfu_note="Model TFLOP/s as published (277; 12,040 tokens/s/GPU, 21.773 s per step), "
        "MFU = 277 / 989 as the page says it computes MFU; the FLOP count is "
        "flops_utils.qwen3_flops at that commit (causal attention counted at half); " + _H100,
        assumptions=_AUTOMODEL_COMMON
        + " Row: GBS 512, MBS 4, LBS 4, GA 16, seq 4096, TP 1, PP 1, CP 1, EP 8, FSDP 8. "
        "Every GPU holds 16 of the 128 experts whole (EP 8 over the 8 FSDP ranks).",
        precision="bf16 pure",
        loss="plain",
        attention_flops="causal",
        independent_source="NVIDIA",
    ),
    PublishedRun(
        key="automodel-deepseek-v3-256-h100",
        name="DeepSeek-V3 671B (MoE), 256 H100, PP 4 (V 8) x FSDP 64 x EP 64 (NeMo Automodel)",
        source=f"{_AUTOMODEL}, row 'DeepSeek V3 671B' with 256 GPUs; configuration "
        "examples/benchmark/configs/deepseek_v3_te_deepep.yaml at the same commit",
        model=_deepseek_v3(),
        hardware="h100",
        gpus=256,
        pp=4,
        dp=64,
        ep=64,
        virtual_stages=8,
        zero=2,
        micro_batch=1,
        global_batch=512,
        seq=4096,
        remat="full",
        achieved_mfu=0.2528,
        achieved_tflops_per_gpu=250.0,
        mfu_note="Model TFLOP/s as published (250; 1,002 tokens/s/GPU, 8.18 s per step), "
        "MFU = 250 / 989 as the page says it computes MFU; the FLOP count is "
        "flops_utils.deepseekv3_flops at that commit, without the MTP layer; " + _H100,
        assumptions=_AUTOMODEL_COMMON
        + " Row: GBS 512, MBS 1, LBS 8, GA 1, seq 4096, TP 1, PP 4, CP 1, EP 64, VP 8, FSDP 64"
        " (8 micro-batches per pipeline per step). Schedule interleaved1f1b, "
        "layers_per_stage 2: the 61 layers fall unevenly over 4 x 8 = 32 chunks; the split is "
        "not published (pp_layers left empty). The multi-token-prediction layer of "
        "config.json is not built (the model code at that commit has none) and not counted.",
        precision="bf16 pure",
        loss="plain",
        attention_flops="causal",
        independent_source="NVIDIA",
    ),
)
