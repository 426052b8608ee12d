"""ZeRO stages 0-3 on the series' models: what each device keeps, and how gradients meet.

Rajbhandari et al. 2019 ("ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", arXiv:1910.02054) split a data-parallel step's model states in three steps:

- stage 0 is plain data parallelism (``"dp"``): everything replicated, gradients all-reduced;
- stage 1 shards the optimizer state over ``data``; parameters and gradients stay
  replicated; each device updates its slice and the new parameters are all-gathered;
- stage 2 shards the gradients too: a *reduce-scatter* leaves each device the summed
  gradient of its slice only, instead of an all-reduce leaving every device all of it;
- stage 3 shards the parameters as well: that is the series' FSDP (``"fsdp"``).

Stages 1 and 2 write the gradient reduction by hand in ``jax.shard_map`` (``psum`` or
``psum_scatter``), so the compiled program shows the collective each stage is defined
by: XLA's CPU partitioner, left to itself, compiles stage 2's sharding constraint into
an all-reduce followed by a slice (notebook 04 shows the same for FSDP). Parameters are
split the way FSDP splits them (``fsdp_specs``: the largest dimension the axis divides;
small arrays stay whole).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from helpers import compat
from helpers.placing.models import cross_entropy
from helpers.placing.sharding import FSDPShardsNothingWarning, check_spec, fsdp_specs
from helpers.placing.train import (
    ShardedState,
    init_opt_state,
    init_sharded,
    make_train_step,
    opt_state_shardings,
    param_shardings,
)

P = PartitionSpec

ZERO_STAGES: dict[int, str] = {
    0: "DP: everything replicated; gradients all-reduced",
    1: "ZeRO-1: optimizer state sharded; gradients all-reduced",
    2: "ZeRO-2: optimizer state and gradients sharded; gradients reduce-scattered",
    3: "ZeRO-3 (FSDP): parameters, gradients and optimizer state sharded",
}


def _check_stage(stage: Any, where: str) -> int:
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        raise ValueError(f"{where}: stage={stage!r} must be one of 0, 1, 2, 3.")
    return int(stage)


def _check_axis(mesh: Mesh, axis: str, where: str) -> None:
    if not isinstance(mesh, Mesh):
        raise ValueError(f"{where}: mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}.")
    if axis not in mesh.shape:
        raise ValueError(
            f"{where}: axis={axis!r} is not a mesh axis; the mesh has {tuple(mesh.axis_names)}."
        )


def zero_specs(params: Any, mesh: Mesh, axis: str = "data") -> Any:
    """The ``PartitionSpec`` of each parameter's slice under ZeRO-1/2: ``fsdp_specs`` with
    no minimum size (ZeRO partitions every array, as the paper's flat partitions do),
    without its warning when nothing can be split (then every stage is plain DP)."""
    _check_axis(mesh, axis, "zero_specs")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FSDPShardsNothingWarning)
        return fsdp_specs(params, mesh, axis, min_size=1)


def init_zero(
    model: nn.Module,
    x: Any,
    mesh: Mesh,
    key: jax.Array,
    optimizer: optax.GradientTransformation,
    stage: int,
    axis: str = "data",
) -> ShardedState:
    """Parameters and optimizer state placed for ZeRO ``stage`` (0-3) over mesh axis ``axis``.

    Stages 0 and 3 are ``init_sharded`` with the ``"dp"`` and ``"fsdp"`` rules; stages 1
    and 2 keep the parameters replicated and shard the optimizer state like FSDP would
    shard the parameters.

    Raises:
      ValueError: ``stage`` is not 0-3, or ``axis`` is not an axis of ``mesh`` (before any
        jax call).
    """
    stage = _check_stage(stage, "init_zero")
    _check_axis(mesh, axis, "init_zero")
    rules = "fsdp" if stage == 3 else "dp"
    state = init_sharded(model, x, mesh, rules, key, optimizer)
    if stage in (1, 2):
        specs = zero_specs(state.params, mesh, axis)
        shardings = jax.tree.map(
            lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda s: isinstance(s, P)
        )
        opt_state, opt_shardings = init_opt_state(optimizer, state.params, shardings, mesh)
        state = dataclasses.replace(state, opt_state=opt_state, opt_shardings=opt_shardings)
    return state


def _scatter_dim(spec: PartitionSpec, axis: str) -> int | None:
    for dim, entry in enumerate(spec):
        if entry == axis or (isinstance(entry, tuple) and axis in entry):
            return dim
    return None


def _zero_local_grads(
    model: nn.Module, mesh: Mesh, specs: Any, stage: int, axis: str
) -> Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, Any]]:
    """ZeRO-1/2's gradients in ``shard_map``: ``(params, x, labels) -> (loss, grads)``.

    Each device differentiates the loss of its slice of the batch; stage 1 averages the
    gradients with ``pmean``, stage 2 reduce-scatters them into the slices of ``specs``.
    """
    n = mesh.shape[axis]
    is_spec = lambda s: isinstance(s, P)  # noqa: E731
    grad_specs = specs if stage == 2 else jax.tree.map(lambda _: P(), specs, is_leaf=is_spec)
    # Inside shard_map every array is already this device's own: no rules, so that the
    # model's logical constraints are no-ops (a constraint on a manual axis is an error).
    no_rules: tuple[tuple[str, Any], ...] = ()

    def per_device(params: Any, x: jax.Array, labels: jax.Array) -> tuple[jax.Array, Any]:
        def loss_fn(p: Any) -> jax.Array:
            with nn.logical_axis_rules(no_rules):
                return cross_entropy(model.apply({"params": p}, x), labels)

        # Varying over the axis: each device differentiates its own loss, and the only
        # reduction of the gradients is the one written below. (Left invariant, the
        # parameters' gradient would come back already summed: the transpose of an
        # invariant input's implicit broadcast is a psum.)
        loss, grads = jax.value_and_grad(loss_fn)(compat.pvary(params, axis))

        def reduce(g: jax.Array, spec: PartitionSpec) -> jax.Array:
            dim = _scatter_dim(spec, axis) if stage == 2 else None
            if dim is None:
                return jax.lax.pmean(g, axis)
            return jax.lax.psum_scatter(g, axis, scatter_dimension=dim, tiled=True) / n

        grads = jax.tree.map(reduce, grads, specs, is_leaf=is_spec)
        return jax.lax.pmean(loss, axis), grads

    batch = P(axis)
    return jax.shard_map(
        per_device,
        mesh=mesh,
        in_specs=(P(), batch, batch),
        out_specs=(P(), grad_specs),
    )


def make_zero_train_step(
    model: nn.Module,
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
    state: ShardedState,
    stage: int,
    axis: str = "data",
    donate: bool = True,
) -> Callable[[Any, Any, Any, Any], tuple[Any, Any, jax.Array]]:
    """A jitted ``step(params, opt_state, x, labels) -> (params, opt_state, loss)`` for ZeRO
    ``stage``, on a state from ``init_zero`` with the same stage.

    Stages 0 and 3 are ``make_train_step`` with the ``"dp"`` and ``"fsdp"`` rules. For 1
    and 2, each device computes the gradient of its own slice of the batch in
    ``jax.shard_map``; stage 1 averages the gradients with ``pmean`` (an all-reduce),
    stage 2 with ``psum_scatter`` (a reduce-scatter) into the optimizer state's slices.
    The Adam update then runs on each device's slice, and the pinned replicated output
    makes XLA all-gather the new parameters. The loss is the mean over the whole batch,
    as in DP, so every stage trains the same model.

    Raises:
      ValueError: ``stage`` is not 0-3, ``axis`` is not a mesh axis, or (when called) the
        batch is not divisible by the axis.
    """
    stage = _check_stage(stage, "make_zero_train_step")
    _check_axis(mesh, axis, "make_zero_train_step")
    if stage in (0, 3):
        return make_train_step(
            model, optimizer, mesh, state, "fsdp" if stage == 3 else "dp", donate=donate
        )
    batch = P(axis)
    local_grads = _zero_local_grads(model, mesh, zero_specs(state.params, mesh, axis), stage, axis)

    def step(
        params: Any, opt_state: Any, x: jax.Array, labels: jax.Array
    ) -> tuple[Any, Any, jax.Array]:
        loss, grads = local_grads(params, x, labels)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    data = NamedSharding(mesh, batch)
    jitted = jax.jit(
        step,
        in_shardings=(state.param_shardings, state.opt_shardings, data, data),
        out_shardings=(state.param_shardings, state.opt_shardings, NamedSharding(mesh, P())),
        donate_argnums=(0, 1) if donate else (),
    )

    def _check(x: Any, labels: Any) -> None:
        check_spec(tuple(x.shape), batch, mesh, "the batch x")
        check_spec(tuple(labels.shape), batch, mesh, "the labels")

    def run(params: Any, opt_state: Any, x: Any, labels: Any) -> tuple[Any, Any, jax.Array]:
        _check(x, labels)
        with compat.set_mesh(mesh):
            return jitted(params, opt_state, x, labels)

    def lower(params: Any, opt_state: Any, x: Any, labels: Any) -> Any:
        _check(x, labels)
        with compat.set_mesh(mesh):
            return jitted.lower(params, opt_state, x, labels)

    run.jitted = jitted  # type: ignore[attr-defined]
    run.lower = lower  # type: ignore[attr-defined]
    return run


def abstract_zero_state(
    model: nn.Module,
    x: Any,
    mesh: Mesh,
    optimizer: optax.GradientTransformation,
    stage: int,
    axis: str = "data",
) -> ShardedState:
    """``init_zero``'s state as ``jax.ShapeDtypeStruct`` s with their shardings: nothing is
    allocated, so a model far larger than this machine can be compiled
    (``compile_zero_step``)."""
    stage = _check_stage(stage, "abstract_zero_state")
    _check_axis(mesh, axis, "abstract_zero_state")
    shardings = param_shardings(model, x, mesh, "fsdp" if stage == 3 else "dp")
    shapes = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), x)["params"])

    def place(a: Any, s: Any) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)

    params = jax.tree.map(place, shapes, shardings)
    opt_params = shardings
    if stage in (1, 2):
        opt_params = jax.tree.map(
            lambda s: NamedSharding(mesh, s),
            zero_specs(params, mesh, axis),
            is_leaf=lambda s: isinstance(s, P),
        )
    opt_shardings = opt_state_shardings(optimizer, params, opt_params, mesh)
    opt_state = jax.tree.map(place, jax.eval_shape(optimizer.init, params), opt_shardings)
    return ShardedState(params, opt_state, shardings, opt_shardings)


def compile_zero_step(
    model: nn.Module,
    tokens: tuple[int, int],
    mesh: Mesh,
    optimizer: optax.GradientTransformation,
    stage: int,
    axis: str = "data",
) -> Any:
    """Compile one ZeRO ``stage`` training step of a ``TransformerLM`` on ``tokens =
    (batch, seq)`` from abstract shapes alone; read it with ``helpers.step_memory`` and
    ``helpers.collective_stats``.

    Raises:
      ValueError: ``tokens`` is not two positive integers, or the batch is not divisible
        by the axis (before any jax call).
    """
    if (
        not isinstance(tokens, tuple | list)
        or len(tokens) != 2
        or not all(isinstance(t, int) and t > 0 for t in tokens)
    ):
        raise ValueError(f"compile_zero_step: tokens={tokens!r} must be (batch, seq), positive.")
    _check_axis(mesh, axis, "compile_zero_step")
    check_spec(tuple(tokens), P(axis), mesh, "the batch")
    x = jax.ShapeDtypeStruct(tuple(tokens), jax.numpy.int32)
    state = abstract_zero_state(model, x, mesh, optimizer, stage, axis)
    step = make_zero_train_step(model, optimizer, mesh, state, stage, axis)
    batch = NamedSharding(mesh, P(axis))
    x = jax.ShapeDtypeStruct(tuple(tokens), jax.numpy.int32, sharding=batch)
    return step.lower(state.params, state.opt_state, x, x).compile()
