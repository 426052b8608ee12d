"""Submit notebook 05's job to Slurm, and read what Slurm says about it.

Slurm's own commands do the work (``sbatch``, ``squeue``, ``scontrol``, ``sacct``,
``scancel``); each runs with a timeout, and a failing one raises ``SlurmError`` with its
message. Nothing here starts a Slurm: ``.ci/slurm-up`` does that for the tests, and on a
cluster it is already running.

- ``slurm_ready()``: whether a Slurm controller answers here, and a sentence why (not).
- ``TRAIN_SBATCH``: the batch script the notebook prints and the tests submit;
  ``LOCAL_COUNTS``: the sbatch options that fit it to this machine.
- ``submit_job``, ``wait_for_job``, ``job_info``, ``requeue_job``, ``cancel_job``: a job's life.
- ``squeue``, ``sacct``, ``read_job_log``, ``job_task_pids``: what a learner looks at.
- ``RECORD``: what ``tests/test_slurm.py`` saw the last time it ran with ``SLURM_RECORD``
  set, for the notebook to show where no Slurm runs (``recorded_slurm_run``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "FINISHED",
    "LOCAL_COUNTS",
    "RECORD",
    "TRAIN_SBATCH",
    "SlurmError",
    "cancel_job",
    "job_environment",
    "job_info",
    "job_task_pids",
    "read_job_log",
    "recorded_slurm_run",
    "requeue_job",
    "sacct",
    "slurm_ready",
    "squeue",
    "submit_job",
    "wait_for_job",
]

TRAIN_SBATCH = Path(__file__).with_name("train.sbatch")
RECORD = Path(__file__).with_name("slurm_record.json")
#: The counts that make ``TRAIN_SBATCH`` a job of this machine: one node, two tasks, no GPU
#: (each task then gets simulated CPU devices: ``--simulated-devices`` after the file name).
LOCAL_COUNTS = ("--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=0")
#: The states of a job that has ended (``squeue``/``scontrol``'s JobState).
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "PREEMPTED", "BOOT_FAIL", "DEADLINE")  # fmt: skip
_CLIENTS = ("sbatch", "sinfo", "squeue", "scontrol", "sacct")


class SlurmError(RuntimeError):
    """A Slurm command failed; the message is the command and what it said."""


def _run(cmd: Sequence[str], timeout_s: float = 30, **kwargs: Any) -> str:
    """Run one Slurm command; its stdout, or ``SlurmError`` with its stderr."""
    try:
        done = subprocess.run(
            list(cmd), capture_output=True, text=True, timeout=timeout_s, check=False, **kwargs
        )
    except FileNotFoundError as err:
        raise SlurmError(f"`{cmd[0]}` is not installed here") from err
    except subprocess.TimeoutExpired as err:
        raise SlurmError(f"`{' '.join(cmd)}` did not answer within {timeout_s:.0f} s") from err
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise SlurmError(f"`{' '.join(cmd)}` failed: {said[-1] if said else done.returncode}")
    return done.stdout


def slurm_ready(timeout_s: float = 10) -> tuple[bool, str]:
    """Whether a Slurm controller answers here, with a sentence that says so, or why not."""
    missing = [c for c in _CLIENTS if shutil.which(c) is None]
    if missing:
        return False, f"Slurm's commands are not installed here (no `{missing[0]}`)"
    try:
        version = _run(["sinfo", "--version"], timeout_s).strip()
        nodes = _run(["sinfo", "-h", "-o", "%N %T %c"], timeout_s).split()
    except SlurmError as err:
        return False, f"no Slurm controller answers here: {err}"
    if len(nodes) < 3 or nodes[1].rstrip("*~#") in ("down", "drained", "fail"):
        return False, f"Slurm answers, but it has no node up ({' '.join(nodes) or 'no node'})"
    return True, f"{version} answers: node {nodes[0]} is {nodes[1]}, {nodes[2]} CPUs"


def job_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a simulated job submitted from here (``sbatch`` passes it on whole).

    This one's, on CPU (``launcher.local_env``: for simulated devices, not for GPUs), with
    this Python first on ``PATH`` (the job runs ``python``) and the folder holding
    ``helpers`` first on ``PYTHONPATH``.
    """
    from helpers.cluster.launcher import local_env

    env = local_env(extra)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def submit_job(
    script: str | os.PathLike[str],
    options: Sequence[str] = (),
    args: Sequence[str] = (),
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
) -> int:
    """``sbatch OPTIONS SCRIPT ARGS`` (in ``cwd``): the new job's id."""
    out = _run(["sbatch", "--parsable", *options, str(script), *args], cwd=cwd,
               env=job_environment() if env is None else env)  # fmt: skip
    return int(out.strip().split(";")[0])


def job_info(job_id: int) -> dict[str, str]:
    """``scontrol show job``'s fields (``JobState``, ``Restarts``, ``ExitCode``, ``StdOut``...).

    Slurm keeps a finished job for ``MinJobAge`` seconds (300 by default); after that it is
    gone from here, and only accounting (``sacct``) knows it.
    """
    text = _run(["scontrol", "show", "job", "-o", str(job_id)])
    return _fields(text)


def _fields(text: str) -> dict[str, str]:
    """``Key=Value Key2=Value two ...`` as a dict: a value runs until the next `` Key=``."""
    pairs = re.findall(r"(?:^|\s)([A-Za-z][\w:/]*)=(.*?)(?=\s[A-Za-z][\w:/]*=|\s*$)", text.strip())
    return dict(pairs)


def wait_for_job(
    job_id: int,
    timeout_s: float,
    states: Sequence[str] = FINISHED,
    poll_s: float = 0.5,
) -> dict[str, str]:
    """Wait until the job's state is one of ``states``; its ``job_info`` then.

    Raises:
      TimeoutError: it was not, ``timeout_s`` seconds later (the job is left as it is).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        info = job_info(job_id)
        if info.get("JobState") in states:
            return info
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"job {job_id} is {info.get('JobState')} ({info.get('Reason')}) after "
                f"{timeout_s:.0f} s, not {' or '.join(states)}"
            )
        time.sleep(poll_s)


def squeue(job_id: int) -> str:
    """What ``squeue -j JOB`` prints (nothing but its header once the job has left the queue)."""
    return _run(["squeue", "-j", str(job_id)])


def sacct(job_id: int, fields: str = "JobID,JobName,State,ExitCode,Elapsed") -> tuple[str, str]:
    """``sacct``'s lines for a job: ``(the command run, what it printed)``.

    ``sacct`` reads Slurm's accounting database (slurmdbd). Where there is none (the
    one-node Slurm of ``.ci/slurm-up``), it says that accounting storage is disabled, and
    ``sacct --completion`` reads the job completion log instead: a line each time the job
    ends or is requeued, with its state and exit code, but no steps.
    """
    cmd = ["sacct", "-j", str(job_id), "-o", fields]
    try:
        return " ".join(cmd), _run(cmd)
    except SlurmError as err:
        if "accounting storage is disabled" not in str(err):
            raise
    cmd.insert(1, "--completion")
    return " ".join(cmd), _run(cmd)


def job_task_pids(job_id: int) -> list[dict[str, str]]:
    """``scontrol listpids JOB``: every process of the job on this node, with its step and task.

    Each row: ``PID``, ``JOBID``, ``STEPID`` (``batch`` is the batch script, ``0`` the first
    ``srun``), ``LOCALID`` and ``GLOBALID`` (the task's rank; ``-`` for a process that is not a
    task itself, such as ``srun``'s helpers). None (``[]``) while the node has no process of
    the job: the controller can call a job RUNNING a moment before its node starts it, and
    ``scontrol`` then says "does not exist on node" (seen on a loaded 2-core CI machine).
    """
    try:
        lines = _run(["scontrol", "listpids", str(job_id)]).splitlines()
    except SlurmError as err:
        if "does not exist on node" in str(err):
            return []
        raise
    head = lines[0].split() if lines else []
    return [dict(zip(head, line.split(), strict=False)) for line in lines[1:] if line.strip()]


def requeue_job(job_id: int) -> None:
    """``scontrol requeue JOB``: back to pending, to run again from the start of its script."""
    _run(["scontrol", "requeue", str(job_id)])


def cancel_job(job_id: int) -> None:
    """``scancel JOB``."""
    _run(["scancel", str(job_id)])


def _is_chatter(line: str) -> bool:
    """gloo's "[Gloo] Rank 3 is connected to 7 peer ranks" lines, and their fragments: the
    tasks' lines get cut up where they interleave, leaving e.g. ``0: [Gloo] Rank`` or ``0: 7``
    (a task's own lines are never a bare number)."""
    text = re.sub(r"^\d+: ", "", line).strip()
    return "peer ranks" in text or text in ("", "[Gloo] Rank") or text.isdigit()


def read_job_log(path: str | os.PathLike[str]) -> list[str]:
    """A job's log file, without gloo's connection chatter and blank lines."""
    return [ln for ln in Path(path).read_text().splitlines() if not _is_chatter(ln)]


def recorded_slurm_run() -> dict[str, Any]:
    """What ``tests/test_slurm.py`` recorded (``RECORD``): the commands it ran and what they
    printed, for the submit, the kill and the requeue, with the date and the Slurm version.

    Each ``log`` is filtered again as ``read_job_log`` filters now, so that a record made
    before the filter caught a fragment does not show it.
    """
    record = json.loads(RECORD.read_text())
    for part in record.values():
        if isinstance(part, dict) and isinstance(part.get("log"), list):
            part["log"] = [ln for ln in part["log"] if not _is_chatter(ln)]
    return record
