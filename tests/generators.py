"""Hypothesis strategies shared by the property-based tests (``tests/test_props_*.py``).

They draw what a learner might hand a helper: shapes of rank 0-4 whose dimensions include
1, primes and sizes the device count does not divide; f32 / bf16 / int32; meshes of 1-3
axes over 1-8 of the 8 simulated devices; PartitionSpecs that fit and ones that do not
(too many entries, unknown axes, an axis used twice, tuples of axes, indivisible
dimensions); and trees with odd leaves. Each test module asks only for what it needs.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding, PartitionSpec

from helpers import make_mesh

P = PartitionSpec
AXIS_NAMES = ("data", "model", "pipe")
DTYPES = (jnp.float32, jnp.bfloat16, jnp.int32)
# 1, primes, composites, and sizes that 3, 5, 6 or 7 devices do not divide.
DIMS = st.sampled_from([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14, 15, 16, 24])

dtypes = st.sampled_from(DTYPES)


def drawing_settings(max_examples: int) -> Any:
    """Settings for a property test that draws figures: no deadline, every health check
    suppressed, and no shrink phase (shrinking a figure takes minutes: a failure is
    reported as drawn)."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
    )


def shapes(min_rank: int = 0, max_rank: int = 4) -> st.SearchStrategy[tuple[int, ...]]:
    return st.lists(DIMS, min_size=min_rank, max_size=max_rank).map(tuple)


@st.composite
def meshes(draw: Any, min_axes: int = 1, max_axes: int = 3) -> Any:
    """A mesh with Auto axes over the first 1-8 devices, 1-3 axes, sizes whose product fits."""
    n_axes = draw(st.integers(min_axes, max_axes))
    sizes: list[int] = []
    for _ in range(n_axes):
        room = len(jax.devices()) // max(1, math.prod(sizes))
        sizes.append(draw(st.integers(1, max(1, room))))
    return make_mesh(tuple(sizes), AXIS_NAMES[:n_axes])


@st.composite
def fitting_specs(draw: Any, shape: tuple[int, ...], mesh: Any) -> PartitionSpec:
    """A spec that can lay out ``shape`` on ``mesh``: each dim gets axes whose sizes divide it."""
    free = list(mesh.axis_names)
    entries: list[Any] = []
    for dim in shape[: draw(st.integers(0, len(shape)))]:
        fits = [a for a in free if dim % mesh.shape[a] == 0]
        choice = draw(st.sampled_from(["none", "one", "pair"]))
        if choice == "one" and fits:
            ax = draw(st.sampled_from(fits))
            entries.append(ax)
            free.remove(ax)
        elif choice == "pair" and len(fits) >= 2:
            a, b = draw(st.permutations(fits))[:2]
            if dim % (mesh.shape[a] * mesh.shape[b]) == 0:
                entries.append((a, b))
                free.remove(a)
                free.remove(b)
            else:
                entries.append(None)
        else:
            entries.append(None)
    return P(*entries)


@st.composite
def any_specs(draw: Any, shape: tuple[int, ...], mesh: Any) -> PartitionSpec:
    """Specs that may or may not fit: too long, unknown or repeated axes, indivisible dims."""
    names = [*mesh.axis_names, "nope"]
    entry = st.one_of(
        st.none(),
        st.sampled_from(names),
        st.lists(st.sampled_from(names), min_size=1, max_size=3).map(tuple),
    )
    return P(*draw(st.lists(entry, min_size=0, max_size=len(shape) + 2)))


def spec_fits(shape: tuple[int, ...], spec: PartitionSpec, mesh: Any) -> bool:
    """The oracle: True when ``spec`` can lay out ``shape`` on ``mesh`` (JAX's rules)."""
    if len(spec) > len(shape):
        return False
    used: list[str] = []
    for dim, entry in zip(shape, spec, strict=False):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        if any(a not in mesh.axis_names for a in axes):
            return False
        used += axes
        if dim % math.prod(mesh.shape[a] for a in axes):
            return False
    return len(used) == len(set(used))


@st.composite
def placed_arrays(draw: Any, mesh: Any, max_rank: int = 3) -> jax.Array:
    """A jax.Array on ``mesh`` under a fitting spec (numbers are small and deterministic)."""
    shape = draw(shapes(0, max_rank))
    dtype = draw(dtypes)
    spec = draw(fitting_specs(shape, mesh))
    x = jnp.arange(math.prod(shape), dtype=jnp.float32).reshape(shape).astype(dtype)
    return jax.device_put(x, NamedSharding(mesh, spec))


@st.composite
def placed_trees(draw: Any, mesh: Any) -> dict[str, Any]:
    """A dict of 1-4 placed arrays, some nested one level."""
    n = draw(st.integers(1, 4))
    tree: dict[str, Any] = {}
    for i in range(n):
        leaf = draw(placed_arrays(mesh))
        if draw(st.booleans()):
            tree[f"layer_{i}"] = {"kernel": leaf}
        else:
            tree[f"w{i}"] = leaf
    return tree


def abstract_of(x: jax.Array, with_sharding: bool = True) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding if with_sharding else None)


# Leaves that are not arrays: a helper must refuse them clearly (or skip what JAX skips).
odd_leaves = st.sampled_from([1, 2.5, True, "kernel", b"x", object(), [1, 2], np.float32(1)])


def nbytes(x: Any) -> int:
    return math.prod(x.shape) * np.dtype(x.dtype).itemsize
