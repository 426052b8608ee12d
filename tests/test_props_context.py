"""Property-based tests of helpers.parallelism.context: the zig-zag's balance and the online-softmax combine."""

from __future__ import annotations

import jax
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.parallelism.context import (
    attention_block,
    attention_block_grads,
    causal_block_work,
    chunk_positions,
    contiguous_chunks,
    online_softmax_combine,
    zigzag_chunks,
)

counts = st.integers(1, 64)


@given(counts)
def test_zigzag_gives_every_device_the_same_work(n):
    work = causal_block_work(zigzag_chunks(n))
    assert (work == 2 * n + 1).all()
    assert work.sum() == causal_block_work(contiguous_chunks(n)).sum() == n * (2 * n + 1)


@given(counts)
def test_contiguous_work_grows_by_four_per_device(n):
    assert causal_block_work(contiguous_chunks(n)).tolist() == [4 * d + 3 for d in range(n)]


@given(counts, st.integers(1, 5), st.booleans())
def test_chunk_positions_are_a_permutation_in_chunk_order(n, size, zig):
    chunks = zigzag_chunks(n) if zig else contiguous_chunks(n)
    pos = chunk_positions(chunks, 2 * n * size)
    assert pos.shape == (n, 2 * size)
    assert sorted(pos.ravel().tolist()) == list(range(2 * n * size))
    for d, (a, b) in enumerate(chunks):
        assert pos[d].tolist() == [
            *range(a * size, (a + 1) * size),
            *range(b * size, (b + 1) * size),
        ]


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 16), st.data())
def test_combining_any_split_of_the_keys_gives_attention_over_all(length, data):
    seed = data.draw(st.integers(0, 2**16))
    scale = data.draw(st.sampled_from([0.1, 1.0, 40.0]))  # 40: scores past exp's float32 range
    q, k, v = jax.random.normal(jax.random.key(seed), (3, 1, length, 1, 4))
    q = scale * q
    pos = np.arange(length)
    in_a = np.array(data.draw(st.lists(st.booleans(), min_size=length, max_size=length)))
    if in_a.all() or not in_a.any():
        return
    a, b = pos[in_a], pos[~in_a]
    part_a = attention_block(q, k[:, a], v[:, a], pos, a)
    part_b = attention_block(q, k[:, b], v[:, b], pos, b)
    want_out, want_lse = attention_block(q, k, v, pos, pos)
    for first, second in ((part_a, part_b), (part_b, part_a)):
        out, lse = online_softmax_combine(*first, *second)
        assert np.isfinite(np.asarray(out)).all()
        np.testing.assert_allclose(out, want_out, atol=1e-5)
        seen = np.asarray(want_lse) > -1e29
        np.testing.assert_allclose(
            np.asarray(lse)[seen], np.asarray(want_lse)[seen], rtol=1e-5, atol=1e-4
        )


@settings(max_examples=15, deadline=None)
@given(st.integers(2, 12), st.data())
def test_block_grads_over_any_split_of_the_keys_equal_autodiff(length, data):
    seed = data.draw(st.integers(0, 2**16))
    q, k, v, dout = jax.random.normal(jax.random.key(seed), (4, 1, length, 1, 4))
    pos = np.arange(length)
    in_a = np.array(data.draw(st.lists(st.booleans(), min_size=length, max_size=length)))
    out, lse = attention_block(q, k, v, pos, pos)
    _, pullback = jax.vjp(lambda q, k, v: attention_block(q, k, v, pos, pos)[0], q, k, v)
    want_q, want_k, want_v = pullback(dout)
    dq = np.zeros(q.shape, np.float32)
    for keys in (pos[in_a], pos[~in_a]):
        if len(keys) == 0:
            continue
        gq, gk, gv = attention_block_grads(q, k[:, keys], v[:, keys], out, lse, dout, pos, keys)
        dq += np.asarray(gq)
        np.testing.assert_allclose(gk, np.asarray(want_k)[:, keys], atol=1e-5)
        np.testing.assert_allclose(gv, np.asarray(want_v)[:, keys], atol=1e-5)
    np.testing.assert_allclose(dq, want_q, atol=1e-5)
