"""Unit tests of helpers.parallelism.experts and helpers.drawing.draw_experts: routing, dispatch, the MoE layer."""

from __future__ import annotations

import warnings
from collections import Counter

import flax.linen as nn
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from matplotlib.colors import to_hex

from helpers import (
    UnmappedLogicalNameWarning,
    collective_ops,
    collective_stats,
    logical_rules,
    make_mesh,
)
from helpers.compat import set_mesh
from helpers.drawing.draw import device_color
from helpers.drawing.draw_experts import draw_routing
from helpers.parallelism.experts import (
    MoEMLP,
    MoESpec,
    Routing,
    dispatch_weights,
    expected_drop_rate,
    expert_capacity,
    expert_parallel_mlp,
    load_balance_loss,
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


def test_load_balance_loss_is_one_when_even_and_e_when_collapsed():
    even = jnp.tile(jnp.eye(4) * 10.0, (8, 1))  # every expert first choice equally often, sharp
    assert float(load_balance_loss(even, 1)) == pytest.approx(1.0, abs=1e-3)
    collapsed = jnp.tile(jnp.array([[10.0, 0.0, 0.0, 0.0]]), (8, 1))
    assert float(load_balance_loss(collapsed, 1)) == pytest.approx(4.0, abs=1e-3)
    # top-2 counts both choices; it is differentiable through the probabilities only
    logits = jax.random.normal(jax.random.key(0), (2, 16, 4))
    value, grad = jax.value_and_grad(lambda lg: load_balance_loss(lg, 2))(logits)
    assert 0.8 < float(value) < 1.3 and float(jnp.abs(grad).max()) > 0  # near 1: random logits
    with pytest.raises(ValueError, match="k=5 must be at most the 4 experts"):
        load_balance_loss(logits, 5)


def test_expected_drop_rate_is_the_binomial_overflow():
    # 16 tokens, top-2 of 16 experts: X ~ Binomial(16, 1/8), capacity 3
    from math import comb

    pmf = [comb(16, x) * (1 / 8) ** x * (7 / 8) ** (16 - x) for x in range(17)]
    want = sum(max(x - 3, 0) * p for x, p in enumerate(pmf)) / 2
    assert expected_drop_rate(16, 16, 2, 3) == pytest.approx(want, rel=1e-9)
    assert expected_drop_rate(16, 16, 2, 32) == 0.0  # room for every choice
    assert expected_drop_rate(4096, 16, 2, 640) < 1e-6  # a big group, capacity factor 1.25
    assert expected_drop_rate(8, 2, 2, 5) == pytest.approx(3 / 8)  # k = E: every token, both
    with pytest.raises(ValueError, match="capacity=0"):
        expected_drop_rate(16, 16, 2, 0)


def test_expected_drop_rate_matches_an_unbiased_router():
    # an orthogonal router over Gaussian tokens: i.i.d. logits, every expert equally likely
    router = jnp.linalg.qr(jax.random.normal(jax.random.key(1), (16, 16)))[0]
    x = jax.random.normal(jax.random.key(2), (512, 16, 16))
    kept = jax.vmap(lambda lg: route(lg, 2, 3).kept)(x @ router)
    assert 1 - float(kept.mean()) == pytest.approx(expected_drop_rate(16, 16, 2, 3), abs=0.01)


def test_moe_layer_sows_its_balance_only_when_asked():
    x, router, wi, wo = _layer_inputs()
    layer = MoEMLP(MoESpec(4, 2, 1.25), 16)
    params = {"router": router, "wi": wi, "wo": wo}
    variables = layer.init(jax.random.key(0), x)
    assert set(variables) == {"params"}  # nothing sown at initialisation
    out, sown = layer.apply({"params": params}, x, mutable=["losses", "intermediates"])
    assert float(sown["losses"]["load_balance"][0]) == pytest.approx(
        float(load_balance_loss(x @ router, 2)), rel=1e-6
    )
    share = np.asarray(sown["intermediates"]["expert_share"][0])
    r = jax.vmap(lambda lg: route(lg, 2, expert_capacity(8, 4, 2, 1.25)))(x @ router)
    np.testing.assert_allclose(
        share, np.bincount(np.asarray(r.expert).ravel(), minlength=4) / r.expert.size
    )
    assert float(sown["intermediates"]["dropped"][0]) == pytest.approx(1 - float(r.kept.mean()))
    np.testing.assert_allclose(out, layer.apply({"params": params}, x), atol=1e-6)


def test_moe_layer_sums_its_balance_on_each_device_and_gathers_no_logits():
    # On a (2, 2) mesh, the tokens split over both axes and the experts over "expert": the
    # loss and its gradient equal those of the whole logits, and the compiled gradient
    # step adds each device's 2·E sums with an all-reduce instead of gathering the logits.
    x, router, wi, wo = _layer_inputs()
    layer = MoEMLP(MoESpec(4, 2, 1.25), 16)
    params = {"router": router, "wi": wi, "wo": wo}

    def loss(p, x):
        out, sown = layer.apply({"params": p}, x, mutable=["losses"])
        balance = sown["losses"]["load_balance"][0]
        return jnp.sum(out**2) + balance, balance

    want, want_grads = jax.value_and_grad(loss, has_aux=True)(params, x)
    mesh = make_mesh((2, 2), ("data", "expert"))
    changes = {"batch": ("data", "expert"), "expert": "expert"}
    rules = tuple((name, changes.get(name, axes)) for name, axes in logical_rules("dp"))
    with set_mesh(mesh), nn.logical_axis_rules(rules):
        step = jax.jit(jax.value_and_grad(loss, has_aux=True)).lower(params, x).compile()
        got, grads = step(params, x)
    assert float(got[1]) == pytest.approx(float(load_balance_loss(x @ router, 2)), rel=1e-5)
    assert float(got[1]) == pytest.approx(float(want[1]), rel=1e-5)
    for name in params:
        np.testing.assert_allclose(grads[name], want_grads[name], rtol=1e-4, atol=1e-5)
    stats = collective_stats(step)
    assert "all-gather" not in stats and "all-reduce" in stats, stats

    # The balancing loss adds only its sums to what the step all-reduces: the layer computes
    # the router's logits once, so the router's gradient stays one array.
    def plain(p, x):
        return jnp.sum(layer.apply({"params": p}, x) ** 2)

    with set_mesh(mesh), nn.logical_axis_rules(rules):
        plain_step = jax.jit(jax.value_and_grad(plain)).lower(params, x).compile()

    def reduced(c):
        return Counter(a for op in collective_ops(c) if op.kind == "all-reduce" for a in op.arrays)

    assert reduced(step) - reduced(plain_step) == Counter({("f32", (2, 4)): 1})


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
        for line in ax.lines:
            gid = line.get_gid() or ""
            if gid.endswith("kept=0"):  # a dropped choice: black, never a device's grey
                assert to_hex(line.get_color()) == "#000000"
    ax = fig.axes[0]
    boxes = {p.get_gid(): p for p in ax.patches if (p.get_gid() or "").startswith("expert:")}
    drops = {ln.get_gid(): ln for ln in ax.lines if (ln.get_gid() or "").startswith("drop:")}
    assert sorted(drops) == ["drop:token=0:expert=3", "drop:token=3:expert=2"]
    for gid, cross in drops.items():  # each cross sits on its expert's box
        e = int(gid.split("expert=")[1])
        box = boxes[f"expert:{e}:device={e // 2}"]
        (x,), (y,) = cross.get_xdata(), cross.get_ydata()
        assert box.get_x() < x < box.get_x() + box.get_width()
        assert box.get_y() < y < box.get_y() + box.get_height()
    # tokens are numbered on their device: two per device here, each device named beside them
    assert [t.get_text() for t in ax.texts[:4]] == ["0", "1", "0", "1"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["device 0", "device 1"]
    tokens_y = sorted(
        p.get_y() + p.get_height() / 2
        for p in ax.patches
        if (p.get_gid() or "").startswith("token:")
    )
    assert list(ax.get_yticks()) == pytest.approx([np.mean(tokens_y[:2]), np.mean(tokens_y[2:])])
    assert min(t.get_fontsize() for t in ax.texts) >= 9
    plt.close(fig)
    with pytest.raises(ValueError, match="must divide"):
        draw_routing(r.expert, r.kept, n_experts=4, n_devices=3)
    with pytest.raises(ValueError, match="expert ids must lie"):
        draw_routing(r.expert + 4, r.kept, n_experts=4, n_devices=2)


def test_draw_routing_bars_one_group_against_its_capacity():
    r = route(jax.random.normal(jax.random.key(3), (12, 4)), 2, 5)
    drawn = Routing(*(a[:4] for a in r))
    fig = draw_routing(drawn.expert, drawn.kept, n_experts=4, n_devices=2,
                       group=(r.expert, r.kept), capacity=5)  # fmt: skip
    gids = [a.get_gid() or "" for ax in fig.axes for a in [*ax.patches, *ax.lines]]
    assert "capacity:5" in gids
    for e in range(4):  # the bars count the whole group's choices, not the drawn ones
        routed = int((np.asarray(r.expert) == e).sum())
        took = int(((np.asarray(r.expert) == e) & np.asarray(r.kept)).sum())
        assert f"load:expert={e}:took={took}" in gids
        assert f"load:expert={e}:dropped={routed - took}" in gids
        assert took <= 5
    bars = fig.axes[1]  # the tallest bar stops under the legend, with little room to spare
    renderer = fig.canvas.get_renderer()
    legend_bottom = bars.get_legend().get_window_extent(renderer).y0
    tops = [p.get_window_extent(renderer).y1 for p in bars.patches if p.get_height() > 0]
    tallest = max(int((np.asarray(r.expert) == e).sum()) for e in range(4))
    assert max(tops) < legend_bottom
    assert bars.get_ylim()[1] < 1.6 * max(tallest, 5)
    plt.close(fig)
    with pytest.raises(ValueError, match="capacity=0"):
        draw_routing(drawn.expert, drawn.kept, n_experts=4, n_devices=2, capacity=0)


def mcolor(rgba):
    from matplotlib import colors

    return colors.to_hex(rgba[:3])
