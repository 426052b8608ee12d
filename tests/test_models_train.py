import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from helpers import make_mesh, memory_per_device
from helpers.measuring.profile import compare_strategies
from helpers.placing.models import (
    MarkovLanguage,
    ModelConfig,
    TransformerConfig,
    TransformerLM,
    cross_entropy,
    padded_vocab_size,
    synthetic_batch,
    synthetic_tokens,
)
from helpers.placing.train import init_sharded, make_train_step, param_shardings

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
    _assert_same_training(params, losses, dp_params, dp_losses)


def _assert_same_training(params, losses, ref_params, ref_losses):
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for a, b in zip(
        jax.tree.leaves(jax.device_get(params)),
        jax.tree.leaves(jax.device_get(ref_params)),
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


# ---------------------------------------------------------------------------
# The Transformer language model
# ---------------------------------------------------------------------------

TCFG = TransformerConfig(n_layers=1, n_heads=8, batch=16, seq=8, vocab_multiple=1024)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_transformer_param_count_formula_matches_init(scan_layers):
    cfg = dataclasses.replace(TCFG, n_layers=3, scan_layers=scan_layers)
    tokens, _ = synthetic_tokens(jax.random.key(0), cfg)
    params = jax.eval_shape(cfg.model().init, jax.random.key(0), tokens)["params"]
    assert sum(np.prod(x.shape) for x in jax.tree.leaves(params)) == cfg.param_count()
    if scan_layers:  # stacked under "blocks", with a leading "layers" dimension
        q = params["blocks"]["block"]["attn"]["query"]["kernel"]
        assert q.names == ("layers", "embed", "heads", "kv") and q.value.shape == (3, 64, 8, 16)


def test_transformer_flops_formula_against_xla():
    """6·N·tokens for the matmul parameters plus PaLM's 12·L·H·Q·T per token for attention:
    XLA's own count of the gradient (the same matmuls, plus its elementwise work) lands
    just above it."""
    from helpers import compat

    cfg = dataclasses.replace(TCFG, seq=64, batch=4)
    model = cfg.model()
    tokens, targets = synthetic_tokens(jax.random.key(0), cfg)
    params = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), tokens))["params"]

    def loss(p):
        return cross_entropy(model.apply({"params": p}, tokens), targets)

    flops = compat.cost_flops(jax.jit(jax.grad(loss)).lower(params).compile())
    if flops is None:
        pytest.skip("this backend has no cost analysis")
    assert 1.0 <= flops / cfg.train_flops_per_step() < 1.1
    attention = 12 * cfg.n_layers * cfg.n_heads * cfg.head_dim * cfg.seq * cfg.batch * cfg.seq
    assert cfg.train_flops_per_step() == 6 * cfg.matmul_params() * cfg.batch * cfg.seq + attention


def test_padded_vocabulary_and_its_masked_logits():
    assert padded_vocab_size(1003, 128) == 1024 and padded_vocab_size(50257, 128 * 8) == 51200
    assert padded_vocab_size(1024, 1024) == 1024
    with pytest.raises(ValueError, match="multiple=0"):
        padded_vocab_size(1003, 0)
    cfg = dataclasses.replace(TCFG, n_layers=1)
    assert cfg.padded_vocab == 1024
    tokens, _ = synthetic_tokens(jax.random.key(0), cfg)
    model = cfg.model()
    logits = model.apply(model.init(jax.random.key(0), tokens), tokens)
    assert logits.shape == (16, 8, 1024)
    assert bool(jnp.all(logits[..., 1003:] == -1e9)) and bool(jnp.all(logits[..., :1003] > -1e8))
    with pytest.raises(ValueError, match="padded_vocab=10 is smaller than vocab_size=1003"):
        TransformerLM(padded_vocab=10).init(jax.random.key(0), tokens)


def test_markov_language_is_learnable_and_fixed():
    lang = MarkovLanguage(50, branching=4)
    assert lang.probs.tolist() == pytest.approx([8 / 15, 4 / 15, 2 / 15, 1 / 15])
    assert lang.entropy() == pytest.approx(-(lang.probs * np.log(lang.probs)).sum())
    tokens = np.asarray(lang.sample(jax.random.key(0), 64, 20))
    assert tokens.shape == (64, 20) and tokens.dtype == np.int32
    for row in tokens:  # every next token is one of the previous token's successors
        for a, b in zip(row[:-1], row[1:], strict=True):
            assert b in lang.successors[a]
    again = np.asarray(MarkovLanguage(50, branching=4).sample(jax.random.key(0), 64, 20))
    np.testing.assert_array_equal(tokens, again)
    cfg = dataclasses.replace(TCFG, vocab_size=50)
    inputs, targets = synthetic_tokens(jax.random.key(1), cfg)
    np.testing.assert_array_equal(np.asarray(inputs)[:, 1:], np.asarray(targets)[:, :-1])
    with pytest.raises(ValueError, match="branching=0"):
        MarkovLanguage(50, branching=0)


def _train_lm(strategy, shape, steps=2):
    mesh = make_mesh(shape, ("data", "model"))
    opt = optax.adam(3e-3)
    model = TCFG.model()
    x, y = synthetic_tokens(jax.random.key(0), TCFG)
    state = init_sharded(model, x, mesh, strategy, jax.random.key(0), opt)
    step = make_train_step(model, opt, mesh, state, strategy)
    params, opt_state, losses = state.params, state.opt_state, []
    for i in range(steps):
        xb, yb = synthetic_tokens(jax.random.key(i + 1), TCFG)
        params, opt_state, loss = step(params, opt_state, xb, yb)
        losses.append(float(loss))
    return params, losses


def test_transformer_tensor_parallel_trains_like_data_parallel():
    """Integer token batches go through init_sharded and make_train_step unchanged; heads,
    MLP width and vocabulary split over "model" (DenseGeneral's 3-D kernels included)
    give DP's losses and parameters."""
    dp_params, dp_losses = _train_lm("dp", (8, 1))
    tp_params, tp_losses = _train_lm("tp", (1, 8))
    q = tp_params["block_0"]["attn"]["query"]["kernel"]
    assert q.sharding.spec == jax.sharding.PartitionSpec(None, "model", None)
    assert tp_params["lm_head"]["kernel"].sharding.spec == jax.sharding.PartitionSpec(None, "model")
    _assert_same_training(tp_params, tp_losses, dp_params, dp_losses)


@pytest.mark.parametrize(("remat", "scan_layers"), [(True, False), (False, True), (True, True)])
def test_mlp_stack_remat_and_scan_compute_the_unrolled_model(remat, scan_layers):
    """remat recomputes, scan stacks the blocks: neither changes the function or its gradient."""
    cfg = dataclasses.replace(CFG, n_layers=3)
    x, y = synthetic_batch(jax.random.key(0), cfg)
    plain = nn.meta.unbox(cfg.model().init(jax.random.key(0), x))["params"]
    variant = dataclasses.replace(cfg, remat=remat, scan_layers=scan_layers).model()
    params = plain
    if scan_layers:  # the same numbers, stacked along a leading "layers" dimension
        blocks = [plain[f"block_{i}"] for i in range(cfg.n_layers)]
        params = {k: v for k, v in plain.items() if not k.startswith("block_")}
        params["blocks"] = {"block": jax.tree.map(lambda *a: jnp.stack(a), *blocks)}
        boxed = jax.eval_shape(variant.init, jax.random.key(0), x)["params"]
        up = boxed["blocks"]["block"]["up"]["kernel"]
        assert up.names == ("layers", "embed", "mlp") and up.value.shape[0] == cfg.n_layers
    assert jax.tree.structure(params) == jax.tree.structure(
        nn.meta.unbox(jax.eval_shape(variant.init, jax.random.key(0), x))["params"]
    )

    def loss(model, p):
        return cross_entropy(model.apply({"params": p}, x), y)

    want, want_grad = jax.value_and_grad(lambda p: loss(cfg.model(), p))(plain)
    got, got_grad = jax.value_and_grad(lambda p: loss(variant, p))(params)
    np.testing.assert_allclose(float(got), float(want), rtol=1e-6)
    if scan_layers:
        want_grad = {k: v for k, v in want_grad.items() if not k.startswith("block_")} | {
            "blocks": {
                "block": jax.tree.map(
                    lambda *a: jnp.stack(a), *[want_grad[f"block_{i}"] for i in range(3)]
                )
            }
        }
    for a, b in zip(jax.tree.leaves(got_grad), jax.tree.leaves(want_grad), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_adam_move_bound_is_jensens_sum_and_holds_for_optax_adam():
    import numpy as np
    import optax

    from helpers import adam_move_bound

    assert adam_move_bound(1.0, 1) == pytest.approx(1.0)
    assert adam_move_bound(1.0, 3) == pytest.approx(1 + 1.0257 + 1.0516, abs=1e-3)
    rng = np.random.default_rng(0)
    tx, lr, steps = optax.adam(1e-2), 1e-2, 3
    p = jnp.zeros(1000)
    state = tx.init(p)
    for _ in range(steps):  # gradients of any sign and size, the worst case for the bound
        g = jnp.asarray(rng.standard_normal(1000) * 10.0 ** rng.integers(-9, 3, 1000))
        updates, state = tx.update(g, state, p)
        p = optax.apply_updates(p, updates)
    assert float(jnp.abs(p).max()) <= adam_move_bound(lr, steps) + 1e-7
    with pytest.raises(ValueError, match="steps"):
        adam_move_bound(1e-3, 0)
