"""Figures of communication: a collective's before and after, the rounds of a ring, and a
pipeline's schedule.

They keep the series' one rule: device ``d`` has the colour ``device_color(d)`` in every
figure. In ``draw_collective`` a block is coloured by the device it came from (a sum of
several devices' blocks gets stripes of all their colours, as ``draw_sharding`` draws a
block held by several devices); in ``draw_pipeline_schedule`` a cell is coloured by the
device of the stage that works in it.

Both follow matplotlib's advice for plotting helpers: they take ``ax``/``axes`` (or make
a figure), return what they drew on and never call ``plt.show()``. Nothing here runs a
collective: the blocks come from ``helpers.parallelism.collectives`` (``blocks_by_device`` reads them
off a real array, ``expected_blocks`` from the definition), the schedules from a run or
from ``gpipe_schedule``.

Artists carry ``gid`` strings that tests (and curious readers) can check:
``"block:panel=<before|after>:device=<d>:slot=<k>:chunk=<c>:sources=<s0,s1,...>"`` and
``"cell:stage=<s>:tick=<t>:micro=<m>"`` (``micro=-1`` for an idle cell), and in
``draw_ring_rounds`` ``"ring:round=<k>:device=<d>:source=<s>:new=<0|1>"``.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator

from helpers.drawing.draw import (
    _axes_size_pt,
    _diagonal_stripes,
    _fit_fontsize,
    _new_figure,
    _text_color,
    device_color,
)
from helpers.parallelism.collectives import Block, bubble_fraction
from helpers.parallelism.schedules import (
    BACKWARD,
    FORWARD,
    IDLE,
    WEIGHT_GRAD,
    PipelineSchedule,
    Timeline,
    in_flight,
)

__all__ = ["draw_collective", "draw_in_flight", "draw_pipeline_schedule", "draw_ring_rounds"]

Layout = Mapping[int, Sequence[Block]]

#: The widest figure these functions make, in inches: a notebook's column shows a figure this
#: wide at its own size (100 dpi), so text drawn at 9 pt reads as 9 pt.
MAX_FIGURE_WIDTH = 9.0


def _check_layout(layout: Any, name: str) -> dict[int, tuple[Block, ...]]:
    if not isinstance(layout, Mapping) or not layout:
        raise ValueError(
            f"draw_collective: {name} must be a non-empty dict device id -> blocks, as "
            f"blocks_by_device or expected_blocks return; got {type(layout).__name__}."
        )
    out = {}
    for d, blocks in layout.items():
        if not all(isinstance(b, Block) for b in blocks):
            raise ValueError(f"draw_collective: {name}[{d}] must hold Block objects only.")
        out[int(d)] = tuple(blocks)
    return out


def _draw_layout(
    ax: Axes, layout: dict[int, tuple[Block, ...]], panel: str, title: str, n: int, width: int
) -> None:
    devices = sorted(layout)
    rows = len(devices)
    ax.set_xlim(-1.9, width + 0.1)
    ax.set_ylim(rows + 0.05, -0.05)
    ax.set_aspect("equal")
    ax.set_axis_off()
    w_pt, _ = _axes_size_pt(ax)
    cell_pt = w_pt / (width + 2.0)
    size = float(np.clip(cell_pt * 0.34, 5.5, 12.0))
    for r, d in enumerate(devices):
        face = device_color(d)
        ax.add_patch(
            Rectangle((-1.85, r + 0.08), 1.65, 0.84, facecolor=face, edgecolor="white",
                      gid=f"device:{d}")
        )  # fmt: skip
        ax.text(-1.025, r + 0.5, f"dev {d}", ha="center", va="center", fontsize=size,
                fontweight="bold", color=_text_color(face))  # fmt: skip
        for k, b in enumerate(layout[d]):
            gid = (
                f"block:panel={panel}:device={d}:slot={k}:chunk={b.chunk}:"
                f"sources={','.join(map(str, b.sources))}"
            )
            x0, y0, w, h = k + 0.06, r + 0.08, 0.88, 0.84
            if len(b.sources) == 1:
                face = device_color(b.sources[0])
                ax.add_patch(Rectangle((x0, y0), w, h, facecolor=face, edgecolor="white", gid=gid))
                ink, box = _text_color(face), None
            else:
                outline = Rectangle((x0, y0), w, h, facecolor="none", edgecolor="0.35",
                                    linewidth=0.8, zorder=1.5, gid=gid)  # fmt: skip
                ax.add_patch(outline)
                _diagonal_stripes(ax, outline, (x0, y0, w, h), list(b.sources), cell_pt,
                                  cell_pt, width_pt=max(2.0, cell_pt / 8))  # fmt: skip
                ink = "black"
                box = {"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "0.5",
                       "alpha": 0.95}  # fmt: skip
            label = b.label(n)
            fs = size if len(label) <= 3 else size * 3.2 / len(label)
            ax.text(x0 + w / 2, y0 + h / 2, label, ha="center", va="center", fontsize=fs,
                    fontweight="bold", color=ink, bbox=box, gid=f"label:{label}")  # fmt: skip
    ax.set_title(title, fontsize=11)


def draw_collective(
    before: Layout,
    after: Layout,
    *,
    title: str | None = None,
    n_devices: int | None = None,
    axes: Sequence[Axes] | None = None,
) -> Figure:
    """Which device holds which block, before (left) and after (right) a collective.

    One row per device; each square is one block, labelled ``a3`` (chunk a of device 3,
    in device 3's colour) or ``Σa`` (chunk a summed over all devices, in stripes of their
    colours); ``a0+1`` or ``a0..4`` is a partial sum.

    Args:
      before, after: device id -> its blocks, as ``blocks_by_device`` (read off a real
        array) or ``expected_blocks`` (the definition) return.
      title: the figure's title, e.g. the collective and its one-line definition.
      n_devices: how many devices "all" is, for the ``Σ`` label (default: the rows).
      axes: two Axes to draw on; a new figure is made when ``None``.

    Returns:
      The Figure. Blocks are ``Rectangle`` patches with a ``gid`` (see the module doc).
    """
    b = _check_layout(before, "before")
    a = _check_layout(after, "after")
    n = len(b) if n_devices is None else int(n_devices)
    width = max(1, max(len(v) for v in (*b.values(), *a.values())))
    if axes is None:
        rows = max(len(b), len(a))
        fig = _new_figure((min(15.0, 1.6 + 0.62 * 2 * (width + 2)), 1.3 + 0.58 * rows))
        ax_b, ax_a = fig.subplots(1, 2)
    else:
        if len(axes) != 2:
            raise ValueError(f"draw_collective: axes must be two Axes, got {len(axes)}.")
        ax_b, ax_a = axes
        fig = ax_b.figure
    _draw_layout(ax_b, b, "before", "before", n, width)
    _draw_layout(ax_a, a, "after", "after", n, width)
    if title:
        fig.suptitle(title, fontsize=12)
    return fig


#: The device names' column in ``draw_ring_rounds``' first panel of a row, and the gap
#: before a later panel, in blocks.
_RING_LABEL_CELLS, _RING_GAP_CELLS = 1.6, 0.45


def _ring_panel(
    ax: Axes,
    held: dict[int, tuple[Block, ...]],
    new: dict[int, set[int]],
    k: int,
    n: int,
    labels: bool,
) -> None:
    """One round of ``draw_ring_rounds``: a row per device, a column per source device; the
    devices' names only where ``labels`` (the first panel of a row of panels)."""
    ax.set_xlim(-_RING_LABEL_CELLS if labels else -_RING_GAP_CELLS, n)
    ax.set_ylim(n, -0.05)
    ax.set_aspect("equal")
    ax.set_axis_off()
    for d in range(n):
        if labels:
            ax.text(-0.15, d + 0.5, f"dev {d}", ha="right", va="center", fontsize=9)
        sources = {b.sources[0] for b in held[d]}
        for s in range(n):
            gid = f"ring:round={k}:device={d}:source={s}:new={int(s in new[d])}"
            if s not in sources:
                ax.add_patch(Rectangle((s + 0.06, d + 0.06), 0.88, 0.88, facecolor="white",
                                       edgecolor="0.8", linewidth=0.8, gid=gid))  # fmt: skip
                continue
            face = device_color(s)
            fresh = s in new[d]
            ax.add_patch(Rectangle((s + 0.06, d + 0.06), 0.88, 0.88, facecolor=face,
                                   edgecolor="black" if fresh else "white",
                                   linewidth=2.2 if fresh else 0.8, zorder=2 if fresh else 1,
                                   gid=gid))  # fmt: skip
            ax.text(s + 0.5, d + 0.5, f"a{s}", ha="center", va="center", fontsize=9,
                    fontweight="bold", color=_text_color(face))  # fmt: skip


def draw_ring_rounds(
    rounds: Sequence[Layout], *, title: str | None = None, ncols: int = 4
) -> Figure:
    """Each round of a ring all-gather: one panel per round, blocks in their source's colour.

    In a panel, row ``d`` is device ``d`` and column ``s`` the block that came from device
    ``s`` (``a3``: device 3's block); an empty square is a block not received yet, and a
    thick black edge marks the block that arrived in that round.

    Args:
      rounds: the layouts before and after each round, as ``ring_all_gather_rounds``
        returns them (entry 0 before the first round); every layout holds one-source
        blocks of chunk 0 only.
      title: the figure's title.
      ncols: the most panels in a row of the figure; fewer where more would make the
        figure wider than ``MAX_FIGURE_WIDTH`` (only the first panel of a row names the
        devices).

    Returns:
      The Figure. Each square is a ``Rectangle`` with a ``gid`` (see the module doc).
    """
    if not rounds:
        raise ValueError("draw_ring_rounds: rounds must hold at least the layout before round 1.")
    layouts = [_check_layout(r, f"rounds[{k}]") for k, r in enumerate(rounds)]
    n = len(layouts[0])
    for k, lay in enumerate(layouts):
        if sorted(lay) != list(range(n)) or any(
            len(b.sources) != 1 or b.chunk != 0 or not 0 <= b.sources[0] < n
            for blocks in lay.values()
            for b in blocks
        ):
            raise ValueError(
                f"draw_ring_rounds: rounds[{k}] must map devices 0..{n - 1} to whole blocks "
                "of one source device each, as ring_all_gather_rounds returns them."
            )
    if isinstance(ncols, bool) or not isinstance(ncols, int) or ncols < 1:
        raise ValueError(f"draw_ring_rounds: ncols={ncols!r} must be a positive whole number.")
    cell = 0.25  # inches per block: its label, 9 pt, fits it
    first_w = max((n + _RING_LABEL_CELLS + 0.1) * cell, 1.3)  # the panel with the devices' names
    other_w = max((n + _RING_GAP_CELLS) * cell, 1.0)
    fit = 1 + int((MAX_FIGURE_WIDTH - 0.2 - first_w) // other_w)  # panels a row holds
    cols = max(1, min(ncols, len(layouts), fit))
    rows = -(-len(layouts) // cols)
    panel_h, head = n * cell + 0.05, 0.32
    widths = [first_w] + [other_w] * (cols - 1)
    fw = sum(widths) + 0.2
    lines = textwrap.wrap(title, width=max(20, int(fw * 11))) if title else []
    top = 0.12 + 0.22 * len(lines)
    fig = _new_figure((fw, top + rows * (panel_h + head) + 0.1))
    fh = fig.get_size_inches()[1]
    axes = []
    for i in range(rows * cols):
        r, c = divmod(i, cols)
        y0 = fh - top - (r + 1) * (panel_h + head) + 0.05
        x0 = 0.1 + sum(widths[:c])
        axes.append(fig.add_axes((x0 / fw, y0 / fh, widths[c] / fw, panel_h / fh)))
    for k, lay in enumerate(layouts):
        prev = layouts[k - 1] if k else {d: () for d in range(n)}
        new = {
            d: {b.sources[0] for b in lay[d]} - {b.sources[0] for b in prev[d]} for d in range(n)
        }
        _ring_panel(axes[k], lay, new if k else {d: set() for d in range(n)}, k, n, k % cols == 0)
        label = "before" if k == 0 else f"after round {k}"
        axes[k].set_title(label, fontsize=10)
    for ax in axes[len(layouts) :]:
        ax.set_axis_off()
    if lines:
        fig.suptitle("\n".join(lines), fontsize=11, y=1 - 0.08 / fh, va="top")
    return fig


def draw_pipeline_schedule(
    schedule: Any,
    *,
    title: str | None = None,
    stage_devices: Sequence[int] | None = None,
    ax: Axes | None = None,
    span: float | None = None,
) -> Axes:
    """A pipeline's schedule: one row per stage, one column per tick.

    A busy cell has its stage's device colour and the micro-batch's number; an idle cell
    (the bubble) is pale grey, lighter than any device's colour (device 7's is a mid grey), and
    has no number. The title gives the bubble fraction unless ``title`` is set.

    Args:
      schedule: ``(stages, ticks)`` ints, the micro-batch each stage works on at each
        tick or ``-1`` when it idles (``gpipe_schedule``, or what a run recorded); or a
        ``PipelineSchedule`` (``helpers.parallelism.schedules``), drawn with forward cells solid,
        backward cells hatched, weight-gradient cells outlined, and, when a device holds
        several model chunks, the chunk as a letter after the micro-batch (``3b``); or a
        ``Timeline`` (``helpers.parallelism.schedules.timeline``): the same cells, each at its
        start time and as wide as its op lasts, on an axis of time.
      stage_devices: the device of each stage (default: stage ``s`` on device ``s``).
      ax: the Axes to draw on; a new figure is made when ``None``.
      span: for a ``PipelineSchedule`` or a ``Timeline``, the length of the x-axis (ticks or
        time), so that schedules drawn one above another share one scale (default: the
        schedule's own length).

    For a ``PipelineSchedule`` or a ``Timeline``, the numbers in the cells are at least 9 pt;
    a new figure is at most ``MAX_FIGURE_WIDTH`` wide. Where a cell is too narrow for its
    label, a chunk's letter goes under the number, and where even that does not fit the
    label is left out and the title says so.
    """
    if isinstance(schedule, (PipelineSchedule, Timeline)):
        return _draw_table(schedule, title=title, stage_devices=stage_devices, ax=ax, span=span)
    a = np.asarray(schedule)
    if a.ndim != 2 or a.size == 0 or not np.issubdtype(a.dtype, np.integer):
        raise ValueError(
            "draw_pipeline_schedule: schedule must be a 2-D integer (stages, ticks) array "
            f"(micro-batch or -1); got shape {a.shape}, dtype {a.dtype}."
        )
    stages, ticks = a.shape
    devs = list(range(stages)) if stage_devices is None else [int(d) for d in stage_devices]
    if len(devs) != stages:
        raise ValueError(
            f"draw_pipeline_schedule: stage_devices has {len(devs)} entries for {stages} stages."
        )
    if ax is None:
        width = min(MAX_FIGURE_WIDTH, 1.8 + 0.36 * ticks)
        ax = _new_figure((width, 1.2 + 0.42 * stages)).add_subplot()
    ax.set_xlim(0, ticks)
    ax.set_ylim(stages, 0)
    w_pt, h_pt = _axes_size_pt(ax)
    cell = min(w_pt / ticks, h_pt / stages)
    size = float(np.clip(cell * 0.42, 4.5, 10.0))
    for s in range(stages):
        for t in range(ticks):
            m = int(a[s, t])
            gid = f"cell:stage={s}:tick={t}:micro={m}"
            if m < 0:
                ax.add_patch(Rectangle((t, s), 1, 1, facecolor="0.93", edgecolor="white",
                                       linewidth=0.8, gid=gid))  # fmt: skip
                continue
            face = device_color(devs[s])
            ax.add_patch(Rectangle((t, s), 1, 1, facecolor=face, edgecolor="white",
                                   linewidth=0.8, gid=gid))  # fmt: skip
            ax.text(t + 0.5, s + 0.5, str(m), ha="center", va="center", fontsize=size,
                    color=_text_color(face), fontweight="bold")  # fmt: skip
    ax.set_yticks([s + 0.5 for s in range(stages)])
    ax.set_yticklabels([f"stage {s} (dev {d})" for s, d in enumerate(devs)], fontsize=9)
    step = max(1, int(np.ceil(ticks / 20)))
    ax.set_xticks([t + 0.5 for t in range(0, ticks, step)])
    ax.set_xticklabels([str(t) for t in range(0, ticks, step)], fontsize=9)
    ax.set_xlabel("tick (one block of work per stage)", fontsize=9)
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    n_micro = int(a.max()) + 1 if (a >= 0).any() else 0
    ax.set_title(
        title
        or f"{stages} stage{'s' * (stages != 1)}, {n_micro} micro-batch{'es' * (n_micro != 1)}: "
        f"bubble {bubble_fraction(a):.1%}\n"
        "(in each cell its micro-batch; pale grey: idle)",
        fontsize=10.5,
    )
    return ax


_CHUNK_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _devices_for(n: int, stage_devices: Sequence[int] | None, where: str) -> list[int]:
    devs = list(range(n)) if stage_devices is None else [int(d) for d in stage_devices]
    if len(devs) != n:
        raise ValueError(f"{where}: stage_devices has {len(devs)} entries for {n} stages.")
    return devs


_MIN_PT = 9.0  # the smallest text these figures print


def _cell_label_size(label: str, w_pt: float, h_pt: float) -> float | None:
    """The font size (9 to 10 pt) at which ``label`` fits a w x h cell, or None if none does."""
    size = _fit_fontsize(label, w_pt, h_pt, lo=0.0, hi=10.0, fill=0.8)
    return size if size >= _MIN_PT else None


def _table_axes(S: int, T: int) -> Axes:
    """A new figure's Axes for a table of ``S`` devices and ``T`` ticks: at least 8.5 inches
    wide (the title's key is that long), at most ``MAX_FIGURE_WIDTH``."""
    width = min(MAX_FIGURE_WIDTH, max(8.5, 1.8 + 0.3 * T))
    fig = _new_figure((width, 1.5 + 0.42 * S))
    fig.subplots_adjust(left=0.6 / width, right=1 - 0.1 / width)  # room for "dev 7" only
    return fig.add_subplot()


def _table_label(m: int, chunk: int | None, w_pt: float, h_pt: float) -> tuple[str, float | None]:
    """A table cell's label (micro-batch ``m``, then the chunk's letter, if any) and its font
    size: on one line if it fits, else the letter under the number; size None if neither fits."""
    if chunk is None:
        return str(m), _cell_label_size(str(m), w_pt, h_pt)
    letter = _CHUNK_LETTERS[chunk % 26]
    for label in (f"{m}{letter}", f"{m}\n{letter}"):
        size = _cell_label_size(label, w_pt, h_pt)
        if size is not None:
            return label, size
    return label, None


def _table_title(s: PipelineSchedule, tl: Timeline | None, dropped: bool) -> str:
    S = s.n_stages
    if tl is None:
        head = (f"{s.name}: {S} device{'s' * (S > 1)}, {s.n_micro} micro-batch"
                f"{'es' * (s.n_micro != 1)}, bubble "
                f"{bubble_fraction(s.phase):.1%}")  # fmt: skip
    else:
        how = "in lockstep" if tl.lockstep else "each device as soon as its inputs are ready"
        head = f"{s.name} in time, {how}: bubble {tl.bubble:.1%}"
    kinds = "solid: forward, hatched: backward"
    if (s.phase == WEIGHT_GRAD).any():
        kinds = "solid: forward, hatched: input gradient (B), outlined: weight gradient (W)"
    chunks = "; the letter is the device's model chunk" if s.n_chunks > 1 else ""
    number = "the number is the micro-batch" + (", where it fits" if dropped else "")
    key = f"({kinds}; {number}{chunks}; pale grey: idle)"
    if len(key) > 95:  # two lines rather than one wider than the figure
        key = f"({kinds};\n{number}{chunks}; pale grey: idle)"
    return f"{head}\n{key}"


def _draw_cell(
    ax: Axes, x0: float, w: float, d: int, ph: int, face: str, gid: str
) -> tuple[str, dict[str, Any] | None]:
    """One busy cell: a forward solid, a backward hatched, a W outlined; its ink and text box."""
    if ph == FORWARD:
        ax.add_patch(Rectangle((x0, d), w, 1, facecolor=face, edgecolor="white", linewidth=0.8,
                               gid=gid))  # fmt: skip
        return _text_color(face), None
    inset = 0.06 * min(w, 1.0)
    ax.add_patch(Rectangle((x0 + inset, d + 0.06), w - 2 * inset, 0.88, facecolor="white",
                           edgecolor=face, hatch="////" if ph == BACKWARD else None,
                           linewidth=1.6, gid=gid))  # fmt: skip
    return "black", {"boxstyle": "round,pad=0.08", "facecolor": "white", "edgecolor": "none"}


def _draw_table(
    table: PipelineSchedule | Timeline,
    *,
    title: str | None,
    stage_devices: Sequence[int] | None,
    ax: Axes | None,
    span: float | None,
) -> Axes:
    """``draw_pipeline_schedule`` for a ``PipelineSchedule`` (one column per tick) or a
    ``Timeline`` (each op at its start, as wide as it lasts): F solid, B hatched, W outlined."""
    tl = table if isinstance(table, Timeline) else None
    s = tl.schedule if tl is not None else table
    S, T = s.n_stages, s.ticks
    length = tl.total if tl is not None else float(T)
    if span is not None and (isinstance(span, bool) or not float(span) >= length):
        raise ValueError(f"draw_pipeline_schedule: span={span!r} must be a number at least the "
                         f"schedule's length, {length:g}.")  # fmt: skip
    span = length if span is None else float(span)
    devs = _devices_for(S, stage_devices, "draw_pipeline_schedule")
    ax = ax if ax is not None else _table_axes(S, T)
    ax.set_xlim(0, span)
    ax.set_ylim(S, 0)
    w_pt, h_pt = _axes_size_pt(ax)
    unit_pt, row_pt = w_pt / max(span, 1e-9), h_pt / S
    n_labels = max(2, int(w_pt // 30))  # tick labels 9 pt wide apart
    dropped = False
    for d in range(S):
        face = device_color(devs[d])
        if tl is not None:  # the row's background: idle wherever no op is drawn
            ax.add_patch(Rectangle((0, d), length, 1, facecolor="0.93", edgecolor="white",
                                   linewidth=0.8, gid=f"idle:stage={d}"))  # fmt: skip
        for t in range(T):
            ph, m, c = int(s.phase[d, t]), int(s.micro[d, t]), int(s.chunk[d, t])
            gid = f"cell:stage={d}:tick={t}:micro={m}:phase={ph}:chunk={c}"
            if ph == IDLE:
                if tl is None:
                    ax.add_patch(Rectangle((t, d), 1, 1, facecolor="0.93", edgecolor="white",
                                           linewidth=0.8, gid=gid))  # fmt: skip
                continue
            x0, w = (float(tl.start[d, t]), float(tl.length[d, t])) if tl is not None else (t, 1.0)
            ink, box = _draw_cell(ax, x0, w, d, ph, face, gid)
            label, size = _table_label(m, c if s.n_chunks > 1 else None, 0.88 * w * unit_pt,
                                       0.8 * row_pt)  # fmt: skip
            if size is None:
                dropped = True
                continue
            ax.text(x0 + w / 2, d + 0.5, label, ha="center", va="center", fontsize=size,
                    color=ink, fontweight="bold", bbox=box)  # fmt: skip
    ax.set_yticks([d + 0.5 for d in range(S)])
    ax.set_yticklabels([f"dev {dv}" for dv in devs], fontsize=_MIN_PT)
    if tl is None:
        step = max(1, int(np.ceil(span / n_labels)))
        ax.set_xticks([t + 0.5 for t in range(0, int(np.ceil(span)), step)])
        ax.set_xticklabels([str(t) for t in range(0, int(np.ceil(span)), step)], fontsize=_MIN_PT)
        ax.set_xlabel("tick (one operation per device, whatever it costs: not to scale in time)",
                      fontsize=_MIN_PT)  # fmt: skip
    else:
        ax.xaxis.set_major_locator(MaxNLocator(nbins=max(2, n_labels // 2)))
        ax.tick_params(axis="x", labelsize=_MIN_PT)
        costs = ", ".join(f"{k} = {v:g}" for k, v in tl.durations.items()
                          if k != "W" or (s.phase == WEIGHT_GRAD).any())  # fmt: skip
        ax.set_xlabel(f"time, in forwards of one chunk ({costs})", fontsize=_MIN_PT)
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    full = _table_title(s, tl, dropped)
    ax.set_title(full if title is None else title + "\n" + full.split("\n", 1)[1], fontsize=10)
    return ax


def draw_in_flight(
    schedules: Sequence[PipelineSchedule],
    *,
    recorded: Sequence[Any] | None = None,
    stage_devices: Sequence[int] | None = None,
    axes: Any = None,
) -> Figure:
    """How many micro-batches' activations each device holds after each tick: one column per
    schedule, one strip per device in its colour (so no device's line hides another's). All
    strips share one scale, from 0 to the figure's peak (the upper number on every axis), so
    that a strip's height compares across devices and schedules: GPipe's 16 stands four times
    as tall as a 1F1B device's 4.

    Args:
      schedules: the schedules to compare (``helpers.parallelism.schedules``), side by side;
        all with the same number of devices.
      recorded: optional, per schedule, the ``(devices, ticks)`` counts a run recorded; they
        are drawn instead of the table's ``in_flight`` (and must have its shape), and the
        figure's title says so.
      stage_devices: the device of each row (default: row ``d`` on device ``d``).
      axes: a ``(devices, schedules)`` grid of Axes; a new figure is made when ``None``.
    """
    if not schedules or not all(isinstance(s, PipelineSchedule) for s in schedules):
        raise ValueError("draw_in_flight: schedules must be a non-empty list of PipelineSchedule.")
    S = schedules[0].n_stages
    if any(s.n_stages != S for s in schedules):
        raise ValueError("draw_in_flight: schedules must all have the same number of devices.")
    counts = _in_flight_counts(schedules, recorded)
    top = max(1, max(int(c.max()) for c in counts))  # one scale for every strip: 0 to the peak
    devs = _devices_for(S, stage_devices, "draw_in_flight")
    if axes is None:
        fig = _new_figure((min(MAX_FIGURE_WIDTH, 1.4 + 3.8 * len(schedules)), 1.3 + 0.5 * S))
        grid = fig.subplots(S, len(schedules), sharex="col", squeeze=False)
    else:
        grid = np.asarray(axes, dtype=object)
        if grid.shape != (S, len(schedules)):
            raise ValueError(f"draw_in_flight: axes must be a ({S}, {len(schedules)}) grid of "
                             f"Axes (devices x schedules); got shape {grid.shape}.")  # fmt: skip
        fig = grid[0, 0].figure
    for j, (s, c) in enumerate(zip(schedules, counts, strict=True)):
        x = np.arange(1, c.shape[1] + 1)
        for d in range(S):
            ax, color = grid[d, j], device_color(devs[d])
            ax.fill_between(x, c[d], step="post", color=color, alpha=0.25, linewidth=0)
            ax.step(x, c[d], where="post", color=color, linewidth=1.4,
                    gid=f"in_flight:{s.name}:device={d}")  # fmt: skip
            ax.set_ylim(0, top * 1.15)
            ax.set_yticks([0, top])
            ax.tick_params(labelsize=_MIN_PT, length=2)
            ax.grid(alpha=0.3)
            if j == 0:
                ax.set_ylabel(f"dev {devs[d]}", rotation=0, ha="right", va="center",
                              fontsize=_MIN_PT)  # fmt: skip
        grid[0, j].set_title(f"{s.name}, M={s.n_micro}: peak {int(c.max())}", fontsize=10)
        grid[-1, j].set_xlabel("tick", fontsize=_MIN_PT)
        grid[-1, j].xaxis.set_major_locator(MaxNLocator(integer=True))
    source = "as the run's devices recorded them" if recorded is not None else "from the table"
    fig.suptitle(f"Micro-batches whose activations each device holds after each tick, {source}"
                 "\n(every strip on one scale: from 0 to the figure's peak, the number on its axis)",
                 fontsize=10.5)  # fmt: skip
    fig.tight_layout()
    return fig


def _in_flight_counts(
    schedules: Sequence[PipelineSchedule], recorded: Sequence[Any] | None
) -> list[np.ndarray]:
    """The table's ``in_flight`` counts, or the recorded ones after checking their shapes."""
    counts = [in_flight(s) for s in schedules]
    if recorded is None:
        return counts
    if len(recorded) != len(schedules):
        raise ValueError(f"draw_in_flight: {len(recorded)} recorded arrays for "
                         f"{len(schedules)} schedules.")  # fmt: skip
    for i, (r, c) in enumerate(zip(recorded, counts, strict=True)):
        if np.shape(r) != c.shape:
            raise ValueError(f"draw_in_flight: recorded[{i}] has shape {np.shape(r)}, the "
                             f"schedule {c.shape}.")  # fmt: skip
    return [np.asarray(r) for r in recorded]
