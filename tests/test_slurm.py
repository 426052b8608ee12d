"""Notebook 05's job on a real Slurm (issue 42), and ``helpers.cluster.slurm``'s pieces.

First the pieces that need no Slurm: what the helpers parse and say when Slurm is missing or
disabled, the one ``train.sbatch`` the notebook prints, the committed record of the last run.

Then three real jobs, where a Slurm controller answers (``.ci/slurm-up`` starts one on this
machine; ``.ci/run`` always does, and sets ``SLURM_TESTS=required`` so that they fail rather
than skip). Each is ``train.sbatch`` submitted with only its counts changed (one node, two
tasks, no GPU) and the script's arguments after the file name (4 simulated CPU devices each):

- **submit**: the two tasks join one job through ``jax.distributed.initialize()`` with no
  arguments, at the coordinator port JAX derives from the job id, train what one process
  with 8 devices trains, and ``sacct`` reports the job COMPLETED;
- **kill**: task 1 is killed (SIGKILL) while both are in the save of step 4; ``srun
  --kill-on-bad-exit=1`` ends the step, the job FAILED, only step 2 is committed;
- **requeue**: ``scontrol requeue`` runs the job again; it resumes from step 2 and ends with
  bitwise the state of the uninterrupted job.

After each, no process of the job is left. Each job runs once per session, even with
pytest-xdist's workers. ``SLURM_RECORD=path`` makes them write what they ran and what Slurm
printed into that file: that is how ``helpers/cluster/slurm_record.json``, which the notebook
shows where no Slurm runs, is refreshed (README, "Slurm").
"""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import json
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from children import once_per_session

from helpers.cluster import launcher, slurm
from helpers.cluster.launcher import still_alive

ROOT = Path(__file__).resolve().parents[1]
STEPS, SAVE_EVERY, HOLD = 4, 2, 4  # 4 steps, saves after 2 and 4; the kill lands in save 4
JOB_TIMEOUT_S = 300  # per job, generous for a busy 2-core machine
ARGS = ["--simulated-devices", "4", "--steps", str(STEPS), "--save-every", str(SAVE_EVERY),
        "--checkpoint-dir", "checkpoints", "--out", "result.npz"]  # fmt: skip


# ---------------------------------------------------------------------------
# No Slurm needed
# ---------------------------------------------------------------------------


def _fake(tmp_path: Path, name: str, body: str) -> None:
    """A command ``name`` on ``tmp_path`` that runs the shell ``body``."""
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """Slurm's client commands as small shell scripts (first on PATH); returns their folder."""
    for name in ("sbatch", "sinfo", "squeue", "scontrol", "sacct"):
        _fake(tmp_path, name, "exit 0")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


def test_slurm_ready_says_why_not_when_its_commands_are_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it
    ready, why = slurm.slurm_ready()
    assert not ready and why == "Slurm's commands are not installed here (no `sbatch`)"


def test_slurm_ready_says_why_not_when_no_controller_answers(fake_slurm):
    _fake(
        fake_slurm, "sinfo", 'echo "sinfo: error: Unable to contact slurm controller" >&2; exit 1'
    )
    ready, why = slurm.slurm_ready()
    assert not ready
    assert why.startswith("no Slurm controller answers here: `sinfo --version` failed: ")
    assert why.endswith("Unable to contact slurm controller")


def test_slurm_ready_names_the_node_and_its_state(fake_slurm):
    _fake(fake_slurm, "sinfo",
          '[ "$1" = --version ] && echo "slurm-wlm 22.05.8" && exit 0; echo "localhost idle 2"')  # fmt: skip
    assert slurm.slurm_ready() == (
        True,
        "slurm-wlm 22.05.8 answers: node localhost is idle, 2 CPUs",
    )
    _fake(fake_slurm, "sinfo", '[ "$1" = --version ] && echo v && exit 0; echo "localhost down* 2"')
    assert slurm.slurm_ready()[0] is False


def test_sacct_reads_the_completion_log_where_accounting_is_disabled(fake_slurm):
    _fake(fake_slurm, "sacct", """case "$1" in
  --completion) echo "7 fsdp-mlp COMPLETED" ;;
  *) echo "Slurm accounting storage is disabled" >&2; exit 1 ;;
esac""")  # fmt: skip
    cmd, out = slurm.sacct(7, "JobID,JobName,State")
    assert cmd == "sacct --completion -j 7 -o JobID,JobName,State" and "COMPLETED" in out
    _fake(fake_slurm, "sacct", 'echo "sacct: error: Problem talking to the database" >&2; exit 1')
    with pytest.raises(slurm.SlurmError, match="Problem talking to the database"):
        slurm.sacct(7)  # any other failure is reported, not papered over


def test_job_info_reads_values_with_spaces_and_submit_job_returns_the_id(fake_slurm):
    _fake(fake_slurm, "scontrol",
          "echo 'JobId=12 JobName=fsdp-mlp JobState=RUNNING Reason=None Command=/x/train.sbatch "
          "--steps 4 --out r.npz WorkDir=/tmp/w StdOut=/tmp/w/fsdp-mlp-12.log'")  # fmt: skip
    info = slurm.job_info(12)
    assert info["JobState"] == "RUNNING" and info["StdOut"] == "/tmp/w/fsdp-mlp-12.log"
    assert info["Command"] == "/x/train.sbatch --steps 4 --out r.npz"
    _fake(fake_slurm, "sbatch", 'echo "4097;local"')
    assert slurm.submit_job("train.sbatch") == 4097
    _fake(fake_slurm, "sbatch", 'echo "sbatch: error: Invalid generic resource (gres) specification" >&2; exit 1')  # fmt: skip
    with pytest.raises(slurm.SlurmError, match=r"`sbatch --parsable train.sbatch` failed: .*gres"):
        slurm.submit_job("train.sbatch")


def test_wait_for_job_times_out_saying_where_the_job_is(fake_slurm):
    _fake(fake_slurm, "scontrol", "echo 'JobId=3 JobState=PENDING Reason=BeginTime'")
    with pytest.raises(TimeoutError, match=r"job 3 is PENDING \(BeginTime\) after 0 s"):
        slurm.wait_for_job(3, timeout_s=0.2, poll_s=0.05)


def test_job_task_pids_is_empty_while_the_node_has_not_started_the_job(fake_slurm):
    """The controller can call a job RUNNING a moment before its node starts it: ``scontrol
    listpids`` then fails with "does not exist on node" (a loaded CI machine, 2026-12-06)."""
    _fake(fake_slurm, "scontrol",
          'echo "PID JOBID STEPID LOCALID GLOBALID"; echo "JobId=133 does not exist on node '
          '(null)." >&2; exit 1')  # fmt: skip
    assert slurm.job_task_pids(133) == []
    _fake(fake_slurm, "scontrol", 'echo "scontrol: error: Invalid job id" >&2; exit 1')
    with pytest.raises(slurm.SlurmError, match="Invalid job id"):
        slurm.job_task_pids(133)  # any other failure is reported
    _fake(fake_slurm, "scontrol", 'echo "PID JOBID STEPID LOCALID GLOBALID"; echo "41 133 0 0 0"')
    assert slurm.job_task_pids(133) == [
        {"PID": "41", "JOBID": "133", "STEPID": "0", "LOCALID": "0", "GLOBALID": "0"}
    ]


def test_read_job_log_drops_gloos_chatter(tmp_path):
    log = tmp_path / "job.log"
    log.write_text("0: step   1  loss 3.1\n1: [Gloo] Rank 1 is connected to 7 peer ranks. \n0: \n"
                   "1: [Gloo] Rank\n0: 7\nsrun: error: localhost: task 1: Killed\n")  # fmt: skip
    assert slurm.read_job_log(log) == [
        "0: step   1  loss 3.1",
        "srun: error: localhost: task 1: Killed",
    ]


def test_the_recorded_logs_are_filtered_when_read():
    """The record of 2026-12-04 holds a fragment of gloo's line, ``0: 7``, that the filter of
    then let through; the notebook must not show it (nor any other chatter)."""
    raw = json.loads(slurm.RECORD.read_text())
    logs = {name: part["log"] for name, part in slurm.recorded_slurm_run().items()
            if isinstance(part, dict) and "log" in part}  # fmt: skip
    assert set(logs) == {"submit", "kill", "requeue"}
    for name, log in logs.items():
        assert not [ln for ln in log if slurm._is_chatter(ln)], name
        assert all(ln in raw[name]["log"] for ln in log), name  # it only drops lines
    assert "0: 7" not in logs["submit"]
    assert "0: step   1  loss 3.174721" in logs["submit"]


def _sbatch_options(text: str) -> dict[str, str]:
    return dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", text, re.M))


def test_train_sbatch_is_one_file_that_the_notebook_prints_and_only_its_counts_change():
    text = slurm.TRAIN_SBATCH.read_text()
    options = _sbatch_options(text)
    assert options["nodes"] == "2" and options["ntasks-per-node"] == "8"
    assert "srun --kill-on-bad-exit=1" in text and "python -m helpers.multiprocess" in text
    assert '"$@"' in text  # arguments after the file name reach the script
    # The notebook shows the file itself (TRAIN_SBATCH), never a copy of its lines.
    source = (ROOT / "notebooks" / "src" / "05_multi_process.md").read_text()
    assert "TRAIN_SBATCH.read_text()" in source and "#SBATCH" not in source
    # Submitting it here changes only the node, task and GPU counts.
    for option in slurm.LOCAL_COUNTS:
        name = option.removeprefix("--").split("=")[0]
        assert name in ("nodes", "ntasks-per-node", "gpus-per-node") and name in options
    # The script accepts what the tests pass after the file name.
    from helpers.cluster import multiprocess

    assert multiprocess.parse_args(["--hold-save", str(HOLD), *ARGS]).steps == STEPS


def test_the_committed_record_is_of_todays_train_sbatch():
    """A change to train.sbatch must come with a fresh record (README: "Slurm")."""
    record = slurm.recorded_slurm_run()
    digest = hashlib.sha256(slurm.TRAIN_SBATCH.read_bytes()).hexdigest()
    assert record["train_sbatch_sha256"] == digest, (
        "helpers/cluster/train.sbatch changed since helpers/cluster/slurm_record.json was "
        "recorded: refresh it (README, 'Slurm')"
    )
    assert record["slurm"].startswith("slurm") and set(record) >= {"submit", "kill", "requeue"}
    assert "COMPLETED" in record["submit"]["sacct"] and "FAILED" in record["kill"]["sacct"]
    assert any("task 1: Killed" in line for line in record["kill"]["log"])
    assert any("restored step 2" in line for line in record["requeue"]["log"])


def test_the_package_carries_the_sbatch_file_and_the_record():
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    shipped = config["package-data"]["helpers.cluster"]
    assert {slurm.TRAIN_SBATCH.name, slurm.RECORD.name} <= set(shipped)


def test_slurm_up_refuses_an_unknown_option_in_one_line():
    done = subprocess.run([str(ROOT / ".ci" / "slurm-up"), "--nodes", "3"], capture_output=True,
                          text=True, timeout=30, check=False)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "slurm-up: unknown option '--nodes' (options: --dir DIR, --no-install, -- COMMAND...)"
    ]


# ---------------------------------------------------------------------------
# Real jobs on a real Slurm, each run once per session
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slurm_up():
    ready, why = slurm.slurm_ready()
    if not ready:
        if os.environ.get("SLURM_TESTS") == "required":
            pytest.fail(f"SLURM_TESTS=required, but {why}")
        pytest.skip(f"{why}; `.ci/slurm-up -- pytest -n 0 tests/test_slurm.py` starts one here")
    return why


def _record(part: str, what: dict) -> None:
    """With ``SLURM_RECORD=path``, add ``what`` under ``part`` to that JSON file."""
    path = os.environ.get("SLURM_RECORD")
    if not path:
        return
    lock_path = (
        Path(tempfile.gettempdir())
        / f"slurm-record-{hashlib.sha256(path.encode()).hexdigest()[:12]}.lock"
    )
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = json.loads(Path(path).read_text()) if Path(path).exists() else {}
        record.update({
            "recorded_on": datetime.date.today().isoformat(),
            "by": "tests/test_slurm.py, on a one-node Slurm started by .ci/slurm-up",
            "slurm": subprocess.run(["sinfo", "--version"], capture_output=True, text=True,
                                    timeout=30, check=True).stdout.strip(),
            "train_sbatch_sha256": hashlib.sha256(slurm.TRAIN_SBATCH.read_bytes()).hexdigest(),
            part: what,
        })  # fmt: skip
        Path(path).write_text(json.dumps(record, indent=1) + "\n")
        fcntl.flock(lock, fcntl.LOCK_UN)


def _submit(directory: Path, extra: list[str]) -> tuple[int, str]:
    """``train.sbatch`` with only its counts changed, in ``directory``; (job id, the command)."""
    args = [*ARGS, *extra]
    job = slurm.submit_job(slurm.TRAIN_SBATCH, slurm.LOCAL_COUNTS, args, cwd=directory)
    return job, " ".join(["sbatch", *slurm.LOCAL_COUNTS, "train.sbatch", *args])


def _tasks_started(job: int, timeout_s: float) -> list[dict]:
    """``scontrol listpids`` once both tasks of step 0 run (the processes to check for later)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = slurm.job_info(job)
        if info["JobState"] in slurm.FINISHED:
            break
        if info["JobState"] == "RUNNING":
            rows = slurm.job_task_pids(job)
            if sum(r["STEPID"] == "0" and r["GLOBALID"] != "-" for r in rows) == 2:
                return rows
        time.sleep(0.2)
    raise AssertionError(f"job {job}'s two tasks were never seen running: {slurm.job_info(job)}")


def _wait_for_lines(job: int, path: Path, text: str, count: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().count(text) >= count:
            return
        if slurm.job_info(job)["JobState"] in slurm.FINISHED:
            break
        time.sleep(0.2)
    tail = "\n".join(slurm.read_job_log(path)[-10:]) if path.exists() else "(no log)"
    raise AssertionError(f"{path.name} never showed {count} x {text!r}; it ends:\n{tail}")


def _stepds(job: int) -> list[int]:
    """The pids of the job's ``slurmstepd: [JOB.STEP]`` processes (Slurm's own, per step)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "cmdline").read_bytes().startswith(
                f"slurmstepd: [{job}.".encode()
            ):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _ended(job: int, rows: list[dict], directory: Path, info: dict) -> dict:
    """What every test of a job reads: its fields, sacct, the log, what is still running.

    ``left_behind``: the job's processes (``scontrol listpids`` while it ran) and its
    ``slurmstepd`` processes still alive 10 s after Slurm says the job ended.
    """
    cmd, table = slurm.sacct(job)
    pids = [int(r["PID"]) for r in rows]
    alive = still_alive(pids, wait_s=10)
    deadline = time.monotonic() + 10
    while _stepds(job) and time.monotonic() < deadline:
        time.sleep(0.2)
    return {"job": job, "info": info, "sacct_command": cmd, "sacct": table,
            "log": slurm.read_job_log(Path(info["StdOut"])), "pids": pids,
            "left_behind": alive + _stepds(job), "workdir": str(directory)}  # fmt: skip


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One process with all 8 simulated devices (shared with tests/test_multi_process.py)."""

    def run(d: Path) -> dict:
        out = str(d / "reference.npz")
        launcher.launch_single(8, ["--steps", str(STEPS), "--out", out], timeout_s=JOB_TIMEOUT_S,
                               echo=False).check()  # fmt: skip
        return {}

    result = once_per_session(tmp_path_factory, "reference", run)
    ref = launcher.load_results(result["dir"] / "reference.npz")
    assert ref["steps"].tolist() == list(range(1, STEPS + 1)), "the shared reference trains 4 steps"
    return ref


@pytest.fixture(scope="module")
def submitted(slurm_up, tmp_path_factory):
    def run(d: Path) -> dict:
        job, command = _submit(d, [])
        queued = slurm.squeue(job)
        rows = _tasks_started(job, JOB_TIMEOUT_S)
        info = slurm.wait_for_job(job, JOB_TIMEOUT_S)
        result = {**_ended(job, rows, d, info), "command": command, "squeue": queued}
        _record(
            "submit", {k: result[k] for k in ("command", "squeue", "sacct_command", "sacct", "log")}
        )
        return result

    return once_per_session(tmp_path_factory, "slurm-submit", run)


@pytest.fixture(scope="module")
def killed(slurm_up, tmp_path_factory):
    """Task 1 killed (SIGKILL, from outside: a crashed process, not a lost node) inside the save of step 4."""

    def run(d: Path) -> dict:
        job, command = _submit(d, ["--hold-save", str(HOLD)])
        rows = _tasks_started(job, JOB_TIMEOUT_S)
        log = Path(slurm.job_info(job)["StdOut"])
        _wait_for_lines(job, log, f"started the save of step {HOLD}", 2, JOB_TIMEOUT_S)
        rows = slurm.job_task_pids(job)  # the same processes, listed again for the record
        task1 = next(int(r["PID"]) for r in rows if r["STEPID"] == "0" and r["GLOBALID"] == "1")
        os.kill(task1, signal.SIGKILL)
        killed_at = time.monotonic()
        info = slurm.wait_for_job(job, JOB_TIMEOUT_S)
        result = {**_ended(job, rows, d, info), "command": command, "task1": task1,
                  "ended_after_s": time.monotonic() - killed_at,
                  "listpids": [" ".join(f"{r[k]:<8}" for k in r).rstrip() for r in rows],
                  "head": " ".join(f"{k:<8}" for k in rows[0]).rstrip()}  # fmt: skip
        _record("kill", {**{k: result[k] for k in ("command", "head", "listpids", "task1",
                                                   "sacct_command", "sacct", "log")},
                         "ended_after_s": round(result["ended_after_s"], 1)})  # fmt: skip
        return result

    return once_per_session(tmp_path_factory, "slurm-kill", run)


@pytest.fixture(scope="module")
def requeued(killed, tmp_path_factory):
    """``scontrol requeue`` of the killed job: its second attempt."""

    def run(d: Path) -> dict:
        job = killed["job"]
        started = time.monotonic()
        slurm.requeue_job(job)
        queued = slurm.squeue(job)
        rows = _tasks_started(job, JOB_TIMEOUT_S)
        info = slurm.wait_for_job(job, JOB_TIMEOUT_S)
        result = {**_ended(job, rows, Path(killed["workdir"]), info), "squeue": queued,
                  "took_s": time.monotonic() - started}  # fmt: skip
        second = result["log"][result["log"].index(f"job {job}, attempt 2, nodes localhost") :]
        _record("requeue", {"command": f"scontrol requeue {job}", "squeue": queued,
                            "sacct_command": result["sacct_command"], "sacct": result["sacct"],
                            "log": second, "took_s": round(result["took_s"], 1)})  # fmt: skip
        return result

    return once_per_session(tmp_path_factory, "slurm-requeue", run)


def _step_losses(log: list[str], task: int) -> list[float]:
    return [float(m.group(1)) for line in log if (m := re.match(rf"{task}: step\s+\d+\s+loss (\S+)", line))]  # fmt: skip


def test_sbatch_runs_two_tasks_as_one_jax_job_that_trains_what_one_process_trains(
    submitted, reference
):
    job, log = submitted["job"], submitted["log"]
    assert submitted["info"]["JobState"] == "COMPLETED" and submitted["info"]["ExitCode"] == "0:0"
    assert re.search(rf"^{job}\s+fsdp-mlp\s+COMPLETED\s+0:0", submitted["sacct"], re.M)
    # jax.distributed.initialize() with no arguments: JAX read Slurm's environment, and took
    # the coordinator port 61440 + job id % 4096 (jax/_src/clusters/slurm_cluster.py).
    port = 61440 + job % 4096
    for task in (0, 1):
        assert f"{task}: jax: Connecting to JAX distributed service on localhost:{port}" in log
        assert f"{task}: jax: JAX distributed initialized with visible devices: {task}" in log
    assert f"0: jax: Starting JAX distributed service on [::]:{port}" in log
    assert sum("Connecting to JAX distributed service" in line for line in log) == 2  # once each
    assert any(line.startswith("0: process 0 of 2: ") and "loads rows 0:16" in line for line in log)
    assert any(
        line.startswith("1: process 1 of 2: ") and "loads rows 16:32" in line for line in log
    )
    assert _step_losses(log, 0) == _step_losses(log, 1) and len(_step_losses(log, 0)) == STEPS
    result = launcher.load_results(Path(submitted["workdir"]) / "result.npz")
    assert list(result["mesh_process_index"]) == [0, 0, 0, 0, 1, 1, 1, 1]
    np.testing.assert_allclose(result["losses"], reference["losses"], rtol=1e-5, atol=1e-5)
    for k, v in result["state"].items():
        np.testing.assert_allclose(v, reference["state"][k], rtol=1e-5, atol=1e-5, err_msg=k)
    assert submitted["left_behind"] == [] and len(submitted["pids"]) >= 2


def test_killing_one_task_ends_the_step_and_the_job_fails_with_the_last_commit_kept(killed):
    job, log = killed["job"], killed["log"]
    assert killed["info"]["JobState"] == "FAILED" and killed["info"]["Restarts"] == "0"
    assert re.search(rf"^{job}\s+fsdp-mlp\s+FAILED\s+\d+:\d+", killed["sacct"], re.M)
    assert "srun: error: localhost: task 1: Killed" in log  # srun saw it die ...
    assert any(f"STEP {job}.0 ON localhost CANCELLED" in line for line in log)  # ... ended the step
    assert not any("commits step 4" in line for line in log)
    assert killed["ended_after_s"] < 60  # KillWait=5 in .ci/slurm-up's slurm.conf
    names = sorted(p.name for p in (Path(killed["workdir"]) / "checkpoints").iterdir())
    assert names[0] == "2" and len(names) == 2 and names[1].startswith("4.orbax-checkpoint-tmp")
    assert killed["left_behind"] == [], "a process of the killed job is still running"


def test_a_requeued_job_resumes_from_the_last_commit_and_ends_as_if_never_killed(
    requeued, submitted
):
    job, log = requeued["job"], requeued["log"]
    assert requeued["info"]["JobState"] == "COMPLETED" and requeued["info"]["Restarts"] == "1"
    assert f"job {job}, attempt 2, nodes localhost" in log  # SLURM_RESTART_COUNT=1
    states = re.findall(rf"^{job}\s+fsdp-mlp\s+(\w+)", requeued["sacct"], re.M)
    assert states[0] == "FAILED" and states[-1] == "COMPLETED"
    second = log[log.index(f"job {job}, attempt 2, nodes localhost") :]
    for task in (0, 1):
        assert (
            f"{task}: process {task} restored step 2 onto mesh {{'data': 8, 'model': 1}}" in second
        )
    got = launcher.load_results(Path(requeued["workdir"]) / "result.npz")
    uninterrupted = launcher.load_results(Path(submitted["workdir"]) / "result.npz")
    assert int(got["restored_step"]) == 2 and got["steps"].tolist() == [3, 4]
    assert got["losses"].tolist() == uninterrupted["losses"][2:].tolist()  # bit for bit
    for k, v in got["state"].items():
        assert np.array_equal(v, uninterrupted["state"][k]), k
    names = sorted(p.name for p in (Path(requeued["workdir"]) / "checkpoints").iterdir())
    assert names == ["2", "4"]  # the killed save's debris is gone
    assert requeued["left_behind"] == []
