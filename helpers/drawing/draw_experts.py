"""Figures of a mixture of experts: where each token goes, and how full each expert is.

``draw_routing`` draws, for one small batch, every token on the left (in its device's
colour, ``device_color``), every expert on the right (in the colour of the device that
holds it), and a line from each token to each expert it chose: solid when the expert took
it, dashed grey when the expert was full and dropped it. Beside it, the load per expert:
the choices each expert took, in its device's colour, and above them, hatched grey, the
ones it dropped.

It makes a figure (or draws on ``fig``), returns it, and never calls ``plt.show()``.
Artists carry ``gid`` strings for tests: ``"route:token=<t>:expert=<e>:kept=<0|1>"``,
``"token:<t>:device=<d>"`` and ``"expert:<e>:device=<d>"``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

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
    bars: Axes, ex: np.ndarray, kp: np.ndarray, n_experts: int, exp_dev: np.ndarray
) -> None:
    """The tokens each expert took and dropped, as stacked bars in its device's colour."""
    took = np.array([int((kp & (ex == e)).sum()) for e in range(n_experts)])
    dropped = np.array([int((~kp & (ex == e)).sum()) for e in range(n_experts)])
    colors = [device_color(int(d)) for d in exp_dev]
    bars.bar(range(n_experts), took, color=colors, edgecolor="0.3", linewidth=0.5,
             label="taken")  # fmt: skip
    bars.bar(range(n_experts), dropped, bottom=took, color="0.9", edgecolor="0.45",
             hatch="///", linewidth=0.5, label="dropped")  # fmt: skip
    step = max(1, int(np.ceil(n_experts / 16)))
    bars.set_xticks(range(0, n_experts, step), [str(e) for e in range(0, n_experts, step)],
                    fontsize=8)  # fmt: skip
    bars.tick_params(axis="y", labelsize=8)
    bars.set_xlabel("expert", fontsize=9)
    bars.set_ylabel("tokens routed to it", fontsize=9)
    bars.set_ylim(0, 1.3 * max(1, int((took + dropped).max())))  # headroom for the legend
    bars.legend(fontsize=8, frameon=False, loc="upper center", ncol=2)
    bars.set_title(f"load per expert: {int(dropped.sum())} of {kp.size} choices dropped",
                   fontsize=9.5)  # fmt: skip
    for spine in ("top", "right"):
        bars.spines[spine].set_visible(False)


def draw_routing(
    expert: Any,
    kept: Any,
    *,
    n_experts: int,
    n_devices: int,
    fig: Figure | None = None,
) -> Figure:
    """Token -> expert -> device for one small batch, and the load per expert.

    ``expert`` and ``kept`` are ``(tokens, k)``, as in ``route``'s result, the tokens in
    device order (device ``d`` holds the ``d``-th ``tokens / n_devices`` of them); device
    ``j`` holds experts ``j·E/n ... (j+1)·E/n - 1``.
    """
    ex, kp = _ints(expert, "expert"), _ints(kept, "kept").astype(bool)
    tokens = _check_routing(ex, kp, n_experts, n_devices)
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
            ax.plot([0.62, 2.38], [ty[t], ey[e]], color=device_color(int(tok_dev[t])) if ok else "0.3",
                    lw=1.1 if ok else 1.3, ls="-" if ok else (0, (2, 2)), alpha=0.85,
                    gid=f"route:token={t}:expert={e}:kept={int(ok)}", zorder=1)  # fmt: skip
    box_t = min(0.8, 0.8 * rows / tokens)
    box_e = min(0.8, 0.8 * rows / n_experts)
    size = float(np.clip(11 * min(box_t, box_e) + 1, 5.5, 9.0))
    for t in range(tokens):
        face = device_color(int(tok_dev[t]))
        ax.add_patch(Rectangle((0.0, ty[t] - box_t / 2), 0.6, box_t, facecolor=face,
                               edgecolor="white", gid=f"token:{t}:device={tok_dev[t]}", zorder=2))  # fmt: skip
        ax.text(0.3, ty[t], str(t), ha="center", va="center", fontsize=size,
                color=_text_color(face), zorder=3)  # fmt: skip
    for e in range(n_experts):
        face = device_color(int(exp_dev[e]))
        ax.add_patch(Rectangle((2.4, ey[e] - box_e / 2), 0.6, box_e, facecolor=face,
                               edgecolor="white", gid=f"expert:{e}:device={exp_dev[e]}", zorder=2))  # fmt: skip
        ax.text(2.7, ey[e], str(e), ha="center", va="center", fontsize=size,
                color=_text_color(face), zorder=3)  # fmt: skip
    ax.set_xlim(-0.05, 3.05)
    ax.set_ylim(rows, 0)
    ax.set_xticks([0.3, 2.7], ["token", "expert"], fontsize=9)
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_title("each token to its experts (colour: the device holding it;\n"
                 "dashed grey: dropped, the expert was full)", fontsize=9.5)  # fmt: skip
    bars = fig.add_subplot(grid[0, 1])
    _draw_load_bars(bars, ex, kp, n_experts, exp_dev)
    return fig
