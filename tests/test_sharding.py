import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from helpers import (
    LOGICAL_RULES,
    check_spec,
    fsdp_plan,
    fsdp_specs,
    logical_rules,
    make_mesh,
    shard_layout,
    shard_tree,
)
from helpers.placing.sharding import FSDPShardsNothingWarning


@pytest.fixture(scope="module")
def mesh():
    return make_mesh((4, 2), ("data", "model"))


def test_spec_longer_than_rank(mesh):
    with pytest.raises(
        ValueError,
        match=r"'bias' has shape \(128,\) \(rank 1\), but PartitionSpec\(None, None\) has 2 entries.*PartitionSpec\(\) to replicate",
    ):
        check_spec((128,), P(None, None), mesh, "bias")


def test_unknown_axis(mesh):
    with pytest.raises(
        ValueError,
        match=r"'w' \(shape \(8, 4\)\).*names mesh axis 'batch', but the mesh has axes \('data', 'model'\)",
    ):
        check_spec((8, 4), P("batch"), mesh, "w")


def test_indivisible_dimension(mesh):
    with pytest.raises(
        ValueError,
        match=r"'w' has shape \(6, 4\): dimension 0 has size 6, which mesh axis 'data' \(size 4\) does not divide",
    ):
        check_spec((6, 4), P("data", None), mesh, "w")


def test_indivisible_by_two_axes(mesh):
    with pytest.raises(
        ValueError, match=r"dimension 1 has size 12.*'data' \(size 4\) x 'model' \(size 2\)"
    ):
        check_spec((3, 12), P(None, ("data", "model")), mesh, "w")


def test_axis_used_twice(mesh):
    with pytest.raises(ValueError, match="uses mesh axis 'data' twice"):
        check_spec((8, 8), P("data", "data"), mesh, "w")


def test_spec_that_is_not_a_partition_spec(mesh):
    with pytest.raises(
        TypeError,
        match=r"'kernel' \(shape \(64, 16\)\): the spec \(None, 'model'\) is a tuple, not a "
        r"PartitionSpec; write P\(None, 'model'\)",
    ):
        check_spec((64, 16), (None, "model"), mesh, "kernel")
    with pytest.raises(TypeError, match=r"'b' \(shape \(16,\)\): the spec 'model' is a str"):
        check_spec((16,), "model", mesh, "b")


def test_valid_specs_pass(mesh):
    check_spec((), P(), mesh)
    check_spec((8, 6), P("data", "model"), mesh)
    check_spec((16,), P(("data", "model")), mesh)


def test_shard_tree_places_and_checks(mesh):
    tree = {"w": jnp.arange(64.0).reshape(8, 8), "b": jnp.ones(3)}
    out = shard_tree(tree, {"w": P("data", "model"), "b": P()}, mesh)
    assert out["w"].sharding.spec == P("data", "model")
    assert out["w"].addressable_shards[0].data.shape == (2, 4)
    np.testing.assert_array_equal(np.asarray(out["w"]), np.asarray(tree["w"]))
    with pytest.raises(ValueError, match="'b' has shape"):
        shard_tree(tree, {"w": P(), "b": P("data")}, mesh)


def test_shard_tree_non_array_leaf(mesh):
    with pytest.raises(ValueError, match=r"parameter 'cfg'.*type str is not an array"):
        shard_tree({"cfg": "hello"}, {"cfg": P()}, mesh)


def test_fsdp_picks_largest_divisible_dimension(mesh):
    tree = {
        "kernel": jax.ShapeDtypeStruct((6, 1024), jnp.float32),  # first dim does not divide 4
        "square": jax.ShapeDtypeStruct((128, 64), jnp.float32),
        "bias": jax.ShapeDtypeStruct((1024,), jnp.float32),
        "odd": jax.ShapeDtypeStruct((5, 1001), jnp.float32),
    }
    specs = fsdp_specs(tree, mesh, "data", min_size=2000)
    assert specs["kernel"] == P(None, "data")
    assert specs["square"] == P("data")
    assert specs["bias"] == P()  # 1024 < min_size
    assert specs["odd"] == P()  # nothing divides
    reasons = {c.path: c.reason for c in fsdp_plan(tree, mesh, "data", min_size=2000)}
    assert "1024 elements < min_size=2000" in reasons["bias"]
    assert "divides no free dimension" in reasons["odd"]
    assert reasons["kernel"] == "dim 1 (size 1024) split 4 ways"


def test_fsdp_over_two_axes_and_base_specs(mesh):
    tree = {"w": jax.ShapeDtypeStruct((64, 32), jnp.float32)}
    assert fsdp_specs(tree, mesh, ("data", "model"), min_size=1)["w"] == P(("data", "model"))
    base = {"w": P("model")}
    assert fsdp_specs(tree, mesh, "data", min_size=1, base_specs=base)["w"] == P("model", "data")


def test_fsdp_unknown_axis(mesh):
    with pytest.raises(ValueError, match="axis 'fsdp' is not a mesh axis"):
        fsdp_specs({"w": jnp.ones((8, 8))}, mesh, "fsdp")


def test_logical_rules_presets():
    assert set(LOGICAL_RULES) == {"dp", "fsdp", "fsdp_all", "tp", "hybrid", "fsdp_tp", "tp_sp"}
    assert dict(logical_rules("fsdp"))["embed"] == "data"
    assert dict(logical_rules("tp"))["mlp"] == "model"
    assert dict(logical_rules("dp"))["embed"] is None
    with pytest.raises(ValueError, match="strategy='zero3' is not one of"):
        logical_rules("zero3")


def test_shard_layout_blocks_and_replicas(mesh):
    blocks = shard_layout((8, 6), NamedSharding(mesh, P("data")))
    assert len(blocks) == 4
    assert [b.start for b in blocks] == [(0, 0), (2, 0), (4, 0), (6, 0)]
    assert blocks[0].shape == (2, 6)
    assert blocks[0].devices == (0, 1)  # replicated over the 'model' axis
    (whole,) = shard_layout((3,), NamedSharding(mesh, P()))
    assert whole.devices == tuple(range(8)) and whole.shape == (3,)


# --- FSDP that shards nothing must say so -----------------------------------------------


@pytest.fixture(scope="module")
def mesh3():
    return make_mesh((3,), ("data",), devices=jax.devices()[:3])


def test_fsdp_plan_says_when_nothing_is_sharded(mesh3):
    tree = {
        "w": jax.ShapeDtypeStruct((64, 128), jnp.float32),  # 3 divides neither dimension
        "b": jax.ShapeDtypeStruct((64,), jnp.float32),  # below min_size
    }
    plan = {c.path: c for c in fsdp_plan(tree, mesh3)}
    assert plan["w"].spec == P() and plan["b"].spec == P()
    for choice in plan.values():
        assert "FSDP shards none of the 2 arrays" in choice.reason
        assert "data parallelism, not FSDP" in choice.reason
    assert plan["w"].reason.startswith(
        "replicated: 3 divides no free dimension (dim 0=64, dim 1=128)"
    )
    assert (
        "3 divides no free dimension of the 1 array with at least 4096 elements" in plan["b"].reason
    )
    assert "the other 1 array is smaller" in plan["b"].reason
    with pytest.warns(
        FSDPShardsNothingWarning, match=r"FSDP shards none of the 2 arrays.*not FSDP"
    ):
        specs = fsdp_specs(tree, mesh3)
    assert specs == {"w": P(), "b": P()}


def test_fsdp_all_arrays_too_small_and_axis_of_size_one(mesh):
    small = {"b": jax.ShapeDtypeStruct((512,), jnp.float32)}
    with pytest.warns(
        FSDPShardsNothingWarning, match="each of the 1 array has fewer than min_size"
    ):
        fsdp_specs(small, mesh, "data")
    one = make_mesh((1, 8), ("data", "model"))  # 8 devices, but FSDP's axis has size 1
    with pytest.warns(FSDPShardsNothingWarning, match="axis 'data' has size 1"):
        fsdp_specs({"w": jax.ShapeDtypeStruct((64, 64), jnp.float32)}, one, "data")


def test_fsdp_does_not_warn_when_something_is_sharded_or_on_one_device(mesh3):
    tree = {
        "w": jax.ShapeDtypeStruct((64, 96), jnp.float32),  # 96 = 3 x 32
        "odd": jax.ShapeDtypeStruct((64, 128), jnp.float32),
    }
    single = make_mesh((1,), ("data",), devices=jax.devices()[:1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fsdp_specs(tree, mesh3) == {"w": P(None, "data"), "odd": P()}
        assert fsdp_specs(tree, single) == {
            "w": P(),
            "odd": P(),
        }  # one device: nothing to warn about
    reasons = [c.reason for c in fsdp_plan(tree, mesh3)]
    assert not any("FSDP shards none" in r for r in reasons)
    (one_device,) = {c.reason for c in fsdp_plan({"w": tree["w"]}, single)}
    assert "axis size is 1" in one_device and "FSDP shards none of the 1 array" in one_device


def test_fsdp_checks_base_specs(mesh3):
    tree = {"w": jax.ShapeDtypeStruct((64, 96), jnp.float32)}
    with pytest.raises(
        ValueError,
        match=r"'w' has shape \(64, 96\): dimension 0 has size 64, which mesh axis 'data' \(size 3\)",
    ):
        fsdp_plan(tree, mesh3, base_specs={"w": P("data")})


def test_shard_tree_needs_the_tree_structure(mesh):
    tree = {"a": jnp.ones((8, 2)), "b": jnp.ones(3)}
    with pytest.raises(ValueError, match="specs must have the structure of the tree"):
        shard_tree(tree, [P("data"), P()], mesh)
    with pytest.raises(
        ValueError,
        match=r"'a' has shape \(8, 2\): dimension 1 has size 2, which mesh axis "
        r"'data' \(size 4\) x 'model' \(size 2\) does not divide",
    ):
        shard_tree(tree, {"a": P(None, ("data", "model")), "b": P()}, mesh)


# ---------------------------------------------------------------------------
# Conventional logical names, and the names no rule maps
# ---------------------------------------------------------------------------


def test_every_preset_maps_every_conventional_name_once():
    from helpers.placing.sharding import LOGICAL_NAMES

    for strategy, rules in LOGICAL_RULES.items():
        assert [name for name, _ in rules] == list(LOGICAL_NAMES), strategy
    for name in ("batch", "length", "embed", "mlp", "heads", "kv", "vocab", "norm"):
        assert name in LOGICAL_NAMES
    tp = dict(logical_rules("tp"))
    assert tp["heads"] == tp["mlp"] == tp["vocab"] == "model" and tp["kv"] is None
    assert dict(logical_rules("fsdp_all"))["norm"] == "data"
    assert dict(logical_rules("fsdp"))["norm"] is None


def test_rule_order_decides_who_gets_a_mesh_axis():
    """Flax gives a mesh axis to the first rule that asks for it: under tp_sp the heads of
    an attention activation win over its length, and a residual activation, which has no
    heads, is split along its length. Under fsdp, the batch wins over embed."""
    import flax.linen as nn

    tp_sp = logical_rules("tp_sp")
    assert nn.logical_to_mesh_axes(("batch", "length", "heads", "kv"), tp_sp) == P(
        None, None, "model", None
    )
    assert nn.logical_to_mesh_axes(("batch", "length", "embed"), tp_sp) == P(None, "model", None)
    assert nn.logical_to_mesh_axes(("batch", "length", "vocab"), tp_sp) == P(None, None, "model")
    fsdp = logical_rules("fsdp")
    assert nn.logical_to_mesh_axes(("batch", "length", "embed"), fsdp) == P("data", None, None)
    assert nn.logical_to_mesh_axes(("embed", "heads", "kv"), fsdp) == P("data", None, None)


class _ForeignModel:
    """A model that names its dimensions its own way: 'hidden' and 'features' are in no preset."""

    @staticmethod
    def build():
        import flax.linen as nn

        class Foreign(nn.Module):
            @nn.compact
            def __call__(self, x):
                init = nn.initializers.lecun_normal()
                x = nn.Dense(32, kernel_init=nn.with_logical_partitioning(init, ("embed", "hidden")),
                             bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("hidden",)),
                             name="wi")(x)  # fmt: skip
                return nn.Dense(16, kernel_init=nn.with_logical_partitioning(init, ("hidden", "features")),
                                use_bias=False, name="wo")(x)  # fmt: skip

        return Foreign()


def test_unmapped_names_of_a_model_outside_the_presets():
    import flax.linen as nn

    from helpers.placing.sharding import format_unmapped, logical_names, unmapped_logical_names

    model, x = _ForeignModel.build(), jnp.ones((8, 16))
    abstract = jax.eval_shape(model.init, jax.random.key(0), x)
    assert logical_names(abstract) == {
        "embed": ("params/wi/kernel",),
        "hidden": ("params/wi/bias", "params/wi/kernel", "params/wo/kernel"),
        "features": ("params/wo/kernel",),
    }
    want = {
        "hidden": ("params/wi/bias", "params/wi/kernel", "params/wo/kernel"),
        "features": ("params/wo/kernel",),
    }
    for strategy in LOGICAL_RULES:
        assert unmapped_logical_names(abstract, strategy) == want
    # The same from the logical PartitionSpecs, and from explicit rules.
    specs = nn.get_partition_spec(abstract)
    assert unmapped_logical_names(specs, "fsdp") == want
    rules = (*logical_rules("fsdp"), ("hidden", "data"), ("features", None))
    assert unmapped_logical_names(abstract, rules) == {}
    assert format_unmapped(want).splitlines() == [
        "'hidden' (3 parameters: params/wi/bias, params/wi/kernel, ...)",
        "'features' (1 parameter: params/wo/kernel)",
    ]
    assert format_unmapped({}) == "every logical name has a rule"
    with pytest.raises(ValueError, match="strategy='zero3'"):
        unmapped_logical_names(abstract, "zero3")


def test_applying_a_preset_through_the_helpers_warns_about_unmapped_names():
    from helpers.placing.sharding import UnmappedLogicalNameWarning
    from helpers.placing.train import param_shardings

    model, x = _ForeignModel.build(), jnp.ones((8, 16))
    mesh = make_mesh((8, 1), ("data", "model"))
    with pytest.warns(
        UnmappedLogicalNameWarning, match=r"'hidden', 'features'.*whole on every device"
    ):
        shardings = param_shardings(model, x, mesh, "fsdp")
    # What Flax did with them, silently: 'hidden' and 'features' split over nothing.
    assert shardings["wi"]["kernel"].spec == P("data", None)
    assert shardings["wo"]["kernel"].spec == P(None, None)


def test_the_series_models_use_only_names_every_preset_maps():
    from helpers.placing.models import (
        ModelConfig,
        TransformerConfig,
        synthetic_batch,
        synthetic_tokens,
    )
    from helpers.placing.sharding import unmapped_logical_names

    cfg = TransformerConfig(n_layers=1, batch=2, seq=4)
    tokens, _ = synthetic_tokens(jax.random.key(0), cfg)
    for c, x in [
        (cfg, tokens),
        (ModelConfig(batch=2), synthetic_batch(jax.random.key(0), ModelConfig(batch=2))[0]),
    ]:
        abstract = jax.eval_shape(c.model().init, jax.random.key(0), x)
        for strategy in LOGICAL_RULES:
            assert unmapped_logical_names(abstract, strategy) == {}, (c, strategy)


def test_param_order_is_the_order_flax_creates_parameters():
    from helpers.placing.models import (
        ModelConfig,
        TransformerConfig,
        synthetic_batch,
        synthetic_tokens,
    )
    from helpers.placing.sharding import param_order

    mcfg = ModelConfig(n_layers=2, batch=2)
    x, _ = synthetic_batch(jax.random.key(0), mcfg)
    order = param_order(mcfg.model(), x)
    assert order[:6] == [
        "block_0/LayerNorm_0/scale", "block_0/LayerNorm_0/bias", "block_0/up/kernel",
        "block_0/up/bias", "block_0/down/kernel", "block_0/down/bias",
    ]  # fmt: skip
    assert order[-4:] == ["final_norm/scale", "final_norm/bias", "head/kernel", "head/bias"]
    tcfg = TransformerConfig(n_layers=11, batch=2, seq=4)
    tokens, _ = synthetic_tokens(jax.random.key(0), tcfg)
    order = param_order(tcfg.model(), tokens)
    assert order[0] == "token_embed/embedding" and order[-1] == "lm_head/kernel"
    assert order[1:11] == [
        f"block_0/{n}" for n in (
            "attn_norm/scale", "attn_norm/bias", "attn/query/kernel", "attn/key/kernel",
            "attn/value/kernel", "attn/out/kernel", "mlp_norm/scale", "mlp_norm/bias",
            "mlp/up/kernel", "mlp/down/kernel",
        )
    ]  # fmt: skip
    blocks = [p.split("/")[0] for p in order if p.startswith("block_")][::10]
    assert blocks == [f"block_{i}" for i in range(11)]  # block_2 before block_10
    with pytest.raises(ValueError, match="no 'batch_stats' collection"):
        param_order(tcfg.model(), tokens, collection="batch_stats")
