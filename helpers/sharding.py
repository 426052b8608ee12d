"""Sharding rules: which dimension of which parameter goes to which mesh axis.

Holds ``fsdp_specs`` (the FSDP rule, done the way real codebases do it), the
logical-axis rule presets that switch one Flax model between DP / FSDP / TP /
hybrid, validation of a spec against a shape, and ``shard_layout`` (which device
holds which block of an array), which ``draw.py`` pictures.
Nothing here draws or times anything.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

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
    """Flatten ``tree`` into ``(path, leaf)`` pairs, checking every leaf is array-like."""
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = path_str(path) or "<root>"
        _shape_of(leaf, f"{what}: parameter '{name}'")
        out.append((name, leaf))
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
    the error XLA would raise from deep inside ``device_put``.
    """
    shape = tuple(shape)
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
    with a message naming the parameter, not from inside XLA.
    """
    leaves = leaves_with_paths(tree, "shard_tree")
    spec_leaves = jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, PartitionSpec))
    if len(spec_leaves) != len(leaves):
        raise ValueError(
            f"shard_tree: the tree has {len(leaves)} arrays but specs has {len(spec_leaves)} PartitionSpecs."
        )
    for (name, leaf), spec in zip(leaves, spec_leaves, strict=True):
        check_spec(tuple(leaf.shape), spec, mesh, name)
    shardings = jax.tree.map(
        lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda s: isinstance(s, PartitionSpec)
    )
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


def fsdp_plan(
    tree: Any,
    mesh: Mesh,
    axis: str | tuple[str, ...] = "data",
    min_size: int = 2**12,
    base_specs: Any = None,
) -> list[FSDPChoice]:
    """Per parameter, the FSDP choice of ``fsdp_specs`` with the reason for it.

    Rule (as in big_vision / MaxText, not the chapter's "first dimension"): shard the
    largest dimension that the ``axis`` size divides; replicate arrays smaller than
    ``min_size`` elements and arrays with no such dimension. With ``base_specs`` (for
    example tensor-parallel specs), dimensions already sharded there are kept and FSDP
    picks among the others.
    """
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
    entry = axes[0] if len(axes) == 1 else axes
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
    return plan


def fsdp_specs(
    tree: Any,
    mesh: Mesh,
    axis: str | tuple[str, ...] = "data",
    min_size: int = 2**12,
    base_specs: Any = None,
) -> Any:
    """A tree of ``PartitionSpec`` for FSDP: see ``fsdp_plan`` for the rule and reasons."""
    plan = fsdp_plan(tree, mesh, axis=axis, min_size=min_size, base_specs=base_specs)
    treedef = jax.tree.structure(tree)
    return jax.tree.unflatten(treedef, [c.spec for c in plan])


# ---------------------------------------------------------------------------
# Logical-axis rule presets for Flax's nn.with_partitioning / nn.logical_axis_rules
# ---------------------------------------------------------------------------

# The logical names the presets know: those of helpers.models and the conventional ones
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
    "classes", "layers", "norm", "embed_vec",
)  # fmt: skip


def _preset(**mesh_axis: str) -> tuple[tuple[str, Any], ...]:
    return tuple((name, mesh_axis.get(name)) for name in LOGICAL_NAMES)


_TP = {"mlp": "model", "heads": "model", "joined_kv": "model", "vocab": "model"}

# Every preset is meant for a mesh with axes ("data", "model"); an axis of size 1 simply
# splits nothing.
LOGICAL_RULES: dict[str, tuple[tuple[str, Any], ...]] = {
    # Data parallel: only the batch is split; every parameter is replicated.
    "dp": _preset(batch="data"),
    # FSDP: the batch and every kernel's "embed" dimension are split over "data";
    # small vectors (LayerNorm, output biases) stay replicated.
    "fsdp": _preset(batch="data", embed="data"),
    # FSDP that also splits the small vectors (the chapter's "biases sharded too" case, E9).
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
    """A model uses logical axis names that no rule maps: Flax leaves those dimensions whole."""


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

    The series' helpers that apply rules (``helpers.train.param_shardings``) call this,
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
        return tuple(x[0]), x[1]
    shape = _shape_of(x, where)
    sharding = getattr(x, "sharding", None)
    if not isinstance(sharding, Sharding):
        raise ValueError(
            f"{where} (shape {shape}) has no sharding. Pass a placed jax.Array, a "
            "jax.ShapeDtypeStruct with sharding=..., or a (shape, sharding) pair."
        )
    return shape, sharding


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
