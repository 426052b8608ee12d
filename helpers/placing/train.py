"""One sharded training step, built the way notebooks 02 and 03 teach it inline.

Notebooks 02-03 write these pieces out once, line by line; notebooks 04-06, the
multi-process script and ``helpers.measuring.profile`` import them from here so that they all
train exactly the same thing. There is no training *loop* here: loops stay in the
notebooks, where the learner can see them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from helpers import compat
from helpers.placing.models import cross_entropy
from helpers.placing.sharding import (
    _axes_of,
    check_spec,
    leaves_with_paths,
    logical_rules,
    warn_unmapped_logical_names,
)

P = PartitionSpec


@dataclass
class ShardedState:
    """Parameters and optimizer state, placed on a mesh, with the shardings used to place them."""

    params: Any
    opt_state: Any
    param_shardings: Any
    opt_shardings: Any


def param_shardings(
    model: nn.Module, x: Any, mesh: Mesh, rules: str | tuple[tuple[str, Any], ...]
) -> Any:
    """The ``NamedSharding`` of every parameter of ``model`` under logical-axis ``rules``.

    Nothing is allocated: ``jax.eval_shape`` gives the boxed abstract parameters,
    ``nn.get_partition_spec`` reads their logical names, and the rules map them to
    mesh axes. A logical name that no rule maps raises an ``UnmappedLogicalNameWarning``
    (Flax would leave that dimension whole without a word). Every resulting spec is checked against its parameter's shape first
    (``check_spec``), so a parameter that cannot be placed fails here, naming the
    parameter, its shape, its logical axes and the mesh axis, instead of with JAX's
    error (which names only a shape) when it is placed. ``init_sharded`` and ``helpers.measuring.profile``
    place parameters only through this function.

    Raises:
      ValueError: a rule maps a dimension to a mesh axis that does not divide it, or to
        an axis the mesh does not have.
    """
    rules = logical_rules(rules) if isinstance(rules, str) else rules
    abstract = jax.eval_shape(model.init, jax.random.key(0), x)
    logical = nn.get_partition_spec(abstract)["params"]
    warn_unmapped_logical_names(logical, rules, where="param_shardings")
    specs = nn.logical_to_mesh(logical, rules)
    is_spec = lambda s: isinstance(s, PartitionSpec)  # noqa: E731
    for (name, sds), names, spec in zip(
        leaves_with_paths(nn.meta.unbox(abstract)["params"], "param_shardings"),
        jax.tree.leaves(logical, is_leaf=is_spec),
        jax.tree.leaves(specs, is_leaf=is_spec),
        strict=True,
    ):
        try:
            check_spec(tuple(sds.shape), spec, mesh, name)
        except ValueError as err:
            missing = [a for e in spec for a in _axes_of(e) if a not in mesh.shape]
            fix = (
                f"build the mesh with axis '{missing[0]}' (helpers.STRATEGY_AXES lists the axes "
                "each preset needs)"
                if missing
                else "choose sizes that the mesh axis divides, or map that logical axis to None"
            )
            raise ValueError(
                f"param_shardings: {err} Its logical axes {tuple(names)} map to "
                f"PartitionSpec{tuple(spec)} under these rules: {fix}."
            ) from None
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=is_spec)


def _check_batch(x: Any, labels: Any, mesh: Mesh, x_spec: Any, label_spec: Any) -> None:
    """Clear errors for a batch that the step's batch sharding cannot split."""
    check_spec(tuple(x.shape), x_spec, mesh, "the batch x")
    check_spec(tuple(labels.shape), label_spec, mesh, "the labels")


def init_sharded(
    model: nn.Module,
    x: Any,
    mesh: Mesh,
    rules: str | tuple[tuple[str, Any], ...],
    key: jax.Array,
    optimizer: optax.GradientTransformation | None = None,
) -> ShardedState:
    """Initialise parameters (and optimizer state) straight into their shardings.

    ``jax.jit(init, out_shardings=...)`` makes each device compute only its own shard, so
    a model larger than one device's memory is never materialised whole. The optimizer
    state gets the same sharding as the parameters it tracks (created from
    unsharded parameters, as the chapter does, it would sit whole on one device).
    """
    rules_t = logical_rules(rules) if isinstance(rules, str) else rules
    shardings = param_shardings(model, x, mesh, rules_t)

    def init_params(k: jax.Array) -> Any:
        return nn.meta.unbox(model.init(k, x)["params"])

    with compat.set_mesh(mesh), nn.logical_axis_rules(rules_t):
        try:
            params = jax.jit(init_params, out_shardings=shardings)(key)
        except ValueError as err:
            _explain_flax_error(err)
            raise
    opt_state, opt_shardings = None, None
    if optimizer is not None:
        opt_state, opt_shardings = init_opt_state(optimizer, params, shardings, mesh)
    return ShardedState(params, opt_state, shardings, opt_shardings)


_RANK_TRAP = re.compile(r"rank at least (\d+), but was applied to a value of rank (\d+)")


def _explain_flax_error(err: ValueError) -> None:
    """Raise the series' explanation for a known trap of ``nn.with_logical_partitioning``
    met inside Flax's init under a mesh; return (so the caller re-raises) for any other."""
    m = _RANK_TRAP.search(str(err))
    if "with_sharding_constraint" not in str(err) or m is None:
        return
    names, rank = m.groups()
    raise ValueError(
        f"init_sharded: a parameter's initialiser carries {names} logical names, but the "
        f"array it draws has {rank} dimensions, so the sharding constraint Flax applies under "
        "the mesh does not fit it. The usual cause: nn.DenseGeneral draws its kernel flat "
        "(2-D) and reshapes it afterwards, so nn.with_logical_partitioning with one name per "
        "final dimension meets the flat array (google/flax#3676; notebook 08, section 6.3). "
        "Draw the kernel in its final shape inside the initialiser (as helpers.placing.models does), "
        "or give the initialiser one name per dimension of the array it draws."
    ) from None


def opt_state_shardings(
    optimizer: optax.GradientTransformation, params: Any, shardings: Any, mesh: Mesh
) -> Any:
    """Shardings for ``optimizer.init(params)``: each parameter-shaped leaf like its parameter,
    everything else (step counters) replicated."""
    abstract = jax.eval_shape(optimizer.init, params)
    replicated = NamedSharding(mesh, P())
    return optax.tree_map_params(
        optimizer,
        lambda _, s: s,
        abstract,
        shardings,
        transform_non_params=lambda _: replicated,
    )


def init_opt_state(
    optimizer: optax.GradientTransformation, params: Any, shardings: Any, mesh: Mesh
) -> tuple[Any, Any]:
    """``optimizer.init(params)`` under jit, with the optimizer state sharded like the parameters."""
    opt_shardings = opt_state_shardings(optimizer, params, shardings, mesh)
    opt_state = jax.jit(optimizer.init, out_shardings=opt_shardings)(params)
    return opt_state, opt_shardings


def make_train_step(
    model: nn.Module,
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
    state: ShardedState,
    rules: str | tuple[tuple[str, Any], ...],
    batch_spec: PartitionSpec | None = None,
    donate: bool = True,
) -> Callable[[Any, Any, Any, Any], tuple[Any, Any, jax.Array]]:
    """A jitted ``step(params, opt_state, x, labels) -> (params, opt_state, loss)``.

    Inputs and outputs are pinned to the state's shardings; the batch is split by
    ``batch_spec`` (default ``P("data")``), and ``step`` and ``step.lower`` check the
    batch against it first (a batch that the ``data`` axis does not divide gets an
    error naming it, its shape and the axis). XLA inserts whatever collectives the
    layout needs (the gradient all-reduce for DP, all-gathers and reductions for FSDP,
    ...). With ``donate`` the old parameters and optimizer state are donated, so their
    memory is reused.
    """
    rules_t = logical_rules(rules) if isinstance(rules, str) else rules
    batch_spec = P("data") if batch_spec is None else batch_spec
    data = NamedSharding(mesh, batch_spec)
    label_spec = P(*tuple(batch_spec)[:2])
    labels_sharding = NamedSharding(mesh, label_spec)
    replicated = NamedSharding(mesh, P())

    def step(
        params: Any, opt_state: Any, x: jax.Array, labels: jax.Array
    ) -> tuple[Any, Any, jax.Array]:
        def loss_fn(p: Any) -> jax.Array:
            with nn.logical_axis_rules(rules_t):
                logits = model.apply({"params": p}, x)
            return cross_entropy(logits, labels)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, loss

    jitted = jax.jit(
        step,
        in_shardings=(state.param_shardings, state.opt_shardings, data, labels_sharding),
        out_shardings=(state.param_shardings, state.opt_shardings, replicated),
        donate_argnums=(0, 1) if donate else (),
    )

    def run(params: Any, opt_state: Any, x: Any, labels: Any) -> tuple[Any, Any, jax.Array]:
        _check_batch(x, labels, mesh, batch_spec, label_spec)
        with compat.set_mesh(mesh):
            return jitted(params, opt_state, x, labels)

    def lower(params: Any, opt_state: Any, x: Any, labels: Any) -> Any:
        _check_batch(x, labels, mesh, batch_spec, label_spec)
        with compat.set_mesh(mesh):
            return jitted.lower(params, opt_state, x, labels)

    run.jitted = jitted  # type: ignore[attr-defined]
    run.lower = lower  # type: ignore[attr-defined]
    return run
