"""Property-based tests of helpers.measuring.trace's overlap arithmetic, on synthetic spans."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.measuring.trace import Span, exposed_spans, summarize_trace

# Times on a 0.5 us grid, as a profiler records them (no subnormal widths).
intervals = st.tuples(
    st.integers(0, 2000).map(lambda t: t / 2), st.integers(0, 200).map(lambda t: t / 2)
)


def _spans(comp, comm, device=0):
    out = [
        Span(device, f"fusion.{i}", "compute", a, d, "m", 0, "t") for i, (a, d) in enumerate(comp)
    ]
    out += [
        Span(device, f"all-gather.{i}", "collective", a, d, "m", 0, "t")
        for i, (a, d) in enumerate(comm)
    ]
    return out


def _covered(t, spans, kind):
    return any(s.kind == kind and s.start_us <= t < s.end_us for s in spans)


@given(st.lists(intervals, max_size=8), st.lists(intervals, min_size=1, max_size=8))
def test_exposed_time_lies_between_bounds_and_is_covered_by_no_compute(comp, comm):
    spans = _spans(comp, comm)
    s = summarize_trace(spans)
    assert -1e-9 <= s.exposed_ms <= s.collective_ms + 1e-9
    assert s.exposed_ms >= s.collective_ms - s.compute_ms - 1e-9
    for _, a, b in exposed_spans(spans):
        mid = (a + b) / 2
        assert b > a and _covered(mid, spans, "collective") and not _covered(mid, spans, "compute")


@given(st.lists(intervals, min_size=1, max_size=8))
def test_compute_that_spans_everything_hides_every_collective(comm):
    end = max(a + d for a, d in comm)
    spans = _spans([(0.0, end + 1)], comm)
    assert summarize_trace(spans).exposed_ms == pytest.approx(0, abs=1e-12)
    assert exposed_spans(spans) == []


@given(st.lists(intervals, min_size=1, max_size=8))
def test_without_compute_every_collective_is_exposed(comm):
    s = summarize_trace(_spans([], comm))
    assert s.exposed_ms == pytest.approx(s.collective_ms)
