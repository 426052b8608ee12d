"""Unit tests of helpers.parallelism.experts and helpers.drawing.draw_experts: routing, dispatch, the MoE layer."""

from __future__ import annotations

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from helpers import UnmappedLogicalNameWarning, logical_rules, make_mesh
from helpers.compat import set_mesh
from helpers.drawing.draw import device_color
from helpers.drawing.draw_experts import draw_routing
from helpers.parallelism.experts import (
    MoEMLP,
    MoESpec,
    Routing,
    dispatch_weights,
    expert_capacity,
    expert_parallel_mlp,
    route,
)
from helpers.placing.models import TransformerConfig
from helpers.placing.train import param_shardings


def test_capacity_is_the_rounded_up_even_share():
    assert expert_capacity(16, 4, 2, 1.0) == 8
    assert expert_capacity(16, 16, 2, 1.25) == 3
    assert expert_capacity(3, 8, 1, 0.1) == 1


def test_route_hands_out_slots_first_choices_first():
    logits = jnp.array([[3.0, 2.0, 0.0], [3.0, 0.0, 2.0], [3.0, 2.0, 1.0]])
    r = route(logits, k=2, capacity=2)
    assert r.expert.tolist() == [[0, 1], [0, 2], [0, 1]]
    # expert 0: the three first choices take slots 0, 1, 2; the third is dropped
    assert r.slot.tolist() == [[0, 0], [1, 0], [2, 1]]
    assert r.kept.tolist() == [[True, True], [True, True], [False, True]]
    np.testing.assert_allclose(r.gate.sum(-1), 1, rtol=1e-6)
    np.testing.assert_allclose(r.gate[0], jax.nn.softmax(jnp.array([3.0, 2.0])), rtol=1e-6)


def test_dispatch_and_combine_place_each_kept_choice_once():
    logits = jax.random.normal(jax.random.key(0), (10, 4))
    r = route(logits, 2, 3)
    dispatch, combine = dispatch_weights(r, 4, 3)
    assert dispatch.shape == combine.shape == (10, 4, 3)
    assert float(dispatch.sum()) == float(r.kept.sum())
    assert float(dispatch.sum(axis=0).max()) <= 1  # one token per slot
    np.testing.assert_allclose(combine.sum(axis=(1, 2)), (r.gate * r.kept).sum(-1), rtol=1e-6)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: expert_capacity(0, 4, 1, 1.0), "tokens=0"),
        (lambda: expert_capacity(8, 4, 5, 1.0), "k=5 must be at most n_experts=4"),
        (lambda: expert_capacity(8, 4, 1, 0), "capacity_factor=0"),
        (lambda: expert_capacity(8, 4, 1, "1"), "capacity_factor='1'"),
        (lambda: route(jnp.zeros(4), 1, 1), "logits must be a"),
        (lambda: route(jnp.zeros((4, 3)), 4, 1), "k=4 must be at most the 3 experts"),
        (lambda: route(jnp.zeros((4, 3)), 1, 0), "capacity=0"),
        (lambda: route(jnp.zeros((4, 3)), 1.5, 1), "k=1.5"),
        (lambda: dispatch_weights((1, 2), 3, 1), "routing must be what route"),
        (lambda: MoESpec(n_experts=2, k=3), "k=3 must be at most"),
    ],
)
def test_bad_input_gets_the_series_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def _layer_inputs(n_experts=4, batch=4, length=8, d=8, h=16, seed=0):
    kx, kr, ki, ko = jax.random.split(jax.random.key(seed), 4)
    return (
        jax.random.normal(kx, (batch, length, d)),
        jax.random.normal(kr, (d, n_experts)),
        jax.random.normal(ki, (n_experts, d, h)) / np.sqrt(d),
        jax.random.normal(ko, (n_experts, h, d)) / np.sqrt(h),
    )


def _dense(x, router, wi, wo, k, capacity):
    r = jax.vmap(lambda lg: route(lg, k, capacity))(x @ router)
    every = jnp.einsum("bseh,ehd->bsed", nn.gelu(jnp.einsum("bsd,edh->bseh", x, wi)), wo)
    chosen = jnp.take_along_axis(every, r.expert[..., None], axis=2)
    return (chosen * (r.gate * r.kept)[..., None]).sum(axis=2)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_expert_parallel_mlp_equals_the_dense_reference(n):
    x, router, wi, wo = _layer_inputs()
    mesh = make_mesh((n,), ("expert",))
    f = jax.shard_map(
        lambda *a: expert_parallel_mlp(*a, k=2, capacity=3, axis_name="expert"),
        mesh=mesh,
        in_specs=(P("expert"), P(), P("expert"), P("expert")),
        out_specs=P("expert"),
    )
    np.testing.assert_allclose(
        jax.jit(f)(x, router, wi, wo), _dense(x, router, wi, wo, 2, 3), atol=1e-5
    )


def test_expert_parallel_mlp_needs_an_axis_when_experts_are_split():
    x, router, wi, wo = _layer_inputs()
    with pytest.raises(ValueError, match="axis_name must name the mesh axis"):
        expert_parallel_mlp(x, router, wi[:2], wo[:2], k=2, capacity=3)
    with pytest.raises(ValueError, match="must be a multiple"):
        expert_parallel_mlp(x, router, wi[:3], wo[:3], k=2, capacity=3)


def test_moe_layer_with_and_without_an_expert_rule():
    x, router, wi, wo = _layer_inputs()
    layer = MoEMLP(MoESpec(4, 2, 1.25), 16)
    params = {"router": router, "wi": wi, "wo": wo}
    want = _dense(x, router, wi, wo, 2, expert_capacity(8, 4, 2, 1.25))
    np.testing.assert_allclose(layer.apply({"params": params}, x), want, atol=1e-5)
    mesh = make_mesh((1, 2), ("data", "expert"))
    changes = {"batch": ("data", "expert"), "expert": "expert"}
    rules = tuple((name, changes.get(name, axes)) for name, axes in logical_rules("dp"))
    shardings = param_shardings(layer, x, mesh, rules)
    assert shardings["wi"].spec == P("expert", None, None)
    with set_mesh(mesh), nn.logical_axis_rules(rules):
        out = jax.jit(lambda p, x: layer.apply({"params": p}, x))(params, x)
    np.testing.assert_allclose(out, want, atol=1e-5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        param_shardings(layer, x, mesh, tuple(r for r in rules if r[0] != "expert"))
    assert any(issubclass(w.category, UnmappedLogicalNameWarning) for w in caught)


def test_transformer_without_moe_is_unchanged_and_with_moe_has_experts():
    cfg = TransformerConfig(vocab_size=32, d_model=16, n_heads=2, head_dim=8, d_ff=32, n_layers=1)
    tokens = jnp.zeros((2, 8), jnp.int32)
    plain = jax.eval_shape(cfg.model().init, jax.random.key(0), tokens)["params"]
    assert set(plain["block_0"]["mlp"]) == {"up", "down"}
    moe = cfg.model().clone(moe=MoESpec(4, 2, 1.0))
    params = jax.eval_shape(moe.init, jax.random.key(0), tokens)["params"]
    assert set(params["block_0"]["mlp"]) == {"router", "wi", "wo"}
    assert params["block_0"]["mlp"]["wi"].names == ("expert", "embed", "mlp")


def test_draw_routing_colours_tokens_and_experts_by_device():
    r = Routing(
        expert=jnp.array([[0, 3], [1, 2], [3, 0], [2, 1]]),
        gate=jnp.full((4, 2), 0.5),
        slot=jnp.zeros((4, 2), jnp.int32),
        kept=jnp.array([[True, False], [True, True], [True, True], [False, True]]),
    )
    fig = draw_routing(r.expert, r.kept, n_experts=4, n_devices=2)
    gids = [a.get_gid() for ax in fig.axes for a in [*ax.patches, *ax.lines] if a.get_gid()]
    routes = sorted(g for g in gids if g.startswith("route:"))
    assert "route:token=0:expert=3:kept=0" in routes and len(routes) == 8
    for ax in fig.axes:
        for p in ax.patches:
            gid = p.get_gid() or ""
            if gid.startswith(("token:", "expert:")):
                d = int(gid.split("device=")[1])
                assert mcolor(p.get_facecolor()) == device_color(d)
    plt.close(fig)
    with pytest.raises(ValueError, match="must divide"):
        draw_routing(r.expert, r.kept, n_experts=4, n_devices=3)
    with pytest.raises(ValueError, match="expert ids must lie"):
        draw_routing(r.expert + 4, r.kept, n_experts=4, n_devices=2)


def mcolor(rgba):
    from matplotlib import colors

    return colors.to_hex(rgba[:3])
