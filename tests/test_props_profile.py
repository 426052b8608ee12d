"""Property-based tests of helpers.profile: resizing to a mesh, degenerate strategies, workloads."""

from __future__ import annotations

import math

import jax
from hypothesis import given
from hypothesis import strategies as st

from helpers import LOGICAL_RULES, STRATEGY_AXES
from helpers.models import ModelConfig
from helpers.profile import degenerate, fit_to_mesh, workload_for

WIDTHS = {"embed": "d_model", "embed_vec": "d_model", "mlp": "d_ff", "classes": "n_classes"}
configs = st.builds(
    ModelConfig,
    d_model=st.integers(1, 300),
    d_ff=st.integers(1, 900),
    n_layers=st.integers(1, 3),
    n_classes=st.integers(1, 40),
)
strategies = st.lists(st.sampled_from(sorted(LOGICAL_RULES)), min_size=1, max_size=3, unique=True)
mesh_shapes = st.tuples(st.integers(1, 8), st.integers(1, 8))


@given(configs, strategies, mesh_shapes, st.sampled_from([1, 8, 128]))
def test_fit_to_mesh_makes_every_split_width_divide_and_changes_nothing_else(
    cfg, names, shape, multiple
):
    fitted, note = fit_to_mesh(cfg, names, shape, multiple)
    sizes = dict(zip(("data", "model"), shape, strict=True))
    for s in names:
        for logical, entry in LOGICAL_RULES[s]:
            if logical in WIDTHS and entry is not None:
                axes = (entry,) if isinstance(entry, str) else entry
                k = math.prod(sizes[a] for a in axes)
                assert getattr(fitted, WIDTHS[logical]) % k == 0
    for field in ("d_model", "d_ff", "n_classes"):
        before, after = getattr(cfg, field), getattr(fitted, field)
        assert after >= before
        assert (after != before) == (field in note)
    assert (fitted.n_layers, fitted.batch, fitted.seq) == (cfg.n_layers, cfg.batch, cfg.seq)
    assert (note == "") == (fitted == cfg)


@given(st.sampled_from(sorted(LOGICAL_RULES)), mesh_shapes)
def test_a_strategy_is_degenerate_exactly_when_its_axes_and_the_mesh_disagree(strategy, shape):
    why = degenerate(strategy, shape)
    sizes = dict(zip(("data", "model"), shape, strict=True))
    used = STRATEGY_AXES[strategy]
    ok = math.prod(shape) == 1 or (
        all(sizes[a] > 1 for a in used) and all(sizes[a] == 1 for a in sizes if a not in used)
    )
    assert (why is None) == ok
    if why is not None:
        assert isinstance(why, str) and why


@given(st.integers(1, 8), st.integers(1, 16), st.sampled_from(["dp", "fsdp"]))
def test_a_workload_has_its_batch_per_device_times_the_data_axis(n, per_device, strategy):
    devices = jax.devices()[:n]
    w = workload_for("tiny", [strategy], devices, (n, 1), batch_per_device=per_device)
    assert w.batch_per_device == per_device and w.cfg.batch == per_device * n
    assert w.tokens_per_step == w.cfg.batch * w.cfg.seq
    if strategy == "fsdp":
        assert w.cfg.d_model % n == 0
