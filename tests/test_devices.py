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
