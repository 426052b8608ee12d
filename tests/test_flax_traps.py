"""Models whose own definition breaks under a mesh get the series' explanation, not jax's.

The traps ``nn.with_logical_partitioning`` users hit, each met by ``param_shardings`` (and
so by ``init_sharded``, which places parameters only through it) before anything compiles:

- ``nn.DenseGeneral``'s flat kernel under names for its final 3-D shape (google/flax#3676,
  notebook 08, going deeper F): Flax's init under the mesh fails inside jax;
- more names than the parameter has dimensions: jax's error, naming only a shape;
- fewer names than dimensions: silent, the unnamed dimensions stay whole;
- one logical name twice on one parameter (a square kernel): Flax's one-line error;
- two names whose rules name one mesh axis: silent, Flax's rules are a priority list
  (google/flax#1703) and the second dimension stays whole; a warning;
- a rule naming a mesh axis the mesh lacks;
- ``nn.scan`` / ``nn.vmap`` stacking named parameters without
  ``metadata_params={nn.PARTITION_NAME: ...}``: Flax's ``PartitioningUnspecifiedError``;
- ``nn.with_partitioning`` (mesh axes, not logical names) naming an axis the mesh lacks:
  jax's error from inside Flax's init. Its valid uses are placed as named, as Flax does.

A logical name no rule maps is tested with ``UnmappedLogicalNameWarning`` in
tests/test_sharding.py.
"""

from __future__ import annotations

import warnings

import flax.linen as nn
import jax
import pytest

from helpers import UnmappedLogicalNameWarning, make_mesh
from helpers.placing.train import init_sharded, param_shardings

LECUN = nn.initializers.lecun_normal()
RULES = (("batch", "data"), ("embed", "data"), ("mlp", "model"), ("layers", None))


class NaiveQuery(nn.Module):
    @nn.compact
    def __call__(self, x):
        init = nn.with_logical_partitioning(LECUN, ("embed", "heads", "kv"))
        return nn.DenseGeneral((4, 16), kernel_init=init, use_bias=False)(x)


class NamedDense(nn.Module):
    """One ``nn.Dense`` kernel (64 -> 32) with the given names and partitioning wrapper."""

    names: tuple
    logical: bool = True

    @nn.compact
    def __call__(self, x):
        wrap = nn.with_logical_partitioning if self.logical else nn.with_partitioning
        return nn.Dense(32, kernel_init=wrap(LECUN, self.names), use_bias=False)(x)


class Layer(nn.Module):
    @nn.compact
    def __call__(self, x, _):
        init = nn.with_logical_partitioning(LECUN, ("embed", "mlp"))
        return nn.Dense(64, kernel_init=init, use_bias=False)(x), None


class Stacked(nn.Module):
    """Four ``Layer`` s stacked by ``nn.scan`` or ``nn.vmap``, with or without a name for the stack."""

    how: str
    named: bool

    @nn.compact
    def __call__(self, x):
        kw: dict = {"variable_axes": {"params": 0}, "split_rngs": {"params": True}}
        if self.named:
            kw["metadata_params"] = {nn.PARTITION_NAME: "layers"}
        if self.how == "scan":
            return nn.scan(Layer, length=4, **kw)(name="layers")(x, None)[0]
        return nn.vmap(Layer, in_axes=None, axis_size=4, **kw)(name="layers")(x, None)[0]


def _param_shardings(model, x, mesh, rules):
    return param_shardings(model, x, mesh, rules)


def _init_sharded(model, x, mesh, rules):
    return init_sharded(model, x, mesh, rules, jax.random.key(0)).param_shardings


BOTH = pytest.mark.parametrize("place", [_param_shardings, _init_sharded])


@pytest.fixture(scope="module")
def mesh():
    n = len(jax.devices())
    return make_mesh((n // 2, 2) if n % 2 == 0 else (n, 1), ("data", "model"))


@pytest.fixture(scope="module")
def x():
    return jax.numpy.ones((len(jax.devices()), 64))


def test_dense_general_trap_is_explained_by_init_sharded(mesh, x):
    with pytest.raises(ValueError, match=r"init_sharded: .*3 logical names.*2 dimensions") as e:
        init_sharded(NaiveQuery(), x, mesh, "fsdp", jax.random.key(0))
    assert "DenseGeneral" in str(e.value) and "flax#3676" in str(e.value)


@BOTH
def test_more_names_than_dimensions_is_refused(mesh, x, place):
    with pytest.raises(ValueError, match=r"param_shardings: 'Dense_0/kernel' has shape \(64, 32\)"):
        place(NamedDense(("embed", "mlp", "kv")), x, mesh, "fsdp")


@BOTH
def test_fewer_names_than_dimensions_is_refused_not_left_whole(mesh, x, place):
    with pytest.raises(
        ValueError, match=r"'Dense_0/kernel' has shape \(64, 32\).*only 1 logical name"
    ) as e:
        place(NamedDense(("embed",)), x, mesh, RULES)
    assert "one name per dimension" in str(e.value)


@BOTH
def test_one_name_twice_on_a_parameter_is_explained(mesh, x, place):
    with pytest.raises(ValueError, match=r"'Dense_0/kernel' .*logical name 'embed' twice") as e:
        place(NamedDense(("embed", "embed")), x, mesh, RULES)
    assert "a name of its own" in str(e.value)


@BOTH
def test_two_names_ruled_to_one_mesh_axis_warn_that_the_second_stays_whole(mesh, x, place):
    rules = (("embed", "model"), ("mlp", "model"))
    with pytest.warns(UnmappedLogicalNameWarning, match=r"'mlp' names a mesh axis .* took first"):
        shardings = place(NamedDense(("embed", "mlp")), x, mesh, rules)
    assert tuple(shardings["Dense_0"]["kernel"].spec) == ("model", None)


def test_a_name_whose_first_rule_is_none_is_not_warned_about(mesh, x):
    rules = (("embed", "model"), ("mlp", None), ("mlp", "model"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shardings = param_shardings(NamedDense(("embed", "mlp")), x, mesh, rules)
    assert tuple(shardings["Dense_0"]["kernel"].spec) == ("model", None)


@BOTH
def test_a_rule_naming_an_axis_the_mesh_lacks_is_explained(mesh, x, place):
    rules = (("embed", "data"), ("mlp", "tensor"))
    with pytest.raises(ValueError, match=r"'Dense_0/kernel' .*names mesh axis 'tensor'") as e:
        place(NamedDense(("embed", "mlp")), x, mesh, rules)
    assert "logical axes ('embed', 'mlp')" in str(e.value)
    assert "build the mesh with axis 'tensor'" in str(e.value)


@BOTH
@pytest.mark.parametrize("how", ["scan", "vmap"])
def test_a_stack_without_a_partition_name_is_explained(mesh, x, place, how):
    with pytest.raises(ValueError, match=r"param_shardings: .*nn\.scan or nn\.vmap") as e:
        place(Stacked(how, named=False), x, mesh, RULES)
    assert "('embed', 'mlp') on an array of shape (4,64,64)" in str(e.value)
    assert "metadata_params={nn.PARTITION_NAME: 'layers'}" in str(e.value)


@BOTH
@pytest.mark.parametrize("how", ["scan", "vmap"])
def test_a_stack_with_a_partition_name_is_placed(mesh, x, place, how):
    shardings = place(Stacked(how, named=True), x, mesh, RULES)
    assert tuple(shardings["layers"]["Dense_0"]["kernel"].spec) == (None, "data", "model")


@BOTH
def test_with_partitioning_naming_an_axis_the_mesh_lacks_is_explained(mesh, x, place):
    with pytest.raises(ValueError, match=r"'Dense_0/kernel' .*names mesh axis 'tensor'") as e:
        place(NamedDense(("data", "tensor"), logical=False), x, mesh, RULES)
    assert "nn.with_partitioning names these mesh axes directly" in str(e.value)


@BOTH
def test_with_partitioning_is_placed_as_named_without_a_warning(mesh, x, place):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shardings = place(NamedDense(("data", None), logical=False), x, mesh, RULES)
    assert tuple(shardings["Dense_0"]["kernel"].spec) == ("data", None)
