"""Measuring what sharding costs: bytes per device, step memory, collectives.

Everything here reads numbers off real objects: the arrays' addressable shards,
the compiled executable's ``memory_analysis()`` and its optimised HLO text.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import jax

from helpers.placing.sharding import leaves_with_paths, shard_shape, sharding_of, spec_of

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

_DTYPE_BYTES = {
    "pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
    "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
    "s32": 4, "u32": 4, "f32": 4,
    "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}  # fmt: skip


def _device_key(device: Any) -> str:
    return f"{device.platform}:{device.id}"


def memory_per_device(tree: Any) -> dict[str, int]:
    """Bytes of ``tree`` actually resident on each device, from its arrays' addressable shards.

    Keys are ``"cpu:0"``, ``"gpu:1"``, ... in device order.
    """
    totals: dict[str, int] = defaultdict(int)
    order: dict[str, int] = {}
    for name, leaf in leaves_with_paths(tree, "memory_per_device"):
        shards = getattr(leaf, "addressable_shards", None)
        if shards is None:
            raise ValueError(
                f"memory_per_device: parameter '{name}' (shape {tuple(leaf.shape)}) is not a placed "
                "jax.Array; for abstract arrays use planned_bytes_per_device."
            )
        for shard in shards:
            key = _device_key(shard.device)
            order[key] = shard.device.id
            totals[key] += int(shard.data.nbytes)
    return {k: totals[k] for k in sorted(totals, key=order.__getitem__)}


def planned_bytes_per_device(tree: Any) -> dict[str, int]:
    """Bytes each device would hold for a tree of placed *or abstract* arrays (from shardings)."""
    totals: dict[str, int] = defaultdict(int)
    order: dict[str, int] = {}
    for name, leaf in leaves_with_paths(tree, "planned_bytes_per_device"):
        shape, sharding = sharding_of(leaf, f"planned_bytes_per_device: parameter '{name}'")
        nbytes = math.prod(shard_shape(shape, sharding)) * leaf.dtype.itemsize
        for device in sharding.device_set:
            key = _device_key(device)
            order[key] = device.id
            totals[key] += nbytes
    return {k: totals[k] for k in sorted(totals, key=order.__getitem__)}


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def format_bytes(n: float) -> str:
    """``1536`` -> ``'1.5 KiB'``."""
    return _fmt_bytes(n)


def sharding_table(tree: Any) -> str:
    """A text table: per parameter its path, shape, dtype, spec, shard shape and bytes per device.

    Works for placed arrays and for abstract ones (``jax.ShapeDtypeStruct`` with a sharding).
    The last lines give the total bytes of the tree and the most any one device holds.
    """
    rows = []
    total = 0
    for name, leaf in leaves_with_paths(tree, "sharding_table"):
        shape, sharding = sharding_of(leaf, f"sharding_table: parameter '{name}'")
        local = shard_shape(shape, sharding)
        per_dev = math.prod(local) * leaf.dtype.itemsize
        total += math.prod(shape) * leaf.dtype.itemsize
        spec = spec_of(sharding)
        rows.append(
            (
                name,
                str(shape),
                str(leaf.dtype),
                "-" if spec is None else str(tuple(spec)),
                str(local),
                _fmt_bytes(per_dev),
            )
        )
    per_device = planned_bytes_per_device(tree)
    header = ("parameter", "shape", "dtype", "spec", "shard shape", "bytes/device")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [line.format(*header), "  ".join("-" * w for w in widths)]
    out += [line.format(*r) for r in rows]
    most = max(per_device.values()) if per_device else 0
    n = len(per_device)
    out.append("")
    out.append(
        f"total: {_fmt_bytes(total)} in {len(rows)} arrays; "
        f"largest per-device share: {_fmt_bytes(most)} on {n} device(s) "
        f"({most / total:.1%} of total)"
        if total
        else "total: 0 B"
    )
    return "\n".join(out)


_COMPILE_HINT = (
    "Pass the compiled executable: jax.jit(f).lower(*args).compile() (or its .as_text())."
)


def _describe(obj: Any) -> str:
    if isinstance(obj, jax.stages.Lowered) or isinstance(
        getattr(obj, "lowered", None), jax.stages.Lowered
    ):
        return (
            "a Lowered object (jax.jit(f).lower(...)): its module is not partitioned yet, so it "
            "has no collectives and no per-device memory to read. Call .compile() on it first"
        )
    if isinstance(obj, jax.stages.Wrapped) or callable(obj):
        return f"a function ({type(obj).__name__}), not a compiled executable"
    return f"a {type(obj).__name__}"


def _compiled(obj: Any, where: str) -> Any:
    """``obj`` if it is a compiled executable, else the series' error saying what to pass."""
    if isinstance(obj, jax.stages.Compiled):
        return obj
    inner = getattr(obj, "compiled", None)  # flax's nnx.jit(...).lower(...).compile() wraps one
    if isinstance(inner, jax.stages.Compiled):
        return inner
    raise TypeError(f"{where}: got {_describe(obj)}. {_COMPILE_HINT}")


def step_memory(compiled: Any) -> dict[str, int]:
    """Per-device bytes of a compiled step from XLA's ``memory_analysis()``.

    ``compiled`` is ``jax.jit(f).lower(*args).compile()``. Returns ``argument``,
    ``output``, ``temp``, ``alias`` (outputs that reuse donated inputs) and
    ``total = argument + output + temp - alias``.

    Raises:
      TypeError: ``compiled`` is not a compiled executable (a ``Lowered`` object, a
        jitted function, ...); the message says to call ``.lower(...).compile()``.
      ValueError: the backend reports no memory analysis.
    """
    ma = _compiled(compiled, "step_memory").memory_analysis()
    if ma is None:
        raise ValueError("step_memory: this backend's compiled object has no memory_analysis().")
    out = {
        "argument": int(ma.argument_size_in_bytes),
        "output": int(ma.output_size_in_bytes),
        "temp": int(ma.temp_size_in_bytes),
        "alias": int(ma.alias_size_in_bytes),
    }
    out["total"] = out["argument"] + out["output"] + out["temp"] - out["alias"]
    return out


# ---------------------------------------------------------------------------
# Collectives from HLO text
# ---------------------------------------------------------------------------

_INSTR = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<type>.+?)\s+"
    r"(?P<op>[a-z][a-z0-9\-]*)\((?P<args>[^)]*)\)(?P<attrs>.*)$"
)
_ARRAY = re.compile(r"\b([a-z]+[0-9]*(?:e[0-9]m[0-9](?:fn)?)?)\[([0-9,]*)\]")


def _group_size(attrs: str, num_partitions: int) -> int:
    """Number of devices in each replica group of a collective."""
    m = re.search(r"replica_groups=\{(\{[^=]*?\})\}", attrs)
    if m:
        first = re.search(r"\{([0-9,\s]*)\}", m.group(1))
        if first and first.group(1).strip():
            return len(first.group(1).split(","))
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", attrs)
    if m:
        return int(m.group(2))
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attrs)
    if m:
        sizes = dict(
            (k.strip().strip("'"), int(v))
            for k, v in (kv.split("=") for kv in m.group(1).split(","))
        )
        axes = [a.strip().strip("'") for a in m.group(2).split(",") if a.strip()]
        return math.prod(sizes[a] for a in axes) if axes else 1
    return num_partitions


def _moves_between_devices(attrs: str) -> bool:
    """False for a collective-permute whose every pair sends a device's data to itself.

    ``ppermute`` over an axis of size 1 compiles to ``source_target_pairs={{0,0}}``: the
    op stays in the HLO, but nothing crosses a link. Without the attribute, assume it moves.
    """
    m = re.search(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}", attrs)
    if not m:
        return True
    pairs = re.findall(r"\{(\d+),(\d+)\}", m.group(1))
    return any(a != b for a, b in pairs)


def _hlo_text(compiled_or_text: Any) -> str:
    if isinstance(compiled_or_text, str):
        text = compiled_or_text
        if not text.lstrip().startswith("HloModule"):
            start = text.lstrip()[:40]
            hint = (
                " This looks like StableHLO from Lowered.as_text(), which is not partitioned "
                "yet: compile it first."
                if start.startswith("module")
                else ""
            )
            raise ValueError(
                f"collective_stats: the text does not start with 'HloModule' (it starts "
                f"{start!r}), so it is not the HLO of a compiled executable.{hint} {_COMPILE_HINT}"
            )
        return text
    text = _compiled(compiled_or_text, "collective_stats").as_text()
    if not isinstance(text, str):  # pragma: no cover - every backend returns text
        raise ValueError(f"collective_stats: as_text() returned no HLO text. {_COMPILE_HINT}")
    return text


@dataclass(frozen=True)
class CollectiveOp:
    """One collective op of a compiled step, as ``collective_ops`` reads it from the HLO.

    ``arrays`` holds ``(dtype, shape)`` of every array it moves, at full size (the
    gathered, or reduced, array; for a reduce-scatter, its input). ``sources`` holds, per
    array, the ``op_name`` JAX recorded for the value that went in: it names the model
    code that produced it (``.../block_0/attn/out/dot_general``), with ``transpose(...)``
    around the backward pass. ``runs`` is how often the op runs per step: the product
    of the trip counts of the loops it sits in (1 outside any loop).
    """

    kind: str
    arrays: tuple[tuple[str, tuple[int, ...]], ...]
    group: int
    sources: tuple[str, ...]
    runs: int = 1
    moves: bool = True  # False for a collective-permute whose every pair sends to itself
    op_name: str = ""  # the JAX operation the collective itself came from ("" if none)

    @property
    def bytes(self) -> int:
        """Full size of all its arrays, in bytes, for one run."""
        return sum(_DTYPE_BYTES[dt] * math.prod(shape) for dt, shape in self.arrays)

    @property
    def sent_per_device(self) -> float:
        """Bytes each device sends in one run, with a bandwidth-optimal ring algorithm."""
        n = self.group
        if self.kind == "all-reduce":
            return 2 * self.bytes * (n - 1) / n
        if self.kind == "collective-permute":
            return float(self.bytes) if self.moves else 0.0
        return self.bytes * (n - 1) / n


_OP_NAME = re.compile(r'op_name="([^"]*)"')
_CHANNEL = re.compile(r"channel_id=(\d+)")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def _arrays(type_text: str) -> list[tuple[str, tuple[int, ...]]]:
    out = []
    for dtype, dims in _ARRAY.findall(type_text):
        if dtype in _DTYPE_BYTES:
            out.append((dtype, tuple(int(d) for d in dims.split(",") if d)))
    return out


def collective_ops(compiled: Any) -> list[CollectiveOp]:
    """Every collective op of a compiled step, in program order, with what it moves and why.

    Accepts the compiled object (``jax.jit(f).lower(...).compile()``) or its ``as_text()``.
    An async ``-start``/``-done`` pair is one op, and so are the copies of one collective
    (one ``channel_id``) that XLA:TPU writes into each fused computation it overlaps with.
    An op inside a ``while`` loop (a
    ``lax.scan``, ``nn.scan`` or ``fori_loop``) has ``runs`` set to the loop's trip count,
    when XLA knows it.
    """
    text = _hlo_text(compiled)
    m = re.search(r"num_partitions=(\d+)", text)
    num_partitions = int(m.group(1)) if m else 1
    instrs, order, parent, called_by = _parse_hlo(text)

    def runs(c: str) -> int:
        total, seen = 1, set()
        while c in parent and c not in seen:
            seen.add(c)
            c, trips = parent[c]
            total *= trips
        return total

    def source(operand: str, fallback: str) -> str:
        entry = instrs.get(operand.strip().lstrip("%"))
        found = _OP_NAME.search(entry[4]) if entry else None
        return found.group(1) if found else fallback

    out, seen = [], set()
    for name in order:
        comp, type_text, op, args, attrs = instrs[name]
        if op in COLLECTIVES:
            kind, op_attrs, op_args = op, attrs, args
        elif op.endswith("-done") and op[: -len("-done")] in COLLECTIVES:
            kind = op[: -len("-done")]
            start = instrs.get(args.strip().lstrip("%").split(",")[0].strip())
            op_attrs, op_args = (start[4], start[3]) if start else (attrs, "")
        else:
            continue
        if comp in called_by and not _first_of_channel(kind, op_attrs, seen):
            continue  # a copy, inside a fused computation, of a collective already counted
        n = _group_size(op_attrs, num_partitions)
        kind, arrays, op_attrs = _full_size(kind, _arrays(type_text), n, comp, op_attrs, called_by)
        own = _OP_NAME.search(op_attrs)
        fallback = own.group(1) if own else ""
        operands = [a for a in re.sub(r"/\*.*?\*/", "", op_args).split(",") if a.strip()]
        sources = [source(a, fallback) for a in operands]
        if len(sources) != len(arrays):
            sources = [fallback] * len(arrays)
        moves = kind != "collective-permute" or _moves_between_devices(op_attrs)
        out.append(
            CollectiveOp(kind, tuple(arrays), n, tuple(sources), runs(comp), moves, fallback)
        )
    return out


_Instr = tuple[str, str, str, str, str]  # (computation, type, op, args, attributes)


def _parse_hlo(
    text: str,
) -> tuple[dict[str, _Instr], list[str], dict[str, tuple[str, int]], dict[str, str]]:
    """The instructions of an HLO module by name, in program order; each loop or call body's
    caller and trip count; and, for each fused computation, the attributes of its caller."""
    instrs: dict[str, _Instr] = {}
    order: list[str] = []
    parent: dict[str, tuple[str, int]] = {}
    called_by: dict[str, str] = {}
    comp = ""
    for line in text.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{"):
            words = line.split()
            comp = (words[1] if words[0] == "ENTRY" and len(words) > 1 else words[0]).lstrip("%")
            continue
        mi = _INSTR.match(line)
        if not mi:
            continue
        name, op, attrs = mi.group("name"), mi.group("op"), mi.group("attrs")
        instrs[name] = (comp, mi.group("type"), op, mi.group("args"), attrs)
        order.append(name)
        for callee in re.findall(r"calls=%?([\w.\-]+)", attrs):
            called_by[callee] = attrs
        if op in ("while", "call"):
            trips = _TRIP_COUNT.search(attrs)
            for callee in re.findall(r"(?:body|to_apply)=%?([\w.\-]+)", attrs):
                parent[callee] = (comp, int(trips.group(1)) if trips and op == "while" else 1)
    return instrs, order, parent, called_by


def _first_of_channel(kind: str, attrs: str, seen: set[tuple[str, str]]) -> bool:
    """False for a copy of a collective already counted: XLA:TPU writes one collective into
    each fused computation that overlaps it, each copy with the same ``channel_id``. Only
    fused computations are deduplicated: XLA:CPU gives every ``shard_map`` collective of a
    program ``channel_id=1``, each a collective of its own."""
    channel = _CHANNEL.search(attrs)
    if channel is None:
        return True
    if (kind, channel.group(1)) in seen:
        return False
    seen.add((kind, channel.group(1)))
    return True


def _full_size(
    kind: str,
    arrays: list[tuple[str, tuple[int, ...]]],
    n: int,
    comp: str,
    attrs: str,
    called_by: dict[str, str],
) -> tuple[str, list[tuple[str, tuple[int, ...]]], str]:
    """``(kind, full-size arrays, attributes)`` of one collective as the HLO writes it."""
    if kind == "reduce-scatter":  # its result is one shard: report the full input
        return kind, [(dt, (s[0] * n, *s[1:]) if s else s) for dt, s in arrays], attrs
    if kind == "all-reduce" and comp.startswith("all-reduce-scatter"):
        # XLA:TPU's reduce-scatter: one fused op (kind=kCustom) that calls a computation
        # %all-reduce-scatter.N of an all-reduce whose result each device slices
        # (dynamic-slice by its partition-id); its arrays are already full size, and the
        # JAX operation it came from is on the fusion that calls it
        return "reduce-scatter", arrays, called_by.get(comp, attrs)
    return kind, arrays, attrs


def collective_stats(compiled: Any, *, per_step: bool = False) -> dict[str, dict[str, float]]:
    """Collectives in a compiled step, read from its optimised HLO text.

    Returns, for each kind in ``COLLECTIVES`` that occurs, a dict with:
      ``ops``: number of collective ops (an async ``-start``/``-done`` pair counts once);
      ``operands``: arrays moved (a combined, tuple-shaped op counts all of its operands);
      ``bytes``: size of the op's full (gathered / reduced) result, summed over ops, in the
        element type the compiled program moves (XLA's CPU backend converts bf16 to f32
        around collectives, so a bf16 array counts 4 bytes per element there);
      ``sent_per_device`` / ``received_per_device``: bytes each device sends / receives
      with a bandwidth-optimal ring algorithm (all-reduce ``2·S·(n-1)/n``, all-gather and
      reduce-scatter ``S·(n-1)/n`` for a full size ``S`` over a group of ``n``; a
      collective-permute ``S`` for the busiest device, 0 when every pair is a device
      sending to itself, as ``ppermute`` on a one-device axis compiles).
    Ops inside a loop body are counted once, as written, unless ``per_step=True``: then
    each counts as often as it runs (``CollectiveOp.runs``).
    Accepts the compiled object (``jax.jit(f).lower(...).compile()``) or its ``as_text()``.

    Raises:
      TypeError: ``compiled`` is a ``Lowered`` object (not partitioned yet: it would show
        no collectives at all), a jitted function or anything else that is not compiled.
      ValueError: a string that is not the HLO text of a compiled executable.
    """
    stats: dict[str, dict[str, float]] = {}
    for c in collective_ops(compiled):
        times = c.runs if per_step else 1
        entry = stats.setdefault(
            c.kind,
            {
                "ops": 0,
                "operands": 0,
                "bytes": 0,
                "sent_per_device": 0.0,
                "received_per_device": 0.0,
            },
        )
        entry["ops"] += times
        entry["operands"] += times * len(c.arrays)
        entry["bytes"] += times * c.bytes
        entry["sent_per_device"] += times * c.sent_per_device
        entry["received_per_device"] += times * c.sent_per_device
    return {k: stats[k] for k in COLLECTIVES if k in stats}


def format_collectives(stats: dict[str, dict[str, float]]) -> str:
    """A short text table of ``collective_stats`` output."""
    if not stats:
        return "no collectives: every device works alone"
    lines = [f"{'collective':<20}{'ops':>5}{'arrays':>8}{'full size':>12}{'sent/device':>14}"]
    for kind, s in stats.items():
        lines.append(
            f"{kind:<20}{int(s['ops']):>5}{int(s['operands']):>8}{_fmt_bytes(s['bytes']):>12}"
            f"{_fmt_bytes(s['sent_per_device']):>14}"
        )
    return "\n".join(lines)


def collective_line(compiled: Any, kind: str, *, containing: str = "") -> str:
    """The HLO instruction of the first ``kind`` collective of a compiled program, for reading.

    ``kind`` is one of ``COLLECTIVES``; with ``containing``, the first such line that holds
    that text (say ``"f32[2,8]"``). An async ``-start`` counts as its collective. The line is
    the compiled HLO's own, shortened: layouts (``{1,0}``), ``metadata``,
    ``backend_config``, ``channel_id`` and ``use_global_device_ids`` are cut, and a list of
    more than three operands, or a result tuple of more than three arrays, keeps its first
    two and says how many it holds (``…, 8 in all``). Accepts the compiled object or its
    ``as_text()``.

    Raises:
      ValueError: ``kind`` is not a collective, or the program has no such line.
    """
    if kind not in COLLECTIVES:
        raise ValueError(f"collective_line: kind={kind!r} must be one of {COLLECTIVES}.")
    text = _hlo_text(compiled)
    pattern = re.compile(r"^\s*(?:ROOT\s+)?(%?[\w.\-]+) = (.+?) " + re.escape(kind)
                         + r"(-start)?\((.*)$")  # fmt: skip
    for line in text.splitlines():
        found = pattern.match(line)
        if found and containing in line:
            break
    else:
        where = f" whose line contains {containing!r}" if containing else ""
        raise ValueError(f"collective_line: the program has no {kind}{where}.")
    name, result, start, rest = found.groups()
    rest = _without_annotations(rest)
    depth, end = 0, len(rest)
    for i, char in enumerate(rest):  # the operand list ends at its own closing parenthesis
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            end = i
            break
    operands, attrs = _shortened(rest[:end]), rest[end + 1 :]
    result = _HLO_LAYOUT.sub("", result)
    if result.startswith("(") and result.endswith(")"):
        result = f"({_shortened(result[1:-1])})"
    return f"{name} = {result} {kind}{start or ''}({operands}){attrs}"


#: An array's memory layout in HLO text, after its shape: ``f32[8,4]{1,0:T(8,128)}``.
_HLO_LAYOUT = re.compile(r"(?<=\])\{[0-9,]*(?::[^}]*)?\}")


def _without_annotations(text: str) -> str:
    """An HLO line without its metadata, backend configuration and channel ids (what
    ``collective_line`` and ``topology.program_summary``'s lines leave out)."""
    text = re.sub(r",\s*(?:metadata|backend_config|frontend_attributes)=.*$", "", text)
    return re.sub(r",\s*channel_id=\d+|,\s*use_global_device_ids=true", "", text)


def _shortened(items: str) -> str:
    """A comma-separated list of HLO arrays or operands, its first two and a count past 3."""
    parts, depth, current = [], 0, ""
    for char in re.sub(r"/\*.*?\*/", "", items) + ",":
        depth += {"[": 1, "{": 1, "(": 1, "]": -1, "}": -1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts, current = [*parts, current.strip()] if current.strip() else parts, ""
        else:
            current += char
    if len(parts) <= 3:
        return ", ".join(parts)
    return f"{parts[0]}, {parts[1]}, …, {len(parts)} in all"


# ---------------------------------------------------------------------------
# What a compiled step's temporary memory holds, from its scheduled HLO
# ---------------------------------------------------------------------------

MEMORY_KINDS = ("gathered parameters", "gradients", "activations", "other")

# Ops whose result is no new buffer: a view of an operand, an input, or a constant.
_NO_BUFFER = {
    "parameter", "get-tuple-element", "bitcast", "tuple", "constant", "partition-id",
    "replica-id", "after-all", "opt-barrier", "optimization-barrier",
}  # fmt: skip
_LOOP_COPIES = 16  # a loop body run more often is drawn this many times in ``steps``


@dataclass(frozen=True)
class LiveBuffer:
    """One temporary buffer of a replayed step (``LiveMemory.largest_at_peak``): its kind
    (one of ``MEMORY_KINDS``), bytes, dtype and shape as the HLO writes them, the HLO op
    that writes it, and the ``op_name`` JAX recorded for that op (empty when none)."""

    kind: str
    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    op: str
    op_name: str


@dataclass(frozen=True)
class _Instr:
    name: str
    op: str
    arrays: tuple[tuple[str, tuple[int, ...]], ...]  # the result's arrays (a tuple's elements)
    args: tuple[str, ...]
    attrs: str
    op_name: str
    root: bool


def _computations(text: str) -> tuple[dict[str, list[_Instr]], str]:
    """Every computation's instructions in their (scheduled) order, and the entry's name."""
    comps: dict[str, list[_Instr]] = {}
    entry, current = "", None
    for line in text.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{"):
            words = line.split()
            name = (words[1] if words[0] == "ENTRY" and len(words) > 1 else words[0]).lstrip("%")
            entry = name if words[0] == "ENTRY" else entry
            current = comps.setdefault(name, [])
            continue
        m = _INSTR.match(line)
        if m is None or current is None:
            continue
        args = re.sub(r"/\*.*?\*/", "", m.group("args"))
        found = _OP_NAME.search(m.group("attrs"))
        current.append(
            _Instr(
                m.group("name"),
                m.group("op"),
                tuple(_arrays(m.group("type"))),
                tuple(a.strip().lstrip("%") for a in args.split(",") if a.strip()),
                m.group("attrs"),
                found.group(1) if found else "",
                line.lstrip().startswith("ROOT"),
            )
        )
    return comps, entry


def _phase(op_name: str) -> str:
    """Where JAX's op_name puts an op: the backward pass (``transpose(...)``), the forward
    pass (``jvp(...)``), or elsewhere (the optimizer update, the loss's last steps)."""
    if "transpose(" in op_name:
        return "backward"
    return "forward" if "jvp(" in op_name else "other"


class _Liveness:
    """Which buffers of one computation are alive after each of its instructions."""

    def __init__(self, comps: dict[str, list[_Instr]], name: str, param_dims: set) -> None:
        self.comps, self.instrs, self.param_dims = comps, comps[name], param_dims
        self.by_name = {i.name: i for i in self.instrs}
        self.kind: dict[tuple[str, int], str] = {}
        self.size: dict[tuple[str, int], int] = {}
        self.desc: dict[tuple[str, int], LiveBuffer] = {}

    def leaves(self, value: str) -> list[tuple[str, int]]:
        """The buffers a value is made of (a view or a tuple is made of its operands')."""
        i = self.by_name.get(value)
        if i is None or i.op in ("parameter", "constant"):
            return []
        if i.op == "tuple":
            return [b for a in i.args for b in self.leaves(a)]
        if i.op in ("bitcast", "get-tuple-element", "while") or i.op.endswith("-done"):
            inner = self.leaves(i.args[0]) if i.args else []
            index = re.search(r"index=(\d+)", i.attrs)
            if i.op == "get-tuple-element" and index and len(inner) > 1:
                inner = inner[int(index.group(1)) : int(index.group(1)) + 1]
            return inner
        if i.op.endswith("-start") and len(i.arrays) > 1:  # (operand, result): the result only
            return [(i.name, len(i.arrays) - 1)]
        return [(i.name, k) for k in range(len(i.arrays))]

    def classify(self, i: _Instr, k: int) -> str:
        """The kind of the ``k``-th array ``i`` writes: a gathered parameter, a gradient (a
        backward-pass or reduced array with a parameter's shape), an activation (anything
        else of the model's passes) or other; a copy (the same bytes from one operand, as a
        relayout or a loop's copy) is of its operand's kind."""
        gathered, grads, acts, other = MEMORY_KINDS
        if i.op.startswith("all-gather"):
            return gathered
        copied = self._kind_copied(i)
        if copied is not None:
            return copied
        phase = _phase(i.op_name)
        reduced = i.op.startswith(("all-reduce", "reduce-scatter"))
        if (phase == "backward" or reduced) and i.arrays[k][1] in self.param_dims:
            return grads
        return acts if phase != "other" else other

    def _kind_copied(self, i: _Instr) -> str | None:
        if i.op not in ("copy", "transpose", "fusion") or len(i.args) != 1 or len(i.arrays) != 1:
            return None
        src = self.leaves(i.args[0])
        kinds = {self.kind.get(b) for b in src}
        same = sum(self.size.get(b, 0) for b in src) == _nbytes(i.arrays[0])
        return kinds.pop() if src and same and len(kinds) == 1 else None

    def nested(self, i: _Instr) -> list[_Step]:
        """The steps of the computations an instruction runs: a loop's body (as often as it
        runs, up to ``_LOOP_COPIES`` times), a call, the largest branch of a conditional."""
        if i.op == "while":
            body = re.search(r"body=%?([\w.\-]+)", i.attrs)
            trips = _TRIP_COUNT.search(i.attrs)
            runs = min(int(trips.group(1)) if trips else 1, _LOOP_COPIES)
            return self._run(body.group(1)) * runs if body else []
        if i.op == "call":
            called = re.search(r"to_apply=%?([\w.\-]+)", i.attrs)
            return self._run(called.group(1)) if called else []
        if i.op == "conditional":
            branches = re.findall(r"%?([\w.\-]+)", _attr(i.attrs, "branch_computations"))
            runs = [self._run(b) for b in branches if b in self.comps]
            return (
                max(runs, key=lambda r: max((sum(s.values()) for s, _, _ in r), default=0))
                if runs
                else []
            )
        return []

    def _run(self, name: str) -> list[_Step]:
        return _Liveness(self.comps, name, self.param_dims).steps() if name in self.comps else []

    def steps(self) -> list[_Step]:
        """Live bytes per kind after each instruction (its nested steps, for a loop), with
        the instruction's phase and the buffers alive (``_Held``). The root's buffers (the
        step's outputs; a loop body's state) are not temporaries and are left out."""
        roots = [i for i in self.instrs if i.root]
        live_out = set(self.leaves(roots[-1].name)) if roots else set()
        last_use: dict[tuple[str, int], int] = {}
        for t, i in enumerate(self.instrs):
            for a in i.args:
                for b in self.leaves(a):
                    last_use[b] = t
        live: dict[tuple[str, int], int] = {}
        out: list[tuple[dict[str, int], str]] = []
        for t, i in enumerate(self.instrs):
            if i.op not in _NO_BUFFER:
                for b in self.leaves(i.name):
                    if b[0] == i.name and b not in self.size:
                        self.size[b] = _nbytes(i.arrays[b[1]])
                        self.kind[b] = self.classify(i, b[1])
                        dtype, shape = i.arrays[b[1]]
                        self.desc[b] = LiveBuffer(
                            self.kind[b], self.size[b], dtype, shape, i.op, i.op_name
                        )
                        if b not in live_out:
                            live[b] = self.size[b]
            base = _by_kind(live, self.kind)
            here = tuple(self.desc[b] for b in live)
            inner = self.nested(i) or [({}, _phase(i.op_name), ())]
            out += [
                ({k: base[k] + s.get(k, 0) for k in MEMORY_KINDS}, ph, (here, held))
                for s, ph, held in inner
            ]
            for b in [b for b in live if last_use.get(b, t) <= t]:
                del live[b]
        return out


# The buffers alive at a step, as a chain: this computation's, then (for a step inside a
# loop body or a call) the nested computation's chain; () ends it.
_Held = tuple
_Step = tuple[dict[str, int], str, _Held]


def _flatten(held: _Held) -> list[LiveBuffer]:
    out: list[LiveBuffer] = []
    while held:
        here, held = held
        out.extend(here)
    return out


def _attr(attrs: str, key: str) -> str:
    m = re.search(key + r"=\{([^}]*)\}", attrs)
    return m.group(1) if m else ""


def _nbytes(array: tuple[str, tuple[int, ...]]) -> int:
    return _DTYPE_BYTES[array[0]] * math.prod(array[1])


def _by_kind(live: dict[tuple[str, int], int], kinds: dict[tuple[str, int], str]) -> dict[str, int]:
    totals = dict.fromkeys(MEMORY_KINDS, 0)
    for b, n in live.items():
        totals[kinds[b]] += n
    return totals


@dataclass(frozen=True)
class LiveMemory:
    """What a compiled step's temporary memory holds, instruction by instruction.

    ``steps[t]`` maps each of ``MEMORY_KINDS`` to the bytes of temporaries alive after the
    ``t``-th instruction of the step's schedule (a loop's body repeated as it runs, up to
    16 times); ``phases[t]`` is that instruction's pass: ``"forward"``, ``"backward"`` or
    ``"other"``. ``temp`` is XLA's own figure (``step_memory(compiled)["temp"]``), or None
    when only HLO text was given: ``peak`` should come close to it, since both replay the
    same schedule (XLA also reuses a dying operand's buffer in place, which this does not).
    """

    steps: tuple[dict[str, int], ...]
    phases: tuple[str, ...]
    temp: int | None = None
    held: tuple[_Held, ...] = field(default=(), repr=False, compare=False)

    @property
    def totals(self) -> list[int]:
        """Bytes of temporaries alive after each step."""
        return [sum(s.values()) for s in self.steps]

    @property
    def peak(self) -> int:
        """The most temporary bytes alive at once."""
        return max(self.totals, default=0)

    @property
    def at_peak(self) -> dict[str, int]:
        """What the temporaries hold, by kind, at the first step where they peak."""
        totals = self.totals
        return dict(self.steps[totals.index(max(totals))]) if totals else {}

    def largest_at_peak(self, n: int | None = 5) -> list[LiveBuffer]:
        """The ``n`` largest buffers alive at the peak (the step ``at_peak`` reads), largest
        first (``n=None``: every one, whose bytes sum to ``peak``): what the kinds' totals
        are made of.

        Raises:
          ValueError: ``n`` is neither None nor a positive integer.
        """
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"largest_at_peak: n must be None or a positive integer, got {n!r}.")
        totals = self.totals
        if not totals or not self.held:
            return []
        return self.alive_at(totals.index(max(totals)))[:n]

    def alive_at(self, step: int) -> list[LiveBuffer]:
        """Every buffer alive after the ``step``-th instruction of ``steps``, largest first
        (their bytes sum to ``totals[step]``); empty when the replay kept no buffers (an
        empty step).

        Raises:
          ValueError: ``step`` is not an index of ``steps`` (0 to ``len(steps) - 1``).
        """
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < len(self.steps):
            raise ValueError(
                f"alive_at: step must be an index of steps, 0 to {len(self.steps) - 1}, got {step!r}."
            )
        if not self.held:
            return []
        return sorted(_flatten(self.held[step]), key=lambda b: -b.nbytes)

    @property
    def most(self) -> dict[str, int]:
        """The most bytes of each kind alive at once, each at its own step."""
        return {k: max((s[k] for s in self.steps), default=0) for k in MEMORY_KINDS}


def live_memory(compiled: Any) -> LiveMemory:
    """Replay a compiled step's schedule and say what its temporary buffers hold.

    Reads the optimised HLO (``compiled.as_text()``), whose instructions XLA lists in the
    order it will run them. Each instruction's result is a buffer from the instruction to
    its last use (a view, a tuple or a loop's result shares its operands' buffers; the
    step's inputs and outputs are not temporaries). Each buffer gets one of
    ``MEMORY_KINDS``: ``gathered parameters`` (an all-gather's result, or a copy of one in
    another layout), ``gradients`` (a backward-pass or reduced array whose shape is a
    parameter's, whole or sharded), ``activations`` (everything else JAX's ``op_name``
    puts in the model's forward or backward pass), ``other`` (the optimizer update, the
    loss). The kinds are read from shapes and op names: an activation with a parameter's
    shape in the backward pass would count as a gradient.

    Accepts the compiled object (then ``temp`` is XLA's ``memory_analysis`` figure, to
    compare ``peak`` with) or its ``as_text()``.

    Raises:
      TypeError / ValueError: as ``collective_stats``, for anything that is not a compiled
        executable or its HLO text.
    """
    text = _hlo_text(compiled)
    comps, entry = _computations(text)
    param_dims = {
        a[1]
        for instrs in comps.values()
        for i in instrs
        if (i.op == "parameter" and instrs is comps.get(entry)) or i.op.startswith("all-gather")
        for a in i.arrays[-1:]
    }
    steps = _Liveness(comps, entry, param_dims).steps()
    temp = None if isinstance(compiled, str) else step_memory(compiled)["temp"]
    return LiveMemory(
        tuple(s for s, _, _ in steps),
        tuple(p for _, p, _ in steps),
        temp,
        tuple(h for _, _, h in steps),
    )
