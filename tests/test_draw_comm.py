"""helpers.drawing.draw_comm: the before/after picture of a collective and the pipeline schedule.

The assertions read the drawn artists' gids and colours: which device's row holds which
block, in whose colour; which stage works on which micro-batch at which tick."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib import colors as mcolors

from helpers import device_color
from helpers.drawing.draw_comm import draw_collective, draw_pipeline_schedule
from helpers.parallelism.collectives import Block, expected_blocks, gpipe_schedule


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
