"""Property-based tests of helpers.parallelism.schedules: every table any count draws obeys the pipeline's rules.

For GPipe, 1F1B, interleaved, zero-bubble and DualPipe tables on 1 to 8 stages: every op runs
once; on every device a micro-batch's forward runs before its backward; a stage's forward
of micro-batch m comes after the previous stage's, its backward after the next stage's; the
formula's bubble equals the table's idle share; the executor's slots never hold two things.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib import colors as mcolors

from helpers.drawing.draw import device_color
from helpers.drawing.draw_comm import draw_in_flight, draw_pipeline_schedule
from helpers.parallelism.schedules import (
    BACKWARD,
    FORWARD,
    IDLE,
    WEIGHT_GRAD,
    PipelineSchedule,
    bubble_fraction,
    dualpipe_table,
    executor_tables,
    gpipe_table,
    in_flight,
    interleaved_bubble,
    interleaved_table,
    one_f_one_b_order,
    one_f_one_b_table,
    simulate,
    stage_layout,
    timeline,
    zero_bubble_table,
)

stages = st.integers(1, 8)


@st.composite
def tables(draw) -> PipelineSchedule:
    S = draw(stages)
    kind = draw(st.sampled_from(["gpipe", "1f1b", "1f1b_split", "interleaved", "zb", "dual"]))
    if kind == "interleaved":
        return interleaved_table(S, S * draw(st.integers(1, 3)), draw(st.integers(1, 4)))
    if kind == "dual":
        return dualpipe_table(S, 2 * draw(st.integers(1, 6)))
    M = draw(st.integers(1, 12))
    return {
        "gpipe": lambda: gpipe_table(S, M),
        "1f1b": lambda: one_f_one_b_table(S, M),
        "1f1b_split": lambda: one_f_one_b_table(S, M, split_backward=True),
        "zb": lambda: zero_bubble_table(S, M),
    }[kind]()


def _when(s: PipelineSchedule) -> dict[tuple[int, int, int, int], int]:
    out = {}
    for (d, t), ph in np.ndenumerate(s.phase):
        if ph != IDLE:
            key = (int(ph), d, int(s.chunk[d, t]), int(s.micro[d, t]))
            assert key not in out, f"{key} runs twice"
            out[key] = t
    return out


@settings(max_examples=60)
@given(tables())
def test_every_op_runs_once_and_in_dependency_order(s):
    when = _when(s)
    split = (s.phase == WEIGHT_GRAD).any()
    for m, route in enumerate(s.route):
        for p, (d, c) in enumerate(route):
            f, b = when[(FORWARD, d, c, m)], when[(BACKWARD, d, c, m)]
            assert f < b  # forward before backward, on every device
            if split:
                assert b < when[(WEIGHT_GRAD, d, c, m)]
            if p > 0:  # after the previous stage's forward of the same micro-batch
                assert when[(FORWARD, *route[p - 1], m)] < f
            if p < len(route) - 1:  # after the next stage's backward
                assert when[(BACKWARD, *route[p + 1], m)] < b
    ops = 3 if split else 2
    assert len(when) == ops * s.n_micro * len(s.route[0])


@settings(max_examples=60)
@given(stages, st.integers(1, 16))
def test_gpipe_and_1f1b_bubble_is_the_formula_and_their_memory_differs(S, M):
    g, o = gpipe_table(S, M), one_f_one_b_table(S, M)
    for s in (g, o):
        assert s.ticks == 2 * (M + S - 1)
        assert bubble_fraction(s) == pytest.approx(interleaved_bubble(S, M))
    assert (in_flight(g).max(axis=1) == M).all()
    assert (in_flight(o).max(axis=1) == np.minimum(S - np.arange(S), M)).all()


@settings(max_examples=60)
@given(stages, st.integers(1, 3), st.integers(1, 4))
def test_interleaved_bubble_is_the_formula(S, k, v):
    s = interleaved_table(S, k * S, v)
    assert bubble_fraction(s) == pytest.approx(interleaved_bubble(S, k * S, v))
    assert s.route[0] == tuple((j % S, j // S) for j in range(S * v))


@settings(max_examples=60)
@given(tables())
def test_in_flight_starts_and_ends_empty_and_never_goes_negative(s):
    held = in_flight(s)
    assert held.shape == (s.n_stages, s.ticks)
    assert (held >= 0).all() and (held[:, -1] == 0).all()


@settings(max_examples=40)
@given(stages, st.integers(1, 10))
def test_zero_bubble_fills_bubbles_without_more_memory(S, M):
    split, zb = one_f_one_b_table(S, M, split_backward=True), zero_bubble_table(S, M)
    assert bubble_fraction(zb) <= bubble_fraction(split) + 1e-12
    assert in_flight(zb).max() <= in_flight(split).max()


@settings(max_examples=60)
@given(tables().filter(lambda s: not (s.phase == WEIGHT_GRAD).any()))
def test_executor_slots_never_hold_two_things(s):
    if any(r[p + 1][0] != (r[p][0] + 1) % s.n_stages for r in s.route for p in range(len(r) - 1)):
        with pytest.raises(ValueError, match="ring"):
            executor_tables(s)
        return
    t = executor_tables(s)
    for d in range(s.n_stages):
        stash = [None] * t["n_stash"]
        act = [None] * t["n_act_inbox"]
        pending_act = None  # what the previous device sent last tick
        for tick in range(s.ticks):
            if t["recv_act"][d, tick] >= 0:
                assert pending_act is not None
                assert act[t["recv_act"][d, tick]] is None
                act[t["recv_act"][d, tick]] = pending_act
            op, m, c = t["op"][d, tick], int(t["micro"][d, tick]), int(t["chunk"][d, tick])
            if op == 1:
                if t["act_in"][d, tick] >= 0:
                    assert act[t["act_in"][d, tick]] == m
                    act[t["act_in"][d, tick]] = None
                assert stash[t["stash"][d, tick]] is None
                stash[t["stash"][d, tick]] = (c, m)
            elif op == 2:
                assert stash[t["stash"][d, tick]] == (c, m)
                stash[t["stash"][d, tick]] = None
            prev = (d - 1) % s.n_stages
            pending_act = int(s.micro[prev, tick]) if s.phase[prev, tick] == FORWARD else None
        assert all(x is None for x in stash + act)
    assert t["n_stash"] == max(1, int(in_flight(s).max()))


@settings(max_examples=30)
@given(stages, st.integers(1, 3), st.integers(1, 4))
def test_stage_layout_puts_every_layer_once_in_circular_order(S, per, v):
    L = S * v * per
    where = stage_layout(L, S, v)
    assert where.shape == (S, v, per)
    assert sorted(where.ravel().tolist()) == list(range(L))
    assert where[1 % S, 0, 0] == (1 % S) * per
    assert (np.argsort(where.ravel()) >= 0).all()


bad = st.one_of(st.integers(-3, 0), st.just(True), st.floats(0.5, 3.5), st.just("2"))


@settings(max_examples=40)
@given(bad)
def test_bad_counts_get_the_series_error_naming_the_parameter(x):
    for call, name in (
        (lambda: gpipe_table(x, 2), "n_stages"),
        (lambda: one_f_one_b_table(2, x), "n_micro"),
        (lambda: interleaved_table(2, 2, x), "n_chunks"),
        (lambda: interleaved_bubble(x, 2), "n_stages"),
        (lambda: stage_layout(4, x), "n_stages"),
        (lambda: one_f_one_b_order(-1 if x == 0 else x, 2, 2), "stage"),
    ):
        with pytest.raises(ValueError, match=name):
            call()


@settings(max_examples=20)
@given(tables())
def test_drawn_cells_say_what_the_table_says(s):
    ax = draw_pipeline_schedule(s)
    try:
        cells = [p for p in ax.patches if (p.get_gid() or "").startswith("cell:")]
        assert len(cells) == s.n_stages * s.ticks
        for p in cells:
            f = dict(kv.split("=") for kv in p.get_gid().split(":")[1:])
            d, t = int(f["stage"]), int(f["tick"])
            assert int(f["phase"]) == s.phase[d, t] and int(f["micro"]) == s.micro[d, t]
            if s.phase[d, t] == FORWARD:
                assert mcolors.to_hex(p.get_facecolor()) == device_color(d)
            elif s.phase[d, t] != IDLE:
                assert mcolors.to_hex(p.get_edgecolor()) == device_color(d)
    finally:
        plt.close(ax.figure)


@settings(max_examples=10)
@given(stages, st.integers(1, 8))
def test_draw_in_flight_draws_one_line_per_device(S, M):
    fig = draw_in_flight([gpipe_table(S, M), one_f_one_b_table(S, M)])
    try:
        lines = [
            ln for ax in fig.axes for ln in ax.lines if (ln.get_gid() or "").startswith("in_flight")
        ]
        assert len(lines) == 2 * S
        assert all(
            mcolors.to_hex(ln.get_color()) == device_color(int(ln.get_gid()[-1])) for ln in lines
        )
    finally:
        plt.close(fig)


@settings(max_examples=40)
@given(tables(), st.floats(1.0, 4.0))
def test_timed_tables_keep_order_and_dependencies(s, b):
    """Timed, every op starts after its inputs end and after the device's previous op; free
    timing is never slower than lockstep; with every op one tick, both are the table."""
    cost = {"F": 1.0, "B": b, "W": 1.0}
    free, lock = timeline(s, cost), timeline(s, cost, lockstep=True)
    for tl in (free, lock):
        end = {}
        for (d, t), ph in np.ndenumerate(s.phase):
            if ph != IDLE:
                end[(int(ph), d, int(s.chunk[d, t]), int(s.micro[d, t]))] = (
                    tl.start[d, t] + tl.length[d, t]
                )
        for (d, t), ph in np.ndenumerate(s.phase):
            if ph == IDLE:
                continue
            m, c = int(s.micro[d, t]), int(s.chunk[d, t])
            p = s.route[m].index((d, c))
            if ph == FORWARD and p > 0:
                assert tl.start[d, t] >= end[(FORWARD, *s.route[m][p - 1], m)] - 1e-9
            if ph == BACKWARD and p < len(s.route[m]) - 1:
                assert tl.start[d, t] >= end[(BACKWARD, *s.route[m][p + 1], m)] - 1e-9
    assert free.total <= lock.total + 1e-9
    unit = timeline(s, lockstep=True)
    assert unit.total == s.ticks and unit.bubble == pytest.approx(bubble_fraction(s))


@settings(max_examples=30)
@given(stages, st.integers(1, 3), st.integers(1, 4), st.floats(1.0, 4.0))
def test_free_timing_keeps_the_bubble_formula(S, k, v, b):
    """Each device free: whatever a backward costs, the idle share is (S-1)/(v·M+S-1)."""
    s = interleaved_table(S, k * S, v)
    assert timeline(s, {"B": b}).bubble == pytest.approx(interleaved_bubble(S, k * S, v))


@settings(max_examples=10)
@given(tables(), st.floats(1.0, 4.0))
def test_drawn_timeline_cells_sit_at_their_times(s, b):
    tl = timeline(s, {"B": b}, lockstep=True)
    ax = draw_pipeline_schedule(tl)
    try:
        for p in ax.patches:
            gid = p.get_gid() or ""
            if not gid.startswith("cell:"):
                continue
            f = dict(kv.split("=") for kv in gid.split(":")[1:])
            d, t = int(f["stage"]), int(f["tick"])
            x, w = p.get_x(), p.get_width()
            assert tl.start[d, t] - 1e-9 <= x and x + w <= tl.start[d, t] + tl.length[d, t] + 1e-9
        assert ax.get_xlim()[1] == pytest.approx(tl.total)
        assert all(t.get_fontsize() >= 9 for t in ax.texts)
    finally:
        plt.close(ax.figure)


def test_simulate_refuses_programs_that_cannot_finish():
    with pytest.raises(ValueError, match="deadlock"):
        simulate([[("B", 0, 0), ("F", 0, 0)], [("F", 0, 0), ("B", 0, 0)]], 1)
    with pytest.raises(ValueError, match="misses ops"):
        simulate([[("F", 0, 0)], [("F", 0, 0), ("B", 0, 0)]], 1)
    with pytest.raises(ValueError, match="twice"):
        simulate([[("F", 0, 0), ("F", 0, 0), ("B", 0, 0)]], 1)
    with pytest.raises(ValueError, match="phase"):
        simulate([[("X", 0, 0)]], 1)
    with pytest.raises(ValueError, match="multiple of n_stages"):
        interleaved_table(3, 4, 2)
    with pytest.raises(ValueError, match="even"):
        dualpipe_table(2, 3)
    with pytest.raises(ValueError, match="splits it"):
        executor_tables(zero_bubble_table(2, 2))
    with pytest.raises(ValueError, match="PipelineSchedule"):
        in_flight(np.zeros((2, 3)))
