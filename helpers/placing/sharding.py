"""Sharding rules: which dimension of which parameter goes to which mesh axis.

Holds ``fsdp_specs`` (the FSDP rule, done the way real codebases do it), the
logical-axis rule presets that switch one Flax model between DP / FSDP / TP /
hybrid, validation of a spec against a shape, and ``shard_layout`` (which device
holds which block of an array), which ``draw.py`` pictures.
Nothing here draws or times anything.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec, Sharding

from helpers import compat

P = PartitionSpec

# ---------------------------------------------------------------------------
# Paths and leaves
# ---------------------------------------------------------------------------


def path_str(path: tuple[Any, ...]) -> str:
    """``('params', 'Dense_0', 'kernel')`` style key path as ``params/Dense_0/kernel``."""
    parts = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return "/".join(parts)


def _shape_of(leaf: Any, where: str) -> tuple[int, ...]:
    shape = getattr(leaf, "shape", None)
    if shape is None or not hasattr(leaf, "dtype"):
        raise ValueError(
            f"{where}: leaf of type {type(leaf).__name__} is not an array; expected a jax.Array, "
            "a numpy array or a jax.ShapeDtypeStruct."
        )
    return tuple(shape)


def leaves_with_paths(tree: Any, what: str) -> list[tuple[str, Any]]:
    """Flatten ``tree`` into ``(path, leaf)`` pairs, checking every leaf is array-like.

    Flax NNX trees work as they are: ``nnx.state(model)`` (placed, or abstract from
    ``nnx.get_abstract_model``), an optimizer's state, a plain dict of ``nnx.Variable`` s.
    A Variable counts as the array it holds, named by the Variable's own path:
    ``block_0/up/kernel``, not ``block_0/up/kernel/value``.
    """
    out = []
    flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=compat.is_nnx_variable)[0]
    for path, leaf in flat:
        if compat.is_nnx_variable(leaf):
            inner = jax.tree_util.tree_flatten_with_path(leaf)[0]
            if len(inner) == 1:  # the usual case: one array, named like its Variable
                inner = [((), inner[0][1])]
            else:  # a Variable holding a pytree: name its arrays below the Variable
                inner = [(sub[1:], value) for sub, value in inner]
            pairs = [(path + sub, value) for sub, value in inner]
        else:
            pairs = [(path, leaf)]
        for full_path, value in pairs:
            name = path_str(full_path) or "<root>"
            _shape_of(value, f"{what}: parameter '{name}'")
            out.append((name, value))
    return out


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------


def _axes_of(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    if isinstance(entry, str):
        return (entry,)
    return tuple(entry)


def check_spec(
    shape: tuple[int, ...], spec: PartitionSpec, mesh: Mesh, name: str = "array"
) -> None:
    """Raise ``ValueError`` unless ``spec`` can lay out an array of ``shape`` on ``mesh``.

    The message names the parameter, its shape and the offending mesh axis, instead of
    the error XLA would raise from deep inside ``device_put``. A ``spec`` that is not a
    ``PartitionSpec`` (a plain tuple, say) raises ``TypeError``, naming the parameter.
    """
    shape = tuple(shape)
    if not isinstance(spec, PartitionSpec):
        fix = f"; write P{tuple(spec)!r}" if isinstance(spec, tuple | list) else ""
        raise TypeError(
            f"'{name}' (shape {shape}): the spec {spec!r} is a {type(spec).__name__}, not a "
            f"PartitionSpec{fix}."
        )
    if len(spec) > len(shape):
        hint = (
            " Use PartitionSpec() to replicate an array of any rank."
            if all(e is None for e in spec)
            else ""
        )
        raise ValueError(
            f"'{name}' has shape {shape} (rank {len(shape)}), but PartitionSpec{tuple(spec)} has "
            f"{len(spec)} entries: a spec may not have more entries than the array has dimensions.{hint}"
        )
    used: set[str] = set()
    for dim, entry in enumerate(spec):
        axes = _axes_of(entry)
        for ax in axes:
            if ax not in mesh.shape:
                raise ValueError(
                    f"'{name}' (shape {shape}): PartitionSpec{tuple(spec)} names mesh axis '{ax}', "
                    f"but the mesh has axes {tuple(mesh.axis_names)}."
                )
            if ax in used:
                raise ValueError(
                    f"'{name}' (shape {shape}): PartitionSpec{tuple(spec)} uses mesh axis '{ax}' twice."
                )
            used.add(ax)
        size = math.prod(mesh.shape[a] for a in axes)
        if axes and shape[dim] % size:
            axis_desc = " x ".join(f"'{a}' (size {mesh.shape[a]})" for a in axes)
            raise ValueError(
                f"'{name}' has shape {shape}: dimension {dim} has size {shape[dim]}, which mesh axis "
                f"{axis_desc} does not divide ({shape[dim]} % {size} = {shape[dim] % size})."
            )


def shard_tree(tree: Any, specs: Any, mesh: Mesh) -> Any:
    """``device_put`` every leaf of ``tree`` with its ``PartitionSpec`` from ``specs`` on ``mesh``.

    Every (leaf, spec) pair is checked first with ``check_spec``, so a bad spec fails
    with a message naming the parameter, its shape and the mesh axis, not from inside XLA.

    Raises:
      ValueError: ``specs`` does not have one ``PartitionSpec`` per array of ``tree`` (in
        the same structure), or a spec cannot place its array on ``mesh``.
    """
    leaves = leaves_with_paths(tree, "shard_tree")
    is_spec = lambda s: isinstance(s, PartitionSpec)  # noqa: E731
    spec_leaves = jax.tree.leaves(specs, is_leaf=is_spec)
    if len(spec_leaves) != len(leaves):
        raise ValueError(
            f"shard_tree: the tree has {len(leaves)} arrays but specs has {len(spec_leaves)} PartitionSpecs."
        )
    if jax.tree.structure(specs, is_leaf=is_spec) != jax.tree.structure(tree):
        raise ValueError(
            "shard_tree: specs must have the structure of the tree (one PartitionSpec per "
            f"array, under the same keys); the tree's arrays are {[n for n, _ in leaves][:6]}..."
        )
    for (name, leaf), spec in zip(leaves, spec_leaves, strict=True):
        if not is_spec(spec):
            raise ValueError(f"shard_tree: the spec for '{name}' is {spec!r}, not a PartitionSpec.")
        check_spec(tuple(leaf.shape), spec, mesh, name)
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=is_spec)
    return jax.device_put(tree, shardings)


# ---------------------------------------------------------------------------
# FSDP
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FSDPChoice:
    """What ``fsdp_specs`` chose for one parameter, and why."""

    path: str
    shape: tuple[int, ...]
    spec: PartitionSpec
    reason: str

    def __str__(self) -> str:  # one line of a report
        return f"{self.path:<40} {str(self.shape):<16} {str(tuple(self.spec)):<24} {self.reason}"


class FSDPShardsNothingWarning(UserWarning):
    """``fsdp_specs`` split no array: every device would hold the whole tree, as in DP."""


def fsdp_plan(
    tree: Any,
    mesh: Mesh,
    axis: str | tuple[str, ...] = "data",
    min_size: int = 2**12,
    base_specs: Any = None,
) -> list[FSDPChoice]:
    """Per parameter, the FSDP choice of ``fsdp_specs`` with the reason for it.

    Rule (big_vision's ``shardings.fsdp``, not the chapter's "first dimension"): shard
    the largest dimension that the ``axis`` size divides, the first of equal ones;
    replicate arrays smaller than ``min_size`` elements (big_vision counts 4 MiB) and
    arrays with no such dimension. With ``base_specs`` (for example tensor-parallel
    specs), dimensions already sharded there are kept and FSDP picks among the others.

    When FSDP splits no array at all (the axis has size 1, every array is below
    ``min_size``, or the axis size divides no free dimension of any array), every
    reason says so: such a layout is plain data parallelism under another name.

    Raises:
      ValueError: ``axis`` is not an axis of ``mesh``, ``base_specs`` does not match the
        tree, or a base spec cannot place its array (``check_spec``'s message).
    """
    return _fsdp_plan(tree, mesh, axis, min_size, base_specs)[0]


def _fsdp_plan(
    tree: Any, mesh: Mesh, axis: str | tuple[str, ...], min_size: int, base_specs: Any
) -> tuple[list[FSDPChoice], str | None]:
    """``fsdp_plan``'s choices, and the sentence saying why FSDP split nothing (or None)."""
    axes = _axes_of(axis)
    for ax in axes:
        if ax not in mesh.shape:
            raise ValueError(
                f"fsdp_specs: axis '{ax}' is not a mesh axis; the mesh has {tuple(mesh.axis_names)}."
            )
    n = math.prod(mesh.shape[a] for a in axes)
    leaves = leaves_with_paths(tree, "fsdp_specs")
    if base_specs is None:
        bases: list[PartitionSpec] = [P()] * len(leaves)
    else:
        bases = jax.tree.leaves(base_specs, is_leaf=lambda s: isinstance(s, PartitionSpec))
        if len(bases) != len(leaves):
            raise ValueError(
                f"fsdp_specs: base_specs has {len(bases)} specs for {len(leaves)} arrays."
            )
        for (name, leaf), base in zip(leaves, bases, strict=True):
            check_spec(tuple(leaf.shape), base, mesh, name)
    entry = axes[0] if len(axes) == 1 else axes
    axis_text = f"'{entry}'" if isinstance(entry, str) else str(entry)
    plan = []
    for (name, leaf), base in zip(leaves, bases, strict=True):
        shape = tuple(leaf.shape)
        base_entries = list(base) + [None] * (len(shape) - len(base))
        size = math.prod(shape)
        if n == 1:
            plan.append(
                FSDPChoice(name, shape, base, f"axis size is 1: nothing to shard over {axes}")
            )
            continue
        if size < min_size:
            plan.append(
                FSDPChoice(name, shape, base, f"replicated: {size} elements < min_size={min_size}")
            )
            continue
        free = [d for d in range(len(shape)) if base_entries[d] is None]
        fits = [d for d in free if shape[d] % n == 0]
        if not fits:
            why = ", ".join(f"dim {d}={shape[d]}" for d in free) or "no free dimension"
            plan.append(
                FSDPChoice(name, shape, base, f"replicated: {n} divides no free dimension ({why})")
            )
            continue
        dim = max(fits, key=lambda d: (shape[d], -d))
        entries = list(base_entries)
        entries[dim] = entry
        while entries and entries[-1] is None:
            entries.pop()
        plan.append(
            FSDPChoice(name, shape, P(*entries), f"dim {dim} (size {shape[dim]}) split {n} ways")
        )
    if not plan or any(_fsdp_split(c, base) for c, base in zip(plan, bases, strict=True)):
        return plan, None
    summary = _nothing_sharded(plan, axis_text, n, min_size)
    return [FSDPChoice(c.path, c.shape, c.spec, f"{c.reason}; {summary}") for c in plan], summary


def _fsdp_split(choice: FSDPChoice, base: PartitionSpec) -> bool:
    """Did FSDP split this array (beyond what its base spec already split)?"""
    return tuple(choice.spec) != tuple(base)


def _nothing_sharded(plan: list[FSDPChoice], axis_text: str, n: int, min_size: int) -> str:
    """One sentence for a plan in which FSDP split no array: why, and what it amounts to."""

    def arrays(k: int) -> str:
        return f"{k} array" + ("s" if k != 1 else "")

    if n == 1:
        cause = f"axis {axis_text} has size 1"
    else:
        small = sum(1 for c in plan if math.prod(c.shape) < min_size)
        big = len(plan) - small
        if big == 0:
            cause = f"each of the {arrays(small)} has fewer than min_size={min_size} elements"
        else:
            cause = (
                f"{n} divides no free dimension of the {arrays(big)} with at least "
                f"{min_size} elements"
            )
            if small:
                cause += f", and the other {arrays(small)} {'is' if small == 1 else 'are'} smaller"
    return (
        f"FSDP shards none of the {arrays(len(plan))} ({cause}): every device holds all "
        "of them, which is data parallelism, not FSDP"
    )


def fsdp_specs(
    tree: Any,
    mesh: Mesh,
    axis: str | tuple[str, ...] = "data",
    min_size: int = 2**12,
    base_specs: Any = None,
) -> Any:
    """A tree of ``PartitionSpec`` for FSDP: see ``fsdp_plan`` for the rule and reasons.

    Warns (``FSDPShardsNothingWarning``) when FSDP splits no array of the tree on a mesh
    of more than one device: the learner would otherwise get DP under the name FSDP.
    """
    plan, nothing = _fsdp_plan(tree, mesh, axis, min_size, base_specs)
    if nothing is not None and mesh.size > 1:
        warnings.warn(
            f"fsdp_specs: {nothing}. fsdp_plan(...) gives each array's reason; a smaller "
            "min_size, or sizes that the axis divides, would let FSDP split something.",
            FSDPShardsNothingWarning,
            stacklevel=2,
        )
    treedef = jax.tree.structure(tree)
    return jax.tree.unflatten(treedef, [c.spec for c in plan])


# ---------------------------------------------------------------------------
# Logical-axis rule presets for Flax's nn.with_partitioning / nn.logical_axis_rules
# ---------------------------------------------------------------------------

# The logical names the presets know: those of helpers.placing.models and the conventional ones
# of Transformer codebases (T5X's docs/usage/partitioning.md lists them; Flax's
# examples/lm1b and MaxText use them too):
#   activations:  "batch", "length" (tokens of a sequence; MLPStack calls it "seq")
#   parameters:   "embed" (model width), "mlp" (hidden width of an MLP), "heads",
#                 "kv" (width of one head), "joined_kv" (heads x kv fused in one
#                 dimension), "vocab", "classes" (a classifier's outputs), "layers"
#                 (the stacked dimension of nn.scan'ed layers)
#   small vectors: "norm" (LayerNorm/RMSNorm scale and bias, MaxText's name) and
#                 "embed_vec" (MLPStack's name for the same, and for output biases)
# Every preset gives every one of these names a rule (None: not split), in this order.
# Order matters: Flax goes through the rules in order and gives a mesh axis to the
# first dimension that asks for it, so a later rule for the same mesh axis only applies
# to arrays that have no earlier claimant ("batch" wins over "embed" in an activation
# (batch, length, embed) under FSDP; "heads" and "mlp" win over "length" under tp_sp).
LOGICAL_NAMES: tuple[str, ...] = (
    "batch", "embed", "mlp", "heads", "kv", "joined_kv", "vocab", "length", "seq",
    "classes", "layers", "norm", "embed_vec", "expert",
)  # fmt: skip


def _preset(**mesh_axis: str) -> tuple[tuple[str, Any], ...]:
    return tuple((name, mesh_axis.get(name)) for name in LOGICAL_NAMES)


_TP = {"mlp": "model", "heads": "model", "joined_kv": "model", "vocab": "model"}

# Every preset is meant for a mesh with axes ("data", "model"); an axis of size 1 simply
# splits nothing. Every preset maps "expert" (a mixture of experts' expert dimension) to
# None: notebook 12 adds the rule that splits experts over a mesh axis of their own.
LOGICAL_RULES: dict[str, tuple[tuple[str, Any], ...]] = {
    # Data parallel: only the batch is split; every parameter is replicated.
    "dp": _preset(batch="data"),
    # FSDP: the batch and every kernel's "embed" dimension are split over "data";
    # small vectors (LayerNorm, output biases) stay replicated.
    "fsdp": _preset(batch="data", embed="data"),
    # FSDP that also splits the model-width vectors ("norm", "embed_vec": LayerNorm scales
    # and biases, output biases), the chapter's "biases sharded too" case; an "mlp"-sized
    # bias and the head's "classes" bias stay whole, as under "fsdp".
    "fsdp_all": _preset(batch="data", embed="data", norm="data", embed_vec="data"),
    # Tensor (Megatron) parallel: MLP hidden width, attention heads and vocabulary split
    # over "model"; every device sees the whole batch.
    "tp": _preset(**_TP),
    # Hybrid DP x TP on a ("data", "model") mesh.
    "hybrid": _preset(batch="data", **_TP),
    # FSDP x TP on a ("data", "model") mesh.
    "fsdp_tp": _preset(batch="data", embed="data", **_TP),
    # TP with sequence parallelism (Megatron-SP, Korthikanti et al. 2022): the
    # activations between the attention and MLP halves, which TP keeps whole on every
    # device, are split along their length over "model" too.
    "tp_sp": _preset(length="model", seq="model", **_TP),
}

# The mesh axes each preset needs.
STRATEGY_AXES: dict[str, tuple[str, ...]] = {
    "dp": ("data",),
    "fsdp": ("data",),
    "fsdp_all": ("data",),
    "tp": ("model",),
    "hybrid": ("data", "model"),
    "fsdp_tp": ("data", "model"),
    "tp_sp": ("model",),
}


def logical_rules(strategy: str) -> tuple[tuple[str, Any], ...]:
    """The logical-axis rules of a strategy, one of the keys of ``LOGICAL_RULES``."""
    try:
        return LOGICAL_RULES[strategy]
    except KeyError:
        raise ValueError(
            f"logical_rules: strategy={strategy!r} is not one of {sorted(LOGICAL_RULES)}."
        ) from None


class UnmappedLogicalNameWarning(UserWarning):
    """A model uses logical axis names that no rule maps, or whose every rule names a mesh axis
    another dimension of the same parameter took first: Flax leaves those dimensions whole."""


def _rule_names(rules: str | Sequence[tuple[str, Any]]) -> set[str]:
    rules_t = logical_rules(rules) if isinstance(rules, str) else rules
    try:
        return {str(name) for name, _ in rules_t}
    except (TypeError, ValueError):
        raise ValueError(
            "rules must be a preset name or a sequence of (logical name, mesh axes) pairs, "
            f"got {rules!r}."
        ) from None


def logical_names(tree: Any) -> dict[str, tuple[str, ...]]:
    """Every logical axis name in ``tree``, with the paths of the parameters that use it.

    ``tree`` is what ``jax.eval_shape(model.init, key, x)`` returns (parameters boxed
    with their names by ``nn.with_logical_partitioning``), or the tree of logical
    ``PartitionSpec`` s that ``nn.get_partition_spec`` makes of it. Names come in the
    order they first appear; leaves without names (plain arrays) contribute none.
    """
    from flax.core import meta

    def is_leaf(x: Any) -> bool:
        return isinstance(x, PartitionSpec | meta.AxisMetadata)

    found: dict[str, list[str]] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)[0]:
        if isinstance(leaf, PartitionSpec):
            names: tuple[Any, ...] = tuple(leaf)
        elif isinstance(leaf, meta.AxisMetadata) and hasattr(leaf, "names"):
            names = tuple(leaf.names)
        else:
            continue
        for entry in names:
            for name in _axes_of(entry):
                users = found.setdefault(name, [])
                if path_str(path) not in users:
                    users.append(path_str(path))
    return {name: tuple(paths) for name, paths in found.items()}


def unmapped_logical_names(
    tree: Any, rules: str | Sequence[tuple[str, Any]]
) -> dict[str, tuple[str, ...]]:
    """The logical axis names of ``tree`` that no rule in ``rules`` maps, with their users.

    Flax gives a dimension whose name has no rule no mesh axis, silently: it stays
    whole, on every device. A name mapped to ``None`` on purpose is mapped (it is in the
    rules). ``tree`` is as for ``logical_names``; ``rules`` is a preset name (see
    ``LOGICAL_RULES``) or a sequence of ``(logical name, mesh axes)`` pairs. An empty
    dict means every name has a rule.
    """
    known = _rule_names(rules)
    return {name: paths for name, paths in logical_names(tree).items() if name not in known}


def format_unmapped(unmapped: dict[str, tuple[str, ...]], max_paths: int = 2) -> str:
    """One line per unmapped name: ``'head_dim' (3 parameters: block_0/attn/query/kernel, ...)``."""
    if not unmapped:
        return "every logical name has a rule"
    lines = []
    for name, paths in unmapped.items():
        shown = ", ".join(paths[:max_paths]) + (", ..." if len(paths) > max_paths else "")
        n = len(paths)
        lines.append(f"{name!r} ({n} parameter{'s' if n != 1 else ''}: {shown})")
    return "\n".join(lines)


def warn_unmapped_logical_names(
    tree: Any, rules: str | Sequence[tuple[str, Any]], where: str = "rules"
) -> dict[str, tuple[str, ...]]:
    """``unmapped_logical_names``, plus an ``UnmappedLogicalNameWarning`` when any are found.

    The series' helpers that apply rules (``helpers.placing.train.param_shardings``) call this,
    so that a name the rules do not know is reported instead of silently replicated.
    """
    unmapped = unmapped_logical_names(tree, rules)
    if unmapped:
        import warnings

        warnings.warn(
            f"{where}: no rule maps the logical name(s) {', '.join(map(repr, unmapped))}, so "
            "Flax leaves those dimensions whole on every device:\n"
            + format_unmapped(unmapped)
            + "\nAdd a rule for each name (a mesh axis, or None to replicate it on purpose).",
            UnmappedLogicalNameWarning,
            stacklevel=3,
        )
    return unmapped


def param_order(model: Any, *args: Any, collection: str = "params", **kwargs: Any) -> list[str]:
    """The paths of a Flax Linen model's parameters in the order the model creates them.

    ``jax.tree`` flattens dicts in sorted key order (``block_10`` before ``block_2``,
    ``down`` before ``up``), and a tree that went through ``jax.tree.map`` or ``jit``
    keeps only that order. The model itself knows its own: this runs ``model.init(key,
    *args, **kwargs)`` abstractly (``jax.eval_shape``: nothing is computed or allocated)
    and reads the nested dicts Flax builds, in creation order. Paths are relative to
    ``collection``, like ``block_0/attn/query/kernel``; pass them as
    ``draw_param_shardings(..., order=...)``.
    """
    from collections.abc import Mapping

    order: list[str] = []

    def walk(node: Any, prefix: str) -> None:
        for key, value in node.items():
            path = f"{prefix}/{key}" if prefix else str(key)
            if isinstance(value, Mapping):
                walk(value, path)
            else:
                order.append(path)

    def init(key: jax.Array) -> None:
        variables = model.init(key, *args, **kwargs)
        if collection not in variables:
            raise ValueError(
                f"param_order: the model has no '{collection}' collection; it has "
                f"{sorted(variables)}."
            )
        walk(variables[collection], "")

    jax.eval_shape(init, jax.random.key(0))
    return order


# ---------------------------------------------------------------------------
# Layout: which device holds which block
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardBlock:
    """One distinct block of a sharded array and every device that holds a copy of it."""

    start: tuple[int, ...]
    stop: tuple[int, ...]
    devices: tuple[int, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in zip(self.start, self.stop, strict=True))


def sharding_of(x: Any, where: str = "array") -> tuple[tuple[int, ...], Sharding]:
    """``(shape, sharding)`` of a placed array, an abstract array or an explicit pair."""
    if isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], Sharding):
        shape = x[0]
        if not isinstance(shape, Sequence) or not all(
            hasattr(d, "__index__") and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise ValueError(
                f"{where}: the shape of a (shape, sharding) pair must be a tuple of whole "
                f"numbers >= 0, got {shape!r}."
            )
        shape = tuple(int(d) for d in shape)
        _check_fits(shape, x[1], where)
        return shape, x[1]
    shape = _shape_of(x, where)
    sharding = getattr(x, "sharding", None)
    if not isinstance(sharding, Sharding):
        raise ValueError(
            f"{where} (shape {shape}) has no sharding. Pass a placed jax.Array, a "
            "jax.ShapeDtypeStruct with sharding=... (for an NNX model: "
            "nnx.get_abstract_model(init, mesh)), or a (shape, sharding) pair."
        )
    if isinstance(sharding, NamedSharding) and isinstance(sharding.mesh, AbstractMesh):
        raise ValueError(
            f"{where} (shape {shape}) has sharding {sharding.spec} on an AbstractMesh, which "
            "names no devices (jax.eval_shape and nnx.eval_shape give such shardings under "
            "jax.set_mesh). Give it a concrete mesh: nnx.get_abstract_model(init, mesh), or a "
            "jax.ShapeDtypeStruct with sharding=NamedSharding(mesh, spec)."
        )
    _check_fits(shape, sharding, where)
    return shape, sharding


def _check_fits(shape: tuple[int, ...], sharding: Sharding, where: str) -> None:
    """The series' error, before any jax call, for a spec that cannot lay out ``shape``:
    more entries than dimensions, or a dimension its mesh axes do not divide."""
    if not isinstance(sharding, NamedSharding):
        return
    spec = tuple(sharding.spec)
    if len(spec) > len(shape):
        raise ValueError(
            f"{where} (shape {shape}) has spec {sharding.spec} with {len(spec)} entries, but "
            f"the array has {len(shape)} dimension(s): a spec names at most one entry per "
            "dimension."
        )
    for dim, entry in enumerate(spec):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        n = math.prod(int(sharding.mesh.shape[a]) for a in axes)
        if n > 1 and shape[dim] % n:
            raise ValueError(
                f"{where} (shape {shape}) has spec {sharding.spec}: dimension {dim} (size "
                f"{shape[dim]}) is split over {' x '.join(map(repr, axes))} ({n} devices), "
                f"which does not divide it. Use a size divisible by {n}, or leave that "
                "dimension unsplit (None)."
            )


def shard_layout(shape: tuple[int, ...], sharding: Sharding) -> list[ShardBlock]:
    """The distinct blocks of an array of ``shape`` under ``sharding``, in row-major order."""
    shape = tuple(shape)
    blocks: dict[tuple[tuple[int, int], ...], list[int]] = {}
    for device, index in sharding.devices_indices_map(shape).items():
        key = tuple(
            (s.start or 0, shape[d] if s.stop is None else s.stop) for d, s in enumerate(index)
        )
        blocks.setdefault(key, []).append(device.id)
    out = [
        ShardBlock(tuple(a for a, _ in key), tuple(b for _, b in key), tuple(sorted(devs)))
        for key, devs in blocks.items()
    ]
    return sorted(out, key=lambda b: b.start)


def spec_of(sharding: Sharding) -> PartitionSpec | None:
    """The ``PartitionSpec`` of a ``NamedSharding`` (None for other shardings)."""
    return sharding.spec if isinstance(sharding, NamedSharding) else None


def shard_shape(shape: tuple[int, ...], sharding: Sharding) -> tuple[int, ...]:
    """Shape of the block one device holds."""
    return tuple(sharding.shard_shape(tuple(shape)))
