"""Tests of helpers.measuring.topology: the real TPU compiler's program, compiled on this CPU.

CI's pinned entry installs libtpu (``.ci/run``), so these run there; an entry without it
skips them with the reason, except where REQUIRE_TPU_COMPILER=1 (the pinned entry), which
makes a missing libtpu fail instead.
"""

import os

import pytest

from helpers import use_simulated_devices

use_simulated_devices(8, quiet=True)

from helpers import (  # noqa: E402
    format_programs,
    hlo_schedule,
    make_mesh,
    program_summary,
    recorded_program,
    tpu_compiler_available,
    tpu_devices,
    tpu_out_of_memory,
)
from helpers.measuring.profile import compile_step  # noqa: E402

needs_libtpu = pytest.mark.skipif(
    not tpu_compiler_available() and os.environ.get("REQUIRE_TPU_COMPILER") != "1",
    reason="libtpu is not installed (CI's pinned entry installs it)",
)


@pytest.mark.parametrize("bad", ["v5e", "2x4", "tpu:2x4", "v5e:2", "", 8, None])
def test_a_topology_that_is_not_a_slice_name_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="topology="):
        tpu_devices(bad)


@needs_libtpu
def test_slices_have_the_chips_their_names_say():
    assert [len(tpu_devices(t)) for t in ("v5e:1x1", "v5e:2x4", "v5p:2x2x2", "v5e:16x16")] == [
        1, 8, 8, 256,
    ]  # fmt: skip
    assert tpu_devices("v5e:2x4")[0].device_kind == "TPU v5 lite"
    assert tpu_devices("v5p:2x2x2")[0].device_kind == "TPU v5"
    with pytest.raises(ValueError, match="libtpu does not know topology='v5e:3x3'"):
        tpu_devices("v5e:3x3")


@needs_libtpu
def test_fsdp_on_eight_tpu_chips_is_the_textbooks_where_the_cpus_is_not():
    """The same FSDP step, two compilers. XLA:TPU reduce-scatters the split gradients (its
    fused all-reduce-scatter), gathers bf16 copies of the kernels and gathers them again
    in the backward pass; XLA:CPU all-reduces every gradient and gathers each kernel once,
    in f32, for both passes."""
    chips = compile_step("fsdp", "tiny", devices=tpu_devices("v5e:2x4"))
    cpus = compile_step("fsdp", "tiny")
    tpu, cpu = program_summary(chips.compiled), program_summary(cpus.compiled)
    t, c = tpu["collectives"], cpu["collectives"]
    assert "reduce-scatter" in t and "reduce-scatter" not in c
    assert t["reduce-scatter"]["ops"]["backward"] >= 1 and t["reduce-scatter"]["dtypes"] == ["f32"]
    # what the CPU all-gathers once is what the TPU reduce-scatters: the split kernels
    assert t["reduce-scatter"]["bytes"] == c["all-gather"]["bytes"]
    assert c["all-gather"]["ops"]["backward"] == 0 and c["all-gather"]["dtypes"] == ["f32"]
    assert t["all-gather"]["ops"]["backward"] > 0 and t["all-gather"]["dtypes"] == ["bf16"]
    assert tpu["async"] > 0 and cpu["async"] == 0
    assert t["all-reduce"]["bytes"] < c["all-reduce"]["bytes"] / 50  # only the unsplit arrays
    table = format_programs({"XLA:CPU": cpus.compiled, "XLA:TPU": chips.compiled})
    assert "reduce-scatter" in table and "bf16" in table and "temporaries" in table
    assert hlo_schedule(chips.compiled)  # a scheduled module, read like the CPU's


def test_format_programs_leaves_the_memory_rows_out_when_asked():
    tpu = recorded_program("fsdp, tiny preset, v5e:2x4")["summary"]
    with_memory, without = (
        format_programs({"TPU": tpu}),
        format_programs({"TPU": tpu}, memory=False),
    )
    assert "arguments" in with_memory and "temporaries" in with_memory
    assert "arguments" not in without and "temporaries" not in without
    assert without.splitlines()[:4] == with_memory.splitlines()[:4]  # the collectives stay


def test_program_summary_shows_one_readable_hlo_line_per_collective_and_says_what_other_is():
    """The line notebook 07 prints for each collective: the op, its types and its devices,
    without layouts or metadata; and the table's legend says that "elsewhere" also holds
    ops whose metadata names no pass (jax 0.12.1's FSDP all-gathers name a parameter)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = make_mesh((8,), ("data",))
    x = jax.device_put(jnp.ones((16, 4)), NamedSharding(mesh, P("data")))
    gather = jax.shard_map(
        lambda b: jax.lax.all_gather(b, "data", tiled=True), mesh=mesh, in_specs=P("data"),
        out_specs=P("data"),
    )  # fmt: skip
    compiled = jax.jit(gather).lower(x).compile()
    line = program_summary(compiled)["hlo"]["all-gather"]
    assert "f32[16,4] all-gather(" in line and "dimensions={0}" in line
    assert "metadata" not in line and "{1,0}" not in line and "channel_id" not in line
    assert "names no pass" in format_programs({"cpu": compiled})


def test_a_long_hlo_line_keeps_what_its_fusion_calls():
    """XLA:TPU's reduce-scatter is a fusion whose ``calls=%all-reduce-scatter`` ends a long
    line: the cut line keeps it, so notebook 07 can print what the fusion calls."""
    from helpers.measuring.topology import _trimmed

    operands = ", ".join(f"%get-tuple-element.{i}" for i in range(40))
    line = f"  %fusion.3 = (f32[8,8]) fusion({operands}), kind=kCustom, calls=%all-reduce-scatter.5"
    cut = _trimmed(line)
    assert cut.startswith("%fusion.3 = (f32[8,8]) fusion(%get-tuple-element.0")
    assert cut.endswith(" ... calls=%all-reduce-scatter.5") and len(cut) < len(line.strip())
    short = "%fusion.4 = f32[8] fusion(%p), kind=kLoop, calls=%fused_computation.2"
    assert _trimmed(short) == short
    assert _trimmed(f"%x = f32[8] add({operands})") == f"%x = f32[8] add({operands})"[:300]


@needs_libtpu
def test_a_program_too_big_for_the_chip_is_refused_with_what_it_needed():
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    chip = tpu_devices("v5e:1x1")
    mesh = make_mesh((1,), ("data",), devices=chip)
    big = jax.ShapeDtypeStruct((2**16, 2**16), jnp.float32, sharding=NamedSharding(mesh, P()))
    with pytest.raises(Exception) as caught:  # noqa: B017 - XLA's error class is not public
        jax.jit(lambda a: (a @ a + 1) @ a).lower(big).compile()
    need, have = tpu_out_of_memory(caught.value)
    assert need > have > 15 * 2**30 and np.isfinite(need)
    assert tpu_out_of_memory(ValueError("something else")) is None


@needs_libtpu
@pytest.mark.parametrize(
    ("topology", "key"), [("v5e:1x1", "tpu-v5e"), ("v5p:2x2x1", "tpu-v5p"), ("v6e:1x1", "tpu-v6e")]
)
def test_the_planners_tpu_hbm_is_what_the_compiler_says_is_available(topology, key):
    """helpers.planning.hardware's TPU bytes are the compiler's 'available HBM' on one chip
    (it prints two decimals of GiB), not Google's round 16/95/32 GB."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from helpers.planning.hardware import HARDWARE

    mesh = make_mesh((1,), ("data",), devices=tpu_devices(topology)[:1])
    x = jax.ShapeDtypeStruct((300_000,), jnp.float32, sharding=NamedSharding(mesh, P()))
    with pytest.raises(Exception) as caught:  # noqa: B017 - XLA's error class is not public
        jax.jit(lambda v: (jnp.sort(jnp.outer(v, v), axis=0)[::7] * 3).sum()).lower(x).compile()
    _, have = tpu_out_of_memory(caught.value)
    assert abs(have - HARDWARE[key].hbm_bytes) <= 0.005 * 2**30, (have, HARDWARE[key].hbm_bytes)


def test_libtpu_is_quieted_only_where_no_tpu_shows(monkeypatch):
    from helpers import compat

    for key in compat.NO_TPU_HERE:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("TPU_WORKER_ID", "0")  # a TPU host's runtime sets it: leave it be
    assert compat.quiet_libtpu_without_tpu() is False
    assert "TPU_ACCELERATOR_TYPE" not in os.environ
    monkeypatch.delenv("TPU_WORKER_ID")
    if tpu_compiler_available():
        assert compat.quiet_libtpu_without_tpu() is True
        assert os.environ["TPU_SKIP_MDS_QUERY"] == "1"
    else:
        assert compat.quiet_libtpu_without_tpu() is False


def test_the_pinned_libtpu_is_one_that_jax_tpu_accepts():
    from importlib.metadata import requires, version
    from pathlib import Path

    from packaging.requirements import Requirement

    from helpers import LIBTPU_PIN

    root = Path(__file__).resolve().parent.parent
    assert LIBTPU_PIN in (root / "requirements-tpu-compiler.txt").read_text().splitlines()
    pinned_jax = next(
        line.split("==")[1]
        for line in (root / "requirements.txt").read_text().splitlines()
        if line.startswith("jax==")
    )
    if version("jax") != pinned_jax:  # the oldest and newest entries run other jax versions
        pytest.skip(f"libtpu's pin is for the pinned jax {pinned_jax}; this is {version('jax')}")
    named = [Requirement(r) for r in requires("jax") or [] if r.startswith("libtpu")]
    assert named and all(r.marker.evaluate({"extra": "tpu"}) for r in named)
    assert all(r.specifier.contains(LIBTPU_PIN.split("==")[1]) for r in named), named


@needs_libtpu
def test_the_recorded_tpu_programs_are_what_the_compiler_gives_now():
    """The notebooks read helpers/measuring/tpu_programs.json where libtpu is missing: its
    small entries must still be what this libtpu compiles (.ci/record_tpu_programs.py)."""
    import importlib.util
    import json
    from pathlib import Path

    from helpers import TPU_PROGRAMS, recorded_program, tpu_program

    script = Path(__file__).resolve().parent.parent / ".ci" / "record_tpu_programs.py"
    spec = importlib.util.spec_from_file_location("record_tpu_programs", script)
    record = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(record)
    first = next(iter(TPU_PROGRAMS))  # the recording script's own entry, for one program
    assert recorded_program(first) == json.loads(json.dumps(record.small_entry(first)))
    for name in TPU_PROGRAMS:  # each compiled once (the compiles are most of CI's minutes here)
        summary, where = tpu_program(name)  # on CPU devices with libtpu: compiled here
        fresh = json.loads(json.dumps({"topology": TPU_PROGRAMS[name][1], "summary": summary}))
        assert recorded_program(name) == fresh, name
        assert "compiled here" in where
    with pytest.raises(ValueError, match="name='nothing' is not recorded"):
        recorded_program("nothing")


def test_the_environment_can_ask_for_the_recording_and_a_bad_value_is_named(monkeypatch):
    from helpers import tpu_program

    monkeypatch.setenv("HELPERS_TPU_PROGRAMS", "recorded")
    summary, where = tpu_program("dp, tiny preset, v5e:2x4")
    assert where.startswith("recorded by .ci/record_tpu_programs.py") and summary
    monkeypatch.setenv("HELPERS_TPU_PROGRAMS", "fresh")
    with pytest.raises(ValueError, match="HELPERS_TPU_PROGRAMS='fresh' must be 'recorded'"):
        tpu_program("dp, tiny preset, v5e:2x4")
