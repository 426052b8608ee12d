"""Property-based tests of helpers.drawing.draw_strategies: every strategy is drawn, and labelled once."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import plot_memory_vs_traffic

NAMES = ("dp", "fsdp", "fsdp_all", "tp", "hybrid", "fsdp_tp")
BYTES = st.floats(0, 2**34, allow_nan=False, allow_infinity=False)


@settings(max_examples=25, deadline=None)
@given(st.dictionaries(st.sampled_from(NAMES), st.tuples(BYTES, BYTES), min_size=1))
def test_every_strategy_is_a_point_and_named_in_exactly_one_label(points):
    ax = plot_memory_vs_traffic(points)
    try:
        assert len(ax.collections) == len(points)
        named = [n for t in ax.texts for n in t.get_text().split(", ")]
        assert sorted(named) == sorted(points)
        x0, x1 = ax.get_xlim()
        y0, y1 = ax.get_ylim()
        for c in ax.collections:  # every point inside the axes
            x, y = c.get_offsets()[0]
            assert x0 <= x <= x1 and y0 <= y <= y1
    finally:
        plt.close(ax.figure)


@given(st.dictionaries(st.sampled_from(NAMES), st.tuples(BYTES, BYTES), min_size=1))
def test_a_negative_byte_count_is_refused_by_name(points):
    name = next(iter(points))
    bad = {**points, name: (-1.0, points[name][1])}
    with pytest.raises(ValueError, match=f"points\\['{name}'\\]"):
        plot_memory_vs_traffic(bad)
