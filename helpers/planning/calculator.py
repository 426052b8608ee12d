"""The planner as a picture and as an interactive calculator (notebook 13).

``draw_plans`` draws the bytes per device of one or more plans as stacked bars against
the accelerator's HBM, each with a thin line for the margin that "fits" keeps room for. ``PlanCalculator`` is an ipywidgets box: dropdowns for the model,
the hardware, the degrees, ZeRO, the micro-batch, the sequence length and remat, a figure
that is redrawn as a control moves, and one line for the step-time estimate (or for why a
setting cannot run). Its plain-text form is the same plan as a table, so where no widget
front end runs (the rendered site, ``pytest``) the notebook shows the table.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from helpers.planning.plan import HARDWARE, NAMED_MODELS, Plan, PlanError, format_plan, plan_model

PARTS = ("params", "grads", "optimizer", "gathered", "activations")
PART_COLORS = {"params": "#4C72B0", "grads": "#DD8452", "optimizer": "#55A868",
               "gathered": "#C44E52", "activations": "#8172B3"}  # fmt: skip


def _label(p: Plan) -> str:
    deg = " ".join(f"{a}{d}" for a, d in p.degrees.items() if d > 1) or "1 device"
    label = f"{deg}, ZeRO-{p.zero}, micro-batch {p.micro_batch}"
    return label + (f", remat {p.remat}" if p.remat != "none" else "")


def draw_plans(plans: Sequence[Plan], title: str = "") -> Figure:
    """Stacked horizontal bars of each plan's bytes per device (GB), and the HBM line.

    Raises:
      ValueError: ``plans`` is empty or holds something that is not a ``Plan``.
    """
    plans = list(plans)
    if not plans or not all(isinstance(p, Plan) for p in plans):
        raise ValueError(
            "draw_plans: plans must be a non-empty sequence of helpers.planning.plan.Plan."
        )
    fig, ax = plt.subplots(figsize=(8, 0.55 * len(plans) + 2.0), layout="constrained")
    for row, p in enumerate(plans):
        left = 0.0
        for part in PARTS:
            gb = p.per_device_bytes[part] / 1e9
            ax.barh(row, gb, left=left, color=PART_COLORS[part], label=part if row == 0 else None)
            left += gb
    hbm = max(p.hbm_bytes for p in plans) / 1e9
    ax.axvline(hbm, color="black", linestyle="--", linewidth=1.2, label=f"HBM {hbm:.0f} GB")
    for row, p in enumerate(plans):  # how far the margin reaches past each bar
        extra = (p.margin - 1) * (p.per_device_bytes["grads"] + p.per_device_bytes["activations"])
        total = p.per_device_bytes["total"] / 1e9
        ax.plot([total, total + extra / 1e9], [row, row], color="black", linewidth=1,
                label="margin" if row == 0 else None)  # fmt: skip
    ax.set_yticks(range(len(plans)), [_label(p) for p in plans])
    ax.invert_yaxis()
    ax.set_xlabel("GB per device (10^9 bytes)")
    fig.suptitle(title or f"{plans[0].model} on {plans[0].hardware}", fontsize=11)
    fig.legend(loc="outside lower center", fontsize=9, ncols=4, frameon=False)
    return fig


CHOICES: dict[str, tuple[Any, ...]] = {
    "model": tuple(NAMED_MODELS),
    "hardware": tuple(HARDWARE),
    "dp": (1, 2, 4, 8, 16, 32, 64, 128),
    "tp": (1, 2, 4, 8),
    "pp": (1, 2, 4, 8),
    "zero": (0, 1, 2, 3),
    "micro_batch": (1, 2, 4, 8),
    "seq": (2048, 4096, 8192),
    "remat": ("none", "selective", "full"),
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
                f"{result.step_time_s:.2f} s, MFU bound {result.mfu:.0%}{expected}."
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
