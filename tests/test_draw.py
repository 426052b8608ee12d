"""Tests for helpers.drawing.draw: what each figure shows (blocks, their devices, labels), not just
that a figure came back."""
# The devices must be set before any other JAX use, so imports follow that call.
# ruff: noqa: E402

from helpers import use_simulated_devices

use_simulated_devices(8, quiet=True)

import re

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from matplotlib import colors as mcolors

from helpers import make_mesh, planned_bytes_per_device, shard_tree
from helpers.drawing.draw import (
    _text_color,
    device_color,
    draw_mesh,
    draw_param_layouts,
    draw_param_shardings,
    draw_sharding,
)

# ---------------------------------------------------------------------------
# Reading a drawing back
# ---------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def mesh8():
    return make_mesh((8,), ("data",))


@pytest.fixture(scope="module")
def mesh24():
    return make_mesh((2, 4), ("data", "model"))


def cells(ax):
    """Mesh cells in drawing order: (device id, rectangle)."""
    return [
        (int(p.get_gid().split(":")[1]), p)
        for p in ax.patches
        if (p.get_gid() or "").startswith("device:")
    ]


def blocks(ax):
    """Array blocks in drawing order: (start, stop, device ids, rectangle)."""
    out = []
    for p in ax.patches:
        gid = p.get_gid() or ""
        m = re.fullmatch(r"block:start=(\(.*?\)):stop=(\(.*?\)):devices=([\d,]+)", gid)
        if m:
            devs = tuple(int(d) for d in m.group(3).split(","))
            out.append((eval(m.group(1)), eval(m.group(2)), devs, p))
    return out


def block_labels(ax):
    return [t.get_text() for t in ax.texts if (t.get_gid() or "").startswith("block-label:")]


def texts(ax):
    return [t.get_text() for t in ax.texts]


# ---------------------------------------------------------------------------
# device_color
# ---------------------------------------------------------------------------


def test_device_color_is_stable_and_distinct():
    first = [device_color(i) for i in range(8)]
    assert first == [device_color(i) for i in range(8)]  # same colour every call
    assert len(set(first)) == 8  # eight devices, eight colours
    assert all(re.fullmatch(r"#[0-9a-f]{6}", c) for c in first)
    assert len({device_color(i) for i in range(40)}) == 40
    assert device_color(np.int64(3)) == device_color(3)
    with pytest.raises(ValueError, match="device_id"):
        device_color("3")


def _contrast(a, b):
    def lum(c):
        rgb = [
            x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4 for x in mcolors.to_rgb(c)
        ]
        return 0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2]

    hi, lo = sorted([lum(a), lum(b)], reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_label_ink_is_readable_on_every_device_colour():
    for i in range(40):
        face = device_color(i)
        assert _contrast(face, _text_color(face)) >= 3.0, (i, face)


# ---------------------------------------------------------------------------
# draw_mesh
# ---------------------------------------------------------------------------


def test_draw_mesh_2x4(mesh24):
    ax = draw_mesh(mesh24)
    got = cells(ax)
    assert [d for d, _ in got] == [d.id for d in mesh24.devices.flat] == list(range(8))
    # Row-major layout: device of mesh[r, c] sits in row r, column c.
    for (did, rect), (r, c) in zip(got, np.ndindex(2, 4), strict=True):
        assert mesh24.devices[r, c].id == did
        assert (int(rect.get_x()), int(rect.get_y())) == (c, r)
        assert rect.get_facecolor()[:3] == pytest.approx(mcolors.to_rgb(device_color(did)))
    ids = [t.get_text() for t in ax.texts if (t.get_gid() or "").startswith("device-id:")]
    assert ids == [str(i) for i in range(8)]
    assert "data (2)" in texts(ax) and "model (4)" in texts(ax)
    assert not any(t.startswith("p") and t[1:].isdigit() for t in texts(ax))  # one process
    assert "data (2) x model (4)" in ax.get_title()


def test_draw_mesh_1d_is_one_row(mesh8):
    ax = draw_mesh(mesh8)
    got = cells(ax)
    assert [d for d, _ in got] == list(range(8))
    assert {rect.get_y() for _, rect in got} == {got[0][1].get_y()}
    assert [rect.get_x() for _, rect in got] == sorted(rect.get_x() for _, rect in got)
    assert "data (8)" in texts(ax)


def test_draw_mesh_3d_side_by_side_grids():
    mesh = make_mesh((2, 2, 2), ("pipe", "data", "model"))
    ax = draw_mesh(mesh)
    got = dict(cells(ax))
    assert sorted(got) == list(range(8))
    assert "pipe = 0" in texts(ax) and "pipe = 1" in texts(ax)
    assert "data (2)" in texts(ax) and "model (2)" in texts(ax)
    # Every device of pipe = 1 is drawn to the right of every device of pipe = 0.
    left = [got[d.id].get_x() for d in mesh.devices[0].flat]
    right = [got[d.id].get_x() for d in mesh.devices[1].flat]
    assert max(left) < min(right)


class _FakeDevice:  # a device of another process, which one machine cannot make for real
    platform = "cpu"

    def __init__(self, i, process):
        self.id, self.process_index = i, process


def _fake_mesh(owners, shape, names=("data", "model")):
    devices = [_FakeDevice(1024 * p + i, p) for i, p in enumerate(owners)]
    return Mesh(np.array(devices).reshape(shape), names)


def _frame_edges(ax, process):
    """The unit edges of the frame drawn around ``process``'s cells, as ((x0, y0), (x1, y1))."""
    (frame,) = [c for c in ax.collections if c.get_gid() == f"process-frame:{process}"]
    return {tuple(map(tuple, np.round(seg, 6))) for seg in frame.get_segments()}


def test_draw_mesh_frames_each_process_and_names_it_beside_its_rows():
    mesh = _fake_mesh([0, 0, 1, 1], (2, 2))  # process 0 owns row 0, process 1 row 1
    fig, ax = plt.subplots()
    assert draw_mesh(mesh, ax=ax) is ax
    # The cells keep their device colours: one colour per device, in every figure.
    for did, rect in cells(ax):
        assert rect.get_facecolor()[:3] == pytest.approx(mcolors.to_rgb(device_color(did)))
    # Each frame is the outline of exactly its process's cells (row 0: y from 0 to 1).
    assert _frame_edges(ax, 0) == {((0, 0), (1, 0)), ((1, 0), (2, 0)), ((0, 1), (1, 1)),
                                   ((1, 1), (2, 1)), ((0, 0), (0, 1)), ((2, 0), (2, 1))}  # fmt: skip
    assert {((0, 2), (1, 2)), ((1, 2), (2, 2))} <= _frame_edges(ax, 1)
    labels = {t.get_gid(): t for t in ax.texts if (t.get_gid() or "").startswith("process-")}
    assert [t.get_text() for t in labels.values()] == ["process 0", "process 1"]
    # Each name sits to the right of its own row, not inside the cells.
    assert [labels[f"process-label:{p}"].get_position()[1] for p in (0, 1)] == [0.5, 1.5]
    assert all(t.get_position()[0] > 2 for t in labels.values())
    assert not [t for t in ax.texts if (t.get_gid() or "").startswith("process:")]
    assert "2 processes" in ax.get_title()


def test_draw_mesh_names_processes_below_columns_or_in_the_cells():
    ax = draw_mesh(_fake_mesh([0, 0, 1, 1, 2, 2, 3, 3], (8,), names=("data",)))  # 1-D
    labels = [t for t in ax.texts if (t.get_gid() or "").startswith("process-label:")]
    assert [t.get_text() for t in labels] == [f"process {p}" for p in range(4)]
    assert [t.get_position()[0] for t in labels] == [1.0, 3.0, 5.0, 7.0]  # under its columns
    assert all(t.get_position()[1] > 1 for t in labels)
    plt.close(ax.figure)

    ax = draw_mesh(_fake_mesh([0, 1, 1, 0], (2, 2)))  # neither whole rows nor whole columns
    inside = [t.get_text() for t in ax.texts if (t.get_gid() or "").startswith("process:")]
    assert inside == ["p0", "p1", "p1", "p0"]
    assert len(_frame_edges(ax, 0)) == 8  # two single cells, four edges each
    plt.close(ax.figure)


def test_draw_mesh_rejects_non_mesh():
    with pytest.raises(ValueError, match="Mesh"):
        draw_mesh((2, 4))


# ---------------------------------------------------------------------------
# draw_sharding
# ---------------------------------------------------------------------------


def test_draw_sharding_rows_split_over_data(mesh8):
    x = jax.device_put(jnp.zeros((64, 128)), NamedSharding(mesh8, P("data", None)))
    ax = draw_sharding(x)
    got = blocks(ax)
    assert [(start, stop, devs) for start, stop, devs, _ in got] == [
        ((8 * i, 0), (8 * i + 8, 128), (i,)) for i in range(8)
    ]
    for start, _, devs, rect in got:
        assert (rect.get_y(), rect.get_height()) == (start[0], 8)
        assert rect.get_facecolor()[:3] == pytest.approx(mcolors.to_rgb(device_color(devs[0])))
    assert block_labels(ax) == [str(i) for i in range(8)]
    title = ax.get_title()
    assert "P('data', None)" in title
    assert "global (64, 128) -> per device (8, 128)" in title
    assert ax.get_ylabel() == "dim 0: 64, split over 'data' (8)"
    assert ax.get_xlabel() == "dim 1: 128, not split"
    assert list(ax.get_yticks()) == list(range(0, 65, 8))


def test_draw_sharding_replicated_names_all_devices(mesh8):
    x = jax.device_put(jnp.zeros((16, 32)), NamedSharding(mesh8, P()))
    ax = draw_sharding(x, title="bias")
    got = blocks(ax)
    assert len(got) == 1
    assert got[0][2] == tuple(range(8))
    assert block_labels(ax) == ["all 8"]
    # Striped in the holders' colours, every one of them.
    stripe_colours = {
        mcolors.to_hex(p.get_facecolor()) for p in ax.patches if p.get_gid() == "stripe"
    }
    assert stripe_colours == {device_color(i) for i in range(8)}
    assert ax.get_title().splitlines()[0] == "bias"
    assert "P()" in ax.get_title() and "per device (16, 32)" in ax.get_title()


def test_draw_sharding_partly_replicated_lists_devices(mesh24):
    ax = draw_sharding(((64, 128), NamedSharding(mesh24, P("data", None))))
    assert [devs for _, _, devs, _ in blocks(ax)] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert block_labels(ax) == ["0,1,2,3", "4,5,6,7"]
    assert ax.get_ylabel() == "dim 0: 64, split over 'data' (2)"


def test_draw_sharding_on_one_device_says_nothing_is_split():
    mesh1 = make_mesh((1,), ("data",), devices=jax.devices()[:1])
    ax = draw_sharding(((64, 128), NamedSharding(mesh1, P("data", None))))
    assert [devs for _, _, devs, _ in blocks(ax)] == [(0,)]
    assert block_labels(ax) == ["0"]  # one device: its id, not "all 1"
    assert ax.get_ylabel() == "dim 0: 64, over 'data' (size 1: not split)"


def test_draw_sharding_two_axes_and_multi_axis_dim(mesh24):
    ax = draw_sharding(((8, 16), NamedSharding(mesh24, P("data", "model"))))
    assert [devs for _, _, devs, _ in blocks(ax)] == [(d,) for d in range(8)]
    assert ax.get_xlabel() == "dim 1: 16, split over 'model' (4)"
    ax = draw_sharding(((16, 4), NamedSharding(mesh24, P(("data", "model"), None))))
    assert [devs for _, _, devs, _ in blocks(ax)] == [(d,) for d in range(8)]
    assert ax.get_ylabel() == "dim 0: 16, split over 'data' x 'model' (8)"


def test_draw_sharding_rank3_folds_unsharded_dims(mesh8):
    x = ((8, 64, 32), NamedSharding(mesh8, P(None, "data")))
    ax = draw_sharding(x)
    got = blocks(ax)
    assert [devs for _, _, devs, _ in got] == [(i,) for i in range(8)]
    assert [start for start, _, _, _ in got] == [(8 * i, 0) for i in range(8)]  # (dim 1, dim 2)
    assert "dim 0 (8) not drawn, not split" in ax.get_title()
    assert ax.get_ylabel() == "dim 1: 64, split over 'data' (8)"
    assert ax.get_xlabel() == "dim 2: 32, not split"
    assert "global (8, 64, 32) -> per device (8, 8, 32)" in ax.get_title()


def test_draw_sharding_rank4_draws_the_two_sharded_dims(mesh24):
    ax = draw_sharding(((2, 8, 4, 16), NamedSharding(mesh24, P(None, "data", None, "model"))))
    assert len(blocks(ax)) == 8
    assert ax.get_ylabel().startswith("dim 1: 8, split over 'data'")
    assert ax.get_xlabel().startswith("dim 3: 16, split over 'model'")
    assert "dims 0, 2 (2, 4) not drawn, not split" in ax.get_title()


def test_draw_sharding_rank3_unsharded_draws_last_two(mesh8):
    ax = draw_sharding(((4, 6, 8), NamedSharding(mesh8, P())))
    assert ax.get_ylabel().startswith("dim 1: 6") and ax.get_xlabel().startswith("dim 2: 8")
    assert "dim 0 (4) not drawn, not split" in ax.get_title()
    assert block_labels(ax) == ["all 8"]


def test_draw_sharding_three_sharded_dims_merges_folded_holders():
    mesh = make_mesh((2, 2, 2), ("a", "b", "c"))
    ax = draw_sharding(((2, 2, 2), NamedSharding(mesh, P("a", "b", "c"))))
    got = blocks(ax)
    assert len(got) == 4
    assert sorted(d for _, _, devs, _ in got for d in devs) == list(range(8))
    assert all(len(devs) == 2 for _, _, devs, _ in got)
    assert "not drawn, split too" in ax.get_title()


def test_draw_sharding_rank1_and_rank0_are_strips(mesh8):
    ax = draw_sharding(jax.device_put(jnp.zeros((64,)), NamedSharding(mesh8, P("data"))))
    got = blocks(ax)
    assert [devs for _, _, devs, _ in got] == [(i,) for i in range(8)]
    assert {rect.get_y() for *_, rect in got} == {0}
    assert [rect.get_x() for *_, rect in got] == [8 * i for i in range(8)]
    assert ax.get_xlabel() == "dim 0: 64, split over 'data' (8)"
    assert list(ax.get_yticks()) == []

    ax = draw_sharding(jax.device_put(jnp.float32(1.0), NamedSharding(mesh8, P())))
    assert [devs for _, _, devs, _ in blocks(ax)] == [tuple(range(8))]
    assert "scalar" in ax.get_xlabel()
    assert "global () -> per device ()" in ax.get_title()


def test_draw_sharding_accepts_pair_and_shape_dtype_struct(mesh24):
    sharding = NamedSharding(mesh24, P(None, "model"))
    placed = jax.device_put(jnp.zeros((6, 8)), sharding)
    abstract = jax.ShapeDtypeStruct((6, 8), jnp.float32, sharding=sharding)
    want = [(s, e, d) for s, e, d, _ in blocks(draw_sharding(placed))]
    assert want == [((0, 2 * i), (6, 2 * i + 2), (i, i + 4)) for i in range(4)]
    assert [(s, e, d) for s, e, d, _ in blocks(draw_sharding(abstract))] == want
    assert [(s, e, d) for s, e, d, _ in blocks(draw_sharding(((6, 8), sharding)))] == want


def test_draw_sharding_on_given_axes_and_single_device_array():
    fig, ax = plt.subplots()
    assert draw_sharding(jnp.zeros((4, 4)), ax=ax) is ax
    assert [devs for _, _, devs, _ in blocks(ax)] == [(0,)]
    assert "SingleDeviceSharding" in ax.get_title()


def test_draw_sharding_clamps_extreme_aspect_ratios(mesh8):
    ax = draw_sharding(((2, 4096), NamedSharding(mesh8, P(None, "data"))))
    ax.apply_aspect()
    box = ax.get_position()
    fw, fh = ax.figure.get_size_inches()
    ratio = (box.height * fh) / (box.width * fw)
    assert ratio == pytest.approx(0.25, rel=0.02)  # not 2/4096: still readable


def test_draw_sharding_errors_name_the_problem():
    with pytest.raises(ValueError, match="no sharding"):
        draw_sharding(np.zeros((4, 4)))
    with pytest.raises(ValueError, match="not an array"):
        draw_sharding("weights")


# ---------------------------------------------------------------------------
# draw_param_shardings
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def params(mesh8):
    tree = {
        "dense": {"kernel": jnp.ones((64, 32)), "bias": jnp.ones((32,))},
        "embed": jnp.ones((2, 16, 8)),
        "scale": jnp.ones(()),
    }
    specs = {"dense": {"kernel": P("data"), "bias": P()}, "embed": P(None, "data"), "scale": P()}
    return shard_tree(tree, specs, mesh8)


def panel_ids(fig):
    """The gid of every panel, in display order (the bar chart excluded)."""
    return [
        ax.get_gid() for ax in fig.axes if (ax.get_gid() or "").startswith(("param:", "vectors:"))
    ]


def panel(fig, gid):
    return next(ax for ax in fig.axes if ax.get_gid() == gid)


def headers(fig):
    return [t.get_text() for t in fig.texts if (t.get_gid() or "").startswith("group:")]


def bar_heights(fig):
    bar_ax = fig.axes[-1]
    assert bar_ax.get_gid() == "bytes-per-device"
    return [p.get_height() for p in bar_ax.patches if (p.get_gid() or "").startswith("bar:")]


def _check_param_figure(fig, tree):
    # Tree order (sorted keys after shard_tree); "embed" and "scale" sit at the top level.
    assert panel_ids(fig) == [
        "param:dense/bias",
        "param:dense/kernel",
        "param:embed",
        "param:scale",
    ]
    assert len(fig.axes) == 4 + 1  # one panel per parameter (nothing repeats), the bar chart
    assert [ax.get_title().splitlines()[0] for ax in fig.axes[:-1]] == [
        "dense/bias", "dense/kernel", "embed", "scale"
    ]  # fmt: skip
    assert headers(fig) == ["dense"]  # the top-level arrays get no header
    kernel = panel(fig, "param:dense/kernel")
    assert [devs for _, _, devs, _ in blocks(kernel)] == [(i,) for i in range(8)]
    assert block_labels(panel(fig, "param:dense/bias")) == ["all 8"]
    assert "not drawn" in panel(fig, "param:embed").get_title()
    bar_ax = fig.axes[-1]
    planned = planned_bytes_per_device(tree)
    bars = [p for p in bar_ax.patches if (p.get_gid() or "").startswith("bar:")]
    assert [b.get_gid() for b in bars] == [f"bar:{k}" for k in planned]
    assert [b.get_height() for b in bars] == list(planned.values())
    assert [mcolors.to_hex(b.get_facecolor()) for b in bars] == [device_color(i) for i in range(8)]
    # 64*32*4/8 + 32*4 + 2*16*8*4/8 + 4 bytes on every device.
    assert set(planned.values()) == {1024 + 128 + 128 + 4}
    assert "the sum of all 4 arrays drawn" in bar_ax.get_title()


def test_draw_param_shardings_placed_tree(params):
    fig = draw_param_shardings(params, title="toy model")
    _check_param_figure(fig, params)
    assert fig.get_suptitle() == "toy model"


def test_draw_param_shardings_abstract_tree(params):
    abstract = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), params
    )
    fig = draw_param_shardings(abstract)
    _check_param_figure(fig, abstract)
    assert "4 arrays" in fig.get_suptitle()


def _abstract(model, x, mesh, rules):
    """A Flax model's parameters, never allocated: shapes from eval_shape, shardings from
    the logical-axis rules."""
    import flax.linen as nn

    from helpers.placing.train import param_shardings

    shapes = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), x)["params"])
    shardings = param_shardings(model, x, mesh, rules)
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes, shardings
    )


@pytest.fixture(scope="module")
def transformer():
    from helpers.placing.models import TransformerConfig, synthetic_tokens
    from helpers.placing.sharding import param_order

    cfg = TransformerConfig(n_layers=4, n_heads=8, vocab_multiple=1024, batch=8, seq=8)
    x, _ = synthetic_tokens(jax.random.key(0), cfg)
    model = cfg.model()
    return cfg, model, x, param_order(model, x)


def test_draw_param_layouts_draws_a_3d_kernel_as_the_same_matrix_under_every_layout(transformer):
    # FSDP splits the query kernel (embed, heads, kv) along embed, TP along heads: both are
    # drawn as the (embed, heads x kv) matrix, FSDP's blocks as rows, TP's as columns of
    # whole heads (a drawing that picked "the split dims" showed each in other dims).
    cfg, model, x, _ = transformer
    trees = {name: _abstract(model, x, make_mesh(shape, ("data", "model")), rules)
             for name, shape, rules in (("fsdp", (8, 1), "fsdp"), ("tp", (1, 8), "tp"))}  # fmt: skip
    paths = ["block_0/attn/query/kernel", "block_0/attn/out/kernel", "block_0/mlp/up/kernel"]
    fig = draw_param_layouts(trees, paths, matrix_rows={"query/kernel": 1, "out/kernel": 2})
    e, hk = cfg.d_model, cfg.n_heads * cfg.head_dim
    fsdp_q, tp_q = (panel(fig, f"cell:{k}:block_0/attn/query/kernel") for k in ("fsdp", "tp"))
    for ax in (fsdp_q, tp_q):
        assert ax.get_xlim() == (0, hk) and ax.get_ylim() == (e, 0)  # the same matrix
    assert [(a, b, d) for a, b, d, _ in blocks(fsdp_q)] == [
        ((i * e // 8, 0), ((i + 1) * e // 8, hk), (i,)) for i in range(8)
    ]
    assert [(a, b, d) for a, b, d, _ in blocks(tp_q)] == [  # one head's kv columns each
        ((0, i * hk // 8), (e, (i + 1) * hk // 8), (i,)) for i in range(8)
    ]
    assert fsdp_q.get_title() == "P('data', None, None)"  # the array's own spec
    assert tp_q.get_xlabel() == f"{cfg.n_heads}×{cfg.head_dim} / 'model'"
    tp_out = panel(fig, "cell:tp:block_0/attn/out/kernel")  # (heads, kv, embed): heads x kv down
    assert tp_out.get_ylim() == (hk, 0) and len(blocks(tp_out)) == 8
    headers_ = [t.get_text() for t in fig.texts if (t.get_gid() or "").startswith("column:")]
    assert headers_[0].endswith(f"({e}, {cfg.n_heads}×{cfg.head_dim})")
    assert [t.get_text() for t in fig.texts if (t.get_gid() or "").startswith("row:")] == [
        "fsdp",
        "tp",
    ]
    assert {p.get_gid() for p in panel(fig, "key").patches} == {f"key:{d}" for d in range(8)}


def test_draw_param_layouts_refuses_what_it_cannot_draw_the_same_way(transformer):
    cfg, model, x, _ = transformer
    tree = {"tp": _abstract(model, x, make_mesh((1, 8), ("data", "model")), "tp")}
    with pytest.raises(ValueError, match="rank 3: give matrix_rows"):
        draw_param_layouts(tree, ["block_0/attn/query/kernel"])
    with pytest.raises(ValueError, match="matches 4 arrays"):
        draw_param_layouts(tree, ["attn/query/kernel"])
    # out (heads, kv, embed) with one leading dim as rows: heads down, kv x embed across,
    # which TP does not split: drawn.
    draw_param_layouts(tree, ["block_0/attn/out/kernel"], matrix_rows={"out/kernel": 1})
    mesh = make_mesh((1, 8), ("data", "model"))
    kv_split = {"a": {"w": jax.ShapeDtypeStruct((4, 16, 8), jnp.float32,
                                                sharding=NamedSharding(mesh, P(None, "model", None)))}}  # fmt: skip
    with pytest.raises(ValueError, match="no matrix_rows draws each"):
        draw_param_layouts(kv_split, ["w"], matrix_rows={"w": 2})  # (4 x 16) rows, 16 split
    with pytest.raises(ValueError, match="non-empty"):
        draw_param_layouts({}, ["w"])


def test_draw_param_shardings_flax_mlp_stack_in_model_order():
    from helpers.placing.models import ModelConfig, synthetic_batch
    from helpers.placing.sharding import param_order

    cfg = ModelConfig(d_model=16, d_ff=32, n_layers=2, n_classes=8, batch=8, seq=2)
    mesh = make_mesh((8, 1), ("data", "model"))
    x, _ = synthetic_batch(jax.random.key(0), cfg)
    model = cfg.model()
    abstract = _abstract(model, x, mesh, "fsdp")
    fig = draw_param_shardings(abstract, order=param_order(model, x))
    # block_1 is block_0 again: folded. The LayerNorm vectors and the biases that FSDP
    # leaves whole share a panel, where the first of them sits; "up" comes before "down".
    assert panel_ids(fig) == [
        "vectors:block_0/LayerNorm_0/scale,block_0/LayerNorm_0/bias,block_0/up/bias,block_0/down/bias",
        "param:block_0/up/kernel",
        "param:block_0/down/kernel",
        "vectors:final_norm/scale,final_norm/bias",
        "param:head/kernel",
        "param:head/bias",
    ]
    assert headers(fig)[0].startswith("block_0..1: 2 layers")
    up = panel(fig, "param:block_0/up/kernel")
    assert [devs for _, _, devs, _ in blocks(up)] == [(i,) for i in range(8)]  # "embed" on data
    assert bar_heights(fig) == list(planned_bytes_per_device(abstract).values())
    assert "the sum of all 16 arrays drawn" in fig.axes[-1].get_title()


def test_draw_param_shardings_folds_a_transformer(transformer):
    cfg, model, x, order = transformer
    mesh = make_mesh((4, 2), ("data", "model"))
    abstract = _abstract(model, x, mesh, "fsdp_tp")
    assert len(jax.tree.leaves(abstract)) == 44
    fig = draw_param_shardings(abstract, order=order)
    block = ["attn/query", "attn/key", "attn/value", "attn/out", "mlp/up", "mlp/down"]
    norms = ["attn_norm/scale", "attn_norm/bias", "mlp_norm/scale", "mlp_norm/bias"]
    assert panel_ids(fig) == [
        "param:token_embed/embedding",
        "vectors:" + ",".join(f"block_0/{n}" for n in norms),
        *[f"param:block_0/{k}/kernel" for k in block],
        "vectors:final_norm/scale,final_norm/bias",
        "param:lm_head/kernel",
    ]
    assert headers(fig) == [
        "token_embed", "block_0..3: 4 layers with the same layout, drawn once", "final_norm", "lm_head"
    ]  # fmt: skip
    # The folded panel draws block_0's query kernel (embed on data, heads on model).
    query = panel(fig, "param:block_0/attn/query/kernel")
    assert query.get_title().splitlines()[0] == "block_0..3/attn/query/kernel"
    assert [devs for _, _, devs, _ in blocks(query)] == [(d,) for d in range(8)]
    assert "P('data', 'model', None)" in query.get_title()
    # A vector panel: one striped bar per vector, in all eight device colours.
    vectors = panel(fig, "vectors:" + ",".join(f"block_0/{n}" for n in norms))
    bars = [p for p in vectors.patches if (p.get_gid() or "").startswith("vector:")]
    assert [b.get_gid() for b in bars] == [f"vector:{n}:devices=0,1,2,3,4,5,6,7" for n in norms]
    stripes = {
        mcolors.to_hex(p.get_facecolor()) for p in vectors.patches if p.get_gid() == "stripe"
    }
    assert stripes == {device_color(i) for i in range(8)}
    # The bars count every array, the folded layers too.
    assert bar_heights(fig) == list(planned_bytes_per_device(abstract).values())
    assert "the sum of all 44 arrays drawn" in fig.axes[-1].get_title()
    note = next(t.get_text() for t in fig.texts if t.get_gid() == "fold-note")
    assert "44 arrays in 10 panels, in model order" in note and "block_0..3 (4 layers)" in note


def test_a_short_panel_keeps_its_mesh_axis_and_its_row_no_empty_band(transformer):
    _, model, x, order = transformer
    fig = draw_param_shardings(_abstract(model, x, make_mesh((1, 8), ("data", "model")), "tp"),
                               order=order)  # fmt: skip
    # The query kernel (64, 8, 16) is drawn 8 high: too short for "dim 1: 8 / 'model'" on
    # one line, so the mesh axis goes on a second line instead of being dropped.
    query = panel(fig, "param:block_0/attn/query/kernel")
    assert query.get_ylabel() == "dim 1: 8\n/ 'model'" and query.yaxis.label.get_visible()
    # The row of value (8 x 16), out and up (64 x 256) is as tall as its tallest drawing:
    # the next row's titles start just below its x labels, not a square panel's height on.
    fig.canvas.draw()
    value, down = (
        panel(fig, "param:block_0/attn/value/kernel"),
        panel(fig, "param:block_0/mlp/down/kernel"),
    )
    gap_in = (value.get_position().y0 - down.get_position().y1) * fig.get_figheight()
    assert gap_in < 1.5, gap_in


def test_a_50_array_transformer_fits_a_readable_figure():
    from helpers.placing.models import TransformerConfig, synthetic_tokens

    cfg = TransformerConfig(n_layers=5, n_heads=8, vocab_multiple=1024, batch=8, seq=8)
    x, _ = synthetic_tokens(jax.random.key(0), cfg)
    abstract = _abstract(cfg.model(), x, make_mesh((8, 1), ("data", "model")), "fsdp")
    assert len(jax.tree.leaves(abstract)) == 54
    folded = draw_param_shardings(abstract)
    w, h = folded.get_size_inches()
    assert w < 40 and h < 60
    assert len(panel_ids(folded)) == 10
    every = draw_param_shardings(abstract, fold=False)
    assert len(panel_ids(every)) == 54  # fold=False: one panel per array
    assert headers(every)[:2] == ["block_0", "block_1"]  # each layer under its own header
    assert every.get_size_inches()[1] > 3 * h


def test_layers_that_differ_are_not_folded(transformer):
    cfg, model, x, order = transformer
    mesh = make_mesh((8, 1), ("data", "model"))
    abstract = _abstract(model, x, mesh, "fsdp")
    other = NamedSharding(mesh, P(None, None, "data"))  # block_1's query split differently
    q = abstract["block_1"]["attn"]["query"]["kernel"]
    abstract["block_1"]["attn"]["query"]["kernel"] = jax.ShapeDtypeStruct(
        q.shape, q.dtype, sharding=other
    )
    fig = draw_param_shardings(abstract, order=order)
    assert [h.split(":")[0] for h in headers(fig)] == [
        "token_embed", "block_0", "block_1", "block_2..3", "final_norm", "lm_head"
    ]  # fmt: skip


def test_without_order_numbers_sort_naturally(mesh8):
    s = NamedSharding(mesh8, P("data"))
    tree = {  # different shapes, so that nothing folds
        f"block_{i}": {"w": jax.ShapeDtypeStruct((8 * (i + 1), 4), jnp.float32, sharding=s)}
        for i in (10, 2, 1)
    }
    sorted_tree = jax.tree.map(lambda a: a, tree)  # jax.tree sorts: block_1, block_10, block_2
    assert list(sorted_tree) == ["block_1", "block_10", "block_2"]
    fig = draw_param_shardings(sorted_tree)
    assert panel_ids(fig) == ["param:block_1/w", "param:block_2/w", "param:block_10/w"]
    # A dict in creation order (as Flax's init returns it) keeps that order.
    fig = draw_param_shardings({"up": tree["block_1"], "down": tree["block_2"]})
    assert panel_ids(fig) == ["param:up/w", "param:down/w"]


def test_draw_param_shardings_rejects_non_array_leaf(params):
    with pytest.raises(ValueError, match="'dense/activation'"):
        draw_param_shardings({"dense": {"kernel": params["dense"]["kernel"], "activation": "relu"}})
    with pytest.raises(ValueError, match="'host'.*no sharding"):
        draw_param_shardings({"host": np.ones((4, 4))})


def test_strategy_guide_names_every_strategy_and_question():
    from helpers import draw_strategy_guide

    ax = draw_strategy_guide()
    texts = " ".join(t.get_text() for t in ax.texts)
    for needle in (
        "DP",
        "FSDP (ZeRO-3) over 'data'",
        "FSDP × TP",
        "fit in ONE device's memory",
        "FLOP/s ÷ link bandwidth",
    ):
        assert needle in texts
    fsdp = next(" ".join(t.get_text().split()) for t in ax.texts if "ZeRO-3" in t.get_text())
    # textbook FSDP frees and gathers again: 3 units; keeping every layer gathered: 2
    assert "sends 3·(N−1)/N" in fsdp and "2·(N−1)/N if it keeps every gathered layer" in fsdp
    assert len(ax.texts) >= 6 + 6  # six boxes, six labelled arrows at least
    assert "DP × TP" not in texts.replace("FSDP × TP", "")
    # on the same N devices FSDP x TP still holds 16·P / N: only a layer too big to gather
    # leads there; a state that does not fit split N ways needs more devices or offload
    labels = [t.get_text() for t in ax.texts]
    assert any(t.startswith("no: one layer") and "too big to" in t for t in labels)
    assert any(t.startswith("no: 16·P / N alone") for t in labels)
    assert not any("16·P / N" in t and "too big to" in t for t in labels)
    assert any("more devices" in t and "CPU memory" in t for t in labels)
    # DP's all-reduce has FSDP's knee too; a state that does not fit can shrink per parameter
    dp = next(t for t in labels if t.startswith("DP\n"))
    assert "tokens per device > FLOP/s ÷ link bandwidth" in dp
    remedy = next(t for t in labels if "CPU memory" in t)
    assert "Adam in 8 bits" in remedy and "Adafactor" in remedy
    # the knee is stated for bf16 on the wire, across nodes with the scaling book's 8 NICs
    assert "bf16 on the wire" in texts and "2,500 across DGX H100 nodes" in texts
    assert "9×" not in texts
    # below the knee across nodes, TP inside each node leaves FSDP's cross-node bytes as they
    # were (the scaling book's GPU chapter, Pop Quiz 3); model parallelism spanning nodes cuts
    # them, and the knee's "no" no longer leads to FSDP × TP
    flat = [" ".join(t.split()) for t in labels]  # the words, however the lines wrap
    knee = next(t for t in flat if t.startswith("Below the knee"))
    assert "more tokens per device" in knee and "inside one node, TP in the node cuts" in knee
    assert "spanning nodes" in knee and "TP inside each node does not" in knee
    # DP's all-reduce has the same remedies (the book's LLaMA-3: PP cuts the DP all-reduce),
    # and pipelining rules out ZeRO-3 but not ZeRO-1 (the book's TLDR)
    assert knee.startswith("Below the knee (DP or FSDP)")
    assert "with PP, ZeRO-1 instead of FSDP" in knee
    assert "below\nthe knee" in labels  # the DP box's arrow into the remedies
    tp = next(t for t in flat if t.startswith("FSDP × TP"))
    assert "across nodes" in tp and "leaves its cross-node bytes" in tp
    assert "fewer, fatter shards" not in texts
    assert sum(t == "no" for t in labels) == 2  # one device's memory, and the knee
    # the N-way memory holds for the program that frees each layer: a scan (notebook 03 §5)
    split = next(t for t in flat if t.startswith("Does it fit split N ways?"))
    assert "frees each layer" in split and "scan, notebook 03 §5" in split
    # the first decision's "no" and the second's "no: 16·P / N alone" are apart, not a cluster
    first_no = max((t for t in ax.texts if t.get_text() == "no"), key=lambda t: t.get_position()[1])
    split_no = next(t for t in ax.texts if t.get_text().startswith("no: 16·P / N"))
    gap = split_no.get_position()[0] - first_no.get_position()[0]
    assert gap > 2.5, (first_no.get_position(), split_no.get_position())
    plt.close(ax.figure)


def test_the_layer_after_one_that_spills_onto_a_second_row_starts_a_new_row(transformer):
    cfg, model, x, order = transformer
    abstract = _abstract(model, x, make_mesh((4, 2), ("data", "model")), "fsdp_tp")
    fig = draw_param_shardings(abstract, order=order)  # 10 panels in 4 columns
    block = [
        ax
        for ax in fig.axes
        if (ax.get_gid() or "").startswith(("param:block_0/", "vectors:block_0/"))
    ]
    assert len(block) == 7  # the folded block fills one row and spills onto the next
    final = panel(fig, "vectors:final_norm/scale,final_norm/bias")
    head = panel(fig, "param:lm_head/kernel")
    lowest = min(ax.get_position().y0 for ax in block)
    # final_norm (and its header) sit below every block panel, not beside the last three;
    assert final.get_position().y1 < lowest
    header = next(t for t in fig.texts if t.get_gid() == "group:final_norm")
    assert header.get_position()[1] < lowest
    # and final_norm and lm_head, which fit in one row, share it.
    assert head.get_position().y0 < final.get_position().y1
    assert head.get_position().y1 > final.get_position().y0
    plt.close(fig)


def _ids_and_blocks(fig):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    blocks = {
        p.get_gid().rsplit("devices=", 1)[1]: p.get_window_extent(renderer)
        for ax in fig.axes
        for p in ax.patches
        if (p.get_gid() or "").startswith("block:")
    }
    labels = [
        t for ax in fig.axes for t in ax.texts if (t.get_gid() or "").startswith("block-label:")
    ]
    return renderer, blocks, labels


@pytest.mark.parametrize("shape", [(128, 128), (64, 256)])
def test_device_ids_keep_a_margin_inside_narrow_blocks(mesh8, shape):
    """In strips one eighth of a panel wide, each id stays inside its own block with room to
    spare, so that neighbouring digits never touch (they did at 85% of the width)."""
    arr = jax.device_put(jnp.zeros(shape), NamedSharding(mesh8, P(None, "data")))
    renderer, blocks, labels = _ids_and_blocks(draw_param_shardings({"layer": {"kernel": arr}}))
    assert len(blocks) == len(labels) == 8
    for t in labels:
        assert t.get_visible() and t.get_fontsize() >= 9
        text, block = t.get_window_extent(renderer), blocks[t.get_gid().split(":", 1)[1]]
        assert block.x0 < text.x0 and text.x1 < block.x1
        assert text.width <= 0.8 * block.width


@pytest.mark.parametrize("shape", [(512, 128), (1024, 64)])
def test_blocks_too_narrow_for_9pt_ids_are_left_to_their_colour(mesh8, shape):
    """A (512, 128) kernel drawn to scale is four times taller than wide: its eight column
    blocks are too narrow for a 9 pt digit, so they carry none, and the note says why."""
    arr = jax.device_put(jnp.zeros(shape), NamedSharding(mesh8, P(None, "data")))
    fig = draw_param_shardings({"layer": {"kernel": arr}})
    _, blocks, labels = _ids_and_blocks(fig)
    assert len(blocks) == len(labels) == 8
    assert not any(t.get_visible() for t in labels)
    note = next(t.get_text() for t in fig.texts if t.get_gid() == "fold-note")
    assert "too small to number shows its device by colour" in " ".join(note.split())


# ---------------------------------------------------------------------------
# To scale, and 9 pt at least (issue 40)
# ---------------------------------------------------------------------------


def drawn_ratio(ax):
    """Height / width of an Axes' drawing box, in inches on the figure."""
    ax.apply_aspect()
    box = ax.get_position()
    fw, fh = ax.figure.get_size_inches()
    return (box.height * fh) / (box.width * fw)


@pytest.mark.parametrize(
    "shape, ratio, to_scale",
    [((64, 128), 0.5, True), ((128, 512), 0.25, True), ((512, 128), 4.0, True),
     ((96, 96), 1.0, True), ((128, 10), 4.0, False), ((8, 1024), 0.25, False)],
)  # fmt: skip
def test_draw_sharding_draws_a_grid_to_scale_or_says_it_is_not(mesh8, shape, ratio, to_scale):
    ax = draw_sharding((shape, NamedSharding(mesh8, P("data"))))
    assert drawn_ratio(ax) == pytest.approx(ratio, rel=0.02)
    assert ("not to scale" in ax.get_title()) is not to_scale


def test_each_panel_keeps_its_arrays_proportions_in_any_figure(mesh8):
    """The same (512, 128) kernel is drawn four times taller than wide alone and beside other
    arrays (it was square in one figure and tall in the next); a (128, 10) kernel, thinner
    than 4:1, is drawn 4:1 and its panel says "not to scale"."""
    s = NamedSharding(mesh8, P(None, "data"))
    down = jax.ShapeDtypeStruct((512, 128), jnp.float32, sharding=s)
    alone = draw_param_shardings({"down": down})
    beside = draw_param_shardings({
        "up": jax.ShapeDtypeStruct((128, 512), jnp.float32, sharding=s), "down": down,
        "head": jax.ShapeDtypeStruct((128, 8), jnp.float32, sharding=s),
        "emb": jax.ShapeDtypeStruct((64, 64), jnp.float32, sharding=s),
    })  # fmt: skip
    for fig in (alone, beside):
        assert drawn_ratio(panel(fig, "param:down")) == pytest.approx(4.0, rel=0.02)
        assert "not to scale" not in panel(fig, "param:down").get_title()
    assert drawn_ratio(panel(beside, "param:up")) == pytest.approx(0.25, rel=0.02)
    assert drawn_ratio(panel(beside, "param:emb")) == pytest.approx(1.0, rel=0.02)
    head = panel(beside, "param:head")
    assert drawn_ratio(head) == pytest.approx(4.0, rel=0.02)  # 16:1, drawn at the limit
    assert "(not to scale)" in head.get_title()
    note = next(t.get_text() for t in beside.texts if t.get_gid() == "fold-note")
    assert "except where marked (not to scale)" in " ".join(note.split())


def visible_texts(fig):
    """Every Text the figure draws: figure texts, titles, labels, tick labels, texts."""
    fig.canvas.draw()
    found = list(fig.texts)
    for ax in fig.axes:
        if ax.get_visible():
            found += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label]
            found += ax.texts + ax.get_xticklabels() + ax.get_yticklabels()
    return [t for t in found if t.get_visible() and t.get_text().strip()]


def test_layout_and_mesh_figures_print_nothing_under_9_points(transformer, mesh24):
    cfg, model, x, order = transformer
    figures = [
        draw_param_shardings(
            _abstract(model, x, make_mesh((4, 2), ("data", "model")), "fsdp_tp"), order=order
        ),  # fmt: skip
        draw_param_shardings({"kernel": jnp.ones((128, 10)), "bias": jnp.ones((10,))}),
        draw_sharding(((64, 128), NamedSharding(mesh24, P("data", "model")))).figure,
        draw_sharding(((2, 4096), NamedSharding(mesh24, P(None, "model")))).figure,
        draw_mesh(mesh24).figure,
        draw_mesh(make_mesh((2, 2, 2), ("a", "b", "c"))).figure,
    ]
    for fig in figures:
        sizes = {t.get_text(): t.get_fontsize() for t in visible_texts(fig)}
        assert sizes and min(sizes.values()) >= 9, sorted(sizes.items(), key=lambda kv: kv[1])[:3]
    # Shown at 100 dpi, the widest stays within a notebook's column: 9 pt stays 9 pt.
    assert all(fig.get_size_inches()[0] <= 10.5 for fig in figures[:2])


def test_a_thin_panel_keeps_its_mesh_axis_when_its_label_is_shortened(mesh8):
    """A panel too short for "dim 0: 16 / 'data'" drops the size before the mesh axis."""
    from helpers import draw_param_shardings

    def spec(shape):
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh8, P("data")))

    fig = draw_param_shardings({"params": {"up": {"kernel": spec((16, 256))}}}, title="t")
    fig.canvas.draw()
    label = fig.axes[0].yaxis.label
    assert label.get_visible() and "'data'" in label.get_text(), label.get_text()
    assert ": 16" not in label.get_text()
