"""One sharded training step, built the way notebooks 02 and 03 teach it inline.

Notebooks 02-03 write these pieces out once, line by line; notebooks 04-06, the
multi-process script and ``helpers.profile`` import them from here so that they all
train exactly the same thing. There is no training *loop* here: loops stay in the
notebooks, where the learner can see them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from helpers import compat
from helpers.models import cross_entropy
from helpers.sharding import logical_rules, warn_unmapped_logical_names

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
    (Flax would leave that dimension whole without a word).
    """
    rules = logical_rules(rules) if isinstance(rules, str) else rules
    abstract = jax.eval_shape(model.init, jax.random.key(0), x)
    logical_specs = nn.get_partition_spec(abstract)
    warn_unmapped_logical_names(logical_specs, rules, where="param_shardings")
    return nn.logical_to_mesh_sharding(logical_specs, mesh, rules)["params"]


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
    state gets the same sharding as the parameters it tracks (E11: created from
    unsharded parameters it would sit whole on one device).
    """
    rules_t = logical_rules(rules) if isinstance(rules, str) else rules
    shardings = param_shardings(model, x, mesh, rules_t)

    def init_params(k: jax.Array) -> Any:
        return nn.meta.unbox(model.init(k, x)["params"])

    with compat.set_mesh(mesh), nn.logical_axis_rules(rules_t):
        params = jax.jit(init_params, out_shardings=shardings)(key)
    opt_state, opt_shardings = None, None
    if optimizer is not None:
        opt_state, opt_shardings = init_opt_state(optimizer, params, shardings, mesh)
    return ShardedState(params, opt_state, shardings, opt_shardings)


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
    ``batch_spec`` (default ``P("data")``). XLA inserts whatever collectives the layout needs (the gradient
    all-reduce for DP, all-gathers and reductions for FSDP, ...). With ``donate`` the
    old parameters and optimizer state are donated, so their memory is reused.
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
        with compat.set_mesh(mesh):
            return jitted(params, opt_state, x, labels)

    run.jitted = jitted  # type: ignore[attr-defined]
    run.lower = lambda *a: _lower(jitted, mesh, *a)  # type: ignore[attr-defined]
    return run


def _lower(jitted: Any, mesh: Mesh, *args: Any) -> Any:
    with compat.set_mesh(mesh):
        return jitted.lower(*args)
