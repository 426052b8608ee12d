"""Read a profiler trace: which HLO ops ran on which device, when, and what overlapped.

``jax.profiler.trace(dir, create_perfetto_trace=True)`` (``compat.profiler_trace``, or
``compare_strategies(..., trace_dir=dir)``) writes, under ``dir/plugins/profile/<run>/``,
a ``<host>.xplane.pb`` for XProf and the same events as JSON in the Chrome Trace Event
Format (``<host>.trace.json.gz``, ``perfetto_trace.json.gz``): a gzip file holding
``{"traceEvents": [...]}``, where a complete event (``"ph": "X"``) has a start ``ts`` and
a duration ``dur`` in microseconds, a process ``pid`` and thread ``tid``, and ``args``
(https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU). That
format is read here with ``gzip`` and ``json`` from the standard library.

Every event that XLA ran for an HLO op carries ``args["hlo_op"]`` (its name in the HLO, as
``collective_ops`` prints it) and ``args["hlo_module"]``. Where it ran:

* the CPU backend records ops on host threads and names the simulated device in
  ``args["device_ordinal"]``;
* a GPU records them in a process per device, named ``/device:GPU:<id>``, one thread per
  CUDA stream.

An op is a *collective* if its HLO name starts with a collective's opcode (``all-gather``,
``all-reduce``, ``reduce-scatter``, ``collective-permute``, ``all-to-all``; an async
``-start``/``-done`` pair too), and *compute* otherwise. Exposed communication is the time
in which some collective of a device runs and none of its compute does: the part of the
communication that no compute hides.

A trace from any machine can be read anywhere: reading it runs nothing on a device.

``hlo_schedule`` reads the other side: the order in which a compiled step's HLO lists its
instructions. XLA compiles a step into a scheduled module (``is_scheduled=true``): its
entry computation lists every instruction in the order of the schedule, the order that XLA
plans the step's buffers by (and so its temporary memory, ``step_memory``). A backend may
still run independent instructions side by side; a trace says what ran when.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers.measuring.measure import COLLECTIVES

__all__ = [
    "COLLECTIVE_OPCODES",
    "HloOp",
    "Span",
    "TraceSummary",
    "exposed_spans",
    "find_trace_file",
    "format_trace_table",
    "hlo_schedule",
    "is_collective",
    "read_trace",
    "readers_of",
    "slowest_ops",
    "step_ops",
    "summarize_trace",
]

#: HLO opcodes of the collectives: ``collective_stats``'s, and two it never meets in this
#: series' programs. An op's name is its opcode, maybe with ``.N`` or ``-start``/``-done``.
COLLECTIVE_OPCODES = (*COLLECTIVES, "ragged-all-to-all", "collective-broadcast")
_COLLECTIVE = re.compile(r"^(" + "|".join(map(re.escape, COLLECTIVE_OPCODES)) + r")([.-]|$)")
_DEVICE = re.compile(r"/device:[A-Za-z_]+:(\d+)")
_HOW = (
    "Capture one with helpers.measuring.profile.compare_strategies(..., trace_dir=DIR) or "
    "jax.profiler.trace(DIR, create_perfetto_trace=True)."
)


def is_collective(hlo_op: str) -> bool:
    """True for an HLO op name of a collective: ``all-gather.3``, ``all-reduce-start``, ..."""
    return bool(_COLLECTIVE.match(hlo_op))


@dataclass(frozen=True)
class Span:
    """One HLO op that ran on one device: times in microseconds from the trace's origin."""

    device: int
    name: str  # the op's name in the HLO, e.g. "all-gather.3" or "ynn_fusion.31"
    kind: str  # "collective" or "compute"
    start_us: float
    dur_us: float
    module: str  # the HLO module, e.g. "jit_step"
    step: int  # which traced step (a StepTraceAnnotation window), 0 if the trace has none
    thread: str  # the thread (CPU) or stream (GPU) it ran on

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


def find_trace_file(path: str | os.PathLike[str]) -> Path:
    """The JSON trace under ``path`` (a folder ``jax.profiler.trace`` wrote to, or the file).

    In a folder it takes the newest ``*.trace.json.gz`` (or ``perfetto_trace.json.gz``).

    Raises:
      ValueError: ``path`` does not exist, or a folder holds no JSON trace.
    """
    p = Path(path)
    if not p.exists():
        raise ValueError(f"read_trace: path={str(path)!r} does not exist. {_HOW}")
    if p.is_file():
        return p
    found = sorted(p.rglob("*.trace.json.gz")) or sorted(p.rglob("perfetto_trace.json.gz"))
    if not found:
        raise ValueError(
            f"read_trace: path={str(path)!r} holds no *.trace.json.gz (the JSON that "
            f"jax.profiler writes with create_perfetto_trace=True). {_HOW}"
        )
    return max(found, key=lambda f: (f.stat().st_mtime, str(f)))


def _load(file: Path) -> list[dict[str, Any]]:
    try:
        with gzip.open(file, "rt", encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(
            f"read_trace: {str(file)!r} is not a gzipped JSON trace ({type(err).__name__}: "
            f"{err}). Give the *.trace.json.gz that jax.profiler wrote, or its folder."
        ) from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ValueError(
            f"read_trace: {str(file)!r} is JSON but has no 'traceEvents' list: not a "
            "Chrome/Perfetto trace."
        )
    return events


def _names(events: Sequence[Mapping[str, Any]], what: str) -> dict[Any, str]:
    out: dict[Any, str] = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == what:
            key = e.get("pid") if what == "process_name" else (e.get("pid"), e.get("tid"))
            out[key] = str(e.get("args", {}).get("name", ""))
    return out


def read_trace(path: str | os.PathLike[str], module: str | None = None) -> list[Span]:
    """Every HLO op span of ``module`` in the trace at ``path``, sorted by device and start.

    ``module`` is an HLO module name (``"jit_step"``); by default the module that ran
    longest in the trace (the training step, when the trace holds training steps). Each
    span's ``step`` is the ``StepTraceAnnotation`` window it started in (counted from 0).

    Raises:
      ValueError: no trace at ``path`` (see ``find_trace_file``), a file that is not a
        JSON trace, a trace that records no HLO op (the host tracer was below level 2),
        or a ``module`` it does not hold.
    """
    file = find_trace_file(path)
    events = _load(file)
    processes, threads = _names(events, "process_name"), _names(events, "thread_name")
    ops = [
        e
        for e in events
        if e.get("ph") == "X" and isinstance(e.get("args"), dict) and "hlo_op" in e["args"]
    ]
    on_device = [e for e in ops if _DEVICE.search(processes.get(e.get("pid"), ""))]
    if on_device:  # a GPU or TPU: the device's own timeline, not the host's launches
        ops = on_device
    if not ops:
        raise ValueError(
            f"read_trace: {str(file)!r} records no HLO op (no event with args['hlo_op']). "
            "Trace with the host tracer at level 2 or more (helpers.compat.profiler_trace "
            "does), around steps that run on the devices."
        )
    time_in: dict[str, float] = defaultdict(float)
    for e in ops:
        time_in[str(e["args"].get("hlo_module", ""))] += float(e.get("dur", 0))
    if module is None:
        module = max(time_in, key=lambda m: time_in[m])
    elif module not in time_in:
        raise ValueError(
            f"read_trace: module={module!r} ran no op in this trace; it has {sorted(time_in)}."
        )
    windows = sorted(
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
        for e in events
        if e.get("ph") == "X" and "step_num" in (e.get("args") or {})
    )
    spans = []
    for e in ops:
        args = e["args"]
        if str(args.get("hlo_module", "")) != module:
            continue
        if "device_ordinal" in args:
            device = int(args["device_ordinal"])
        else:
            found = _DEVICE.search(processes.get(e.get("pid"), ""))
            if found is None:
                continue
            device = int(found.group(1))
        start, name = float(e["ts"]), str(args["hlo_op"])
        step = next((i for i, (a, b) in enumerate(windows) if a <= start <= b), 0)
        spans.append(
            Span(
                device=device,
                name=name,
                kind="collective" if is_collective(name) else "compute",
                start_us=start,
                dur_us=float(e.get("dur", 0)),
                module=module,
                step=step,
                thread=threads.get((e.get("pid"), e.get("tid")), str(e.get("tid"))),
            )
        )
    return sorted(spans, key=lambda s: (s.device, s.start_us))


# ---------------------------------------------------------------------------
# Overlap arithmetic on intervals
# ---------------------------------------------------------------------------


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _length(intervals: Sequence[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def _subtract(
    these: Sequence[tuple[float, float]], those: Sequence[tuple[float, float]]
) -> list[tuple[float, float]]:
    """The parts of merged intervals ``these`` that no merged interval of ``those`` covers."""
    out, j = [], 0
    for a, b in these:
        while j < len(those) and those[j][1] <= a:
            j += 1
        k, cur = j, a
        while k < len(those) and those[k][0] < b:
            if those[k][0] > cur:
                out.append((cur, those[k][0]))
            cur = max(cur, those[k][1])
            k += 1
        if cur < b:
            out.append((cur, b))
    return out


def exposed_spans(spans: Sequence[Span]) -> list[tuple[int, float, float]]:
    """``(device, start_us, end_us)`` of every stretch in which a device runs a collective
    and no compute: its exposed communication."""
    out = []
    for device in sorted({s.device for s in spans}):
        mine = [s for s in spans if s.device == device]
        comm = _union((s.start_us, s.end_us) for s in mine if s.kind == "collective")
        comp = _union((s.start_us, s.end_us) for s in mine if s.kind == "compute")
        out += [(device, a, b) for a, b in _subtract(comm, comp)]
    return out


@dataclass(frozen=True)
class TraceSummary:
    """Per traced step, averaged over the devices, in milliseconds.

    ``compute_ms``: time in which some compute op of a device runs. ``collective_ms``: time
    in which some collective runs. ``exposed_ms``: collective time with no compute beside
    it. ``busiest_collective``: the collective with the most exposed time, and that time.
    """

    n_devices: int
    n_steps: int
    compute_ms: float
    collective_ms: float
    exposed_ms: float
    collective_ops: dict[str, int]
    busiest_collective: tuple[str, float] | None


def summarize_trace(spans: Sequence[Span]) -> TraceSummary:
    """Compute, collective and exposed time per step from ``read_trace``'s spans.

    Raises:
      ValueError: ``spans`` is empty.
    """
    if not spans:
        raise ValueError("summarize_trace: spans is empty; read_trace returns at least one.")
    devices = sorted({s.device for s in spans})
    steps = sorted({s.step for s in spans})
    comp = comm = exposed = 0.0
    exposed_by: dict[str, float] = defaultdict(float)
    for device in devices:
        for step in steps:
            mine = [s for s in spans if s.device == device and s.step == step]
            c = _union((s.start_us, s.end_us) for s in mine if s.kind == "compute")
            k = _union((s.start_us, s.end_us) for s in mine if s.kind == "collective")
            bare = _subtract(k, c)
            comp, comm, exposed = comp + _length(c), comm + _length(k), exposed + _length(bare)
            for s in mine:
                if s.kind == "collective":
                    own = _subtract([(s.start_us, s.end_us)], c)
                    exposed_by[s.name] += _length(own)
    per = 1e3 * len(devices) * len(steps)
    ops: dict[str, int] = defaultdict(int)
    for s in spans:
        if s.kind == "collective" and s.device == devices[0] and s.step == steps[0]:
            ops[re.sub(r"\.\d+$", "", s.name)] += 1
    busiest = max(exposed_by.items(), key=lambda kv: kv[1], default=None)
    return TraceSummary(
        n_devices=len(devices),
        n_steps=len(steps),
        compute_ms=comp / per,
        collective_ms=comm / per,
        exposed_ms=exposed / per,
        collective_ops=dict(ops),
        busiest_collective=None if busiest is None else (busiest[0], busiest[1] / per),
    )


def slowest_ops(
    spans: Sequence[Span], n: int = 3, kind: str = "compute"
) -> list[tuple[str, float]]:
    """The ``n`` ops of one ``kind`` (``"compute"`` or ``"collective"``) that took the most
    time: ``(HLO name, ms)``, the op's time per device and traced step, averaged over both,
    longest first.

    Raises:
      ValueError: ``spans`` is empty, ``n`` < 1, or ``kind`` is neither kind.
    """
    if not spans:
        raise ValueError("slowest_ops: spans is empty; read_trace returns at least one.")
    if n < 1 or kind not in ("compute", "collective"):
        raise ValueError(
            f"slowest_ops: n={n} must be >= 1 and kind={kind!r} 'compute' or 'collective'."
        )
    per = 1e3 * len({s.device for s in spans}) * len({s.step for s in spans})
    total: dict[str, float] = defaultdict(float)
    for s in spans:
        if s.kind == kind:
            total[s.name] += s.dur_us
    ranked = sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    return [(name, us / per) for name, us in ranked]


def step_ops(spans: Sequence[Span], device: int = 0, step: int | None = None) -> list[Span]:
    """The ops one device ran in one traced step (default: the last), in order of start."""
    if not spans:
        raise ValueError("step_ops: spans is empty; read_trace returns at least one.")
    mine = [s for s in spans if s.device == device]
    if not mine:
        raise ValueError(
            f"step_ops: device={device} ran nothing in these spans; they hold devices "
            f"{sorted({s.device for s in spans})}."
        )
    step = max(s.step for s in mine) if step is None else step
    return sorted((s for s in mine if s.step == step), key=lambda s: s.start_us)


def format_trace_table(summaries: Mapping[str, TraceSummary], where: str = "") -> str:
    """One row per strategy: compute, collective and exposed time per step (ms).

    ``where`` labels the numbers (say ``"CPU measurement"``); it heads the table.
    """
    head = f"{'':<8}{'compute':>10}{'collectives':>13}{'exposed':>10}{'exposed/coll.':>15}"
    lines = [f"per traced step, mean over devices, ms{f' ({where})' if where else ''}", head]
    for name, s in summaries.items():
        share = f"{s.exposed_ms / s.collective_ms:.0%}" if s.collective_ms else "-"
        lines.append(
            f"{name:<8}{s.compute_ms:>10.2f}{s.collective_ms:>13.2f}{s.exposed_ms:>10.2f}"
            f"{share:>15}"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# The compiled schedule
# ---------------------------------------------------------------------------

_HLO_INSTR = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<type>.+?)\s+"
    r"(?P<op>[a-z][a-z0-9\-]*)\((?P<args>[^)]*)\)(?P<attrs>.*)$"
)
_HLO_ARRAY = re.compile(r"\b([a-z]+[0-9]*(?:e[0-9]m[0-9](?:fn)?)?)\[([0-9,]*)\]")
_HLO_NOISE = re.compile(r",\s*(?:metadata|backend_config|frontend_attributes|sharding|statistics)=")


@dataclass(frozen=True)
class HloOp:
    """One instruction of a compiled step's entry computation, as ``hlo_schedule`` reads it.

    ``index`` is its place in the schedule (0 = first). ``result`` is its type without
    layouts (``f32[128,512]``, or a tuple of them); ``op_name`` the JAX operation it came from (the metadata's
    ``op_name``, "" if none): ``jit(step)/jvp(...)/...`` in the forward pass,
    ``.../transpose(jvp(...))/...`` in the backward pass. ``text`` is the line trimmed for
    reading: no layouts, metadata, channel ids or backend configuration, and long tuples cut.
    """

    index: int
    name: str
    opcode: str
    result: str
    operands: tuple[str, ...]
    op_name: str
    text: str

    @property
    def collective(self) -> str | None:
        """The collective this op runs (``"all-gather"``, ...; an async ``-start`` too), or None."""
        kind = self.opcode.removesuffix("-start")
        return kind if kind in COLLECTIVE_OPCODES else None

    @property
    def arrays(self) -> list[tuple[str, tuple[int, ...]]]:
        """``(dtype, shape)`` of every array in its result, in order."""
        return [
            (dtype, tuple(int(d) for d in dims.split(",") if d))
            for dtype, dims in _HLO_ARRAY.findall(self.result)
        ]


def _short_list(items: list[str], what: str, keep: int = 2) -> str:
    if len(items) <= keep + 1:
        return ", ".join(items)
    return f"{', '.join(items[:keep])}, ... {len(items)} {what}"


def _trim_hlo(
    name: str, type_text: str, op: str, operands: list[str], attrs: str
) -> tuple[str, str]:
    """``(result, text)``: the result type and the whole line, trimmed for reading."""
    arrays = [f"{d}[{s}]" for d, s in _HLO_ARRAY.findall(type_text)]
    if type_text.lstrip().startswith("("):
        result, short = f"({', '.join(arrays)})", f"({_short_list(arrays, 'arrays')})"
    else:
        result = short = arrays[0] if arrays else type_text.strip()
    cut = _HLO_NOISE.search(attrs)
    attrs = attrs[: cut.start()] if cut else attrs
    attrs = re.sub(r",\s*channel_id=\d+|,\s*use_global_device_ids=true", "", attrs).rstrip()
    args = _short_list([f"%{o}" for o in operands], "operands")
    return result, f"%{name} = {short} {op}({args}){attrs}"


def hlo_schedule(compiled: Any) -> list[HloOp]:
    """The entry computation of a compiled step, one ``HloOp`` per instruction, in schedule order.

    ``compiled`` is what ``jax.jit(f).lower(...).compile()`` returns, or its ``as_text()``.
    For a scheduled module (``is_scheduled=true``, what XLA compiles) the order is XLA's
    schedule: the order it plans the buffers by. Which instruction reads which value is in
    ``operands``.

    Raises:
      ValueError: the text holds no ENTRY computation (not the HLO of a compiled step).
    """
    text = compiled if isinstance(compiled, str) else getattr(compiled, "as_text", lambda: None)()
    if not isinstance(text, str) or "\nENTRY" not in f"\n{text}":
        raise ValueError(
            "hlo_schedule: compiled must be a compiled step (jax.jit(f).lower(...).compile()) "
            f"or its as_text(); got {type(compiled).__name__} with no ENTRY computation."
        )
    ops: list[HloOp] = []
    inside = False
    for line in text.splitlines():
        if line.startswith("ENTRY"):
            inside = True
            continue
        if inside and line.startswith("}"):
            break
        m = _HLO_INSTR.match(line) if inside else None
        if not m:
            continue
        attrs = m.group("attrs")
        found = re.search(r'op_name="([^"]*)"', attrs)
        operands = re.findall(r"%([\w.\-]+)", m.group("args"))
        result, short = _trim_hlo(m.group("name"), m.group("type"), m.group("op"), operands, attrs)
        ops.append(
            HloOp(
                len(ops), m.group("name"), m.group("op"), result, tuple(operands),
                found.group(1) if found else "", short,
            )
        )  # fmt: skip
    return ops


def _same_value(op: HloOp) -> bool:
    """True for an op that passes one value on unchanged (an async ``-done``) or only moves
    it to another layout (``copy``, ``bitcast``, XLA:CPU's ``wrapped_copy`` fusions)."""
    return (
        op.opcode.endswith("-done")
        or op.opcode in ("copy", "bitcast")
        or (op.opcode == "fusion" and op.name.startswith("wrapped_copy") and len(op.operands) == 1)
    )


def readers_of(schedule: Sequence[HloOp], op: HloOp) -> list[HloOp]:
    """The instructions of ``schedule`` that read ``op``'s value, in schedule order.

    An async ``-done``, a ``copy`` or a ``bitcast`` of the value is followed to its own
    readers: it is the same array (done, or laid out anew), so its readers read the value.
    """
    by_reader: dict[str, list[HloOp]] = defaultdict(list)
    for o in schedule:
        for name in set(o.operands):
            by_reader[name].append(o)
    out: dict[int, HloOp] = {}
    todo, seen = [op.name], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for r in by_reader.get(name, []):
            if _same_value(r):
                todo.append(r.name)
            else:
                out[r.index] = r
    return [out[i] for i in sorted(out)]
