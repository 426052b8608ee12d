"""The published runs of ``helpers/planning/runs.py`` are whole, consistent and cover issue 39.

Only the data: the planner is checked against these runs in tests/test_plan_published_runs.py.
Each check below is one a transcription slip would fail: a degree that does not multiply to the
GPU count, a batch that does not split into micro-batches, a model shape that does not give the
parameter count its source prints, an MFU conversion that does not reproduce.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.planning.runs import PUBLISHED_RUNS, PublishedRun

ROOT = Path(__file__).resolve().parents[1]
RUNS = {run.key: run for run in PUBLISHED_RUNS}
TRAINED = [run for run in PUBLISHED_RUNS if run.outcome == "trained"]

# The keys each family's config.json has for the shapes the planner reads.
FAMILY_KEYS = {
    "gpt2": {"n_embd", "n_layer", "n_head", "n_inner", "n_positions", "vocab_size"},
    "bloom": {"hidden_size", "n_layer", "n_head", "vocab_size"},
    "mpt": {
        "d_model", "n_heads", "n_layers", "expansion_ratio", "max_seq_len", "vocab_size",
        "learned_pos_emb", "no_bias", "attn_config",
    },
    "llama": {
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "intermediate_size", "vocab_size", "max_position_embeddings", "rope_theta",
    },
    "qwen3_moe": {
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "head_dim", "intermediate_size", "moe_intermediate_size", "num_experts",
        "num_experts_per_tok", "decoder_sparse_step", "mlp_only_layers", "vocab_size",
        "max_position_embeddings",
    },
    "deepseek_v3": {
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
        "intermediate_size", "moe_intermediate_size", "n_routed_experts", "n_shared_experts",
        "num_experts_per_tok", "first_k_dense_replace", "vocab_size", "max_position_embeddings",
    },
}  # fmt: skip
LAYERS_KEY = {"gpt2": "n_layer", "bloom": "n_layer", "mpt": "n_layers"}
HEADS_KEY = {"gpt2": "n_head", "bloom": "n_head", "mpt": "n_heads"}
POSITIONS_KEY = {"gpt2": "n_positions", "mpt": "max_seq_len"}
EXPERTS_KEY = {"qwen3_moe": "num_experts", "deepseek_v3": "n_routed_experts"}
PEAK_TFLOPS = {"a100-80gb": 312.0, "h100": 989.0}


def layers(run: PublishedRun) -> int:
    return run.model[LAYERS_KEY.get(run.model["model_type"], "num_hidden_layers")]


def heads(run: PublishedRun) -> int:
    return run.model[HEADS_KEY.get(run.model["model_type"], "num_attention_heads")]


def experts(run: PublishedRun) -> int:
    family = run.model["model_type"]
    return run.model[EXPERTS_KEY[family]] if family in EXPERTS_KEY else 1


def model_over_hardware_flops(l: int, h: int, s: int, v: int) -> float:  # noqa: E741
    """Korthikanti 2022 Eq. 7 over Narayanan 2021 Eq. 3 (full recomputation)."""
    model = 72 * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
    hardware = 96 * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    return model / hardware


def test_the_module_imports_nothing_but_the_standard_library():
    """The planner's command line imports it in a Python with no jax or numpy (issue 39)."""
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('runs', {str(ROOT / 'helpers/planning/runs.py')!r})\n"
        "m = importlib.util.module_from_spec(spec); sys.modules['runs'] = m\n"
        "spec.loader.exec_module(m)\n"
        "heavy = [x for x in ('jax', 'numpy', 'matplotlib', 'helpers') if x in sys.modules]\n"
        "print(len(m.PUBLISHED_RUNS), heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split(None, 1) == [str(len(PUBLISHED_RUNS)), "[]\n"]
    assert importlib.util.find_spec("helpers.planning.runs") is not None


def test_keys_are_unique_and_every_run_is_frozen():
    assert len(RUNS) == len(PUBLISHED_RUNS)
    with pytest.raises(AttributeError):
        PUBLISHED_RUNS[0].gpus = 1  # type: ignore[misc]


@pytest.mark.parametrize("run", PUBLISHED_RUNS, ids=lambda r: r.key)
def test_a_run_says_where_it_comes_from_and_what_was_assumed(run: PublishedRun):
    assert len(run.source) > 40 and run.name and run.independent_source
    assert run.mfu_note and run.assumptions
    assert "arXiv:" in run.source or " @ " in run.source, "a paper or a pinned commit"


@pytest.mark.parametrize("run", PUBLISHED_RUNS, ids=lambda r: r.key)
def test_the_degrees_multiply_to_the_gpu_count_and_the_batch_splits(run: PublishedRun):
    degrees = (run.tp, run.pp, run.dp, run.cp, run.ep, run.virtual_stages, run.micro_batch)
    assert run.gpus > 0 and all(d >= 1 for d in degrees)
    # ep is carved out of the data-parallel (x context-parallel) ranks; it multiplies nothing
    assert run.gpus == run.tp * run.pp * run.cp * run.dp
    assert (run.dp * run.cp) % run.ep == 0
    # global batch (sequences) = dp x micro-batch x micro-batches per step
    assert run.global_batch % (run.dp * run.micro_batch) == 0
    if run.pp > 1:
        # every pipeline rank has at least one micro-batch in flight per step
        assert run.global_batch // (run.dp * run.micro_batch) >= 1


@pytest.mark.parametrize("run", PUBLISHED_RUNS, ids=lambda r: r.key)
def test_settings_are_ones_the_planner_knows(run: PublishedRun):
    assert run.hardware in PEAK_TFLOPS
    assert run.zero in (0, 1, 2, 3)
    assert run.remat in ("none", "selective", "op", "full")
    assert run.precision in ("bf16 mixed", "fp16 mixed", "bf16 pure")  # pure: issue 53
    assert run.loss in ("fused", "upcast", "plain")
    assert run.outcome in ("trained", "oom")
    assert run.seq >= 1024 and run.seq % 1024 == 0
    if run.sequence_parallel:
        assert run.tp > 1, "Megatron-style SP splits what TP leaves whole"
    if run.virtual_stages > 1:
        assert run.pp > 1


@pytest.mark.parametrize("run", PUBLISHED_RUNS, ids=lambda r: r.key)
def test_mfu_is_a_fraction_for_trained_runs_and_none_for_oom(run: PublishedRun):
    if run.outcome == "oom":
        assert run.achieved_mfu is None and run.achieved_tflops_per_gpu is None
        return
    assert run.achieved_mfu is not None and 0.0 < run.achieved_mfu < 1.0
    if run.achieved_tflops_per_gpu is not None:
        # published TFLOP/s count model FLOPs or more (recomputation): MFU is at most that over
        # the peak, up to the rounding of a published percentage
        assert run.achieved_mfu <= run.achieved_tflops_per_gpu / PEAK_TFLOPS[run.hardware] + 0.006


@pytest.mark.parametrize("run", PUBLISHED_RUNS, ids=lambda r: r.key)
def test_the_model_has_its_familys_config_keys_and_fits_the_layout(run: PublishedRun):
    family = run.model.get("model_type")
    assert family in FAMILY_KEYS, family
    missing = FAMILY_KEYS[family] - set(run.model)
    assert not missing, f"{run.key}: {family} config.json keys missing: {sorted(missing)}"
    assert "tie_word_embeddings" in run.model
    assert heads(run) % run.tp == 0
    if "num_key_value_heads" in run.model:
        assert run.model["num_attention_heads"] % run.model["num_key_value_heads"] == 0
    positions = run.model.get(POSITIONS_KEY.get(family, "max_position_embeddings"))
    if positions is not None:
        assert run.seq <= positions
    n_experts = experts(run)
    assert n_experts % run.ep == 0
    if n_experts == 1:
        assert run.ep == 1
    n_layers = layers(run)
    if run.pp_layers:
        assert len(run.pp_layers) == run.pp and sum(run.pp_layers) == n_layers
    elif n_layers % (run.pp * run.virtual_stages):
        assert "unevenly" in run.assumptions, "an uneven split the source does not give"


def test_coverage_asked_for_by_issue_39():
    assert len(PUBLISHED_RUNS) >= 12
    assert len({run.independent_source for run in PUBLISHED_RUNS}) >= 4
    assert {"a100-80gb", "h100"} <= {run.hardware for run in TRAINED}
    assert any(experts(run) > 1 for run in TRAINED) and any(experts(run) == 1 for run in TRAINED)
    assert any(run.tp > 1 for run in TRAINED)
    assert any(run.pp > 1 for run in TRAINED)
    assert any(run.virtual_stages > 1 for run in TRAINED)
    assert any(run.cp > 1 for run in TRAINED)
    assert any(run.ep > 1 for run in TRAINED)
    assert any(run.zero == 1 for run in TRAINED)
    assert any(run.zero == 3 for run in TRAINED)
    assert any(run.sequence_parallel for run in TRAINED)
    assert any(run.remat == "selective" for run in TRAINED)
    assert sum(run.outcome == "oom" for run in PUBLISHED_RUNS) >= 1


# Narayanan et al. 2021, Table 1, 'Number of parameters (billion)'; Eq. 2 gives them from the
# shapes: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)).
NARAYANAN_PARAMS = {
    "megatron21-gpt-1.7b": 1.7,
    "megatron21-gpt-18b": 18.4,
    "megatron21-gpt-145b": 145.6,
    "megatron21-gpt-530b": 529.6,
    "megatron21-gpt-1t": 1008.0,
    "megatron21-zero3-gpt3-175b": 174.6,  # Table 2
}


@pytest.mark.parametrize("key", sorted(NARAYANAN_PARAMS))
def test_megatron_shapes_give_the_papers_parameter_count(key: str):
    m = RUNS[key].model
    l, h, v, s = m["n_layer"], m["n_embd"], m["vocab_size"], m["n_positions"]  # noqa: E741
    p = 12 * l * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * l * h))
    assert round(p / 1e9, 1) == NARAYANAN_PARAMS[key]


# llm-foundry's NumParams column at the pinned commit.
MPT_NUM_PARAMS = {
    "mosaic-mpt-70b-512-h100": 64862437376,
    "mosaic-mpt-7b-8-h100": 6658859008,
    "mosaic-mpt-30b-8-a100": 29975214080,
}


@pytest.mark.parametrize("key", sorted(MPT_NUM_PARAMS))
def test_mpt_shapes_give_the_benchmarks_num_params(key: str):
    """Learned positions, biases and LayerNorm weights and biases, tied embeddings: the count
    matches to the parameter, which is how ``learned_pos_emb`` and ``no_bias`` were read."""
    m = RUNS[key].model
    d, n, v, s = m["d_model"], m["n_layers"], m["vocab_size"], m["max_seq_len"]
    ffn = m["expansion_ratio"] * d
    per_layer = 4 * d * d + 2 * d * ffn + (4 * d + ffn + d) + 4 * d  # weights, biases, 2 norms
    total = n * per_layer + v * d + s * d + 2 * d  # embedding, positions, final norm
    assert total == MPT_NUM_PARAMS[key]


@pytest.mark.parametrize(
    "run", [r for r in TRAINED if r.key.startswith("megatron21-")], ids=lambda r: r.key
)
def test_megatron21_mfu_is_the_published_hardware_tflops_converted(run: PublishedRun):
    m = run.model
    ratio = model_over_hardware_flops(m["n_layer"], m["n_embd"], run.seq, m["vocab_size"])
    assert run.achieved_mfu == pytest.approx(run.achieved_tflops_per_gpu * ratio / 312, abs=6e-5)
    assert f"{ratio:.4f}" in run.mfu_note


def test_bloom_mfu_is_its_logged_hardware_tflops_converted():
    run = RUNS["bloom-176b"]
    m = run.model
    l, h, v, s, b = m["n_layer"], m["hidden_size"], m["vocab_size"], run.seq, run.global_batch  # noqa: E741
    # the log line's 104.70 s per iteration on 384 GPUs gives its TFLOPs by Narayanan's Eq. 3
    hardware = 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    assert hardware / 104.70 / run.gpus / 1e12 == pytest.approx(149.77, abs=0.02)
    ratio = model_over_hardware_flops(l, h, s, v)
    assert run.achieved_mfu == pytest.approx(149.77 * ratio / 312, abs=6e-5)


@pytest.mark.parametrize(
    "key", ["automodel-qwen3-30b-a3b-8-h100", "automodel-deepseek-v3-256-h100"]
)
def test_automodel_mfu_is_its_model_tflops_over_989(key: str):
    run = RUNS[key]
    assert run.achieved_mfu == pytest.approx(run.achieved_tflops_per_gpu / 989, abs=6e-5)
