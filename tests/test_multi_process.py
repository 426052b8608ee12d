"""Tests for ``helpers.multiprocess``: the launcher ends every process it starts, and a real
two-process JAX job (gloo on loopback) trains what one process trains, starts the same way
under a SLURM environment, and stops with a clear error when one of its processes dies.

The real jobs take a while on a 2-core machine (each process imports JAX and compiles), so
they are sized small: 2 processes x 4 simulated devices, 2 steps. Every launch has its own
timeout; nothing here can hang the suite.
"""

from __future__ import annotations

import signal
import socket
import sys
import time
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from helpers import make_mesh
from helpers import multiprocess as mp

PY = sys.executable
JOB_TIMEOUT_S = 300  # per launch of real JAX processes, generous for a busy machine
HEARTBEAT_S = 5
STEPS = 2
DEATH_SIGNS = (
    "detected fatal errors",
    "heartbeat timeout",
    "Connection reset by peer",
    "Connection closed by peer",
)


def _still_alive(pids: list[int], wait_s: float = 5.0) -> list[int]:
    """The pids that are still alive after up to ``wait_s`` (orphans take a moment to be reaped)."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = [p for p in pids if mp.pid_alive(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


# ---------------------------------------------------------------------------
# Small pieces, no JAX job
# ---------------------------------------------------------------------------


def test_free_loopback_port_can_be_bound_on_loopback():
    port = mp.free_loopback_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))


@pytest.mark.parametrize(
    ("address", "expected"),
    [("127.0.0.1:1234", True), ("localhost:99", True), ("[::1]:5", True), ("10.0.0.1:1234", False),
     ("node001:61440", False), (None, False)],
)  # fmt: skip
def test_is_loopback(address, expected):
    assert mp.is_loopback(address) is expected


def test_connect_leaves_detection_to_jax_when_no_arguments_are_given(monkeypatch):
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **k: calls.append((a, k)))

    mp.connect(mp.parse_args([]))  # what `srun python -m helpers.multiprocess` does
    assert calls == [((None, None, None), {"initialization_timeout": 300})]

    calls.clear()
    mp.connect(mp.parse_args(["--num-processes", "1"]))  # one process: no distributed runtime
    assert calls == []

    mp.connect(mp.parse_args(["--coordinator", "10.0.0.1:1234", "--num-processes", "2",
                              "--process-id", "1", "--heartbeat-timeout", "7"]))  # fmt: skip
    assert calls == [
        (("10.0.0.1:1234", 2, 1), {"initialization_timeout": 300, "heartbeat_timeout_seconds": 7})
    ]

    calls.clear()
    mp.connect(mp.parse_args(["--coordinator", "127.0.0.1:4321", "--num-processes", "2",
                              "--process-id", "0"]))  # fmt: skip
    assert calls[0][1]["coordinator_bind_address"] == "127.0.0.1:4321"  # loopback only


def test_process_rows_of_a_single_process_is_the_whole_batch():
    mesh = make_mesh((8, 1), ("data", "model"))
    assert mp.process_rows(NamedSharding(mesh, P("data")), (32, 8, 64)) == slice(0, 32)


def test_process_rows_refuses_rows_that_are_not_contiguous():
    blocks = {0: (slice(0, 4),), 1: (slice(8, 12),)}
    fake = SimpleNamespace(addressable_devices_indices_map=lambda shape: blocks)
    with pytest.raises(ValueError, match="contiguous"):
        mp.process_rows(fake, (16,))


# ---------------------------------------------------------------------------
# The launcher, on plain Python processes
# ---------------------------------------------------------------------------


def test_launch_streams_prefixed_lines_and_reports_exit_codes(capsys):
    result = mp.launch(
        [[PY, "-c", "print('a'); print('b')"], [PY, "-c", "import sys; print('c'); sys.exit(3)"]],
        timeout_s=60,
    )
    out = capsys.readouterr().out
    assert "[p0] a\n[p0] b\n" in out and "[p1] c\n" in out
    assert result.lines_of(0) == ["a", "b"] and result.lines_of(1) == ["c"]
    assert [p.returncode for p in result.processes] == [0, 3]
    assert not result.ok
    with pytest.raises(RuntimeError, match="returncode 3"):
        result.check()


def test_launch_kills_every_process_and_its_children_at_the_timeout():
    # The process starts a child of its own (same process group) and then hangs.
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    t0 = time.monotonic()
    result = mp.launch([[PY, "-c", code]], timeout_s=3, echo=False)
    assert result.timed_out and time.monotonic() - t0 < 30
    assert result.processes[0].ended_by == "stopped by launcher"
    grandchild = int(result.lines_of(0)[0])
    assert _still_alive([*result.pids, grandchild]) == []


def test_launch_stops_the_others_after_a_failure_and_the_grace_period():
    result = mp.launch(
        [[PY, "-c", "import time; time.sleep(120)"], [PY, "-c", "import sys; sys.exit(1)"]],
        timeout_s=60, grace_s=1, echo=False,
    )  # fmt: skip
    assert not result.timed_out and result.elapsed_s < 30
    assert result.processes[1].ended_by == "exited" and result.processes[1].returncode == 1
    assert result.processes[0].ended_by == "stopped by launcher"
    assert _still_alive(result.pids) == []


def test_launch_kills_a_process_after_the_step_it_reports():
    code = "import time\nfor i in range(1, 2000):\n    print(f'step {i:>3}  loss 1.0', flush=True)\n    time.sleep(0.05)\n"
    result = mp.launch([[PY, "-c", code]], timeout_s=60, kill=(0, 2), echo=False)
    p = result.processes[0]
    assert result.killed == 0 and p.ended_by == "killed on purpose"
    assert p.returncode == -signal.SIGKILL
    assert "step   2  loss 1.0" in p.lines and len(p.lines) < 100
    assert _still_alive(result.pids) == []


# ---------------------------------------------------------------------------
# Real JAX jobs
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One process with all 8 simulated devices: what the multi-process runs must match."""
    out = str(tmp_path_factory.mktemp("reference") / "reference.npz")
    run = mp.run_reference(8, steps=STEPS, out=out, timeout_s=JOB_TIMEOUT_S, echo=False).check()
    assert _still_alive(run.pids) == []
    return mp.load_results(out)


def _assert_same_training(result: dict, reference: dict) -> None:
    np.testing.assert_allclose(result["losses"], reference["losses"], rtol=1e-5, atol=1e-5)
    assert result["params"].keys() == reference["params"].keys() and len(result["params"]) == 16
    for k, v in result["params"].items():
        np.testing.assert_allclose(v, reference["params"][k], rtol=1e-5, atol=1e-5, err_msg=k)


def test_two_processes_train_what_one_process_trains(reference, tmp_path):
    out = str(tmp_path / "multi.npz")
    run = mp.launch_local(2, 4, steps=STEPS, out=out, timeout_s=JOB_TIMEOUT_S, echo=False).check()
    assert _still_alive(run.pids) == []

    # Each process loads its own half of every batch, and both see the same losses.
    assert any("loads rows 0:16 of each global batch of 32" in line for line in run.lines_of(0))
    assert any("loads rows 16:32 of each global batch of 32" in line for line in run.lines_of(1))
    steps = [[line for line in run.lines_of(i) if line.startswith("step")] for i in (0, 1)]
    assert len(steps[0]) == STEPS and steps[0] == steps[1]

    result = mp.load_results(out)
    assert list(result["mesh_process_index"]) == [0, 0, 0, 0, 1, 1, 1, 1]
    _assert_same_training(result, reference)


def test_srun_style_launch_detects_the_job_from_slurm_variables(reference, tmp_path):
    # What `srun python -m helpers.multiprocess` sees: no --coordinator/--num-processes/
    # --process-id, only SLURM's variables. JAX derives the coordinator's port from the job
    # id (61440 + id % 4096); pick a job id whose port is free, and keep it on loopback.
    for job_id in range(4096):
        port = 61440 + job_id
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", port))
            break
        except OSError:
            continue
    out = str(tmp_path / "srun.npz")
    commands = [
        ["env", f"SLURM_JOB_ID={job_id}", "SLURM_STEP_NODELIST=127.0.0.1", "SLURM_NTASKS=2",
         f"SLURM_PROCID={i}", f"SLURM_LOCALID={i}", f"JAX_COORDINATOR_BIND_ADDRESS=127.0.0.1:{port}",
         *mp.script_command("--simulated-devices", "4", "--steps", str(STEPS), "--out", out,
                            "--heartbeat-timeout", str(HEARTBEAT_S), "--init-timeout", "120")]
        for i in (0, 1)
    ]  # fmt: skip
    run = mp.launch(commands, timeout_s=JOB_TIMEOUT_S, echo=False, env=mp.local_env()).check()
    assert _still_alive(run.pids) == []
    assert any(line.startswith("process 1 of 2:") for line in run.lines_of(1))
    _assert_same_training(mp.load_results(out), reference)


def test_a_dead_process_stops_the_others_within_a_bounded_time():
    run = mp.launch_local(2, 4, steps=300, kill=(1, 2), heartbeat_timeout_s=HEARTBEAT_S,
                          timeout_s=JOB_TIMEOUT_S, echo=False)  # fmt: skip
    assert run.killed == 1 and not run.timed_out
    killed, survivor = run.processes[1], run.processes[0]
    assert killed.ended_by == "killed on purpose" and killed.returncode == -signal.SIGKILL
    # The survivor was stopped by JAX itself (not by the launcher), with an error that says why.
    assert survivor.ended_by == "exited" and survivor.returncode != 0, survivor.status
    assert survivor.ended_at_s - run.killed_at_s < 3 * HEARTBEAT_S + 10
    said_why = any(sign in line for line in survivor.lines for sign in DEATH_SIGNS)
    assert said_why, survivor.lines[-20:]
    assert _still_alive(run.pids) == []
