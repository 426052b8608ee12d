"""The planner's figures (``helpers.planning.calculator``): the published-runs figure numbers
every run as its table does, keys every run, marks the runs that did not fit, and never prints
a label over another; the plans' bars add up to each plan's bytes."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from helpers.planning.calculator import draw_plans, draw_published_runs  # noqa: E402
from helpers.planning.calibration import runs_table  # noqa: E402
from helpers.planning.plan import plan_model  # noqa: E402

ROWS = runs_table()


@pytest.fixture(scope="module")
def runs_figure():
    fig = draw_published_runs(ROWS)
    fig.canvas.draw()
    yield fig
    plt.close(fig)


def _texts(fig):
    ax = fig.axes[0]
    labels = [t for t in ax.texts if t.get_text().strip()]
    return ax, labels, [t for t in fig.texts if t.get_text().strip()]


def test_each_run_that_trained_gets_its_row_number(runs_figure) -> None:
    _, labels, _ = _texts(runs_figure)
    trained = [str(i) for i, r in enumerate(ROWS, 1) if r["outcome"] == "trained"]
    assert sorted(t.get_text() for t in labels) == sorted(trained)
    oom = [str(i) for i, r in enumerate(ROWS, 1) if r["outcome"] != "trained"]
    assert oom and not set(oom) & {t.get_text() for t in labels}


def test_the_key_names_every_run_and_marks_those_that_did_not_fit_in_red(runs_figure) -> None:
    _, _, key = _texts(runs_figure)
    numbers = [t for t in key if t.get_text().isdigit()]
    names = [t for t in key if not t.get_text().isdigit()]
    assert [t.get_text() for t in numbers] == [str(i) for i in range(1, len(ROWS) + 1)]
    assert len(names) == len(ROWS)
    for row, name in zip(ROWS, names, strict=True):
        assert name.get_text().startswith(row["name"].split(" (")[0][:20])
        red = matplotlib.colors.to_hex(name.get_color()) == "#b22222"
        assert red == (row["outcome"] != "trained"), row["key"]
        if row["outcome"] != "trained":
            assert row["memory_verdict"] != "fits"
            assert f"planner: {row['memory_verdict']}" in name.get_text()


def test_no_text_overlaps_another_and_none_is_under_9_points(runs_figure) -> None:
    ax, labels, key = _texts(runs_figure)
    renderer = runs_figure.canvas.get_renderer()
    legend = ax.get_legend()
    texts = labels + key + list(legend.get_texts())
    boxes = [t.get_window_extent(renderer) for t in texts]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b), (texts[boxes.index(a)].get_text(), a, b)
    assert min(t.get_fontsize() for t in texts) >= 9
    inside = runs_figure.bbox
    for box in boxes:  # nothing cut off at the figure's edges
        assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0


def test_a_label_away_from_its_point_has_a_line_to_it(runs_figure) -> None:
    ax, labels, _ = _texts(runs_figure)
    renderer = runs_figure.canvas.get_renderer()
    far = 0
    for t in labels:
        px, py = ax.transData.transform(t.xy)
        box = matplotlib.text.Text.get_window_extent(t, renderer)  # the text alone
        gap = max(box.x0 - px, px - box.x1, box.y0 - py, py - box.y1, 0.0)
        if gap > 14:  # farther than the first ring of places (8 points, about 11 pixels)
            far += 1
            assert t.arrow_patch is not None, t.get_text()
    assert far  # the default runs crowd some labels out of the first ring
    title = ax.get_title()
    assert f"{len(ROWS)} published configurations" in title
    assert f"the {sum(r['outcome'] == 'trained' for r in ROWS)} that trained" in title


def test_the_lines_are_optimistic_equals_achieved_and_the_band() -> None:
    fig = draw_published_runs(ROWS, band=1.6)
    ax = fig.axes[0]
    (x1, y1), (x2, y2) = (line.get_xydata().T for line in ax.lines[:2])
    assert list(x1) == list(y1)
    assert list(y2) == pytest.approx([1.6 * x for x in x2])
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    # issue 53: both markers are read against the solid line, so it names neither alone
    assert labels[:2] == ["planner = achieved", "optimistic = 1.6 x achieved"]
    # the hardware's key draws the points' own circles, not squares
    markers = {h.get_marker() for h in ax.get_legend().legend_handles}
    assert markers - {"None"} == {"o"}
    plt.close(fig)


@pytest.mark.parametrize("rows", [[], [{"name": "x"}], [dict(ROWS[0], outcome="oom")]])
def test_rows_that_are_not_runs_table_rows_are_refused(rows) -> None:
    with pytest.raises(ValueError, match="draw_published_runs"):
        draw_published_runs(rows)


def test_draw_plans_stacks_each_plans_bytes() -> None:
    plans = [plan_model("llama3-8b", "h100", dp=8, zero=z) for z in (1, 3)]
    fig = draw_plans(plans)
    ax = fig.axes[0]
    for row, plan in enumerate(plans):
        bars = [p for p in ax.patches if abs(p.get_y() + p.get_height() / 2 - row) < 1e-9]
        assert sum(b.get_width() for b in bars) == pytest.approx(
            plan.per_device_bytes["total"] / 1e9
        )
    plt.close(fig)


def test_draw_plans_shows_in_its_legend_only_the_kinds_it_draws() -> None:
    plans = [plan_model("llama3-8b", "h100", dp=8, zero=z) for z in (1, 2)]  # none gathers
    fig = draw_plans(plans)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "gathered" not in legend and {"params", "grads", "optimizer"} <= set(legend)
    plt.close(fig)
    fig = draw_plans([plan_model("llama3-8b", "h100", dp=8, zero=3)])
    assert "gathered" in [t.get_text() for t in fig.legends[0].get_texts()]
    plt.close(fig)


def test_draw_plans_names_an_interleaved_pipeline() -> None:
    plan = plan_model("llama3-70b", "h100", pp=2, tp=4, dp=8, zero=2, virtual_stages=2,
                      grad_accum=32)  # fmt: skip
    fig = draw_plans([plan])
    (label,) = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert label.startswith("pp2 dp8 tp4 v2, ZeRO-2")
    plt.close(fig)


def test_draw_plans_writes_each_plans_mfu_and_fit_beside_its_bar_over_nothing() -> None:
    plans = [plan_model("llama3-8b", "h100", dp=8, zero=z) for z in (1, 2, 3)]
    plans.append(plan_model("llama3-70b", "h100", dp=32, tp=2, zero=3, global_batch=256))
    fig = draw_plans(plans)
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    for p, text in zip(plans, texts, strict=True):
        b = p.per_device_bytes
        need = (b["total"] + (p.margin - 1) * (b["grads"] + b["activations"])) / 1e9
        room = p.hbm_bytes / 1e9 - need
        assert text.startswith(f"optimistic MFU {p.mfu:.1%}\nwith margin {need:.1f} GB, ")
        assert text.endswith(f"{room:.1f} GB left" if room >= 0 else f"{-room:.1f} GB over")
    assert "GB left" in texts[-1]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    ticks = [t.get_window_extent(renderer) for t in ax.get_yticklabels()]
    legend = fig.legends[0].get_window_extent(renderer)
    for row, box in enumerate(boxes):  # right of the bars and the HBM line, level with its bar
        assert box.x0 >= frame.x1
        assert box.y0 < ax.transData.transform((0, row))[1] < box.y1
        assert box.x1 <= fig.bbox.x1 and not box.overlaps(legend)
        assert not any(box.overlaps(o) for o in boxes[:row] + ticks)
    plt.close(fig)
