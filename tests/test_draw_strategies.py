"""Tests of helpers.drawing.draw_strategies: the strategies' scatter draws what it is given."""

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from helpers import plot_memory_vs_traffic  # noqa: E402

POINTS = {
    "dp": (3 * 2**20, 2 * 2**20),
    "fsdp": (0.4 * 2**20, 3 * 2**20),
    "fsdp_all": (0.39 * 2**20, 3.01 * 2**20),
    "tp": (0.5 * 2**20, 0.6 * 2**20),
}


def test_one_point_per_strategy_at_its_bytes_and_close_points_share_a_label():
    ax = plot_memory_vs_traffic(POINTS, title="t")
    try:
        drawn = sorted(tuple(c.get_offsets()[0]) for c in ax.collections)
        want = sorted((sent / 2**20, held / 2**20) for held, sent in POINTS.values())
        assert drawn == pytest.approx(want)
        labels = sorted(t.get_text() for t in ax.texts)
        assert labels == ["dp", "fsdp, fsdp_all", "tp"]
        assert "MiB" in ax.get_xlabel() and "MiB" in ax.get_ylabel()
        assert ax.get_title() == "t"
    finally:
        plt.close(ax.figure)


def test_small_numbers_use_a_small_unit():
    ax = plot_memory_vs_traffic({"dp": (3000, 0), "fsdp": (500, 900)})
    try:
        assert "KiB" in ax.get_ylabel() and "bytes" in ax.get_xlabel()
    finally:
        plt.close(ax.figure)


@pytest.mark.parametrize(
    ("points", "match"),
    [
        ({}, "non-empty mapping"),
        ([("dp", (1, 2))], "non-empty mapping"),
        ({"": (1, 2)}, "keys must be names"),
        ({"dp": (1,)}, r"points\['dp'\] must be two numbers"),
        ({"dp": ("a", 2)}, r"points\['dp'\] must be two numbers"),
        ({"dp": (-1, 2)}, "finite byte counts"),
        ({"dp": (1, float("nan"))}, "finite byte counts"),
    ],
)
def test_bad_points_get_a_clear_error(points, match):
    with pytest.raises(ValueError, match=match):
        plot_memory_vs_traffic(points)
