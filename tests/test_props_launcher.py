"""Property-based tests of helpers.cluster.launcher: what it echoes of a process's output, and pids."""

from __future__ import annotations

import os

from hypothesis import given
from hypothesis import strategies as st

from helpers.cluster import launcher

# Ordinary lines a training script prints: not indented, not a traceback's first line.
ordinary = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=40).filter(
    lambda s: (
        s.strip()
        and not s.startswith((" ", "\t", "Traceback", "*** ", "PC: @", "@"))
        and s not in launcher._CHAINED
    )
)
frames = st.lists(
    st.sampled_from(['  File "x.py", line 3, in f', "    return g()", "    ^^^^^^"]), max_size=6
)


@given(st.lists(ordinary, max_size=20))
def test_ordinary_lines_pass_through_unchanged_and_in_order(lines):
    folder = launcher._Folder()
    shown = [s for line in lines for s in folder.feed(line)] + folder.flush()
    assert shown == lines


@given(st.lists(st.tuples(st.lists(ordinary, max_size=3), frames, ordinary), max_size=5))
def test_each_traceback_prints_as_its_exception_line_only(parts):
    folder = launcher._Folder()
    lines, want = [], []
    for before, stack, exception in parts:
        lines += [*before, "Traceback (most recent call last):", *stack, exception]
        want += [*before, exception]
    shown = [s for line in lines for s in folder.feed(line)] + folder.flush()
    assert len(shown) == len(want)
    for got, expected in zip(shown, want, strict=True):
        assert got == expected or (got.startswith(expected) and "traceback folded" in got)


@given(
    st.lists(
        st.sampled_from(["    @     0x7f00 abort", "PC: @ 0x1", "*** SIGABRT received ***"]),
        min_size=1,
        max_size=8,
    ),
    ordinary,
)
def test_a_native_stack_prints_as_one_line(stack, after):
    folder = launcher._Folder()
    shown = [s for line in [*stack, after] for s in folder.feed(line)] + folder.flush()
    assert shown == [f"({len(stack)} lines of a C++ stack trace folded)", after]


@given(st.integers(1, 50))
def test_free_ports_bind_on_loopback_and_pids_of_the_living_are_alive(_):
    port = launcher.free_loopback_port()
    assert 1024 <= port <= 65535
    assert launcher.pid_alive(os.getpid())
    assert launcher.still_alive([os.getpid()], wait_s=0.0) == [os.getpid()]
