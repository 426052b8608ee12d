"""Property-based tests of helpers.drawing.draw: what is drawn is what shard_layout says, in the series' colours."""

from __future__ import annotations

import ast
import re

import jax
import matplotlib.pyplot as plt
import pytest
from generators import meshes, placed_arrays
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib import colors as mcolors

from helpers import device_color, draw_mesh, draw_sharding, shard_layout

_BLOCK = re.compile(r"block:start=(\(.*?\)):stop=(\(.*?\)):devices=([\d,]+)")


def _drawn_blocks(ax) -> list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], object]]:
    out = []
    for p in ax.patches:
        m = _BLOCK.fullmatch(p.get_gid() or "")
        if m:
            devs = tuple(int(d) for d in m.group(3).split(","))
            out.append((ast.literal_eval(m.group(1)), ast.literal_eval(m.group(2)), devs, p))
    return out


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@settings(max_examples=20)
@given(st.data())
def test_draw_sharding_draws_exactly_the_layout_in_device_colours(data):
    mesh = data.draw(meshes())
    x = data.draw(placed_arrays(mesh, max_rank=4))
    layout = shard_layout(x.shape, x.sharding)
    ax = draw_sharding(x)
    drawn = _drawn_blocks(ax)
    try:
        if x.ndim <= 2:
            # Rank 0-2: every block of the layout is drawn once, with its holders.
            got = sorted((s, e, d) for s, e, d, _ in drawn)
            want = sorted((tuple(b.start), tuple(b.stop), b.devices) for b in layout)
            if x.ndim == 0:
                want = [((), (), b.devices) for b in layout]
            assert got == want
        else:
            # Rank 3+: blocks that differ only in a folded dimension are drawn as one, which
            # lists every device holding a piece: each layout block's holders land in one.
            for b in layout:
                holders = [d for *_, d, _ in drawn if set(b.devices) <= set(d)]
                assert len(holders) == 1
            assert sorted({i for *_, d, _ in drawn for i in d}) == sorted(
                d.id for d in mesh.devices.flat
            )
        for *_, devs, patch in drawn:
            if len(devs) == 1:  # one holder: its colour, the same in every figure of the series
                assert mcolors.to_hex(patch.get_facecolor()) == device_color(devs[0])
        labels = [t.get_text() for t in ax.texts if (t.get_gid() or "").startswith("block-label:")]
        assert len(labels) == len(drawn)
        title = ax.get_title()
        assert str(tuple(x.shape)) in title and str(tuple(x.sharding.shard_shape(x.shape))) in title
    finally:
        plt.close(ax.figure)


@settings(max_examples=25)
@given(meshes())
def test_draw_mesh_draws_every_device_once_in_mesh_order(mesh):
    ax = draw_mesh(mesh)
    cells = [p for p in ax.patches if (p.get_gid() or "").startswith("device:")]
    ids = [int(p.get_gid().split(":")[1]) for p in cells]
    assert ids == [d.id for d in mesh.devices.flat]
    for p, i in zip(cells, ids, strict=True):
        assert mcolors.to_hex(p.get_facecolor()) == device_color(i)
    for name, size in mesh.shape.items():
        assert f"{name} ({size})" in ax.get_title()
    plt.close(ax.figure)


@given(st.integers(0, 10_000))
def test_device_color_is_a_stable_hex_colour(i):
    c = device_color(i)
    assert re.fullmatch(r"#[0-9a-f]{6}", c) and c == device_color(i)
    assert c == device_color(i % 40)  # the palette repeats after 40 devices
    if i < 40 and i % 40 != (i + 1) % 40:
        assert device_color(i) != device_color(i + 1)


@given(st.one_of(st.floats(allow_nan=False), st.text(max_size=3), st.booleans(), st.none()))
def test_device_color_refuses_what_is_not_a_device_id(i):
    with pytest.raises(ValueError, match="device_id"):
        device_color(i)


@settings(max_examples=15)
@given(
    st.one_of(st.integers(), st.text(max_size=4), st.none(), st.lists(st.integers(), max_size=2))
)
def test_draw_functions_refuse_what_they_cannot_draw(obj):
    with pytest.raises(ValueError, match="draw_mesh"):
        draw_mesh(obj)
    with pytest.raises(ValueError, match="draw_sharding"):
        draw_sharding(obj)


def test_draw_mesh_refuses_an_array_and_draw_sharding_draws_one_on_one_device():
    x = jax.numpy.ones(3)  # placed on device 0: a layout of one block
    with pytest.raises(ValueError, match="draw_mesh"):
        draw_mesh(x)
    assert [d for *_, d, _ in _drawn_blocks(draw_sharding(x))] == [(0,)]


@settings(max_examples=12)
@given(st.data(), st.integers(1, 12), st.booleans())
def test_draw_param_shardings_sums_every_array_and_stays_a_readable_size(data, layers, fold):
    from helpers import draw_param_shardings, planned_bytes_per_device

    mesh = data.draw(meshes(max_axes=2))
    kernel = data.draw(placed_arrays(mesh, max_rank=2))
    vector = jax.device_put(
        jax.numpy.zeros(3), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    )
    tree = {f"block_{i}": {"kernel": kernel, "bias": vector} for i in range(layers)}
    fig = draw_param_shardings(tree, fold=fold)
    try:
        planned = planned_bytes_per_device(tree)
        bars = [p for p in fig.axes[-1].patches if (p.get_gid() or "").startswith("bar:")]
        assert [b.get_height() for b in bars] == list(planned.values())
        panels = [
            a for a in fig.axes[:-1] if (a.get_gid() or "").startswith(("param:", "vectors:"))
        ]
        assert 1 <= len(panels) <= 2 * layers
        if not fold:
            assert len(panels) == 2 * layers  # one per array
        else:
            assert len(panels) <= 2  # identical layers fold into one kernel and one vector panel
        w, h = fig.get_size_inches()
        assert w <= 40 and h <= 60
        assert f"all {2 * layers} arrays" in fig.axes[-1].get_title()
    finally:
        plt.close(fig)
