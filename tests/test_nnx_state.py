"""The series' helpers on Flax NNX trees: ``nnx.state(model)``, placed and abstract.

The tree walker (``helpers.placing.sharding.leaves_with_paths``) counts each ``nnx.Variable`` as the
array it holds, under the Variable's own path, so that every helper built on it
(``sharding_table``, ``memory_per_device``, ``planned_bytes_per_device``,
``draw_param_shardings``) reads NNX state the way it reads a Linen parameter dict.
"""
# The devices must be set before any other JAX use, so imports follow that call.
# ruff: noqa: E402

from helpers import use_simulated_devices

use_simulated_devices(8, quiet=True)

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from helpers import (
    draw_param_shardings,
    make_mesh,
    memory_per_device,
    planned_bytes_per_device,
    sharding_table,
)
from helpers.compat import nnx_sharding_names
from helpers.placing.sharding import leaves_with_paths, sharding_of

KERNEL, BIAS = (64, 32), (32,)


class TwoLayers(nnx.Module):
    """A kernel split over "data" by its rows, a replicated bias, and a small second layer."""

    def __init__(self, rngs: nnx.Rngs):
        self.dense = nnx.Linear(
            *KERNEL,
            kernel_init=nnx.with_partitioning(nnx.initializers.lecun_normal(), ("data", None)),
            bias_init=nnx.with_partitioning(nnx.initializers.zeros_init(), (None,)),
            rngs=rngs,
        )
        self.out = nnx.Linear(KERNEL[1], 4, use_bias=False, rngs=rngs)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def mesh():
    return make_mesh((8,), ("data",))


@pytest.fixture(scope="module")
def model(mesh):
    with jax.set_mesh(mesh):  # eager sharding: each Variable is placed as it is created
        return TwoLayers(nnx.Rngs(0))


NAMES = ["dense/bias", "dense/kernel", "out/kernel"]


def test_paths_are_the_variables_paths_and_leaves_their_arrays(model):
    pairs = leaves_with_paths(nnx.state(model), "test")
    assert [name for name, _ in pairs] == NAMES  # no trailing "/value"
    kernel = dict(pairs)["dense/kernel"]
    assert isinstance(kernel, jax.Array) and kernel.shape == KERNEL
    assert kernel is model.dense.kernel[...]


def test_memory_per_device_of_placed_state(model):
    mem = memory_per_device(nnx.state(model))
    kernel_share = KERNEL[0] // 8 * KERNEL[1] * 4  # 8 rows of 32 float32 per device
    replicated = BIAS[0] * 4 + KERNEL[1] * 4 * 4  # the bias and the (32, 4) kernel, whole
    assert mem == {f"cpu:{i}": kernel_share + replicated for i in range(8)}
    assert planned_bytes_per_device(nnx.state(model)) == mem
    assert memory_per_device(model) == mem  # the module itself is a pytree too


def test_sharding_table_of_placed_state(model):
    lines = sharding_table(nnx.state(model)).splitlines()
    assert [line.split()[0] for line in lines[2:5]] == NAMES
    kernel_row = next(line for line in lines if line.startswith("dense/kernel "))
    assert "(64, 32)" in kernel_row and "('data', None)" in kernel_row
    assert "(8, 32)" in kernel_row and "1.0 KiB" in kernel_row
    assert lines[-1].startswith("total: 8.6 KiB in 3 arrays")


def test_only_params_and_optimizer_state(mesh, model):
    params = nnx.state(model, nnx.Param)
    assert [name for name, _ in leaves_with_paths(params, "test")] == NAMES
    with jax.set_mesh(mesh):  # the optimizer's moments copy the parameters' annotations
        optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    names = [name for name, _ in leaves_with_paths(nnx.state(optimizer), "test")]
    assert names == [
        "opt_state/0/count",
        *(f"opt_state/0/mu/{n}" for n in NAMES),
        *(f"opt_state/0/nu/{n}" for n in NAMES),
        "step",
    ]
    adam = memory_per_device(nnx.state(optimizer))
    params_held = memory_per_device(params)
    # mu and nu are laid out like the parameters; the two counters are int32 scalars.
    assert adam["cpu:0"] == 2 * params_held["cpu:0"] + 4 + 4


def test_abstract_state_from_get_abstract_model(mesh, model):
    _, abstract = nnx.get_abstract_model(lambda: TwoLayers(nnx.Rngs(0)), mesh)
    assert all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(abstract))
    assert planned_bytes_per_device(abstract) == memory_per_device(nnx.state(model))
    assert sharding_table(abstract) == sharding_table(nnx.state(model))
    with pytest.raises(ValueError, match="parameter 'dense/bias'.*not a placed jax.Array"):
        memory_per_device(abstract)


def test_eval_shape_state_names_the_parameter_and_the_way_out(mesh):
    # nnx.eval_shape gives shardings on an AbstractMesh (no devices) in newer flax, and no
    # sharding at all in flax 0.12.0: either way the error names the parameter and the fix.
    with jax.set_mesh(mesh):
        abstract_model = nnx.eval_shape(lambda: TwoLayers(nnx.Rngs(0)))
    state = nnx.state(abstract_model)
    with pytest.raises(
        ValueError,
        match=r"'dense/bias' \(shape \(32,\)\).*(AbstractMesh|no sharding).*get_abstract_model",
    ):
        sharding_table(state)
    with pytest.raises(ValueError, match="get_abstract_model"):
        draw_param_shardings(state)


def test_draw_param_shardings_of_nnx_state(model):
    fig = draw_param_shardings(nnx.state(model))
    assert [ax.get_title().splitlines()[0] for ax in fig.axes[:-1]] == NAMES
    kernel_panel = fig.axes[1]
    blocks = [p.get_gid() for p in kernel_panel.patches if (p.get_gid() or "").startswith("block:")]
    assert [gid.split("devices=")[1] for gid in blocks] == [str(i) for i in range(8)]
    bars = [p for p in fig.axes[-1].patches if (p.get_gid() or "").startswith("bar:")]
    assert [b.get_height() for b in bars] == list(memory_per_device(nnx.state(model)).values())


def test_a_variable_holding_a_tree_names_its_arrays(mesh):
    moments = nnx.Variable(
        {
            "a": jnp.ones((8, 2)),
            "b": jax.device_put(jnp.ones((16,)), NamedSharding(mesh, P("data"))),
        }
    )
    pairs = leaves_with_paths({"moments": moments, "plain": np.zeros(3)}, "test")
    assert [name for name, _ in pairs] == ["moments/a", "moments/b", "plain"]
    shape, sharding = sharding_of(dict(pairs)["moments/b"])
    assert shape == (16,) and sharding.spec == P("data")


def test_sharding_names_read_from_metadata_whatever_the_flax(model):
    assert nnx_sharding_names(model.dense.kernel.get_metadata()) == ("data", None)
    assert nnx_sharding_names(model.out.kernel.get_metadata()) is None  # not annotated
    assert nnx_sharding_names({"sharding_names": ("a",)}) == ("a",)  # flax < 0.12.4
