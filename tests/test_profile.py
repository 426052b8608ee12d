"""Tests of helpers.profile: what compare_strategies measures, the cost model, and the CLI.

There is no GPU here, so the GPU-only lines are exercised with stand-ins: a fake
allocator for ``memory_stats()``, fake devices for ``choose_preset``, device-kind strings
for the peak table, and a compile-only (``dry_run``) pass of the ``gpu`` preset itself.
"""

from helpers import use_simulated_devices

use_simulated_devices(8, quiet=True)

import dataclasses  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from helpers import profile  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TINY = profile.PRESETS["tiny"]


class FakeAllocator:
    """Stands in for a GPU's ``memory_stats()['peak_bytes_in_use']``: a high-water mark."""

    def __init__(self, readings):
        self.readings = list(readings)
        self.calls = 0

    def __call__(self, devices):
        value = self.readings[min(self.calls, len(self.readings) - 1)]
        self.calls += 1
        return value


@pytest.fixture(scope="module")
def tiny():
    """DP and FSDP on the tiny preset, 8 simulated devices, with a fake GPU allocator."""
    lines: list[str] = []
    # Readings: before/after the first strategy run, then before/after the second.
    fake = FakeAllocator([1000, 5000, 5000, 5000])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(profile, "allocator_peak", fake)
        results = profile.compare_strategies(
            ("dp", "fsdp"), preset="tiny", steps=3, warmup=1, progress=lines.append
        )
    assert fake.calls == 4
    return {r.strategy: r for r in results}, results, lines


def test_results_come_back_in_the_order_asked(tiny):
    by_name, results, _ = tiny
    assert [r.strategy for r in results] == ["dp", "fsdp"]


def test_every_field_is_measured_and_sane(tiny):
    by_name, _, _ = tiny
    cfg = dataclasses.replace(TINY, batch=TINY.batch * 8)
    for r in by_name.values():
        assert r.preset == "tiny" and r.n_devices == 8 and r.mesh_shape == (8, 1)
        assert r.platform == "cpu" and r.device_kind == "cpu"
        assert r.batch_per_device == TINY.batch and r.config["batch"] == 8 * TINY.batch
        assert r.tokens_per_step == 8 * TINY.batch * TINY.seq
        assert r.config["dtype"] == "float32" and r.config["param_dtype"] == "float32"
        assert r.n_params == r.config["param_count"] == TINY.param_count()
        assert r.compile_s > 0
        assert (r.steps, r.warmup) == (3, 1) and len(r.step_times_s) == 3
        assert all(t > 0 for t in r.step_times_s)
        assert r.step_min_s <= r.step_median_s <= r.step_max_s
        assert r.step_median_s == sorted(r.step_times_s)[1]
        assert r.tokens_per_s == pytest.approx(r.tokens_per_step / r.step_median_s)
        assert r.flops_formula == cfg.train_flops_per_step()
        # cost_analysis() is the per-device program: about 1/8 of the formula's total
        # (a little more, for the elementwise work the formula leaves out).
        per_device = r.flops_formula / 8
        assert per_device <= r.flops_hlo_per_device <= 1.15 * per_device
        assert len(r.losses) == 3 and all(math.isfinite(v) for v in r.losses)
        assert set(r.step_memory) == {"argument", "output", "temp", "alias", "total"}
        assert r.mfu_source == "formula"


def test_mfu_is_not_available_on_cpu(tiny):
    by_name, _, _ = tiny
    assert profile.allocator_peak(jax.devices()) is None  # a CPU has no allocator statistics
    for r in by_name.values():
        assert r.mfu is None and r.peak_flops_per_device is None and r.peak_name is None


def test_fsdp_holds_less_per_device_and_gathers(tiny):
    by_name, _, _ = tiny
    dp, fsdp = by_name["dp"], by_name["fsdp"]
    assert fsdp.step_memory["argument"] < dp.step_memory["argument"]
    # DP: every device holds params + Adam mu + nu in f32, and Adam's int32 step count.
    assert dp.state_bytes_per_device == 3 * 4 * TINY.param_count() + 4
    assert fsdp.state_bytes_per_device < dp.state_bytes_per_device / 4
    assert "all-gather" in fsdp.collectives and "all-gather" not in dp.collectives
    assert "all-reduce" in dp.collectives
    assert fsdp.comm_bytes_per_device > dp.comm_bytes_per_device > 0
    assert dp.program_fingerprint != fsdp.program_fingerprint


def test_dp_and_fsdp_train_the_same_model(tiny):
    by_name, _, _ = tiny
    np.testing.assert_allclose(by_name["dp"].losses, by_name["fsdp"].losses, rtol=1e-5)


def test_the_smaller_step_runs_first_so_the_allocator_peak_means_something(tiny):
    by_name, _, lines = tiny
    # FSDP's step is smaller, so it ran first and raised the fake high-water mark 1000 -> 5000;
    # DP ran next and did not raise it.
    assert by_name["fsdp"].device_peak_bytes == 5000 and by_name["fsdp"].device_peak_raised
    assert by_name["dp"].device_peak_bytes == 5000 and by_name["dp"].device_peak_raised is False
    first_run = [i for i, s in enumerate(lines) if "timed steps" in s]
    assert [lines[i].split(":")[0] for i in first_run] == ["fsdp", "dp"]


def test_progress_has_a_line_per_phase_and_strategy(tiny):
    _, _, lines = tiny
    assert lines[0].startswith("preset 'tiny'") and "8 x cpu" in lines[0]
    for s in ("dp", "fsdp"):
        mine = [line for line in lines if line.startswith(f"{s}:")]
        phases = ["compiling", "compiled in", "initialising", "timed steps", "median step"]
        assert [any(p in line for line in mine) for p in phases] == [True] * len(phases), mine


def test_progress_true_prints_flushed_lines(capsys):
    log = profile._log_to(True)
    log("hello")
    assert capsys.readouterr().out == "[profile] hello\n"
    profile._log_to(False)("silent")
    assert capsys.readouterr().out == ""


def test_table_states_what_it_measured(tiny):
    _, results, _ = tiny
    table = profile.format_table(results)
    header = table.splitlines()[3]
    assert header.split() == ["dp", "fsdp"]
    mfu_row = next(line for line in table.splitlines() if line.startswith("MFU"))
    assert mfu_row.split()[-2:] == ["n/a", "n/a"]
    assert "NOT GPU timings" in table
    assert "median step time ratios, same run: fsdp/dp = " in table
    ratio = results[1].step_median_s / results[0].step_median_s
    assert f"fsdp/dp = {ratio:.2f}" in table
    assert "<= 4.9 KiB" in table  # DP did not raise the fake allocator's peak
    assert "all-gather x" in table


def test_table_with_a_known_gpu_reports_mfu(tiny):
    _, results, _ = tiny
    fake = [
        dataclasses.replace(r, device_kind="NVIDIA H100 80GB HBM3", platform="gpu",
                            peak_name="H100 SXM", peak_flops_per_device=989e12, mfu=0.5)
        for r in results
    ]  # fmt: skip
    table = profile.format_table(fake)
    mfu_row = next(line for line in table.splitlines() if line.startswith("MFU"))
    assert mfu_row.split()[-2:] == ["50.0%", "50.0%"]
    assert "peak H100 SXM = 989 TFLOP/s" in table and "NOT GPU timings" not in table


def test_report_dict_is_json_with_versions(tiny):
    _, results, _ = tiny
    report = json.loads(json.dumps(profile.report_dict(results)))
    env = report["environment"]
    assert (
        env["jax"] == jax.__version__ and env["device_count"] == 8 and env["device_kind"] == "cpu"
    )
    assert env["flax"] and env["optax"]
    assert report["preset"] == "tiny" and report["config"]["d_model"] == TINY.d_model
    assert report["mfu_flops_source"] == "formula" and report["notes"]["simulated"] is True
    assert [r["strategy"] for r in report["results"]] == ["dp", "fsdp"]
    assert report["results"][1]["collectives"]["all-gather"]["ops"] >= 1


def test_plot_results_draws_what_was_measured(tiny, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _, results, _ = tiny
    fig = profile.plot_results(results)
    ax_t, ax_m = fig.axes
    heights = [p.get_height() for p in ax_t.patches]
    assert heights == pytest.approx([r.step_median_s * 1e3 for r in results])
    assert [t.get_text() for t in ax_t.get_xticklabels()] == ["dp", "fsdp"]
    stacked = [p.get_height() for p in ax_m.patches]  # arguments, then temporaries
    assert stacked[:2] == pytest.approx([r.step_memory["argument"] / 2**20 for r in results])
    assert "simulated" in fig.texts[0].get_text()
    fig.savefig(tmp_path / "bars.png")
    assert (tmp_path / "bars.png").stat().st_size > 1000
    plt.close(fig)


# ---------------------------------------------------------------------------
# One device, bf16: the "one GPU" case, run on one CPU device
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def one_device_bf16():
    """DP and FSDP on ONE device in bf16, as on one GPU, with a stand-in peak for MFU."""
    cfg = dataclasses.replace(TINY, dtype=jnp.bfloat16)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(profile, "peak_flops", lambda kind: ("stand-in", 1e12))
        return profile.compare_strategies(
            ("dp", "fsdp"), preset=cfg, steps=2, warmup=1, devices=jax.devices()[:1], progress=False
        )


def test_one_device_dp_and_fsdp_are_the_same_program_in_bf16(one_device_bf16):
    dp, fsdp = one_device_bf16
    assert dp.preset == "custom" and dp.n_devices == 1 and dp.mesh_shape == (1, 1)
    assert dp.config["dtype"] == "bfloat16" and dp.config["param_dtype"] == "float32"
    assert dp.program_fingerprint == fsdp.program_fingerprint
    assert dp.collectives == fsdp.collectives == {}
    assert dp.step_memory == fsdp.step_memory
    assert dp.losses == fsdp.losses and all(math.isfinite(v) for v in dp.losses)


def test_mfu_is_formula_flops_over_time_devices_and_peak(one_device_bf16):
    for r in one_device_bf16:
        assert r.peak_name == "stand-in" and r.peak_flops_per_device == 1e12
        assert r.mfu == pytest.approx(r.flops_formula / (r.step_median_s * 1 * 1e12))
    table = profile.format_table(one_device_bf16)
    assert f"{one_device_bf16[0].mfu:.1%}" in table and "peak stand-in = 1 TFLOP/s" in table


def test_projection_base_uses_a_one_gpu_measurement(one_device_bf16):
    dp = one_device_bf16[0]
    assert profile.config_from_dict(dp.config) == dataclasses.replace(
        TINY, dtype=jnp.bfloat16, batch=TINY.batch
    )
    # On CPU devices there is no GPU measurement: the gpu preset at the H100's peak.
    ref = profile.projection_base(dp)
    gpu = profile.PRESETS["gpu"]
    assert ref.cfg == gpu and ref.flops_per_s == 989e12 and "assumed" in ref.source
    assert ref.compute_s == pytest.approx(gpu.train_flops_per_step() / 989e12)
    assert profile.projection_base(None) == ref
    # The same result, as if measured on one H100: its own step is the compute time.
    on_gpu = dataclasses.replace(dp, platform="gpu", device_kind="NVIDIA H100 80GB HBM3")
    base = profile.projection_base(on_gpu)
    assert base.cfg == dataclasses.replace(TINY, dtype=jnp.bfloat16) and "measured" in base.source
    assert base.compute_s == dp.step_median_s
    assert base.flops_per_s == pytest.approx(dp.flops_formula / dp.step_median_s)
    # Several GPUs' steps include communication: not a compute time.
    assert "assumed" in profile.projection_base(dataclasses.replace(on_gpu, n_devices=8)).source
    with pytest.raises(ValueError, match="no bf16 peak"):
        profile.projection_base(None, reference="cpu")


# ---------------------------------------------------------------------------
# Peaks, MFU, presets
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "name", "peak"),
    [
        ("NVIDIA H200", "H200 SXM", 989e12),
        ("NVIDIA H200 NVL", "H200 NVL", 835e12),
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989e12),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", "H100 NVL", 835e12),
        ("NVIDIA A100-SXM4-80GB", "A100", 312e12),
        ("NVIDIA A100-PCIE-40GB", "A100", 312e12),
        ("NVIDIA L4", "L4", 121e12),
        ("Tesla T4", "T4 (FP16 peak)", 65e12),
    ],
)
def test_peak_table_matches_device_kinds(kind, name, peak):
    assert profile.peak_flops(kind) == (name, peak)


@pytest.mark.parametrize("kind", ["cpu", "NVIDIA L40S", "NVIDIA GeForce RTX 4090", "TPU v5 lite"])
def test_unknown_devices_have_no_peak(kind):
    assert profile.peak_flops(kind) is None


def test_mfu_arithmetic():
    assert profile.mfu(989e12, 1.0, 2, 989e12) == pytest.approx(0.5)
    assert profile.mfu(3e12, 0.01, 1, 1e15) == pytest.approx(0.3)
    assert profile.mfu(1e12, 1.0, 1, None) is None


class FakeDevice:
    def __init__(self, platform, stats=None, fail=False):
        self.platform, self._stats, self._fail = platform, stats, fail

    def memory_stats(self):
        if self._fail:
            raise NotImplementedError
        return self._stats


def test_auto_preset_follows_the_devices():
    gib = 2**30
    assert profile.choose_preset(jax.devices()) == "tiny"
    assert profile.choose_preset([FakeDevice("gpu", {"bytes_limit": 75 * gib})] * 2) == "gpu"
    assert profile.choose_preset([FakeDevice("gpu", {"bytes_limit": 20 * gib})]) == "gpu_small"
    assert profile.choose_preset([FakeDevice("gpu", fail=True)]) == "gpu"
    assert profile.resolve_preset("auto", jax.devices()) == ("tiny", TINY)
    assert profile.resolve_preset(TINY, jax.devices()) == ("custom", TINY)
    with pytest.raises(ValueError, match="preset='huge'"):
        profile.resolve_preset("huge", jax.devices())


def test_allocator_peak_reads_the_largest_device():
    devs = [
        FakeDevice("gpu", {"peak_bytes_in_use": 7}),
        FakeDevice("gpu", {"peak_bytes_in_use": 9}),
    ]
    assert profile.allocator_peak(devs) == 9
    assert profile.allocator_peak([FakeDevice("gpu", fail=True), FakeDevice("cpu", None)]) is None


def test_other_strategies_on_a_two_axis_mesh():
    """Any LOGICAL_RULES preset is accepted; the global batch follows the "data" axis."""
    (r,) = profile.compare_strategies(
        ("fsdp_tp",), preset="tiny", mesh_shape=(4, 2), dry_run=True, progress=False
    )
    assert r.mesh_shape == (4, 2) and r.config["batch"] == 4 * TINY.batch
    assert "all-gather" in r.collectives  # FSDP over "data"
    # The batch split 4 ways and the MLP width 2 ways: each device does about 1/8 of the work.
    assert r.flops_hlo_per_device == pytest.approx(r.flops_formula / 8, rel=0.1)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="'pp' is not one of"):
        profile.compare_strategies(("dp", "pp"), preset="tiny", progress=False)
    with pytest.raises(ValueError, match="repeat a name"):
        profile.compare_strategies(("dp", "dp"), preset="tiny", progress=False)
    with pytest.raises(ValueError, match="steps=0"):
        profile.compare_strategies(("dp",), preset="tiny", steps=0, progress=False)


def test_gpu_preset_is_a_valid_big_bf16_model():
    cfg = profile.PRESETS["gpu"]
    x = jax.ShapeDtypeStruct((cfg.batch, cfg.seq, cfg.d_model), jnp.float32)
    params = jax.eval_shape(cfg.model().init, jax.random.key(0), x)["params"]
    leaves = jax.tree.leaves(params)
    n = sum(math.prod(p.shape) for p in leaves)
    assert n == cfg.param_count()
    assert 1e8 <= n < 1e9, n  # hundreds of millions
    assert {p.dtype for p in leaves} == {jnp.dtype(jnp.float32)}  # f32 master weights
    assert cfg.dtype == jnp.bfloat16  # bf16 compute
    assert all(d % 128 == 0 for d in (cfg.d_model, cfg.d_ff, cfg.n_classes, cfg.seq))
    assert cfg.batch * cfg.seq >= 8192  # tokens per device: large matmuls, compute-bound FSDP
    small = profile.PRESETS["gpu_small"]
    assert 1e8 <= small.param_count() < n
    assert all(d % 128 == 0 for d in (small.d_model, small.d_ff, small.n_classes, small.seq))


def test_gpu_preset_compiles_and_its_flops_match_the_formula():
    """Compile (never run) the gpu preset on 8 simulated devices: the GPU path up to the first step."""
    dp, fsdp = profile.compare_strategies(
        ("dp", "fsdp"), preset="gpu", dry_run=True, progress=False
    )
    cfg = profile.PRESETS["gpu"]
    for r in (dp, fsdp):
        assert r.step_times_s == [] and r.step_median_s is None and r.mfu is None
        assert r.tokens_per_step == 8 * cfg.batch * cfg.seq
        assert r.flops_hlo_per_device == pytest.approx(r.flops_formula / 8, rel=0.02)
    # DP's arguments: f32 params + Adam mu, nu (12 bytes per parameter) plus the batch shard.
    batch_bytes = cfg.batch * cfg.seq * (cfg.d_model * 4 + 4)
    assert dp.step_memory["argument"] == pytest.approx(
        12 * cfg.param_count() + batch_bytes, rel=1e-4
    )
    assert fsdp.step_memory["argument"] < dp.step_memory["argument"] / 4
    assert "all-gather" in fsdp.collectives
    table = profile.format_table([dp, fsdp])
    assert "dry run: compiled only" in table


# ---------------------------------------------------------------------------
# Cost model
# ---------------------------------------------------------------------------


def test_collective_bytes_formula():
    assert (
        profile.collective_bytes_per_device("dp", 1000, 4, bytes_per_param=2) == 2 * 1000 * 2 * 0.75
    )
    assert (
        profile.collective_bytes_per_device("fsdp", 1000, 4, bytes_per_param=2)
        == 3 * 1000 * 2 * 0.75
    )
    assert profile.collective_bytes_per_device("fsdp", 1000, 1) == 0  # one device sends nothing
    with pytest.raises(ValueError, match="no cost model"):
        profile.collective_bytes_per_device("tp", 1000, 4)


def test_collective_bytes_formula_matches_the_compiled_step(tiny):
    """On CPU the tiny preset's measured ring bytes are what the formula says (f32 on the wire)."""
    by_name, _, _ = tiny
    for s in ("dp", "fsdp"):
        formula = profile.collective_bytes_per_device(s, TINY.param_count(), 8, bytes_per_param=4)
        assert by_name[s].comm_bytes_per_device == pytest.approx(formula, rel=0.01)


def test_project_step_time_overlaps_or_adds():
    assert profile.project_step_time(0.1, 45e9, 450e9) == pytest.approx(0.1)
    assert profile.project_step_time(0.05, 45e9, 450e9) == pytest.approx(0.1)
    assert profile.project_step_time(0.05, 45e9, 450e9, overlap=False) == pytest.approx(0.15)


def test_project_n_devices():
    p = profile.project_n_devices(
        0.1, n_params=10**9, n_devices=8, bandwidth=450e9, bytes_per_param=2
    )
    assert p["dp"]["comm_s"] == pytest.approx(2 * 2e9 * 7 / 8 / 450e9)
    assert p["fsdp"]["comm_s"] == pytest.approx(3 * 2e9 * 7 / 8 / 450e9)
    assert p["dp"]["compute_s"] == 0.1 and p["dp"]["compute_bound"]
    assert p["fsdp"]["step_s"] == pytest.approx(max(0.1, p["fsdp"]["comm_s"]))
    assert p["fsdp"]["step_s_serial"] == pytest.approx(0.1 + p["fsdp"]["comm_s"])
    slow = profile.project_n_devices(0.001, 10**9, 8, profile.PCIE4_X16)
    assert not slow["fsdp"]["compute_bound"] and slow["fsdp"]["step_s"] == slow["fsdp"]["comm_s"]


def test_scaling_book_threshold_and_the_knee():
    c_over_w = profile.compute_bound_tokens(989e12, profile.NVLINK4)
    assert c_over_w == pytest.approx(2197.8, rel=1e-4)
    cfg = profile.PRESETS["gpu"]
    n = 8
    # With bf16 on the wire and compute at peak, the FSDP knee is the scaling-book C/W
    # (times (N-1)/N for the ring, times all-params / matmul-params, which is ~1 here).
    knee = profile.knee_tokens(cfg, n, 989e12, profile.NVLINK4, "fsdp", bytes_per_param=2)
    assert knee == pytest.approx(c_over_w * (n - 1) / n, rel=0.01)
    # f32 on the wire doubles it; DP needs two units of bytes instead of three.
    assert profile.knee_tokens(cfg, n, 989e12, profile.NVLINK4, "fsdp") == pytest.approx(2 * knee)
    assert profile.knee_tokens(cfg, n, 989e12, profile.NVLINK4, "dp", 2) == pytest.approx(
        2 * knee / 3
    )
    tokens = np.array([knee / 4, knee, knee * 4])
    curve = profile.projection_curve(cfg, tokens, n, 989e12, profile.NVLINK4, "fsdp", 2)
    comm_s = profile.collective_bytes_per_device("fsdp", cfg.param_count(), n, 2) / profile.NVLINK4
    assert curve[0] == pytest.approx(comm_s) and curve[1] == pytest.approx(comm_s)
    assert curve[2] == pytest.approx(4 * comm_s)  # compute-bound: linear in tokens


def test_plot_projection_marks_the_knees():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = profile.PRESETS["gpu"]
    bws = {"NVLink": profile.NVLINK4, "PCIe": profile.PCIE5_X16}
    ax = profile.plot_projection(cfg, 8, 989e12, bws, scaling_book=2197.8)
    labels = [line.get_label() for line in ax.get_lines()]
    for want in ("compute alone", "dp, NVLink", "fsdp, NVLink", "dp, PCIe", "fsdp, PCIe"):
        assert want in labels
    knee = profile.knee_tokens(cfg, 8, 989e12, profile.NVLINK4, "fsdp")
    xs = [line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == ":"]
    assert any(x == pytest.approx(knee) for x in xs)
    assert ax.get_xscale() == "log" and "tokens per device" in ax.get_xlabel()
    plt.close(ax.figure)


# ---------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------


def test_cli_writes_json_and_plot(tmp_path):
    out, png = tmp_path / "out.json", tmp_path / "out.png"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUM_DEVICES": "2", "MPLBACKEND": "Agg"}
    cmd = [sys.executable, "-m", "helpers.profile", "--preset", "tiny", "--steps", "2", "--warmup", "1",
           "--json", str(out), "--plot", str(png)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[profile] fsdp: median step" in proc.stdout
    assert "MFU (formula FLOPs)" in proc.stdout and "NOT GPU timings" in proc.stdout
    report = json.loads(out.read_text())
    env_ = report["environment"]
    assert (
        env_["jax"] == jax.__version__ and env_["device_count"] == 2 and env_["platform"] == "cpu"
    )
    assert report["preset"] == "tiny" and report["config"]["batch"] == 2 * TINY.batch
    assert report["config"]["param_count"] == TINY.param_count()
    dp, fsdp = report["results"]
    assert (dp["strategy"], fsdp["strategy"]) == ("dp", "fsdp")
    assert len(dp["step_times_s"]) == 2 and dp["mfu"] is None and dp["mesh_shape"] == [2, 1]
    assert dp["step_min_s"] <= dp["step_median_s"] <= dp["step_max_s"]
    assert fsdp["step_memory"]["argument"] < dp["step_memory"]["argument"]
    assert png.stat().st_size > 1000


def test_main_in_process_dry_run(tmp_path, capsys):
    out = tmp_path / "dry.json"
    argv = ["--preset", "tiny", "--devices", "8", "--strategies", "fsdp", "--dry-run", "--quiet",
            "--json", str(out), "--plot", str(tmp_path / "none.png")]  # fmt: skip
    assert profile.main(argv) == 0
    text = capsys.readouterr().out
    assert "dry run: compiled only" in text and "--plot skipped" in text
    assert not (tmp_path / "none.png").exists()
    report = json.loads(out.read_text())
    assert report["steps"] == 0 and report["results"][0]["step_times_s"] == []


def test_cli_flags():
    args = profile.build_parser().parse_args(
        ["--strategies", "dp", "fsdp", "fsdp_all", "--devices", "4"]
    )
    assert (
        args.strategies == ["dp", "fsdp", "fsdp_all"]
        and args.devices == 4
        and args.preset == "auto"
    )
    with pytest.raises(SystemExit):
        profile.build_parser().parse_args(["--strategies", "pp"])
