"""One sharded training step, built the way notebooks 02 and 03 teach it inline.

Notebooks 02-03 write these pieces out once, line by line; notebooks 04-06, the
multi-process script and ``helpers.measuring.profile`` import them from here so that they all
train exactly the same thing. There is no training *loop* here: loops stay in the
notebooks, where the learner can see them.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import optax
from flax.errors import PartitioningUnspecifiedError
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from helpers import compat
from helpers.placing.models import cross_entropy
from helpers.placing.sharding import (
    UnmappedLogicalNameWarning,
    _axes_of,
    check_spec,
    logical_rules,
    path_str,
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

    Nothing is allocated: ``jax.eval_shape`` gives the boxed abstract parameters, and
    the rules map each parameter's logical names (``nn.with_logical_partitioning``) to
    mesh axes. A parameter boxed by ``nn.with_partitioning`` names mesh axes directly and
    keeps them: no rule applies to it, as none does when Flax initialises it under the
    mesh. A logical name that no rule maps, or whose every rule names a mesh axis another
    dimension of the same parameter took first (Flax's rules are a priority list,
    google/flax#1703), raises an ``UnmappedLogicalNameWarning``: Flax would leave that
    dimension whole without a word. Every resulting spec is checked against its
    parameter's shape first (``check_spec``), so a parameter that cannot be placed fails
    here, naming the parameter, its shape, its axes and the fix, instead of with JAX's
    error (which names only a shape) when it is placed. ``init_sharded`` and
    ``helpers.measuring.profile`` place parameters only through this function.

    Raises:
      ValueError: a parameter has fewer or more logical names than dimensions, or one
        name twice; ``nn.scan`` / ``nn.vmap`` stacked a named parameter without
        ``metadata_params={nn.PARTITION_NAME: ...}``; a spec maps a dimension to a mesh
        axis that does not divide it, or to an axis the mesh does not have.
    """
    rules = logical_rules(rules) if isinstance(rules, str) else rules
    boxed = _abstract_params(model, x)
    warn_unmapped_logical_names(_logical_only(boxed), rules, where="param_shardings")
    flat, treedef = jax.tree_util.tree_flatten_with_path(boxed, is_leaf=_is_box)
    specs = [_checked_spec(path_str(path), leaf, rules, mesh) for path, leaf in flat]
    _warn_taken_axes(flat, specs, rules)
    return jax.tree.unflatten(treedef, [NamedSharding(mesh, s) for s in specs])


def _is_box(leaf: Any) -> bool:
    return isinstance(leaf, nn.Partitioned)


def _logical_only(boxed: Any) -> Any:
    """``boxed`` with ``nn.with_partitioning``'s boxes (mesh axes, not logical names) unboxed."""
    return jax.tree.map(
        lambda b: b if not _is_box(b) or isinstance(b, nn.LogicallyPartitioned) else b.value,
        boxed,
        is_leaf=_is_box,
    )


def _abstract_params(model: nn.Module, x: Any) -> Any:
    """``model``'s boxed abstract parameters; a layer stacked by ``nn.scan`` / ``nn.vmap``
    without a name for its new axis gets the series' explanation, not Flax's."""
    try:
        return jax.eval_shape(model.init, jax.random.key(0), x)["params"]
    except PartitioningUnspecifiedError as err:
        found = re.search(r"\[([0-9,]*)\].*?names=(\([^)]*\))", str(err))
        box = (
            f"logical names {found.group(2)} on an array of shape ({found.group(1)})"
            if found
            else "logical names"
        )
        where = _caller_of_failed_transform(model, x)
    raise ValueError(
        f"param_shardings: a parameter stacked by nn.scan or nn.vmap (called in {where}) "
        f"carries {box}, but the transform was given no name for the axis it adds. Flax cannot tell which logical name the stacked (layers) dimension has. "
        "Pass metadata_params={nn.PARTITION_NAME: 'layers'} to nn.scan / nn.vmap, and give "
        "'layers' a rule (None keeps it whole); see flax.errors.PartitioningUnspecifiedError."
    ) from None


def _caller_of_failed_transform(model: nn.Module, x: Any) -> str:
    """The path of the innermost module whose call raised Flax's PartitioningUnspecifiedError."""
    seen: list[str] = []

    def record(next_fun: Any, args: Any, kwargs: Any, context: Any) -> Any:
        try:
            return next_fun(*args, **kwargs)
        except PartitioningUnspecifiedError:
            if not seen:
                path = "/".join(context.module.path)
                seen.append(f"module '{path}'" if path else "the model's top module")
            raise

    try:
        with nn.intercept_methods(record):
            jax.eval_shape(model.init, jax.random.key(0), x)
    except PartitioningUnspecifiedError:
        pass
    return seen[0] if seen else "the model"


def _checked_spec(name: str, leaf: Any, rules: Any, mesh: Mesh) -> PartitionSpec:
    """The mesh ``PartitionSpec`` of one boxed abstract parameter, checked against its shape."""
    if not _is_box(leaf):  # no names: replicated
        return P()
    shape, names = tuple(leaf.value.shape), tuple(leaf.names)
    logical = isinstance(leaf, nn.LogicallyPartitioned)
    if logical:
        _check_names(name, shape, names)
        spec = nn.logical_to_mesh_axes(names, rules)
        how = f"Its logical axes {names} map to PartitionSpec{tuple(spec)} under these rules"
    else:
        spec = P(*names)
        how = "nn.with_partitioning names these mesh axes directly (no rule applies to them)"
    try:
        check_spec(shape, spec, mesh, name)
    except ValueError as err:
        raise ValueError(
            f"param_shardings: {err} {how}: {_fix_for(spec, shape, mesh, logical)}."
        ) from None
    return spec


def _fix_for(spec: PartitionSpec, shape: tuple[int, ...], mesh: Mesh, logical: bool) -> str:
    """The fix for a spec that ``check_spec`` refused."""
    axes = [a for e in spec for a in _axes_of(e)]
    missing = [a for a in axes if a not in mesh.shape]
    if missing:
        if not logical:
            return f"build the mesh with axis '{missing[0]}', or name only axes the mesh has"
        return f"build the mesh with axis '{missing[0]}' (helpers.STRATEGY_AXES lists the axes each preset needs)"
    if len(spec) > len(shape):
        return "give one mesh axis (or None) per dimension"
    if len(set(axes)) < len(axes):
        return "name each mesh axis at most once"
    return "choose sizes that the mesh axis divides, or " + (
        "map that logical axis to None" if logical else "put None for that dimension"
    )


def _check_names(name: str, shape: tuple[int, ...], names: tuple[Any, ...]) -> None:
    """One logical name per dimension, none twice: the traps Flax leaves to jax, or to silence."""
    twice = sorted({n for n in names if isinstance(n, str) and names.count(n) > 1})
    if len(names) < len(shape):
        raise ValueError(
            f"param_shardings: '{name}' has shape {shape} ({len(shape)} dimensions), but "
            f"nn.with_logical_partitioning gives it only {len(names)} logical name(s), "
            f"{names}: Flax would leave the unnamed last dimension(s) whole on every device, "
            "without a word. Give one name per dimension (None, or a name the rules map to "
            "None, keeps a dimension whole on purpose)."
        )
    if len(names) > len(shape):
        raise ValueError(
            f"param_shardings: '{name}' has shape {shape} ({len(shape)} dimensions), but "
            f"nn.with_logical_partitioning gives it {len(names)} logical names, {names}: "
            "give one name per dimension of the array the initialiser draws (a 3-D "
            "nn.DenseGeneral kernel: see google/flax#3676 and notebook 08, going deeper F)."
        )
    if twice:
        raise ValueError(
            f"param_shardings: '{name}' (shape {shape}) uses the logical name '{twice[0]}' "
            f"twice, {names}; Flax refuses a name given to two dimensions of one array (a "
            "square kernel, width to width, is the usual case). Give one of the two "
            "dimensions a name of its own, and that name a rule (None keeps it whole)."
        )


def _warn_taken_axes(flat: list[tuple[Any, Any]], specs: list[PartitionSpec], rules: Any) -> None:
    """Warn when a logical name that has a rule to a mesh axis ends up with none, because an
    earlier dimension of the same parameter took that axis (google/flax#1703's priority)."""
    first: dict[str, Any] = {}
    for n, axes in rules:
        first.setdefault(n, axes)  # Flax applies a name's first rule whose axis is free
    mapped = {n for n, axes in first.items() if axes is not None}
    lost: dict[str, list[str]] = {}
    for (path, leaf), spec in zip(flat, specs, strict=True):
        if isinstance(leaf, nn.LogicallyPartitioned):
            for n, entry in zip(leaf.names, spec, strict=True):
                if entry is None and n in mapped:
                    lost.setdefault(n, []).append(path_str(path))
    if lost:
        lines = "\n".join(
            f"'{n}' ({len(p)} parameter(s): {', '.join(p[:2])})" for n, p in lost.items()
        )
        warnings.warn(
            "param_shardings: every rule for the logical name(s) "
            f"{', '.join(map(repr, lost))} names a mesh axis that another dimension of the "
            "same parameter took first (Flax's rules are a priority list, google/flax#1703), "
            f"so Flax leaves those dimensions whole on every device:\n{lines}\nMap the two "
            "names to different mesh axes, or one of them to None on purpose.",
            UnmappedLogicalNameWarning,
            stacklevel=3,
        )


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
        "final dimension meets the flat array (google/flax#3676; notebook 08, going deeper F). "
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


def adam_move_bound(lr: float, steps: int, b1: float = 0.9, b2: float = 0.999) -> float:
    """The most that ``steps`` Adam updates (optax's, from a zero state) can move one entry.

    Jensen's inequality on the bias-corrected averages bounds step ``t`` by
    ``lr * sqrt((1 - b1) (1 - b2**t) / ((1 - b1**t) (1 - b2)))``: ``lr`` at step 1, 1.03 and
    1.05 ``lr`` at steps 2 and 3 with optax's defaults (notebook 03b derives it). The bound
    is the sum over the steps; two runs from the same start differ by at most twice it.
    """
    if not lr > 0 or steps < 1 or not 0 <= b1 < 1 or not 0 <= b2 < 1:
        raise ValueError(
            f"adam_move_bound: lr must be > 0, steps >= 1 and 0 <= b1, b2 < 1; got lr={lr}, "
            f"steps={steps}, b1={b1}, b2={b2}"
        )
    return lr * sum(
        ((1 - b1) * (1 - b2**t) / ((1 - b1**t) * (1 - b2))) ** 0.5 for t in range(1, steps + 1)
    )
