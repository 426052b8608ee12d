"""Property-based tests of helpers.placing.sharding: spec checks, placement, layouts, the FSDP rule."""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from generators import any_specs, dtypes, fitting_specs, meshes, placed_arrays, shapes, spec_fits
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding

from helpers import (
    LOGICAL_RULES,
    STRATEGY_AXES,
    check_spec,
    fsdp_plan,
    fsdp_specs,
    logical_rules,
    shard_layout,
    shard_tree,
)


@settings(max_examples=80)
@given(st.data())
def test_check_spec_accepts_exactly_what_jax_can_place(data):
    mesh = data.draw(meshes())
    shape = data.draw(shapes())
    spec = data.draw(st.one_of(any_specs(shape, mesh), fitting_specs(shape, mesh)))
    if spec_fits(shape, spec, mesh):
        check_spec(shape, spec, mesh, "w")
        jax.device_put(jnp.zeros(shape), NamedSharding(mesh, spec))  # and JAX agrees
    else:
        with pytest.raises(ValueError) as info:
            check_spec(shape, spec, mesh, "w")
        msg = str(info.value)
        assert "'w'" in msg and str(shape) in msg
        names = [a for e in spec if e is not None for a in ((e,) if isinstance(e, str) else e)]
        assert len(spec) > len(shape) or any(f"'{a}'" in msg for a in names)


@settings(max_examples=40)
@given(st.data())
def test_shard_tree_places_every_leaf_as_asked_or_refuses_before_jax(data):
    mesh = data.draw(meshes())
    shapes_ = data.draw(st.lists(shapes(0, 3), min_size=1, max_size=3))
    tree = {f"p{i}": jnp.zeros(s) for i, s in enumerate(shapes_)}
    specs = {
        k: data.draw(st.one_of(fitting_specs(v.shape, mesh), any_specs(v.shape, mesh)))
        for k, v in tree.items()
    }
    if all(spec_fits(tree[k].shape, specs[k], mesh) for k in tree):
        placed = shard_tree(tree, specs, mesh)
        for k, x in placed.items():
            assert x.sharding.is_equivalent_to(NamedSharding(mesh, specs[k]), x.ndim)
    else:
        with pytest.raises(ValueError) as info:
            shard_tree(tree, specs, mesh)
        assert "'p" in str(info.value)  # names the parameter
        assert "jaxlib" not in "".join(str(e.path) for e in info.traceback)


@settings(max_examples=30)
@given(st.data())
def test_shard_layout_tiles_the_array_once_per_replica(data):
    mesh = data.draw(meshes())
    x = data.draw(placed_arrays(mesh, max_rank=4))
    blocks = shard_layout(x.shape, x.sharding)
    n = len(mesh.devices.flat)
    # Every device holds exactly one block, and every block has the same number of holders.
    held = sorted(d for b in blocks for d in b.devices)
    assert held == sorted(d.id for d in mesh.devices.flat)
    assert len({len(b.devices) for b in blocks}) == 1
    # The blocks are disjoint and cover the array: each element exactly once.
    if x.ndim:
        count = np.zeros(x.shape, dtype=int)
        for b in blocks:
            count[tuple(slice(a, z) for a, z in zip(b.start, b.stop, strict=True))] += 1
        assert (count == 1).all()
    else:
        assert len(blocks) == 1
    # Each block is the shard shape JAX gives, and its holders are the devices JAX maps there.
    local = x.sharding.shard_shape(x.shape)
    for b in blocks:
        assert b.shape == tuple(local)
    jax_map = {d.id: idx for d, idx in x.sharding.devices_indices_map(x.shape).items()}
    for b in blocks:
        for d in b.devices:
            got = tuple(
                (s.start or 0, x.shape[i] if s.stop is None else s.stop)
                for i, s in enumerate(jax_map[d])
            )
            assert got == tuple(zip(b.start, b.stop, strict=True))
    assert len(blocks) * len(blocks[0].devices) == n


@settings(max_examples=100)
@given(st.data(), st.sampled_from([1, 16, 2**12]))
def test_fsdp_specs_shards_only_what_divides_and_leaves_nothing_shardable_replicated(
    data, min_size
):
    mesh = data.draw(meshes(max_axes=2))
    axis = mesh.axis_names[0]
    n = mesh.shape[axis]
    leaves = data.draw(st.lists(st.tuples(shapes(0, 4), dtypes), min_size=1, max_size=4))
    tree = {f"p{i}": jax.ShapeDtypeStruct(s, d) for i, (s, d) in enumerate(leaves)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a plan that shards nothing may warn: tested elsewhere
        specs = fsdp_specs(tree, mesh, axis=axis, min_size=min_size)
        plan = {c.path: c for c in fsdp_plan(tree, mesh, axis=axis, min_size=min_size)}
    for name, leaf in tree.items():
        spec = specs[name]
        check_spec(leaf.shape, spec, mesh, name)  # never an indivisible dimension
        sharded = [i for i, e in enumerate(spec) if e is not None]
        divisible = [i for i, s in enumerate(leaf.shape) if s % n == 0]
        big = math.prod(leaf.shape) >= min_size
        if n > 1 and big and divisible:
            assert len(sharded) == 1, (name, leaf.shape, spec)
            dim = sharded[0]
            assert leaf.shape[dim] == max(leaf.shape[i] for i in divisible)  # the largest that fits
        else:
            assert sharded == [], (name, leaf.shape, spec)
        assert plan[name].spec == spec and plan[name].reason


@given(st.text(max_size=8))
def test_logical_rules_answers_for_presets_and_refuses_the_rest(name):
    if name in LOGICAL_RULES:
        assert logical_rules(name) == LOGICAL_RULES[name]
    else:
        with pytest.raises(ValueError, match="is not one of"):
            logical_rules(name)


@given(st.sampled_from(sorted(LOGICAL_RULES)))
def test_every_preset_maps_each_logical_name_once_to_a_known_axis(strategy):
    rules = logical_rules(strategy)
    names = [n for n, _ in rules]
    assert len(names) == len(set(names))
    # Every preset is written for a ("data", "model") mesh, and names the axes it needs.
    axes = set()
    for _, entry in rules:
        axes |= set(() if entry is None else (entry,) if isinstance(entry, str) else entry)
    assert axes <= {"data", "model"}
    assert set(STRATEGY_AXES[strategy]) <= axes | {"data"}


@settings(max_examples=60)
@given(st.data(), st.sampled_from([1, 64, 2**12]))
def test_fsdp_warns_exactly_when_it_shards_nothing_on_several_devices(data, min_size):
    import warnings as _w

    from helpers.placing.sharding import FSDPShardsNothingWarning

    mesh = data.draw(meshes(max_axes=1))
    leaves = data.draw(st.lists(shapes(0, 3), min_size=1, max_size=3))
    tree = {f"p{i}": jax.ShapeDtypeStruct(s, jnp.float32) for i, s in enumerate(leaves)}
    with _w.catch_warnings(record=True) as caught:
        _w.simplefilter("always")
        specs = fsdp_specs(tree, mesh, axis="data", min_size=min_size)
    nothing = all(all(e is None for e in spec) for spec in specs.values())
    warned = any(issubclass(w.category, FSDPShardsNothingWarning) for w in caught)
    assert warned == (nothing and mesh.size > 1)
