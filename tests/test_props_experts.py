"""Property-based tests of helpers.parallelism.experts: capacity, slots and drops, dispatch and combine."""

from __future__ import annotations

import math

import jax
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.parallelism.experts import dispatch_weights, expert_capacity, route


@given(st.integers(1, 512), st.integers(1, 64), st.data())
def test_capacity_covers_an_even_split_times_the_factor(tokens, n_experts, data):
    k = data.draw(st.integers(1, n_experts))
    factor = data.draw(st.floats(0.05, 8.0))
    c = expert_capacity(tokens, n_experts, k, factor)
    assert c >= 1
    assert c >= factor * tokens * k / n_experts - 1e-6
    assert c <= max(1, math.ceil(factor * tokens * k / n_experts))


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 24), st.integers(1, 8), st.data())
def test_slots_are_unique_per_expert_and_drops_are_exactly_the_overflow(tokens, n_experts, data):
    k = data.draw(st.integers(1, n_experts))
    capacity = data.draw(st.integers(1, 6))
    seed = data.draw(st.integers(0, 2**16))
    logits = jax.random.normal(jax.random.key(seed), (tokens, n_experts))
    r = route(logits, k, capacity)
    expert, slot, kept = (np.asarray(a) for a in (r.expert, r.slot, r.kept))
    for e in range(n_experts):
        mine = np.sort(slot[expert == e])
        assert mine.tolist() == list(range(len(mine)))  # slots 0, 1, 2, ... in order
        assert int(kept[expert == e].sum()) == min(len(mine), capacity)
    assert (kept == (slot < capacity)).all()
    for t in range(tokens):  # k distinct experts, the top k
        assert len(set(expert[t].tolist())) == k
        assert np.asarray(logits)[t, expert[t]].min() >= np.sort(np.asarray(logits)[t])[-k] - 1e-6
    dispatch, combine = dispatch_weights(r, n_experts, capacity)
    assert float(np.asarray(dispatch).sum()) == kept.sum()
    assert float(np.asarray(dispatch).sum(axis=0).max(initial=0)) <= 1
    np.testing.assert_allclose(
        np.asarray(combine).sum(axis=(1, 2)), (np.asarray(r.gate) * kept).sum(-1), rtol=1e-5
    )
