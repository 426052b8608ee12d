"""Tests of helpers.drawing.draw_profile: the profile's two figures draw what was measured and projected."""

import dataclasses

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from helpers.drawing.draw_profile import (  # noqa: E402
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
    plt.close(fig)


def test_plot_results_on_a_gpu_does_not_call_it_noise(results):
    fake = [dataclasses.replace(r, platform="gpu", device_kind="NVIDIA H100") for r in results]
    fig = plot_results(fake)
    assert "noise" not in fig.axes[0].get_title() and "simulated" not in fig.texts[0].get_text()
    plt.close(fig)


def test_plot_projection_draws_the_cost_model_and_one_shared_knee():
    cfg = profile.PRESETS["gpu"]
    bws = {"NVLink": cm.NVLINK4, "PCIe": cm.PCIE5_X16}
    ax = plot_projection(cfg, 8, 989e12, bws, bytes_per_param=2, scaling_book=2197.8)
    lines = {line.get_label(): line for line in ax.get_lines()}
    for want in ("compute alone", "compute alone, remat (8/6)", "dp, NVLink", "fsdp, NVLink",
                 "fsdp + remat, NVLink", "dp, PCIe", "fsdp + remat, PCIe"):  # fmt: skip
        assert want in lines, sorted(lines)
    tokens = lines["fsdp, NVLink"].get_xdata()
    step = cm.step_cost(cfg, "fsdp", 8, 989e12, cm.NVLINK4, 2, tokens=tokens, keep_gathered=True)
    step = step.step_s
    assert lines["fsdp, NVLink"].get_ydata() == pytest.approx(step * 1e3)
    # The three knees coincide: one dotted line for all of them, and the scaling book's.
    knee = cm.knee_tokens(cfg, "fsdp", 8, 989e12, cm.NVLINK4, 2, keep_gathered=True)
    dotted = [line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == ":"]
    assert dotted == pytest.approx([knee])
    labels = [t.get_text() for t in ax.texts]
    assert f"knee (dp, fsdp, fsdp + remat): {knee:,.0f} tokens" in labels
    assert "scaling book C/W: 2,198 tokens" in labels
    assert ax.get_xscale() == "log" and "tokens per device" in ax.get_xlabel()
    plt.close(ax.figure)


def test_plot_projection_joins_cases_whose_lines_coincide():
    cfg = profile.PRESETS["gpu"]
    ax = plot_projection(
        cfg, 8, 989e12, {"NVLink": cm.NVLINK4}, cases=(("fsdp", False), ("fsdp_all", False))
    )
    labels = [line.get_label() for line in ax.get_lines()]
    assert "fsdp = fsdp_all, NVLink" in labels and "compute alone, remat (8/6)" not in labels
    assert np.isfinite(ax.get_lines()[1].get_ydata()).all()
    plt.close(ax.figure)


@pytest.mark.parametrize("bandwidth", [cm.NVLINK4, cm.PCIE5_X16])
def test_plot_projection_labels_cross_no_other_mark_and_stay_inside(bandwidth):
    # The knee (1,923 tokens on NVLink 4) sits 12% left of C/W (2,198): a label written
    # rightwards from the knee used to run across the C/W line. On PCIe the order flips.
    cfg = profile.PRESETS["gpu"]
    c_over_w = cm.compute_bound_tokens(989e12, bandwidth)
    ax = plot_projection(cfg, 8, 989e12, {"link": bandwidth}, bytes_per_param=2,
                         scaling_book=c_over_w)  # fmt: skip
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    marks = [line for line in ax.get_lines() if line.get_linestyle() in (":", "-.")]
    xs = [ax.transData.transform((line.get_xdata()[0], 1))[0] for line in marks]
    assert len(xs) == 2
    inside = ax.get_window_extent(renderer)
    for text in ax.texts:
        box = text.get_window_extent(renderer)
        crossed = [x for x in xs if box.x0 + 1 < x < box.x1 - 1]
        assert not crossed, f"{text.get_text()!r} runs across a mark's line"
        assert inside.x0 <= box.x0 and box.x1 <= inside.x1, f"{text.get_text()!r} is clipped"
    plt.close(fig)


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

    fig = plot_trace_timeline({"fsdp": _spans()}, where="CPU measurement")
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_yticklabels()] == ["device 0", "device 1", "device 2"]
    assert "CPU measurement" in ax.get_title()
    widths = sorted({round(p.get_width(), 3) for p in ax.patches})
    # compute 0.1 and 0.05 ms, the collective 0.4 ms, exposed 0.2 + 0.15 ms (around fusion.2)
    assert widths == [0.05, 0.1, 0.15, 0.2, 0.4]
    faces = {matplotlib.colors.to_hex(p.get_facecolor()) for p in ax.patches}
    assert {device_color(d) for d in range(3)} <= faces
    assert [t.get_text() for t in ax.texts] == ["all-gather.1"]  # named on the top row only
    plt.close(fig)
    with pytest.raises(ValueError, match="traces must map"):
        plot_trace_timeline({})


def test_plot_knee_by_devices_marks_the_node_boundary_and_joins_equal_knees():
    net = cm.Network(cm.NVLINK4, cm.IB_NDR_400, 8)
    ax = plot_knee_by_devices(TINY, 1e15, {"one NIC": net}, cases=(("dp", False), ("dp", False)))
    (line,) = ax.get_lines()
    assert line.get_label() == "dp = dp, one NIC"
    xs, ys = line.get_data()
    assert list(xs) == [2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert ys[3] > 4 * ys[2]  # the ring leaves the node between 8 and 16 GPUs
    assert any("node boundary" in t.get_text() for t in ax.texts)
    plt.close(ax.figure)
    with pytest.raises(ValueError, match="networks must name"):
        plot_knee_by_devices(TINY, 1e15, {})
