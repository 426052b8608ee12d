"""Property-based tests of helpers.drawing.draw_profile: its two figures draw what they are given."""

from __future__ import annotations

import matplotlib.pyplot as plt
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.drawing.draw_profile import plot_projection
from helpers.measuring import cost_model as cm
from helpers.placing.models import ModelConfig


@settings(max_examples=10)
@given(
    st.integers(2, 64),
    st.sampled_from(sorted(cm.INTERCONNECTS)),
    st.sampled_from([2, 4]),
    st.builds(ModelConfig, d_model=st.sampled_from([128, 1024]), d_ff=st.sampled_from([512, 4096])),
)
def test_projection_draws_compute_and_one_line_per_case_and_link(n, link, b, cfg):
    ax = plot_projection(cfg, n, 400e12, {link: cm.INTERCONNECTS[link]}, bytes_per_param=b)
    try:
        labels = [line.get_label() for line in ax.get_lines()]
        assert "compute alone" in labels
        assert any(link in label for label in labels)
        x0, x1 = ax.get_xlim()
        assert x0 > 0 and x1 > x0  # log axes
        for text in ax.texts:  # every label inside the axes
            x, _ = text.get_position()
            assert x0 <= x <= x1 or text.get_transform() != ax.transData
    finally:
        plt.close(ax.figure)
