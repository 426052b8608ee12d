"""Tests of helpers.measuring.trace: a real trace of DP and FSDP steps, read back; synthetic traces for
the overlap arithmetic and the GPU layout; and every bad input the reader refuses.
"""

from helpers import use_simulated_devices

use_simulated_devices(8, quiet=True)

import gzip  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from helpers.measuring import trace as tr  # noqa: E402
from helpers.measuring.profile import compare_strategies  # noqa: E402


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """Two traced steps each of DP and FSDP, tiny preset, 8 simulated devices."""
    where = tmp_path_factory.mktemp("trace")
    results = compare_strategies(
        ("dp", "fsdp"), preset="tiny", steps=1, warmup=0, progress=False, trace_dir=where
    )
    return {r.strategy: tr.read_trace(r.trace_dir) for r in results}


def test_the_profiler_writes_json_and_xplane_files(traced, tmp_path_factory):
    (run,) = (tmp_path_factory.getbasetemp() / "trace0" / "dp" / "plugins" / "profile").iterdir()
    names = sorted(p.name for p in run.iterdir())
    assert any(n.endswith(".trace.json.gz") for n in names)
    assert any(n.endswith(".xplane.pb") for n in names)
    assert "perfetto_trace.json.gz" in names


def test_every_device_and_both_steps_are_read(traced):
    for spans in traced.values():
        assert {s.device for s in spans} == set(range(8))
        assert {s.step for s in spans} == {0, 1}
        assert {s.module for s in spans} == {"jit_step"}
        assert all(s.dur_us >= 0 for s in spans)


def test_dp_all_reduces_once_at_the_end_and_fsdp_gathers_before_computing(traced):
    for device in range(8):
        dp = tr.step_ops(traced["dp"], device)
        coll = [s.name for s in dp if s.kind == "collective"]
        assert len(coll) == 1 and coll[0].startswith("all-reduce")
        # the all-reduce comes after the forward and backward matmuls
        first = next(i for i, s in enumerate(dp) if s.kind == "collective")
        assert sum(s.kind == "compute" for s in dp[:first]) > 10
        fsdp = tr.step_ops(traced["fsdp"], device)
        gathers = [i for i, s in enumerate(fsdp) if s.name.startswith("all-gather")]
        reduce = [i for i, s in enumerate(fsdp) if s.name.startswith("all-reduce")]
        assert len(gathers) >= 2 and len(reduce) == 1 and max(gathers) < reduce[0]


def test_the_summary_is_consistent(traced):
    for spans in traced.values():
        s = tr.summarize_trace(spans)
        assert (s.n_devices, s.n_steps) == (8, 2)
        assert s.compute_ms > 0 and s.collective_ms > 0
        assert 0 <= s.exposed_ms <= s.collective_ms * (1 + 1e-9)
        assert s.busiest_collective is not None
        assert s.collective_ops.get("all-reduce") == 1
    assert tr.summarize_trace(traced["fsdp"]).collective_ops.get("all-gather", 0) >= 2
    table = tr.format_trace_table(
        {k: tr.summarize_trace(v) for k, v in traced.items()}, "CPU measurement"
    )
    assert "CPU measurement" in table and "fsdp" in table and "exposed" in table


def _write(path, events):
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    return path


def _gpu_trace(tmp_path):
    """Two GPUs as XProf lays them out: a process per device, HLO names in args."""
    meta = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/device:GPU:1"}},
        {"ph": "M", "pid": 9, "name": "process_name", "args": {"name": "/host:CPU"}},
    ]

    def op(pid, name, ts, dur, module="jit_step"):
        args = {"hlo_op": name, "hlo_module": module}
        return {"ph": "X", "pid": pid, "tid": 7, "name": "kernel", "ts": ts, "dur": dur,
                "args": args}  # fmt: skip

    events = meta + [
        op(1, "fusion.1", 0, 10),
        op(1, "all-gather-start.2", 5, 15),  # 5 of 15 us hidden behind fusion.1
        op(2, "fusion.1", 0, 30),
        op(2, "all-gather-start.2", 5, 15),  # hidden entirely
        op(9, "fusion.1", 0, 1000),  # a host-side launch: ignored where devices exist
        op(1, "fusion.9", 100, 1, module="jit_other"),
    ]
    return _write(tmp_path / "gpu.trace.json.gz", events)


def test_a_gpu_trace_reads_devices_from_process_names_and_finds_what_is_exposed(tmp_path):
    spans = tr.read_trace(_gpu_trace(tmp_path))
    assert {(s.device, s.name, s.kind) for s in spans} == {
        (0, "fusion.1", "compute"),
        (0, "all-gather-start.2", "collective"),
        (1, "fusion.1", "compute"),
        (1, "all-gather-start.2", "collective"),
    }
    assert tr.exposed_spans(spans) == [(0, 10.0, 20.0)]
    s = tr.summarize_trace(spans)
    assert s.collective_ms == pytest.approx(15e-3)
    assert s.exposed_ms == pytest.approx(5e-3)  # 10 us on device 0, 0 on device 1
    assert s.compute_ms == pytest.approx(20e-3)
    assert s.busiest_collective == ("all-gather-start.2", pytest.approx(5e-3))
    other = tr.read_trace(tmp_path, module="jit_other")
    assert [x.name for x in other] == ["fusion.9"]


TPU_TRACE = Path(__file__).parent / "data" / "tpu_v5e_dp_step.trace.json.gz"


def test_a_recorded_tpu_trace_reads_like_any_other():
    """A real trace: two DP steps of the MLP (preset gpu_small, 1 x TPU v5 lite, jax 0.10.2,
    2026-12-06), the chip's own events kept, file paths removed. Read here on the CPU."""
    spans = tr.read_trace(TPU_TRACE)
    assert {s.module for s in spans} == {"jit_step"} and {s.step for s in spans} == {0, 1}
    assert {s.device for s in spans} == {0} and {s.thread for s in spans} == {"XLA Ops"}
    assert all(s.kind == "compute" for s in spans)  # one chip: no collective
    s = tr.summarize_trace(spans)
    assert (s.n_devices, s.n_steps, s.collective_ms) == (1, 2, 0.0)
    assert 21.7 < s.compute_ms <= s.step_ms < 21.8  # the chip is busy for the whole step
    # the FLOPs XLA:TPU counted for the step's ops: the MLP's formula says 3.30e12
    assert s.model_flops == pytest.approx(3.3173e12, rel=1e-4)
    assert 0.77 < s.mfu(197e12) < 0.78  # TPU v5e's dense bf16 peak
    with pytest.raises(ValueError, match="peak_flops_per_s"):
        s.mfu(0)
    name, ms = tr.slowest_ops(spans, 1)[0]
    assert name.startswith("fusion") and ms > 1


def _tpu_trace(tmp_path):
    """Two TPU chips as the TPU runtime lays them out: a process per chip, its ops on the
    thread "XLA Ops" with the HLO line in long_name, the module on "XLA Modules"."""
    meta = [{"ph": "M", "pid": p, "name": "process_name", "args": {"name": f"/device:TPU:{d}"}}
            for p, d in ((3, 0), (4, 1))]  # fmt: skip
    for pid in (3, 4):
        meta += [{"ph": "M", "pid": pid, "tid": t, "name": "thread_name", "args": {"name": n}}
                 for t, n in ((2, "XLA Modules"), (3, "XLA Ops"))]  # fmt: skip

    def op(pid, name, ts, dur, line=""):
        return {"ph": "X", "pid": pid, "tid": 3, "name": name, "ts": ts, "dur": dur,
                "args": {"long_name": line or f"%{name} = f32[8] op()", "model_flops": "100"}}  # fmt: skip

    rs = "%fusion.7 = (f32[8]) fusion(%p), kind=kCustom, calls=%all-reduce-scatter.5"
    events = meta + [
        {"ph": "X", "pid": p, "tid": 2, "name": "jit_step(123)", "ts": 0, "dur": 50} for p in (3, 4)
    ] + [
        op(3, "fusion.1", 0, 10),
        op(3, "fusion.7", 5, 15, rs),  # XLA:TPU's reduce-scatter: 5 of 15 us hidden
        op(4, "fusion.1", 0, 30),
        op(4, "all-gather-start.2", 5, 15),
        op(4, "fusion.2", 60, 5),  # after the module's window: not in jit_step
    ]  # fmt: skip
    return _write(tmp_path / "tpu.trace.json.gz", events)


def test_a_tpu_trace_finds_modules_collectives_and_flops(tmp_path):
    spans = tr.read_trace(_tpu_trace(tmp_path))
    assert {(s.device, s.name, s.kind) for s in spans} == {
        (0, "fusion.1", "compute"),
        (0, "fusion.7", "collective"),
        (1, "fusion.1", "compute"),
        (1, "all-gather-start.2", "collective"),
    }
    assert tr.exposed_spans(spans) == [(0, 10.0, 20.0)]
    s = tr.summarize_trace(spans)
    assert s.model_flops == pytest.approx(200)  # two ops a chip, 100 FLOPs each
    assert s.collective_ops == {"reduce-scatter": 1}
    assert [x.name for x in tr.read_trace(tmp_path, module="")] == ["fusion.2"]


@pytest.mark.parametrize(
    "name",
    ["all-gather", "all-gather.3", "all-reduce-start.1", "reduce-scatter.12",
     "collective-permute-done", "all-to-all.2"],
)  # fmt: skip
def test_collectives_are_told_by_their_hlo_names(name):
    assert tr.is_collective(name)


@pytest.mark.parametrize("name", ["fusion.3", "ynn_fusion.31", "dot.2", "all_gather_fusion"])
def test_compute_is_everything_else(name):
    assert not tr.is_collective(name)


def test_bad_input_is_refused_with_the_parameter_named(tmp_path):
    with pytest.raises(ValueError, match="path=.* does not exist.*trace_dir"):
        tr.read_trace(tmp_path / "nowhere")
    with pytest.raises(ValueError, match=r"holds no \*\.trace\.json\.gz"):
        tr.read_trace(tmp_path)
    text = tmp_path / "notes.trace.json.gz"
    text.write_text("not gzip")
    with pytest.raises(ValueError, match="not a gzipped JSON trace"):
        tr.read_trace(text)
    with gzip.open(tmp_path / "list.json.gz", "wt") as f:
        f.write("{broken")
    with pytest.raises(ValueError, match="not a gzipped JSON trace"):
        tr.read_trace(tmp_path / "list.json.gz")
    with gzip.open(tmp_path / "other.json.gz", "wt") as f:
        json.dump({"rows": []}, f)
    with pytest.raises(ValueError, match="no 'traceEvents' list"):
        tr.read_trace(tmp_path / "other.json.gz")
    empty = _write(tmp_path / "empty.json.gz", [{"ph": "X", "ts": 0, "dur": 1, "name": "x"}])
    with pytest.raises(ValueError, match="records no HLO op"):
        tr.read_trace(empty)
    with pytest.raises(ValueError, match="module='jit_nope' ran no op"):
        tr.read_trace(_gpu_trace(tmp_path), module="jit_nope")
    with pytest.raises(ValueError, match="spans is empty"):
        tr.summarize_trace([])
    with pytest.raises(ValueError, match="device=5 ran nothing"):
        tr.step_ops(tr.read_trace(_gpu_trace(tmp_path)), device=5)


def test_compare_strategies_refuses_a_trace_it_cannot_take_and_passes_compiler_options(tmp_path):
    with pytest.raises(ValueError, match="trace_dir needs steps that run"):
        compare_strategies(("dp",), preset="tiny", dry_run=True, trace_dir=tmp_path)
    with pytest.raises(ValueError, match="trace_steps=0 must be >= 1"):
        compare_strategies(("dp",), preset="tiny", trace_dir=tmp_path, trace_steps=0)
    (r,) = compare_strategies(
        ("dp",), preset="tiny", dry_run=True, progress=False, compiler_options={}
    )
    assert r.compiler_options == {} and r.trace_dir is None


def test_slowest_ops_ranks_each_ops_time_per_device_and_step():
    def span(device, name, kind, start, dur, step=0):
        return tr.Span(device, name, kind, float(start), float(dur), "jit_step", step, "t")

    spans = [
        span(0, "fusion.1", "compute", 0, 100),
        span(1, "fusion.1", "compute", 0, 300),
        span(0, "fusion.2", "compute", 100, 50),
        span(1, "fusion.2", "compute", 300, 50),
        span(0, "fusion.2", "compute", 150, 50),  # twice in the step: its times add up
        span(0, "all-gather.3", "collective", 200, 1000),
    ]
    assert tr.slowest_ops(spans) == [("fusion.1", 0.2), ("fusion.2", 0.075)]
    assert tr.slowest_ops(spans, n=1) == [("fusion.1", 0.2)]
    assert tr.slowest_ops(spans, kind="collective") == [("all-gather.3", 0.5)]
    with pytest.raises(ValueError, match="spans is empty"):
        tr.slowest_ops([])
    with pytest.raises(ValueError, match="n=0 must be >= 1"):
        tr.slowest_ops(spans, n=0)
    with pytest.raises(ValueError, match="kind='fusion'"):
        tr.slowest_ops(spans, kind="fusion")


def test_a_real_traces_slowest_op_is_one_it_ran(traced):
    for spans in traced.values():
        ((name, ms),) = tr.slowest_ops(spans, n=1)
        assert ms > 0 and name in {s.name for s in spans if s.kind == "compute"}


HLO = """HloModule jit_step, is_scheduled=true

%region.1 (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  ROOT %add.9 = f32[] add(%a, %a)
}

ENTRY %main.5_spmd (param: f32[16,512], param.1: f32[64,128]) -> f32[64,512] {
  %param = f32[16,512]{1,0} parameter(0), sharding={devices=[8,1]<=[8]}, metadata={op_name="p"}
  %param.1 = f32[64,128]{1,0} parameter(1)
  %all-gather = f32[128,512]{1,0} all-gather(%param), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true, metadata={op_name="jit(step)/jvp(M)/up/dot_general" source_file="x.py"}
  %copy.1 = f32[128,512]{0,1} copy(%all-gather), metadata={op_name="jit(step)/jvp(M)/up/dot_general"}
  %dot.2 = f32[64,512]{1,0} dot(%param.1, %copy.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(step)/jvp(M)/up/dot_general"}
  %dot.3 = f32[64,128]{1,0} dot(%dot.2, %all-gather), lhs_contracting_dims={1}, rhs_contracting_dims={1}, metadata={op_name="jit(step)/transpose(jvp(M))/up/dot_general"}
  %all-reduce.4 = (f32[64,128]{1,0}, f32[64,512]{1,0}, f32[8]{0}, f32[]) all-reduce(%dot.3, %dot.2, %param, %param), channel_id=2, replica_groups=[1,8]<=[8], to_apply=%region.1, backend_config={"a":{"b":1}}
  ROOT %dot.5 = f32[64,512]{1,0} dot(%param.1, %all-gather), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


def test_hlo_schedule_lists_the_entry_in_order_trimmed():
    ops = tr.hlo_schedule(HLO)
    assert [op.name for op in ops] == [
        "param", "param.1", "all-gather", "copy.1", "dot.2", "dot.3", "all-reduce.4", "dot.5",
    ]  # fmt: skip
    assert [op.index for op in ops] == list(range(8))
    ag = ops[2]
    assert ag.collective == "all-gather" and ops[4].collective is None
    assert ag.text == (
        "%all-gather = f32[128,512] all-gather(%param), replica_groups=[1,8]<=[8], dimensions={0}"
    )
    assert ag.arrays == [("f32", (128, 512))] and ag.operands == ("param",)
    assert ag.op_name == "jit(step)/jvp(M)/up/dot_general"
    ar = ops[6]
    assert ar.result == "(f32[64,128], f32[64,512], f32[8], f32[])"
    assert ar.text.startswith("%all-reduce.4 = (f32[64,128], f32[64,512], ... 4 arrays) ")
    assert "all-reduce(%dot.3, %dot.2, ... 4 operands)" in ar.text
    assert "backend_config" not in ar.text and "channel_id" not in ar.text
    assert len(ar.arrays) == 4 and ar.op_name == ""


def test_readers_of_follows_a_copy_and_an_async_done():
    ops = tr.hlo_schedule(HLO)
    ag = next(op for op in ops if op.collective == "all-gather")
    assert [r.name for r in tr.readers_of(ops, ag)] == ["dot.2", "dot.3", "dot.5"]
    assert [r.name for r in tr.readers_of(ops, ops[1])] == ["dot.2", "dot.5"]
    text = HLO.replace(
        "%all-gather = f32[128,512]{1,0} all-gather(%param)",
        "%all-gather-start = (f32[16,512]{1,0}, f32[128,512]{1,0}) all-gather-start(%param)",
    ).replace(
        "  %copy.1 =",
        "  %all-gather = f32[128,512]{1,0} all-gather-done(%all-gather-start)\n  %copy.1 =",
    )
    ops = tr.hlo_schedule(text)
    start = next(op for op in ops if op.opcode == "all-gather-start")
    assert start.collective == "all-gather" and start.arrays[-1] == ("f32", (128, 512))
    done = next(op for op in ops if op.opcode == "all-gather-done")
    assert done.collective is None
    assert [r.name for r in tr.readers_of(ops, start)] == ["dot.2", "dot.3", "dot.5"]


def test_hlo_schedule_of_a_compiled_fsdp_step_keeps_every_gathered_kernel():
    from helpers.measuring.profile import compile_step

    ops = tr.hlo_schedule(compile_step("fsdp", "tiny").compiled)
    gathers = [op for op in ops if op.collective == "all-gather"]
    assert len(gathers) == 5  # the four block kernels and the head's
    for g in gathers:  # read in the forward pass and again in the backward pass
        passes = {"transpose(" in r.op_name for r in tr.readers_of(ops, g)}
        assert passes == {False, True}, g.text


def test_hlo_schedule_refuses_what_is_not_a_compiled_step():
    with pytest.raises(ValueError, match="no ENTRY computation"):
        tr.hlo_schedule("module @jit_f { func.func public @main() }")
    with pytest.raises(ValueError, match="hlo_schedule: compiled must be"):
        tr.hlo_schedule(42)
