"""Read a profiler trace: which HLO ops ran on which device, when, and what overlapped.

``jax.profiler.trace(dir, create_perfetto_trace=True)`` (``compat.profiler_trace``, or
``compare_strategies(..., trace_dir=dir)``) writes, under ``dir/plugins/profile/<run>/``,
a ``<host>.xplane.pb`` for XProf and the same events as JSON in the Chrome Trace Event
Format (``<host>.trace.json.gz``, ``perfetto_trace.json.gz``): a gzip file holding
``{"traceEvents": [...]}``, where a complete event (``"ph": "X"``) has a start ``ts`` and
a duration ``dur`` in microseconds, a process ``pid`` and thread ``tid``, and ``args``
(https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU). That
format is read here with ``gzip`` and ``json`` from the standard library.

Where an HLO op ran, and how the trace names it:

* the CPU backend records ops on host threads: each event carries ``args["hlo_op"]`` (its
  name in the HLO, as ``collective_ops`` prints it), ``args["hlo_module"]``, and names the
  simulated device in ``args["device_ordinal"]``;
* a GPU records them in a process per device, named ``/device:GPU:<id>``, one thread per
  CUDA stream, with the same ``hlo_op`` and ``hlo_module``;
* a TPU records them in a process per chip, ``/device:TPU:<id>``, on a thread named
  ``XLA Ops``: the event's ``name`` is the HLO op, and its ``args`` hold the whole HLO line
  (``long_name``), a category (``hlo_category``), and the FLOPs and bytes the compiler
  counted for the op (``model_flops``, ``bytes_accessed``). The module is the event of the
  thread ``XLA Modules`` (``jit_step(<fingerprint>)``) that the op ran inside.

An op is a *collective* if its HLO name starts with a collective's opcode (``all-gather``,
``all-reduce``, ``reduce-scatter``, ``collective-permute``, ``all-to-all``; an async
``-start``/``-done`` pair too), or, on a TPU, if its HLO line calls one of XLA:TPU's
collective computations (a reduce-scatter there is a fusion that calls
``%all-reduce-scatter``), and *compute* otherwise. Exposed communication is the time
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
    "collective_kind",
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
_CALLS_COLLECTIVE = re.compile(
    r"calls=%(" + "|".join(map(re.escape, (*COLLECTIVE_OPCODES, "all-reduce-scatter"))) + r")[.,\s]"
)
_DEVICE = re.compile(r"/device:[A-Za-z_]+:(\d+)")
_HOW = (
    "Capture one with helpers.measuring.profile.compare_strategies(..., trace_dir=DIR) or "
    "jax.profiler.trace(DIR, create_perfetto_trace=True)."
)


def is_collective(hlo_op: str, hlo_line: str = "") -> bool:
    """True for an HLO op name of a collective: ``all-gather.3``, ``all-reduce-start``, ...;
    or for an op whose HLO line (``hlo_line``, a TPU trace's ``long_name``) calls one of
    XLA:TPU's collective computations, such as ``calls=%all-reduce-scatter.5``."""
    return collective_kind(hlo_op, hlo_line) is not None


def collective_kind(hlo_op: str, hlo_line: str = "") -> str | None:
    """The collective an op runs (``"all-gather"``, ``"reduce-scatter"``, ...), or None.

    XLA:TPU's fused reduce-scatter (a fusion that calls ``%all-reduce-scatter``) is a
    ``"reduce-scatter"``: it reduces over the group and keeps each device's slice.
    """
    found = _COLLECTIVE.match(hlo_op) or _CALLS_COLLECTIVE.search(hlo_line)
    if found is None:
        return None
    kind = found.group(1)
    return "reduce-scatter" if kind == "all-reduce-scatter" else kind


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
    thread: str  # the thread (CPU), stream (GPU) or "XLA Ops" (TPU) it ran on
    flops: float | None = None  # the FLOPs the compiler counted for the op (TPU), else None
    collective: str | None = None  # its collective ("all-gather", "reduce-scatter", ...)

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


@dataclass(frozen=True)
class _Op:
    """One HLO op event, whichever backend wrote it."""

    name: str
    module: str
    device: int
    start_us: float
    dur_us: float
    thread: str
    line: str  # the op's HLO line where the trace records it (TPU), else ""
    flops: float | None


def _host_ops(
    events: Sequence[Mapping[str, Any]], processes: Mapping[Any, str], threads: Mapping[Any, str]
) -> list[_Op]:
    """CPU and GPU: events with ``args["hlo_op"]``; on a GPU only the devices' own timeline."""
    ops = [
        e
        for e in events
        if e.get("ph") == "X" and isinstance(e.get("args"), dict) and "hlo_op" in e["args"]
    ]
    on_device = [e for e in ops if _DEVICE.search(processes.get(e.get("pid"), ""))]
    out = []
    for e in on_device or ops:
        args = e["args"]
        if "device_ordinal" in args:
            device = int(args["device_ordinal"])
        else:
            found = _DEVICE.search(processes.get(e.get("pid"), ""))
            if found is None:
                continue
            device = int(found.group(1))
        out.append(
            _Op(str(args["hlo_op"]), str(args.get("hlo_module", "")), device, float(e["ts"]),
                float(e.get("dur", 0)), threads.get((e.get("pid"), e.get("tid")), str(e.get("tid"))),
                "", None)
        )  # fmt: skip
    return out


def _tpu_ops(
    events: Sequence[Mapping[str, Any]], processes: Mapping[Any, str], threads: Mapping[Any, str]
) -> list[_Op]:
    """TPU: the events of each chip's ``XLA Ops`` thread, each in the module (an event of
    the chip's ``XLA Modules`` thread) it ran inside."""
    chips = {pid: int(m.group(1)) for pid, name in processes.items()
             if (m := re.search(r"/device:TPU:(\d+)", name))}  # fmt: skip
    modules: dict[Any, list[tuple[float, float, str]]] = defaultdict(list)
    op_events = []
    for e in events:
        if e.get("ph") != "X" or e.get("pid") not in chips:
            continue
        thread = threads.get((e.get("pid"), e.get("tid")), "")
        if thread == "XLA Modules":
            start = float(e["ts"])
            name = re.sub(r"\(\d+\)$", "", str(e.get("name", "")))
            modules[e["pid"]].append((start, start + float(e.get("dur", 0)), name))
        elif thread == "XLA Ops":
            op_events.append(e)
    out = []
    for e in op_events:
        start, args = float(e["ts"]), e.get("args") or {}
        module = next((n for a, b, n in modules[e["pid"]] if a <= start <= b), "")
        flops = args.get("model_flops")
        out.append(
            _Op(str(e.get("name", "")), module, chips[e["pid"]], start, float(e.get("dur", 0)),
                "XLA Ops", str(args.get("long_name", "")),
                None if flops is None else float(flops))
        )  # fmt: skip
    return out


def read_trace(path: str | os.PathLike[str], module: str | None = None) -> list[Span]:
    """Every HLO op span of ``module`` in the trace at ``path``, sorted by device and start.

    Reads the traces of the CPU backend, a GPU and a TPU alike (the module docstring says
    how each names its ops). ``module`` is an HLO module name (``"jit_step"``); by default
    the module that ran longest in the trace (the training step, when the trace holds
    training steps). Each span's ``step`` is the ``StepTraceAnnotation`` window it started
    in (counted from 0); on a TPU each span also carries the FLOPs the compiler counted.

    Raises:
      ValueError: no trace at ``path`` (see ``find_trace_file``), a file that is not a
        JSON trace, a trace that records no HLO op (the host tracer was below level 2),
        or a ``module`` it does not hold.
    """
    file = find_trace_file(path)
    events = _load(file)
    processes, threads = _names(events, "process_name"), _names(events, "thread_name")
    ops = _tpu_ops(events, processes, threads) or _host_ops(events, processes, threads)
    if not ops:
        raise ValueError(
            f"read_trace: {str(file)!r} records no HLO op (no event with args['hlo_op'], "
            "and no TPU 'XLA Ops' thread). Trace with the host tracer at level 2 or more "
            "(helpers.compat.profiler_trace does), around steps that run on the devices."
        )
    time_in: dict[str, float] = defaultdict(float)
    for op in ops:
        time_in[op.module] += op.dur_us
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
    spans = [
        Span(
            device=op.device,
            name=op.name,
            kind="collective" if collective_kind(op.name, op.line) else "compute",
            start_us=op.start_us,
            dur_us=op.dur_us,
            module=module,
            step=next((i for i, (a, b) in enumerate(windows) if a <= op.start_us <= b), 0),
            thread=op.thread,
            flops=op.flops,
            collective=collective_kind(op.name, op.line),
        )
        for op in ops
        if op.module == module
    ]
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
    ``step_ms``: from a step's first op to its last, on a device. ``model_flops``: the FLOPs
    the compiler counted for a step's ops on a device (a TPU trace records them per op),
    or None where the trace records none.
    """

    n_devices: int
    n_steps: int
    compute_ms: float
    collective_ms: float
    exposed_ms: float
    collective_ops: dict[str, int]
    busiest_collective: tuple[str, float] | None
    step_ms: float = 0.0
    model_flops: float | None = None

    def mfu(self, peak_flops_per_s: float) -> float | None:
        """``model_flops`` / ``step_ms`` / the device's peak FLOP/s: the MFU the trace itself
        gives, or None where it records no FLOPs.

        Raises:
          ValueError: ``peak_flops_per_s`` is not positive.
        """
        if not peak_flops_per_s > 0:
            raise ValueError(f"mfu: peak_flops_per_s={peak_flops_per_s!r} must be positive.")
        if self.model_flops is None or self.step_ms <= 0:
            return None
        return self.model_flops / (self.step_ms / 1e3) / peak_flops_per_s


def summarize_trace(spans: Sequence[Span]) -> TraceSummary:
    """Compute, collective and exposed time per step from ``read_trace``'s spans.

    Raises:
      ValueError: ``spans`` is empty.
    """
    if not spans:
        raise ValueError("summarize_trace: spans is empty; read_trace returns at least one.")
    devices = sorted({s.device for s in spans})
    steps = sorted({s.step for s in spans})
    comp = comm = exposed = wall = 0.0
    exposed_by: dict[str, float] = defaultdict(float)
    for device in devices:
        for step in steps:
            mine = [s for s in spans if s.device == device and s.step == step]
            if mine:
                wall += max(s.end_us for s in mine) - min(s.start_us for s in mine)
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
            if "-done" not in s.name:  # an async pair is one collective: count its start
                ops[s.collective or re.sub(r"\.\d+$", "", s.name)] += 1
    busiest = max(exposed_by.items(), key=lambda kv: kv[1], default=None)
    counted = [s.flops for s in spans if s.flops is not None]
    return TraceSummary(
        n_devices=len(devices),
        n_steps=len(steps),
        compute_ms=comp / per,
        collective_ms=comm / per,
        exposed_ms=exposed / per,
        collective_ops=dict(ops),
        busiest_collective=None if busiest is None else (busiest[0], busiest[1] / per),
        step_ms=wall / per,
        model_flops=sum(counted) / (len(devices) * len(steps)) if counted else None,
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
