"""Property-based tests of helpers.placing.zero and helpers.planning.calculator: ZeRO slices split like
FSDP or not at all, a bad stage is refused by name, and every calculator setting gives a
plan or one line saying why it cannot run."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import make_mesh
from helpers.placing.zero import init_zero, zero_specs
from helpers.planning.calculator import CHOICES, calculator_plan
from helpers.planning.plan import Plan

shapes = st.lists(st.integers(1, 96), min_size=1, max_size=3).map(tuple)


@given(st.lists(shapes, min_size=1, max_size=4), st.sampled_from([1, 2, 3, 4, 5, 8]))
def test_zero_specs_split_one_dimension_the_axis_divides(shape_list, n):
    mesh = make_mesh((n,), ("data",), devices=jax.devices()[:n])
    tree = {f"p{i}": jax.ShapeDtypeStruct(s, np.float32) for i, s in enumerate(shape_list)}
    specs = zero_specs(tree, mesh)
    for name, shape in ((k, v.shape) for k, v in tree.items()):
        entries = tuple(specs[name])
        split = [d for d, e in enumerate(entries) if e == "data"]
        assert len(split) <= 1
        if split:
            assert shape[split[0]] % n == 0 and n > 1


@given(st.one_of(st.integers(-5, 10).filter(lambda s: s not in (0, 1, 2, 3)), st.text(max_size=2)))
def test_a_bad_stage_is_refused_before_any_jax_call(stage):
    mesh = make_mesh((1,), ("data",), devices=jax.devices()[:1])
    with pytest.raises(ValueError, match="stage"):
        init_zero(None, None, mesh, None, None, stage)  # type: ignore[arg-type]


@given(st.fixed_dictionaries({k: st.sampled_from(v) for k, v in CHOICES.items()}))
def test_every_calculator_setting_gives_a_plan_or_one_line(settings):
    result = calculator_plan(**settings)
    if isinstance(result, str):
        assert result.startswith("Cannot run: --") and "\n" not in result
    else:
        assert isinstance(result, Plan) and result.per_device_bytes["total"] > 0
