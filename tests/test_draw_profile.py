"""Tests of helpers.drawing.draw_profile: the profile's two figures draw what was measured and projected."""

import dataclasses
import itertools

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
import matplotlib.colors as mcolors  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

from helpers.drawing.draw_profile import (  # noqa: E402
    CASES,
    HSDP_CASE,
    ProjectionCase,
    plot_knee_by_devices,
    plot_projection,
    plot_results,
    plot_trace_timeline,
)
from helpers.measuring import cost_model as cm  # noqa: E402
from helpers.measuring import profile  # noqa: E402

TINY = profile.PRESETS["tiny"]


@pytest.fixture(scope="module")
def results():
    return profile.compare_strategies(
        ("dp", "fsdp"), preset="tiny", steps=4, warmup=1, progress=False
    )


def test_plot_results_draws_every_step_and_the_memory(results, tmp_path):
    fig = plot_results(results)
    ax_t, ax_m = fig.axes
    bars = [p.get_height() for p in ax_t.patches]
    assert bars == pytest.approx([r.step_median_s * 1e3 for r in results])
    dots = [c.get_offsets()[:, 1] for c in ax_t.collections]
    for r, ys in zip(results, dots, strict=True):  # every timed step, in ms
        assert sorted(ys) == pytest.approx(sorted(t * 1e3 for t in r.step_times_s))
    notes = [t.get_text() for t in ax_t.texts]
    assert notes == [
        f"{r.step_median_s * 1e3:.1f} ms\nspread {profile.spread(r):.0%}" for r in results
    ]
    assert "noise" in ax_t.get_title()  # CPU devices: the panel says what it shows
    assert [t.get_text() for t in ax_t.get_xticklabels()] == ["dp", "fsdp"]
    stacked = [p.get_height() for p in ax_m.patches]  # arguments, then temporaries
    assert stacked[:2] == pytest.approx([r.step_memory["argument"] / 2**20 for r in results])
    assert "simulated" in fig.texts[0].get_text()
    fig.savefig(tmp_path / "bars.png")
    assert (tmp_path / "bars.png").stat().st_size > 1000
    for ax in fig.axes:  # no legend over a bar's note, no text under 9 pt
        box = ax.get_legend().get_window_extent()
        for text in ax.texts:
            assert not box.overlaps(text.get_window_extent()), text.get_text()
            assert text.get_fontsize() >= 9
    plt.close(fig)


def test_plot_results_on_a_gpu_does_not_call_it_noise(results):
    fake = [dataclasses.replace(r, platform="gpu", device_kind="NVIDIA H100") for r in results]
    fig = plot_results(fake)
    assert "noise" not in fig.axes[0].get_title() and "simulated" not in fig.texts[0].get_text()
    plt.close(fig)


def test_the_cases_name_what_they_run():
    by_label = {c.label: c for c in (*CASES, HSDP_CASE)}
    assert by_label["fsdp (keeps gathers)"].kwargs() == {"keep_gathered": True, "remat": False}
    assert by_label["fsdp (ZeRO-3, frees)"].kwargs() == {"keep_gathered": False, "remat": False}
    assert by_label["fsdp + remat"].kwargs() == {"keep_gathered": False, "remat": True}
    units = {c.label: cm.comm_units(c.strategy, keep_gathered=c.keep_gathered).total for c in CASES}
    assert units == {
        "dp": 2, "fsdp (keeps gathers)": 2, "fsdp (ZeRO-3, frees)": 3, "fsdp + remat": 3,
    }  # fmt: skip


def test_plot_projection_draws_the_cost_model_and_one_shared_knee():
    cfg = profile.PRESETS["gpu"]
    bws = {"NVLink": cm.NVLINK4, "PCIe": cm.PCIE5_X16}
    ax = plot_projection(
        cfg, 8, 989e12, bws, bytes_per_param=2, scaling_book=2197.8, point=(16384, 30.0, "step")
    )
    lines = {line.get_label(): line for line in ax.get_lines()}
    for want in ("compute alone", "compute alone, remat (8/6)", "dp, NVLink",
                 "fsdp (keeps gathers), NVLink", "fsdp (ZeRO-3, frees), NVLink",
                 "fsdp + remat, NVLink", "dp, PCIe", "fsdp + remat, PCIe"):  # fmt: skip
        assert want in lines, sorted(lines)
    tokens = lines["fsdp (keeps gathers), NVLink"].get_xdata()
    step = cm.step_cost(cfg, "fsdp", 8, 989e12, cm.NVLINK4, 2, tokens=tokens, keep_gathered=True)
    assert lines["fsdp (keeps gathers), NVLink"].get_ydata() == pytest.approx(step.step_s * 1e3)
    zero3 = cm.step_cost(cfg, "fsdp", 8, 989e12, cm.NVLINK4, 2, tokens=tokens)
    assert lines["fsdp (ZeRO-3, frees), NVLink"].get_ydata() == pytest.approx(zero3.step_s * 1e3)
    # Every knee of a link coincides: one vertical line for all of them on each link, dotted
    # on the first link and dashed on the second, named with the link and its value in the
    # legend, and the scaling book's (no text over the curves).
    knee = cm.knee_tokens(cfg, "fsdp", 8, 989e12, cm.NVLINK4, 2, keep_gathered=True)
    pcie = cm.knee_tokens(cfg, "fsdp", 8, 989e12, cm.PCIE5_X16, 2, keep_gathered=True)
    knees = [line for line in ax.get_lines() if line.get_label().startswith("knee")]
    assert [line.get_xdata()[0] for line in knees] == pytest.approx([knee, pcie])
    assert [line.get_linestyle() for line in knees] == [":", "--"]  # told apart by style
    # in a neutral grey, never a case's colour: a dashed knee must not read as a PCIe curve
    curve_colours = {
        mcolors.to_hex(line.get_color()) for line in ax.get_lines() if len(line.get_xdata()) > 2
    }
    for line in knees:
        r, g, b = mcolors.to_rgb(line.get_color())
        assert r == g == b and mcolors.to_hex(line.get_color()) not in curve_colours
        assert r >= 0.45 and line.get_linewidth() <= 1.5  # thin and grey, never near black
    cross = lines["step"]
    assert cross.get_marker() == "x" and list(cross.get_xydata()[0]) == [16384, 30.0]
    # the knee's style is no other line's: the remat compute line is solid, the C/W dash-dotted
    assert lines["compute alone, remat (8/6)"].get_linestyle() == "-"
    assert ax.get_legend().handlelength >= 4  # long enough to show a dashed line's dashes
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert f"knee of every case, NVLink: {knee:,.0f} tokens" in legend
    assert f"knee of every case, PCIe: {pcie:,.0f} tokens" in legend
    assert "scaling book C/W: 2,198 tokens" in legend
    assert not ax.texts
    assert ax.get_xscale() == "log" and "tokens per device" in ax.get_xlabel()
    assert "no latency, no optimizer step" in ax.get_title()
    # the y-range is the curves' own, with a quarter's room each side: no empty band
    curves = [line.get_ydata() for line in ax.get_lines() if len(line.get_ydata()) > 2]
    low, high = min(min(y) for y in curves), max(max(y) for y in curves)
    assert ax.get_ylim() == pytest.approx((low / 1.25, high * 1.25))
    fig = ax.figure
    fig.canvas.draw()
    legend, frame = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert legend.x0 > frame.x1  # one column right of the axes, never over the curves
    assert frame.width > 0.55 * fig.bbox.width  # the axes keep most of the figure's width
    plt.close(fig)


def test_plot_projection_shows_every_line_where_lines_coincide():
    # Left of the knee ZeRO-3's line and remat's are one curve, and right of it every case
    # runs along compute: each line keeps a marker of its own, never where another has one.
    cfg = profile.PRESETS["gpu"]
    bws = {"NVLink": cm.NVLINK4, "PCIe": cm.PCIE5_X16}
    ax = plot_projection(cfg, 8, 989e12, bws, bytes_per_param=4)
    cases = [
        line
        for line in ax.get_lines()
        if ("NVLink" in line.get_label() or "PCIe" in line.get_label())
        and not line.get_label().startswith("knee")
    ]
    assert len(cases) == 8
    zero3, remat = (
        next(line for line in cases if line.get_label() == f"{name}, NVLink")
        for name in ("fsdp (ZeRO-3, frees)", "fsdp + remat")
    )
    assert zero3.get_ydata()[0] == pytest.approx(remat.get_ydata()[0])  # they do coincide
    assert zero3.get_marker() != remat.get_marker()
    marked = []
    for line in cases:
        start, every = line.get_markevery()
        xs = line.get_xdata()[start::every]
        assert len(xs) >= 4 and line.get_marker() not in ("", "None", None), line.get_label()
        marked.append(set(np.round(xs, 6)))
    for a, b in itertools.combinations(marked, 2):
        assert not a & b  # no two lines put a marker at the same point
    plt.close(ax.figure)


def test_plot_projection_takes_a_network_and_says_it_has_latency():
    cfg = profile.PRESETS["gpu"]
    ax = plot_projection(cfg, 8, 989e12, {"DGX": cm.DGX_H100}, cases=CASES[:2])
    assert "NCCL's latency" in ax.get_title()
    lines = {line.get_label(): line for line in ax.get_lines()}
    tokens = lines["dp, DGX"].get_xdata()
    want = cm.step_cost(cfg, "dp", 8, 989e12, cm.DGX_H100, 4, tokens=tokens).step_s
    assert lines["dp, DGX"].get_ydata() == pytest.approx(want * 1e3)
    plt.close(ax.figure)


def test_plot_projection_joins_cases_whose_lines_coincide():
    cfg = profile.PRESETS["gpu"]
    cases = (ProjectionCase("a", "fsdp"), ProjectionCase("b", "fsdp_all"))
    ax = plot_projection(cfg, 8, 989e12, {"NVLink": cm.NVLINK4}, cases=cases)
    labels = [line.get_label() for line in ax.get_lines()]
    assert "a = b, NVLink" in labels and "compute alone, remat (8/6)" not in labels
    assert np.isfinite(ax.get_lines()[1].get_ydata()).all()
    plt.close(ax.figure)
    with pytest.raises(ValueError, match="cases: .* is not a ProjectionCase"):
        plot_projection(cfg, 8, 989e12, {"NVLink": cm.NVLINK4}, cases=(("fsdp", False),))


def _spans():
    from helpers.measuring.trace import Span

    out = []
    for d in range(3):
        out += [
            Span(d, "fusion.1", "compute", 0.0, 100.0, "jit_step", 0, "t"),
            Span(d, "all-gather.1", "collective", 100.0, 400.0, "jit_step", 0, "t"),
            Span(d, "fusion.2", "compute", 300.0, 50.0, "jit_step", 0, "t"),
        ]
    return out


def test_plot_trace_timeline_draws_a_row_per_device_and_marks_the_exposed_part():
    from helpers.drawing.draw import device_color

    fig = plot_trace_timeline({"fsdp": _spans()}, where="CPU measurement", notes={"fsdp": "n"})
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_yticklabels()] == ["device 0", "device 1", "device 2"]
    # compute per device: 0.1 + 0.05 ms; the note on a line of its own
    assert ax.get_title() == (
        "fsdp, last traced step (CPU measurement): compute 0.15 ms per device\nn"
    )
    widths = sorted({round(p.get_width(), 3) for p in ax.patches})
    # compute 0.1 and 0.05 ms, the collective 0.4 ms, exposed 0.2 + 0.15 ms (around fusion.2)
    assert widths == [0.05, 0.1, 0.15, 0.2, 0.4]
    faces = {matplotlib.colors.to_hex(p.get_facecolor()) for p in ax.patches}
    assert {device_color(d) for d in range(3)} <= faces
    assert [t.get_text() for t in ax.texts] == ["all-gather.1"]  # named on the top row only
    assert min(t.get_fontsize() for t in (*ax.texts, *ax.get_yticklabels())) >= 9
    plt.close(fig)
    with pytest.raises(ValueError, match="traces must map"):
        plot_trace_timeline({})


def test_plot_trace_timeline_puts_every_panel_on_one_time_axis():
    from helpers.measuring.trace import Span

    short = [Span(d, "fusion.1", "compute", 0.0, 100.0, "jit_step", 0, "t") for d in range(2)]
    fig = plot_trace_timeline({"dp": _spans(), "fsdp": short})
    dp_ax, fsdp_ax = fig.axes
    # the longer step (0.5 ms) sets the axis of both panels: equal widths are equal times
    assert dp_ax.get_xlim() == fsdp_ax.get_xlim() == pytest.approx((0, 0.5 * 1.01))
    assert "one scale for every panel" in fsdp_ax.get_xlabel()
    plt.close(fig)
    with pytest.raises(ValueError, match="step=5 is not a traced step"):
        plot_trace_timeline({"dp": _spans()}, step=5)


def test_plot_knee_by_devices_marks_the_node_boundary_and_joins_equal_knees():
    net = cm.Network(cm.NVLINK4, cm.IB_NDR_400, 8)
    dp = ProjectionCase("dp", "dp")
    ax = plot_knee_by_devices(TINY, 1e15, {"one NIC": net}, cases=(dp, dp))
    (line,) = ax.get_lines()
    assert line.get_label() == "dp = dp, one NIC"
    xs, ys = line.get_data()
    assert list(xs) == [2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert ys[3] > 4 * ys[2]  # the ring leaves the node between 8 and 16 GPUs
    assert any("node boundary" in t.get_text() for t in ax.texts)
    # a labelled 1-2-5 tick below the lowest knee and above the highest
    lo, hi = ax.get_ylim()
    ticks = [t for t in ax.get_yticks() if lo <= t <= hi]
    assert min(ticks) <= min(ys) and max(ticks) >= max(ys)
    plt.close(ax.figure)
    with pytest.raises(ValueError, match="networks must name"):
        plot_knee_by_devices(TINY, 1e15, {})


def test_plot_knee_by_devices_draws_both_cross_node_models_and_shares_equal_lines():
    net, gpu = cm.DGX_H100, profile.PRESETS["gpu"]
    nets = {"hierarchical": net, "flat": net._replace(cross_node="flat")}
    ax = plot_knee_by_devices(gpu, 989e12, nets, cases=(CASES[2], HSDP_CASE), legend=False)
    labels = [line.get_label() for line in ax.get_lines()]
    # HSDP's rings across nodes hold one GPU per node: both models give the same knees
    assert labels == [
        "fsdp (ZeRO-3, frees), hierarchical",
        "hsdp (frees), hierarchical = flat",
        "fsdp (ZeRO-3, frees), flat",
    ]
    (hier, _, flat) = ax.get_lines()
    assert flat.get_ydata()[3] > hier.get_ydata()[3]  # at 16 GPUs the flat ring sends more
    assert ax.get_legend() is None
    plt.close(ax.figure)
