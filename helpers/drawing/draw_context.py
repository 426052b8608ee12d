"""Figures of context parallelism: which device computes which causal score block.

``draw_causal_work`` draws, for each way of splitting the sequence, the grid of (query
chunk, key chunk) score blocks: a block a device must compute has that device's colour
(``device_color``, as everywhere in the series); a block that lies wholly in the future is
pale grey (wholly masked: a kernel that skips such blocks never computes it). The device of
each row (a query chunk, held by one device) is written at the row's right end, once per row
rather than in every block, so that it stays at 9 pt however many chunks there are. Under
each grid, the blocks per device as bars.

It makes a figure (or draws on ``fig``), returns it, and never calls ``plt.show()``. Cells
carry ``gid`` strings for tests:
``"block:layout=<name>:query=<i>:key=<j>:device=<d>"`` (``device=-1`` for a skipped block).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator

from helpers.drawing.draw import _new_figure, device_color
from helpers.parallelism.context import _check_layout, causal_block_work

__all__ = ["draw_causal_work"]


def draw_causal_work(
    layouts: Mapping[str, Sequence[Sequence[int]]], *, fig: Figure | None = None
) -> Figure:
    """Causal score blocks per device, for each named layout (``{"plain": chunks, ...}``).

    ``chunks`` per layout are as ``contiguous_chunks`` / ``zigzag_chunks`` return them:
    device ``d`` holds the query (and key) chunks ``chunks[d]``. One column per layout:
    on top the grid of blocks (rows: query chunks, columns: key chunks), below the number
    of blocks each device computes (``causal_block_work``).
    """
    if not isinstance(layouts, Mapping) or not layouts:
        raise ValueError(
            "draw_causal_work: layouts must be a non-empty dict name -> chunks per device."
        )
    checked = {str(k): _check_layout(v, "draw_causal_work") for k, v in layouts.items()}
    sizes = {len(v) for v in checked.values()}
    if len(sizes) != 1:
        raise ValueError("draw_causal_work: every layout must be for the same device count.")
    n = sizes.pop()
    n_chunks = sum(len(d) for d in next(iter(checked.values())))
    cols = len(checked)
    if fig is None:
        fig = _new_figure((4.6 * cols, 7.4))
    grid = fig.add_gridspec(2, cols, height_ratios=(3.2, 1.6), hspace=0.42, wspace=0.32)
    top = max(int(causal_block_work(v).max()) for v in checked.values())
    for col, (name, layout) in enumerate(checked.items()):
        owner = {c: d for d, dev in enumerate(layout) for c in dev}
        ax = fig.add_subplot(grid[0, col])
        ax.set_xlim(0, n_chunks)
        ax.set_ylim(n_chunks, 0)
        ax.set_aspect("equal")
        for i in range(n_chunks):
            for j in range(n_chunks):
                d = owner[i] if j <= i else -1
                face = device_color(d) if d >= 0 else "0.93"
                ax.add_patch(Rectangle((j, i), 1, 1, facecolor=face, edgecolor="white",
                                       linewidth=0.6,
                                       gid=f"block:layout={name}:query={i}:key={j}:device={d}"))  # fmt: skip
        step = max(1, int(np.ceil(n_chunks / 8)))
        ticks = list(range(0, n_chunks, step))
        ax.set_xticks([t + 0.5 for t in ticks], [str(t) for t in ticks], fontsize=9)
        ax.set_yticks([t + 0.5 for t in ticks], [str(t) for t in ticks], fontsize=9)
        ax.set_xlabel("key chunk", fontsize=9)
        ax.set_ylabel("query chunk", fontsize=9)
        ax.tick_params(length=0)
        holder = ax.secondary_yaxis("right")  # each row's device, once per row
        rows = range(0, n_chunks, max(1, int(np.ceil(n_chunks / 16))))
        holder.set_yticks([i + 0.5 for i in rows], [str(owner[i]) for i in rows], fontsize=9)
        holder.set_ylabel("device holding the query chunk", fontsize=9)
        holder.tick_params(length=0)
        for spine in (*ax.spines.values(), *holder.spines.values()):
            spine.set_visible(False)
        ax.set_title(f"{name}\n(colour: the device that holds the queries;\npale: wholly masked)",
                     fontsize=9.5)  # fmt: skip
        work = causal_block_work(layout)
        bars = fig.add_subplot(grid[1, col])
        bars.bar(range(n), work, color=[device_color(d) for d in range(n)], edgecolor="0.3",
                 linewidth=0.5)  # fmt: skip
        bars.set_ylim(0, top * 1.15)
        bars.set_xticks(range(n), [str(d) for d in range(n)], fontsize=9)
        bars.set_xlabel("device", fontsize=9)
        bars.set_ylabel("blocks with a visible key", fontsize=9)
        bars.tick_params(axis="y", labelsize=9)
        bars.yaxis.set_major_locator(MaxNLocator(integer=True))  # whole blocks
        bars.set_title(f"busiest / mean: {work.max() / work.mean():.2f}", fontsize=9.5)
        for spine in ("top", "right"):
            bars.spines[spine].set_visible(False)
    return fig
