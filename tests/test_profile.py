"""Tests of helpers.measuring.profile: what compare_strategies measures, how it sizes and refuses, the CLI.

There is no GPU here, so the GPU-only lines are exercised with stand-ins: a fake
allocator for ``memory_stats()``, fake devices for ``choose_preset``, and a compile-only
(``dry_run``) pass of the ``gpu`` preset itself. The cost model's own formulas are
tests/test_cost_model.py; here its unit counts meet the bytes of compiled steps.
"""

from helpers import use_simulated_devices

use_simulated_devices(8, quiet=True)

import dataclasses  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from children import run_jax_child  # noqa: E402

from helpers.measuring import cost_model as cm  # noqa: E402
from helpers.measuring import profile  # noqa: E402

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
        assert r.model == "mlp" and r.preset == "tiny" and r.n_devices == 8
        assert r.mesh_shape == (8, 1)
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
        assert r.remat is False and r.resized == "" and r.compiler_options == {}


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
    assert lines[0].startswith("model 'mlp', preset 'tiny': MLPStack: 2 blocks, d_model 128")
    assert "8 x cpu" in lines[0]
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
    assert table.startswith("model 'mlp', preset 'tiny' (0.3 M parameters")
    assert table.splitlines()[1] == "MLPStack: 2 blocks, d_model 128, d_ff 512, 16 classes"
    header = table.splitlines()[4]
    assert header.split() == ["dp", "fsdp"]
    mfu_row = next(line for line in table.splitlines() if line.startswith("MFU"))
    assert mfu_row.split()[-2:] == ["n/a", "n/a"]
    assert "NOT GPU timings" in table
    assert "FLOPs / step (formula): 6 x tokens x matmul parameters." in table
    assert "median step time ratios, same run: fsdp/dp = " in table
    ratio = results[1].step_median_s / results[0].step_median_s
    assert f"fsdp/dp = {ratio:.2f}" in table
    assert "allocator" not in table  # measured (the JSON keeps it), not explained: not shown
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
    assert report["model"] == "mlp" and report["preset"] == "tiny"
    assert report["config"]["d_model"] == TINY.d_model
    assert "6 x tokens x matmul parameters" in report["notes"]["mfu"]
    assert report["notes"]["simulated"] is True and env["xla_flags"] == os.environ.get(
        "XLA_FLAGS", ""
    )
    assert [r["strategy"] for r in report["results"]] == ["dp", "fsdp"]
    assert {r["model"] for r in report["results"]} == {"mlp"}
    first = report["results"][0]
    assert first["remat"] is False and first["resized"] == "" and first["compiler_options"] == {}
    assert report["results"][1]["collectives"]["all-gather"]["ops"] >= 1


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
    assert ref.cfg == gpu and ref.flops_per_s == 989e12 and "assumed: model 'mlp'" in ref.source
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
# The cost model's units against the compiled steps
# ---------------------------------------------------------------------------


def test_the_compiled_bytes_are_the_cost_models_units(tiny):
    """On CPU (f32 on the wire, FSDP's gradients all-reduced, its gathered weights kept from
    the forward to the backward pass) DP sends 2 units, FSDP 3."""
    by_name, _, _ = tiny
    for s in ("dp", "fsdp"):
        units = cm.comm_units(s, keep_gathered=True, reduce_scatter=False)
        predicted = cm.comm_bytes(
            s, TINY.param_count(), 8, 4, keep_gathered=True, reduce_scatter=False
        )
        assert by_name[s].comm_bytes_per_device == pytest.approx(predicted.total, rel=0.01)
        assert units.total == {"dp": 2, "fsdp": 3}[s]


def test_remat_gathers_the_weights_again_and_recomputes_the_forward(tiny):
    by_name, _, _ = tiny
    (r,) = profile.compare_strategies(
        ("fsdp",), preset="tiny", remat=True, dry_run=True, progress=False
    )
    plain = by_name["fsdp"]
    assert r.remat and r.n_params == plain.n_params  # nn.remat keeps the parameter tree
    assert r.collectives["all-gather"]["ops"] == 2 * plain.collectives["all-gather"]["ops"]
    assert r.collectives["all-gather"]["bytes"] == 2 * plain.collectives["all-gather"]["bytes"]
    assert r.collectives["all-reduce"] == plain.collectives["all-reduce"]
    predicted = cm.comm_bytes("fsdp", TINY.param_count(), 8, 4, reduce_scatter=False)
    assert r.comm_bytes_per_device == pytest.approx(predicted.total, rel=0.01)
    # The backward pass recomputes the forward: about 8/6 of the matmul FLOPs.
    assert r.flops_hlo_per_device / plain.flops_hlo_per_device == pytest.approx(8 / 6, rel=0.05)
    assert r.flops_formula == plain.flops_formula  # model FLOPs, what MFU divides


def test_compile_step_is_the_program_compare_strategies_timed(tiny):
    from helpers.measuring.measure import collective_stats, step_memory

    by_name, _, _ = tiny
    for s in ("dp", "fsdp"):
        step = profile.compile_step(s, "tiny")
        assert profile.program_fingerprint(step.compiled) == by_name[s].program_fingerprint
        assert collective_stats(step.compiled) == by_name[s].collectives
        assert step_memory(step.compiled) == by_name[s].step_memory
        assert step.workload.cfg == profile.workload_for("tiny", (s,), jax.devices()).cfg
    specs = profile.compile_step("fsdp", "tiny")
    kernel = specs.params["block_0"]["up"]["kernel"]
    assert kernel.shape == (128, 512) and tuple(kernel.sharding.spec) == ("data", None)
    assert tuple(specs.logical["block_0"]["up"]["kernel"]) == ("embed", "mlp")
    assert tuple(specs.params["block_0"]["up"]["bias"].sharding.spec) in ((), (None,))


def test_compile_step_takes_rules_of_your_own_and_a_config():
    from helpers.measuring.measure import collective_stats
    from helpers.placing.models import ModelConfig
    from helpers.placing.sharding import LOGICAL_RULES

    cfg = ModelConfig(d_model=64, d_ff=512, n_layers=3, n_classes=16, batch=2, seq=8)
    dp_rules = LOGICAL_RULES["dp"]
    width = tuple((name, "data" if name in ("batch", "mlp") else None) for name, _ in dp_rules)
    step = profile.compile_step(width, cfg)
    assert step.rules == width
    assert tuple(step.params["block_1"]["down"]["kernel"].sharding.spec) == ("data", None)
    stats = collective_stats(step.compiled)
    # the up kernel, up bias and down kernel of each block, each gathered once
    assert stats["all-gather"]["ops"] == 3 * cfg.n_layers
    split = cfg.n_layers * (2 * cfg.d_model * cfg.d_ff + cfg.d_ff)
    sent = sum(v["sent_per_device"] for v in stats.values())
    # and every gradient all-reduced, with the loss (one f32) in the same all-reduce
    want = (split + 2 * (cfg.param_count() + 1)) * 4 * 7 / 8
    assert sent == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize(
    "layout, said",
    [
        ("zero", "is not one of"),
        ((("batch", "nowhere"),), "neither a strategy of LOGICAL_RULES .* nor logical rules"),
        ("not rules", "is not one of"),
        ([("batch",)], "neither a strategy"),
        (42, "neither a strategy"),
    ],
)
def test_compile_step_refuses_a_layout_it_cannot_read(layout, said):
    with pytest.raises(ValueError, match=said):
        profile.compile_step(layout, "tiny")


def test_compile_step_resizes_a_preset_as_compare_strategies_does():
    three = jax.devices()[:3]
    (dp3, _) = profile.compare_strategies(
        ("dp", "fsdp"), preset="tiny", devices=three, dry_run=True, progress=False
    )
    alone = profile.compile_step("dp", "tiny", devices=three)
    assert alone.workload.cfg.d_model == 128  # DP splits nothing: nothing to resize
    both = profile.compile_step("dp", "tiny", devices=three, resize_for=("dp", "fsdp"))
    assert both.workload.cfg.d_model == dp3.config["d_model"] == 144  # 3 x 48
    assert profile.program_fingerprint(both.compiled) == dp3.program_fingerprint
    with pytest.raises(ValueError, match="is not one of"):
        profile.compile_step("dp", "tiny", resize_for=("zero",))


def test_compile_step_refuses_a_degenerate_mesh():
    with pytest.raises(ValueError, match="repeat each other's work"):
        profile.compile_step("dp", "tiny", mesh_shape=(4, 2))


def test_gpu_compiler_options_exist_in_this_jaxlib(monkeypatch):
    """XLA rejects an unknown option by name, on any backend: compiling proves the names."""
    import jax.numpy as jnp

    lowered = jax.jit(lambda x: x * 2).lower(jnp.ones(3))
    assert lowered.compile(profile.GPU_COMPILER_OPTIONS) is not None
    with pytest.raises(Exception, match="No such compile option"):
        lowered.compile({"xla_gpu_enable_latency_hiding_schedulr": True})
    monkeypatch.setenv("XLA_FLAGS", "")
    assert profile.gpu_compiler_options() == {"xla_gpu_enable_latency_hiding_scheduler": True}
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_latency_hiding_scheduler=false")
    assert profile.gpu_compiler_options() == {}  # the user's flag wins


# ---------------------------------------------------------------------------
# Sizes that follow the mesh, and strategies the mesh leaves degenerate
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("preset", "strategies", "shape", "changed"),
    [
        ("tiny", ("dp", "fsdp"), (8, 1), {}),
        ("tiny", ("dp", "fsdp"), (3, 1), {"d_model": 144}),  # lcm(3, 8) = 24
        ("tiny", ("dp", "fsdp"), (7, 1), {"d_model": 168}),
        ("tiny", ("dp",), (7, 1), {}),  # DP splits no parameter
        ("tiny", ("tp",), (1, 3), {"d_ff": 528}),
        ("tiny", ("fsdp_tp",), (3, 2), {"d_model": 144}),  # 2 divides d_ff = 512 already
        ("gpu", ("dp", "fsdp"), (6, 1), {"d_model": 4224}),  # lcm(6, 128) = 384
        ("gpu", ("dp", "fsdp"), (5, 1), {"d_model": 4480}),
    ],
)
def test_fit_to_mesh_rounds_up_what_the_mesh_must_divide(preset, strategies, shape, changed):
    base = profile.PRESETS[preset]
    cfg, note = profile.fit_to_mesh(base, strategies, shape, profile.PRESET_MULTIPLE[preset])
    assert cfg == dataclasses.replace(base, **changed)
    assert bool(note) == bool(changed)
    for width, value in changed.items():
        assert f"{width} {getattr(base, width)} -> {value}" in note


def test_workload_for_resizes_presets_but_not_a_model_config():
    three = jax.devices()[:3]
    wl = profile.workload_for("tiny", ("dp", "fsdp"), three)
    assert wl.cfg.d_model == 144 and wl.cfg.batch == 3 * TINY.batch and "d_model 128" in wl.resized
    own = dataclasses.replace(TINY, d_model=96)
    wl = profile.workload_for(own, ("fsdp",), three, batch_per_device=2, remat=True)
    assert wl.name == "custom" and wl.cfg.d_model == 96 and wl.resized == ""
    assert wl.cfg.batch == 6 and wl.batch_per_device == 2 and wl.remat
    assert wl.model().__class__.__name__ != "MLPStack"  # the nn.remat-lifted class


def test_three_devices_run_fsdp_with_a_resized_preset():
    (r,) = profile.compare_strategies(
        ("fsdp",), preset="tiny", devices=jax.devices()[:3], dry_run=True, progress=False
    )
    assert r.config["d_model"] == 144 and r.n_params == r.config["param_count"]
    assert r.mesh_shape == (3, 1) and "all-gather" in r.collectives
    assert "resized to fit the mesh: d_model 128 -> 144" in profile.format_table([r])


@pytest.mark.parametrize(
    ("strategy", "shape", "why"),
    [
        ("dp", (8, 1), None),
        ("fsdp", (8, 1), None),
        ("tp", (1, 8), None),
        ("hybrid", (4, 2), None),
        ("fsdp_tp", (2, 4), None),
        ("tp", (1, 1), None),  # one device: every strategy is the one-device program
        ("tp", (8, 1), "'model' has size 1; the 8 devices along 'data' would repeat"),
        ("hybrid", (8, 1), "'model' has size 1; use a mesh with both axes > 1, e.g. (4, 2)"),
        ("fsdp_tp", (7, 1), "7 devices (a prime count) make no mesh with both axes > 1"),
        ("dp", (4, 2), "the 2 devices along 'model' would repeat each other's work; use mesh (8, 1)"),
        ("fsdp", (1, 8), "'data' has size 1; the 8 devices along 'model'"),
    ],
)  # fmt: skip
def test_degenerate_strategies_are_named_with_a_reason(strategy, shape, why):
    said = profile.degenerate(strategy, shape)
    if why is None:
        assert said is None
    else:
        assert why in said and f"strategy {strategy!r} on mesh {shape}" in said


def test_compare_strategies_refuses_what_would_measure_nothing():
    with pytest.raises(ValueError, match="'tp' on mesh \\(8, 1\\)"):
        profile.compare_strategies(("dp", "tp"), preset="tiny", dry_run=True, progress=False)
    with pytest.raises(ValueError, match="mesh_shape=\\(2, 2\\) holds 4 devices, but 8"):
        profile.compare_strategies(("hybrid",), preset="tiny", mesh_shape=(2, 2), progress=False)
    with pytest.raises(
        ValueError, match="of model 'mlp' is sized for a GPU .* TFLOP per step.*--allow-cpu"
    ):
        profile.compare_strategies(("dp",), preset="gpu", progress=False)
    with pytest.raises(ValueError, match="sized for a GPU"):
        profile.compare_strategies(("dp",), preset="gpu_small", progress=False)
    # Asked explicitly (or only compiling), the GPU preset passes the checks on CPU devices.
    gpu = profile.workload_for("gpu", ("dp",), jax.devices())
    for dry_run, allow_cpu in ((False, True), (True, False)):
        profile._refuse(("dp",), gpu, jax.devices(), (8, 1), 1, 0, dry_run, allow_cpu)


# ---------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------


def test_cli_writes_json_and_plot(tmp_path):
    out, png = tmp_path / "out.json", tmp_path / "out.png"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUM_DEVICES": "2", "MPLBACKEND": "Agg"}
    cmd = [sys.executable, "-m", "helpers.profile", "--preset", "tiny", "--steps", "2", "--warmup", "1",
           "--json", str(out), "--plot", str(png)]  # fmt: skip
    proc = run_jax_child(cmd, devices=2, cwd=ROOT, env=env, timeout=240)
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
        and args.model == "mlp"  # what a learner ran before --model existed
    )
    assert profile.build_parser().parse_args(["--model", "transformer"]).model == "transformer"
    with pytest.raises(SystemExit):
        profile.build_parser().parse_args(["--model", "cnn"])
    with pytest.raises(SystemExit):
        profile.build_parser().parse_args(["--strategies", "pp"])
    assert profile.build_parser().parse_args(["--mesh-shape", "2,4"]).mesh_shape == (2, 4)
    for bad in ("2x4", "8", "0,8", "2,2,2"):
        with pytest.raises(SystemExit):
            profile.build_parser().parse_args(["--mesh-shape", bad])


def test_cli_help_shows_the_mesh_and_model_options():
    text = profile.build_parser().format_help()
    assert "--mesh-shape DATA,MODEL" in text and "--allow-cpu" in text and "--remat" in text
    assert "--model {mlp,transformer}" in text and "--preset {auto,tiny,gpu_small,gpu}" in text


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--preset", "gpu"], "preset 'gpu' of model 'mlp' is sized for a GPU"),
        (
            ["--model", "transformer", "--preset", "gpu"],
            "preset 'gpu' of model 'transformer' is sized",
        ),
        (
            ["--model", "transformer", "--preset", "tiny", "--strategies", "tp"],
            "'tp' on mesh (8, 1)",
        ),
        (["--preset", "tiny", "--strategies", "tp"], "'tp' on mesh (8, 1)"),
        (["--preset", "tiny", "--mesh-shape", "4,2"], "'dp' on mesh (4, 2)"),
    ],
)
def test_cli_refuses_with_one_sentence(argv, said, capsys):
    assert profile.main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err and "usage:" not in err
    assert len(err.strip().splitlines()) == 1


def test_cli_runs_a_two_axis_mesh(capsys):
    argv = ["--preset", "tiny", "--mesh-shape", "4,2", "--strategies", "hybrid", "fsdp_tp",
            "--dry-run", "--quiet"]  # fmt: skip
    assert profile.main(argv) == 0
    out = capsys.readouterr().out
    assert "mesh (4, 2) (data, model)" in out and "hybrid" in out and "fsdp_tp" in out


def test_requirements_gpu_is_the_pins_plus_the_cuda_extra_of_the_same_jax():
    """The README's GPU install: requirements-gpu.txt must not drift from requirements.txt."""
    pins = dict(
        line.split("==")
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    gpu = [
        ln for ln in (ROOT / "requirements-gpu.txt").read_text().splitlines() if ln and ln[0] != "#"
    ]
    assert gpu == ["-r requirements.txt", f"jax[cuda12]=={pins['jax']}"]
    assert pins["jaxlib"] == pins["jax"]  # the CUDA plugin is released with both, same version


# ---------------------------------------------------------------------------
# The Transformer as a model choice (--model transformer)
# ---------------------------------------------------------------------------

LM = profile.TRANSFORMER_PRESETS


@pytest.fixture(scope="module")
def lm_cli(tmp_path_factory):
    """``python -m helpers.profile --model transformer --preset tiny`` on 5 CPU devices:
    DP and FSDP, 2 timed steps each, with a JSON report."""
    out = tmp_path_factory.mktemp("lm") / "lm.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    cmd = [sys.executable, "-m", "helpers.profile", "--model", "transformer", "--preset", "tiny",
           "--devices", "5", "--steps", "2", "--warmup", "1", "--json", str(out)]  # fmt: skip
    proc = run_jax_child(cmd, devices=5, cwd=ROOT, env=env, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout, json.loads(out.read_text())


def test_cli_trains_the_transformer_on_cpu_and_names_it(lm_cli):
    stdout, report = lm_cli
    assert report["model"] == "transformer" and report["preset"] == "tiny"
    env = report["environment"]
    assert env["device_count"] == 5 and env["platform"] == "cpu"
    assert "12 x layers x heads x head_dim x seq" in report["notes"]["mfu"]
    table = stdout[stdout.index("\nmodel 'transformer', preset 'tiny'") + 1 :]  # after [profile]
    # 5 devices do not divide d_model 128: the heads grow with it (10 x 16 = 160).
    assert table.splitlines()[1] == (
        "TransformerLM: 2 layers, d_model 160, 10 heads x 16, d_ff 512, "
        "vocabulary 1,003 padded to 1,008"
    )
    assert "resized to fit the mesh: n_heads 8 -> 10 and d_model 128 -> 160" in table
    assert "FLOPs / step (formula): tokens x (6 x matmul parameters + 12 x layers" in table
    assert "[profile] fsdp: median step" in stdout
    cfg = dataclasses.replace(LM["tiny"], d_model=160, n_heads=10, batch=5 * LM["tiny"].batch)
    assert profile.config_from_dict(report["config"], "transformer") == cfg
    assert report["config"]["padded_vocab"] == 1008
    assert report["config"]["matmul_params"] == cfg.matmul_params()
    dp, fsdp = report["results"]
    for r in (dp, fsdp):
        assert r["model"] == "transformer" and r["mesh_shape"] == [5, 1]
        assert r["n_params"] == r["config"]["param_count"] == cfg.param_count()
        assert r["tokens_per_step"] == 5 * 4 * 32 and len(r["step_times_s"]) == 2
        assert len(r["losses"]) == 2 and all(math.isfinite(v) for v in r["losses"])


def test_the_transformers_flops_are_its_own_formula_attention_included(lm_cli):
    """MFU's numerator is TransformerConfig.train_flops_per_step() (PaLM's count), which
    XLA's count of the per-device program matches (5 devices, a little elementwise work)."""
    _, report = lm_cli
    cfg = profile.config_from_dict(report["config"], "transformer")
    tokens = cfg.batch * cfg.seq
    attention = 12 * cfg.n_layers * cfg.n_heads * cfg.head_dim * cfg.seq
    for r in report["results"]:
        assert r["flops_formula"] == cfg.train_flops_per_step()
        assert r["flops_formula"] == tokens * (6 * cfg.matmul_params() + attention)
        assert 1.0 <= 5 * r["flops_hlo_per_device"] / r["flops_formula"] < 1.1


def test_dp_and_fsdp_train_the_same_transformer(lm_cli):
    _, report = lm_cli
    dp, fsdp = report["results"]
    np.testing.assert_allclose(dp["losses"], fsdp["losses"], rtol=1e-5)
    assert "all-gather" in fsdp["collectives"] and "all-gather" not in dp["collectives"]
    assert fsdp["step_memory"]["argument"] < dp["step_memory"]["argument"]
    # DP: every device holds params + Adam mu + nu in f32, and Adam's int32 step count.
    assert dp["state_bytes_per_device"] == 3 * 4 * dp["n_params"] + 4


def test_a_transformer_result_round_trips_and_projects(lm_cli):
    _, report = lm_cli
    res = profile.StrategyResult(**report["results"][0])
    cfg = profile.config_from_dict(res.config, "transformer")
    assert profile.config_dict(cfg) == res.config
    # A CPU result projects from the Transformer's own gpu preset, at the H100's peak.
    ref = profile.projection_base(res)
    assert ref.cfg == LM["gpu"] and "assumed: model 'transformer', preset 'gpu'" in ref.source
    on_gpu = dataclasses.replace(
        res, platform="gpu", device_kind="NVIDIA H100 80GB HBM3", n_devices=1
    )
    base = profile.projection_base(on_gpu)
    assert base.cfg == dataclasses.replace(cfg, batch=res.batch_per_device)
    assert base.flops_per_s == pytest.approx(res.flops_formula / res.step_median_s)
    step = cm.step_cost(base.cfg, "fsdp", 8, base.flops_per_s, cm.NVLINK4, 2)
    assert step.compute.total == pytest.approx(base.cfg.train_flops_per_step() / base.flops_per_s)
    with pytest.raises(ValueError, match="model='cnn' is not one of"):
        profile.config_from_dict(res.config, "cnn")


def test_transformer_remat_recomputes_each_block(lm_cli):
    _, report = lm_cli
    plain = report["results"][1]
    (r,) = profile.compare_strategies(
        ("fsdp",), preset="tiny", model="transformer", remat=True, dry_run=True,
        devices=jax.devices()[:5], progress=False,
    )  # fmt: skip
    assert r.remat and r.config["remat"] and r.n_params == plain["n_params"]
    assert r.flops_formula == plain["flops_formula"]  # model FLOPs: no recompute counted
    # Each block's forward runs again (its weights gathered again); the embedding and the
    # logits, outside the blocks, do not: less than the whole model's 8/6.
    ratio = r.flops_hlo_per_device / plain["flops_hlo_per_device"]
    assert 1.1 < ratio < 8 / 6
    assert r.collectives["all-gather"]["bytes"] > plain["collectives"]["all-gather"]["bytes"]


def test_gpu_transformer_dry_run_compiles_and_reports_parameters_and_flops(tmp_path, capsys):
    """The gpu preset compiled (never run) on 8 simulated devices, through the CLI."""
    out = tmp_path / "gpu.json"
    argv = ["--model", "transformer", "--preset", "gpu", "--devices", "8", "--strategies", "fsdp",
            "--dry-run", "--quiet", "--json", str(out)]  # fmt: skip
    assert profile.main(argv) == 0
    text = capsys.readouterr().out
    cfg = dataclasses.replace(LM["gpu"], batch=8 * LM["gpu"].batch)
    report = json.loads(out.read_text())
    (r,) = report["results"]
    assert report["model"] == "transformer" and r["step_times_s"] == [] and r["mfu"] is None
    assert r["n_params"] == report["config"]["param_count"] == cfg.param_count()
    assert r["flops_formula"] == cfg.train_flops_per_step()
    assert r["flops_hlo_per_device"] == pytest.approx(r["flops_formula"] / 8, rel=0.05)
    assert r["config"]["dtype"] == "bfloat16" and r["config"]["param_dtype"] == "float32"
    assert "all-gather" in r["collectives"] and "dry run: compiled only" in text
    assert f"({cfg.param_count() / 1e6:,.1f} M parameters, bfloat16 compute" in text
    assert "TransformerLM: 8 layers, d_model 2048, 16 heads x 128, d_ff 8192" in text
    # FSDP's arguments: about 1/8 of the f32 params + Adam mu, nu (12 bytes per parameter).
    assert r["step_memory"]["argument"] == pytest.approx(12 * cfg.param_count() / 8, rel=0.02)


@pytest.mark.parametrize("name", ["gpu_small", "gpu"])
def test_gpu_transformer_presets_are_standard_bf16_shapes(name):
    cfg = LM[name]
    tokens = jax.ShapeDtypeStruct((cfg.batch, cfg.seq), jnp.int32)
    leaves = jax.tree.leaves(jax.eval_shape(cfg.model().init, jax.random.key(0), tokens))
    assert sum(math.prod(p.shape) for p in leaves) == cfg.param_count()
    assert {p.dtype for p in leaves} == {jnp.dtype(jnp.float32)}  # f32 master weights
    assert cfg.dtype == jnp.bfloat16  # bf16 compute
    assert cfg.n_heads * cfg.head_dim == cfg.d_model
    assert all(d % 128 == 0 for d in (cfg.d_model, cfg.d_ff, cfg.head_dim, cfg.seq))
    # GPT-2's vocabulary, padded the way TransformerConfig pads it: 50,257 -> 50,304.
    assert cfg.vocab_size == 50257 and cfg.padded_vocab == 50304 and cfg.padded_vocab % 128 == 0
    # Attention is a real part of the FLOPs that MFU counts, not a rounding error.
    attention = 12 * cfg.n_layers * cfg.n_heads * cfg.head_dim * cfg.seq * cfg.batch * cfg.seq
    assert attention / cfg.train_flops_per_step() > 0.05
    assert 1e8 <= cfg.param_count() < 1e9
    assert LM["gpu_small"].param_count() < LM["gpu"].param_count()
    assert LM["gpu"].batch * LM["gpu"].seq >= 8192  # tokens per device: large matmuls


def test_the_model_choice_and_a_config_must_agree():
    devs, own = jax.devices(), LM["tiny"]
    assert profile.resolve_preset("tiny", devs, "transformer") == ("tiny", own)
    assert profile.resolve_preset("auto", devs, "transformer") == ("tiny", own)  # CPU devices
    assert profile.resolve_preset("tiny", devs) == ("tiny", TINY)  # the MLP by default
    assert profile.resolve_preset(own, devs) == profile.resolve_preset(own, devs, "transformer")
    with pytest.raises(ValueError, match="model='mlp', but preset is a TransformerConfig"):
        profile.resolve_preset(own, devs, "mlp")
    with pytest.raises(ValueError, match="model='cnn' is not one of"):
        profile.compare_strategies(("dp",), preset="tiny", model="cnn", progress=False)
    with pytest.raises(ValueError, match="preset='huge' is not one of"):
        profile.resolve_preset("huge", devs, "transformer")
    wl = profile.workload_for(own, ("dp",), devs[:3], batch_per_device=2, remat=True)
    assert (wl.model_name, wl.name, wl.resized, wl.batch_per_device) == (
        "transformer",
        "custom",
        "",
        2,
    )
    assert wl.cfg == dataclasses.replace(own, batch=6, remat=True) and wl.model().remat
    assert wl.x_init(profile.make_mesh((3, 1), profile.AXES, devices=devs[:3])).dtype == jnp.int32


@pytest.mark.parametrize(
    ("preset", "strategies", "shape", "changed"),
    [
        ("tiny", ("dp", "fsdp"), (8, 1), {}),
        ("tiny", ("tp",), (1, 8), {}),  # 8 heads, d_ff 512 and 1008 tokens: all split 8 ways
        ("tiny", ("dp", "fsdp"), (3, 1), {"n_heads": 9, "d_model": 144}),
        ("tiny", ("dp", "fsdp"), (5, 1), {"n_heads": 10, "d_model": 160}),
        ("tiny", ("fsdp_all",), (6, 1), {"n_heads": 9, "d_model": 144}),  # 144 = 6 x 24
        ("tiny", ("dp", "fsdp"), (7, 1), {"n_heads": 14, "d_model": 224}),
        ("tiny", ("fsdp_tp",), (3, 2), {"n_heads": 12, "d_model": 192}),  # heads / 2, d_model / 3
        ("tiny", ("tp",), (1, 5), {"n_heads": 10, "d_model": 160, "d_ff": 520, "vocab_multiple": 40}),
        ("tiny", ("tp",), (1, 7), {"n_heads": 14, "d_model": 224, "d_ff": 560}),  # 1008 = 7 x 144
        ("gpu", ("dp", "fsdp"), (6, 1), {"n_heads": 18, "d_model": 2304}),
        ("gpu", ("tp",), (1, 3), {"n_heads": 18, "d_model": 2304, "d_ff": 8448}),  # 50304 = 3 x 16768
        ("gpu", ("tp",), (1, 5), {"n_heads": 20, "d_model": 2560, "d_ff": 8320, "vocab_multiple": 640}),
    ],
)  # fmt: skip
def test_fit_to_mesh_resizes_the_transformers_widths(preset, strategies, shape, changed):
    base = LM[preset]
    cfg, note = profile.fit_to_mesh(base, strategies, shape, profile.PRESET_MULTIPLE[preset])
    assert cfg == dataclasses.replace(base, **changed)
    assert bool(note) == bool(changed)
    assert cfg.n_heads * cfg.head_dim == cfg.d_model  # still a standard Transformer shape
    if "d_model" in changed:
        assert f"n_heads {base.n_heads} -> {cfg.n_heads} and d_model {base.d_model} -> " in note
    if "vocab_multiple" in changed:
        assert f"padded_vocab {base.padded_vocab} -> {cfg.padded_vocab}" in note


@pytest.mark.parametrize(
    ("shape", "strategy"),
    [((3, 1), "fsdp"), ((1, 5), "tp"), ((3, 2), "fsdp_tp"), ((7, 1), "fsdp_all")],
)
def test_the_tiny_transformer_compiles_at_3_5_6_and_7_devices(shape, strategy):
    n = math.prod(shape)
    (r,) = profile.compare_strategies(
        (strategy,), preset="tiny", model="transformer", devices=jax.devices()[:n],
        mesh_shape=shape, dry_run=True, progress=False,
    )  # fmt: skip
    cfg = profile.config_from_dict(r.config, "transformer")
    assert r.resized and r.mesh_shape == shape and r.n_params == cfg.param_count()
    assert r.flops_formula == cfg.train_flops_per_step()
    # Each device computes its own share: nothing is repeated.
    assert n * r.flops_hlo_per_device == pytest.approx(r.flops_formula, rel=0.15)
    assert r.collectives  # the mesh is used


def test_the_transformer_is_refused_degenerate_strategies_with_the_series_sentence():
    with pytest.raises(ValueError) as err:
        profile.compare_strategies(
            ("hybrid",),
            preset="tiny",
            model="transformer",
            devices=jax.devices()[:5],
            progress=False,
        )
    assert str(err.value).endswith(
        "strategy 'hybrid' on mesh (5, 1) (data, model): it splits over 'data' and 'model', and "
        "'model' has size 1; 5 devices (a prime count) make no mesh with both axes > 1."
    )
    with pytest.raises(ValueError) as err:
        profile.compare_strategies(
            ("fsdp_tp", "tp"), preset="tiny", model="transformer", devices=jax.devices()[:6],
            mesh_shape=(3, 2), progress=False,
        )  # fmt: skip
    assert str(err.value).endswith(
        "strategy 'tp' on mesh (3, 2) (data, model): the 3 devices along 'data' would repeat "
        "each other's work; use mesh (1, 6)."
    )


def test_the_workload_names_are_the_same_objects_from_helpers_profile():
    import ast
    import inspect

    from helpers.measuring import workload

    tree = ast.parse(inspect.getsource(workload))
    defined = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined |= {t.id for t in targets if isinstance(t, ast.Name)}
    public = {n for n in defined if not n.startswith("_") and n != "P"}
    assert {"PRESETS", "workload_for", "fit_to_mesh", "degenerate", "Workload"} <= public
    for name in public:
        assert name in profile.__all__ and getattr(profile, name) is getattr(workload, name)
