"""Property-based tests of helpers.measuring.profile's own arithmetic and command line (what it trains,
helpers.measuring.workload, is tested in test_props_workload.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.measuring import profile

times = st.lists(st.floats(1e-4, 10.0, allow_nan=False), min_size=1, max_size=12)


def timed(steps: list[float]) -> profile.StrategyResult:
    """A StrategyResult with only its timing fields filled, as _run fills them."""
    fields = {f.name: None for f in dataclasses.fields(profile.StrategyResult)}
    fields.update(
        {
            f.name: f.default
            for f in dataclasses.fields(profile.StrategyResult)
            if f.default is not dataclasses.MISSING
        }  # fmt: skip
    )
    fields.update(
        step_times_s=steps,
        step_median_s=sorted(steps)[len(steps) // 2],
        step_min_s=min(steps),
        step_max_s=max(steps),
    )
    return profile.StrategyResult(**fields)


@given(
    st.floats(1.0, 1e18),
    st.floats(1e-6, 1e3),
    st.integers(1, 4096),
    st.one_of(st.none(), st.floats(1e9, 1e16)),
)
def test_mfu_divides_the_model_flops_by_time_devices_and_peak(flops, step_s, n, peak):
    got = profile.mfu(flops, step_s, n, peak)
    if peak is None:
        assert got is None
    else:
        assert got == pytest.approx(flops / (step_s * n * peak))
    assert profile.mfu(flops, 0.0, n, 1e15) is None  # no time, no rate


@given(times, times)
def test_the_ratio_range_holds_the_median_ratio_and_every_pair_of_steps(a, b):
    r, base = timed(a), timed(b)
    median, low, high = profile.ratio_range(r, base)
    assert low <= median * (1 + 1e-12) and median <= high * (1 + 1e-12)
    pairs = [x / y for x in a for y in b]
    assert low == pytest.approx(min(pairs)) and high == pytest.approx(max(pairs))
    s = profile.spread(r)
    assert s is not None and s == pytest.approx((max(a) - min(a)) / r.step_median_s)
    assert s >= 0


@given(st.integers(1, 64), st.integers(1, 64))
def test_the_cli_reads_a_mesh_shape_of_two_positive_sizes(data, model):
    args = profile.build_parser().parse_args(["--mesh-shape", f"{data},{model}"])
    assert args.mesh_shape == (data, model)


@given(
    st.one_of(
        st.integers(-8, 0).map(lambda k: f"{k},2"),
        st.integers(1, 8).map(str),
        st.tuples(st.integers(1, 8), st.integers(1, 8), st.integers(1, 8)).map(
            lambda t: ",".join(map(str, t))
        ),
        st.text(alphabet="abx ;.", min_size=1, max_size=5),
    )
)
def test_the_cli_refuses_any_other_mesh_shape_with_a_sentence(text):
    stderr = io.StringIO()
    with pytest.raises(SystemExit) as exc, contextlib.redirect_stderr(stderr):
        profile.build_parser().parse_args([f"--mesh-shape={text}"])
    assert exc.value.code == 2
    err = stderr.getvalue()
    assert "two positive sizes" in err and "--mesh-shape" in err


@given(st.sampled_from(sorted(profile.GPU_COMPILER_OPTIONS)), st.booleans())
def test_a_flag_set_in_xla_flags_wins_over_the_profiles_option(flag, set_it):
    env = f"--{flag}=false" if set_it else ""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XLA_FLAGS", env)
        got = profile.gpu_compiler_options()
    assert (flag in got) == (not set_it)
