import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from helpers import make_mesh, memory_per_device
from helpers.models import ModelConfig, cross_entropy, synthetic_batch
from helpers.profile import compare_strategies
from helpers.train import init_sharded, make_train_step, param_shardings

CFG = ModelConfig(d_model=64, d_ff=128, n_layers=1, n_classes=8, batch=16, seq=4)


def test_param_count_formula_matches_init():
    params = jax.eval_shape(
        CFG.model().init, jax.random.key(0), jnp.ones((2, CFG.seq, CFG.d_model))
    )
    n = sum(np.prod(x.shape) for x in jax.tree.leaves(params))
    assert n == CFG.param_count()


def test_synthetic_batch_shapes_and_determinism():
    x, y = synthetic_batch(jax.random.key(3), CFG)
    assert x.shape == (16, 4, 64) and y.shape == (16, 4) and y.dtype == jnp.int32
    x2, y2 = synthetic_batch(jax.random.key(3), CFG)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(y2))
    assert int(y.max()) < CFG.n_classes


def test_cross_entropy_of_uniform_logits():
    assert float(
        cross_entropy(jnp.zeros((2, 3, 8)), jnp.zeros((2, 3), jnp.int32))
    ) == pytest.approx(np.log(8))


def _train(strategy, shape, steps=3):
    mesh = make_mesh(shape, ("data", "model"))
    opt = optax.adam(1e-2)
    x, y = synthetic_batch(jax.random.key(0), CFG)
    state = init_sharded(CFG.model(), x, mesh, strategy, jax.random.key(0), opt)
    step = make_train_step(CFG.model(), opt, mesh, state, strategy)
    params, opt_state, losses = state.params, state.opt_state, []
    for i in range(steps):
        xb, yb = synthetic_batch(jax.random.key(i + 1), CFG)
        params, opt_state, loss = step(params, opt_state, xb, yb)
        losses.append(float(loss))
    return state, params, opt_state, losses


@pytest.fixture(scope="module")
def dp_run():
    return _train("dp", (8, 1))


def test_fsdp_shards_params_and_adam_state(dp_run):
    state, params, opt_state, _ = _train("fsdp", (8, 1), steps=1)
    kernel = params["block_0"]["up"]["kernel"]
    assert kernel.sharding.spec == jax.sharding.PartitionSpec("data", None)
    dp_bytes = max(memory_per_device(dp_run[1]).values())
    fsdp_bytes = max(memory_per_device(params).values())
    assert fsdp_bytes < dp_bytes / 4
    mu = opt_state[0].mu["block_0"]["up"]["kernel"]
    assert mu.sharding.spec == kernel.sharding.spec


@pytest.mark.parametrize(
    ("strategy", "shape"), [("fsdp", (8, 1)), ("tp", (1, 8)), ("hybrid", (4, 2))]
)
def test_strategies_train_the_same_model(dp_run, strategy, shape):
    _, dp_params, _, dp_losses = dp_run
    _, params, _, losses = _train(strategy, shape)
    np.testing.assert_allclose(losses, dp_losses, rtol=1e-5)
    for a, b in zip(
        jax.tree.leaves(jax.device_get(params)),
        jax.tree.leaves(jax.device_get(dp_params)),
        strict=True,
    ):
        np.testing.assert_allclose(a, b, atol=1e-4)


def test_loss_falls(dp_run):
    losses = dp_run[3]
    assert losses[-1] < losses[0]


# --- every path that places parameters checks their specs first -----------------------

# d_model = 64 is not a multiple of 3: FSDP's "embed" split over a 3-device "data" axis
# cannot place the kernels. Every path must say which parameter, its shape and the axis.
ODD = ModelConfig(d_model=64, d_ff=192, n_layers=1, n_classes=8, batch=6, seq=4)
ODD_MESSAGE = (
    r"param_shardings: 'block_0/down/kernel' has shape \(192, 64\): dimension 1 has size 64, "
    r"which mesh axis 'data' \(size 3\) does not divide \(64 % 3 = 1\)\. Its logical axes "
    r"\('mlp', 'embed'\) map to PartitionSpec\(None, 'data'\)"
)


@pytest.fixture(scope="module")
def mesh3():
    return make_mesh((3, 1), ("data", "model"), devices=jax.devices()[:3])


def test_param_shardings_names_the_parameter_that_cannot_be_placed(mesh3):
    x = jnp.zeros((3, ODD.seq, ODD.d_model))
    with pytest.raises(ValueError, match=ODD_MESSAGE):
        param_shardings(ODD.model(), x, mesh3, "fsdp")
    # The same model under DP places fine: nothing is split.
    specs = param_shardings(ODD.model(), x, mesh3, "dp")
    assert all(all(e is None for e in s.spec) for s in jax.tree.leaves(specs))


def test_init_sharded_fails_before_placing(mesh3):
    x = jnp.zeros((3, ODD.seq, ODD.d_model))
    with pytest.raises(ValueError, match=ODD_MESSAGE):
        init_sharded(ODD.model(), x, mesh3, "fsdp", jax.random.key(0), optax.adam(1e-3))


def test_compare_strategies_fails_with_the_same_message():
    with pytest.raises(ValueError, match=ODD_MESSAGE):
        compare_strategies(
            ("fsdp",),
            preset=dataclasses.replace(ODD, batch=2),
            devices=jax.devices()[:3],
            dry_run=True,
            progress=False,
        )


def test_param_shardings_names_a_missing_mesh_axis():
    mesh = make_mesh((8,), ("data",))
    x = jnp.zeros((8, CFG.seq, CFG.d_model))
    with pytest.raises(
        ValueError,
        match=r"'block_0/down/kernel' \(shape \(128, 64\)\): PartitionSpec\('model', None\) names "
        r"mesh axis 'model', but the mesh has axes \('data',\).*build the mesh with axis 'model'",
    ):
        param_shardings(CFG.model(), x, mesh, "tp")


def test_train_step_checks_the_batch(mesh3):
    cfg = dataclasses.replace(ODD, d_model=48)  # 48 = 3 x 16: FSDP places it
    x, y = synthetic_batch(jax.random.key(0), cfg)  # batch 6 splits 3 ways
    opt = optax.adam(1e-3)
    state = init_sharded(cfg.model(), x, mesh3, "fsdp", jax.random.key(0), opt)
    step = make_train_step(cfg.model(), opt, mesh3, state, "fsdp", donate=False)
    _, _, loss = step(state.params, state.opt_state, x, y)
    assert np.isfinite(float(loss))
    x4, y4 = synthetic_batch(jax.random.key(1), cfg, batch=4)
    match = r"'the batch x' has shape \(4, 4, 48\): dimension 0 has size 4, which mesh axis 'data' \(size 3\)"
    with pytest.raises(ValueError, match=match):
        step(state.params, state.opt_state, x4, y4)
    with pytest.raises(ValueError, match=match):
        step.lower(state.params, state.opt_state, x4, y4)
