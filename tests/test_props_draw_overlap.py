"""Property test: no figure of the helpers prints text over text, whatever it is given.

Hypothesis draws trees a learner might bring (ranks 0-4, long paths, many layers, stacked
(scanned) layers, odd shapes, 1-8 devices), renders each figure with the Agg backend and
asks matplotlib's own renderer for the window extent of every visible, non-empty Text
artist: suptitles, figure texts (group headers, notes), panel titles, axis labels, tick
labels and the device numbers inside the blocks. No two boxes may overlap.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import jax
import matplotlib
import matplotlib.pyplot as plt
import pytest
from generators import drawing_settings, fitting_specs, meshes
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from helpers import draw_mesh, draw_param_layouts, draw_param_shardings, draw_sharding

matplotlib.use("Agg")

# Sizes a real model has (512, 4096, a vocabulary), primes and 1.
BIG_DIMS = st.sampled_from([1, 2, 3, 4, 7, 8, 12, 16, 24, 64, 128, 512, 4096, 50257])
SHORT = ["kernel", "bias", "scale", "embedding", "w", "up", "down", "q", "kv"]
LONG = [
    "self_attention_with_rotary_embeddings",
    "feed_forward_network_expansion",
    "layer_normalization_before_attention",
]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _visible(t: Text) -> bool:
    if not t.get_visible() or not t.get_text().strip():
        return False
    a: Any = t
    while a is not None:  # an artist inside an invisible parent is not drawn
        if hasattr(a, "get_visible") and not a.get_visible():
            return False
        a = getattr(a, "axes", None) if a is not t.axes else None
    return True


def _texts(fig: Figure) -> list[Text]:
    """Every Text the figure draws: figure texts, and per Axes its title(s), texts, and
    (when its axis is on) axis labels and the tick labels inside the view."""
    out: list[Text] = list(fig.texts)
    if fig._suptitle is not None and fig._suptitle not in out:  # noqa: SLF001
        out.append(fig._suptitle)
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        out += [ax.title, ax._left_title, ax._right_title, *ax.texts]  # noqa: SLF001
        if not ax.axison:
            continue
        for axis, lim in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            lo, hi = min(lim), max(lim)
            out.append(axis.label)
            for tick in axis.get_major_ticks():
                if lo - 1e-9 <= tick.get_loc() <= hi + 1e-9 and tick.label1.get_visible():
                    out.append(tick.label1)
    return [t for t in out if _visible(t)]


def overlapping_labels(fig: Figure) -> list[tuple[str, str]]:
    """Pairs of visible texts whose rendered boxes overlap (by more than half a pixel)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes: list[tuple[str, Bbox]] = []
    for t in _texts(fig):
        bb = t.get_window_extent(renderer)
        if bb.width > 0 and bb.height > 0:
            boxes.append((t.get_text(), bb))
    bad = []
    for (ta, a), (tb, b) in itertools.combinations(boxes, 2):
        w = min(a.x1, b.x1) - max(a.x0, b.x0)
        h = min(a.y1, b.y1) - max(a.y0, b.y0)
        if w > 0.5 and h > 0.5:
            bad.append((ta, tb))
    return bad


@st.composite
def abstract_leaf(draw: Any, mesh: Any, lead: tuple[int, ...] = ()) -> jax.ShapeDtypeStruct:
    rank = draw(st.integers(0, 4 - len(lead)))
    shape = lead + tuple(draw(st.lists(BIG_DIMS, min_size=rank, max_size=rank)))
    spec = draw(fitting_specs(shape, mesh))
    return jax.ShapeDtypeStruct(shape, jax.numpy.float32, sharding=NamedSharding(mesh, spec))


@st.composite
def learner_trees(draw: Any, mesh: Any) -> dict[str, Any]:
    """A model's parameters as a learner's own model might have them."""
    names = st.sampled_from(SHORT + LONG)
    n_layers = draw(st.integers(1, 12))
    stem = draw(st.sampled_from(["block_", "layers_", "transformer_decoder_layer_"]))
    same = draw(st.booleans())  # identical layers (what fold draws once)
    layer: dict[str, Any] = {}
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.lists(names, min_size=1, max_size=3))
        node = layer
        for p in path[:-1]:
            node = node.setdefault(p, {}) if isinstance(node.get(p, {}), dict) else node
        node[path[-1]] = draw(abstract_leaf(mesh))
    body: dict[str, Any] = {}
    for i in range(n_layers):
        body[f"{stem}{i}"] = layer if same else {"kernel": draw(abstract_leaf(mesh))}
    if draw(st.booleans()):  # a stacked (scanned) layer: the layer index is dim 0
        body["scanned_layers"] = {
            "kernel": draw(abstract_leaf(mesh, lead=(n_layers,))),
            "norm_scale": draw(abstract_leaf(mesh, lead=(n_layers,))),
        }
    body["embedding_table_for_tokens"] = draw(abstract_leaf(mesh))
    prefix = draw(st.sampled_from([(), ("params",), ("params", "language_model", "decoder")]))
    for p in reversed(prefix):
        body = {p: body}
    return body


# Shrinking a figure takes minutes: a failure is reported as drawn.
_SETTINGS = drawing_settings(max_examples=12)


@_SETTINGS
@given(st.data(), st.booleans())
def test_draw_param_shardings_never_prints_text_over_text(data, fold):
    mesh = data.draw(meshes(max_axes=2))
    tree = data.draw(learner_trees(mesh))
    fig = draw_param_shardings(tree, fold=fold)
    bad = overlapping_labels(fig)
    plt.close(fig)
    assert bad == []


@_SETTINGS
@given(st.data())
def test_draw_sharding_never_prints_text_over_text(data):
    mesh = data.draw(meshes())
    leaf = data.draw(abstract_leaf(mesh))
    form = data.draw(st.sampled_from(["abstract", "pair"]))
    x = leaf if form == "abstract" else (leaf.shape, leaf.sharding)
    title = data.draw(st.sampled_from([None, "kernel", "/".join(LONG)]))
    ax = draw_sharding(x, title=title)
    bad = overlapping_labels(ax.figure)
    plt.close(ax.figure)
    assert bad == []


@_SETTINGS
@given(st.data())
def test_draw_param_layouts_never_prints_text_over_text(data):
    """A few parameters (rank 0-2, long names, odd sizes) under one to three layouts."""
    mesh = data.draw(meshes(max_axes=2))
    names = data.draw(st.lists(st.sampled_from(SHORT + LONG), min_size=1, max_size=6, unique=True))
    shapes = {n: tuple(data.draw(st.lists(BIG_DIMS, min_size=0, max_size=2))) for n in names}
    layouts = data.draw(st.lists(st.sampled_from(["dp", "fsdp on (8, 1)", "a layout of my own"]),
                                 min_size=1, max_size=3, unique=True))  # fmt: skip
    trees = {
        layout: {
            "params": {
                n: jax.ShapeDtypeStruct(
                    shape,
                    jax.numpy.float32,
                    sharding=NamedSharding(mesh, data.draw(fitting_specs(shape, mesh))),
                )
                for n, shape in shapes.items()
            }  # fmt: skip
        }
        for layout in layouts
    }
    fig = draw_param_layouts(trees, [f"params/{n}" for n in names], title="layouts")
    bad = overlapping_labels(fig)
    plt.close(fig)
    assert bad == []


@settings(max_examples=25, deadline=None, phases=[Phase.explicit, Phase.generate])
@given(meshes())
def test_draw_mesh_never_prints_text_over_text(mesh):
    ax = draw_mesh(mesh)
    bad = overlapping_labels(ax.figure)
    plt.close(ax.figure)
    assert bad == []


def test_the_overlap_check_sees_an_overlap():
    fig = plt.figure()
    fig.text(0.5, 0.5, "one label")
    fig.text(0.5, 0.5, "another")
    assert len(overlapping_labels(fig)) == 1
    assert math.isfinite(fig.get_size_inches()[0])
