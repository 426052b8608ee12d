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


def test_a_note_is_written_beside_its_point():
    ax = plot_memory_vs_traffic(POINTS, notes={"fsdp": "XLA:CPU all-reduces"})
    try:
        note = next(t for t in ax.texts if t.get_text() == "XLA:CPU all-reduces")
        assert note.xy == pytest.approx((3.0, 0.4)) and note.get_style() == "italic"
    finally:
        plt.close(ax.figure)
    with pytest.raises(ValueError, match="notes must map strategies of points"):
        plot_memory_vs_traffic(POINTS, notes={"zero3": "not a point"})


def _live(steps, temp=None):
    from helpers import LiveMemory

    kinds = ("gathered parameters", "gradients", "activations", "other")
    full = tuple({k: s.get(k, 0) for k in kinds} for s in steps)
    return LiveMemory(full, ("forward",) * len(full), temp)


def test_live_memory_panels_stack_the_kinds_on_one_scale():
    from helpers import plot_live_memory

    kept = _live([{"gathered parameters": 2 * 2**20}, {"gradients": 2**20}], temp=3 * 2**20)
    freed = _live([{"gathered parameters": 2**19, "activations": 2**19}, {}])
    fig = plot_live_memory({"kept": kept, "freed": freed}, title="t")
    try:
        top, bottom = fig.axes[:2]
        assert top.get_title(loc="left") == "kept: peak 2.00 MiB"
        assert bottom.get_title(loc="left") == "freed: peak 1.00 MiB"
        assert top.get_ylim() == bottom.get_ylim() == pytest.approx((0, 3 * 1.15))
        assert [line.get_ydata()[0] for line in top.lines] == [3.0]  # XLA's temp, dashed
        assert not bottom.lines  # no temp given: no line
        texts = [t.get_text() for t in fig.legends[0].get_texts()]
        assert texts == ["gathered parameters", "gradients (incl. reductions' in/out)",
                         "activations", "other", "XLA's temp size"]  # fmt: skip
    finally:
        plt.close(fig)


def test_live_memory_legend_renames_a_kind_on_request():
    from helpers import plot_live_memory

    live = {"scan": _live([{"other": 2**20}])}
    fig = plot_live_memory(live, labels={"other": "other (what the loop stores)"})
    try:
        texts = [t.get_text() for t in fig.legends[0].get_texts()]
        assert texts[2:4] == ["activations", "other (what the loop stores)"]
    finally:
        plt.close(fig)
    with pytest.raises(ValueError, match="labels must rename some of"):
        plot_live_memory(live, labels={"weights": "not a kind"})


@pytest.mark.parametrize(("lives", "match"), [({}, "non-empty mapping"), ({"a": 3}, "LiveMemory")])
def test_live_memory_plot_wants_live_memories(lives, match):
    from helpers import plot_live_memory

    with pytest.raises(ValueError, match=match):
        plot_live_memory(lives)


def test_model_states_stack_each_plan_with_its_total_above():
    from helpers import ModelSpec, plan_model, plot_model_states

    spec = ModelSpec("7.5B", 0, 0, 0, 0, 0, 0, params_only=7_500_000_000)
    plans = {f"ZeRO-{z}": plan_model(spec, dp=64, zero=z).per_device_bytes for z in (0, 3)}
    fig = plot_model_states(plans, title="t")
    try:
        (ax,) = fig.axes
        bars = ax.patches
        assert len(bars) == 6  # 3 states x 2 plans, stacked
        tops = [
            max(
                b.get_y() + b.get_height()
                for b in bars
                if abs(b.get_x() + b.get_width() / 2 - i) < 1e-9
            )
            for i in (0, 1)
        ]
        assert tops == pytest.approx([120.0, 1.875])
        assert [t.get_text() for t in ax.texts] == ["120 GB", "1.88 GB"]
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert legend == ["optimizer state", "gradients", "parameters"]  # as stacked, top first
    finally:
        plt.close(fig)


def test_model_states_zoom_draws_the_small_bar_again_with_its_states_written():
    """Issue 53: ZeRO-3's 1.9 GB is a line beside DP's 120 GB; the zoomed panel draws it on
    its own axis and writes each state's size under it."""
    import matplotlib.pyplot as plt

    from helpers import ModelSpec, plan_model, plot_model_states

    spec = ModelSpec("7.5B", 0, 0, 0, 0, 0, 0, params_only=7_500_000_000)
    plans = {f"ZeRO-{z}": plan_model(spec, dp=64, zero=z).per_device_bytes for z in (0, 3)}
    fig = plot_model_states(plans, title="t", zoom=["ZeRO-3"])
    try:
        ax, zax = fig.axes
        assert len(ax.patches) == 6 and len(zax.patches) == 3
        assert zax.get_ylim()[1] == pytest.approx(1.875 * 1.15)
        (label,) = [t.get_text() for t in zax.get_xticklabels()]
        assert label.splitlines() == ["ZeRO-3", "optimizer 1.41", "gradients 0.234",
                                      "parameters 0.234"]  # fmt: skip
    finally:
        plt.close(fig)


@pytest.mark.parametrize(
    ("plans", "kwargs", "match"),
    [
        ({}, {}, "non-empty mapping"),
        ({"a": {"params": 1, "grads": 1}}, {}, r"plans\['a'\] must give"),
        ({"a": {"params": 1, "grads": -1, "optimizer": 1}}, {}, "non-negative"),
        ({"a": {"params": 1, "grads": 1, "optimizer": 1}}, {"scale": 0}, "scale must be"),
        ({"a": {"params": 1, "grads": 1, "optimizer": 1}}, {"zoom": ["b"]}, "zoom must be"),
        ({"a": {"params": 1, "grads": 1, "optimizer": 1}}, {"zoom": "a"}, "zoom must be"),
    ],
)
def test_model_states_plot_names_the_bad_parameter(plans, kwargs, match):
    from helpers import plot_model_states

    with pytest.raises(ValueError, match=match):
        plot_model_states(plans, **kwargs)


def test_activation_terms_stack_each_term_in_one_color_with_the_total_above():
    from helpers import NAMED_MODELS, activation_terms, plot_activation_terms

    llama = NAMED_MODELS["llama3-8b"]
    bars = {r: activation_terms(llama, remat=r) for r in ("none", "op", "full")}
    fig = plot_activation_terms(bars, title="t")
    try:
        (ax,) = fig.axes
        terms = list(dict.fromkeys(k for t in bars.values() for k in t))
        assert len(ax.patches) == 3 * len(terms)  # every term in every bar, 0 where absent
        tops = [
            max(b.get_y() + b.get_height() for b in ax.patches if abs(b.get_x() + 0.3 - i) < 1e-9)
            for i in range(3)
        ]
        assert tops == pytest.approx([sum(t.values()) / 1e3 for t in bars.values()])
        assert [t.get_text() for t in ax.texts] == [f"{x:.3g}" for x in tops]
        legend = ax.get_legend()
        shown = [t.get_text().removesuffix(" (too thin to see)") for t in legend.get_texts()]
        assert shown == terms[::-1]  # top of stack first
        assert all(t.get_fontsize() >= 9 for t in legend.get_texts())  # the house's 9 pt
        assert all(t.get_fontsize() >= 9 for t in [*ax.texts, *ax.get_xticklabels()])
        colors = {}
        for b, term in zip(ax.patches, [t for t in terms for _ in range(3)], strict=True):
            assert colors.setdefault(term, b.get_facecolor()) == b.get_facecolor()
        assert len(set(colors.values())) == len(terms)
        # no light/dark twin of one hue among the colours (tab20's pairs)
        hues = [matplotlib.colors.rgb_to_hsv(c[:3]) for c in colors.values()]
        for i, a in enumerate(hues):
            for b in hues[i + 1 :]:
                near = min(abs(a[0] - b[0]), 1 - abs(a[0] - b[0])) < 0.02
                assert not (near and a[1] > 0.2 and b[1] > 0.2), (a, b)
        # one layer input, one attention output: the planner names a tensor the same way
        # under every recompute choice
        assert sum("layer input" in t for t in terms) == 1
        assert sum(t.startswith("attention output") for t in terms) == 1
    finally:
        plt.close(fig)


def test_activation_terms_panels_have_their_own_axes():
    from helpers import NAMED_MODELS, activation_terms, plot_activation_terms

    llama = NAMED_MODELS["llama3-8b"]
    bars = {
        f"{r}\nt = {t}": activation_terms(llama, tp=t, sequence_parallel=t > 1, remat=r)
        for t in (1, 8)
        for r in ("none", "op")
    }
    fig = plot_activation_terms(bars, panels=[list(bars)[:2], list(bars)[2:]])
    try:
        left, right = fig.axes
        assert [t.get_text() for t in left.get_xticklabels()] == list(bars)[:2]
        assert [t.get_text() for t in right.get_xticklabels()] == list(bars)[2:]
        assert right.get_ylim()[1] < left.get_ylim()[1] / 2  # the small bars, scaled up
        assert left.get_legend() is None and right.get_legend() is not None
        assert left.get_ylabel() == right.get_ylabel() == "kB per token and layer"
    finally:
        plt.close(fig)


def test_activation_terms_legend_marks_a_term_too_thin_to_see():
    from helpers import plot_activation_terms
    from helpers.drawing.draw_strategies import THIN_TERM

    tiny = THIN_TERM / 2 * 1000.0  # under THIN_TERM of the 1000-byte bar in the same panel
    bars = {"a": {"big": 1000.0 - tiny, "tiny": tiny}, "b": {"big": 10.0, "small": 1.0}}
    fig = plot_activation_terms(bars, panels=[["a"], ["b"]])
    try:
        legend = [t.get_text() for t in fig.axes[-1].get_legend().get_texts()]
        # "small" is 10% of its own panel's bar: seen, though under 1% of the other panel's
        assert legend == ["small", "tiny (too thin to see)", "big"]
    finally:
        plt.close(fig)


@pytest.mark.parametrize(
    ("bars", "kwargs", "match"),
    [
        ({}, {}, "bars must be a non-empty mapping"),
        ([("none", {"x": 1.0})], {}, "bars must be a non-empty mapping"),
        ({"none": {}}, {}, r"bars\['none'\] must map"),
        ({"none": {"x": -1.0}}, {}, r"bars\['none'\] must map .* non-negative"),
        ({"none": {"x": "1"}}, {}, r"bars\['none'\] must map"),
        ({"none": {"x": 1.0}}, {"scale": 0}, "scale must be"),
        ({"a": {"x": 1.0}}, {"panels": [["a"], ["b"]]}, "panels must be"),
        ({"a": {"x": 1.0}, "b": {"x": 1.0}}, {"panels": [["a"]]}, "panels must be"),
        ({"a": {"x": 1.0}}, {"panels": [[]]}, "panels must be"),
        ({"a": {"x": 1.0}}, {"panels": "a"}, "panels must be"),
    ],
)
def test_activation_terms_plot_names_the_bad_parameter(bars, kwargs, match):
    from helpers import plot_activation_terms

    with pytest.raises(ValueError, match=match):
        plot_activation_terms(bars, **kwargs)
