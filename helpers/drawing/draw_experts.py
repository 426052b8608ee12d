"""Figures of a mixture of experts: where each token goes, and how full each expert is.

``draw_routing`` draws, for one small batch, every token on the left (in its device's
colour, ``device_color``, numbered from 0 on each device, the device named beside its tokens),
every expert on the right (in the
colour of the device that holds it), and a line from each token to each expert it chose:
solid, in the token's device colour, when the expert took it; dotted black with a cross on
the expert's box when the expert was full and dropped it (black, because grey is device 7's
colour). Beside it, the
load per expert, of the drawn tokens or of one whole routing group (``group=``): the
choices each expert took, in its device's colour, above them, hatched, the ones it dropped,
and, with ``capacity=``, a line at the capacity.

It makes a figure (or draws on ``fig``), returns it, and never calls ``plt.show()``.
Artists carry ``gid`` strings for tests: ``"route:token=<t>:expert=<e>:kept=<0|1>"``,
``"drop:token=<t>:expert=<e>"`` (a cross), ``"token:<t>:device=<d>"``,
``"expert:<e>:device=<d>"``, ``"load:expert=<e>:took=<n>"``,
``"load:expert=<e>:dropped=<n>"`` and ``"capacity:<c>"`` (``t`` counts all the tokens drawn).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator

from helpers.drawing.draw import _new_figure, _text_color, device_color

__all__ = ["draw_routing"]


def _ints(a: Any, name: str) -> np.ndarray:
    arr = np.asarray(a)
    if arr.ndim != 2 or not (np.issubdtype(arr.dtype, np.integer) or arr.dtype == bool):
        raise ValueError(
            f"draw_routing: {name} must be a 2-D (tokens, k) array of ints or bools, as route() "
            f"returns; got shape {arr.shape}, dtype {arr.dtype}."
        )
    return arr


def _check_routing(ex: np.ndarray, kp: np.ndarray, n_experts: int, n_devices: int) -> int:
    """Refuse what ``draw_routing`` cannot draw; the number of tokens."""
    if ex.shape != kp.shape:
        raise ValueError(f"draw_routing: expert {ex.shape} and kept {kp.shape} must match.")
    for name, v in (("n_experts", n_experts), ("n_devices", n_devices)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"draw_routing: {name}={v!r} must be an int >= 1.")
    tokens = ex.shape[0]
    if n_experts % n_devices or tokens % n_devices:
        raise ValueError(
            f"draw_routing: n_devices={n_devices} must divide the {tokens} tokens and the "
            f"n_experts={n_experts} experts."
        )
    if ex.size and (ex.min() < 0 or ex.max() >= n_experts):
        raise ValueError(f"draw_routing: expert ids must lie in 0..{n_experts - 1}.")
    return tokens


def _draw_load_bars(
    bars: Axes,
    ex: np.ndarray,
    kp: np.ndarray,
    exp_dev: np.ndarray,
    capacity: int | None,
    what: str,
) -> None:
    """The choices each expert took and dropped, as stacked bars in its device's colour."""
    n_experts = len(exp_dev)
    took = np.array([int((kp & (ex == e)).sum()) for e in range(n_experts)])
    dropped = np.array([int((~kp & (ex == e)).sum()) for e in range(n_experts)])
    colors = [device_color(int(d)) for d in exp_dev]
    for e in range(n_experts):
        bars.bar(e, took[e], color=colors[e], edgecolor="0.3", linewidth=0.5,
                 gid=f"load:expert={e}:took={took[e]}", label="taken (its device's colour)" if e == 0 else None)  # fmt: skip
        bars.bar(e, dropped[e], bottom=took[e], color="white", edgecolor="black", hatch="xx",
                 linewidth=0.6, gid=f"load:expert={e}:dropped={dropped[e]}",
                 label="dropped" if e == 0 else None)  # fmt: skip
    top = max(1, int((took + dropped).max()), capacity or 0)
    if capacity is not None:
        bars.axhline(capacity, color="black", ls="--", lw=1.2, gid=f"capacity:{capacity}",
                     label=f"capacity: {capacity} slots")  # fmt: skip
    step = max(1, int(np.ceil(n_experts / 16)))
    bars.set_xticks(range(0, n_experts, step), [str(e) for e in range(0, n_experts, step)],
                    fontsize=9)  # fmt: skip
    bars.tick_params(axis="y", labelsize=9)
    bars.yaxis.set_major_locator(MaxNLocator(integer=True))
    bars.set_xlabel("expert", fontsize=9)
    bars.set_ylabel("choices routed to it", fontsize=9)
    legend = bars.legend(fontsize=9, frameon=False, loc="upper left", ncol=1)
    bars.set_ylim(0, top / _below_legend(bars, legend))  # headroom for the legend, no more
    bars.set_title(f"load per expert, {what}:\n{int(dropped.sum())} of {kp.size} choices dropped",
                   fontsize=9.5)  # fmt: skip
    for spine in ("top", "right"):
        bars.spines[spine].set_visible(False)


def _below_legend(ax: Axes, legend: Any) -> float:
    """The height, as a fraction of ``ax``'s, under its legend (less a small gap): the tallest
    bar may reach it without running into the legend. The legend sits in axes coordinates, so
    changing the y limits afterwards does not move it. Without a renderer, 1/1.6."""
    get_renderer = getattr(ax.figure.canvas, "get_renderer", None)
    if get_renderer is None:
        return 1 / 1.6
    bottom = ax.transAxes.inverted().transform(legend.get_window_extent(get_renderer()))[0][1]
    return float(np.clip(bottom - 0.04, 0.3, 0.95))


def _device_key(ax: Axes, ty: np.ndarray, n_devices: int, unit_pt: float) -> None:
    """Each device's name beside its tokens (at ``ty``, in device order), as y tick labels;
    every few devices only where names would stand under 12 pt apart (``unit_pt``: the
    points in one unit of the y axis)."""
    per_device = len(ty) // n_devices
    token_rows = float(ty[1] - ty[0]) if len(ty) > 1 else 1.0
    every = max(1, int(np.ceil(12 / max(token_rows * per_device * unit_pt, 1e-9))))
    shown = range(0, n_devices, every)
    ax.set_yticks([float(np.mean(ty[d * per_device : (d + 1) * per_device])) for d in shown],
                  [f"device {d}" for d in shown], fontsize=9)  # fmt: skip
    ax.tick_params(axis="y", length=0)


def draw_routing(
    expert: Any,
    kept: Any,
    *,
    n_experts: int,
    n_devices: int,
    group: tuple[Any, Any] | None = None,
    capacity: int | None = None,
    token_label: str = "token\n(numbered on\nits device)",
    fig: Figure | None = None,
) -> Figure:
    """Token -> expert -> device for one small batch, and the load per expert.

    ``expert`` and ``kept`` are ``(tokens, k)``, as in ``route``'s result, the tokens in
    device order (device ``d`` holds the ``d``-th ``tokens / n_devices`` of them); device
    ``j`` holds experts ``j·E/n ... (j+1)·E/n - 1``. The bars count the drawn tokens'
    choices, or, with ``group=(expert, kept)``, those of one whole routing group (whose
    capacity, given as ``capacity``, is drawn as a line). Each token's box holds its number
    among its device's tokens; ``token_label`` heads their column (say what they are).
    """
    ex, kp = _ints(expert, "expert"), _ints(kept, "kept").astype(bool)
    tokens = _check_routing(ex, kp, n_experts, n_devices)
    if capacity is not None and (
        isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 1
    ):
        raise ValueError(f"draw_routing: capacity={capacity!r} must be None or an int >= 1.")
    if group is None:
        g_ex, g_kp, what = ex, kp, f"the {tokens} tokens drawn"
    else:
        g_ex, g_kp = _ints(group[0], "group's expert"), _ints(group[1], "group's kept").astype(bool)
        _check_routing(g_ex, g_kp, n_experts, 1)
        what = f"one group of {g_ex.shape[0]} tokens"
    tok_dev = np.arange(tokens) // (tokens // n_devices)
    exp_dev = np.arange(n_experts) // (n_experts // n_devices)
    if fig is None:
        fig = _new_figure((11.0, max(3.6, 0.2 * max(tokens, 2 * n_experts) + 1.4)))
    grid = fig.add_gridspec(1, 2, width_ratios=(1.15, 1.0), wspace=0.28)
    ax = fig.add_subplot(grid[0, 0])
    rows = max(tokens, n_experts)
    ty = (np.arange(tokens) + 0.5) * rows / tokens
    ey = (np.arange(n_experts) + 0.5) * rows / n_experts
    for t in range(tokens):
        for j in range(ex.shape[1]):
            e, ok = int(ex[t, j]), bool(kp[t, j])
            ax.plot([0.62, 2.38], [ty[t], ey[e]], color=device_color(int(tok_dev[t])) if ok else "black",
                    lw=1.1 if ok else 1.4, ls="-" if ok else (0, (1, 1.5)), alpha=0.85 if ok else 1,
                    gid=f"route:token={t}:expert={e}:kept={int(ok)}", zorder=1 if ok else 1.5)  # fmt: skip
            if not ok:  # a cross on the box of the full expert that turned it away
                ax.plot(2.49, ey[e], marker="X", ms=8, mfc="black", mec="white", mew=0.8,
                        zorder=4, gid=f"drop:token={t}:expert={e}")  # fmt: skip
    box_t = min(0.8, 0.8 * rows / tokens)
    box_e = min(0.8, 0.8 * rows / n_experts)
    size = float(np.clip(11 * min(box_t, box_e) + 1, 5.5, 9.0))
    for t in range(tokens):
        face = device_color(int(tok_dev[t]))
        ax.add_patch(Rectangle((0.0, ty[t] - box_t / 2), 0.6, box_t, facecolor=face,
                               edgecolor="white", gid=f"token:{t}:device={tok_dev[t]}", zorder=2))  # fmt: skip
        ax.text(0.3, ty[t], str(t % (tokens // n_devices)), ha="center", va="center", fontsize=size,
                color=_text_color(face), zorder=3)  # fmt: skip
    for e in range(n_experts):
        face = device_color(int(exp_dev[e]))
        ax.add_patch(Rectangle((2.4, ey[e] - box_e / 2), 0.6, box_e, facecolor=face,
                               edgecolor="white", gid=f"expert:{e}:device={exp_dev[e]}", zorder=2))  # fmt: skip
        ax.text(2.7, ey[e], str(e), ha="center", va="center", fontsize=size,
                color=_text_color(face), zorder=3)  # fmt: skip
    ax.set_xlim(-0.05, 3.05)
    ax.set_ylim(rows, 0)
    ax.set_xticks([0.3, 2.7], [token_label, "expert"], fontsize=9, va="top")
    _device_key(ax, ty, n_devices, fig.get_figheight() * 72 / (rows + 2))
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_title("each token to its experts (colour: the device holding it;\n"
                 "black dotted with ×: dropped, the expert was full in its group)", fontsize=9.5)  # fmt: skip
    bars = fig.add_subplot(grid[0, 1])
    _draw_load_bars(bars, g_ex, g_kp, exp_dev, capacity, what)
    return fig
