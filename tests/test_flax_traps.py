"""Models whose own definition breaks under a mesh get the series' explanation, not jax's.

The traps ``nn.with_logical_partitioning`` users hit: ``nn.DenseGeneral``'s flat kernel
under names for its final 3-D shape (google/flax#3676, notebook 08 section 6.3), and more
names than the parameter has dimensions on a plain ``nn.Dense``.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import pytest

from helpers import make_mesh
from helpers.placing.train import init_sharded, param_shardings


class NaiveQuery(nn.Module):
    @nn.compact
    def __call__(self, x):
        init = nn.with_logical_partitioning(
            nn.initializers.lecun_normal(), ("embed", "heads", "kv")
        )
        return nn.DenseGeneral((4, 16), kernel_init=init, use_bias=False)(x)


class TooManyNames(nn.Module):
    @nn.compact
    def __call__(self, x):
        init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp", "kv"))
        return nn.Dense(32, kernel_init=init, use_bias=False)(x)


@pytest.fixture(scope="module")
def mesh():
    n = len(jax.devices())
    return make_mesh((n, 1), ("data", "model"))


def test_dense_general_trap_is_explained_by_init_sharded(mesh):
    x = jax.numpy.ones((len(jax.devices()), 64))
    with pytest.raises(ValueError, match=r"init_sharded: .*3 logical names.*2 dimensions") as e:
        init_sharded(NaiveQuery(), x, mesh, "fsdp", jax.random.key(0))
    assert "DenseGeneral" in str(e.value) and "flax#3676" in str(e.value)


def test_more_names_than_dimensions_is_refused_by_param_shardings(mesh):
    x = jax.numpy.ones((len(jax.devices()), 64))
    with pytest.raises(ValueError, match="param_shardings"):
        param_shardings(TooManyNames(), x, mesh, "fsdp")
