import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from helpers import make_mesh, memory_per_device
from helpers.models import ModelConfig, cross_entropy, synthetic_batch
from helpers.train import init_sharded, make_train_step

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
