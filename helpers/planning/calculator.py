"""The planner as a picture and as an interactive calculator (notebook 13b).

``draw_plans`` draws the bytes per device of one or more plans as stacked bars against
the accelerator's HBM, each with a thin line for the margin that "fits" keeps room for,
and its optimistic MFU beside it.
``draw_published_runs`` sets the planner against published runs: each run's optimistic MFU
and expected MFU against the MFU it achieved, numbered, with a key. ``PlanCalculator`` is an ipywidgets box: dropdowns for the model,
the hardware, the degrees, ZeRO, the micro-batch, the sequence length and remat, a figure
that is redrawn as a control moves, and one line for the step-time estimate (or for why a
setting cannot run). Its plain-text form is the same plan as a table, so where no widget
front end runs (the rendered site, ``pytest``) the notebook shows the table.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.transforms import Bbox

from helpers.planning.plan import HARDWARE, NAMED_MODELS, Plan, PlanError, format_plan, plan_model

PARTS = ("params", "grads", "optimizer", "gathered", "activations")
PART_COLORS = {"params": "#4C72B0", "grads": "#DD8452", "optimizer": "#55A868",
               "gathered": "#C44E52", "activations": "#8172B3"}  # fmt: skip


def _label(p: Plan) -> str:
    deg = " ".join(f"{a}{d}" for a, d in p.degrees.items() if d > 1) or "1 device"
    deg += f" v{p.options['virtual_stages']}" if p.options.get("virtual_stages", 1) > 1 else ""
    label = f"{deg}, ZeRO-{p.zero}, micro-batch {p.micro_batch}"
    return label + (f", remat {p.remat}" if p.remat != "none" else "")


def _fit_text(p: Plan) -> str:
    """The text right of a plan's bar: its optimistic MFU, and its GB with the margin against
    the HBM (the room left, or the excess), where the whisker's end is too near the HBM line
    to read."""
    need = p.bytes_with_margin / 1e9
    room = p.hbm_bytes / 1e9 - need
    left = f"{room:.1f} GB left" if room >= 0 else f"{-room:.1f} GB over"
    return f"optimistic MFU {p.mfu:.1%}\nwith margin {need:.1f} GB, {left}"


def draw_plans(plans: Sequence[Plan], title: str = "") -> Figure:
    """Stacked horizontal bars of each plan's bytes per device (GB), and the HBM line;
    each plan's optimistic MFU and its GB with the margin (and the room that leaves in HBM)
    are written right of the axes, level with its bar.

    Raises:
      ValueError: ``plans`` is empty or holds something that is not a ``Plan``.
    """
    plans = list(plans)
    if not plans or not all(isinstance(p, Plan) for p in plans):
        raise ValueError(
            "draw_plans: plans must be a non-empty sequence of helpers.planning.plan.Plan."
        )
    fig, ax = plt.subplots(figsize=(9, 0.7 * len(plans) + 2.0), layout="constrained")
    drawn = [part for part in PARTS if any(p.per_device_bytes[part] > 0 for p in plans)]
    for row, p in enumerate(plans):
        left = 0.0
        for part in drawn:  # a kind no plan holds gets no bar and no legend entry
            gb = p.per_device_bytes[part] / 1e9
            ax.barh(row, gb, left=left, color=PART_COLORS[part], label=part if row == 0 else None)
            left += gb
    hbm = max(p.hbm_bytes for p in plans) / 1e9
    ax.axvline(hbm, color="black", linestyle="--", linewidth=1.2, label=f"HBM {hbm:.1f} GB")
    for row, p in enumerate(plans):  # how far the margin reaches past each bar
        total = p.per_device_bytes["total"] / 1e9
        ax.plot([total, p.bytes_with_margin / 1e9], [row, row], color="black", linewidth=1,
                label="margin" if row == 0 else None)  # fmt: skip
    for row, p in enumerate(plans):  # each plan's MFU and fit with the margin, right of the axes
        ax.annotate(_fit_text(p), (1.0, row), xytext=(6, 0), fontsize=9,
                    xycoords=ax.get_yaxis_transform(), textcoords="offset points",
                    ha="left", va="center", annotation_clip=False)  # fmt: skip
    ax.set_yticks(range(len(plans)), [_label(p) for p in plans])
    ax.invert_yaxis()
    ax.set_xlabel("GB per device (10^9 bytes)")
    fig.suptitle(title or f"{plans[0].model} on {plans[0].hardware}", fontsize=11)
    fig.legend(loc="outside lower center", fontsize=9, ncols=4, frameon=False)
    return fig


_HW_COLORS = {"a100-80gb": "#4C72B0", "h100": "#DD8452"}
# Where a run's number may go, in points from its optimistic MFU's marker: beside, above, below,
# then diagonally and farther out; the first place that overlaps nothing is taken.
_LABEL_OFFSETS = [(dx, dy) for r in (1, 2, 3) for dx, dy in
                  ((7, 0), (-7, 0), (0, 8), (0, -8), (7, 7), (-7, 7), (7, -7), (-7, -7))
                  for dx, dy in [(dx * r, dy * r)]]  # fmt: skip


def _short_name(row: dict[str, Any]) -> str:
    """The run's name without its trailing "(source)", and the planner's verdict if not
    "fits"."""
    name = re.sub(r" \([^()]*\)$", "", str(row["name"]))
    if row["outcome"] != "trained":
        return f"{name} (planner: {row['memory_verdict']})"
    return name + (
        f" (planner: {row['memory_verdict']})" if row["memory_verdict"] != "fits" else ""
    )


def _place_labels(fig: Figure, ax: Axes, points: list[tuple[str, float, float]],
                  obstacles: list[Bbox], others: Sequence[tuple[float, float]] = ()) -> list[Any]:  # fmt: skip
    """Put each label next to its point where it overlaps no other label or marker, stays
    inside the axes, and is nearer its own point than any other point or any of ``others``
    (markers that carry no label); returns the texts."""
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    inside = ax.get_window_extent(renderer)
    pixels = [
        tuple(ax.transData.transform(xy)) for xy in [(x, y) for _, x, y in points] + list(others)
    ]
    placed: list[Any] = []
    for k, (label, x, y) in enumerate(points):
        text = None
        for dx, dy in _LABEL_OFFSETS:
            text = ax.annotate(label, (x, y), xytext=(dx, dy), textcoords="offset points",
                               fontsize=9, ha="left" if dx > 0 else "right" if dx < 0 else "center",
                               va="bottom" if dy > 0 else "top" if dy < 0 else "center")  # fmt: skip
            box = text.get_window_extent(renderer).padded(3)
            cx, cy = (box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2
            dist = [(px - cx) ** 2 + (py - cy) ** 2 for px, py in pixels]
            clear = not any(box.overlaps(o) for o in obstacles) and min(dist) == dist[k]
            if clear and inside.contains(box.x0, box.y0) and inside.contains(box.x1, box.y1):
                if max(abs(dx), abs(dy)) > 8:  # beyond the first ring: a line to its point
                    text.remove()
                    text = ax.annotate(label, (x, y), xytext=(dx, dy), textcoords="offset points",
                                       fontsize=9, ha=text.get_ha(), va=text.get_va(),
                                       arrowprops={"arrowstyle": "-", "lw": 0.6, "shrinkB": 4})  # fmt: skip
                break
            text.remove()
            text = None
        if text is None:  # nowhere free: the last place, with a line to its point
            dx, dy = _LABEL_OFFSETS[-1]
            text = ax.annotate(label, (x, y), xytext=(dx, dy), textcoords="offset points",
                               fontsize=9, arrowprops={"arrowstyle": "-", "lw": 0.6})  # fmt: skip
        obstacles.append(text.get_window_extent(renderer))
        placed.append(text)
    return placed


def draw_published_runs(rows: Sequence[dict[str, Any]], band: float = 1.6) -> Figure:
    """The planner against published runs: for each run that trained, its optimistic MFU
    (filled; ``helpers.planning.estimate``) and its expected MFU fitted without it (hollow)
    against the MFU it achieved, with the lines planner = achieved (read for both markers)
    and optimistic = ``band`` x achieved; each run numbered as in ``rows``
    (``helpers.planning.calibration.runs_table()``), named in a key below, the runs that did
    not fit listed there in red with the planner's verdict; the hardware's key uses the points'
    circles. Labels are 9 pt and never overlap.

    Raises:
      ValueError: ``rows`` holds no run that trained, or a row lacks a key ``runs_table``
        gives.
    """
    rows = list(rows)
    need = {"name", "outcome", "hardware", "achieved", "optimistic", "expected", "memory_verdict"}
    if not rows or any(not need <= set(r) for r in rows):
        raise ValueError(
            f"draw_published_runs: rows must be runs_table() rows, with {sorted(need)}."
        )
    trained = [(i, r) for i, r in enumerate(rows, 1) if r["outcome"] == "trained" and r["achieved"]]
    if not trained:
        raise ValueError("draw_published_runs: no run that trained and published an MFU.")
    line_in, plot_in = 0.17, 4.0  # inches: one line of the key, the plot
    height = 0.45 + plot_in + 0.75 + line_in * len(rows) + 0.15
    fig = plt.figure(figsize=(8, height))
    ax = fig.add_axes((0.09, 1 - (0.45 + plot_in) / height, 0.88, plot_in / height))
    _draw_runs(ax, [r for _, r in trained], band)
    ax.set_title(
        f"The planner against {len(rows)} published configurations: the {len(trained)} that trained",
        fontsize=11,
    )
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    pad = 3  # pixels kept clear around every marker and label
    obstacles = [ax.get_legend().get_window_extent(renderer).padded(pad)]
    for _, r in trained:
        for y in (r["optimistic"], r["expected"]):
            px, py = ax.transData.transform((r["achieved"], y))
            obstacles.append(Bbox.from_extents(px - 4, py - 4, px + 4, py + 4).padded(pad))
    hollow = [(r["achieved"], r["expected"]) for _, r in trained if r["expected"]]
    _place_labels(fig, ax, [(str(i), r["achieved"], r["optimistic"]) for i, r in trained], obstacles,
                  hollow)  # fmt: skip
    top = 1 - (0.45 + plot_in + 0.75) / height
    for k, r in enumerate(rows):
        y, color = top - k * line_in / height, "#B22222" if r["outcome"] != "trained" else "black"
        fig.text(0.045, y, str(k + 1), fontsize=9, va="top", ha="right", color=color)
        fig.text(0.06, y, _short_name(r), fontsize=9, va="top", color=color)
    return fig


def _draw_runs(ax: Axes, trained: list[dict[str, Any]], band: float) -> None:
    """The points, the two lines and the legend of ``draw_published_runs``."""
    from matplotlib.lines import Line2D

    xs = [r["achieved"] for r in trained]
    ys = [v for r in trained for v in (r["optimistic"], r["expected"] or r["optimistic"])]
    lo = min(min(xs), min(ys)) * 0.85
    x_hi, y_hi = max(xs) * 1.12, max(ys) * 1.06
    ax.plot([lo, x_hi], [lo, x_hi], color="0.3", lw=1)
    ax.plot([lo, x_hi], [band * lo, band * x_hi], color="0.3", lw=1, ls="--")
    for hw, color in _HW_COLORS.items():
        mine = [r for r in trained if r["hardware"] == hw]
        x = [r["achieved"] for r in mine]
        expected = [r["expected"] or r["optimistic"] for r in mine]
        ax.vlines(x, expected, [r["optimistic"] for r in mine], color=color, lw=0.8)
        ax.scatter(x, [r["optimistic"] for r in mine], s=30, color=color, zorder=3)
        ax.scatter(x, expected, s=30, facecolor="white", edgecolor=color, zorder=3)
    ax.set(xlim=(lo, x_hi), ylim=(lo, y_hi))
    ax.set_xlabel("MFU the run achieved (published, or converted from its TFLOP/s)", fontsize=10)
    ax.set_ylabel("MFU the planner gives", fontsize=10)
    ax.tick_params(labelsize=9)
    handles = [
        Line2D([], [], color="0.3", lw=1, label="planner = achieved"),
        Line2D([], [], color="0.3", lw=1, ls="--", label=f"optimistic = {band:g} x achieved"),
        Line2D([], [], marker="o", color="0.4", ls="", label="optimistic MFU"),
        Line2D([], [], marker="o", mfc="white", color="0.4", ls="",
               label="expected MFU (fitted without the run)"),
        *[Line2D([], [], marker="o", color=c, ls="", label=hw.split("-")[0].upper())
          for hw, c in _HW_COLORS.items()],
    ]  # fmt: skip
    ax.legend(handles=handles, loc="lower right", fontsize=9, frameon=False)


CHOICES: dict[str, tuple[Any, ...]] = {
    "model": tuple(NAMED_MODELS),
    "hardware": tuple(HARDWARE),
    "dp": (1, 2, 4, 8, 16, 32, 64, 128),
    "tp": (1, 2, 4, 8),
    "pp": (1, 2, 4, 8),
    "zero": (0, 1, 2, 3),
    "micro_batch": (1, 2, 4, 8),
    "seq": (2048, 4096, 8192),
    "remat": ("none", "selective", "op", "full"),
}


def calculator_plan(**settings: Any) -> Plan | str:
    """``plan_model`` on the calculator's settings (keys of ``CHOICES``), or the one line
    saying why they cannot run."""
    settings = dict(settings)
    model = settings.pop("model")
    hardware = settings.pop("hardware")
    try:
        return plan_model(model, hardware, **settings)
    except PlanError as err:
        return f"Cannot run: {err}"


def plan_calculator(**defaults: Any) -> Any:
    """An interactive ``PlanCalculator`` (ipywidgets), or, without ipywidgets, the table of
    the default settings printed (and None returned)."""
    settings = {"model": "llama3-8b", "hardware": "h100", "dp": 8, "tp": 1, "pp": 1, "zero": 3,
                "micro_batch": 1, "seq": 4096, "remat": "none", **defaults}  # fmt: skip
    unknown = set(settings) - set(CHOICES)
    if unknown:
        raise ValueError(
            f"plan_calculator: unknown settings {sorted(unknown)}; use {list(CHOICES)}."
        )
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        result = calculator_plan(**settings)
        print(result if isinstance(result, str) else format_plan(result))
        return None
    return _calculator_class()(settings)


def _calculator_class() -> type:
    import ipywidgets as w

    class PlanCalculator(w.VBox):  # type: ignore[misc]
        """Controls, the memory figure and the step-time line; text form: the plan's table."""

        def __init__(self, settings: dict[str, Any]) -> None:
            self.controls = {
                key: w.Dropdown(
                    options=CHOICES[key],
                    value=settings[key],
                    description=key,
                    layout=w.Layout(width="190px"),
                )  # fmt: skip
                for key in CHOICES
            }
            self.figure = w.Image(format="png", layout=w.Layout(width="640px"))
            self.line = w.HTML()
            rows = [w.HBox(list(self.controls.values())[i : i + 3]) for i in range(0, 9, 3)]
            super().__init__([*rows, self.line, self.figure])
            for control in self.controls.values():
                control.observe(lambda _change: self.update(), names="value")
            self.update()

        def settings(self) -> dict[str, Any]:
            return {key: c.value for key, c in self.controls.items()}

        def update(self) -> None:
            result = calculator_plan(**self.settings())
            self.result = result
            if isinstance(result, str):
                self.line.value = f"<b>{result}</b>"
                return
            gpus = 1
            for d in result.degrees.values():
                gpus *= d
            expected = (
                f", expected {result.mfu_expected:.0%}" if result.mfu_expected is not None else ""
            )
            self.line.value = (
                f"{gpus} GPUs; {result.per_device_bytes['total'] / 1e9:.1f} GB per device: "
                f"{result.memory_verdict} (margin x{result.margin:g}). Step "
                f"{result.step_time_s:.2f} s, optimistic MFU {result.mfu:.0%}{expected}."
            )
            fig = draw_plans([result])
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=90)
            plt.close(fig)
            self.figure.value = buf.getvalue()

        def text(self) -> str:
            r = self.result
            return r if isinstance(r, str) else format_plan(r)

        def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
            data = super()._repr_mimebundle_(**kwargs)
            data["text/plain"] = self.text()
            return data

    return PlanCalculator
