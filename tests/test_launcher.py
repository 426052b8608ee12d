"""Tests for ``helpers.cluster.launcher``, on plain Python processes (no JAX job): it streams each
process's lines with its label, reports how each ended, kills a process on purpose after a
given line, stops the others after a failure, and ends every process it started (and what
those started) by its pid, within its timeout. Real JAX jobs: ``test_multi_process.py``.
"""

from __future__ import annotations

import signal
import socket
import sys
import time

import numpy as np
import pytest

from helpers.cluster import launcher
from helpers.cluster.launcher import still_alive

PY = sys.executable


def test_still_alive_waits_for_processes_to_end():
    import subprocess

    proc = subprocess.Popen([PY, "-c", "import time; time.sleep(0.5)"])
    try:
        assert still_alive([proc.pid], wait_s=0) == [proc.pid]
        proc.wait(timeout=30)
        assert still_alive([proc.pid], wait_s=5) == []
    finally:
        proc.kill()
        proc.wait()


def test_free_loopback_port_can_be_bound_on_loopback():
    port = launcher.free_loopback_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))


def test_loopback_sockets_work_where_a_listener_takes_a_connection(monkeypatch):
    monkeypatch.delenv("HELPERS_ASSUME_NO_SOCKETS", raising=False)
    ok, why = launcher.loopback_sockets_work()
    assert ok is True and why == "TCP sockets work on 127.0.0.1: a listener there took a connection"


def test_loopback_sockets_work_is_false_where_tcp_sockets_are_refused(monkeypatch):
    """As on a sandbox that refuses every TCP socket: ``socket()`` fails with errno 97."""
    monkeypatch.delenv("HELPERS_ASSUME_NO_SOCKETS", raising=False)

    def refused(*args, **kwargs):
        raise OSError(97, "Address family not supported by protocol")

    monkeypatch.setattr(socket, "socket", refused)
    ok, why = launcher.loopback_sockets_work()
    assert ok is False
    assert why == (
        "this machine refuses TCP sockets on 127.0.0.1 "
        "([Errno 97] Address family not supported by protocol)"
    )


def test_loopback_sockets_work_is_false_where_the_listener_is_unreachable(monkeypatch):
    """A socket opens and binds, but nothing connects to it (a network namespace with its
    loopback interface down)."""
    monkeypatch.delenv("HELPERS_ASSUME_NO_SOCKETS", raising=False)

    def unreachable(*args, **kwargs):
        raise OSError(101, "Network is unreachable")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    ok, why = launcher.loopback_sockets_work()
    assert ok is False and why.endswith("([Errno 101] Network is unreachable)")


def test_loopback_sockets_work_is_false_without_trying_when_told_to_assume_so(monkeypatch):
    def touched(*args, **kwargs):
        raise AssertionError("no socket may be opened")

    monkeypatch.setattr(socket, "socket", touched)
    monkeypatch.setenv("HELPERS_ASSUME_NO_SOCKETS", "1")
    ok, why = launcher.loopback_sockets_work()
    assert ok is False and why.startswith("HELPERS_ASSUME_NO_SOCKETS=1")
    monkeypatch.setenv("HELPERS_ASSUME_NO_SOCKETS", "0")  # only "1" means it: "0" tries
    with pytest.raises(AssertionError, match="no socket may be opened"):
        launcher.loopback_sockets_work()
    from helpers import loopback_sockets_work

    assert loopback_sockets_work is launcher.loopback_sockets_work


def test_local_env_is_cpu_unbuffered_without_proxies(monkeypatch):
    monkeypatch.setenv("https_proxy", "http://proxy.invalid:1")
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
    env = launcher.local_env({"EXTRA": "1"})
    assert "https_proxy" not in env and env["EXTRA"] == "1"
    assert env["JAX_PLATFORMS"] == "cpu" and env["PYTHONUNBUFFERED"] == "1"
    assert env["XLA_FLAGS"] == "--xla_dump_to=/tmp/x --xla_backend_optimization_level=0"


def test_script_commands():
    assert launcher.script_command("--steps", "2") == [
        PY,
        "-m",
        "helpers.multiprocess",
        "--steps",
        "2",
    ]
    assert launcher.single_command(4, ["--steps", "1"])[3:] == [
        "--num-processes", "1", "--simulated-devices", "4", "--steps", "1",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="num_processes=0"):
        launcher.launch_local(0, 4)


def test_launch_streams_labelled_lines_and_reports_exit_codes(capsys):
    result = launcher.launch(
        [[PY, "-c", "print('a'); print('b')"], [PY, "-c", "import sys; print('c'); sys.exit(3)"]],
        timeout_s=60,
    )
    out = capsys.readouterr().out
    assert "[p0] a\n[p0] b\n" in out and "[p1] c\n" in out
    assert result.lines_of(0) == ["a", "b"] and result.lines_of(1) == ["c"]
    assert [p.returncode for p in result.processes] == [0, 3]
    assert not result.ok
    with pytest.raises(RuntimeError, match=r"returncode 3(.|\n)*last lines of p1:\n    c"):
        result.check()

    labelled = launcher.launch([[PY, "-c", "print('x')"]], timeout_s=60, labels=["8 devices"])
    assert "[8 devices] x\n" in capsys.readouterr().out and labelled.ok
    with pytest.raises(ValueError, match="2 labels for 1 commands"):
        launcher.launch([[PY, "-c", "pass"]], timeout_s=60, labels=["a", "b"])


def test_launch_kills_every_process_and_its_children_at_the_timeout():
    # The process starts a child of its own (same process group) and then hangs.
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    t0 = time.monotonic()
    result = launcher.launch([[PY, "-c", code]], timeout_s=3, echo=False)
    assert result.timed_out and time.monotonic() - t0 < 30
    assert result.processes[0].ended_by == "stopped by launcher"
    grandchild = int(result.lines_of(0)[0])
    assert still_alive([*result.pids, grandchild]) == []


def test_launch_stops_the_others_after_a_failure_and_the_grace_period():
    result = launcher.launch(
        [[PY, "-c", "import time; time.sleep(120)"], [PY, "-c", "import sys; sys.exit(1)"]],
        timeout_s=60, grace_s=1, echo=False,
    )  # fmt: skip
    assert not result.timed_out and result.elapsed_s < 30
    assert result.processes[1].ended_by == "exited" and result.processes[1].returncode == 1
    assert result.processes[0].ended_by == "stopped by launcher"
    assert still_alive(result.pids) == []


@pytest.mark.parametrize("when", [2, r"^saving 2$"], ids=["step", "regex"])
def test_launch_kills_a_process_after_the_line_it_waits_for(when):
    code = (
        "import time\nfor i in range(1, 2000):\n"
        "    print(f'step {i:>3}  loss 1.0', flush=True)\n"
        "    print(f'saving {i}', flush=True)\n    time.sleep(0.05)\n"
    )
    result = launcher.launch([[PY, "-c", code]], timeout_s=60, kill=(0, when), echo=False)
    p = result.processes[0]
    assert result.killed == 0 and p.ended_by == "killed on purpose"
    assert p.returncode == -signal.SIGKILL
    seen = "step   2  loss 1.0" if when == 2 else "saving 2"
    assert seen in p.lines and len(p.lines) < 100
    assert still_alive(result.pids) == []


def test_kill_needs_a_step_or_a_pattern():
    with pytest.raises(ValueError, match="when=1.5"):
        launcher.launch([[PY, "-c", "pass"]], timeout_s=60, kill=(0, 1.5))  # type: ignore[arg-type]


def test_load_results_splits_the_state_and_its_parameters(tmp_path):
    path = tmp_path / "out.npz"
    np.savez(path, losses=np.array([1.0, 0.5]), **{"state/params/w": np.ones(2),
             "state/opt_state/0/mu/w": np.zeros(2)})  # fmt: skip
    got = launcher.load_results(path)
    assert sorted(got["state"]) == ["opt_state/0/mu/w", "params/w"]
    assert list(got["params"]) == ["w"] and got["losses"].tolist() == [1.0, 0.5]
    assert got["shard_shapes"] == {}


def test_load_results_reads_the_shard_shapes_apart_from_the_rest(tmp_path):
    path = tmp_path / "out.npz"
    np.savez(path, **{"shard/w": np.array([8, 256]), "state/params/w": np.ones((64, 256))})
    got = launcher.load_results(path)
    assert got["shard_shapes"] == {"w": (8, 256)} and "shard/w" not in got
    assert got["params"]["w"].shape == (64, 256)


def test_a_dying_process_prints_its_exception_not_its_traceback(capsys):
    script = (
        "import sys\n"
        "print('step 1 done', flush=True)\n"
        "sys.stderr.write('*** Check failure stack trace: ***\\n    @     0x7f00 abort\\n"
        "    @     0x7f01 raise\\n')\n"
        "def f():\n    raise RuntimeError('Gloo AllGather failed: Connection closed by peer')\n"
        "f()\n"
    )
    result = launcher.launch([[sys.executable, "-c", script]], timeout_s=60)
    out = capsys.readouterr().out
    shown = [line for line in out.splitlines() if line.startswith("[p0]")]
    assert "[p0] step 1 done" in shown
    assert any(
        line.startswith("[p0] RuntimeError: Gloo AllGather failed") and "traceback folded" in line
        for line in shown
    )
    assert "[p0] (3 lines of a C++ stack trace folded)" in shown
    assert "Traceback (most recent call last)" not in out and "0x7f00" not in out
    # The result keeps every line, for tests and for a reader who wants them.
    assert "Traceback (most recent call last):" in result.lines_of(0)
    assert any("0x7f00" in line for line in result.lines_of(0))


def test_folder_keeps_ordinary_output_and_folds_chained_tracebacks():
    folder = launcher._Folder()
    lines = [
        "loss 1.0",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "KeyError: 'a'",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "x.py", line 3, in <module>',
        "ValueError: b",
        "",
        "RPC: the rest of its message",
        "done",
    ]
    shown = [s for line in lines for s in folder.feed(line)] + folder.flush()
    assert shown[0] == "loss 1.0"
    assert shown[1].startswith("KeyError: 'a'")
    assert shown[2].startswith("ValueError: b") and "folded" in shown[2]
    assert shown[3:] == ["RPC: the rest of its message", "done"]  # no blank line echoed
