"""Property-based tests of helpers.measuring.measure: bytes per device, tables, step memory, collectives."""

from __future__ import annotations

import math
import re
from collections import Counter

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from generators import abstract_of, dtypes, meshes, nbytes, odd_leaves, placed_trees, shapes
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from helpers import (
    collective_stats,
    format_bytes,
    format_collectives,
    make_mesh,
    memory_per_device,
    planned_bytes_per_device,
    sharding_table,
    step_memory,
)


def _shard_bytes(tree) -> Counter:
    """The oracle: bytes each device holds, summed from every array's addressable shards."""
    total: Counter = Counter()
    for leaf in jax.tree.leaves(tree):
        for shard in leaf.addressable_shards:
            total[f"cpu:{shard.device.id}"] += shard.data.nbytes
    return total


@settings(max_examples=20)
@given(st.data())
def test_memory_per_device_is_the_sum_of_its_shards_and_matches_the_plan(data):
    mesh = data.draw(meshes())
    tree = data.draw(placed_trees(mesh))
    held = memory_per_device(tree)
    assert held == dict(_shard_bytes(tree))
    assert list(held) == sorted(held, key=lambda k: int(k.split(":")[1]))  # device order
    assert planned_bytes_per_device(tree) == held
    abstract = jax.tree.map(abstract_of, tree)
    assert planned_bytes_per_device(abstract) == held
    # Each device holds one block of every array it appears in.
    expected = sum(
        math.prod(x.sharding.shard_shape(x.shape))
        * np.dtype(x.dtype).itemsize
        * len(x.sharding.device_set)
        for x in jax.tree.leaves(tree)
    )
    assert sum(held.values()) == expected


@settings(max_examples=20)
@given(st.data())
def test_sharding_table_totals_are_the_trees_bytes(data):
    mesh = data.draw(meshes())
    tree = data.draw(placed_trees(mesh))
    text = sharding_table(tree)
    total = sum(nbytes(x) for x in jax.tree.leaves(tree))
    rows = text.splitlines()
    assert (
        len(rows) == 2 + len(jax.tree.leaves(tree)) + 2
    )  # header, rule, one per array, blank, total
    if total:
        assert f"total: {format_bytes(total)} in {len(jax.tree.leaves(tree))} arrays" in text
        assert (
            f"largest per-device share: {format_bytes(max(planned_bytes_per_device(tree).values()))}"
            in text
        )
    assert sharding_table(jax.tree.map(abstract_of, tree)) == text


@settings(max_examples=30)
@given(st.data())
def test_tree_walkers_refuse_odd_leaves_naming_them(data):
    mesh = data.draw(meshes())
    tree = data.draw(placed_trees(mesh))
    odd = data.draw(odd_leaves)
    tree["odd"] = odd
    has_array_leaf = isinstance(odd, np.generic)  # a numpy scalar has a shape and a dtype
    for fn in (memory_per_device, planned_bytes_per_device, sharding_table):
        with pytest.raises(ValueError, match="odd|not an array|no sharding|not a placed"):
            fn(tree)
    if not has_array_leaf:
        with pytest.raises(ValueError, match="'odd"):
            memory_per_device(tree)


@settings(max_examples=20)
@given(st.data())
def test_abstract_arrays_are_refused_where_only_placed_ones_make_sense(data):
    mesh = data.draw(meshes())
    tree = data.draw(placed_trees(mesh))
    name = next(iter(sorted(tree)))  # the first leaf in JAX's (sorted) tree order
    abstract = jax.tree.map(abstract_of, tree)
    with pytest.raises(ValueError, match="planned_bytes_per_device"):
        memory_per_device(abstract)
    bare = jax.tree.map(lambda x: abstract_of(x, with_sharding=False), tree)
    with pytest.raises(
        ValueError, match=f"planned_bytes_per_device: parameter '{name}.*has no sharding"
    ):
        planned_bytes_per_device(bare)


@settings(max_examples=10)
@given(meshes(max_axes=1))
def test_flax_boxed_values_are_walked_through(mesh):
    x = jax.device_put(jnp.ones((mesh.size * 2, 3)), NamedSharding(mesh, P("data")))
    boxed = {"kernel": nn.Partitioned(x, names=("data", None)), "skip": None}
    assert memory_per_device(boxed) == memory_per_device({"kernel": x})


@settings(max_examples=15)
@given(st.integers(1, 8), shapes(1, 3), dtypes)
def test_all_gather_bytes_match_the_ring_closed_form(n, shape, dtype):
    """Resharding P('data') -> replicated all-gathers the whole array once."""
    shape = (n * shape[0], *shape[1:])
    mesh = make_mesh((n,), ("data",))
    x = jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P("data")))
    compiled = jax.jit(lambda a: a, out_shardings=NamedSharding(mesh, P())).lower(x).compile()
    stats = collective_stats(compiled)
    assert stats == collective_stats(compiled.as_text())
    if n == 1:
        assert stats == {}
        assert format_collectives(stats).startswith("no collectives")
        return
    # XLA's CPU backend converts bf16 to f32 around a collective: 4 bytes per element on the wire.
    wire = (
        4
        if dtype == jnp.bfloat16 and jax.devices()[0].platform == "cpu"
        else np.dtype(dtype).itemsize
    )
    size = math.prod(shape) * wire
    gathered = sum(v["bytes"] for k, v in stats.items() if k == "all-gather")
    assert gathered == size
    assert stats["all-gather"]["sent_per_device"] == pytest.approx(size * (n - 1) / n)
    assert "all-gather" in format_collectives(stats)


@settings(max_examples=10)
@given(st.integers(1, 8), shapes(1, 2))
def test_step_memory_adds_up(n, shape):
    shape = (n * shape[0], *shape[1:])
    mesh = make_mesh((n,), ("data",))
    x = jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, P("data")))
    compiled = jax.jit(lambda a: (a * 2).sum(0)).lower(x).compile()
    mem = step_memory(compiled)
    assert mem["total"] == mem["argument"] + mem["output"] + mem["temp"] - mem["alias"]
    assert mem["argument"] == math.prod(shape) * 4 // n  # one shard of the input per device


def _lowered():
    mesh = make_mesh((2,), ("data",))
    x = jax.ShapeDtypeStruct((4, 2), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    f = jax.jit(lambda a: a.sum(0))
    return f, f.lower(x)


not_compiled = st.one_of(
    st.sampled_from(["lowered", "jitted", "plain function"]),
    st.one_of(st.integers(), st.none(), st.lists(st.integers(), max_size=2), st.binary(max_size=4)),
)


@settings(max_examples=25)
@given(not_compiled)
def test_collective_stats_and_step_memory_refuse_what_is_not_compiled(what):
    f, lowered = _lowered()
    obj = (
        {"lowered": lowered, "jitted": f, "plain function": lambda a: a}.get(what, what)
        if isinstance(what, str)
        else what
    )
    for fn in (collective_stats, step_memory):
        with pytest.raises(TypeError, match=r"lower\(\*args\)\.compile\(\)") as info:
            fn(obj)
        if what == "lowered":
            assert "not partitioned yet" in str(info.value)
        assert info.value.__traceback__.tb_next is None or "helpers" in str(info.traceback[-1].path)


@settings(max_examples=25)
@given(st.text(max_size=60))
def test_collective_stats_refuses_text_that_is_not_compiled_hlo(text):
    if text.lstrip().startswith("HloModule"):
        return
    with pytest.raises(ValueError, match="HloModule"):
        collective_stats(text)


def test_collective_stats_names_stablehlo_for_what_it_is():
    _, lowered = _lowered()
    with pytest.raises(ValueError, match="StableHLO from Lowered.as_text"):
        collective_stats(lowered.as_text())


_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


@given(st.one_of(st.integers(0, 2**45), st.floats(0, 2**45, allow_nan=False)))
def test_format_bytes_reads_back_within_rounding(n):
    text = format_bytes(n)
    m = re.fullmatch(r"(\d+(?:\.\d)?) (B|KiB|MiB|GiB)", text)
    assert m, text
    value, unit = float(m.group(1)), m.group(2)
    assert value * _UNITS[unit] == pytest.approx(n, rel=0.05, abs=0.5 * _UNITS[unit] / 10 + 0.5)
    assert unit == "GiB" or value < 1024


def test_flax_nnx_compiled_steps_are_read_through_their_wrapper():
    from flax import nnx

    mesh = make_mesh((2,), ("data",))
    model = nnx.Linear(4, 4, rngs=nnx.Rngs(0))
    x = jax.device_put(jnp.ones((2, 4)), NamedSharding(mesh, P("data")))
    lowered = nnx.jit(lambda m, a: m(a).sum()).lower(model, x)
    compiled = lowered.compile()
    assert collective_stats(compiled) == collective_stats(compiled.compiled)
    assert step_memory(compiled) == step_memory(compiled.compiled)
    with pytest.raises(TypeError, match="not partitioned yet"):
        collective_stats(lowered)


@settings(max_examples=10)
@given(st.integers(2, 8), st.integers(1, 4))
def test_collective_ops_add_up_to_collective_stats(n, layers):
    from helpers.measuring.measure import collective_ops

    mesh = make_mesh((n,), ("data",))
    ws = jax.ShapeDtypeStruct(
        (layers, 8 * n, 8), jnp.float32, sharding=NamedSharding(mesh, P(None, "data"))
    )
    x = jax.ShapeDtypeStruct((4, 8 * n), jnp.float32, sharding=NamedSharding(mesh, P()))

    def f(ws, x):
        return jax.lax.scan(lambda h, w: (jnp.tanh(h @ w @ w.T), None), x, ws)[0].sum()

    compiled = jax.jit(jax.grad(f)).lower(ws, x).compile()
    ops = collective_ops(compiled)
    for per_step in (False, True):
        stats = collective_stats(compiled, per_step=per_step)
        for kind, entry in stats.items():
            mine = [o for o in ops if o.kind == kind]
            times = [o.runs if per_step else 1 for o in mine]
            assert entry["ops"] == sum(times)
            assert entry["sent_per_device"] == pytest.approx(
                sum(t * o.sent_per_device for t, o in zip(times, mine, strict=True))
            )
