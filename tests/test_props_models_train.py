"""Property-based tests of helpers.placing.models and helpers.placing.train: sizes, data, loss, placement."""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import (
    LOGICAL_RULES,
    STRATEGY_AXES,
    check_spec,
    make_mesh,
    mesh_shape_for,
    planned_bytes_per_device,
)
from helpers.placing.models import ModelConfig, cross_entropy, synthetic_batch
from helpers.placing.train import init_sharded, param_shardings

configs = st.builds(
    ModelConfig,
    d_model=st.sampled_from([8, 12, 16, 24, 30]),
    d_ff=st.sampled_from([8, 16, 20, 48]),
    n_layers=st.integers(1, 3),
    n_classes=st.sampled_from([2, 5, 16]),
    batch=st.sampled_from([1, 4, 6, 8]),
    seq=st.integers(1, 4),
)


@settings(max_examples=15)
@given(configs)
def test_param_count_formula_matches_init(cfg):
    x = jnp.zeros((1, cfg.seq, cfg.d_model))
    params = nn.meta.unbox(jax.eval_shape(cfg.model().init, jax.random.key(0), x)["params"])
    assert sum(math.prod(p.shape) for p in jax.tree.leaves(params)) == cfg.param_count()
    matmul = cfg.n_layers * 2 * cfg.d_model * cfg.d_ff + cfg.d_model * cfg.n_classes
    assert cfg.train_flops_per_step() == 6 * cfg.batch * cfg.seq * matmul


small = st.builds(
    ModelConfig,
    d_model=st.sampled_from([8, 16]),
    n_classes=st.sampled_from([2, 16]),
    batch=st.sampled_from([1, 4]),
    seq=st.sampled_from([1, 3]),
)  # few distinct shapes: each new shape compiles


@settings(max_examples=5)
@given(small, st.integers(0, 2**31 - 1))
def test_synthetic_batches_have_their_shapes_and_labels_in_range(cfg, seed):
    x, labels = synthetic_batch(jax.random.key(seed), cfg)
    assert x.shape == (cfg.batch, cfg.seq, cfg.d_model) and labels.shape == (cfg.batch, cfg.seq)
    assert (
        labels.dtype == jnp.int32 and int(labels.min()) >= 0 and int(labels.max()) < cfg.n_classes
    )


@settings(max_examples=10)
@given(st.sampled_from([2, 7, 16]), st.sampled_from([1, 3]), st.floats(-5, 5))
def test_cross_entropy_of_uniform_logits_is_log_classes(classes, n, value):
    logits = jnp.full((n, 1, classes), value)
    labels = jnp.zeros((n, 1), jnp.int32)
    assert float(cross_entropy(logits, labels)) == pytest.approx(np.log(classes), rel=1e-5)


def _placeable(cfg: ModelConfig, mesh, strategy: str) -> bool:
    """The oracle: every parameter's dims divide by the mesh axes its logical names map to."""
    x = jnp.zeros((1, cfg.seq, cfg.d_model))
    abstract = jax.eval_shape(cfg.model().init, jax.random.key(0), x)
    logical = nn.get_partition_spec(abstract)["params"]
    params = nn.meta.unbox(abstract)["params"]
    specs = nn.logical_to_mesh(logical, LOGICAL_RULES[strategy])
    is_spec = lambda s: isinstance(s, jax.sharding.PartitionSpec)  # noqa: E731
    for p, spec in zip(
        jax.tree.leaves(params), jax.tree.leaves(specs, is_leaf=is_spec), strict=True
    ):
        try:
            check_spec(p.shape, spec, mesh)
        except ValueError:
            return False
    return True


@settings(max_examples=25)
@given(configs, st.sampled_from(sorted(LOGICAL_RULES)), st.integers(1, 8))
def test_param_shardings_places_exactly_what_divides_and_names_what_does_not(cfg, strategy, n):
    mesh = make_mesh(mesh_shape_for(n, 2), ("data", "model"))
    x = jnp.zeros((mesh.shape["data"], cfg.seq, cfg.d_model))
    if _placeable(cfg, mesh, strategy):
        shardings = param_shardings(cfg.model(), x, mesh, strategy)
        for s in jax.tree.leaves(
            shardings, is_leaf=lambda s: isinstance(s, jax.sharding.NamedSharding)
        ):
            assert set(a for e in s.spec if e for a in ((e,) if isinstance(e, str) else e)) <= set(
                STRATEGY_AXES[strategy]
            ) | {"data"}
    else:
        with pytest.raises(
            ValueError, match=r"param_shardings: '.+' has shape .*mesh axis '(data|model)'"
        ):
            param_shardings(cfg.model(), x, mesh, strategy)


@settings(max_examples=3)
@given(configs, st.sampled_from(["dp", "fsdp", "tp"]), st.sampled_from([1, 2, 4]))
def test_init_sharded_holds_what_the_plan_says(cfg, strategy, n):
    mesh = make_mesh(mesh_shape_for(n, 2), ("data", "model"))
    x = jnp.zeros((mesh.shape["data"], cfg.seq, cfg.d_model))
    if not _placeable(cfg, mesh, strategy):
        return
    state = init_sharded(cfg.model(), x, mesh, strategy, jax.random.key(0))
    for p, s in zip(
        jax.tree.leaves(state.params), jax.tree.leaves(state.param_shardings), strict=True
    ):
        assert p.sharding.is_equivalent_to(s, p.ndim)
    assert planned_bytes_per_device(state.params) == {
        k: v
        for k, v in planned_bytes_per_device(
            jax.tree.map(
                lambda p, s: jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=s),
                state.params,
                state.param_shardings,
            )
        ).items()
    }
