"""Property-based tests of helpers.measuring.workload (what helpers.measuring.profile trains): resizing to a mesh,
degenerate strategies, workloads."""

from __future__ import annotations

import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import LOGICAL_RULES, STRATEGY_AXES
from helpers.measuring.workload import (
    config_dict,
    config_from_dict,
    degenerate,
    describe,
    fit_to_mesh,
    model_of,
    resolve_preset,
    workload_for,
)
from helpers.placing.models import ModelConfig, TransformerConfig

WIDTHS = {"embed": "d_model", "embed_vec": "d_model", "mlp": "d_ff", "classes": "n_classes"}
configs = st.builds(
    ModelConfig,
    d_model=st.integers(1, 300),
    d_ff=st.integers(1, 900),
    n_layers=st.integers(1, 3),
    n_classes=st.integers(1, 40),
)
strategies = st.lists(st.sampled_from(sorted(LOGICAL_RULES)), min_size=1, max_size=3, unique=True)
mesh_shapes = st.tuples(st.integers(1, 8), st.integers(1, 8))


def assert_split_widths_divide(fitted, names, shape, widths) -> None:
    """Every width that a strategy of ``names`` splits over the mesh ``shape`` divides evenly."""
    sizes = dict(zip(("data", "model"), shape, strict=True))
    for s in names:
        for logical, entry in LOGICAL_RULES[s]:
            if logical in widths and entry is not None:
                axes = (entry,) if isinstance(entry, str) else entry
                assert getattr(fitted, widths[logical]) % math.prod(sizes[a] for a in axes) == 0


@given(configs, strategies, mesh_shapes, st.sampled_from([1, 8, 128]))
def test_fit_to_mesh_makes_every_split_width_divide_and_changes_nothing_else(
    cfg, names, shape, multiple
):
    fitted, note = fit_to_mesh(cfg, names, shape, multiple)
    assert_split_widths_divide(fitted, names, shape, WIDTHS)
    for field in ("d_model", "d_ff", "n_classes"):
        before, after = getattr(cfg, field), getattr(fitted, field)
        assert after >= before
        assert (after != before) == (field in note)
    assert (fitted.n_layers, fitted.batch, fitted.seq) == (cfg.n_layers, cfg.batch, cfg.seq)
    assert (note == "") == (fitted == cfg)


@given(st.sampled_from(sorted(LOGICAL_RULES)), mesh_shapes)
def test_a_strategy_is_degenerate_exactly_when_its_axes_and_the_mesh_disagree(strategy, shape):
    why = degenerate(strategy, shape)
    sizes = dict(zip(("data", "model"), shape, strict=True))
    used = STRATEGY_AXES[strategy]
    ok = math.prod(shape) == 1 or (
        all(sizes[a] > 1 for a in used) and all(sizes[a] == 1 for a in sizes if a not in used)
    )
    assert (why is None) == ok
    if why is not None:
        assert isinstance(why, str) and why


@given(st.integers(1, 8), st.integers(1, 16), st.sampled_from(["dp", "fsdp"]))
def test_a_workload_has_its_batch_per_device_times_the_data_axis(n, per_device, strategy):
    devices = jax.devices()[:n]
    w = workload_for("tiny", [strategy], devices, (n, 1), batch_per_device=per_device)
    assert w.batch_per_device == per_device and w.cfg.batch == per_device * n
    assert w.tokens_per_step == w.cfg.batch * w.cfg.seq
    if strategy == "fsdp":
        assert w.cfg.d_model % n == 0


LM_WIDTHS = {"embed": "d_model", "norm": "d_model", "mlp": "d_ff", "heads": "n_heads",
             "vocab": "padded_vocab"}  # fmt: skip


@st.composite
def transformer_configs(draw):
    heads, head_dim = draw(st.integers(1, 20)), draw(st.sampled_from([8, 16, 64, 128]))
    tied = draw(st.booleans())  # d_model = heads x head_dim, as in every preset
    return TransformerConfig(
        vocab_size=draw(st.integers(1, 3000)),
        d_model=heads * head_dim if tied else draw(st.integers(1, 300)),
        n_heads=heads,
        head_dim=head_dim,
        d_ff=draw(st.integers(1, 900)),
        vocab_multiple=draw(st.sampled_from([1, 8, 128])),
    )


@given(transformer_configs(), strategies, mesh_shapes, st.sampled_from([1, 8, 128]))
def test_fit_to_mesh_makes_every_transformer_split_divide_and_keeps_heads_x_head_dim(
    cfg, names, shape, multiple
):
    fitted, note = fit_to_mesh(cfg, names, shape, multiple)
    assert_split_widths_divide(fitted, names, shape, LM_WIDTHS)
    if cfg.d_model == cfg.n_heads * cfg.head_dim:
        assert fitted.d_model == fitted.n_heads * fitted.head_dim
    for field in ("d_model", "d_ff", "n_heads", "padded_vocab"):
        before, after = getattr(cfg, field), getattr(fitted, field)
        assert after >= before
        assert (after != before) == (f"{field} {before} -> {after}" in note)
    same = ("vocab_size", "head_dim", "n_layers", "batch", "seq", "dtype", "param_dtype")
    assert all(getattr(fitted, f) == getattr(cfg, f) for f in same)
    assert (note == "") == (fitted == cfg)


@given(st.one_of(configs, transformer_configs()), st.sampled_from(["float32", "bfloat16"]))
def test_a_config_survives_json_and_is_described_by_its_model(cfg, dtype):
    cfg = dataclasses.replace(cfg, dtype=jnp.dtype(dtype))
    model = model_of(cfg)
    d = json.loads(json.dumps(config_dict(cfg)))
    assert config_from_dict(d, model) == cfg
    assert d["param_count"] == cfg.param_count() and d["dtype"] == dtype
    text = describe(cfg)
    assert text.startswith({"mlp": "MLPStack: ", "transformer": "TransformerLM: "}[model])
    assert f"d_model {cfg.d_model}," in text and f"d_ff {cfg.d_ff}" in text
    if model == "transformer":
        assert d["padded_vocab"] == cfg.padded_vocab and f"{cfg.n_heads} heads x" in text
        assert ("padded to" in text) == (cfg.padded_vocab != cfg.vocab_size)
    with pytest.raises(ValueError, match="but preset is a"):
        resolve_preset(cfg, jax.devices(), {"mlp": "transformer", "transformer": "mlp"}[model])
