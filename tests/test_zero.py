"""Tests of helpers.placing.zero: every ZeRO stage trains the model DP trains, and the compiled
program shows the collective that defines each stage."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from helpers import collective_stats, make_mesh, memory_per_device
from helpers.placing.models import ModelConfig, TransformerConfig
from helpers.placing.zero import ZERO_STAGES, init_zero, make_zero_train_step, zero_specs

CFG = TransformerConfig(batch=16)


def _data() -> tuple[jax.Array, jax.Array]:
    toks = jax.random.randint(jax.random.key(1), (CFG.batch, CFG.seq + 1), 0, CFG.vocab_size)
    return toks[:, :-1], toks[:, 1:]


def _train(stage: int, opt: optax.GradientTransformation, steps: int = 3):
    mesh = make_mesh((8,), ("data",))
    x, labels = _data()
    model = CFG.model()
    state = init_zero(model, x, mesh, jax.random.key(0), opt, stage)
    step = make_zero_train_step(model, opt, mesh, state, stage)
    compiled = step.lower(state.params, state.opt_state, x, labels).compile()
    held = memory_per_device(state.opt_state)
    params, opt_state, losses = state.params, state.opt_state, []
    for _ in range(steps):
        params, opt_state, loss = step(params, opt_state, x, labels)
        losses.append(float(loss))
    return params, losses, compiled, held


@pytest.fixture(scope="module")
def runs():
    return {s: _train(s, optax.sgd(0.1)) for s in ZERO_STAGES}


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_every_stage_trains_the_model_dp_trains(runs, stage):
    dp_params, dp_losses, *_ = runs[0]
    params, losses, *_ = runs[stage]
    np.testing.assert_allclose(losses, dp_losses, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(dp_params), jax.tree.leaves(params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-6)


def test_adam_losses_agree_with_dp(adam_runs):
    for stage in (1, 2, 3):
        np.testing.assert_allclose(adam_runs[stage][1], adam_runs[0][1], rtol=1e-5)


@pytest.fixture(scope="module")
def adam_runs():
    return {s: _train(s, optax.adam(1e-3), steps=1) for s in ZERO_STAGES}


def test_each_stage_compiles_its_collective(adam_runs):
    ops = {
        s: {k: v["ops"] for k, v in collective_stats(r[2]).items()} for s, r in adam_runs.items()
    }
    assert set(ops[0]) == {"all-reduce"}
    assert "reduce-scatter" not in ops[1] and ops[1]["all-reduce"] and ops[1]["all-gather"]
    assert ops[2]["reduce-scatter"] and ops[2]["all-gather"]
    assert "reduce-scatter" not in ops[3] and ops[3]["all-gather"]


def test_stage_1_shards_the_optimizer_state(adam_runs):
    dp_state = max(adam_runs[0][3].values())
    z1_state = max(adam_runs[1][3].values())
    assert z1_state < dp_state / 4  # most of Adam's state splits 8 ways; small arrays don't


def test_zero_specs_split_like_fsdp():
    mesh = make_mesh((8,), ("data",))
    x = jnp.zeros((8, 4, 64))
    cfg = ModelConfig(d_model=64, d_ff=128, n_layers=1, n_classes=8, batch=8, seq=4)
    params = jax.eval_shape(cfg.model().init, jax.random.key(0), x)["params"]
    specs = jax.tree.leaves(zero_specs(params, mesh), is_leaf=lambda s: hasattr(s, "index"))
    assert any("data" in tuple(s) for s in specs)


@pytest.mark.parametrize("stage", [-1, 4, "1", True, None])
def test_a_bad_stage_is_named(stage):
    mesh = make_mesh((8,), ("data",))
    with pytest.raises(ValueError, match="stage"):
        init_zero(CFG.model(), jnp.zeros((8, 4), jnp.int32), mesh, jax.random.key(0),
                  optax.sgd(0.1), stage)  # fmt: skip


def test_a_missing_axis_is_named():
    mesh = make_mesh((8,), ("model",))
    with pytest.raises(ValueError, match="axis='data'"):
        make_zero_train_step(CFG.model(), optax.sgd(0.1), mesh, None, 1)  # type: ignore[arg-type]
