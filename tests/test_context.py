"""Unit tests of helpers.parallelism.context and helpers.drawing.draw_context: layouts, work, attention pieces."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import pytest

from helpers.drawing.draw import device_color
from helpers.drawing.draw_context import draw_causal_work
from helpers.parallelism.context import (
    MASKED,
    attention_block,
    attention_block_grads,
    causal_block_work,
    chunk_positions,
    contiguous_chunks,
    online_softmax_combine,
    zigzag_chunks,
)


def test_layouts_for_four_devices():
    assert contiguous_chunks(4) == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert zigzag_chunks(4) == ((0, 7), (1, 6), (2, 5), (3, 4))


def test_work_of_the_two_layouts():
    assert causal_block_work(contiguous_chunks(4)).tolist() == [3, 7, 11, 15]
    assert causal_block_work(zigzag_chunks(4)).tolist() == [9, 9, 9, 9]


def test_chunk_positions_lay_out_each_devices_tokens():
    pos = chunk_positions(zigzag_chunks(2), 8)
    assert pos.tolist() == [[0, 1, 6, 7], [2, 3, 4, 5]]


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: zigzag_chunks(0), "n_devices=0"),
        (lambda: contiguous_chunks(2.0), "n_devices=2.0"),
        (lambda: zigzag_chunks(True), "n_devices=True"),
        (lambda: chunk_positions(zigzag_chunks(2), 10), "length=10 must be a multiple"),
        (lambda: chunk_positions(zigzag_chunks(2), 0), "length=0"),
        (lambda: chunk_positions(((0, 1), (1, 2)), 8), "exactly once"),
        (lambda: chunk_positions(((0, 1), (2,)), 8), "as many chunks"),
        (lambda: causal_block_work(5), "one sequence of chunk numbers"),
        (lambda: causal_block_work(()), "at least one chunk"),
    ],
)
def test_bad_layouts_get_the_series_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def _qkv(length=12, seed=0):
    return jax.random.normal(jax.random.key(seed), (3, 2, length, 2, 8))


def test_attention_block_equals_jax_attention():
    q, k, v = _qkv()
    pos = np.arange(q.shape[1])
    out, lse = attention_block(q, k, v, pos, pos)
    ref = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    np.testing.assert_allclose(out, ref, atol=1e-5)
    scores = jnp.einsum("bqhd,bkhd->bqhk", q, k) / np.sqrt(8)
    scores = jnp.where(np.tril(np.ones((12, 12), bool))[None, :, None, :], scores, -jnp.inf)
    np.testing.assert_allclose(lse, jax.nn.logsumexp(scores, axis=-1), rtol=1e-5)


def test_a_query_that_sees_no_key_gets_a_zero_weight():
    q, k, v = _qkv()
    pos = np.arange(12)
    _, lse = attention_block(q, k[:, 6:], v[:, 6:], pos, pos[6:])
    assert (np.asarray(lse[:, :6]) < MASKED / 2).all()
    out_a, lse_a = attention_block(q, k[:, :6], v[:, :6], pos, pos[:6])
    out_b, lse_b = attention_block(q, k[:, 6:], v[:, 6:], pos, pos[6:])
    out, _ = online_softmax_combine(out_a, lse_a, out_b, lse_b)
    np.testing.assert_allclose(out[:, :6], out_a[:, :6], atol=1e-6)


def test_combine_gives_finite_gradients_through_masked_blocks():
    q, k, v = _qkv()
    pos = np.arange(12)

    def loss(q, k, v):
        a = attention_block(q, k[:, :6], v[:, :6], pos, pos[:6])
        b = attention_block(q, k[:, 6:], v[:, 6:], pos, pos[6:])
        return online_softmax_combine(*a, *b)[0].sum()

    grads = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    ref = jax.grad(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True).sum(),
                   argnums=(0, 1, 2))(q, k, v)  # fmt: skip
    for g, r in zip(grads, ref, strict=True):
        np.testing.assert_allclose(g, r, atol=1e-5)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (lambda q, k, v, p: (q[0], k, v, p, p), "q must be a"),
        (lambda q, k, v, p: (q, k, v[:, :5], p, p), "one shape"),
        (lambda q, k, v, p: (q[..., :4], k, v, p, p), "must agree"),
        (lambda q, k, v, p: (q, k, v, p[:5], p), "q_pos must hold one position"),
        (lambda q, k, v, p: (q, k, v, p, [0, 1]), "k_pos must hold one position"),
    ],
)
def test_attention_block_refuses_bad_shapes(args, match):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=match):
        attention_block(*args(q, k, v, np.arange(12)))


def test_tiles_give_the_same_attention():
    q, k, v = _qkv()
    pos = np.arange(12)
    want = attention_block(q, k, v, pos, pos)
    for tile in (1, 3, 4, 12):
        got = jax.jit(lambda q, k, v, t=tile: attention_block(q, k, v, pos, pos, tile=t))(q, k, v)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-5)


def _autodiff_grads(q, k, v, pos, dout):
    out, pullback = jax.vjp(lambda q, k, v: attention_block(q, k, v, pos, pos)[0], q, k, v)
    return out, pullback(dout)


@pytest.mark.parametrize("tile", [None, 2, 6])
def test_block_grads_summed_over_blocks_equal_autodiff(tile):
    q, k, v = _qkv()
    dout = jax.random.normal(jax.random.key(5), q.shape)
    pos = np.arange(12)
    out, lse = attention_block(q, k, v, pos, pos)
    want = _autodiff_grads(q, k, v, pos, dout)[1]
    dq = jnp.zeros_like(q)
    dks, dvs = [], []
    for keys in (pos[:6], pos[6:]):  # two blocks of keys, each with the whole row's out, lse
        gq, gk, gv = attention_block_grads(
            q, k[:, keys], v[:, keys], out, lse, dout, pos, keys, tile=tile
        )
        dq, dks, dvs = dq + gq, [*dks, gk], [*dvs, gv]
    got = (dq, jnp.concatenate(dks, axis=1), jnp.concatenate(dvs, axis=1))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=1e-5)


def test_a_masked_block_adds_no_gradient():
    q, k, v = _qkv()
    pos = np.arange(12)
    out, lse = attention_block(q, k, v, pos, pos)
    dout = jnp.ones_like(q)
    gq, gk, gv = attention_block_grads(
        q[:, :6], k[:, 6:], v[:, 6:], out[:, :6], lse[:, :6], dout[:, :6], pos[:6], pos[6:]
    )  # queries 0..5 see none of keys 6..11
    assert float(jnp.abs(gq).max()) == float(jnp.abs(gk).max()) == float(jnp.abs(gv).max()) == 0


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda q, k, v, p: attention_block(q, k, v, p, p, tile=5), "tile=5 must divide the 12"),
        (lambda q, k, v, p: attention_block(q, k, v, p, p, tile=0), "tile=0 must be None"),
        (lambda q, k, v, p: attention_block(q, k, v, p, p, tile=2.0), "tile=2.0"),
        (
            lambda q, k, v, p: attention_block_grads(q, k, v, q, q[..., 0], q[:, :3], p, p),
            "dout must have shape",
        ),
        (
            lambda q, k, v, p: attention_block_grads(q, k, v, q, q, q, p, p),
            "lse must have shape",
        ),
        (
            lambda q, k, v, p: attention_block_grads(q, k, v, q, q[..., 0], q, p, p, tile=7),
            "tile=7",
        ),
    ],
)
def test_tiles_and_grads_refuse_bad_input(call, match):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=match):
        call(q, k, v, np.arange(12))


def test_combine_refuses_bad_shapes():
    o, lse = jnp.zeros((2, 3, 4)), jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="out_a .* and out_b"):
        online_softmax_combine(o, lse, o[:1], lse[:1])
    with pytest.raises(ValueError, match="lse_b must have shape"):
        online_softmax_combine(o, lse, o, lse[:, :2])


def test_draw_causal_work_colours_each_block_by_its_device():
    fig = draw_causal_work({"plain": contiguous_chunks(3), "zig-zag": zigzag_chunks(3)})
    cells = [p for ax in fig.axes for p in ax.patches if (p.get_gid() or "").startswith("block:")]
    assert len(cells) == 2 * 6 * 6
    for p in cells:
        fields = dict(kv.split("=") for kv in p.get_gid().split(":")[1:])
        i, j, d = int(fields["query"]), int(fields["key"]), int(fields["device"])
        chunks = contiguous_chunks(3) if fields["layout"] == "plain" else zigzag_chunks(3)
        owner = next(dev for dev, cs in enumerate(chunks) if i in cs)
        assert d == (owner if j <= i else -1)
        if d >= 0:
            assert p.get_facecolor()[:3] == pytest.approx(
                tuple(int(device_color(d)[k : k + 2], 16) / 255 for k in (1, 3, 5))
            )
    plt.close(fig)


@pytest.mark.parametrize("n", [1, 3, 8])
def test_draw_causal_work_names_each_rows_device_once_at_9pt(n):
    chunks = zigzag_chunks(n)
    fig = draw_causal_work({"zig-zag": chunks})
    grid = fig.axes[0]
    (holder,) = grid.child_axes  # the right-hand axis: one device number per query chunk
    owner = {c: d for d, cs in enumerate(chunks) for c in cs}
    assert [t.get_text() for t in holder.get_yticklabels()] == [str(owner[i]) for i in range(2 * n)]
    assert not grid.texts  # no number inside the blocks
    texts = [t for ax in (*fig.axes, holder) for t in (*ax.texts, *ax.get_xticklabels(),
             *ax.get_yticklabels(), ax.title, ax.xaxis.label, ax.yaxis.label) if t.get_text()]  # fmt: skip
    assert texts and min(t.get_fontsize() for t in texts) >= 9
    plt.close(fig)


def test_draw_causal_work_refuses_mixed_device_counts():
    with pytest.raises(ValueError, match="same device count"):
        draw_causal_work({"a": zigzag_chunks(2), "b": zigzag_chunks(3)})
    with pytest.raises(ValueError, match="non-empty dict"):
        draw_causal_work({})
