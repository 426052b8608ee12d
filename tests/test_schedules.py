"""helpers.parallelism.schedules and helpers.parallelism.pipeline: tables on small cases written out by hand, and
notebook 07's GPipe as an importable function. Runs on 8 simulated devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from helpers import make_mesh
from helpers.parallelism.collectives import gpipe_schedule
from helpers.parallelism.pipeline import gpipe_pipeline
from helpers.parallelism.schedules import (
    bubble_fraction,
    executor_tables,
    gpipe_table,
    in_flight,
    interleaved_table,
    one_f_one_b_order,
    one_f_one_b_table,
    simulate,
    stage_layout,
    timeline,
)


def test_gpipe_table_by_hand():
    s = gpipe_table(2, 2)
    # ticks:        0   1   2   3   4   5
    assert s.phase.tolist() == [[0, 0, -1, -1, 1, 1], [-1, 0, 0, 1, 1, -1]]
    assert s.micro.tolist() == [[0, 1, -1, -1, 0, 1], [-1, 0, 1, 0, 1, -1]]
    assert in_flight(s).tolist() == [[1, 2, 2, 2, 1, 0], [0, 1, 2, 1, 0, 0]]
    # its forward half is notebook 07's schedule
    fwd = np.where(s.phase == 0, s.micro, -1)[:, :3]
    assert np.array_equal(fwd, gpipe_schedule(2, 2))


def test_one_f_one_b_order_by_hand():
    assert one_f_one_b_order(0, 3, 4) == [
        ("F", 0, 0), ("F", 1, 0), ("F", 2, 0), ("B", 0, 0), ("F", 3, 0), ("B", 1, 0),
        ("B", 2, 0), ("B", 3, 0),
    ]  # fmt: skip
    assert one_f_one_b_order(2, 3, 2) == [("F", 0, 0), ("B", 0, 0), ("F", 1, 0), ("B", 1, 0)]
    with pytest.raises(ValueError, match="stage=3"):
        one_f_one_b_order(3, 3, 2)


def test_1f1b_holds_s_minus_stage_and_interleaved_circles_the_ring():
    assert in_flight(one_f_one_b_table(4, 8)).max(axis=1).tolist() == [4, 3, 2, 1]
    s = interleaved_table(2, 4, 2)
    assert s.route[0] == ((0, 0), (1, 0), (0, 1), (1, 1))
    assert bubble_fraction(s) == pytest.approx(1 / 9)


def test_executor_tables_sizes_follow_the_schedule():
    g, o = executor_tables(gpipe_table(4, 8)), executor_tables(one_f_one_b_table(4, 8))
    assert (g["n_stash"], o["n_stash"]) == (8, 4)
    assert g["op"].shape == g["stash"].shape == (4, 2 * (8 + 3))
    assert g["act_in"][0].max() == -1  # stage 0 reads the data
    assert (g["grad_in"][3] == -1).all()  # the last stage starts from the loss


def test_gpipe_pipeline_is_notebook_07s():
    mesh = make_mesh((4,), ("stage",))
    w = jax.random.normal(jax.random.key(0), (4, 8, 8)) / 3
    xs = jax.random.normal(jax.random.key(1), (5, 2, 8))
    run = gpipe_pipeline(lambda p, x: jnp.tanh(x @ p), mesh)
    outputs, tags = run(w, xs)
    want = xs
    for i in range(4):
        want = jnp.tanh(want @ w[i])
    np.testing.assert_allclose(outputs[-1], want, rtol=1e-5, atol=1e-6)
    assert np.array_equal(np.asarray(tags), gpipe_schedule(4, 5))
    with pytest.raises(ValueError, match="axis='data'"):
        gpipe_pipeline(lambda p, x: x, mesh, axis="data")
    with pytest.raises(ValueError, match="callable"):
        gpipe_pipeline(None, mesh)
    assert P("stage") == P("stage")


def test_timeline_of_gpipe_by_hand():
    # GPipe, 2 stages, 2 micro-batches, a backward costing 2 forwards. Free: stage 1 runs
    # F0 [1,2], F1 [2,3], B0 [3,5], B1 [5,7]; stage 0 runs F0 [0,1], F1 [1,2], B0 [5,7], B1 [7,9].
    s = gpipe_table(2, 2)
    free = timeline(s, {"B": 2})
    assert np.nan_to_num(free.start, nan=-1).tolist() == [
        [0, 1, -1, -1, 5, 7],
        [-1, 1, 2, 3, 5, -1],
    ]
    assert free.length.tolist() == [[1, 1, 0, 0, 2, 2], [0, 1, 1, 2, 2, 0]]
    assert free.total == 9 and free.bubble == pytest.approx(1 / 3)  # (S-1)/(M+S-1)
    # in lockstep each tick lasts its longest op: 1, 1, 1, 2, 2, 2
    lock = timeline(s, {"B": 2}, lockstep=True)
    assert np.nan_to_num(lock.start, nan=-1).tolist() == [
        [0, 1, -1, -1, 5, 7],
        [-1, 1, 2, 3, 5, -1],
    ]
    assert lock.total == 9
    # one tick per op by default: the table itself
    unit = timeline(s)
    assert np.array_equal(
        np.where(s.phase < 0, -1, unit.start), np.where(s.phase < 0, -1, np.arange(6))
    )


def test_lockstep_1f1b_waits_for_its_neighbours_backward():
    s = one_f_one_b_table(4, 8)
    free, lock = timeline(s, {"B": 3}), timeline(s, {"B": 3}, lockstep=True)
    assert free.bubble == pytest.approx(bubble_fraction(s))  # costs scaled alike: same share
    assert lock.bubble > free.bubble + 0.1 and lock.total > free.total
    # a device's op never starts before the one before it on that device ended
    for d in range(4):
        busy = s.phase[d] >= 0
        starts, ends = lock.start[d, busy], (lock.start + lock.length)[d, busy]
        assert (starts[1:] >= ends[:-1] - 1e-9).all()


def test_timeline_rejects_bad_durations():
    s = gpipe_table(2, 2)
    with pytest.raises(ValueError, match="durations"):
        timeline(s, {"X": 1})
    with pytest.raises(ValueError, match=r"durations\['B'\]"):
        timeline(s, {"B": 0})
    with pytest.raises(ValueError, match="PipelineSchedule"):
        timeline(np.zeros((2, 3)))


def test_timeline_hop_zero_changes_nothing():
    for s in (gpipe_table(3, 4), one_f_one_b_table(4, 8), interleaved_table(4, 8, 2)):
        for lockstep in (False, True):
            old, new = (
                timeline(s, {"B": 3}, lockstep=lockstep),
                timeline(s, {"B": 3}, lockstep=lockstep, hop=0.0),
            )
            assert np.array_equal(old.start, new.start, equal_nan=True) and new.hop == 0.0


def test_timeline_hop_delays_each_send_on_the_critical_path():
    # GPipe, 2 stages, 2 micro-batches, B = 2, a send costing h. Stage 1's F0 waits h for
    # stage 0's F0; stage 0's B0 waits h for stage 1's B0: two hops on the critical path.
    s = gpipe_table(2, 2)
    h = 0.5
    free = timeline(s, {"B": 2}, hop=h)
    assert np.nan_to_num(free.start, nan=-1).tolist() == [
        [0, 1, -1, -1, 5 + 2 * h, 7 + 2 * h],
        [-1, 1 + h, 2 + h, 3 + h, 5 + h, -1],
    ]
    assert free.total == 9 + 2 * h and free.hop == h
    # lockstep: each of the 5 ticks before the last ends h later (its ppermutes)
    lock = timeline(s, {"B": 2}, lockstep=True, hop=h)
    assert np.nan_to_num(lock.start, nan=-1)[0].tolist() == [0, 1 + h, -1, -1, 5 + 4 * h, 7 + 5 * h]
    assert lock.total == 9 + 5 * h
    # on one device nothing is sent: a hop changes nothing, free or lockstep
    one = interleaved_table(1, 4, 2)
    for lockstep in (False, True):
        assert (
            timeline(one, {"B": 3}, lockstep=lockstep, hop=1.0).total
            == timeline(one, {"B": 3}, lockstep=lockstep).total
        )


def _undoubled_order(d, S, m):
    # notebook 10's exercise 2: interleaved (v = 2) with 1F1B's warm-up (S-1-d) + S
    fwd = [("F", (k // (2 * S)) * S + k % S, (k // S) % 2) for k in range(2 * m)]
    bwd = [("B", mb, 1 - c) for _, mb, c in fwd]
    warm = min(2 * S - 1 - d, 2 * m)
    return fwd[:warm] + [op for i in range(2 * m) for op in fwd[warm + i : warm + i + 1] + [bwd[i]]]


def test_doubled_warm_up_absorbs_a_sends_latency():
    # The reviewer's numbers: B = 3.07, S = 8, M = 16, v = 2, free timeline.
    S, M, cost = 8, 16, {"B": 3.07}
    megatron = interleaved_table(S, M, 2)
    undoubled = simulate([_undoubled_order(d, S, M) for d in range(S)], M, n_chunks=2)
    assert in_flight(undoubled)[0].max() == 2 * S and in_flight(megatron)[0].max() == 3 * S - 1
    got = {
        hop: (timeline(undoubled, cost, hop=hop).total, timeline(megatron, cost, hop=hop).total)
        for hop in (0.0, 0.25, 0.5)
    }
    want = {0.0: (158.73, 158.73), 0.25: (176.23, 166.23), 0.5: (193.73, 173.73)}
    for hop, ends in want.items():
        assert got[hop] == pytest.approx(ends)  # equal without sends, Megatron sooner with
    # Megatron's end grows by one micro-batch's round trip of hops, 2(vS - 1) = 30
    assert (got[0.5][1] - got[0.0][1]) / 0.5 == pytest.approx(2 * (2 * S - 1))


def test_timeline_rejects_a_bad_hop():
    s = gpipe_table(2, 2)
    for bad in (-0.1, float("nan"), float("inf"), "0.1", True, None):
        with pytest.raises(ValueError, match="hop="):
            timeline(s, hop=bad)


def test_stage_layout_refuses_chunks_that_split_a_layer():
    assert stage_layout(32, 8, 4).shape == (8, 4, 1)
    with pytest.raises(ValueError, match="multiple of n_stages x n_chunks"):
        stage_layout(32, 8, 8)  # 64 chunks of 32 layers
