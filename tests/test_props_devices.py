"""Property-based tests of helpers.placing.devices: mesh shapes and meshes for any device count."""

from __future__ import annotations

import itertools
import math

import jax
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from helpers import make_mesh, mesh_shape_for, use_simulated_devices


def _factorisations(n: int, k: int) -> list[tuple[int, ...]]:
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    return [c for c in itertools.product(divisors, repeat=k) if math.prod(c) == n]


@given(st.integers(1, 96), st.integers(1, 4), st.sampled_from(["first", "last"]))
def test_mesh_shape_for_uses_every_device_and_is_as_square_as_possible(n, k, prefer):
    shape = mesh_shape_for(n, k, prefer=prefer)
    assert len(shape) == k and math.prod(shape) == n and min(shape) >= 1
    assert list(shape) == sorted(shape, reverse=(prefer == "first"))
    # "As square as possible": no factorisation into k axes has a smaller largest axis.
    assert max(shape) == min(max(c) for c in _factorisations(n, k))


@given(st.integers(-5, 0), st.integers(1, 3))
def test_mesh_shape_for_refuses_no_devices(n, k):
    with pytest.raises(ValueError, match="n_devices"):
        mesh_shape_for(n, k)


@given(st.lists(st.integers(1, 8), min_size=1, max_size=3))
def test_make_mesh_uses_the_first_devices_in_order(sizes):
    assume(math.prod(sizes) <= len(jax.devices()))
    names = ("data", "model", "pipe")[: len(sizes)]
    mesh = make_mesh(sizes, names)
    assert dict(mesh.shape) == dict(zip(names, sizes, strict=True))
    assert [d.id for d in mesh.devices.flat] == list(range(math.prod(sizes)))


@given(st.lists(st.integers(-3, 12), min_size=1, max_size=3), st.integers(0, 2))
def test_make_mesh_answers_or_refuses_with_the_series_error(sizes, minus_ones):
    sizes = [-1] * minus_ones + sizes
    names = tuple(f"ax{i}" for i in range(len(sizes)))
    n = len(jax.devices())
    rest = math.prod(s for s in sizes if s != -1)
    ok = (
        sizes.count(-1) <= 1
        and all(s >= 1 or s == -1 for s in sizes)
        and (
            sizes.count(-1) == 0
            and rest <= n
            or sizes.count(-1) == 1
            and rest > 0
            and n % rest == 0
        )
    )
    if ok:
        mesh = make_mesh(sizes, names)
        assert math.prod(mesh.devices.shape) == (n if -1 in sizes else rest)
    else:
        with pytest.raises(ValueError, match="make_mesh"):
            make_mesh(sizes, names)


@given(st.integers(1, 3), st.integers(1, 3))
def test_make_mesh_refuses_mismatched_names(n_shape, n_names):
    assume(n_shape != n_names)
    with pytest.raises(ValueError, match="has 1 axes|axes but names"):
        make_mesh([1] * n_shape, [f"a{i}" for i in range(n_names)])


@given(st.one_of(st.integers(-3, 0), st.booleans(), st.floats(0.5, 9), st.text(max_size=3)))
def test_use_simulated_devices_refuses_what_is_no_device_count(n):
    with pytest.raises(ValueError, match="use_simulated_devices"):
        use_simulated_devices(n, quiet=True)


@given(st.integers(1, 16))
def test_use_simulated_devices_after_start_returns_the_same_or_refuses(n):
    # The backend started with 8 devices (tests/conftest.py): JAX cannot change that.
    if n == len(jax.devices()):
        assert len(use_simulated_devices(n, quiet=True)) == n
    else:
        with pytest.raises(RuntimeError, match="Restart the kernel"):
            use_simulated_devices(n, quiet=True)
