"""Figures that compare the sharding strategies: what a device holds, and what it sends.

``plot_memory_vs_traffic`` draws one labelled point per strategy: how many bytes of training
state the fullest device holds (y) against how many bytes each device sends per training step
(x). ``plot_live_memory`` draws what a compiled step's temporaries hold, instruction by
instruction, for a few programs side by side (``helpers.measuring.measure.live_memory``).
Notebook 03 draws both. ``plot_model_states`` stacks a plan's model states per device
(parameters, gradients, optimizer state) in one bar per plan: notebook 13a draws the ZeRO
stages with it, and ``plot_activation_terms`` stacks one layer's activations per token, term
by term (``helpers.activation_terms``), in one bar per recompute choice. matplotlib is imported inside the functions, so importing this module
does not need it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

_UNITS = ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "bytes"))


def _unit(largest: float) -> tuple[float, str]:
    """The largest binary unit that ``largest`` reaches (bytes below 1 KiB)."""
    for size, name in _UNITS:
        if largest >= size:
            return size, name
    return 1, "bytes"


def _clusters(xy: dict[str, tuple[float, float]], span: tuple[float, float]) -> list[list[str]]:
    """Strategies whose points lie within 6% of the axes' spans of each other, grouped."""
    groups: list[list[str]] = []
    for name, (x, y) in xy.items():
        for group in groups:
            gx, gy = xy[group[0]]
            if abs(x - gx) <= 0.06 * span[0] and abs(y - gy) <= 0.06 * span[1]:
                group.append(name)
                break
        else:
            groups.append([name])
    return groups


def _checked_points(
    points: Mapping[str, tuple[float, float]], notes: Mapping[str, str] | None
) -> tuple[dict[str, tuple[float, float]], dict[str, str]]:
    """``plot_memory_vs_traffic``'s arguments checked: ``(sent, held)`` per name, and the notes."""
    notes = dict(notes or {})
    if any(k not in points or not isinstance(v, str) for k, v in notes.items()):
        raise ValueError(
            "plot_memory_vs_traffic: notes must map strategies of points to text, got "
            f"{notes!r} for points {sorted(points)}."
        )
    if not isinstance(points, Mapping) or not points:
        raise ValueError(
            "plot_memory_vs_traffic: points must be a non-empty mapping of strategy name to "
            f"(bytes held, bytes sent), got {points!r}."
        )
    xy: dict[str, tuple[float, float]] = {}
    for name, value in points.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"plot_memory_vs_traffic: points' keys must be names, got {name!r}.")
        try:
            held, sent = (float(v) for v in value)
        except (TypeError, ValueError):
            raise ValueError(
                f"plot_memory_vs_traffic: points[{name!r}] must be two numbers "
                f"(bytes held, bytes sent), got {value!r}."
            ) from None
        if not (math.isfinite(held) and math.isfinite(sent)) or held < 0 or sent < 0:
            raise ValueError(
                f"plot_memory_vs_traffic: points[{name!r}] must be finite byte counts >= 0, "
                f"got {value!r}."
            )
        xy[name] = (sent, held)
    return xy, notes


def plot_memory_vs_traffic(
    points: Mapping[str, tuple[float, float]],
    *,
    ax: Any = None,
    title: str | None = None,
    notes: Mapping[str, str] | None = None,
) -> Any:
    """A scatter of one point per strategy: bytes held per device against bytes sent per step.

    ``points`` maps a strategy's name to ``(held, sent)``: the bytes of training state on the
    fullest device, and the bytes each device sends per training step. Points closer than 6%
    of the axes' spans share one label (``"fsdp, fsdp_all"``), so no label covers another.
    ``notes`` maps some of the strategies to a remark, written in italics above and left of
    its point, with a line to it (say, why it sits where it does on this backend). Draws on ``ax`` if given;
    returns the Axes.
    """
    xy, notes = _checked_points(points, notes)
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.6), layout="constrained")
    x_unit, x_name = _unit(max(x for x, _ in xy.values()))
    y_unit, y_name = _unit(max(y for _, y in xy.values()))
    scaled = {n: (x / x_unit, y / y_unit) for n, (x, y) in xy.items()}
    x_top = (max(x for x, _ in scaled.values()) or 1.0) * 1.25  # all zero: a unit-wide axis
    y_top = (max(y for _, y in scaled.values()) or 1.0) * 1.2
    ax.set_xlim(-0.05 * x_top, x_top)
    ax.set_ylim(0, y_top)
    for group in _clusters(scaled, (x_top, y_top)):
        for name in group:
            ax.scatter(*scaled[name], s=60, color="0.2", zorder=3)
        gx, gy = scaled[group[0]]
        ax.annotate(
            ", ".join(group),
            (gx, gy),
            xytext=(8, 6),
            textcoords="offset points",
            fontsize=10.5,
            clip_on=False,
        )
    for name, text in notes.items():
        ax.annotate(
            text,
            scaled[name],
            xytext=(-6, 34),
            textcoords="offset points",
            ha="right",
            va="bottom",
            fontsize=9.5,
            style="italic",
            color="0.25",
            arrowprops={"arrowstyle": "-", "color": "0.5", "lw": 0.8, "shrinkB": 5},
        )
    ax.set_xlabel(f"bytes sent per device per training step ({x_name})")
    ax.set_ylabel(f"training state on the fullest device ({y_name})")
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title, fontsize=11.5)
    return ax


_KIND_COLORS = {
    "gathered parameters": "tab:blue",
    "gradients": "tab:red",
    "activations": "tab:green",
    "other": "0.7",
}
#: A kind's name in the legend, where it needs more words than its key.
_KIND_LABELS = {"gradients": "gradients (incl. reductions' in/out)"}


def plot_live_memory(
    lives: Mapping[str, Any],
    *,
    title: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> Any:
    """One panel per program: its temporaries alive through one step, stacked by kind.

    ``lives`` maps a program's name to its ``helpers.measuring.measure.LiveMemory``
    (``live_memory(compiled)``). The x axis is the position in the step's schedule, from
    the first instruction to the last (programs of different lengths share it); a dashed
    line marks XLA's own temp size where the ``LiveMemory`` has it.
    The panels share their y axis, in one unit, so that heights compare. ``labels`` renames
    kinds in the legend (say, what "other" holds in these programs). Returns the Figure;
    its Axes are the panels, in the order of ``lives``.
    """
    if labels is not None and not set(labels) <= set(_KIND_COLORS):
        raise ValueError(
            f"plot_live_memory: labels must rename some of {list(_KIND_COLORS)}, got "
            f"{sorted(labels)}."
        )
    if not isinstance(lives, Mapping) or not lives:
        raise ValueError(
            "plot_live_memory: lives must be a non-empty mapping of program name to "
            f"LiveMemory (helpers.live_memory(compiled)), got {lives!r}."
        )
    for name, live in lives.items():
        if not all(hasattr(live, a) for a in ("steps", "phases", "temp")) or not live.steps:
            raise ValueError(
                f"plot_live_memory: lives[{name!r}] must be a LiveMemory with at least one "
                f"step (helpers.live_memory(compiled)), got {type(live).__name__}."
            )
    import matplotlib.pyplot as plt

    top = max(max(max(live.totals), live.temp or 0) for live in lives.values())
    size, unit = _unit(top)
    fig, axes = plt.subplots(
        len(lives), 1, figsize=(8, 1.2 + 1.9 * len(lives)), sharex=True, layout="constrained"
    )
    axes = [axes] if len(lives) == 1 else list(axes)
    for ax, (name, live) in zip(axes, lives.items(), strict=True):
        _live_panel(ax, name, live, size, unit)
        ax.set_ylim(0, top / size * 1.15)
    axes[-1].set_xlabel("position in the step's schedule (first instruction to last)")
    names = {**_KIND_LABELS, **(labels or {})}
    legend = [names.get(k, k) for k in _KIND_COLORS] + ["XLA's temp size"]
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in _KIND_COLORS.values()]
    handles.append(plt.Line2D([], [], color="0.2", ls="--", lw=1))
    fig.legend(handles, legend, loc="outside lower center", ncol=3, fontsize=9.5, frameon=False)
    if title:
        fig.suptitle(title, fontsize=11.5)
    return fig


def _live_panel(ax: Any, name: str, live: Any, size: float, unit: str) -> None:
    """One program's stacked temporaries, and XLA's temp size dashed."""
    n = len(live.steps)
    x = [i / max(n - 1, 1) for i in range(n)]
    series = [[s[k] / size for s in live.steps] for k in _KIND_COLORS]
    ax.stackplot(x, series, colors=list(_KIND_COLORS.values()), linewidth=0)
    if live.temp is not None:
        ax.axhline(live.temp / size, color="0.2", ls="--", lw=1)
    peak = max(live.totals)
    ax.set_title(f"{name}: peak {peak / size:.2f} {unit}", fontsize=10.5, loc="left")
    ax.set_ylabel(unit, fontsize=10)
    ax.set_xlim(0, 1)
    ax.tick_params(labelsize=9)


_STATE_COLORS = {"params": "#4c72b0", "grads": "#dd8452", "optimizer": "#55a868"}
_STATE_LABELS = {"params": "parameters", "grads": "gradients", "optimizer": "optimizer state"}


def plot_model_states(
    plans: Mapping[str, Mapping[str, float]],
    *,
    title: str | None = None,
    scale: float = 1e9,
    unit: str = "GB",
    zoom: Sequence[str] = (),
) -> Any:
    """One bar per plan: the bytes per device of its parameters, gradients and optimizer
    state, stacked, with the total written above the bar.

    ``plans`` maps a bar's label to the bytes of each state, for instance the
    ``per_device_bytes`` of ``helpers.plan_model`` (other keys are ignored). The y axis is in
    ``unit`` (``scale`` bytes each; 10^9 bytes, "GB", by default, as the ZeRO paper counts).
    ``zoom`` names bars drawn again in a second panel on their own y axis, each with the size
    of every state written under it: a bar far below the largest is otherwise a line on the
    first panel's linear axis. Returns the Figure.
    """
    if not isinstance(plans, Mapping) or not plans:
        raise ValueError(
            "plot_model_states: plans must be a non-empty mapping of a label to bytes per "
            f"state ({sorted(_STATE_COLORS)}), got {plans!r}."
        )
    for name, held in plans.items():
        if not isinstance(held, Mapping) or not all(
            isinstance(held.get(k), int | float) and held[k] >= 0 for k in _STATE_COLORS
        ):
            raise ValueError(
                f"plot_model_states: plans[{name!r}] must give non-negative bytes for each of "
                f"{sorted(_STATE_COLORS)}, got {held!r}."
            )
    if not (isinstance(scale, int | float) and scale > 0):
        raise ValueError(
            f"plot_model_states: scale must be a positive number of bytes, got {scale!r}."
        )
    if isinstance(zoom, str) or not all(z in plans for z in zoom):
        raise ValueError(
            f"plot_model_states: zoom must be a sequence of labels of plans ({list(plans)}), "
            f"got {zoom!r}."
        )
    import matplotlib.pyplot as plt

    width = 1.8 + 1.5 * len(plans)
    if zoom:
        fig, (ax, zax) = plt.subplots(
            1, 2, figsize=(width + 1.2 + 1.6 * len(zoom), 3.8), layout="constrained",
            gridspec_kw={"width_ratios": [len(plans) + 0.6, len(zoom) + 0.9]},
        )  # fmt: skip
    else:
        fig, ax = plt.subplots(figsize=(width, 3.8), layout="constrained")
    _state_bars(ax, plans, list(plans), scale, unit)
    ax.set_ylabel(f"{unit} per device", fontsize=10)
    handles, labels = ax.get_legend_handles_labels()  # listed top to bottom, as stacked
    ax.legend(handles[::-1], labels[::-1], fontsize=9, frameon=False, loc="upper right")
    if zoom:
        _state_bars(zax, plans, list(zoom), scale, unit)
        zax.set_xticks(
            range(len(zoom)),
            [
                "\n".join([z] + [f"{_STATE_LABELS[k].split()[0]} {plans[z][k] / scale:.3g}"
                                  for k in reversed(_STATE_COLORS)])
                for z in zoom
            ],
        )  # fmt: skip
        zax.set_xlim(-0.7, len(zoom) - 0.3)
        zax.set_title(f"zoomed, {unit}", fontsize=10)
    if title:
        (fig.suptitle if zoom else ax.set_title)(title, fontsize=11)
    return fig


def _state_bars(
    ax: Any, plans: Mapping[str, Mapping[str, float]], names: list[str], scale: float, unit: str
) -> None:
    """``plot_model_states``'s stacked bars for ``names``, each total written above it."""
    bottoms = [0.0] * len(names)
    for kind, color in _STATE_COLORS.items():
        heights = [plans[n][kind] / scale for n in names]
        ax.bar(names, heights, bottom=bottoms, color=color, width=0.6, label=_STATE_LABELS[kind])
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    top = max(bottoms)
    for i, total in enumerate(bottoms):
        ax.text(
            i, total + top * 0.02, f"{total:.3g} {unit}", ha="center", va="bottom", fontsize=9.5
        )
    ax.set_ylim(0, top * 1.15 if top > 0 else 1)
    ax.tick_params(labelsize=9.5)


# Thirteen colours no two of which are a light/dark pair of one hue (tab20's pairs read as
# one): tab10's first eight and its cyan, then navy, gold, mint and black.
_TERM_COLORS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#17becf", "#000075", "#e6ab02", "#aaffc3", "#000000",
)  # fmt: skip


def _check_activation_bars(bars: Any, scale: Any, panels: Any) -> list[list[str]]:
    """``plot_activation_terms``'s arguments checked; its panels, each a list of labels."""
    if not isinstance(bars, Mapping) or not bars:
        raise ValueError(
            "plot_activation_terms: bars must be a non-empty mapping of a label to the terms "
            f"of helpers.activation_terms (a term's name to its bytes per token), got {bars!r}."
        )
    for name, terms in bars.items():
        if (
            not isinstance(terms, Mapping)
            or not terms
            or not all(
                isinstance(k, str) and isinstance(v, int | float) and v >= 0
                for k, v in terms.items()
            )
        ):
            raise ValueError(
                f"plot_activation_terms: bars[{name!r}] must map each term's name to its "
                f"non-negative bytes per token, got {terms!r}."
            )
    if not (isinstance(scale, int | float) and scale > 0):
        raise ValueError(
            f"plot_activation_terms: scale must be a positive number of bytes, got {scale!r}."
        )
    if panels is None:
        return [list(bars)]
    groups = [list(p) for p in panels] if isinstance(panels, list | tuple) else []
    flat = [label for g in groups for label in g]
    if not groups or not all(groups) or sorted(flat, key=str) != sorted(bars, key=str):
        raise ValueError(
            "plot_activation_terms: panels must be a list of non-empty lists of the labels of "
            f"bars, each label in exactly one, got {panels!r}."
        )
    return groups


#: The share of a panel's tallest bar under which ``plot_activation_terms`` calls a term's
#: segment too thin to see (about one pixel of a 4.2-inch figure at 100 dpi).
THIN_TERM = 0.004


def plot_activation_terms(
    bars: Mapping[str, Mapping[str, float]],
    *,
    title: str | None = None,
    scale: float = 1e3,
    unit: str = "kB",
    panels: Sequence[Sequence[str]] | None = None,
) -> Any:
    """One bar per entry of ``bars``: the bytes one layer keeps per token for its backward
    pass, term by term, stacked, with the total written above the bar.

    ``bars`` maps a bar's label (a recompute choice, a tensor-parallel degree) to the terms of
    ``helpers.activation_terms``: a term's name to its bytes per token. A term keeps its
    color in every bar; the legend, right of the axes, lists every term once, in the order
    the bars first hold them, and marks "(too thin to see)" a term that is under
    ``THIN_TERM`` of its panel's tallest bar in every bar that holds it (a segment of a
    pixel or less). The y axis is in ``unit`` (``scale`` bytes each; 10^3 bytes, "kB", by
    default). ``panels`` (default: one) lists the bars of each panel, left to right, every
    label of ``bars`` in exactly one; each panel has a y axis of its own, labelled, so that
    small bars stay readable beside large ones. Returns the Figure.
    """
    groups = _check_activation_bars(bars, scale, panels)
    import matplotlib.pyplot as plt

    order = list(dict.fromkeys(k for terms in bars.values() for k in terms))
    colors = {t: _TERM_COLORS[i % len(_TERM_COLORS)] for i, t in enumerate(order)}
    widths = [0.6 + 0.95 * len(g) for g in groups]
    fig, axes = plt.subplots(
        1, len(groups), figsize=(1.4 + sum(widths) + 3.9, 4.2), layout="constrained",
        gridspec_kw={"width_ratios": widths}, squeeze=False,
    )  # fmt: skip
    seen = set()  # the terms drawn tall enough to see in some bar
    for ax, names in zip(axes[0], groups, strict=True):
        _activation_panel(ax, {n: bars[n] for n in names}, order, colors, scale)
        ax.set_ylabel(f"{unit} per token and layer", fontsize=10)
        top = max(sum(bars[n].values()) for n in names)
        seen |= {t for n in names for t, v in bars[n].items() if v >= THIN_TERM * top}
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[t]) for t in order]
    labels = [t if t in seen else f"{t} (too thin to see)" for t in order]
    axes[0][-1].legend(handles[::-1], labels[::-1], fontsize=9, frameon=False, loc="upper left",
                       bbox_to_anchor=(1.02, 1.0))  # fmt: skip
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


def _activation_panel(
    ax: Any, bars: Mapping[str, Mapping[str, float]], order: list[str], colors: dict, scale: float
) -> None:
    """One panel of ``plot_activation_terms``: its bars stacked, each total above it."""
    names, bottoms = list(bars), [0.0] * len(bars)
    for term in order:
        heights = [bars[n].get(term, 0.0) / scale for n in names]
        ax.bar(range(len(names)), heights, bottom=bottoms, width=0.6, color=colors[term],
               label=term)  # fmt: skip
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    top = max(bottoms)
    for i, total in enumerate(bottoms):
        ax.text(i, total + top * 0.02, f"{total:.3g}", ha="center", va="bottom", fontsize=9)
    ax.set_ylim(0, top * 1.12 if top > 0 else 1)
    ax.set_xticks(range(len(names)), names)
    ax.set_xlim(-0.6, len(names) - 0.4)
    ax.tick_params(labelsize=9)
