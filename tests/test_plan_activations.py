"""Activation memory, the way Megatron counts it: Korthikanti et al. 2022 (arXiv:2205.05198),
Table 2, reproduced exactly from the planner's tensor-by-tensor count, then fused attention."""

from __future__ import annotations

import itertools

import pytest

from helpers.planning.activations import (
    KORTHIKANTI_ROWS,
    activation_terms,
    korthikanti_table,
    layer_activation_bytes,
)
from helpers.planning.models import ModelSpec, model_from_hf_config

# Table 2 for a 22B-like layer, as the paper writes each row (s, b, h, a, t symbolic).
S, B, H, A, T = 2048, 4, 6144, 64, 8
SBH = S * B * H
TABLE_2 = {
    "no parallelism": SBH * (34 + 5 * A * S / H),
    "tensor parallel": SBH * (10 + 24 / T + 5 * A * S / (H * T)),
    "tensor + sequence parallel": SBH * (34 / T + 5 * A * S / (H * T)),
    "tensor parallel + selective recompute": SBH * (10 + 24 / T),
    "tensor + sequence parallel + selective recompute": SBH * (34 / T),
    "full recompute": SBH * 2,
}
ROW_SETTINGS = {  # row: (uses tensor parallelism, sequence parallel, recompute)
    "no parallelism": (False, False, "none"),
    "tensor parallel": (True, False, "none"),
    "tensor + sequence parallel": (True, True, "none"),
    "tensor parallel + selective recompute": (True, False, "selective"),
    "tensor + sequence parallel + selective recompute": (True, True, "selective"),
    "full recompute": (True, False, "full"),
}


def gpt_layer(h: int, a: int) -> ModelSpec:
    """The GPT layer Korthikanti et al. count: LayerNorm, multi-head attention, a GELU MLP
    of 4h, dropout after attention's softmax and after each block."""
    return model_from_hf_config(
        {"model_type": "gpt2", "n_embd": h, "n_layer": 1, "n_head": a, "vocab_size": 64,
         "n_positions": 8, "resid_pdrop": 0.1, "attn_pdrop": 0.1}, "gpt"
    )  # fmt: skip


def count(model: ModelSpec, s: int, b: int, row: str, t: int = T, flash: bool = False) -> float:
    uses_tp, sp, remat = ROW_SETTINGS[row]
    return layer_activation_bytes(
        model, seq=s, micro_batch=b, tp=t if uses_tp else 1, sequence_parallel=sp, remat=remat,
        flash_attention=flash,
    )  # fmt: skip


def test_the_closed_forms_are_the_papers_table_2() -> None:
    assert tuple(TABLE_2) == KORTHIKANTI_ROWS
    table = korthikanti_table(S, B, H, A, T)
    for row in KORTHIKANTI_ROWS:
        assert table[row] == pytest.approx(TABLE_2[row], rel=1e-12), row


@pytest.mark.parametrize("row", KORTHIKANTI_ROWS)
def test_the_tensor_by_tensor_count_reproduces_each_row_exactly(row: str) -> None:
    for (s, b), (h, a), t in itertools.product(
        [(2048, 1), (4096, 2), (1024, 8)], [(6144, 64), (12288, 96), (2048, 16)], [2, 4, 8]
    ):
        assert count(gpt_layer(h, a), s, b, row, t) == pytest.approx(
            korthikanti_table(s, b, h, a, t)[row], rel=1e-12
        ), (row, s, b, h, a, t)


def test_the_itemised_list_is_section_4_1s() -> None:
    """34 sbh + 5 as^2 b, item by item (bytes per token and layer here: divide by sb)."""
    terms = activation_terms(gpt_layer(H, A), 1, False, seq=S)
    assert (
        terms["layer input (attention norm's input)"] == 2 * H and terms["MLP norm input"] == 2 * H
    )
    assert terms["q, k, v"] == 6 * H and terms["attention output (out-projection input)"] == 2 * H
    assert terms["MLP hidden (gate, up, product; or pre- and post-GELU)"] == 16 * H
    assert terms["attention dropout mask"] == terms["MLP dropout mask"] == H
    assert terms["scores: softmax (and dropout) over s keys"] == 5 * A * S


def test_fused_attention_drops_the_score_matrix() -> None:
    """With flash attention no L^2 term: only the softmax's f32 log-sum-exp per head."""
    gpt = gpt_layer(H, A)
    for row in ("no parallelism", "tensor parallel", "tensor + sequence parallel"):
        unfused, fused = count(gpt, S, B, row), count(gpt, S, B, row, flash=True)
        tp = T if ROW_SETTINGS[row][0] else 1
        assert unfused - fused == pytest.approx(S * B * (5 * A * S - 4 * A) / tp, rel=1e-12)
    # fused: linear in the sequence, unfused: quadratic
    one, two = (count(gpt, s, 1, "no parallelism", flash=True) for s in (4096, 8192))
    assert two == pytest.approx(2 * one, rel=1e-12)
    one, two = (count(gpt, s, 1, "no parallelism") for s in (4096, 8192))
    assert two > 3 * one


def test_a_llama_layer_counts_grouped_queries_and_three_mlp_tensors() -> None:
    llama = ModelSpec("l", 8192, 1, 64, 8, 28672, 128256)
    terms = activation_terms(llama, 8, True, sequence_parallel=True)
    assert terms["q, k, v"] == 2 * (8 * 128 + 1 * 256)  # 64/8 query heads, 1 KV head
    assert terms["MLP hidden (gate, up, product; or pre- and post-GELU)"] == 2 * 3 * 28672 / 8
    assert "attention dropout mask" not in terms  # no dropout
    assert terms["layer input (attention norm's input)"] == 2 * 8192 / 8  # sequence parallel


def test_405b_with_and_without_sequence_parallelism() -> None:
    """Issue 39, item 3: LLaMA-3-405B, tp 8, pp 16, 8192 tokens, 1F1B: ~188 GB of activations
    on the first stage without sequence parallelism and ~68 GB with it."""
    from helpers.planning.plan import plan_model

    kw = dict(tp=8, pp=16, dp=8, grad_accum=16, seq=8192, zero=1)
    off = plan_model("llama3-405b", sequence_parallel=False, **kw).per_device_bytes
    on = plan_model("llama3-405b", sequence_parallel=True, **kw).per_device_bytes
    assert 150e9 < off["activations"] < 200e9 and 60e9 < on["activations"] < 80e9
