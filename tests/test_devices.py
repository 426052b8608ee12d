import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from helpers import make_mesh, mesh_shape_for, use_simulated_devices

ROOT = Path(__file__).resolve().parents[1]


def test_same_count_again_is_quiet(capsys):
    devices = use_simulated_devices(8)
    assert len(devices) == 8 and devices[0].platform == "cpu"
    assert capsys.readouterr().out == ""


def test_other_count_after_start_raises_clear_error():
    with pytest.raises(RuntimeError, match=r"n=4.*already started with 8 CPU.*Restart the kernel"):
        use_simulated_devices(4)


@pytest.mark.parametrize("bad", [0, -2])
def test_non_positive_count(bad):
    with pytest.raises(ValueError, match=f"n={bad} must be a positive device count"):
        use_simulated_devices(bad)


def test_env_count_not_a_number(monkeypatch):
    monkeypatch.setenv("NUM_DEVICES", "eight")
    with pytest.raises(ValueError, match="NUM_DEVICES='eight' is not a whole number"):
        use_simulated_devices()


def test_env_count_zero(monkeypatch):
    monkeypatch.setenv("NUM_DEVICES", "0")
    with pytest.raises(ValueError, match="NUM_DEVICES=0 must be a positive"):
        use_simulated_devices()


def test_fresh_process_gets_requested_count():
    code = (
        "from helpers import use_simulated_devices as u; d = u(); print('N', len(d), d[0].platform)"
    )
    env = {**os.environ, "NUM_DEVICES": "3", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "N 3 cpu" in out.stdout
    assert "running on 3 CPU device(s)" in out.stdout


def test_make_mesh_auto_axes_and_order():
    mesh = make_mesh((4, 2), ("data", "model"))
    assert dict(mesh.shape) == {"data": 4, "model": 2}
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)
    assert [d.id for d in mesh.devices.flat] == list(range(8))


def test_make_mesh_fill_and_subset():
    assert dict(make_mesh((-1, 2), ("data", "model")).shape) == {"data": 4, "model": 2}
    small = make_mesh((2,), ("data",))
    assert [d.id for d in small.devices.flat] == [0, 1]


def test_make_mesh_too_big_names_shape_and_count():
    with pytest.raises(
        ValueError,
        match=r"mesh shape \(4, 4\) with axes \('data', 'model'\) needs 16 devices, but only 8",
    ):
        make_mesh((4, 4), ("data", "model"))


def test_make_mesh_mismatched_names():
    with pytest.raises(ValueError, match="has 2 axes but names"):
        make_mesh((4, 2), ("data",))


@pytest.mark.parametrize(
    ("n", "axes", "expected"),
    [
        (8, 2, (4, 2)),
        (4, 2, (2, 2)),
        (2, 2, (2, 1)),
        (1, 2, (1, 1)),
        (8, 3, (2, 2, 2)),
        (8, 1, (8,)),
        (6, 2, (3, 2)),
    ],
)
def test_mesh_shape_for(n, axes, expected):
    assert mesh_shape_for(n, axes) == expected


def test_mesh_shape_for_prefer_last():
    assert mesh_shape_for(8, 2, prefer="last") == (2, 4)


def test_this_jaxlib_knows_the_series_cpu_collective_flags():
    from helpers.compat import CPU_COLLECTIVE_FLAGS, xla_knows_flag

    for name in CPU_COLLECTIVE_FLAGS:
        assert xla_knows_flag(name), name
    assert not xla_knows_flag("xla_cpu_a_flag_no_xla_has_ever_defined")


def test_patient_cpu_collectives_adds_its_flags_once_and_keeps_yours(monkeypatch):
    from helpers.compat import CPU_COLLECTIVE_FLAGS, patient_cpu_collectives

    warn, terminate = CPU_COLLECTIVE_FLAGS
    monkeypatch.setenv("XLA_FLAGS", f"--xla_dump_to=/tmp/x --{terminate}=7")
    flags = patient_cpu_collectives()
    assert flags.split() == ["--xla_dump_to=/tmp/x", f"--{terminate}=7", f"--{warn}=120"]
    assert patient_cpu_collectives() == flags  # a second call adds nothing
    monkeypatch.delenv("XLA_FLAGS")
    assert patient_cpu_collectives().split() == [f"--{warn}=120", f"--{terminate}=600"]


# --- issue 38: the AVX2 cap for jaxlib 0.8.x-0.10.1 on AVX-512 CPUs -------------------------

ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu sse sse2 avx avx2 avx512f avx512dq avx512_bf16 avx512vl
"""
NO_AVX512 = "model name\t: Intel(R) Core(TM) i7-8700\nflags\t\t: fpu sse avx avx2 fma\n"


def test_the_deadlock_range_is_jaxlib_0_8_0_to_0_10_1_on_avx512_only():
    from helpers.compat import avx512_deadlock_risk, cpu_flags

    avx512, plain = cpu_flags(ZEN4), cpu_flags(NO_AVX512)
    assert "avx512f" in avx512 and "avx512f" not in plain
    for version in ("0.8.0", "0.8.1", "0.9.0", "0.10.1", "0.10.1.dev20260101"):
        assert avx512_deadlock_risk(version, avx512), version
        assert not avx512_deadlock_risk(version, plain), version
    for version in ("0.7.2", "0.10.2", "0.11.0", "0.12.0.1", "1.0.0"):
        assert not avx512_deadlock_risk(version, avx512), version
    assert not avx512_deadlock_risk("0.8.0", set())  # no /proc/cpuinfo (macOS): no cap


def test_cpu_description_names_the_model_and_its_avx512_flags():
    from helpers.compat import cpu_description

    assert cpu_description(ZEN4) == (
        "AMD EPYC 9R14 96-Core Processor (avx512_bf16, avx512dq, avx512f, avx512vl)"
    )
    assert cpu_description(NO_AVX512) == "Intel(R) Core(TM) i7-8700 (no AVX-512)"
    assert cpu_description("") == "unknown CPU (no AVX-512)"


def _cap(monkeypatch, risk: bool, knows: bool = True) -> str:
    from helpers import compat

    monkeypatch.setattr(compat, "avx512_deadlock_risk", lambda: risk)
    monkeypatch.setattr(compat, "xla_knows_flag", lambda name: knows)
    return compat.cap_cpu_isa()


def test_the_cap_is_added_only_where_needed_and_known_and_never_over_yours(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
    assert _cap(monkeypatch, risk=False) == "--xla_dump_to=/tmp/x"
    assert _cap(monkeypatch, risk=True, knows=False) == "--xla_dump_to=/tmp/x"
    assert _cap(monkeypatch, risk=True) == "--xla_dump_to=/tmp/x --xla_cpu_max_isa=AVX2"
    assert _cap(monkeypatch, risk=True) == "--xla_dump_to=/tmp/x --xla_cpu_max_isa=AVX2"  # once
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_max_isa=AVX512")  # yours win
    assert _cap(monkeypatch, risk=True) == "--xla_cpu_max_isa=AVX512"
    monkeypatch.delenv("XLA_FLAGS")
    assert _cap(monkeypatch, risk=True) == "--xla_cpu_max_isa=AVX2"


def test_every_supported_jaxlib_knows_the_cap_flag():
    """jaxlib 0.8.0 (the oldest supported) and the pinned one both define it; a jaxlib that
    did not would simply not get it (``cap_cpu_isa`` checks)."""
    from helpers.compat import CPU_ISA_CAP, xla_knows_flag

    assert xla_knows_flag(CPU_ISA_CAP[0])


def _flags_after(call: str, xla_flags: str | None = None) -> str:
    """``$XLA_FLAGS`` in a fresh process after ``call`` (a use_simulated_devices call)."""
    code = f"import os\nfrom helpers import use_simulated_devices\n{call}\nprint(os.environ['XLA_FLAGS'])\n"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if xla_flags is not None:
        env["XLA_FLAGS"] = xla_flags
    env["PYTHONPATH"] = str(ROOT)
    env.pop("HELPERS_REAL_DEVICES", None)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_process_started_by_the_series_on_an_affected_pair_gets_the_cap():
    """use_simulated_devices applies cpu_backend_flags before the backend starts."""
    from helpers.compat import avx512_deadlock_risk

    flags = _flags_after("use_simulated_devices(3, quiet=True)")
    assert ("--xla_cpu_max_isa=AVX2" in flags) == avx512_deadlock_risk(), flags


def test_simulated_devices_compile_fast_and_real_or_auto_ones_keep_xlas_level():
    """FAST_CPU_COMPILE on the simulated devices only: "auto" (notebook 04, which times
    steps) keeps XLA's default, and a level of your own wins."""
    from helpers.compat import FAST_CPU_COMPILE, xla_knows_flag

    flag = "--{}={}".format(*FAST_CPU_COMPILE)
    assert xla_knows_flag(FAST_CPU_COMPILE[0])
    assert flag in _flags_after("use_simulated_devices(2, quiet=True)").split()
    assert "optimization_level" not in _flags_after(
        "use_simulated_devices(2, real_accelerators='auto', quiet=True)"
    )
    mine = _flags_after(
        "use_simulated_devices(2, quiet=True)", "--xla_backend_optimization_level=2"
    )
    assert "--xla_backend_optimization_level=2" in mine and flag not in mine


def test_remat_keeps_gathers_on_the_jaxlibs_the_notebooks_describe():
    """Notebooks 03, 04 and 08 assert that unrolled remat keeps both gathers only there."""
    from helpers.compat import remat_keeps_gathers

    for version in ("0.8.0", "0.9.1", "0.10.2", "0.10.9"):
        assert remat_keeps_gathers(version), version
    for version in ("0.7.2", "0.11.0", "0.12.0.1"):
        assert not remat_keeps_gathers(version), version
