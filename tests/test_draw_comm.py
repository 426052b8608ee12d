"""helpers.drawing.draw_comm: the before/after picture of a collective and the pipeline schedule.

The assertions read the drawn artists' gids and colours: which device's row holds which
block, in whose colour; which stage works on which micro-batch at which tick."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib import colors as mcolors
from test_props_draw_overlap import overlapping_labels

from helpers import device_color
from helpers.drawing.draw_comm import (
    MAX_FIGURE_WIDTH,
    draw_collective,
    draw_pipeline_schedule,
    draw_ring_rounds,
)
from helpers.parallelism.collectives import (
    Block,
    expected_blocks,
    gpipe_schedule,
    ring_all_gather_rounds,
)


def _blocks(fig, panel):
    out = {}
    for ax in fig.axes:
        for p in ax.patches:
            gid = p.get_gid() or ""
            if gid.startswith(f"block:panel={panel}:"):
                fields = dict(kv.split("=") for kv in gid.split(":")[1:])
                out[(int(fields["device"]), int(fields["slot"]))] = (
                    int(fields["chunk"]),
                    tuple(int(s) for s in fields["sources"].split(",")),
                    p,
                )
    return out


def test_all_gather_rows_hold_every_block_in_its_source_colour():
    before, after = expected_blocks("all_gather", 4)
    fig = draw_collective(before, after, title="all_gather", n_devices=4)
    b, a = _blocks(fig, "before"), _blocks(fig, "after")
    assert sorted(b) == [(d, 0) for d in range(4)]  # one block per device before
    assert sorted(a) == [(d, k) for d in range(4) for k in range(4)]  # four after
    for (_d, k), (chunk, sources, patch) in a.items():
        assert (chunk, sources) == (0, (k,))  # slot k holds device k's block
        assert mcolors.to_hex(patch.get_facecolor()) == device_color(k)
    assert fig._suptitle.get_text() == "all_gather"
    plt.close(fig)


def test_psum_scatter_after_holds_one_summed_chunk_labelled_sigma():
    before, after = expected_blocks("psum_scatter", 3)
    fig = draw_collective(before, after, n_devices=3)
    a = _blocks(fig, "after")
    assert {d: (c, s) for (d, _), (c, s, _) in a.items()} == {
        0: (0, (0, 1, 2)),
        1: (1, (0, 1, 2)),
        2: (2, (0, 1, 2)),
    }
    labels = [
        t.get_text()
        for ax in fig.axes
        for t in ax.texts
        if (t.get_gid() or "").startswith("label:")
    ]
    assert labels.count("Σa") == 1 and labels.count("Σc") == 1
    stripes = [p for ax in fig.axes for p in ax.patches if p.get_gid() == "stripe"]
    assert {mcolors.to_hex(p.get_facecolor()[:3]) for p in stripes} == {
        device_color(d) for d in range(3)
    }
    plt.close(fig)


def test_draw_collective_rejects_bad_layouts():
    with pytest.raises(ValueError, match="before must be a non-empty dict"):
        draw_collective({}, {0: (Block(0, (0,)),)})
    with pytest.raises(ValueError, match=r"after\[0\] must hold Block"):
        draw_collective({0: (Block(0, (0,)),)}, {0: ("a0",)})


def test_pipeline_schedule_cells_say_stage_tick_micro():
    schedule = gpipe_schedule(3, 4)
    ax = draw_pipeline_schedule(schedule, stage_devices=[5, 6, 7])
    cells = {}
    for p in ax.patches:
        gid = p.get_gid() or ""
        if gid.startswith("cell:"):
            f = dict(kv.split("=") for kv in gid.split(":")[1:])
            cells[(int(f["stage"]), int(f["tick"]))] = (int(f["micro"]), p)
    assert len(cells) == 3 * 6
    assert cells[(2, 3)][0] == 1  # micro-batch 1 reaches stage 2 at tick 3
    assert cells[(0, 5)][0] == -1  # stage 0 idles at the end
    assert mcolors.to_hex(cells[(1, 1)][1].get_facecolor()) == device_color(6)  # stage 1 on dev 6
    assert "bubble 33.3%" in ax.get_title() and "pale grey: idle" in ax.get_title()
    idle = mcolors.to_rgb(cells[(0, 5)][1].get_facecolor())
    assert all(mcolors.to_rgb(device_color(d)) != idle for d in range(8))
    assert min(idle) > max(mcolors.to_rgb(device_color(7)))  # lighter than device 7's grey
    assert [t.get_text() for t in ax.get_yticklabels()][0] == "stage 0 (dev 5)"
    plt.close(ax.figure)


def test_pipeline_schedule_rejects_bad_input():
    with pytest.raises(ValueError, match="2-D integer"):
        draw_pipeline_schedule(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="stage_devices has 1 entries for 2 stages"):
        draw_pipeline_schedule(gpipe_schedule(2, 2), stage_devices=[0])


def test_pipeline_tables_share_a_scale_and_print_no_text_under_9pt():
    from helpers.parallelism.schedules import (
        interleaved_table,
        one_f_one_b_table,
        zero_bubble_table,
    )

    fig, axes = plt.subplots(2, 1, figsize=(12, 8))
    split, zb = one_f_one_b_table(8, 8, split_backward=True), zero_bubble_table(8, 8)
    for ax, s in zip(axes, (split, zb), strict=True):
        draw_pipeline_schedule(s, ax=ax, span=split.ticks)
    assert axes[0].get_xlim() == axes[1].get_xlim() == (0, split.ticks) and zb.ticks < split.ticks
    with pytest.raises(ValueError, match="span"):
        draw_pipeline_schedule(split, ax=axes[0], span=zb.ticks)
    plt.close(fig)
    # 46 ticks in a notebook column (9 inches): every cell's number at 9 pt or more, the
    # chunk's letter under it; the same at a width where one line fits keeps one line
    ax = draw_pipeline_schedule(interleaved_table(8, 8, 2))
    assert ax.figure.get_size_inches()[0] <= MAX_FIGURE_WIDTH
    assert ax.texts and all(t.get_fontsize() >= 9 for t in ax.texts)
    assert all(t.get_text().count("\n") == 1 for t in ax.texts)
    assert "where it fits" not in ax.get_title()
    plt.close(ax.figure)
    fig, ax = plt.subplots(figsize=(16, 5))
    draw_pipeline_schedule(interleaved_table(8, 8, 2), ax=ax)
    assert ax.texts and all("\n" not in t.get_text() for t in ax.texts)
    plt.close(fig)
    # too narrow for 9 pt: the numbers are left out, and the title says so
    fig, ax = plt.subplots(figsize=(4, 3))
    draw_pipeline_schedule(interleaved_table(8, 8, 2), ax=ax)
    assert all(t.get_fontsize() >= 9 for t in ax.texts) and "where it fits" in ax.get_title()
    plt.close(fig)


def test_in_flight_draws_one_strip_per_device_and_says_when_it_was_recorded():
    from helpers.drawing.draw_comm import draw_in_flight
    from helpers.parallelism.schedules import gpipe_table, in_flight, one_f_one_b_table

    g, o = gpipe_table(4, 8), one_f_one_b_table(4, 8)
    fig = draw_in_flight([g, o], recorded=[in_flight(g), in_flight(o)])
    assert len(fig.axes) == 8  # 4 devices x 2 schedules
    lines = {ln.get_gid(): ln for ax in fig.axes for ln in ax.lines}
    assert lines["in_flight:1F1B:device=3"].get_ydata().max() == 1  # the last stage holds one
    # every strip on one scale, 0 to the figure's peak: the last stage's 1 stands 1/8 as tall
    tops = {ln.get_gid(): ln.axes.get_ylim()[1] for ln in lines.values()}
    assert list(tops.values()) == pytest.approx([8 * 1.15] * len(tops))
    ticks = {
        ln.get_gid(): [t.get_text() for t in ln.axes.get_yticklabels()] for ln in lines.values()
    }
    assert (
        ticks["in_flight:1F1B:device=3"] == ["0", "8"]
        and ticks["in_flight:GPipe:device=0"][-1] == "8"
    )
    assert fig.get_size_inches()[0] <= MAX_FIGURE_WIDTH
    assert "recorded" in fig._suptitle.get_text()
    assert all(t.get_fontsize() >= 9 for ax in fig.axes for t in ax.texts)
    plt.close(fig)
    fig = draw_in_flight([g])
    assert "from the table" in fig._suptitle.get_text()
    plt.close(fig)
    with pytest.raises(ValueError, match="grid of"):
        draw_in_flight([g, o], axes=[fig.axes[0]])
    with pytest.raises(ValueError, match="same number of devices"):
        draw_in_flight([g, gpipe_table(2, 2)])


def _ring_squares(fig):
    out = {}
    for ax in fig.axes:
        for p in ax.patches:
            gid = p.get_gid() or ""
            if gid.startswith("ring:"):
                f = dict(kv.split("=") for kv in gid.split(":")[1:])
                out[(int(f["round"]), int(f["device"]), int(f["source"]))] = (f["new"] == "1", p)
    return out


def test_ring_rounds_mark_the_block_that_arrived_in_its_source_colour():
    fig = draw_ring_rounds(ring_all_gather_rounds(4), title="ring all-gather")
    squares = _ring_squares(fig)
    assert len(squares) == 4 * 4 * 4  # 4 panels of 4 devices x 4 sources
    new, patch = squares[(2, 1, 3)]  # round 2: device 1 receives device 3's block (1 - 2 = -1)
    assert new and mcolors.to_hex(patch.get_facecolor()) == device_color(3)
    assert mcolors.to_hex(patch.get_edgecolor()) == "#000000"
    assert [k for (k, d, s), (n, _) in squares.items() if n and d == 0] == [1, 2, 3]
    empty = squares[(0, 0, 1)][1]  # before: device 0 holds only its own block
    assert mcolors.to_hex(empty.get_facecolor()) == "#ffffff"
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["before", "after round 1", "after round 2", "after round 3"]
    plt.close(fig)


@pytest.mark.parametrize("n", range(1, 9))
def test_ring_rounds_print_no_text_over_text_and_nothing_outside_the_figure(n):
    title = f"ring all-gather on {n} devices: in each round every device passes on the block it last received"
    fig = draw_ring_rounds(ring_all_gather_rounds(n), title=title)
    assert overlapping_labels(fig) == []
    assert fig.get_size_inches()[0] <= MAX_FIGURE_WIDTH  # shown at its own size in a column
    renderer = fig.canvas.get_renderer()
    frame = fig.bbox
    texts = [fig._suptitle] + [t for ax in fig.axes for t in (ax.title, *ax.texts) if t.get_text()]
    for t in texts:
        bb = t.get_window_extent(renderer)
        assert frame.x0 - 1 <= bb.x0 and bb.x1 <= frame.x1 + 1, t.get_text()
        assert frame.y0 - 1 <= bb.y0 and bb.y1 <= frame.y1 + 1, t.get_text()
        assert t.get_fontsize() >= 9, t.get_text()
    plt.close(fig)


def test_draw_ring_rounds_rejects_bad_input():
    with pytest.raises(ValueError, match="at least the layout before round 1"):
        draw_ring_rounds([])
    summed = {0: (Block(0, (0, 1)),), 1: (Block(0, (0, 1)),)}
    with pytest.raises(ValueError, match="whole blocks of one source device"):
        draw_ring_rounds([summed])
    with pytest.raises(ValueError, match="ncols=0 must be a positive"):
        draw_ring_rounds(ring_all_gather_rounds(2), ncols=0)


def test_schedule_titles_say_micro_batch_in_the_singular_for_one():
    from helpers.drawing.draw_comm import draw_pipeline_schedule
    from helpers.parallelism.schedules import gpipe_table

    ax = draw_pipeline_schedule(gpipe_table(1, 1))
    assert "1 device, 1 micro-batch, bubble" in ax.get_title()
    plt.close(ax.figure)
    ax = draw_pipeline_schedule(gpipe_table(2, 3))
    assert "2 devices, 3 micro-batches, bubble" in ax.get_title()
    plt.close(ax.figure)
