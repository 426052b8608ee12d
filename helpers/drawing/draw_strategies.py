"""One figure that sums up the sharding strategies: memory per device against bytes sent.

``plot_memory_vs_traffic`` draws one labelled point per strategy: how many bytes of training
state the fullest device holds (y) against how many bytes each device sends per training step
(x). Notebook 03 ends with it. matplotlib is imported inside the function, so importing this
module does not need it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
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


def plot_memory_vs_traffic(
    points: Mapping[str, tuple[float, float]],
    *,
    ax: Any = None,
    title: str | None = None,
) -> Any:
    """A scatter of one point per strategy: bytes held per device against bytes sent per step.

    ``points`` maps a strategy's name to ``(held, sent)``: the bytes of training state on the
    fullest device, and the bytes each device sends per training step. Points closer than 6%
    of the axes' spans share one label (``"fsdp, fsdp_all"``), so no label covers another.
    Draws on ``ax`` if given; returns the Axes.
    """
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
    ax.set_xlabel(f"bytes sent per device per training step ({x_name})")
    ax.set_ylabel(f"training state on the fullest device ({y_name})")
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title, fontsize=11.5)
    return ax
