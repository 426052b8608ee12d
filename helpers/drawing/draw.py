"""Every figure of the series: device meshes, shard layouts, and bytes per device.

One rule holds for all of them: a device has one colour, ``device_color(id)``, in every
figure of every notebook, so a learner can follow device 3 from the mesh picture to the
block of a weight it holds and to its bar in the memory chart.

The functions follow matplotlib's advice for plotting helpers: they take ``ax=None``,
draw on the given Axes (or make a figure when there is none), return the Axes or Figure
and never call ``plt.show()``. Nothing here computes a sharding: the layouts come from
``helpers.placing.sharding.shard_layout`` and the byte counts from
``helpers.measuring.measure.planned_bytes_per_device``.

Artists carry ``gid`` strings so that tests (and curious readers) can check what was
drawn: mesh cells are ``"device:<id>"``; array blocks are
``"block:start=(...):stop=(...):devices=0,1"`` (coordinates in the drawn dimensions). In
``draw_param_shardings`` a panel's Axes is ``"param:<path>"`` or ``"vectors:<path>,..."``,
a vector's bar ``"vector:<name>:devices=0,1"``, a group header ``"group:<header>"``.
"""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from jax.sharding import Mesh, NamedSharding, Sharding
from matplotlib import colors as mcolors
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Polygon, Rectangle
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator

from helpers.measuring.measure import format_bytes, planned_bytes_per_device
from helpers.placing.sharding import (
    leaves_with_paths,
    shard_layout,
    shard_shape,
    sharding_of,
    spec_of,
)

__all__ = [
    "device_color",
    "draw_mesh",
    "draw_param_layouts",
    "draw_param_shardings",
    "draw_sharding",
    "draw_strategy_guide",
]

# ---------------------------------------------------------------------------
# One colour per device, for the whole series
# ---------------------------------------------------------------------------


def _build_palette() -> tuple[str, ...]:
    import matplotlib as mpl

    tab10 = [mcolors.to_hex(c) for c in mpl.colormaps["tab10"].colors]
    tab20 = [mcolors.to_hex(c) for c in mpl.colormaps["tab20"].colors]
    tab20b = [mcolors.to_hex(c) for c in mpl.colormaps["tab20b"].colors]
    # The ten strong tab10 colours first (devices 0-9), then the light tab20 shades,
    # then tab20b: 40 distinct colours before the palette repeats.
    out: list[str] = []
    for c in tab10 + tab20[1::2] + tab20b:
        if c not in out:
            out.append(c)
    return tuple(out)


_PALETTE: tuple[str, ...] = _build_palette()


def device_color(device_id: int) -> str:
    """The colour of device ``device_id`` in every figure of the series (a ``#rrggbb`` string).

    Devices 0-9 get matplotlib's ``tab10`` colours (0 blue, 1 orange, 2 green, 3 red, ...),
    then lighter shades follow; the palette repeats after 40 devices.
    """
    if isinstance(device_id, bool) or not isinstance(device_id, (int, np.integer)):
        raise ValueError(
            f"device_color: device_id must be an integer device id, got {device_id!r}."
        )
    return _PALETTE[int(device_id) % len(_PALETTE)]


def _text_color(face: str) -> str:
    """Black or white, whichever reads better on ``face`` (WCAG relative luminance)."""
    r, g, b = mcolors.to_rgb(face)

    def lin(c: float) -> float:
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    lum = 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b)
    # Contrast against white vs against black; pick the larger.
    return "white" if (1.05 / (lum + 0.05)) > ((lum + 0.05) / 0.05) else "black"


# ---------------------------------------------------------------------------
# Small geometry helpers
# ---------------------------------------------------------------------------

#: No text of a mesh or layout figure is smaller than this (points, at the 100 dpi that
#: Jupyter's inline backend renders at, so a figure shown at its own size shows it as is).
_MIN_PT = 9.0
#: A grid is drawn to scale while its sides are within this ratio; a thinner array is drawn
#: at this ratio, and its panel says "not to scale".
_MAX_RATIO = 4.0


def _shown_ratio(rows: int, cols: int) -> tuple[float, bool]:
    """``(height / width as drawn, whether that is the array's own ratio)`` of a grid."""
    ratio = rows / cols if cols else 1.0
    shown = float(np.clip(ratio, 1 / _MAX_RATIO, _MAX_RATIO))
    return shown, math.isclose(shown, ratio)


def _drawn_extent_units(rows: int, cols: int) -> tuple[float, float]:
    """A grid's drawn ``(height, width)`` in elements: the array's own, except that the short
    side of an array thinner than ``_MAX_RATIO`` is widened to that ratio."""
    shown, _ = _shown_ratio(rows, cols)
    if rows >= cols:
        return float(rows), rows / shown
    return cols * shown, float(cols)


def _axes_size_pt(ax: Axes) -> tuple[float, float]:
    """Width and height of ``ax``'s drawing box in points (after its aspect is applied)."""
    ax.apply_aspect()
    pos = ax.get_position()
    fw, fh = ax.figure.get_size_inches()
    return pos.width * fw * 72.0, pos.height * fh * 72.0


def _fit_fontsize(
    text: str, w_pt: float, h_pt: float, lo: float = 5.0, hi: float = 12.0, fill: float = 0.85
) -> float:
    """The largest font size (clamped to ``[lo, hi]``) at which ``text`` fits a w x h box,
    taking at most ``fill`` of its width."""
    lines = text.split("\n")
    chars = max(len(line) for line in lines) or 1
    by_width = fill * w_pt / (0.7 * chars)  # bold DejaVu Sans digits are ~0.7 em wide
    by_height = 0.95 * h_pt / (1.2 * len(lines))
    return float(min(hi, max(lo, min(by_width, by_height))))


def _new_figure(figsize: tuple[float, float]) -> Figure:
    """A pyplot figure (so Jupyter shows it), imported late: ``import helpers`` stays light."""
    import matplotlib.pyplot as plt

    return plt.figure(figsize=figsize)


def _fig_for(ax: Axes | None, figsize: tuple[float, float]) -> Axes:
    if ax is not None:
        return ax
    return _new_figure(figsize).add_subplot()


# ---------------------------------------------------------------------------
# draw_mesh
# ---------------------------------------------------------------------------


def draw_mesh(mesh: Mesh, ax: Axes | None = None) -> Axes:
    """A picture of a 1-, 2- or 3-D device mesh: one coloured cell per device.

    Rows follow the mesh's first axis and columns its second; the axis names and sizes
    are written on the sides (``"data (2)"`` to the left of the rows, ``"model (4)"``
    above the columns). Each cell shows its device id, in the device's own colour. A 1-D
    mesh is one row. A 3-D mesh is drawn as side-by-side 2-D grids, one per index of its
    first axis (meshes of higher rank likewise, one grid per index of all but the last two).

    When the mesh spans several processes, a thick dark frame surrounds the devices of
    each process (the cells keep their device colours), and a bracket names the process:
    to the right of its rows when every row belongs to one process, below its columns when
    every column does, and otherwise ``p<k>`` inside each cell.

    Args:
      mesh: a ``jax.sharding.Mesh`` (with devices, not an ``AbstractMesh``).
      ax: the Axes to draw on; a new figure is made when ``None``.

    Returns:
      The Axes drawn on. Each cell is a ``Rectangle`` with ``gid="device:<id>"`` in
      ``ax.patches``, in mesh (row-major) order. With several processes, each frame is a
      ``LineCollection`` with ``gid="process-frame:<k>"`` and each bracket's text has
      ``gid="process-label:<k>"`` (in-cell labels: ``gid="process:<device id>"``).
    """
    names, shape, grids, headers = _mesh_grids(mesh)
    row_name = f"{names[-2]} ({shape[-2]})" if len(shape) > 1 else None
    col_name = f"{names[-1]} ({shape[-1]})"
    owners, n_procs, brackets = _process_brackets(grids)
    n_rows, n_cols = grids[0].shape
    right = 1.9 if brackets == "rows" else 0.1
    bottom = 0.9 if brackets == "cols" else 0.1
    gap = 1.0 + (right - 0.1)
    total_w = len(grids) * n_cols + (len(grids) - 1) * gap
    left_margin = 1.0 if row_name else 0.2
    top_margin = 1.0 + (0.55 if headers[0] else 0.0)
    ax = _fig_for(
        ax,
        (
            min(16.0, 1.0 + 0.95 * (total_w + left_margin + right)),
            1.2 + 0.95 * (n_rows + top_margin + bottom),
        ),
    )
    ax.set_xlim(-left_margin, total_w + right)
    ax.set_ylim(n_rows + bottom, -top_margin)
    ax.set_aspect("equal")
    ax.set_axis_off()
    w_pt, h_pt = _axes_size_pt(ax)
    cell_pt = min(w_pt / (total_w + left_margin + 0.1), h_pt / (n_rows + top_margin + 0.1))
    sizes = (
        float(np.clip(cell_pt * 0.32, _MIN_PT, 18)),  # device ids
        float(np.clip(cell_pt * 0.17, _MIN_PT, 11)),  # indices, p<k>
        float(np.clip(cell_pt * 0.2, _MIN_PT, 12)),  # axis names, headers
    )
    for g, (grid, header) in enumerate(zip(grids, headers, strict=True)):
        x0 = g * (n_cols + gap)
        _draw_mesh_cells(ax, grid, x0, brackets, sizes)
        if n_procs > 1:
            _frame_processes(ax, owners[g], x0, brackets, sizes[2])
        _label_mesh_grid(ax, grid.shape, x0, header, col_name, row_name if g == 0 else None,
                         sizes)  # fmt: skip
    dims = " x ".join(f"{n} ({s})" for n, s in zip(names, shape, strict=True))
    n_dev = math.prod(shape)
    procs = f", {n_procs} processes (framed)" if n_procs > 1 else ""
    ax.set_title(
        f"Mesh {dims}: {n_dev} device{'s' if n_dev != 1 else ''}{procs}", fontsize=sizes[2] + 1
    )
    return ax


def _mesh_grids(mesh: Mesh) -> tuple[tuple[str, ...], tuple[int, ...], list[Any], list[str | None]]:
    """``(axis names, shape, 2-D grids of devices, a header per grid)``: a 1-D mesh is one
    row; from 3-D on, one grid per index of all but the last two axes."""
    devices = getattr(mesh, "devices", None)
    if not isinstance(mesh, Mesh) or not isinstance(devices, np.ndarray):
        raise ValueError(
            f"draw_mesh: expected a jax.sharding.Mesh with devices, got {type(mesh).__name__}. "
            "Make one with helpers.make_mesh(shape, names)."
        )
    names = tuple(str(n) for n in mesh.axis_names)
    shape = tuple(int(s) for s in devices.shape)
    if len(shape) == 0:
        raise ValueError("draw_mesh: the mesh has no axes.")
    if len(shape) == 1:
        return names, shape, [devices.reshape(1, shape[0])], [None]
    headers: list[str | None] = [
        ", ".join(f"{n} = {i}" for n, i in zip(names[:-2], idx, strict=True)) or None
        for idx in np.ndindex(*shape[:-2])
    ]
    return names, shape, list(devices.reshape((-1, shape[-2], shape[-1]))), headers


def _process_brackets(grids: list[Any]) -> tuple[list[np.ndarray], int, str | None]:
    """Each grid's owning process per cell, the process count, and where the brackets go:
    ``"rows"`` (right), ``"cols"`` (below), ``"cells"`` (``p<k>`` inside), None (one process)."""
    owners = [np.vectorize(lambda d: int(getattr(d, "process_index", 0)))(g) for g in grids]
    n_procs = len(np.unique(np.concatenate([o.ravel() for o in owners])))
    if n_procs <= 1:
        return owners, n_procs, None
    if all((o == o[:, :1]).all() for o in owners):
        return owners, n_procs, "rows"
    if all((o == o[:1, :]).all() for o in owners):
        return owners, n_procs, "cols"
    return owners, n_procs, "cells"


def _draw_mesh_cells(
    ax: Axes, grid: Any, x0: float, brackets: str | None, sizes: tuple[float, float, float]
) -> None:
    """One cell per device in its colour, its id inside (and ``p<k>`` when the processes
    are named per cell)."""
    id_size, small, _ = sizes
    for r in range(grid.shape[0]):
        for c in range(grid.shape[1]):
            d = grid[r, c]
            did = int(d.id)
            face = device_color(did)
            ax.add_patch(Rectangle((x0 + c + 0.04, r + 0.04), 0.92, 0.92, facecolor=face,
                                   edgecolor="white", linewidth=1.0, gid=f"device:{did}"))  # fmt: skip
            ink = _text_color(face)
            y = r + (0.42 if brackets == "cells" else 0.5)
            ax.text(x0 + c + 0.5, y, str(did), ha="center", va="center", fontsize=id_size,
                    fontweight="bold", color=ink, gid=f"device-id:{did}")  # fmt: skip
            if brackets == "cells":
                ax.text(x0 + c + 0.5, r + 0.78, f"p{int(d.process_index)}", ha="center",
                        va="center", fontsize=small, color=ink, gid=f"process:{did}")  # fmt: skip


def _label_mesh_grid(
    ax: Axes,
    grid_shape: tuple[int, int],
    x0: float,
    header: str | None,
    col_name: str,
    row_name: str | None,
    sizes: tuple[float, float, float],
) -> None:
    """Index numbers along the sides of one grid, the axis names, and its header."""
    n_rows, n_cols = grid_shape
    _, small, label_size = sizes
    for c in range(n_cols):
        ax.text(x0 + c + 0.5, -0.15, str(c), ha="center", va="bottom", fontsize=small,
                color="0.35")  # fmt: skip
    ax.text(x0 + n_cols / 2, -0.55, col_name, ha="center", va="bottom", fontsize=label_size,
            fontweight="bold", gid="axis-label:col")  # fmt: skip
    if header:
        ax.text(x0 + n_cols / 2, -1.0, header, ha="center", va="bottom", fontsize=label_size,
                fontweight="bold", color="0.15", gid="grid-header",
                bbox={"boxstyle": "round,pad=0.25", "facecolor": "0.92", "edgecolor": "0.7"})  # fmt: skip
    if row_name:
        for r in range(n_rows):
            ax.text(x0 - 0.12, r + 0.5, str(r), ha="right", va="center", fontsize=small,
                    color="0.35")  # fmt: skip
        ax.text(x0 - 0.55, n_rows / 2, row_name, ha="right", va="center", rotation=90,
                fontsize=label_size, fontweight="bold", gid="axis-label:row")  # fmt: skip


def _runs(keys: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(key, start, stop)`` for every run of equal consecutive keys."""
    out: list[tuple[int, int, int]] = []
    for i, k in enumerate(keys):
        if out and out[-1][0] == k:
            out[-1] = (k, out[-1][1], i + 1)
        else:
            out.append((k, i, i + 1))
    return out


def _frame_processes(
    ax: Axes, owner: np.ndarray, x0: float, brackets: str | None, size: float
) -> None:
    """A frame around each process's cells of one grid, and a bracket naming the process."""
    from matplotlib.collections import LineCollection

    n_rows, n_cols = owner.shape

    def other(r: int, c: int, p: int) -> bool:
        return not (0 <= r < n_rows and 0 <= c < n_cols) or int(owner[r, c]) != p

    for p in np.unique(owner):
        p = int(p)
        segments = []
        for r, c in zip(*np.nonzero(owner == p), strict=True):
            x, y = x0 + c, float(r)
            if other(r - 1, c, p):
                segments.append([(x, y), (x + 1, y)])
            if other(r + 1, c, p):
                segments.append([(x, y + 1), (x + 1, y + 1)])
            if other(r, c - 1, p):
                segments.append([(x, y), (x, y + 1)])
            if other(r, c + 1, p):
                segments.append([(x + 1, y), (x + 1, y + 1)])
        ax.add_collection(
            LineCollection(
                segments,
                colors="0.1",
                linewidths=3.0,
                capstyle="projecting",
                gid=f"process-frame:{p}",
                zorder=3,
            )  # fmt: skip
        )
    if brackets == "rows":
        for p, start, stop in _runs([int(k) for k in owner[:, 0]]):
            xb = x0 + n_cols + 0.2
            ax.plot([xb, xb], [start + 0.08, stop - 0.08], color="0.1", lw=2.0)
            ax.text(xb + 0.15, (start + stop) / 2, f"process {p}", ha="left", va="center",
                    fontsize=size, fontweight="bold", color="0.1",
                    gid=f"process-label:{p}")  # fmt: skip
    elif brackets == "cols":
        for p, start, stop in _runs([int(k) for k in owner[0, :]]):
            yb = n_rows + 0.2
            ax.plot([x0 + start + 0.08, x0 + stop - 0.08], [yb, yb], color="0.1", lw=2.0)
            ax.text(x0 + (start + stop) / 2, yb + 0.12, f"process {p}", ha="center", va="top",
                    fontsize=size, fontweight="bold", color="0.1",
                    gid=f"process-label:{p}")  # fmt: skip


# ---------------------------------------------------------------------------
# draw_sharding
# ---------------------------------------------------------------------------


def _spec_text(sharding: Sharding) -> str:
    spec = spec_of(sharding)
    if spec is None:
        return type(sharding).__name__
    return "P(" + ", ".join(repr(e) for e in spec) + ")"


def _dim_axes(sharding: Sharding, dim: int) -> tuple[str, ...]:
    spec = spec_of(sharding)
    if spec is None or dim >= len(spec) or spec[dim] is None:
        return ()
    entry = spec[dim]
    return (entry,) if isinstance(entry, str) else tuple(entry)


def _dim_label(
    shape: Sequence[int], local: Sequence[int], sharding: Sharding, dim: int, compact: bool
) -> str:
    size = shape[dim]
    axes = _dim_axes(sharding, dim)
    ways = size // local[dim] if local[dim] else 1
    if axes and isinstance(sharding, NamedSharding):
        mesh_shape = sharding.mesh.shape
        n = math.prod(mesh_shape[a] for a in axes)
        names = " x ".join(f"'{a}'" for a in axes)
        if compact:
            return f"dim {dim}: {size} / {names}" + (" (1)" if n == 1 else "")
        if n == 1:
            return f"dim {dim}: {size}, over {names} (size 1: not split)"
        return f"dim {dim}: {size}, split over {names} ({n})"
    if ways > 1:
        return f"dim {dim}: {size}, split {ways} ways"
    return f"dim {dim}: {size}" + ("" if compact else ", not split")


def _device_text(devs: Sequence[int], n_all: int) -> str:
    if len(devs) > 1 and len(devs) == n_all:
        return f"all {n_all}"
    parts = [str(d) for d in devs]
    per_line = 4
    return "\n".join(",".join(parts[i : i + per_line]) for i in range(0, len(parts), per_line))


def _layout_2d(shape: tuple[int, ...], local: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """Which dimensions are drawn and which are folded (rank 3 and above)."""
    rank = len(shape)
    if rank <= 2:
        return list(range(rank)), []
    sharded = [d for d in range(rank) if local[d] < shape[d]]
    drawn = sharded[:2]
    for d in reversed(range(rank)):
        if len(drawn) >= 2:
            break
        if d not in drawn:
            drawn.append(d)
    drawn.sort()
    folded = [d for d in range(rank) if d not in drawn]
    return drawn, folded


def _diagonal_stripes(
    ax: Axes,
    clip: Rectangle,
    box: tuple[float, float, float, float],
    devs: Sequence[int],
    sx: float,
    sy: float,
    width_pt: float = 6.0,
) -> None:
    """Fill ``box`` (data units; ``sx, sy`` points per unit) with 45-degree stripes
    cycling through the colours of ``devs``, clipped to ``clip``."""
    c0, r0, w, h = box
    sx, sy = max(sx, 1e-9), max(sy, 1e-9)
    span = w * sx + h * sy  # range of u = x*sx + y*sy over the box, in points
    width_pt = max(width_pt, span / 300.0)
    u_start = c0 * sx + r0 * sy
    n = math.ceil(span / width_pt)
    for k in range(n):
        u0, u1 = u_start + k * width_pt, u_start + (k + 1) * width_pt
        xs = (c0, c0 + w)
        verts = [
            (xs[0], (u0 - xs[0] * sx) / sy),
            (xs[1], (u0 - xs[1] * sx) / sy),
            (xs[1], (u1 - xs[1] * sx) / sy),
            (xs[0], (u1 - xs[0] * sx) / sy),
        ]
        band = Polygon(
            verts,
            closed=True,
            facecolor=device_color(devs[k % len(devs)]),
            edgecolor="none",
            alpha=0.75,
            gid="stripe",
        )
        ax.add_patch(band)
        band.set_clip_path(clip)


def _drawn_extent(x: Any) -> tuple[int, int, int, int] | None:
    """``(rows, cols, row blocks, col blocks)`` of what ``_draw_sharding`` draws as a grid:
    its size in elements and how many blocks it is cut into along each (None: a strip)."""
    shape, sharding = sharding_of(x)
    shape = tuple(int(s) for s in shape)
    local = tuple(int(s) for s in shard_shape(shape, sharding))
    drawn, _ = _layout_2d(shape, local)
    if len(drawn) != 2:
        return None
    r, c = drawn
    return shape[r], shape[c], -(-shape[r] // max(local[r], 1)), -(-shape[c] // max(local[c], 1))


def _to_scale(ax: Axes, size_pt: tuple[float, float]) -> None:
    """Shrink ``ax`` to ``size_pt`` (width, height in points), centred, its top kept."""
    pos = ax.get_position()
    fw, fh = ax.figure.get_size_inches()
    w = min(pos.width, size_pt[0] / (72.0 * fw))
    h = min(pos.height, size_pt[1] / (72.0 * fh))
    ax.set_position([pos.x0 + (pos.width - w) / 2, pos.y1 - h, w, h])


class _Layout:
    """What ``_draw_sharding`` draws: the array's layout projected on its drawn dimensions.

    ``cells`` are ``(((start, stop) per drawn dim), devices)``: blocks that only differ in
    a folded dimension (when more than two dims are sharded) are merged, with every device
    holding a piece. ``rows, cols`` are the drawn extent in elements (1 for a missing dim).
    """

    def __init__(self, x: Any, where: str) -> None:
        shape, self.sharding = sharding_of(x, where)
        self.shape = tuple(int(s) for s in shape)
        self.local = tuple(int(s) for s in shard_shape(self.shape, self.sharding))
        self.blocks = shard_layout(self.shape, self.sharding)
        self.n_all = len(self.sharding.device_set)
        self.drawn, self.folded = _layout_2d(self.shape, self.local)
        merged: dict[tuple[tuple[int, int], ...], list[int]] = {}
        for b in self.blocks:
            key = tuple((b.start[d], b.stop[d]) for d in self.drawn)
            devs = merged.setdefault(key, [])
            devs.extend(d for d in b.devices if d not in devs)
        self.cells = [(key, sorted(devs)) for key, devs in sorted(merged.items())]
        if len(self.drawn) == 2:
            self.rows, self.cols = self.shape[self.drawn[0]], self.shape[self.drawn[1]]
        else:
            self.rows, self.cols = 1, (self.shape[self.drawn[0]] if self.drawn else 1)
        # A strip (rank 0 or 1) has no second side to scale; a grid may be too thin to draw so.
        self.to_scale = len(self.drawn) < 2 or _shown_ratio(self.rows, self.cols)[1]

    def box(self, key: tuple[tuple[int, int], ...]) -> tuple[int, int, int, int]:
        """``(c0, r0, w, h)`` of a cell: x along the last drawn dim, y down the first."""
        if len(self.drawn) == 2:
            (r0, r1), (c0, c1) = key
        elif len(self.drawn) == 1:
            (c0, c1), (r0, r1) = key[0], (0, 1)
        else:
            (c0, c1), (r0, r1) = (0, 1), (0, 1)
        return c0, r0, c1 - c0, r1 - r0


def _sharding_geometry(lay: _Layout) -> tuple[tuple[float, float], float]:
    """``(figsize, aspect)``: rank 2+ as a grid drawn to scale (up to ``_MAX_RATIO``; a
    thinner array is drawn at that ratio, and its title says "not to scale"), rank 1 as a
    strip, rank 0 as one small box."""
    if len(lay.drawn) == 2:
        shown, _ = _shown_ratio(lay.rows, lay.cols)  # height / width as drawn
        # The plot fits a 6 x 4.5 inch box, plus room for labels and the title.
        plot_w = min(6.0, 4.5 / shown)
        return (plot_w + 1.6, plot_w * shown + 1.6), shown * lay.cols / max(lay.rows, 1)
    if lay.drawn:
        return (7.0, 2.4), 0.16 * lay.cols
    return (4.5, 2.4), 0.45


def _draw_block(
    ax: Axes,
    lay: _Layout,
    key: tuple[tuple[int, int], ...],
    devs: list[int],
    scale: tuple[float, float],
    compact: bool,
) -> None:
    """One block in its device's colour (striped in its holders' colours when several
    hold it), and the device numbers in it, if they fit legibly."""
    c0, r0, w, h = lay.box(key)
    sx, sy = scale
    start, stop = tuple(k[0] for k in key), tuple(k[1] for k in key)
    gid = f"block:start={start}:stop={stop}:devices={','.join(map(str, devs))}"
    if len(devs) == 1:
        face = device_color(devs[0])
        ax.add_patch(
            Rectangle((c0, r0), w, h, facecolor=face, edgecolor="white", linewidth=1.2, gid=gid)
        )
        ink, box = _text_color(face), None
    else:
        # A block several devices hold: a texture of thin diagonal stripes in their
        # colours (so it does not read as split), its label on a white tag.
        outline = Rectangle((c0, r0), w, h, facecolor="none", edgecolor="white",
                            linewidth=1.2, zorder=1.5, gid=gid)  # fmt: skip
        ax.add_patch(outline)
        _diagonal_stripes(ax, outline, (c0, r0, w, h), devs, sx, sy)
        ink = "black"
        box = {"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "0.5",
               "alpha": 0.95}  # fmt: skip
    label = _device_text(devs, lay.n_all)
    hi = 11.0 if compact else 13.0
    # A device id keeps a margin inside its block, so that neighbours' digits never touch.
    flat = _fit_fontsize(label, w * sx, h * sy, lo=0.0, hi=hi, fill=0.72)
    upright = _fit_fontsize(label, h * sy, w * sx, lo=0.0, hi=hi, fill=0.72)
    tall = h * sy > w * sx
    rotation = 90 if tall and upright > flat * 1.25 and "\n" not in label else 0
    size = upright if rotation else flat
    ax.text(
        c0 + w / 2, r0 + h / 2, label, ha="center", va="center", fontsize=max(size, _MIN_PT),
        color=ink, fontweight="bold", bbox=box, rotation=rotation, clip_on=False,
        # Too small to number legibly: left unnumbered, its colour names the device.
        visible=size >= _MIN_PT, gid=f"block-label:{','.join(map(str, devs))}",
    )  # fmt: skip


def _tick_edges(lay: _Layout, dim: int, room_pt: float, along_x: bool, size: float) -> list[int]:
    """Ticks at block boundaries (in elements), thinned to what ``room_pt`` allows."""
    edges = sorted({b.start[dim] for b in lay.blocks} | {lay.shape[dim]})
    per_tick = size * (0.62 * len(str(lay.shape[dim])) + 1.0) if along_x else size * 1.6
    fit = max(2, int(room_pt / per_tick))
    if len(edges) > fit:
        step = math.ceil((len(edges) - 1) / (fit - 1))
        sel = edges[::step]
        if sel[-1] != edges[-1]:
            crowded = len(sel) >= 2 and edges[-1] - sel[-1] < (sel[1] - sel[0]) / 2
            sel = sel[:-1] + [edges[-1]] if crowded else sel + [edges[-1]]
        edges = sel
    return edges


def _label_sharding_axes(ax: Axes, lay: _Layout, room: tuple[float, float], compact: bool) -> None:
    """Ticks at block boundaries, and each drawn dimension's size and mesh axes."""
    tick_size = _MIN_PT
    label_size = _MIN_PT if compact else 9.5
    sharding, shape, local, drawn = lay.sharding, lay.shape, lay.local, lay.drawn
    if len(drawn) >= 1:
        ax.set_xticks(_tick_edges(lay, drawn[-1], room[0], True, tick_size))
        ax.set_xlabel(_dim_label(shape, local, sharding, drawn[-1], compact), fontsize=label_size)
    else:
        ax.set_xticks([])
        ax.set_xlabel("scalar (rank 0): one value", fontsize=label_size)
    if len(drawn) == 2:
        ax.set_yticks(_tick_edges(lay, drawn[0], room[1], False, tick_size))
        ax.set_ylabel(_dim_label(shape, local, sharding, drawn[0], compact), fontsize=label_size)
    else:
        ax.set_yticks([])
    ax.tick_params(labelsize=tick_size, length=2)
    ax.xaxis.set_label_position("bottom")
    for spine in ax.spines.values():
        spine.set_visible(False)


#: What a compact panel's title says after the spec when the grid is drawn thicker than it is.
_NOT_TO_SCALE = "  (not to scale)"


def _fold_line(lay: _Layout, compact: bool) -> str:
    """The dimensions a drawing leaves out ("folds"), and whether they are split."""
    folded, shape, local = lay.folded, lay.shape, lay.local
    dims = ", ".join(str(d) for d in folded)
    sizes = ", ".join(str(shape[d]) for d in folded)
    head = f"dim {dims} ({sizes})" if len(folded) == 1 else f"dims {dims} ({sizes})"
    if any(local[d] < shape[d] for d in folded):
        tail = "split too" if compact else "split too: a block lists every device with a piece"
        return f"{head} not drawn, {tail}"
    return f"{head} not drawn, not split" + ("" if compact else ": each block holds all of it")


def _sharding_title(lay: _Layout, title: str | None, compact: bool) -> str:
    """The spec, the global and per-device shapes, what is not drawn, and whether the grid is
    drawn to scale."""
    shape, local = lay.shape, lay.local
    lines = [title] if title else []
    scale = "" if lay.to_scale else _NOT_TO_SCALE
    if compact:
        lines += [_spec_text(lay.sharding) + scale, f"per device {local} of {shape}"]
    else:
        lines.append(f"{_spec_text(lay.sharding)}  global {shape} -> per device {local}")
    if lay.folded:
        lines.append(_fold_line(lay, compact))
    if scale and not compact:
        lines.append(f"drawn at most {_MAX_RATIO:g}:1, not to scale")
    return "\n".join(lines)


def _draw_sharding(
    x: Any,
    ax: Axes | None,
    title: str | None,
    compact: bool,
    where: str,
    size_pt: tuple[float, float] | None = None,
) -> Axes:
    lay = _Layout(x, where)
    figsize, aspect = _sharding_geometry(lay)
    ax = _fig_for(ax, figsize)
    ax.set_xlim(0, max(lay.cols, 1))
    ax.set_ylim(max(lay.rows, 1), 0)
    if size_pt is not None and len(lay.drawn) == 2:
        _to_scale(ax, size_pt)  # drawn to the scale its group shares
    else:
        ax.set_aspect(aspect, adjustable="box")
    w_pt, h_pt = _axes_size_pt(ax)
    scale = (w_pt / max(lay.cols, 1), h_pt / max(lay.rows, 1))
    for key, devs in lay.cells:
        _draw_block(ax, lay, key, devs, scale, compact)
    _label_sharding_axes(ax, lay, (w_pt, h_pt), compact)
    # The pad keeps the title clear of the top tick label (half of it stands above the box).
    ax.set_title(_sharding_title(lay, title, compact), fontsize=(_MIN_PT if compact else 10.5),
                 loc="center", pad=(8.0 if compact else 10.0))  # fmt: skip
    return ax


def draw_sharding(x: Any, ax: Axes | None = None, title: str | None = None) -> Axes:
    """Which device holds which block of an array, at any rank.

    Args:
      x: a placed ``jax.Array``, a ``jax.ShapeDtypeStruct`` with ``sharding=...`` (for
        example from ``jax.eval_shape``), or a ``(shape, sharding)`` pair.
      ax: the Axes to draw on; a new figure is made when ``None``.
      title: an optional first title line (e.g. the parameter's name).

    Rank 0 and 1 are drawn as a strip, rank 2 as a grid of blocks drawn to scale while its
    sides are within 4:1; a thinner array is drawn at 4:1 and its title says "not to scale"
    (so that its blocks stay visible). From rank 3 on, the sharded dimensions are drawn (at
    most two; filled up to two with the last unsharded dimensions) and the title names the
    others ("not drawn"). Each block is coloured by
    the device holding it (``device_color``); a replicated block is striped in the colours
    of all its holders and names them (``"0,1,2,3"``, or ``"all 8"`` when every device of
    the sharding holds it). Axis labels give each drawn dimension's index, size and the
    mesh axis it is split over, e.g. ``"dim 0: 64, split over 'data' (8)"``. The title
    gives the spec, the global shape and the per-device shard shape, e.g.
    ``"P('data', None)  global (64, 128) -> per device (8, 128)"``.

    Returns:
      The Axes. Each block is a ``Rectangle`` in ``ax.patches`` with
      ``gid="block:start=(...):stop=(...):devices=0,1"``; its label is in ``ax.texts``.

    Raises:
      ValueError: ``x`` is not an array, or it has no sharding.
    """
    return _draw_sharding(x, ax, title, compact=False, where="draw_sharding: array")


# ---------------------------------------------------------------------------
# draw_param_layouts: a few parameters under several layouts, one row each
# ---------------------------------------------------------------------------


class _Matrix:
    """A parameter as the 2-D matrix ``draw_param_layouts`` draws: its ``groups`` of
    dimensions (rows, columns), ``view`` (an abstract array of that shape whose sharding
    gives every device the same elements as the parameter's), and ``spec``, the
    parameter's own ``PartitionSpec`` as text."""

    def __init__(self, leaf: Any, rows: int | None, where: str) -> None:
        import jax

        shape_, sharding = sharding_of(leaf, where)
        shape = tuple(int(n) for n in shape_)
        rank = len(shape)
        if rank > 2 and rows is None:
            raise ValueError(
                f"{where} has rank {rank}: give matrix_rows an entry for it (how many of its "
                "leading dimensions are the matrix's rows), so that it is drawn the same way "
                "under every layout."
            )
        if rows is None:
            rows = rank - 1 if rank else 0
        if not 0 <= rows <= rank:
            raise ValueError(f"{where}: matrix_rows={rows} for a rank-{rank} array.")
        self.shape, self.sharding, self.spec = shape, sharding, _spec_text(sharding)
        self.groups = (tuple(range(rows)), tuple(range(rows, rank)))
        local = tuple(int(n) for n in shard_shape(shape, sharding))
        entries = []
        for group in self.groups:
            split = [d for d in group if local[d] < shape[d]]
            # a split keeps each device's elements contiguous in the merged dimension only
            # when it cuts the group's first dimension longer than 1
            first = next((d for d in group if shape[d] > 1), None)
            if len(split) > 1 or (split and split[0] != first):
                raise ValueError(
                    f"{where} ({self.spec}, shape {shape}) splits dims {split} of the dims "
                    f"{list(group)} that one matrix side merges: no matrix_rows draws each "
                    "device's part as one block; choose another."
                )
            entries.append(spec_of(sharding)[split[0]] if split else None)
        merged = tuple(math.prod(shape[d] for d in g) for g in self.groups)
        if any(entries) and not isinstance(sharding, NamedSharding):
            raise ValueError(f"{where} has a {type(sharding).__name__}, not a NamedSharding.")
        if isinstance(sharding, NamedSharding):
            from jax.sharding import PartitionSpec

            merged_sharding: Any = NamedSharding(sharding.mesh, PartitionSpec(*entries))
        else:
            merged_sharding = sharding
        self.view = jax.ShapeDtypeStruct(merged, leaf.dtype, sharding=merged_sharding)
        self.local = local

    def sides(self) -> tuple[str, str]:
        """Each side's sizes (``8×16`` for merged dims) and, if split, its mesh axes."""
        out = []
        for group in self.groups:
            size = "×".join(str(self.shape[d]) for d in group) or "1"
            split = [d for d in group if self.local[d] < self.shape[d]]
            axes = _dim_axes(self.sharding, split[0]) if split else ()
            out.append(size + (" / " + " x ".join(f"'{a}'" for a in axes) if axes else ""))
        return out[0], out[1]

    def drawn_shape(self) -> str:
        """``(64, 8×16)``: the matrix's sides, merged dimensions joined by ×."""
        sides = ["×".join(str(self.shape[d]) for d in g) or "1" for g in self.groups]
        return f"({sides[0]}, {sides[1]})"


#: ``draw_param_layouts`` draws a matrix thinner than this ratio at this ratio (its column
#: header says so): thick enough that a split along the short side shows its colours.
_LAYOUT_RATIO = 3.0


def _layout_extent(rows: int, cols: int) -> tuple[float, float, bool]:
    """``(height, width, to scale)`` of a matrix as ``draw_param_layouts`` draws it."""
    ratio = rows / cols if cols else 1.0
    shown = float(np.clip(ratio, 1 / _LAYOUT_RATIO, _LAYOUT_RATIO))
    height, width = (float(rows), rows / shown) if rows >= cols else (cols * shown, float(cols))
    return height, width, math.isclose(shown, ratio)


def _find_leaf(leaves: dict[str, Any], path: str, label: str) -> Any:
    """The leaf at ``path``, or the one leaf whose path ends with ``/path``."""
    if path in leaves:
        return leaves[path]
    found = [k for k in leaves if k.endswith("/" + path)]
    if len(found) != 1:
        raise ValueError(
            f"draw_param_layouts: paths entry {path!r} matches {len(found)} arrays of "
            f"{label!r}'s tree ({found[:3] or sorted(leaves)[:3]}...); give a longer path."
        )
    return leaves[found[0]]


def _rows_for(path: str, matrix_rows: Mapping[str, int]) -> int | None:
    hits = [n for key, n in matrix_rows.items() if path == key or path.endswith("/" + key)]
    return hits[0] if hits else None


def draw_param_layouts(
    trees: Mapping[str, Any],
    paths: Sequence[str],
    *,
    matrix_rows: Mapping[str, int] | None = None,
    title: str | None = None,
) -> Figure:
    """A few parameters under several layouts: one row per layout, one column per parameter.

    Each parameter is drawn as the same matrix in every row, so that two layouts of one
    array can be compared at a glance: an array of rank 3 or more as the 2-D matrix its
    ``matrix_rows`` entry names (that many leading dimensions form the rows, the rest the
    columns: a ``DenseGeneral`` kernel ``(embed, heads, kv)`` with 1 is the ``(embed,
    heads×kv)`` matrix its matmul multiplies by), a vector as one row. Blocks are coloured
    by the device that holds them (``device_color``), striped in the colours of every holder
    when several hold one, and numbered where the number fits; a key under the rows names
    the colours. Each cell's title is the parameter's own ``PartitionSpec``; its axis labels
    give each side's sizes and the mesh axes that split it. Columns share one scale per
    parameter; a matrix thinner than 3:1 is drawn at 3:1 (its header says "not to scale").

    Args:
      trees: a layout's name (``"fsdp on (8, 1)"``) -> a pytree of placed arrays or of
        ``jax.ShapeDtypeStruct`` s with shardings, all with the parameters ``paths`` names.
      paths: the parameters to draw, in order: a path (``"block_0/attn/query/kernel"``) or
        its end, if only one array's path ends so (``"query/kernel"``).
      matrix_rows: path (or path end) -> how many leading dimensions are the matrix's rows,
        for every drawn array of rank 3 or more (lower ranks may have one too).
      title: the figure's title.

    Returns:
      The Figure: its Axes are the cells, row by row (``gid="cell:<layout>:<path>"``), then
      the key; the blocks carry ``draw_sharding``'s ``gid`` s in matrix coordinates.

    Raises:
      ValueError: no layouts or no paths; a path that names no array, or several; an array
        of rank 3 or more without ``matrix_rows``; a layout that splits two dimensions that
        one side of its matrix merges (no block would be contiguous); no sharding.
    """
    if not trees or not paths:
        raise ValueError("draw_param_layouts: trees and paths must both be non-empty.")
    rows_of = dict(matrix_rows or {})
    grid: dict[str, list[_Matrix]] = {}
    for label, tree in trees.items():
        leaves = dict(leaves_with_paths(tree, "draw_param_layouts"))
        grid[label] = [
            _Matrix(_find_leaf(leaves, p, label), _rows_for(p, rows_of),
                    f"draw_param_layouts: parameter {p!r} of {label!r}")
            for p in paths
        ]  # fmt: skip
    col_w, label_w, room, cell_h = 1.7, 0.55, 1.05, 1.85
    head = 0.2 + (0.3 if title else 0.0)
    head_lines = max(  # a header's lines: its path (two if long), its shape, "not to scale"
        (2 if len(p) * 6.0 > col_w * 72.0 - 8.0 else 1) + 1 + (not _layout_extent(*m.view.shape)[2])
        for p, m in zip(paths, grid[next(iter(grid))], strict=True)
    )
    fig_w = label_w + len(paths) * col_w
    holders = sorted(
        {d.id for cells in grid.values() for m in cells for d in m.sharding.device_set}
    )
    per_row = max(1, int(fig_w - 0.2))  # the key: an inch a device
    key_h = 0.3 * -(-len(holders) // per_row)
    fig_h = head + 0.17 * head_lines + 0.1 + len(trees) * cell_h + key_h + 0.25
    fig = _new_figure((fig_w, fig_h))

    def rect(x: float, y_top: float, w: float, h: float) -> list[float]:
        return [x / fig_w, 1 - (y_top + h) / fig_h, w / fig_w, h / fig_h]

    if title:
        fig.suptitle(title, fontsize=11, fontweight="bold", y=1 - 0.1 / fig_h, va="top")
    first = grid[next(iter(grid))]
    for c, (path, m) in enumerate(zip(paths, first, strict=True)):
        scale = "" if _layout_extent(*m.view.shape)[2] else "\nnot to scale"
        fig.text((label_w + (c + 0.5) * col_w) / fig_w, 1 - head / fig_h,
                 f"{path}\n{m.drawn_shape()}{scale}", ha="center", va="top", fontsize=_MIN_PT,
                 fontweight="bold", gid=f"column:{path}")  # fmt: skip
    fits: list[tuple[Any, ...]] = []
    for r, (label, cells) in enumerate(grid.items()):
        y = head + 0.17 * head_lines + 0.1 + r * cell_h
        fig.text(0.12 / fig_w, 1 - (y + 0.3 + room / 2) / fig_h, label, rotation=90, ha="left",
                 va="center", fontsize=9.5, fontweight="bold", gid=f"row:{label}")  # fmt: skip
        for c, (path, m) in enumerate(zip(paths, cells, strict=True)):
            x = label_w + c * col_w
            ax = fig.add_axes(rect(x + 0.38, y + 0.3, col_w - 0.5, room))
            ax.set_gid(f"cell:{label}:{path}")
            _layout_cell(ax, m, ((col_w - 0.5) * 72.0, room * 72.0),
                         f"draw_param_layouts: parameter {path!r} of {label!r}")  # fmt: skip
            fits.append((ax, col_w * 72.0 - 8.0, x, x + col_w))
    _fit_labels(fig, fits)
    _fit_column_headers(fig, col_w * 72.0 - 8.0)
    _device_key(fig, sorted(holders), rect(0.1, fig_h - 0.1 - key_h, fig_w - 0.2, key_h), per_row)
    return fig


def _layout_cell(ax: Axes, m: _Matrix, room_pt: tuple[float, float], where: str) -> None:
    """One cell of ``draw_param_layouts``: the matrix to its shared scale, titled with the
    parameter's spec, each side labelled with its sizes and mesh axes (no ticks)."""
    rows_u, cols_u, _ = _layout_extent(*m.view.shape)
    size = min(room_pt[0] / cols_u, room_pt[1] / rows_u)
    _draw_sharding(m.view, ax, None, compact=True, size_pt=(cols_u * size, rows_u * size),
                   where=where)  # fmt: skip
    ax.set_title(m.spec, fontsize=_MIN_PT, pad=4.0)
    ax.set_xticks([])
    ax.set_yticks([])
    row_side, col_side = m.sides()
    ax.set_ylabel(row_side, fontsize=_MIN_PT)
    ax.set_xlabel(col_side, fontsize=_MIN_PT, labelpad=2.0)


def _fit_column_headers(fig: Figure, width_pt: float) -> None:
    """Each column header at most ``width_pt`` wide: a long path first on two lines (broken
    after its last ``/``), then ``_fit_width``."""
    renderer = _renderer(fig)
    for t in fig.texts:
        if (t.get_gid() or "").startswith("column:"):
            path, rest = t.get_text().split("\n", 1)
            too_wide = t.get_window_extent(renderer).width > width_pt * renderer.points_to_pixels(
                1.0
            )
            if too_wide and "/" in path:
                head, tail = path.rsplit("/", 1)
                t.set_text(f"{head}/\n{tail}\n{rest}")
            _fit_width(t, width_pt, renderer)


def _device_key(fig: Figure, ids: list[int], where: list[float], per_row: int) -> None:
    """A key under the rows: each device's colour and id, ``per_row`` to a line (an inch each)."""
    key = fig.add_axes(where)
    key.set_axis_off()
    key.set_gid("key")
    for k, d in enumerate(ids):
        x, y = k % per_row, k // per_row
        key.add_patch(Rectangle((x, y + 0.2), 0.3, 0.6, facecolor=device_color(d), gid=f"key:{d}"))
        key.text(x + 0.38, y + 0.5, f"device {d}", va="center", fontsize=_MIN_PT)
    key.set_xlim(0, where[2] * fig.get_size_inches()[0])  # one unit an inch
    key.set_ylim(max(1, -(-len(ids) // per_row)), 0)


# ---------------------------------------------------------------------------
# draw_param_shardings
# ---------------------------------------------------------------------------


def _device_id_of_key(key: str) -> int:
    """``planned_bytes_per_device`` keys look like ``"cpu:3"``."""
    return int(str(key).rsplit(":", 1)[-1])


_NUMBERED = re.compile(r"(.*?)(\d+)")


def _stem(key: str) -> tuple[str, int | None]:
    """``"block_10"`` -> ``("block_", 10)``; a key without a number -> ``(key, None)``."""
    m = _NUMBERED.fullmatch(key)
    return (m.group(1), int(m.group(2))) if m else (key, None)


def _display_order(names: list[str], tree: Any, order: Sequence[str] | None) -> list[int]:
    """Indices of ``names`` (paths ``a/b/c``, in flatten order) in model order.

    With ``order`` (paths in model order, from ``helpers.placing.sharding.param_order``): by the
    first entry that is the path, ends with it, or that it ends with (so a subtree such as
    ``{"block_0": ...}`` or a tree with a ``params/`` prefix still matches). Otherwise,
    and for paths ``order`` lacks: siblings keep the order of ``tree``'s dicts, and
    numbered siblings (``block_2``, ``block_10``) follow their numbers, at the place of
    the first of them.
    """
    siblings: dict[tuple[str, ...], dict[str, int]] = {}

    def walk(node: Any, prefix: tuple[str, ...]) -> None:
        if isinstance(node, Mapping):
            for i, (key, value) in enumerate(node.items()):
                siblings.setdefault(prefix, {})[str(key)] = i
                walk(value, (*prefix, str(key)))

    walk(tree, ())
    for pos, name in enumerate(names):  # containers that are not dicts: flatten order
        parts = name.split("/")
        for d in range(len(parts)):
            siblings.setdefault(tuple(parts[:d]), {}).setdefault(parts[d], 10**6 + pos)

    def natural(i: int) -> tuple[tuple[int, int], ...]:
        parts = names[i].split("/")
        out = []
        for d, key in enumerate(parts):
            here = siblings[tuple(parts[:d])]
            stem, number = _stem(key)
            if number is None:
                out.append((here[key], 0))
            else:
                base = min(r for k, r in here.items() if _stem(k)[0] == stem)
                out.append((base, number))
        return tuple(out)

    def given(i: int) -> int | None:
        p = names[i]
        for rank, entry in enumerate(order or ()):
            if entry == p or entry.endswith("/" + p) or p.endswith("/" + entry):
                return rank
        return None

    def key(i: int) -> tuple[int, int, tuple[tuple[int, int], ...]]:
        g = given(i)
        return (0, g, natural(i)) if g is not None else (1, 0, natural(i))

    return sorted(range(len(names)), key=key)


class _Panel:
    """One panel of ``draw_param_shardings``: a parameter, or several small vectors.

    ``names`` are what the panel shows: a parameter's path (``block_0..3/mlp/up/kernel`` in
    a fold), or each vector's path below the group's header. ``paths`` are the full paths
    (of the first layer, in a fold)."""

    def __init__(self, names: list[str], paths: list[str], leaves: list[Any], vectors: bool):
        self.names, self.paths, self.leaves, self.vectors = names, paths, leaves, vectors


class _Group:
    """A run of panels under one header: a layer, or identical layers folded into one."""

    def __init__(self, header: str, count: int) -> None:
        self.header, self.count = header, count
        self.panels: list[_Panel] = []


def _signature(items: list[tuple[tuple[str, ...], Any]]) -> list[Any]:
    return [
        (rel, tuple(leaf.shape), str(leaf.dtype), sharding_of(leaf, "/".join(rel))[1])
        for rel, leaf in items
    ]


def _whole_everywhere(leaf: Any) -> bool:
    shape, sharding = sharding_of(leaf)
    return len(shard_layout(tuple(shape), sharding)) == 1


def _fold_end(
    units: list[tuple[str, list[tuple[tuple[str, ...], Any]], list[str]]],
    i: int,
    m: re.Match[str] | None,
) -> int:
    """One past the last unit that folds with unit ``i``: consecutive numbers, same leaves."""
    j = i + 1
    if m:
        sig = _signature(units[i][1])
        while j < len(units):
            mj = _NUMBERED.fullmatch(units[j][0])
            expected = int(m.group(2)) + (j - i)
            if not (mj and mj.group(1) == m.group(1) and int(mj.group(2)) == expected):
                break
            if _signature(units[j][1]) != sig:
                break
            j += 1
    return j


def _add_panels(
    group: _Group, items: list[tuple[tuple[str, ...], Any]], names: list[str], fold: bool
) -> None:
    """One panel per leaf of ``items``, the whole vectors (when folding) together in one."""
    header = group.header
    vector_idx = [
        k
        for k, (_, leaf) in enumerate(items)
        if fold and len(leaf.shape) <= 1 and _whole_everywhere(leaf)
    ]
    shown_vectors = False
    for k, (rel, leaf) in enumerate(items):
        if k in vector_idx and len(vector_idx) > 1:
            if not shown_vectors:
                group.panels.append(
                    _Panel(
                        ["/".join(items[v][0]) for v in vector_idx],
                        [names[v] for v in vector_idx],
                        [items[v][1] for v in vector_idx],
                        vectors=True,
                    )
                )
                shown_vectors = True
            continue
        title = "/".join(x for x in (header, *rel) if x)  # the path, with the fold's label
        group.panels.append(_Panel([title], [names[k]], [leaf], vectors=False))


def _groups(leaves: list[tuple[str, Any]], fold: bool) -> list[_Group]:
    """Split ordered ``(path, leaf)`` pairs into layers, folding identical numbered ones."""
    parts = [tuple(name.split("/")) for name, _ in leaves]
    # Drop the prefix every path shares ("params/", "params/decoder/"), keeping a name.
    common = 0
    while all(len(p) > common + 1 for p in parts) and len({p[common] for p in parts}) == 1:
        common += 1
    units: list[tuple[str, list[tuple[tuple[str, ...], Any]], list[str]]] = []
    for (name, leaf), p in zip(leaves, parts, strict=True):
        head = p[common] if len(p) > common + 1 else ""
        rel = p[common + 1 :] if head else p[common:]
        if units and units[-1][0] == head:  # top-level leaves (head "") share a group
            units[-1][1].append((rel, leaf))
            units[-1][2].append(name)
        else:
            units.append((head, [(rel, leaf)], [name]))
    prefix = "/".join(parts[0][:common])
    groups: list[_Group] = []
    i = 0
    while i < len(units):
        head, items, names = units[i]
        m = _NUMBERED.fullmatch(head) if fold and head else None
        j = _fold_end(units, i, m)
        if j - i > 1:
            last = _NUMBERED.fullmatch(units[j - 1][0])
            assert m is not None and last is not None
            label = f"{head}..{last.group(2)}"
        else:
            label = head
        header = "/".join(x for x in (prefix, label) if x)
        group = _Group(header, j - i)
        _add_panels(group, items, names, fold)
        groups.append(group)
        i = j
    return groups


def _draw_vectors(ax: Axes, names: list[str], leaves: list[Any], where: str) -> None:
    """Small vectors that every device of their sharding holds whole: one striped bar each."""
    ax.set_xlim(0, 1)
    ax.set_ylim(len(names), 0)
    ax.set_axis_off()
    w_pt, h_pt = _axes_size_pt(ax)
    row_pt = h_pt / max(len(names), 1)
    holders: set[int] = set()
    for r, (name, leaf) in enumerate(zip(names, leaves, strict=True)):
        shape, sharding = sharding_of(leaf, f"{where} '{name}'")
        devs = sorted(d.id for d in sharding.device_set)
        holders.update(devs)
        gid = f"vector:{name}:devices={','.join(map(str, devs))}"
        outline = Rectangle(
            (0, r + 0.1), 1, 0.8, facecolor="none", edgecolor="white", linewidth=1.2,
            zorder=1.5, gid=gid,
        )  # fmt: skip
        ax.add_patch(outline)
        _diagonal_stripes(ax, outline, (0, r + 0.1, 1, 0.8), devs, w_pt, row_pt)
        label = f"{name}  {tuple(shape)}"
        size = _fit_fontsize(label, 0.92 * w_pt, 0.7 * row_pt, lo=_MIN_PT, hi=10.0)
        ax.text(
            0.5, r + 0.5, label, ha="center", va="center", fontsize=size, color="black",
            bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "0.5",
                  "alpha": 0.95},
            gid=f"vector-label:{name}",
        )  # fmt: skip
    n_all = len(holders)
    where_ = (
        f"whole on every device (all {n_all})" if n_all > 1 else f"whole on device {min(holders)}"
    )
    ax.set_title(f"{len(names)} small vectors\n{where_}", fontsize=_MIN_PT, loc="center")


def draw_param_shardings(
    tree: Any,
    title: str | None = None,
    *,
    order: Sequence[str] | None = None,
    fold: bool = True,
) -> Figure:
    """The layout of every parameter of a model, in model order, and bytes per device.

    Args:
      tree: a pytree of placed ``jax.Array`` s, or of ``jax.ShapeDtypeStruct`` s with
        shardings (an abstract tree, nothing allocated).
      title: the figure's title; defaults to the array count and total size.
      order: parameter paths in model order, e.g. ``helpers.placing.sharding.param_order(model,
        x)``. Without it, panels follow the order of ``tree``'s dicts (Flax's creation
        order, if the tree comes straight from ``init``; sorted keys once it has been
        through ``jax.tree.map`` or ``jit``), with numbered names in number order
        (``block_2`` before ``block_10``).
      fold: fold what repeats. Consecutive numbered layers (``block_0``, ``block_1``, ...)
        whose parameters have the same shapes, dtypes and shardings are drawn once, under
        a header ``block_0..3  ×4``; the small vectors of a layer (rank 0 or 1) that every
        device holds whole share one panel, a striped bar each. ``False`` draws every
        array in its own panel.

    Panels are grouped by layer (the first path component after the prefix that every
    path shares, such as ``params/``), each group under a bold header. Groups share a row
    when they fit in it, except that a group that fills more than one row ends its last
    one: the next group's header never stands beside its panels. A panel is titled
    with the parameter's path (in a fold, the fold's label stands for the layer:
    ``block_0..3/mlp/up/kernel``). Each block is coloured by its device (``device_color``).
    The bar chart on the right sums every array of ``tree``, folded ones included, from
    ``helpers.measuring.measure.planned_bytes_per_device``, each bar in its device's colour, and
    its title says so.

    Returns:
      The Figure. Its Axes are the panels in display order, then the bar chart
      (``fig.axes[-1]``), whose bars are ``fig.axes[-1].patches`` in device order. A panel
      Axes has ``gid="param:<path>"`` (for a fold, the path of its first layer; for a
      vector panel, ``"vectors:<path>,<path>,..."``); a group header is a figure text
      with ``gid="group:<header>"``.

    Raises:
      ValueError: a leaf is not an array, or has no sharding; the message names it.
    """
    leaves = leaves_with_paths(tree, "draw_param_shardings")
    if not leaves:
        raise ValueError("draw_param_shardings: the tree has no arrays to draw.")
    for name, leaf in leaves:  # fail before drawing anything, naming the parameter
        sharding_of(leaf, f"draw_param_shardings: parameter '{name}'")
    per_device = planned_bytes_per_device(tree)
    names = [name for name, _ in leaves]
    ordered = [leaves[i] for i in _display_order(names, tree, order)]
    groups = _groups(ordered, fold)

    n_panels = sum(len(g.panels) for g in groups)
    ncols = 1 if n_panels == 1 else 2 if n_panels <= 4 else 3  # at most 3: 10.4 inches wide
    rows = _flow_rows(groups, ncols)
    geo = _Geometry(ncols)
    note_of = lambda flags: textwrap.fill(  # noqa: E731 - about 13 characters an inch at 9 pt
        _figure_note(groups, len(leaves), n_panels, order is not None, flags),
        width=int(geo.fig_w * 13),
    )
    flags = {"shortened": _may_shorten(groups, geo.panel_w), "unnumbered": True, "starred": True}
    note = note_of(flags)  # the room is kept for the longest note
    geo.head = 0.62 + 0.2 * note.count("\n") + 0.2
    heights = [geo.row_height(r) for r in rows]
    geo.fig_h = max(5.0, geo.head + sum(heights))
    fig = _new_figure((geo.fig_w, geo.fig_h))
    fits = _draw_panels(fig, geo, groups, rows, heights)

    bar_h = min(geo.fig_h - geo.head - 1.0, 4.0)
    bar_ax = fig.add_axes(geo.rect(ncols * geo.panel_w + 0.85, geo.head + 0.5, geo.bar_w - 1.0,
                                   bar_h))  # fmt: skip
    n = len(leaves)
    arrays = f"{n} array{'s' if n != 1 else ''}"
    _bar_chart(bar_ax, per_device, arrays, bar_h)
    _clear_of(bar_ax, ncols * geo.panel_w + 0.1)
    total = sum(math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize for _, leaf in leaves)
    if title is None:
        title = f"{arrays}, {format_bytes(total)} in total"
    fig.suptitle(title, fontsize=11, fontweight="bold", y=1 - 0.12 / geo.fig_h, va="top")
    note_text = fig.text(0.5, 1 - 0.42 / geo.fig_h, note, ha="center", va="top",
                         fontsize=_MIN_PT, color="0.3", gid="fold-note", linespacing=1.3)  # fmt: skip
    flags = _fit_labels(fig, fits)
    if note_of(flags).count("\n") <= note.count("\n"):  # else keep the reserved room's note
        note_text.set_text(note_of(flags))
    return fig


_Row = list[tuple[_Group, _Panel, bool]]  # (group, panel, is the group's first panel)


def _flow_rows(groups: list[_Group], ncols: int) -> list[_Row]:
    """Flow the groups into rows: a group starts a new row unless it fits in what is left
    of the row, and the group after one that spilled onto a second row starts a new row
    too, so that no header stands beside another layer's headerless panels."""
    rows: list[_Row] = [[]]
    spilled = False
    for g in groups:
        if rows[-1] and (spilled or len(rows[-1]) + len(g.panels) > ncols):
            rows.append([])
        first_row = len(rows)
        for k, panel in enumerate(g.panels):
            if len(rows[-1]) == ncols:
                rows.append([])
            rows[-1].append((g, panel, k == 0))
        spilled = len(rows) > first_row
    return rows


def _title_lines(panel: _Panel) -> int:
    """Lines of a grid or strip panel's title: its name, its spec, its shapes, and one more
    from rank 3 on, for what is not drawn."""
    return 3 + (1 if _Layout(panel.leaves[0], "draw_param_shardings").folded else 0)


class _Geometry:
    """Fixed geometry in inches (no layout engine), so each panel knows its size while it
    is drawn and can size its labels to fit. A row of strips needs less height; a row whose
    titles have four lines, more."""

    panel_w, plot_h, strip_h, header_h = 2.6, 1.75, 0.4, 0.32  # a grid's room is square
    pad_l, pad_r, pad_b, pad_vectors = 0.7, 0.15, 0.5, 0.45
    bar_w = 2.6

    def __init__(self, ncols: int) -> None:
        self.fig_w = ncols * self.panel_w + self.bar_w
        self.fig_h = 5.0
        self.head = 0.0

    @staticmethod
    def pad_t(lines: int) -> float:
        """Room above a panel's drawing for a title of ``lines`` lines."""
        return (lines * _MIN_PT * 1.25 + 10.0) / 72.0

    def row_lines(self, row: _Row) -> int:
        return max((_title_lines(p) for _, p, _ in row if not p.vectors), default=3)

    def grid_h(self, row: _Row) -> float:
        """The height a row's drawings take: the tallest grid's, drawn in a square room, so
        that a row of flat arrays leaves no empty band below them."""
        room = ((self.panel_w - self.pad_l - self.pad_r) * 72.0, self.plot_h * 72.0)
        sizes = [_panel_size(p, room) for _, p, _ in row if not p.vectors]
        if not sizes or any(s is None for s in sizes):
            return self.plot_h
        return min(self.plot_h, max(s[1] for s in sizes if s is not None) / 72.0)

    def row_height(self, row: _Row) -> float:
        strips = all(not p.vectors and len(p.leaves[0].shape) <= 1 for _, p, _ in row)
        vec_rows = max((len(p.names) for _, p, _ in row if p.vectors), default=0)
        h = self.pad_t(self.row_lines(row)) + (self.strip_h if strips else self.grid_h(row))
        h += self.pad_b
        h = max(h, 0.9 + 0.3 * vec_rows) if vec_rows else h
        return h + (self.header_h if any(first and g.header for g, _, first in row) else 0.0)

    def rect(self, x: float, y_top: float, w: float, h: float) -> list[float]:
        """Inches from the figure's top-left corner -> figure fractions."""
        return [x / self.fig_w, 1 - (y_top + h) / self.fig_h, w / self.fig_w, h / self.fig_h]


def _draw_panels(
    fig: Figure, geo: _Geometry, groups: list[_Group], rows: list[_Row], heights: list[float]
) -> list[tuple[Any, ...]]:
    """Every header and panel, row by row; returns what ``_fit_labels`` must fit: ``((header,
    group), the width in points it may take)``, or ``(Axes, that width, its panel's left and
    right edges in inches)``."""
    fits: list[tuple[Any, ...]] = []
    y = geo.head
    for row, h in zip(rows, heights, strict=True):
        has_header = any(first and g.header for g, _, first in row)
        top = y + (geo.header_h if has_header else 0.0)
        grid_pad_t = geo.pad_t(geo.row_lines(row))  # one for the row, so its drawings align
        for c, (g, panel, first) in enumerate(row):
            if first and g.header:
                header = fig.text((c * geo.panel_w + 0.12) / geo.fig_w, 1 - (y + 0.24) / geo.fig_h,
                                  _header_text(g), ha="left", va="baseline", fontsize=9.5,
                                  fontweight="bold", color="0.15", gid=f"group:{g.header}")  # fmt: skip
                span = sum(1 for g2, _, _ in row if g2 is g)
                fits.append(((header, g), span * geo.panel_w * 72.0 - 14.0))
            left = geo.pad_l * (0.25 if panel.vectors else 1)
            pad_t = geo.pad_vectors if panel.vectors else grid_pad_t
            ax = fig.add_axes(
                geo.rect(c * geo.panel_w + left, top + pad_t, geo.panel_w - left - geo.pad_r,
                         h - (top - y) - pad_t - (0.15 if panel.vectors else geo.pad_b))
            )  # fmt: skip
            if panel.vectors:
                ax.set_gid("vectors:" + ",".join(panel.paths))
                _draw_vectors(ax, panel.names, panel.leaves, "draw_param_shardings: parameter")
            else:
                ax.set_gid(f"param:{panel.paths[0]}")
                _draw_sharding(
                    panel.leaves[0], ax, panel.names[0], compact=True,
                    where=f"draw_param_shardings: parameter '{panel.paths[0]}'",
                    size_pt=_panel_size(panel, _axes_size_pt(ax)),
                )  # fmt: skip
            fits.append((ax, geo.panel_w * 72.0 - 8.0, c * geo.panel_w, (c + 1) * geo.panel_w))
        y += h
    return fits


def _bar_chart(bar_ax: Axes, per_device: dict[str, int], arrays: str, bar_h: float) -> None:
    """Bytes held per device, one bar each in its device's colour, its value above it."""
    bar_ax.set_gid("bytes-per-device")
    ids = [_device_id_of_key(k) for k in per_device]
    heights_b = list(per_device.values())
    xs = np.arange(len(ids))
    bars = bar_ax.bar(
        xs, heights_b, color=[device_color(i) for i in ids], edgecolor="0.3", linewidth=0.5
    )
    for bar, key in zip(bars, per_device, strict=True):
        bar.set_gid(f"bar:{key}")
    pad = max(0.0, (4 - len(ids)) / 2)  # one or two bars stay bar-shaped
    bar_ax.set_xlim(-0.6 - pad, len(ids) - 0.4 + pad)
    bar_ax.set_xticks(xs, [str(i) for i in ids], fontsize=_MIN_PT)
    bar_ax.set_xlabel("device id", fontsize=9.5)
    top = max(heights_b) if heights_b else 1
    unit = max(u for u in (1, 1024, 1024**2, 1024**3) if u <= max(top, 1))
    ticks = MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]).tick_values(0, top / unit) * unit
    bar_ax.yaxis.set_major_locator(FixedLocator([t for t in ticks if t <= top * 1.1]))
    bar_ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_bytes(v)))
    bar_ax.tick_params(axis="y", labelsize=_MIN_PT)
    # Each bar's value, rotated above it, where the bars are far enough apart for its type.
    slot_pt = _axes_size_pt(bar_ax)[0] / max(len(ids) + 2 * pad, 1)
    labelled = slot_pt >= 1.25 * _MIN_PT
    chars = max((len(format_bytes(v)) for v in heights_b), default=1) if labelled else 0
    room = min(0.6, (_MIN_PT * 0.7 * chars + 6) / (bar_h * 72.0))
    bar_ax.set_ylim(0, top * 1.015 / (1 - room) if top else 1)
    for bar, hb in zip(bars, heights_b, strict=True) if labelled else ():
        bar_ax.text(bar.get_x() + bar.get_width() / 2, hb + top * 0.015, format_bytes(hb),
                    ha="center", va="bottom", fontsize=_MIN_PT, rotation=90)  # fmt: skip
    bar_ax.set_title(f"bytes held per device:\nthe sum of all {arrays} drawn", fontsize=9.5)
    for side in ("top", "right"):
        bar_ax.spines[side].set_visible(False)


def _clear_of(ax: Axes, left_in: float) -> None:
    """Move ``ax`` right, and narrow it, until its y tick labels start right of ``left_in``
    inches (a very large byte count makes them wide)."""
    renderer = _renderer(ax.figure)
    over = left_in * ax.figure.dpi - ax.yaxis.get_tightbbox(renderer).x0
    if over > 0:
        pos = ax.get_position()
        dx = over / (ax.figure.get_size_inches()[0] * ax.figure.dpi)
        ax.set_position([pos.x0 + dx, pos.y0, max(pos.width - dx, 0.05), pos.height])


def _header_text(g: _Group) -> str:
    """A group's header: its layer, and for a fold how many layers it stands for."""
    if g.count > 1:
        return f"{g.header}: {g.count} layers with the same layout, drawn once"
    return g.header


def _figure_note(
    groups: list[_Group], n_arrays: int, n_panels: int, ordered: bool, flags: dict[str, bool]
) -> str:
    """The line under the title: what the panels show, in words a learner reads at once.
    ``flags``: whether a name was shortened, a block left unnumbered, a title's "(not to
    scale)" cut to a star."""
    how = (
        "in model order"
        if ordered
        else "in the tree's order (numbered layers counted up: block_2 before block_10)"
    )
    note = f"{n_arrays} arrays in {n_panels} panels, {how}"
    folds = [f"{g.header} ({g.count} layers)" for g in groups if g.count > 1]
    if folds:
        note += "; layers with the same layout drawn once: " + ", ".join(folds)
    if any(p.vectors for g in groups for p in g.panels):
        note += "; a layer's small vectors held whole everywhere share one panel"
    grids = [p for g in groups for p in g.panels if not p.vectors and len(p.leaves[0].shape) > 1]
    if grids:
        note += "; each array drawn to its own scale"
        if not all(_Layout(p.leaves[0], "draw_param_shardings").to_scale for p in grids):
            note += ", except where marked (not to scale)" + (" or *" if flags["starred"] else "")
    if flags["unnumbered"]:
        note += "; a block too small to number shows its device by colour (see the bars)"
    if flags["shortened"]:
        note += "; a name that starts with '…/' lost its first parts (its header has them)"
    return note


def _may_shorten(groups: list[_Group], panel_w: float) -> bool:
    """Whether a panel's title or a header may need shortening (a generous estimate, so
    that the note has room for saying so)."""
    titles = [len(p.names[0]) * _MIN_PT * 0.6 for g in groups for p in g.panels if not p.vectors]
    headers = [len(g.header) * 9.5 * 0.65 for g in groups]
    return max([*titles, *headers, 0.0]) > panel_w * 72 - 14


def _panel_size(panel: _Panel, room: tuple[float, float]) -> tuple[float, float] | None:
    """The drawing box, in points, of a grid panel in a ``room`` (width, height): the largest
    that fits and keeps the array's proportions, except that an array thinner than
    ``_MAX_RATIO`` is drawn at that ratio (its title says "not to scale"). Each panel has its
    own scale, so that a small array is as legible as a large one. None for a strip."""
    extent = _drawn_extent(panel.leaves[0])
    if extent is None:
        return None
    rows, cols = _drawn_extent_units(max(extent[0], 1), max(extent[1], 1))
    scale = min(room[0] / cols, room[1] / rows)
    return cols * scale, rows * scale


def _renderer(fig: Figure) -> Any:
    canvas = fig.canvas
    return canvas.get_renderer() if hasattr(canvas, "get_renderer") else fig._get_renderer()


def _shorter(line: str) -> str | None:
    """``line`` one step shorter and still readable: drop its first path component (the
    panels' shared start, shown as ``…/``), else cut its middle. None: nothing to cut."""
    body = line[2:] if line.startswith("…/") else line
    if "/" in body:
        return "…/" + body.split("/", 1)[1]
    if len(line) <= 8:
        return None
    cut = max(1, len(line) // 8)
    mid = len(line) // 2
    return line[: mid - cut] + "…" + line[mid + cut :]


def _fit_width(
    t: Any, max_pt: float, renderer: Any, min_size: float = _MIN_PT, paths: bool = True
) -> bool:
    """Make text ``t`` at most ``max_pt`` wide: its first line's path loses its start
    (``…/``) first (not for an axis label: ``paths=False``), then the type gets smaller (down
    to ``min_size``), then the line is cut in the middle; if nothing readable fits, the text
    is hidden. Returns whether the first line was cut."""
    first_line = t.get_text().split("\n")[0]
    max_px = max_pt * renderer.points_to_pixels(1.0)

    def fits() -> bool:
        return t.get_window_extent(renderer).width <= max_px

    def shorten(paths_only: bool) -> bool:
        first, *rest = t.get_text().split("\n")
        body = first[2:] if first.startswith("…/") else first
        widest = max(len(line) for line in [first, *rest])
        if paths_only and (not paths or "/" not in body or len(first) < widest):
            return False  # the path is not what overflows
        short = _shorter(first)
        if short is None:
            return False
        t.set_text("\n".join([short, *rest]))
        return True

    for _ in range(200):
        if not t.get_text() or fits():
            return t.get_text().split("\n")[0] != first_line
        if shorten(paths_only=True):
            continue
        if t.get_fontsize() > min_size:
            t.set_fontsize(max(min_size, t.get_fontsize() * 0.9))
            continue
        if not shorten(paths_only=False):
            break
    if not fits():
        t.set_visible(False)  # nothing readable fits: leave the space empty
    return t.get_text().split("\n")[0] != first_line


def _fit_header(t: Any, g: _Group, max_pt: float, renderer: Any) -> bool:
    """A group header in its room: shorter wording for a fold first, then ``_fit_width``."""
    max_px = max_pt * renderer.points_to_pixels(1.0)
    if g.count > 1:
        for text in (
            f"{g.header}: {g.count} layers alike, drawn once",
            f"{g.header} ({g.count} layers)",
        ):
            if t.get_window_extent(renderer).width <= max_px:
                return False
            t.set_text(text)
    return _fit_width(t, max_pt, renderer)


def _shorter_lines(t: Any, max_pt: float, renderer: Any) -> bool:
    """A compact title's lines past the first (its name, which ``_fit_width`` shortens), each
    shortened if it overflows: the shapes line loses "per device", the spec line's "(not to
    scale)" becomes a star (the figure's note says what it means). Returns whether a star
    was used."""
    max_px = max_pt * renderer.points_to_pixels(1.0)
    props = t.get_fontproperties()

    def width(line: str) -> float:
        return float(renderer.get_text_width_height_descent(line, props, ismath=False)[0])

    lines = t.get_text().split("\n")
    for i in range(1, len(lines)):
        for old, new in (("per device ", ""), (_NOT_TO_SCALE, " *")):
            if width(lines[i]) > max_px:
                lines[i] = lines[i].replace(old, new)
    t.set_text("\n".join(lines))
    return any(line.endswith(" *") for line in lines[1:])


def _nudge_into(ax: Axes, t: Any, edges: list[float], renderer: Any) -> None:
    """Slide text ``t`` (a title or an x label, centred on ``ax``) sideways until it lies
    between its panel's edges (inches), so that it never reaches into the next panel."""
    box = t.get_window_extent(renderer)
    dpi = ax.figure.dpi
    left, right = edges[0] * dpi + 4.0, edges[1] * dpi - 4.0
    shift = min(0.0, right - box.x1) or max(0.0, left - box.x0)
    if shift:
        t.set_x(t.get_position()[0] + shift / ax.get_window_extent(renderer).width)


def _fit_labels(fig: Figure, fits: list[tuple[Any, ...]]) -> dict[str, bool]:
    """Shorten what would overflow its panel: a panel's title and axis labels, a header, a
    vector's label. Returns the note's flags: whether a name lost its first parts (``…/``),
    whether a title marks "not to scale" with a star, whether a block is unnumbered."""
    renderer = _renderer(fig)
    px = renderer.points_to_pixels(1.0)
    flags = {"shortened": False, "starred": False, "unnumbered": False}
    for obj, width, *edges in fits:
        if isinstance(obj, tuple):  # (header, its group)
            flags["shortened"] |= _fit_header(obj[0], obj[1], width, renderer)
            continue
        flags["starred"] |= _shorter_lines(obj.title, width, renderer)
        flags["shortened"] |= _fit_width(obj.title, width, renderer)
        _nudge_into(obj, obj.title, edges, renderer)
        if obj.axison:
            _fit_width(obj.xaxis.label, width, renderer, paths=False)
            _nudge_into(obj, obj.xaxis.label, edges, renderer)
            _fit_height(obj.yaxis.label, obj.get_window_extent(renderer).height / px + 4.0,
                        renderer)  # fmt: skip
        for t in obj.texts:
            gid = t.get_gid() or ""
            flags["unnumbered"] |= gid.startswith("block-label:") and not t.get_visible()
            if gid.startswith("vector-label:"):
                room = obj.get_window_extent(renderer).width * 0.95 / px
                flags["shortened"] |= _fit_width(t, room, renderer)
    return flags


def _fit_height(t: Any, max_pt: float, renderer: Any) -> None:
    """A rotated axis label at most ``max_pt`` tall: smaller type, then its mesh axes on a
    second line, then its dimension and mesh axes without the size, then just its dimension."""
    max_px = max_pt * renderer.points_to_pixels(1.0)
    while t.get_window_extent(renderer).height > max_px and t.get_fontsize() > _MIN_PT:
        t.set_fontsize(max(_MIN_PT, t.get_fontsize() * 0.9))
    text = t.get_text()
    if t.get_window_extent(renderer).height > max_px and " / " in text:
        t.set_text(text.replace(" / ", "\n/ ", 1))  # "dim 1: 8\n/ 'model'"
        if t.get_window_extent(renderer).height > max_px:
            t.set_text(text)
    if t.get_window_extent(renderer).height > max_px and ":" in text and " / " in text:
        dim, axes = text.split(":")[0], text.split(" / ", 1)[1]
        for short in (f"{dim} / {axes}", f"{dim}\n/ {axes}"):  # keep the mesh axis, drop the size
            t.set_text(short)
            if t.get_window_extent(renderer).height <= max_px:
                break
    if t.get_window_extent(renderer).height > max_px:
        t.set_text(text.split(":")[0])  # "dim 0: 64 / 'data'" -> "dim 0"
    if t.get_window_extent(renderer).height > max_px:
        t.set_visible(False)


def _guide_answer(color: str) -> dict[str, Any]:
    """The box style of a strategy (an answer) in the strategy guide."""
    return {
        "boxstyle": "round,pad=0.55",
        "facecolor": color,
        "edgecolor": "0.2",
        "linewidth": 1.5,
    }


def _guide_box(
    ax: Axes, xy: tuple[float, float], text: str, style: dict[str, Any], size: float, weight: str
) -> None:
    """A boxed text centred at ``xy``."""
    ax.text(*xy, text, ha="center", va="center", fontsize=size, bbox=style, fontweight=weight)


def _guide_arrow(
    ax: Axes,
    start: tuple[float, float],
    end: tuple[float, float],
    label: str,
    label_xy: tuple[float, float] | None,
) -> None:
    """An arrow from ``start`` to ``end``, with a bold ``label`` at ``label_xy`` if given."""
    ax.annotate(
        "", xy=end, xytext=start, arrowprops={"arrowstyle": "-|>", "lw": 1.6, "color": "0.25"}
    )
    if label:
        assert label_xy is not None
        ax.text(
            *label_xy,
            label,
            fontsize=10.5,
            fontweight="bold",
            color="0.1",
            ha="center",
            va="center",
        )


def _guide_below_the_knee(ax: Axes, xy: tuple[float, float]) -> None:
    """The strategy guide's remedies for a step below the knee, DP's or FSDP's, a box at ``xy``.

    A second axis splitting the parameters (each one, or the layers or experts) cuts DP's
    all-reduce and FSDP's gathers alike (the scaling book's GPU chapter, "Reductions when array is sharded over a separate axis";
    its LLaMA-3 example: "The 16-way PP reduces the cost of the data parallel AllReduce by
    16x"). Inside the node it cuts the bytes on the node's links but not across nodes; model
    parallelism spanning nodes cuts those (its Pop Quiz 3 and TLDR). Pipelining "usually makes
    ZeRO-3 impossible ... but you can do ZeRO-1 instead" (same TLDR,
    https://jax-ml.github.io/scaling-book/gpus/).
    """
    ax.text(*xy, "Below the knee (DP or FSDP):\n• more tokens per device (a larger batch)\n"
            "• a second axis splitting the parameters:\n   inside one node, TP in the node cuts\n"
            "   the bytes per device; across nodes,\n   model parallelism spanning nodes\n"
            "   (TP, PP or EP) cuts the cross-node\n   bytes; TP inside each node does not\n"
            "• with PP, ZeRO-1 instead of FSDP\n   (each stage would gather its layers)",
            ha="center", va="center", multialignment="left", fontsize=10,
            bbox=_guide_answer("#eeeeee"))  # fmt: skip


def draw_strategy_guide(ax: Axes | None = None) -> Axes:
    """The chapter's missing summary picture: a flowchart from model size, device memory
    and interconnect to the sharding strategy to pick. Notebook 03b explains it."""
    if ax is None:
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=(13, 8.4))
        ax = fig.add_axes((0.01, 0.01, 0.98, 0.93))
    ax.set_xlim(0, 13)
    ax.set_ylim(0, 8.4)
    ax.set_axis_off()
    question = {"boxstyle": "round,pad=0.5", "facecolor": "#f3f3f3", "edgecolor": "0.35"}

    answer = _guide_answer

    def box(xy, text, style, size=10.5, weight="normal"):
        _guide_box(ax, xy, text, style, size, weight)

    def arrow(start, end, label="", label_xy=None):
        _guide_arrow(ax, start, end, label, label_xy)

    box((6.5, 7.75), "Training state of P parameters: about 16·P bytes in fp32 with Adam\n"
        "(4 params + 4 grads + 8 Adam m, v), plus activations (they grow with batch × sequence)",
        question)  # fmt: skip
    box((6.5, 6.45), "Does it all fit in ONE device's memory?", question, 11.5, "bold")
    box((2.5, 4.2), "DP\nreplicate the parameters, split the batch\n"
        "sends 2·(N−1)/N × the parameter bytes per step\n(one all-reduce)\nsimplest: the reference to check others against\n"
        "compute hides the all-reduce only while\ntokens per device > FLOP/s ÷ link bandwidth\n"
        "(the same knee as FSDP's)", answer("#cfe8cf"))  # fmt: skip
    box(
        (9.4, 4.65),
        "Does it fit split N ways?\n16·P / N + a gathered layer or two + activations\n"
        "(FSDP that frees each layer after use:\nthe layers in a scan, notebook 03 §5, on XLA:CPU)",
        question,
        11,
        "bold",
    )
    box((7.1, 2.8), "Tokens per device  >  FLOP/s ÷ link bandwidth?\n(bf16 on the wire: "
        "≈ 2,200 on H100 NVLink;\n≈ 2,500 across DGX H100 nodes, 8 NICs each)", question, 10.5)  # fmt: skip
    box((6.2, 0.95), "FSDP (ZeRO-3) over 'data'\nshards params, grads and Adam state\n"
        "sends 3·(N−1)/N × the parameter bytes\nper step: gathers each layer, frees it,\n"
        "gathers it again for the backward\n(2·(N−1)/N if it keeps every gathered\n"
        "layer, but then the whole model\nsits on each device)",
        answer("#cfe0f5"), 10)  # fmt: skip
    box((10.75, 0.95), "FSDP × TP on a 2-D mesh\n'model' (TP) inside an NVLink node:\n"
        "its activation all-reduces in every\nlayer need fast links\n'data' (FSDP) across nodes: TP inside\n"
        "a node leaves its cross-node bytes\nas they were", answer("#f7dcc4"), 10)  # fmt: skip
    _guide_below_the_knee(ax, (2.0, 1.2))

    arrow((6.5, 7.42), (6.5, 6.72))
    arrow((5.2, 6.18), (3.1, 5.02), "yes", (3.9, 5.8))
    arrow((7.8, 6.18), (8.85, 5.3), "no", (8.6, 5.85))
    arrow((8.7, 4.08), (7.9, 3.18), "yes", (8.05, 3.72))
    box((11.6, 6.5), "fewer bytes per parameter:\nAdam in 8 bits, or Adafactor;\n"
        "more devices; or offload\nthe state to CPU memory", answer("#eeeeee"), 10)  # fmt: skip
    arrow((10.3, 5.25), (11.3, 6.0), "no: 16·P / N alone\ndoes not fit", (11.95, 5.45))
    arrow((10.4, 4.08), (10.9, 1.95), "no: one layer\nis too big to\ngather whole", (11.85, 3.0))
    arrow((7.0, 2.42), (6.7, 2.05), "yes", (7.2, 2.2))
    arrow((5.15, 2.7), (3.75, 2.25), "no", (4.5, 2.75))
    arrow((1.2, 3.32), (1.2, 2.42), "below\nthe knee", (0.55, 2.87))
    ax.set_title("Choosing a sharding strategy from model size, device memory and interconnect",
                 fontsize=13.5)  # fmt: skip
    return ax
