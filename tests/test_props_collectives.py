"""Property-based tests of helpers.parallelism.collectives and helpers.drawing.draw_comm: tags, definitions, schedules."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib import colors as mcolors

from helpers.drawing.draw import device_color
from helpers.drawing.draw_comm import draw_collective, draw_pipeline_schedule
from helpers.parallelism.collectives import (
    COLLECTIVES,
    Block,
    bubble_fraction,
    chunks_for,
    expected_blocks,
    gpipe_bubble,
    gpipe_schedule,
    read_blocks,
    ring_bytes,
    tag_blocks,
)

counts = st.integers(1, 24)
collectives = st.sampled_from(COLLECTIVES)


@given(counts, st.integers(1, 24))
def test_tags_read_back_as_the_blocks_they_tag(n, chunks):
    rows = tag_blocks(n, chunks)
    assert rows.shape == (n * chunks, n)
    assert read_blocks(rows) == tuple(Block(c, (d,)) for d in range(n) for c in range(chunks))


@given(counts, st.data())
def test_a_sum_of_tags_of_one_chunk_reads_as_its_sources(n, data):
    chunks = data.draw(st.integers(1, 6))
    chunk = data.draw(st.integers(0, chunks - 1))
    sources = sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1)))
    rows = tag_blocks(n, chunks)
    summed = sum(rows[d * chunks + chunk] for d in sources)
    assert read_blocks(summed[None, :]) == (Block(chunk, tuple(sources)),)


@given(st.integers(2, 24), st.data())
def test_a_sum_that_mixes_chunks_is_refused_whatever_its_total(n, data):
    chunks = data.draw(st.integers(2, 6))
    sources = sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=2)))
    picked = {d: data.draw(st.integers(0, chunks - 1)) for d in sources}
    if len(set(picked.values())) == 1:
        return
    rows = tag_blocks(n, chunks)
    mixed = sum(rows[d * chunks + c] for d, c in picked.items())
    with pytest.raises(ValueError, match="adds different chunks"):
        read_blocks(mixed[None, :])


@given(collectives, counts)
def test_definitions_conserve_what_they_should(collective, n):
    before, after = expected_blocks(collective, n)
    assert sorted(before) == sorted(after) == list(range(n))
    c = chunks_for(collective, n)
    assert all(len(v) == c for v in before.values())
    held = [b for v in after.values() for b in v]
    if collective == "ppermute":  # a permutation: every block once, on another device
        assert sorted(held) == sorted(b for v in before.values() for b in v)
    if collective == "all_to_all":  # a transpose of (device, chunk)
        assert sorted((b.chunk, b.sources) for b in held) == sorted(
            (k, (d,)) for d in range(n) for k in range(n)
        )
    if collective == "psum_scatter":  # each chunk reduced once, on its own device
        assert [v[0].chunk for _, v in sorted(after.items())] == list(range(n))
    if collective in ("psum", "psum_scatter"):
        assert all(b.sources == tuple(range(n)) for b in held)


@given(counts, st.floats(0, 1e12))
def test_all_reduce_is_reduce_scatter_then_all_gather_in_bytes(n, b):
    assert ring_bytes("psum", b, n) == pytest.approx(
        ring_bytes("psum_scatter", b, n) + ring_bytes("all_gather", b / n, n)
    )
    for c in COLLECTIVES:
        assert ring_bytes(c, b, n) >= 0
        if n == 1:
            assert ring_bytes(c, b, n) == 0


@given(st.integers(1, 16), st.integers(1, 32))
def test_gpipe_schedule_runs_each_micro_batch_once_per_stage_in_order(s, m):
    sched = gpipe_schedule(s, m)
    assert sched.shape == (s, m + s - 1)
    for stage in range(s):
        busy = sched[stage][sched[stage] >= 0]
        assert list(busy) == list(range(m))  # each micro-batch once, in order
        assert list(np.flatnonzero(sched[stage] >= 0)) == list(range(stage, stage + m))
    assert bubble_fraction(sched) == pytest.approx(gpipe_bubble(s, m))


@given(
    st.one_of(st.integers(-3, 0), st.booleans(), st.floats(0.5, 3), st.text(max_size=2)),
    st.integers(1, 4),
)
def test_schedules_and_counts_refuse_what_is_not_a_positive_whole_number(bad, good):
    with pytest.raises(ValueError):
        gpipe_schedule(bad, good)
    with pytest.raises(ValueError):
        tag_blocks(bad, good)


@settings(max_examples=15)
@given(collectives, st.integers(1, 8))
def test_draw_collective_draws_the_layouts_in_source_colours(collective, n):
    before, after = expected_blocks(collective, n)
    fig = draw_collective(before, after)
    try:
        for panel, layout in (("before", before), ("after", after)):
            drawn = [
                p
                for p in fig.findobj()
                if str(getattr(p, "get_gid", lambda: "")() or "").startswith(
                    f"block:panel={panel}:"
                )
            ]
            assert len(drawn) == sum(len(v) for v in layout.values())
            for p in drawn:
                fields = dict(kv.split("=") for kv in p.get_gid().split(":")[1:])
                block = layout[int(fields["device"])][int(fields["slot"])]
                assert int(fields["chunk"]) == block.chunk
                assert tuple(int(x) for x in fields["sources"].split(",")) == block.sources
                if len(block.sources) == 1:
                    assert mcolors.to_hex(p.get_facecolor()) == device_color(block.sources[0])
    finally:
        plt.close(fig)


@settings(max_examples=15)
@given(st.integers(1, 8), st.integers(1, 12))
def test_draw_pipeline_schedule_draws_every_cell(s, m):
    sched = gpipe_schedule(s, m)
    ax = draw_pipeline_schedule(sched)
    try:
        cells = {p.get_gid(): p for p in ax.patches if (p.get_gid() or "").startswith("cell:")}
        assert len(cells) == sched.size
        for (stage, tick), micro in np.ndenumerate(sched):
            p = cells[f"cell:stage={stage}:tick={tick}:micro={micro}"]
            if micro >= 0:
                assert mcolors.to_hex(p.get_facecolor()) == device_color(stage)
        assert f"{bubble_fraction(sched):.1%}" in ax.get_title()
    finally:
        plt.close(ax.figure)
