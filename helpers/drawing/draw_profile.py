"""The profile's figures: what a run measured, what its trace shows, what the cost model projects.

``plot_results`` draws ``helpers.measuring.profile.compare_strategies``'s results (every timed step,
and memory per device); ``plot_trace_timeline`` draws a ``helpers.measuring.trace`` reading (each
device's ops in one traced step); ``plot_projection`` draws ``helpers.measuring.cost_model``'s
projected step time against tokens per device, and ``plot_knee_by_devices`` its knee
against the number of GPUs, across the node boundary; a ``ProjectionCase`` names each line
(``CASES``: DP, FSDP keeping its gathered weights, textbook FSDP freeing them, FSDP with
remat). Each takes an ``ax``/``axes`` to draw on and returns what it drew; matplotlib is
imported inside them, so importing this module does not need it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from helpers.measuring import cost_model as cm
from helpers.measuring.results import StrategyResult, spread
from helpers.measuring.trace import Span, exposed_spans, summarize_trace

#: The smallest text the profile's figures draw, in points (the series asks for >= 9).
_FONT = 9


def _plot_step_times(
    ax_t: Any, results: Sequence[StrategyResult], xs: np.ndarray, names: list[str], cpu: bool
) -> None:
    """The time panel: each strategy's median (bar) and every timed step (dots)."""
    med = np.array([(r.step_median_s or 0) * 1e3 for r in results])
    ax_t.bar(xs, med, width=0.6, color="#4c72b0", alpha=0.35 if cpu else 1.0, label="median")
    for x, r in zip(xs, results, strict=True):
        ts = np.array(r.step_times_s) * 1e3
        jitter = np.linspace(-0.18, 0.18, len(ts)) if len(ts) > 1 else np.zeros(len(ts))
        ax_t.scatter(
            x + jitter,
            ts,
            s=18,
            color="#1f3b66",
            zorder=3,
            label="each timed step" if x == 0 else None,
        )
        if r.step_median_s:
            ax_t.annotate(
                f"{r.step_median_s * 1e3:.1f} ms\nspread {spread(r):.0%}",
                (x, max(ts)),
                xytext=(0, 4),
                textcoords="offset points",
                ha="center",
                fontsize=_FONT,
            )
    top_t = max((max(r.step_times_s, default=0) for r in results), default=0) * 1e3
    ax_t.set_ylim(0, top_t * 1.3 or 1)
    ax_t.set(xticks=xs, xticklabels=names, ylabel="ms per step")
    ax_t.set_title(
        "step time: noise on shared CPU cores" if cpu else "step time (median, every step)",
        fontsize=10,
    )
    # below the axes: inside, it could cover a bar's note
    ax_t.legend(fontsize=_FONT, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncols=2)


def _plot_step_memory(
    ax_m: Any, results: Sequence[StrategyResult], xs: np.ndarray, names: list[str]
) -> None:
    """The memory panel: arguments and temporaries stacked, as XLA planned the step."""
    arg_b = np.array([r.step_memory["argument"] for r in results], dtype=float)
    tmp_b = np.array([r.step_memory["temp"] for r in results], dtype=float)
    unit, scale = ("GiB", 2**30) if max(arg_b + tmp_b) >= 2**31 else ("MiB", 2**20)
    arg, tmp = arg_b / scale, tmp_b / scale
    ax_m.bar(xs, arg, color="#55a868", label="arguments (params, Adam, batch)")
    ax_m.bar(xs, tmp, bottom=arg, color="#c44e52", label="temporaries")
    for x, total in zip(xs, arg + tmp, strict=True):
        ax_m.annotate(
            f"{total:.1f} {unit}",
            (x, total),
            xytext=(0, 3),
            textcoords="offset points",
            ha="center",
        )
    ax_m.set(xticks=xs, xticklabels=names, ylabel=f"{unit} per device")
    ax_m.set_title("memory per device, as XLA planned the step", fontsize=10)
    ax_m.legend(fontsize=_FONT, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncols=2)
    ax_m.set_ylim(0, max(arg + tmp) * 1.2)


def plot_results(results: Sequence[StrategyResult], axes: Any = None) -> Any:
    """Two panels: every timed step (dots) and its median (bar), and per-device memory.

    On CPU devices the time panel says that it shows noise. Draws on ``axes`` (two
    matplotlib Axes) if given; returns the Figure.
    """
    import matplotlib.pyplot as plt

    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(9, 4.2), layout="constrained")
    else:
        fig = axes[0].figure
    names = [r.strategy for r in results]
    xs = np.arange(len(results))
    ax_t, ax_m = axes
    r0 = results[0]
    cpu = r0.platform == "cpu"
    _plot_step_times(ax_t, results, xs, names, cpu)
    _plot_step_memory(ax_m, results, xs, names)
    where = f"{r0.n_devices} x {r0.device_kind}" + (" (simulated: not GPU timings)" if cpu else "")
    fig.suptitle(f"model '{r0.model}', preset '{r0.preset}' on {where}")
    return fig


class ProjectionCase(NamedTuple):
    """One line of a projection: a strategy and how its step runs, under a name that says so.

    ``keep_gathered``: FSDP keeps each gathered weight from its forward use to its backward
    use (one gather, the whole model in memory: what XLA compiled for the series' jitted
    step); False is textbook FSDP (ZeRO-3), which frees each gathered layer and gathers it
    again for the backward pass. ``remat``: the backward pass recomputes the forward pass
    (8/6 of the FLOPs); it does not change what a strategy sends.
    """

    label: str
    strategy: str
    keep_gathered: bool = False
    remat: bool = False

    def kwargs(self) -> dict[str, bool]:
        """The cost model's keywords for this case (``step_cost``, ``knee_tokens``)."""
        return {"keep_gathered": self.keep_gathered, "remat": self.remat}


#: The cases the profile's figures draw by default: DP; FSDP as XLA compiled it here,
#: keeping its gathered weights (2 units with a reduce-scatter); textbook FSDP (ZeRO-3),
#: freeing them and gathering again (3 units); and FSDP with remat, which XLA compiles
#: here with a second gather too (3 units) and 8/6 of the FLOPs.
CASES: tuple[ProjectionCase, ...] = (
    ProjectionCase("dp", "dp"),
    ProjectionCase("fsdp (keeps gathers)", "fsdp", keep_gathered=True),
    ProjectionCase("fsdp (ZeRO-3, frees)", "fsdp"),
    ProjectionCase("fsdp + remat", "fsdp", remat=True),
)
#: HSDP as ZeRO-3 runs it inside each node (free, gather again), DP across nodes.
HSDP_CASE = ProjectionCase("hsdp (frees)", "hsdp")


def _as_case(case: Any) -> ProjectionCase:
    if isinstance(case, ProjectionCase):
        return case
    raise ValueError(
        f"cases: {case!r} is not a ProjectionCase; give ProjectionCase(label, strategy, "
        "keep_gathered=..., remat=...), as draw_profile.CASES holds them."
    )


def _distinct_curves(
    cfg: cm.SizedModel,
    cases: Sequence[ProjectionCase],
    n_devices: int,
    flops_per_s: float,
    bw: float | cm.Network,
    bytes_per_param: float,
    tokens: np.ndarray,
) -> list[tuple[list[str], np.ndarray, ProjectionCase]]:
    """Each case's projected step time on one link; cases with the same curve share one."""
    curves: list[tuple[list[str], np.ndarray, ProjectionCase]] = []
    for case in cases:
        y = cm.step_cost(
            cfg, case.strategy, n_devices, flops_per_s, bw, bytes_per_param, tokens=tokens,
            **case.kwargs(),
        ).step_s  # fmt: skip
        same = next((c for c in curves if np.allclose(c[1], y)), None)
        if same:
            same[0].append(case.label)
        else:
            curves.append(([case.label], y, case))
    return curves


#: One marker per case, so that lines that coincide still show each of them.
_MARKERS = ("o", "s", "^", "D", "v", "P")


#: The knee lines' style on the first, second, ... link: the scaling book's C/W is "-.".
_KNEE_STYLES: tuple[Any, ...] = (":", "--", (0, (4, 1.5, 1, 1.5, 1, 1.5)))

#: The knee lines' colours, mid to light greys (one per distinct knee of a link), never a
#: case's colour (a dashed knee in a curve's colour would read as that case's curve on the
#: dashed link) and never near black, the scaling book's C/W line.
_KNEE_GREYS = ["0.5", "0.62", "0.74"]


def _draw_marks(ax: Any, marks: list[tuple[float, str, str, Any]]) -> None:
    """A vertical line per mark (a knee, or the scaling book's C/W), named in the legend:
    ``(tokens, label, colour, line style)``."""
    for k, label, colour, ls in marks:
        ax.axvline(k, color=colour, ls=ls, lw=1.2, label=f"{label}: {k:,.0f} tokens")


def _knee_marks(
    cfg: cm.SizedModel,
    curves: list[tuple[list[str], np.ndarray, ProjectionCase]],
    n_devices: int,
    flops_per_s: float,
    bw: float | cm.Network,
    bytes_per_param: float,
    colours: list[str],
) -> list[tuple[float, str, str]]:
    """One mark per distinct knee of ``curves``: ``(tokens, label, colour)``."""
    found: list[tuple[float, list[str], str]] = []
    for j, (labels, _, case) in enumerate(curves):
        k = cm.knee_tokens(
            cfg, case.strategy, n_devices, flops_per_s, bw, bytes_per_param, **case.kwargs()
        )
        same = next((m for m in found if np.isclose(m[0], k, rtol=1e-3)), None)
        if same:
            same[1].extend(labels)
        else:
            found.append((k, list(labels), colours[j % len(colours)]))
    every = len(found) == 1 and len(curves) > 1
    return [
        (k, "knee of every case" if every else f"knee ({' = '.join(names)})", c)
        for k, names, c in found
    ]


def _has_latency(bandwidths: Mapping[str, float | cm.Network]) -> bool:
    return any(isinstance(b, cm.Network) and any(b.latency) for b in bandwidths.values())


#: Legend handle length (in font sizes) of ``plot_projection``: matplotlib's default, 2,
#: is too short to tell a dashed line with markers from a solid one.
_LEGEND_HANDLE_LENGTH = 5.0


def plot_projection(
    cfg: cm.SizedModel,
    n_devices: int,
    flops_per_s: float,
    bandwidths: Mapping[str, float | cm.Network],
    cases: Sequence[ProjectionCase] = CASES,
    bytes_per_param: float = 4,
    tokens: Any = None,
    scaling_book: float | None = None,
    point: tuple[float, float, str] | None = None,
    ax: Any = None,
) -> Any:
    """Projected step time (``cost_model.step_cost``) against tokens per device. Returns the Axes.

    One line per ``ProjectionCase`` and interconnect: solid for the first link, dashed for
    the next ones, one colour and one marker per case, the markers of different lines
    never at the same point, so that lines that coincide over part of the range all stay
    visible; cases whose lines coincide everywhere share one (``a = b``). A link is a
    bandwidth (bytes/s one way, no latency) or a ``cost_model.Network``. The thick grey
    line is compute alone (the thin solid one, with remat's recompute). A thin grey vertical line
    marks each distinct knee on each link, dotted on the first link, dashed on the second
    (its legend entry names the link), and
    ``scaling_book`` (tokens) draws the scaling book's C/W, each named in the legend with
    its value; ``point``, ``(tokens, ms, label)``, draws a black cross named in the legend.
    The curves leave out the optimizer step, which the title says; the y-range is the
    curves' own; the legend is one column right of the axes, which keep most of the
    figure's width, its handles long enough (``_LEGEND_HANDLE_LENGTH``) to show each line's
    dashes.
    """
    import matplotlib.pyplot as plt

    cases = [_as_case(c) for c in cases]
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 4.8), layout="constrained")
    tokens = np.geomspace(128, 131072, 64) if tokens is None else np.asarray(tokens, dtype=float)
    compute = tokens * cm.flops_per_token(cfg).total / flops_per_s
    ax.plot(tokens, compute * 1e3, color="0.6", lw=4, alpha=0.6, label="compute alone")
    drawn: list[np.ndarray] = [compute]
    if any(case.remat for case in cases):
        remat_compute = tokens * cm.flops_per_token(cfg, remat=True).total / flops_per_s
        ax.plot(
            tokens, remat_compute * 1e3, color="0.6", lw=1.5,
            label="compute alone, remat (8/6)",
        )  # fmt: skip
        drawn.append(remat_compute)
    colours = ["#4c72b0", "#dd8452", "#c44e52", "#8172b3", "#55a868"]
    marks: list[tuple[float, str, str, Any]] = []
    n_lines = len(cases) * len(bandwidths)
    for i, (bw_name, bw) in enumerate(bandwidths.items()):
        curves = _distinct_curves(cfg, cases, n_devices, flops_per_s, bw, bytes_per_param, tokens)
        for j, (labels, y, _) in enumerate(curves):
            # Where lines coincide (right of the knee every case runs along compute; left of
            # it ZeRO-3 and remat meet), each still shows: its own marker, placed where no
            # other line has one (markers every n_lines points, each line offset by one).
            ax.plot(
                tokens, y * 1e3, "-" if i == 0 else "--", color=colours[j % len(colours)],
                lw=max(2.6 - 0.5 * j, 1.2), marker=_MARKERS[j % len(_MARKERS)], ms=6,
                markevery=(j * len(bandwidths) + i, n_lines), mfc="white", mew=1.4,
                label=f"{' = '.join(labels)}, {bw_name}",
            )  # fmt: skip
            drawn.append(y)
        knees = _knee_marks(cfg, curves, n_devices, flops_per_s, bw, bytes_per_param, _KNEE_GREYS)
        ls = _KNEE_STYLES[i % len(_KNEE_STYLES)]
        marks.extend((k, f"{label}, {bw_name}", colour, ls) for k, label, colour in knees)
    if scaling_book is not None:
        marks.append((scaling_book, "scaling book C/W", "k", "-."))
    _draw_marks(ax, marks)
    if point is not None:
        ax.plot([point[0]], [point[1]], "kx", ms=10, mew=2, label=point[2])
    # the y-range the curves take, and a little room: no empty band above or below them
    low, high = min(float(y.min()) for y in drawn), max(float(y.max()) for y in drawn)
    ax.set_ylim(low * 1e3 / 1.25, high * 1e3 * 1.25)
    latency = "NCCL's latency" if _has_latency(bandwidths) else "no latency"
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="tokens per device per step (batch x seq)",
        ylabel="projected step time (ms)",
        title=f"{cfg.param_count() / 1e6:,.0f} M parameters on {n_devices} GPUs, "
        f"{flops_per_s / 1e12:,.0f} TFLOP/s per GPU, {bytes_per_param:g} B/param on the wire\n"
        f"each phase overlapped, {latency}, no optimizer step",
    )
    ax.title.set_fontsize(10)
    ax.legend(
        fontsize=_FONT, loc="center left", bbox_to_anchor=(1.02, 0.5), ncols=1,
        handlelength=_LEGEND_HANDLE_LENGTH,
    )  # fmt: skip
    ax.grid(True, which="both", alpha=0.2)
    return ax


#: Hatch and outline of a collective in ``plot_trace_timeline``: darker than any device colour.
_COMM = "0.25"


def plot_trace_timeline(
    traces: Mapping[str, Sequence[Span]],
    step: int | None = None,
    where: str = "",
    axes: Any = None,
    notes: Mapping[str, str] | None = None,
) -> Any:
    """One panel per strategy: a row per device, each HLO op of one traced step as a bar.

    Compute ops are solid bars in the device's colour; collectives are white bars hatched
    and outlined in dark grey (so that no device's colour, tab10's grey for device 7
    among them, can pass for one), named where they are wide enough; a black strip under
    a row marks exposed communication (a collective with no compute beside it).
    ``traces`` maps a strategy to ``read_trace``'s spans; ``step`` is the traced step to
    draw (default: the last). Every panel shares one time axis, as long as the longest
    step, so that equal widths are equal times. Each panel's title gives ``where`` (say ``"CPU
    measurement"``) and the step's compute time per device; ``notes`` maps a strategy to a
    line added under its title (say what XLA counts, or the slowest op). Returns the
    Figure.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from helpers.drawing.draw import device_color

    if not traces or any(not spans for spans in traces.values()):
        raise ValueError("plot_trace_timeline: traces must map each strategy to >= 1 span.")
    n_dev = max(len({s.device for s in spans}) for spans in traces.values())
    if axes is None:
        fig, axes = plt.subplots(
            len(traces), 1, figsize=(9, 1.2 + (1.2 + 0.3 * n_dev) * len(traces)),
            layout="constrained", squeeze=False,
        )  # fmt: skip
        axes = axes[:, 0]
    fig = axes[0].figure
    drawn = {name: _step_spans(spans, step) for name, spans in traces.items()}
    # one time axis for every panel, so that equal lengths are equal times
    span_ms = (
        max(max(s.end_us for s in m) - min(s.start_us for s in m) for m in drawn.values()) / 1e3
    )
    for ax, (name, mine) in zip(axes, drawn.items(), strict=True):
        t0 = min(s.start_us for s in mine)
        width = max(s.end_us for s in mine) - t0
        devices = sorted({s.device for s in mine})
        for s in mine:
            y = devices.index(s.device)
            x, w = (s.start_us - t0) / 1e3, s.dur_us / 1e3
            if s.kind == "compute":
                ax.barh(y, w, left=x, height=0.62, color=device_color(s.device), lw=0)
            else:
                ax.barh(y, w, left=x, height=0.62, fc="white", hatch="///", ec=_COMM, lw=0.6)
                if y == 0 and s.dur_us > 0.12 * width:
                    ax.text(x + w / 2, y, s.name, ha="center", va="center", fontsize=_FONT,
                            color="black", bbox={"fc": "white", "ec": "none", "pad": 0.5})  # fmt: skip
        for device, a, b in exposed_spans(mine):
            y = devices.index(device)
            ax.barh(y + 0.4, (b - a) / 1e3, left=(a - t0) / 1e3, height=0.14, color="black")
        ax.set_yticks(range(len(devices)), [f"device {d}" for d in devices], fontsize=_FONT)
        ax.tick_params(axis="x", labelsize=_FONT)
        ax.set_ylim(len(devices) - 0.4, -0.6)
        ax.set_xlim(0, span_ms * 1.01)
        ax.set_xlabel("ms since the step's first op (one scale for every panel)", fontsize=_FONT)
        which = "last traced step" if step is None else f"traced step {step}"
        note = (notes or {}).get(name, "")
        ax.set_title(_timeline_title(name, which, mine, where, note), fontsize=10)
    handles = [
        Patch(color=device_color(0), label="compute (each device's colour)"),
        Patch(fc="white", hatch="///", ec=_COMM, lw=0.6, label="collective (named if wide enough)"),
        Patch(color="black", label="exposed: a collective, no compute"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=_FONT)
    return fig


def _step_spans(spans: Sequence[Span], step: int | None) -> list[Span]:
    """The spans of traced step ``step`` (default: the last one)."""
    last = max(s.step for s in spans) if step is None else step
    mine = [s for s in spans if s.step == last]
    if not mine:
        raise ValueError(
            f"plot_trace_timeline: step={step!r} is not a traced step of every strategy."
        )
    return mine


def _timeline_title(name: str, which: str, spans: Sequence[Span], where: str, note: str) -> str:
    """A panel's title: the strategy, the step, its compute per device, and a note."""
    compute = summarize_trace(spans).compute_ms
    head = f"{name}, {which}{f' ({where})' if where else ''}: compute {compute:.2f} ms per device"
    return f"{head}\n{note}" if note else head


def plot_knee_by_devices(
    cfg: cm.SizedModel,
    flops_per_s: float,
    networks: Mapping[str, cm.Network],
    cases: Sequence[ProjectionCase] = (*CASES, HSDP_CASE),
    bytes_per_param: float = 4,
    devices: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
    ax: Any = None,
    title: str | None = None,
    legend: bool = True,
) -> Any:
    """The knee (``cost_model.knee_tokens``) against the number of GPUs, across nodes.

    One line per ``ProjectionCase`` and network (solid for the first network, dashed for
    the next); cases whose knees agree within 1% share one. A band marks the node boundary
    of the first network: right of it, the ring leaves the node. A case whose knees are
    the same on a later network keeps its one line, named after both networks. Device
    counts past one node that are not whole nodes are skipped. ``title`` replaces the
    default (the model, FLOP/s and bytes per parameter); ``legend=False`` leaves the legend
    to the caller (a figure of several panels). Returns the Axes.
    """
    import matplotlib.pyplot as plt

    if not networks:
        raise ValueError("plot_knee_by_devices: networks must name at least one Network.")
    cases = [_as_case(c) for c in cases]
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 5.0), layout="constrained")
    colours = ["#4c72b0", "#dd8452", "#c44e52", "#55a868", "#8172b3"]
    drawn: list[tuple[list[str], np.ndarray, Any]] = []  # (labels, knees, its Line2D)
    for i, (net_name, net) in enumerate(networks.items()):
        ns = [
            n for n in devices if n > 1 and (n <= net.gpus_per_node or n % net.gpus_per_node == 0)
        ]
        curves: list[tuple[list[str], np.ndarray]] = []
        for case in cases:
            y = np.array(
                [
                    cm.knee_tokens(
                        cfg, case.strategy, n, flops_per_s, net, bytes_per_param, **case.kwargs()
                    )
                    for n in ns
                ]
            )
            same = next((c for c in curves if np.allclose(c[1], y, rtol=0.01)), None)
            if same:
                same[0].append(case.label)
            else:
                curves.append(([case.label], y))
        for j, (labels, y) in enumerate(curves):
            # the same cases with the same knees on an earlier network: one line, both names
            earlier = next(
                (d for d in drawn if d[0] == labels and len(d[1]) == len(y)
                 and np.allclose(d[1], y, rtol=0.01)), None,
            )  # fmt: skip
            if earlier:
                earlier[2].set_label(f"{earlier[2].get_label()} = {net_name}")
                continue
            (line,) = ax.plot(
                ns, y, "-o" if i == 0 else "--s", ms=3, color=colours[j % len(colours)],
                label=f"{' = '.join(labels)}, {net_name}",
            )  # fmt: skip
            drawn.append((labels, y, line))
    _style_knee_axes(ax, cfg, flops_per_s, networks, devices, drawn, bytes_per_param, title, legend)
    return ax


def _style_knee_axes(
    ax: Any,
    cfg: cm.SizedModel,
    flops_per_s: float,
    networks: Mapping[str, cm.Network],
    devices: Sequence[int],
    drawn: list[tuple[list[str], np.ndarray, Any]],
    bytes_per_param: float,
    title: str | None,
    legend: bool,
) -> None:
    """``plot_knee_by_devices``' node-boundary band, scales, ticks, title and legend."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    g = next(iter(networks.values())).gpus_per_node
    ax.axvspan(g, 2 * g, color="0.85", zorder=0)
    ax.annotate(
        f"node boundary: past {g} GPUs\nthe ring leaves the node",
        (g * np.sqrt(2), 0.03),
        xycoords=("data", "axes fraction"),
        ha="center",
        va="bottom",
        fontsize=_FONT,
    )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="GPUs (N)",
        ylabel="knee: tokens per GPU per step",
        title=title
        or f"{cfg.param_count() / 1e6:,.0f} M parameters, {flops_per_s / 1e12:,.0f} TFLOP/s "
        f"per GPU, {bytes_per_param:g} B/param on the wire",
    )
    ax.set_xticks([n for n in devices if n > 1], [str(n) for n in devices if n > 1])
    ax.minorticks_off()
    knees = np.concatenate([d[1] for d in drawn])
    ticks = _ticks_125(float(knees.min()), float(knees.max()))
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:,.0f}"))
    ax.set_ylim(ticks[0] / 1.15, ticks[-1] * 1.15)  # a labelled tick below and above the data
    ax.title.set_fontsize(10)
    if legend:  # below the axes: inside, it would hide the steep rise past the boundary
        ax.legend(fontsize=_FONT, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=2)
    ax.grid(True, which="major", alpha=0.2)


def _ticks_125(lo: float, hi: float) -> list[float]:
    """The 1-2-5 values from the largest at or below ``lo`` to the smallest at or above ``hi``."""
    decade = 10.0 ** np.floor(np.log10(lo))
    values = [m * decade * 10.0**k for k in range(-1, 12) for m in (1.0, 2.0, 5.0)]
    below = max(v for v in values if v <= lo * (1 + 1e-9))
    above = min(v for v in values if v >= hi * (1 - 1e-9))
    return [v for v in values if below <= v <= above]
