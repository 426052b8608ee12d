"""Property-based tests of helpers.compat and helpers.cluster.allreduce_probe: meshes, FLOPs, HLO parsing."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import AxisType

from helpers import compat
from helpers.cluster.allreduce_probe import backend_configs


@given(st.lists(st.integers(1, 8), min_size=1, max_size=3))
def test_auto_mesh_is_jax_make_mesh_with_auto_axes(sizes):
    if math.prod(sizes) > len(jax.devices()):
        return
    names = tuple(f"a{i}" for i in range(len(sizes)))
    mesh = compat.auto_mesh(tuple(sizes), names, devices=jax.devices()[: math.prod(sizes)])
    assert tuple(mesh.shape.values()) == tuple(sizes)
    assert all(t == AxisType.Auto for t in mesh.axis_types)
    with compat.set_mesh(mesh) as current:
        assert current is mesh


@settings(max_examples=10)
@given(st.sampled_from([1, 4, 16]), st.sampled_from([1, 8, 32]))
def test_cost_flops_counts_a_matmul(m, k):
    compiled = jax.jit(lambda a, b: a @ b).lower(jnp.ones((m, k)), jnp.ones((k, 4))).compile()
    flops = compat.cost_flops(compiled)
    assert flops is None or flops >= 2 * m * k * 4 * 0.5  # XLA's count of 2·m·k·n, give or take


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["all-reduce", "all-reduce-start", "add", "all-gather"]), st.booleans()
        ),
        max_size=8,
    )
)
def test_backend_configs_finds_one_entry_per_all_reduce(ops):
    lines, want = ["HloModule m"], []
    for i, (op, has_config) in enumerate(ops):
        config = ', backend_config={"x":1}' if has_config else ""
        lines.append(f"  %v{i} = f32[8]{{0}} {op}(%p{i}), channel_id={i}{config}")
        if op.startswith("all-reduce"):
            want.append('{"x":1}' if has_config else "none")
    assert backend_configs("\n".join(lines)) == want


@settings(max_examples=10)
@given(st.sampled_from([1, 3, 8]), st.sampled_from([2, 5]))
def test_saved_residuals_follows_the_checkpoint_policy(rows, cols):
    from jax.ad_checkpoint import checkpoint_name

    def f(w, x):  # two matmuls with a tanh between: the backward reads h's tanh
        return (jnp.tanh(checkpoint_name(x @ w, "h")) @ w).sum()

    w, x = jnp.ones((cols, cols)), jnp.ones((rows, cols))

    def kept(fn):  # the residuals that are not the arguments, by shape (their labels vary)
        got = compat.saved_residuals(fn, w, x)
        assert all(isinstance(a, jax.ShapeDtypeStruct) and isinstance(why, str) for a, why in got)
        return [a.shape for a, why in got if "argument" not in why]

    assert kept(f) and all(shape == (rows, cols) for shape in kept(f))
    policies = jax.checkpoint_policies
    assert kept(jax.checkpoint(f, policy=policies.save_only_these_names("h"))) == [(rows, cols)]
    assert kept(jax.checkpoint(f, policy=policies.nothing_saveable)) == []
