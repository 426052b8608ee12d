"""Collectives by hand: which device holds which block, what each one costs, pipeline schedules.

Notebook 07 writes the five collectives of ``jax.lax`` out by hand inside ``jax.shard_map``
and checks them three ways; this module holds the parts that are not the lesson itself:

- **Blocks you can read back.** ``tag_blocks`` makes an array whose rows say where they
  came from: device ``d``'s chunk ``c`` is a row of ``n`` numbers, all 0 but ``c + 1`` in
  column ``d``. Sums stay readable: each device adds into its own column, so
  ``read_blocks`` recovers the chunk and the set of devices that went into it, and
  refuses a row that adds different chunks (``(1, 2, 3)`` is chunk a of device 0, b of
  device 1 and c of device 2: a wrong sum, whatever its total).
  ``blocks_by_device`` reads every device's rows from the shards of a real array.
- **The textbook answer.** ``expected_blocks`` says, from the definition alone, which
  blocks each device holds before and after each collective, to compare with what ran;
  ``ring_all_gather_rounds`` what each device holds after each round of the ring that
  runs an all-gather.
- **Closed forms.** ``ring_bytes`` gives the bytes one device sends under the
  bandwidth-optimal ring algorithms, the number printed beside what the compiled HLO moves.
- **Pipelines.** ``gpipe_schedule`` (which stage works on which micro-batch at which
  tick), ``bubble_fraction`` of a schedule and ``gpipe_bubble``'s closed form.
- **HLO order.** ``hlo_op_sequence`` lists the matmuls and collectives of a compiled
  program in the order it runs them.

Nothing here draws (``helpers.drawing.draw_comm`` does) or runs a collective itself.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "COLLECTIVES",
    "HLO_NAME",
    "Block",
    "blocks_by_device",
    "bubble_fraction",
    "chunks_for",
    "expected_blocks",
    "gpipe_bubble",
    "gpipe_schedule",
    "hlo_op_sequence",
    "read_blocks",
    "ring_all_gather_rounds",
    "ring_bytes",
    "tag_blocks",
]

# The five collectives of jax.lax that notebook 07 teaches, and their HLO op names.
COLLECTIVES = ("psum", "all_gather", "psum_scatter", "ppermute", "all_to_all")
HLO_NAME = {
    "psum": "all-reduce",
    "all_gather": "all-gather",
    "psum_scatter": "reduce-scatter",
    "ppermute": "collective-permute",
    "all_to_all": "all-to-all",
}
_MAX_DEVICES = 256  # rows are n_devices wide: a bound on what a demo allocates


def _check_collective(collective: str, where: str) -> None:
    if collective not in COLLECTIVES:
        raise ValueError(f"{where}: collective={collective!r} is not one of {COLLECTIVES}.")


def _check_count(n_devices: Any, where: str, name: str = "n_devices") -> int:
    if isinstance(n_devices, bool) or not isinstance(n_devices, (int, np.integer)):
        raise ValueError(f"{where}: {name}={n_devices!r} must be a whole number of devices.")
    if not 1 <= n_devices <= _MAX_DEVICES:
        raise ValueError(f"{where}: {name}={n_devices} must be between 1 and {_MAX_DEVICES}.")
    return int(n_devices)


# ---------------------------------------------------------------------------
# Blocks: tagged data that says where it came from
# ---------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Block:
    """One row of tagged data: chunk ``chunk`` of every device in ``sources``, added up.

    A block copied from one device has one source; after a ``psum`` it has all of them.
    """

    chunk: int
    sources: tuple[int, ...]

    def label(self, n_devices: int | None = None) -> str:
        """``"a3"``: chunk a of device 3; ``"Σb"``: chunk b summed over all ``n_devices``;
        ``"c0+1"`` or ``"c0..4"`` for a partial sum (as a ring's steps make)."""
        letter = _chunk_letter(self.chunk)
        s = self.sources
        if len(s) == 1:
            return f"{letter}{s[0]}"
        if n_devices is not None and s == tuple(range(n_devices)):
            return f"Σ{letter}"
        if len(s) == 2:
            return f"{letter}{s[0]}+{s[1]}"
        if s == tuple(range(s[0], s[-1] + 1)):
            return f"{letter}{s[0]}..{s[-1]}"
        return f"{letter}{{{','.join(map(str, s))}}}"


def _chunk_letter(chunk: int) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return letters[chunk] if chunk < len(letters) else f"#{chunk}"


def chunks_for(collective: str, n_devices: int) -> int:
    """How many chunks each device's block has in notebook 07's demo of ``collective``.

    ``psum``, ``psum_scatter`` and ``all_to_all`` act chunk by chunk over ``n_devices``
    chunks; ``all_gather`` and ``ppermute`` move one whole block.
    """
    _check_collective(collective, "chunks_for")
    n = _check_count(n_devices, "chunks_for")
    return n if collective in ("psum", "psum_scatter", "all_to_all") else 1


def tag_blocks(n_devices: int, chunks: int) -> np.ndarray:
    """A ``(n_devices * chunks, n_devices)`` float32 array of tags.

    Device ``d``'s chunk ``c`` is the row that is 0 everywhere but ``c + 1`` in column ``d``.
    Split over a mesh axis of ``n_devices`` (``PartitionSpec(axis)``), device ``d`` holds
    rows ``d * chunks ... (d + 1) * chunks - 1``: its own ``chunks`` chunks.
    """
    n = _check_count(n_devices, "tag_blocks")
    if isinstance(chunks, bool) or not isinstance(chunks, (int, np.integer)) or chunks < 1:
        raise ValueError(f"tag_blocks: chunks={chunks!r} must be a positive whole number.")
    rows = np.zeros((n * int(chunks), n), dtype=np.float32)
    for d in range(n):
        for c in range(int(chunks)):
            rows[d * int(chunks) + c, d] = c + 1
    return rows


def read_blocks(rows: Any) -> tuple[Block, ...]:
    """The ``Block`` of every row of tagged data (shape ``(k, n_devices)``), in row order.

    A row's non-zero columns are the devices that went into it; each holds its chunk + 1.

    Raises:
      ValueError: ``rows`` is not 2-D, or a row is not a sum of one chunk's tags: no
        non-zero column, a value that is not a positive whole number, or columns that
        hold different chunks (a sum that mixed chunks, whatever its total).
    """
    a = np.asarray(rows, dtype=np.float64)
    if a.ndim != 2 or a.shape[1] < 1:
        raise ValueError(
            f"read_blocks: rows must be 2-D (k, n_devices) as tag_blocks makes them; got {a.shape}."
        )
    out = []
    for i, row in enumerate(a):
        sources = tuple(int(d) for d in np.flatnonzero(np.abs(row) > 1e-3))
        values = row[list(sources)]
        shown = "(" + ", ".join(f"{v:g}" for v in row) + ")"
        if not sources or np.any(np.abs(values - np.round(values)) > 1e-3) or np.any(values < 1):
            raise ValueError(
                f"read_blocks: row {i} = {shown} is not tagged data: its non-zero columns "
                "must hold chunk + 1, a positive whole number."
            )
        chunks = {int(round(v)) - 1 for v in values}
        if len(chunks) != 1:
            raise ValueError(
                f"read_blocks: row {i} = {shown} adds different chunks of devices "
                f"{list(sources)}: a sum of tagged data must add one chunk."
            )
        out.append(Block(chunks.pop(), sources))
    return tuple(out)


def blocks_by_device(array: Any) -> dict[int, tuple[Block, ...]]:
    """What each device holds of a tagged ``jax.Array``: device id -> its blocks, in id order.

    Reads the array's ``addressable_shards``, so the answer is where the data really is.
    Give it the output of a ``shard_map`` with ``out_specs=PartitionSpec(axis)``: each
    device's local result is then its own shard.
    """
    shards = getattr(array, "addressable_shards", None)
    if shards is None:
        raise ValueError(
            f"blocks_by_device: expected a placed jax.Array, got {type(array).__name__}."
        )
    held = {int(s.device.id): read_blocks(np.asarray(s.data)) for s in shards}
    return {d: held[d] for d in sorted(held)}


def expected_blocks(
    collective: str, n_devices: int
) -> tuple[dict[int, tuple[Block, ...]], dict[int, tuple[Block, ...]]]:
    """Which blocks device ``0 .. n_devices-1`` holds before and after ``collective``.

    Before, device ``d`` holds its own ``chunks_for(collective, n)`` chunks. After:
      ``psum``: every device, every chunk summed over all devices;
      ``all_gather``: every device, every device's block, in device order;
      ``psum_scatter``: device ``d``, chunk ``d`` summed over all devices;
      ``ppermute`` (a shift by one, ``d -> d+1``): device ``d``, device ``d-1``'s block;
      ``all_to_all``: device ``d``, chunk ``d`` of every device, in device order.
    """
    _check_collective(collective, "expected_blocks")
    n = _check_count(n_devices, "expected_blocks")
    everyone = tuple(range(n))
    c = chunks_for(collective, n)
    before = {d: tuple(Block(k, (d,)) for k in range(c)) for d in range(n)}
    if collective == "psum":
        after = {d: tuple(Block(k, everyone) for k in range(c)) for d in range(n)}
    elif collective == "all_gather":
        after = {d: tuple(Block(0, (s,)) for s in range(n)) for d in range(n)}
    elif collective == "psum_scatter":
        after = {d: (Block(d, everyone),) for d in range(n)}
    elif collective == "ppermute":
        after = {d: (Block(0, ((d - 1) % n,)),) for d in range(n)}
    else:  # all_to_all
        after = {d: tuple(Block(d, (s,)) for s in range(n)) for d in range(n)}
    return before, after


def ring_all_gather_rounds(n_devices: int) -> list[dict[int, tuple[Block, ...]]]:
    """What each device holds before and after each round of the ring all-gather.

    The devices form a ring, ``d`` sending to ``d+1`` (the last to device 0). In round
    ``k`` (1 .. ``n_devices - 1``) every device passes on the block it received in round
    ``k - 1`` (in round 1, its own): device ``d`` receives device ``(d - k) % n``'s block.
    Each device sends one block per round, ``n - 1`` blocks in all: ``ring_bytes``'s
    ``b·(n-1)``.

    Returns ``n_devices`` layouts (device id -> its blocks, in source order): entry 0 is
    before the first round, entry ``k`` after round ``k``; the last is
    ``expected_blocks("all_gather", n)[1]``.
    """
    n = _check_count(n_devices, "ring_all_gather_rounds")
    rounds = []
    for k in range(n):
        rounds.append(
            {
                d: tuple(Block(0, (s,)) for s in sorted((d - j) % n for j in range(k + 1)))
                for d in range(n)
            }  # fmt: skip
        )
    return rounds


# ---------------------------------------------------------------------------
# Closed forms: bytes one device sends
# ---------------------------------------------------------------------------


def ring_bytes(collective: str, block_bytes: float, n_devices: int) -> float:
    """Bytes one device sends for ``collective``, with ``block_bytes`` on each device before it.

    The bandwidth-optimal algorithms (a ring for the first three):
      ``psum`` (all-reduce) ``2·b·(n-1)/n``: a reduce-scatter, then an all-gather;
      ``all_gather`` ``b·(n-1)``: ``n-1`` rounds, each passing one block to the next
        device (``ring_all_gather_rounds``);
      ``psum_scatter`` (reduce-scatter) ``b·(n-1)/n``: ``n-1`` partial sums of ``b/n``;
      ``ppermute`` ``b``: its block, once (0 on one device, where it sends to itself);
      ``all_to_all`` ``b·(n-1)/n``: a different ``1/n`` of its block to each of the others.
    """
    _check_collective(collective, "ring_bytes")
    n = _check_count(n_devices, "ring_bytes")
    if not isinstance(block_bytes, (int, float, np.integer, np.floating)) or block_bytes < 0:
        raise ValueError(f"ring_bytes: block_bytes={block_bytes!r} must be a number >= 0.")
    b = float(block_bytes)
    if n == 1:
        return 0.0
    return {
        "psum": 2 * b * (n - 1) / n,
        "all_gather": b * (n - 1),
        "psum_scatter": b * (n - 1) / n,
        "ppermute": b,
        "all_to_all": b * (n - 1) / n,
    }[collective]


# ---------------------------------------------------------------------------
# Pipeline schedules
# ---------------------------------------------------------------------------


def gpipe_schedule(n_stages: int, n_micro: int) -> np.ndarray:
    """GPipe's forward schedule: ``(n_stages, n_micro + n_stages - 1)`` ints.

    Entry ``[s, t]`` is the micro-batch that stage ``s`` works on at tick ``t``, or ``-1``
    when it idles: micro-batch ``m`` enters stage 0 at tick ``m`` and reaches stage ``s`` at
    tick ``m + s``.
    """
    for name, v in (("n_stages", n_stages), ("n_micro", n_micro)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"gpipe_schedule: {name}={v!r} must be a positive whole number.")
    ticks = n_micro + n_stages - 1
    t = np.arange(ticks)[None, :]
    s = np.arange(n_stages)[:, None]
    m = t - s
    return np.where((m >= 0) & (m < n_micro), m, -1).astype(int)


def bubble_fraction(schedule: Any) -> float:
    """The idle share of a schedule: idle (stage, tick) cells over all cells (``-1`` = idle)."""
    a = np.asarray(schedule)
    if a.ndim != 2 or a.size == 0:
        raise ValueError(
            f"bubble_fraction: schedule must be a 2-D (stages, ticks) array; got shape {a.shape}."
        )
    return float(np.mean(a < 0))


def gpipe_bubble(n_stages: int, n_micro: int) -> float:
    """GPipe's bubble by formula: ``(S - 1) / (M + S - 1)`` for ``S`` stages, ``M`` micro-batches."""
    gpipe_schedule(n_stages, n_micro)  # validates
    return (n_stages - 1) / (n_micro + n_stages - 1)


# ---------------------------------------------------------------------------
# HLO: matmuls and collectives in the order a compiled program runs them
# ---------------------------------------------------------------------------

_COMPUTATION = re.compile(r"^\s*(ENTRY\s+)?%?([\w.\-]+)\s*(\([^)]*\))?.*\{\s*$")
_OP = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*.+?\s([a-z][a-z0-9\-]*)\((.*)$")
_CALLS = re.compile(r"calls=%?([\w.\-]+)")
_SHOWN = {
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "all-reduce-start",
    "all-gather-start",
    "collective-permute-start",
    "all-reduce-done",
    "all-gather-done",
    "collective-permute-done",
}
#: Other HLO ops counted as an op of ``include``: XLA:TPU writes a matmul (``dot_general``)
#: as a ``convolution`` inside a fusion (seen in libtpu 0.0.42.1's programs).
_SAME_AS = {"dot": ("convolution",)}


def hlo_op_sequence(compiled: Any, include: Sequence[str] = ("dot",)) -> list[str]:
    """The collectives and the ops in ``include`` of a compiled program's entry computation,
    in the order of its (scheduled) HLO text.

    A fusion counts as ``"dot"`` when its fused computation holds one, as XLA's CPU backend
    wraps every matmul in a fusion; a ``convolution``, alone or fused, counts as ``"dot"``
    too, as XLA:TPU writes a matmul as one. Accepts the compiled object or its ``as_text()``.

    Raises:
      TypeError: ``compiled`` is neither a string nor has ``as_text()`` (``jit(f).lower(...)
        .compile()`` does), or ``include`` is a string instead of a sequence of op names.
      ValueError: the text holds no HLO entry computation.
    """
    if not isinstance(compiled, str) and not callable(getattr(compiled, "as_text", None)):
        raise TypeError(
            f"hlo_op_sequence: compiled={compiled!r} is a {type(compiled).__name__}; expected a "
            "compiled executable (jax.jit(f).lower(...).compile()) or its as_text() string."
        )
    if isinstance(include, str):
        raise TypeError(
            f"hlo_op_sequence: include={include!r} is a string; pass a sequence of op names, "
            f"such as ({include!r},)."
        )
    text = compiled if isinstance(compiled, str) else compiled.as_text()
    if not isinstance(text, str) or "ENTRY" not in text:
        raise ValueError("hlo_op_sequence: expected a compiled executable or its HLO text.")
    bodies, entry = _hlo_computations(text)
    seq = []
    for ln in bodies.get(entry or "", []):
        m = _OP.match(ln)
        if not m:
            continue
        op = m.group(1)
        if op in _SHOWN or op in include:
            seq.append(op)
            continue
        as_op = [w for w in include if op in _SAME_AS.get(w, ())]
        if as_op:
            seq.append(as_op[0])
        elif op == "fusion":
            called = _CALLS.search(ln)
            for want in include:
                names = (want, *_SAME_AS.get(want, ()))
                if called and any(_calls_op(bodies, called.group(1), n) for n in names):
                    seq.append(want)
                    break
    return seq


def _hlo_computations(text: str) -> tuple[dict[str, list[str]], str | None]:
    """Each computation's body lines in HLO ``text``, and the entry computation's name."""
    bodies: dict[str, list[str]] = {}
    entry, current = None, None
    for line in text.splitlines():
        head = _COMPUTATION.match(line)
        if head and "=" not in line.split("{")[0]:
            current = head.group(2)
            bodies[current] = []
            if head.group(1):
                entry = current
            continue
        if current is not None:
            if line.strip() == "}":
                current = None
            else:
                bodies[current].append(line)
    return bodies, entry


def _calls_op(bodies: dict[str, list[str]], name: str, op: str, depth: int = 0) -> bool:
    """Whether computation ``name`` holds ``op``, itself or in what it calls (4 levels)."""
    for ln in bodies.get(name, []):
        m = _OP.match(ln)
        if not m:
            continue
        if m.group(1) == op:
            return True
        called = _CALLS.search(ln)
        if called and depth < 4 and _calls_op(bodies, called.group(1), op, depth + 1):
            return True
    return False
