"""Pipeline schedules beyond GPipe: tick tables for GPipe, 1F1B, interleaved, zero-bubble, DualPipe.

Notebook 07 measures GPipe's forward schedule (``helpers.parallelism.collectives.gpipe_schedule``);
notebook 10 runs whole training steps, forward *and* backward, by a table:

- **A schedule is a table.** ``PipelineSchedule`` says, for every device and tick, which
  micro-batch it works on, whether it is a forward (``F``), a backward (``B``) or, when the
  backward is split, a weight gradient (``W``), and which of the device's model chunks it
  uses. Every operation takes one tick: a table gives each device's order of work, not its
  time.
- **One generator.** ``simulate`` runs each device's program (its list of operations, in
  order) as early as the data allows: a forward waits for the previous stage's forward of
  the same micro-batch, a backward for the next stage's backward. ``gpipe_table``,
  ``one_f_one_b_table``, ``interleaved_table``, ``zero_bubble_table`` and
  ``dualpipe_table`` only write the programs.
- **What a table costs.** ``bubble_fraction`` (re-exported from ``helpers.parallelism.collectives``,
  and now also reading a ``PipelineSchedule``), ``in_flight`` (how many micro-batches'
  activations each device holds after each tick), ``interleaved_bubble`` (the formula
  ``(S-1)/(v·M+S-1)``) and ``executor_tables``: the per-tick integer arrays a
  ``shard_map`` executor reads (which slot of its stash and inboxes each tick uses).
- **What it costs in time.** ``timeline`` keeps each device's order and gives each op a
  duration (a backward costs about two forwards, three when it recomputes the forward):
  either each device runs as soon as its inputs are ready, or the ticks stay whole, as in a
  lockstep ``shard_map`` executor; ``hop`` charges each send between devices a latency.

Nothing here runs JAX: the tables are numpy, so they can be tested exhaustively.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from helpers.parallelism.collectives import bubble_fraction as _bubble_of_array

__all__ = [
    "BACKWARD",
    "FORWARD",
    "IDLE",
    "WEIGHT_GRAD",
    "Op",
    "PipelineSchedule",
    "Timeline",
    "bubble_fraction",
    "dualpipe_table",
    "executor_tables",
    "gpipe_table",
    "in_flight",
    "interleaved_bubble",
    "interleaved_table",
    "one_f_one_b_order",
    "one_f_one_b_table",
    "simulate",
    "stage_layout",
    "timeline",
    "zero_bubble_table",
]

IDLE, FORWARD, BACKWARD, WEIGHT_GRAD = -1, 0, 1, 2
_PHASE = {"F": FORWARD, "B": BACKWARD, "W": WEIGHT_GRAD}
_MAX_TICKS = 100_000

# One operation of a device's program: (phase "F" | "B" | "W", micro-batch, chunk).
Op = tuple[str, int, int]


@dataclass(frozen=True)
class PipelineSchedule:
    """A pipeline schedule: what every device does at every tick.

    ``micro``, ``phase`` and ``chunk`` are ``(n_stages, ticks)`` int arrays; at an idle
    cell all three are ``-1``. ``phase`` is ``FORWARD`` (0), ``BACKWARD`` (1) or
    ``WEIGHT_GRAD`` (2, only when the backward is split). ``route[m]`` lists the
    ``(device, chunk)`` pairs micro-batch ``m`` passes through, in forward order.
    """

    name: str
    n_stages: int
    n_micro: int
    n_chunks: int
    micro: np.ndarray
    phase: np.ndarray
    chunk: np.ndarray
    route: tuple[tuple[tuple[int, int], ...], ...]

    @property
    def ticks(self) -> int:
        return int(self.micro.shape[1])


def _whole(where: str, name: str, value: Any, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{where}: {name}={value!r} must be a whole number >= {low}.")
    return int(value)


def _ring_route(n_stages: int, n_chunks: int) -> tuple[tuple[int, int], ...]:
    # Virtual stage k = chunk * S + device: device d holds chunks d, d+S, d+2S, ... (circular).
    return tuple((k % n_stages, k // n_stages) for k in range(n_stages * n_chunks))


def simulate(
    programs: Sequence[Sequence[Op]],
    n_micro: int,
    *,
    n_chunks: int = 1,
    routes: Sequence[Sequence[tuple[int, int]]] | None = None,
    defer_weight_grads: bool = False,
    limits: Sequence[int] | None = None,
    name: str = "custom",
) -> PipelineSchedule:
    """Run each device's program as early as its data allows; the table of what ran when.

    Args:
      programs: ``programs[d]`` is device ``d``'s list of ``(phase, micro, chunk)`` ops, in
        the order it runs them (or a tuple of such lists, streams that each run in order: at
        each tick the device runs the first stream's next op that can run, a backward first); ``phase`` is ``"F"``, ``"B"`` or ``"W"`` (a split backward:
        ``B`` the input gradient, ``W`` the weight gradient). Each (micro, chunk) of the
        device's route must appear once as ``F`` and once as ``B`` (and once as ``W``
        when any ``W`` appears).
      n_micro: the number of micro-batches ``M``.
      n_chunks: model chunks per device (``v``; 1 for GPipe and 1F1B).
      routes: ``routes[m]``: the ``(device, chunk)`` pairs micro-batch ``m`` visits in forward
        order (default: virtual stage ``k`` on device ``k % S``, chunk ``k // S``).
      defer_weight_grads: if True, ``W`` ops are not in ``programs``: each ``B`` queues its
        ``W``, and a device runs its oldest queued ``W`` when its next op must wait (the
        zero-bubble idea), and after its program ends.
      limits: ``limits[d]``: device ``d`` starts no forward while it holds this many
        activations (forwards whose backward, or ``W``, has not run); it runs a queued ``W``
        instead. Default: no limit beyond what the programs imply.

    A device's op runs at tick ``t`` when what it needs finished at an earlier tick: ``F``
    of micro-batch ``m`` needs the previous stage's ``F`` of ``m``; ``B`` needs its own
    ``F`` and the next stage's ``B``; ``W`` needs its own ``B``. At most one op per device
    per tick.

    Raises:
      ValueError: a malformed program (an op twice or missing, an unknown phase, a chunk
        the route does not give that device) or one that can never finish (a deadlock).
    """
    where = "simulate"
    M = _whole(where, "n_micro", n_micro)
    v = _whole(where, "n_chunks", n_chunks)
    if not isinstance(programs, Sequence) or len(programs) < 1:
        raise ValueError(f"{where}: programs must be a non-empty list, one program per device.")
    S = len(programs)
    routes, position = _route_positions(where, routes, S, v, M)
    queues, uses_w = _parse_programs(where, programs, position, defer_weight_grads)
    if limits is not None and (
        len(limits) != S or any(_whole(where, "limits[d]", x) < 1 for x in limits)
    ):
        raise ValueError(f"{where}: limits must hold one whole number >= 1 per device ({S}).")
    sim = _Simulation(queues, position, routes, defer_weight_grads, limits, uses_w)
    rows, t = sim.run(where)
    table = np.array(rows, dtype=int).reshape(S, t, 3)
    return PipelineSchedule(
        name=name,
        n_stages=S,
        n_micro=M,
        n_chunks=v,
        phase=table[:, :, 0],
        micro=table[:, :, 1],
        chunk=table[:, :, 2],
        route=routes,
    )


_Routes = tuple[tuple[tuple[int, int], ...], ...]
_Position = dict[tuple[int, int, int], int]


def _route_positions(
    where: str, routes: Sequence[Sequence[tuple[int, int]]] | None, S: int, v: int, M: int
) -> tuple[_Routes, _Position]:
    """The routes as tuples, and each (device, chunk, micro)'s index in its micro's route."""
    if routes is None:
        routes = [_ring_route(S, v)] * M
    if len(routes) != M:
        raise ValueError(f"{where}: routes has {len(routes)} entries for n_micro={M}.")
    routes = tuple(tuple((int(d), int(c)) for d, c in r) for r in routes)
    position: _Position = {}  # (device, chunk, micro) -> index in route
    for m, r in enumerate(routes):
        for p, (d, c) in enumerate(r):
            if not (0 <= d < S and 0 <= c < v):
                raise ValueError(f"{where}: route of micro-batch {m} visits {(d, c)}, outside "
                                 f"{S} devices x {v} chunks.")  # fmt: skip
            position[(d, c, m)] = p
    return routes, position


def _parse_programs(
    where: str, programs: Sequence[Any], position: _Position, defer_weight_grads: bool
) -> tuple[list[list[list[tuple[int, int, int]]]], bool]:
    """Each device's streams as (phase, micro, chunk) queues, checked; and whether W runs."""
    streams_of = [
        list(prog) if isinstance(prog, tuple) and all(isinstance(x, list) for x in prog) else [prog]
        for prog in programs
    ]
    uses_w = defer_weight_grads or any(
        op[0] == "W"
        for st in streams_of
        for prog in st
        for op in prog
        if isinstance(op, (tuple, list)) and op
    )
    phases = (
        (FORWARD, BACKWARD, WEIGHT_GRAD)
        if uses_w and not defer_weight_grads
        else (FORWARD, BACKWARD)
    )
    queues = [
        _device_queues(where, d, streams, position, defer_weight_grads, phases)
        for d, streams in enumerate(streams_of)
    ]
    return queues, uses_w


def _device_queues(
    where: str,
    d: int,
    streams: list[Any],
    position: _Position,
    defer_weight_grads: bool,
    phases: tuple[int, ...],
) -> list[list[tuple[int, int, int]]]:
    """Device ``d``'s streams as queues; each op once, none missing, none off its route."""
    seen: set[tuple[int, int, int]] = set()
    qs = []
    for prog in streams:
        q = []
        for op in prog:
            if not (isinstance(op, (tuple, list)) and len(op) == 3 and op[0] in _PHASE):
                raise ValueError(f"{where}: device {d}'s op {op!r} is not (phase 'F'|'B'|'W', "
                                 "micro, chunk).")  # fmt: skip
            ph, m, c = _PHASE[op[0]], int(op[1]), int(op[2])
            if (d, c, m) not in position:
                raise ValueError(f"{where}: device {d} runs {tuple(op)!r}, but micro-batch {m}'s "
                                 f"route does not pass chunk {c} of device {d}.")  # fmt: skip
            if (ph, m, c) in seen or (defer_weight_grads and ph == WEIGHT_GRAD):
                raise ValueError(f"{where}: device {d} runs {tuple(op)!r} twice (or a W that "
                                 "defer_weight_grads queues itself).")  # fmt: skip
            seen.add((ph, m, c))
            q.append((ph, m, c))
        qs.append(q)
    need = {(ph, m, c) for (dd, c, m) in position if dd == d for ph in phases}
    if seen != need:
        missing = sorted(need - seen)[:3]
        raise ValueError(f"{where}: device {d}'s program misses ops, e.g. "
                         f"{[('FBW'[p], m, c) for p, m, c in missing]}.")  # fmt: skip
    return qs


class _Simulation:
    """The state of :func:`simulate`'s tick loop: queue heads, deferred W's, what ran when."""

    def __init__(
        self,
        queues: list[list[list[tuple[int, int, int]]]],
        position: _Position,
        routes: _Routes,
        defer_weight_grads: bool,
        limits: Sequence[int] | None,
        uses_w: bool,
    ) -> None:
        S = len(queues)
        self.queues, self.position, self.routes = queues, position, routes
        self.defer, self.limits, self.uses_w = defer_weight_grads, limits, uses_w
        self.done: dict[tuple[int, int, int, int], int] = {}  # (phase, device, chunk, micro)
        self.rows: list[list[tuple[int, int, int]]] = [[] for _ in range(S)]
        self.heads = [[0] * len(qs) for qs in queues]
        self.deferred: list[list[tuple[int, int]]] = [[] for _ in range(S)]
        self.held = [0] * S

    def ready(self, d: int, ph: int, m: int, c: int, t: int) -> bool:
        """Whether what op (ph, m, c) of device ``d`` needs finished before tick ``t``."""

        def before(key: tuple[int, int, int, int]) -> bool:
            return self.done.get(key, _MAX_TICKS) < t

        p, route = self.position[(d, c, m)], self.routes[m]
        if ph == FORWARD:
            return p == 0 or before((FORWARD, *route[p - 1], m))
        if ph == BACKWARD:
            nxt = p == len(route) - 1 or before((BACKWARD, *route[p + 1], m))
            return nxt and before((FORWARD, d, c, m))
        return before((BACKWARD, d, c, m))

    def pending(self, d: int) -> bool:
        """Whether device ``d`` has ops left (queued or deferred)."""
        heads, queues = self.heads[d], self.queues[d]
        return any(h < len(q) for h, q in zip(heads, queues, strict=True)) or bool(self.deferred[d])

    def pick(self, d: int, t: int) -> tuple[int, int, int]:
        """The op device ``d`` runs at tick ``t`` (or idle), taken off its queue."""
        queues, heads = self.queues[d], self.heads[d]
        # The next op of each stream that can run now; a backward first (it frees memory
        # and someone waits for it), then the first stream's.
        full = self.limits is not None and self.held[d] >= self.limits[d]
        heads_ready = [(queues[i][h][0] != BACKWARD, i) for i, h in enumerate(heads)
                       if h < len(queues[i]) and self.ready(d, *queues[i][h], t)
                       and not (full and queues[i][h][0] == FORWARD)]  # fmt: skip
        if heads_ready:
            i = min(heads_ready)[1]
            cell = queues[i][heads[i]]
            heads[i] += 1
            if self.defer and cell[0] == BACKWARD:
                self.deferred[d].append((cell[1], cell[2]))
            return cell
        if self.deferred[d] and self.ready(d, WEIGHT_GRAD, *self.deferred[d][0], t):
            return (WEIGHT_GRAD, *self.deferred[d].pop(0))
        return (IDLE, -1, -1)

    def run(self, where: str) -> tuple[list[list[tuple[int, int, int]]], int]:
        """Tick until every program ends; the rows of cells and the number of ticks."""
        S, rows = len(self.queues), self.rows
        t = 0
        while any(self.pending(d) for d in range(S)):
            progressed = False
            for d in range(S):
                cell = self.pick(d, t)
                if cell[0] != IDLE:
                    self.done[(cell[0], d, cell[2], cell[1])] = t
                    progressed = True
                    self.held[d] += {FORWARD: 1, BACKWARD: 0 if self.uses_w else -1,
                                     WEIGHT_GRAD: -1}[cell[0]]  # fmt: skip
                rows[d].append(cell)
            t += 1
            if not progressed and t >= 2 and all(r[-2][0] == IDLE for r in rows):
                # Nothing ran this tick or the last: nothing ever will.
                stuck = [("FBW"[q[h][0]], q[h][1], q[h][2]) for d in range(S)
                         for h, q in zip(self.heads[d], self.queues[d], strict=True)
                         if h < len(q)]  # fmt: skip
                raise ValueError(f"{where}: the programs deadlock at tick {t - 2}: every "
                                 "device's next op waits for another's, e.g. "
                                 f"{stuck[:3]} (phase, micro, chunk).")  # fmt: skip
        return rows, t


# ---------------------------------------------------------------------------
# The programs of the classic schedules
# ---------------------------------------------------------------------------


def _check_sm(where: str, n_stages: Any, n_micro: Any) -> tuple[int, int]:
    return _whole(where, "n_stages", n_stages), _whole(where, "n_micro", n_micro)


def gpipe_table(n_stages: int, n_micro: int) -> PipelineSchedule:
    """GPipe with its backward: every device runs all ``M`` forwards, then all ``M`` backwards.

    A device keeps every micro-batch's activations until its backward: ``M`` in flight.
    """
    S, M = _check_sm("gpipe_table", n_stages, n_micro)
    programs = [[("F", m, 0) for m in range(M)] + [("B", m, 0) for m in range(M)]
                for _ in range(S)]  # fmt: skip
    return simulate(programs, M, name="GPipe")


def one_f_one_b_order(stage: int, n_stages: int, n_micro: int) -> list[Op]:
    """The program of ``stage`` under 1F1B: warm up with ``min(S-1-stage, M)`` forwards, then
    alternate one forward and one backward, then drain the remaining backwards."""
    S, M = _check_sm("one_f_one_b_order", n_stages, n_micro)
    s = _whole("one_f_one_b_order", "stage", stage, 0)
    if s >= S:
        raise ValueError(f"one_f_one_b_order: stage={s} must be below n_stages={S}.")
    warm = min(S - 1 - s, M)
    prog: list[Op] = [("F", m, 0) for m in range(warm)]
    for i in range(M):
        if warm + i < M:
            prog.append(("F", warm + i, 0))
        prog.append(("B", i, 0))
    return prog


def one_f_one_b_table(
    n_stages: int, n_micro: int, *, split_backward: bool = False
) -> PipelineSchedule:
    """1F1B (PipeDream-Flush): stage ``s`` holds at most ``min(S - s, M)`` micro-batches.

    ``split_backward=True`` runs each backward as two ops, ``B`` then at once ``W`` (what
    ``zero_bubble_table`` is compared with)."""
    S, M = _check_sm("one_f_one_b_table", n_stages, n_micro)
    programs = [one_f_one_b_order(s, S, M) for s in range(S)]
    if split_backward:
        programs = [[x for op in prog for x in ([op] if op[0] == "F" else [op, ("W", *op[1:])])]
                    for prog in programs]  # fmt: skip
    return simulate(programs, M, name="1F1B, split backward" if split_backward else "1F1B")


def interleaved_table(n_stages: int, n_micro: int, n_chunks: int) -> PipelineSchedule:
    """Interleaved 1F1B (Megatron-LM; MaxText's circular layout): device ``d`` holds chunks
    ``d, d+S, ...`` of the ``S·v`` model chunks, so a micro-batch circles the devices ``v``
    times. ``n_micro`` must be a multiple of ``n_stages`` (Megatron's condition). ``v = 1`` is
    1F1B.

    Device ``d``'s program: forwards in groups of ``S`` micro-batches per chunk, warm-up of
    ``2·(S-1-d) + (v-1)·S`` forwards, then one forward and one backward alternating.
    """
    where = "interleaved_table"
    S, M = _check_sm(where, n_stages, n_micro)
    v = _whole(where, "n_chunks", n_chunks)
    if M % S:
        raise ValueError(f"{where}: n_micro={M} must be a multiple of n_stages={S} (micro-"
                         "batches enter in groups of S per chunk).")  # fmt: skip
    if v == 1:
        return simulate([one_f_one_b_order(s, S, M) for s in range(S)], M, name="1F1B")

    def fwd(k: int) -> Op:
        return ("F", (k // (S * v)) * S + k % S, (k // S) % v)

    def bwd(k: int) -> Op:
        return ("B", (k // (S * v)) * S + k % S, v - 1 - (k // S) % v)

    total = M * v
    programs = []
    for d in range(S):
        warm = min(2 * (S - 1 - d) + (v - 1) * S, total)
        prog = [fwd(k) for k in range(warm)]
        for i in range(total):
            if warm + i < total:
                prog.append(fwd(warm + i))
            prog.append(bwd(i))
        programs.append(prog)
    return simulate(programs, M, n_chunks=v, name=f"interleaved, v={v}")


def zero_bubble_table(n_stages: int, n_micro: int) -> PipelineSchedule:
    """Zero-bubble's idea (Qi et al. 2024, ZB-H1) on 1F1B: the backward split into ``B``
    (the input's gradient, which the previous stage waits for) and ``W`` (the weights'
    gradient, which no one waits for); each ``W`` is deferred into ticks that would idle."""
    S, M = _check_sm("zero_bubble_table", n_stages, n_micro)
    programs = [one_f_one_b_order(s, S, M) for s in range(S)]
    # ZB-H1 keeps 1F1B's peak: no device holds more than stage 0 does under 1F1B (S).
    return simulate(
        programs, M, defer_weight_grads=True, limits=[S] * S, name="zero-bubble (ZB-H1 style)"
    )


def dualpipe_table(n_stages: int, n_micro: int) -> PipelineSchedule:
    """A bidirectional schedule in DualPipe's shape (DeepSeek-V3, 2024): each device holds
    two chunks, stage ``d`` of a pipeline running down (chunk 0) and stage ``S-1-d`` of one
    running up (chunk 1); half the micro-batches enter at each end. Weight gradients are
    deferred as in zero-bubble. Simplified: DualPipe also overlaps one chunk's forward with
    another's backward inside a tick, which a one-op-per-tick table cannot show.
    ``n_micro`` must be even."""
    S, M = _check_sm("dualpipe_table", n_stages, n_micro)
    if M % 2:
        raise ValueError(f"dualpipe_table: n_micro={M} must be even (half enter at each end).")
    half = M // 2
    routes = [tuple((k, 0) for k in range(S)) if m < half else tuple((S - 1 - k, 1)
              for k in range(S)) for m in range(M)]  # fmt: skip
    programs = []
    for d in range(S):
        down = [(p, m, 0) for p, m, _ in one_f_one_b_order(d, S, half)]
        up = [(p, m + half, 1) for p, m, _ in one_f_one_b_order(S - 1 - d, S, half)]
        # Two streams, each in 1F1B order; each tick runs whichever can (a backward first).
        programs.append((down, up) if d <= S - 1 - d else (up, down))
    return simulate(programs, M, n_chunks=2, routes=routes, defer_weight_grads=True,
                    name="bidirectional (DualPipe's shape)")  # fmt: skip


# ---------------------------------------------------------------------------
# What a table costs
# ---------------------------------------------------------------------------


def _schedule(where: str, schedule: Any) -> PipelineSchedule:
    if not isinstance(schedule, PipelineSchedule):
        raise ValueError(f"{where}: expected a PipelineSchedule (from gpipe_table, "
                         f"one_f_one_b_table, ...); got {type(schedule).__name__}.")  # fmt: skip
    return schedule


def bubble_fraction(schedule: Any) -> float:
    """The idle share of a schedule: idle (device, tick) cells over all cells.

    Accepts a ``PipelineSchedule`` or, as ``helpers.parallelism.collectives.bubble_fraction`` does, a
    2-D ``(stages, ticks)`` array with ``-1`` where a stage idles.
    """
    if isinstance(schedule, PipelineSchedule):
        return float(np.mean(schedule.phase == IDLE))
    return _bubble_of_array(schedule)


def interleaved_bubble(n_stages: int, n_micro: int, n_chunks: int = 1) -> float:
    """The bubble by formula: ``(S-1)/(v·M + S-1)``; ``v = 1`` is GPipe's and 1F1B's."""
    S, M = _check_sm("interleaved_bubble", n_stages, n_micro)
    v = _whole("interleaved_bubble", "n_chunks", n_chunks)
    return (S - 1) / (v * M + S - 1)


def in_flight(schedule: PipelineSchedule) -> np.ndarray:
    """``(n_stages, ticks)`` ints: how many (micro-batch, chunk) activations each device
    holds at the end of each tick: its forward has run, its backward (its ``W`` when the
    backward is split) has not."""
    s = _schedule("in_flight", schedule)
    last = WEIGHT_GRAD if (s.phase == WEIGHT_GRAD).any() else BACKWARD
    step = np.where(s.phase == FORWARD, 1, 0) - np.where(s.phase == last, 1, 0)
    return np.cumsum(step, axis=1)


_DEFAULT_DURATIONS = {"F": 1.0, "B": 1.0, "W": 1.0}


@dataclass(frozen=True)
class Timeline:
    """A schedule in time: each cell's op starts at ``start`` and lasts ``length``.

    ``start`` and ``length`` are ``(n_stages, ticks)`` float arrays (``nan`` and ``0`` at idle
    cells), in units of ``durations`` (``{"F": 1, "B": 3}``: a backward costs three
    forwards). ``lockstep`` says how the devices waited for each other and ``hop`` what a
    send cost (see ``timeline``).
    """

    schedule: PipelineSchedule
    start: np.ndarray
    length: np.ndarray
    durations: dict[str, float]
    lockstep: bool
    hop: float = 0.0

    @property
    def total(self) -> float:
        """The time from the first op's start to the last op's end."""
        ends = np.where(self.length > 0, self.start + self.length, 0.0)
        return float(ends.max())

    @property
    def bubble(self) -> float:
        """The idle share of device-time: ``1 - busy time / (devices x total)``."""
        total = self.total
        return (
            0.0 if total == 0 else 1.0 - float(self.length.sum()) / (self.length.shape[0] * total)
        )


def _durations(where: str, durations: Any) -> dict[str, float]:
    if durations is None:
        return dict(_DEFAULT_DURATIONS)
    if not isinstance(durations, dict) or not set(durations) <= set(_PHASE):
        raise ValueError(f"{where}: durations must be a dict with keys among 'F', 'B', 'W' "
                         f"(op -> its duration); got {durations!r}.")  # fmt: skip
    out = dict(_DEFAULT_DURATIONS)
    for k, x in durations.items():
        if (
            isinstance(x, bool)
            or not isinstance(x, (int, float, np.integer, np.floating))
            or not (np.isfinite(x) and x > 0)
        ):
            raise ValueError(f"{where}: durations[{k!r}]={x!r} must be a positive number.")
        out[k] = float(x)
    return out


def timeline(
    schedule: PipelineSchedule,
    durations: dict[str, float] | None = None,
    *,
    lockstep: bool = False,
    hop: float = 0.0,
) -> Timeline:
    """When each op of ``schedule`` runs if ops take ``durations`` rather than one tick each.

    A table gives each device's order of ops; ``timeline`` keeps that order and times it:

    - ``lockstep=False``: each device runs its next op as soon as it is free and the op's
      inputs are ready (the previous stage's forward, the next stage's backward), as separate
      programs exchanging point-to-point messages would (MPMD).
    - ``lockstep=True``: the table's ticks stay whole, as in a ``shard_map`` executor whose
      every tick ends with ``ppermute``s to both ring neighbours: a device starts tick
      ``t + 1`` only when it and its two neighbours have finished tick ``t``.

    Args:
      schedule: a ``PipelineSchedule``.
      durations: how long each kind of op takes, ``{"F": 1, "B": 2}``; a kind not given
        takes 1 (the default: every op one tick).
      lockstep: see above.
      hop: the latency of one point-to-point send, in the units of ``durations``. Free, an
        op that needs another device's output (a forward the previous stage's forward, a
        backward the next stage's backward) starts at least ``hop`` after that output ends;
        an input from the same device (a chunk's own forward, or the next virtual stage
        when it sits on the same device) waits for nothing. Lockstep, every tick ends with
        its ``ppermute``s, so each tick ends ``hop`` later (on one device, nothing is sent
        and ``hop`` is not charged). Default 0: sends are free.

    Raises:
      ValueError: not a ``PipelineSchedule``, a duration that is not a positive number, or
        a ``hop`` that is not a number >= 0.
    """
    s = _schedule("timeline", schedule)
    dur = _durations("timeline", durations)
    if (
        isinstance(hop, bool)
        or not isinstance(hop, (int, float, np.integer, np.floating))
        or not (np.isfinite(hop) and hop >= 0)
    ):
        raise ValueError(f"timeline: hop={hop!r} must be a number >= 0 (a send's latency).")
    length = np.zeros(s.phase.shape)
    for key, ph in _PHASE.items():
        length[s.phase == ph] = dur[key]
    hop = float(hop)
    start = (
        _lockstep_starts(length, hop if s.n_stages > 1 else 0.0)
        if lockstep
        else _free_starts(s, length, hop)
    )
    start = np.where(s.phase == IDLE, np.nan, start)
    return Timeline(
        schedule=s, start=start, length=length, durations=dur, lockstep=lockstep, hop=hop
    )


def _lockstep_starts(length: np.ndarray, hop: float = 0.0) -> np.ndarray:
    """Tick ``t`` of device ``d`` starts when ``d`` and its ring neighbours ended tick ``t-1``
    (each tick ending ``hop`` after its op: its ``ppermute``s)."""
    S, T = length.shape
    start = np.zeros((S, T))
    ready = np.zeros(S)
    for t in range(T):
        start[:, t] = ready
        ends = ready + length[:, t] + hop
        ready = np.maximum(ends, np.maximum(np.roll(ends, 1), np.roll(ends, -1)))
    return start


def _free_starts(s: PipelineSchedule, length: np.ndarray, hop: float = 0.0) -> np.ndarray:
    """Each device's ops in the table's order, each as early as the device and its inputs allow;
    an input from another device arrives ``hop`` after its op ends."""
    position = {(d, c, m): p for m, r in enumerate(s.route) for p, (d, c) in enumerate(r)}
    end: dict[tuple[int, int, int, int], float] = {}
    free = np.zeros(s.n_stages)
    start = np.zeros(length.shape)
    for t in range(s.ticks):  # an op's inputs ran at earlier ticks of the table
        for d in range(s.n_stages):
            ph = int(s.phase[d, t])
            if ph == IDLE:
                continue
            m, c = int(s.micro[d, t]), int(s.chunk[d, t])
            p, r = position[(d, c, m)], s.route[m]
            needs = []
            if ph == FORWARD and p > 0:
                needs.append((FORWARD, *r[p - 1], m))
            elif ph == BACKWARD:
                needs.append((FORWARD, d, c, m))
                if p < len(r) - 1:
                    needs.append((BACKWARD, *r[p + 1], m))
            elif ph == WEIGHT_GRAD:
                needs.append((BACKWARD, d, c, m))
            start[d, t] = max([free[d], *(end[k] + (hop if k[1] != d else 0.0) for k in needs)])
            free[d] = end[(ph, d, c, m)] = start[d, t] + length[d, t]
    return start


def _slots(intervals: list[tuple[int, int, Any]]) -> tuple[dict[Any, int], int]:
    """Give each ``(start, end, key)`` interval (ticks, inclusive) the lowest free slot."""
    free_at: list[int] = []  # slot -> first tick it is free again
    out: dict[Any, int] = {}
    for start, end, key in sorted(intervals, key=lambda x: (x[0], x[1])):
        slot = next((i for i, f in enumerate(free_at) if f <= start), len(free_at))
        if slot == len(free_at):
            free_at.append(0)
        free_at[slot] = end + 1
        out[key] = slot
    return out, len(free_at)


def executor_tables(schedule: PipelineSchedule) -> dict[str, Any]:
    """What a ``shard_map`` executor reads at each tick, as ``(n_stages, ticks)`` int32 arrays.

    The executor keeps, per device, a **stash** (the input of every forward whose backward
    has not run: what the backward differentiates) and two **inboxes** (activations and
    gradients that arrived from a neighbour and wait for their op). Slots are assigned here,
    so the executor only indexes. Keys:

      ``op``: 0 idle, 1 forward, 2 backward; ``micro``, ``chunk``;
      ``stash``: the stash slot of the op's (micro, chunk);
      ``act_in``: the activation inbox slot a forward reads, ``-1`` = read the data (first stage);
      ``grad_in``: the gradient inbox slot a backward reads, ``-1`` = the loss's gradient (last stage);
      ``recv_act`` / ``recv_grad``: the inbox slot where what arrives this tick is kept, ``-1``
        = nothing arrives for this device;
    and the sizes ``n_stash``, ``n_act_inbox``, ``n_grad_inbox`` (at least 1 each).

    Raises:
      ValueError: a schedule with a split backward (``W``), or whose routes do not step one
        device up the ring (``d -> d+1 mod S``) per stage, as one pair of ``ppermute``s does.
    """
    s = _schedule("executor_tables", schedule)
    _check_executable(s)
    S, T = s.n_stages, s.ticks
    when = _op_ticks(s)
    z = np.full((S, T), -1, dtype=np.int32)
    out = {k: z.copy() for k in ("stash", "act_in", "grad_in", "recv_act", "recv_grad")}
    out["op"] = np.where(s.phase == IDLE, 0, s.phase + 1).astype(np.int32)
    out["micro"] = np.maximum(s.micro, 0).astype(np.int32)
    out["chunk"] = np.maximum(s.chunk, 0).astype(np.int32)
    sizes = {}
    for name in ("stash", "act", "grad"):
        sizes[name] = 1
        for d in range(S):
            iv = _held_intervals(s, when, name, d)
            slot, n = _slots(iv)
            sizes[name] = max(sizes[name], n)
            _write_slots(out, when, name, d, iv, slot)
    out["n_stash"], out["n_act_inbox"], out["n_grad_inbox"] = (
        sizes["stash"], sizes["act"], sizes["grad"])  # fmt: skip
    return out


def _check_executable(s: PipelineSchedule) -> None:
    """Refuse a split backward, and routes that do not step one device up the ring."""
    S = s.n_stages
    if (s.phase == WEIGHT_GRAD).any():
        raise ValueError("executor_tables: the executor runs a whole backward per op; this "
                         f"schedule ({s.name}) splits it into B and W.")  # fmt: skip
    for m, r in enumerate(s.route):
        if any(r[p + 1][0] != (r[p][0] + 1) % S for p in range(len(r) - 1)):
            raise ValueError(f"executor_tables: micro-batch {m}'s route {r} does not step to "
                             "the next device of the ring at every stage.")  # fmt: skip


def _op_ticks(s: PipelineSchedule) -> dict[tuple[int, int, int, int], int]:
    """The tick of each op, keyed by (phase, device, chunk, micro-batch)."""
    when: dict[tuple[int, int, int, int], int] = {}
    for d in range(s.n_stages):
        for t in range(s.ticks):
            if s.phase[d, t] != IDLE:
                when[(int(s.phase[d, t]), d, int(s.chunk[d, t]), int(s.micro[d, t]))] = t
    return when


def _held_intervals(
    s: PipelineSchedule, when: dict[tuple[int, int, int, int], int], name: str, d: int
) -> list[tuple[int, int, tuple[int, int]]]:
    """Device ``d``'s (first tick, last tick, (chunk, micro)) for each thing ``name`` keeps.

    ``stash``: from the forward to its backward; ``act``: from the tick after the previous
    stage's forward to this forward; ``grad``: from the tick after the next stage's backward
    to this backward.
    """
    iv = []
    for m, r in enumerate(s.route):
        for p, (dd, c) in enumerate(r):
            if dd != d:
                continue
            f, b = when[(FORWARD, d, c, m)], when[(BACKWARD, d, c, m)]
            if name == "stash":
                iv.append((f, b, (c, m)))
            elif name == "act" and p > 0:
                iv.append((when[(FORWARD, *r[p - 1], m)] + 1, f, (c, m)))
            elif name == "grad" and p < len(r) - 1:
                iv.append((when[(BACKWARD, *r[p + 1], m)] + 1, b, (c, m)))
    return iv


def _write_slots(
    out: dict[str, Any],
    when: dict[tuple[int, int, int, int], int],
    name: str,
    d: int,
    iv: list[tuple[int, int, tuple[int, int]]],
    slot: dict[Any, int],
) -> None:
    """Write device ``d``'s slots for ``name`` into the tables at the ticks that use them."""
    for start, _end, (c, m) in iv:
        f, b = when[(FORWARD, d, c, m)], when[(BACKWARD, d, c, m)]
        if name == "stash":
            out["stash"][d, f] = out["stash"][d, b] = slot[(c, m)]
        elif name == "act":
            out["act_in"][d, f] = out["recv_act"][d, start] = slot[(c, m)]
        else:
            out["grad_in"][d, b] = out["recv_grad"][d, start] = slot[(c, m)]


def stage_layout(n_layers: int, n_stages: int, n_chunks: int = 1) -> np.ndarray:
    """Which layer sits where: ``(n_stages, n_chunks, layers_per_chunk)`` layer indices.

    Chunk ``c`` of device ``d`` is virtual stage ``k = c·S + d`` and holds the consecutive
    layers ``k·Lc ... (k+1)·Lc - 1`` (``Lc = n_layers / (S·v)``): the circular layout of
    interleaved schedules. ``stacked[stage_layout(...)]`` turns ``(L, ...)`` layers into
    ``(S, v, Lc, ...)``; ``np.argsort(stage_layout(...).ravel())`` undoes it.
    """
    L = _whole("stage_layout", "n_layers", n_layers)
    S = _whole("stage_layout", "n_stages", n_stages)
    v = _whole("stage_layout", "n_chunks", n_chunks)
    if L % (S * v):
        raise ValueError(f"stage_layout: n_layers={L} must be a multiple of n_stages x n_chunks "
                         f"= {S} x {v}.")  # fmt: skip
    return np.arange(L).reshape(v, S, L // (S * v)).swapaxes(0, 1)
