"""Start the processes of a local multi-process JAX job, stream their output, end them all.

Notebook 05 and the tests run ``python -m helpers.multiprocess`` (the training script a
learner reads) as several processes on one machine. This module is the machinery around
that, and knows nothing of JAX: it starts the commands, prefixes each output line with the
process it came from, kills a process on purpose when it prints a given line (a fault
drill), and, however the call ends, ends every process it started by its pid.

- ``launch(commands, ...)``: any commands, one per process; the general launcher.
- ``launch_local(P, K, args)``: the script as one job of ``P`` processes with ``K``
  simulated CPU devices each, its coordinator on a free port of 127.0.0.1.
- ``launch_single(K, args)``: the script as a single process holding ``K`` devices.
- ``load_results(path)``: what a run's ``--out`` file holds.
- ``loopback_sockets_work()``: whether this machine lets processes talk over TCP on
  127.0.0.1 at all (some sandboxes refuse every TCP socket), and a sentence why (not).
"""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from helpers import compat

__all__ = [
    "LOOPBACK",
    "LaunchResult",
    "ProcessOutcome",
    "free_loopback_port",
    "launch",
    "launch_local",
    "launch_single",
    "load_results",
    "local_env",
    "loopback_sockets_work",
    "pid_alive",
    "script_command",
    "single_command",
    "still_alive",
]

LOOPBACK = "127.0.0.1"
#: ``HELPERS_ASSUME_NO_SOCKETS=1`` makes ``loopback_sockets_work`` answer no without trying,
#: to rehearse, where sockets work, what notebook 05 does on a machine that refuses them.
_ASSUME_NO_SOCKETS = "HELPERS_ASSUME_NO_SOCKETS"


def _is_chatter(line: str) -> bool:
    """gloo's "[Gloo] Rank 3 is connected to 7 peer ranks" lines (one per device, often
    interleaved mid-line): kept in the result, not echoed."""
    return "peer ranks" in line or line.strip() == "[Gloo] Rank"


_CHAINED = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)


class _Folder:
    """Folds what a dying process prints into what a reader needs, for the echo only.

    A Python traceback becomes its last line, the exception (``JaxRuntimeError: ...
    Connection closed by peer``), a C++ stack trace (absl's ``*** Check failure stack
    trace: ***`` and its ``@ 0x...`` frames) one line saying it was folded, and blank
    lines (between the parts of a multi-line error message) are left out. Every line
    stays in the result (``LaunchResult.lines_of``); only what is printed is shorter.
    """

    def __init__(self) -> None:
        self.python = 0  # lines of a Python traceback folded so far (0: not in one)
        self.native = 0  # lines of a C++ stack trace folded so far

    def feed(self, line: str) -> list[str]:
        out = []
        if self.native and not _is_native_frame(line):
            out.append(f"({self.native} lines of a C++ stack trace folded)")
            self.native = 0
        if self.python:
            if line.startswith((" ", "\t")) or not line.strip() or line in _CHAINED:
                self.python += 1
                return out
            if line.startswith("Traceback (most recent call last):"):
                self.python += 1
                return out
            folded, self.python = self.python, 0
            return [*out, f"{line}   ({folded} lines of traceback folded)"]
        if line.startswith("Traceback (most recent call last):") or line in _CHAINED:
            self.python = 1
            return out
        if _is_native_frame(line):
            self.native += 1
            return out
        if not line.strip():  # a blank line says nothing under a process's label
            return out
        return [*out, line]

    def flush(self) -> list[str]:
        out = []
        if self.python:
            out.append(f"({self.python} lines of an unfinished traceback folded)")
        if self.native:
            out.append(f"({self.native} lines of a C++ stack trace folded)")
        self.python = self.native = 0
        return out


def _is_native_frame(line: str) -> bool:
    text = line.strip()
    return text.startswith(("@ 0x", "@     0x", "PC: @", "*** ")) or (
        text.startswith("@") and "0x" in text[:24]
    )


@dataclass
class ProcessOutcome:
    """How one launched process ended."""

    process_id: int
    pid: int
    label: str
    returncode: int | None = None
    ended_by: str = "running"  # "exited", "killed on purpose", "stopped by launcher"
    ended_at_s: float | None = None  # seconds after launch
    lines: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        rc = self.returncode
        if rc is None:
            return self.ended_by
        if rc < 0:
            return f"{self.ended_by}: {signal.Signals(-rc).name} (returncode {rc})"
        return f"{self.ended_by}: returncode {rc}"


@dataclass
class LaunchResult:
    """What ``launch`` saw: every process's outcome, its output, and the times."""

    processes: list[ProcessOutcome]
    elapsed_s: float
    timed_out: bool = False
    killed: int | None = None  # the index of the process killed on purpose, if any
    killed_at_s: float | None = None

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(p.returncode == 0 for p in self.processes)

    def lines_of(self, process_id: int) -> list[str]:
        return self.processes[process_id].lines

    def summary(self) -> str:
        rows = [f"  {p.label} (pid {p.pid}): {p.status}"
                + (f" after {p.ended_at_s:.1f} s" if p.ended_at_s is not None else "")
                for p in self.processes]  # fmt: skip
        head = f"{len(self.processes)} process(es), {self.elapsed_s:.1f} s"
        if self.timed_out:
            head += ", TIMED OUT"
        return "\n".join([head, *rows])

    def check(self) -> LaunchResult:
        """Raise ``RuntimeError`` with the summary unless every process exited with 0."""
        if not self.ok:
            tail = "\n".join(
                f"  last lines of {p.label}:\n" + "\n".join(f"    {ln}" for ln in p.lines[-8:])
                for p in self.processes
                if p.returncode != 0
            )
            raise RuntimeError(
                "the launched processes did not all succeed:\n" + self.summary() + "\n" + tail
            )
        return self


def free_loopback_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def loopback_sockets_work(timeout_s: float = 5.0) -> tuple[bool, str]:
    """Whether TCP sockets work on 127.0.0.1 here, with a sentence that says so, or why not.

    A local job needs them: JAX's coordinator and gloo talk over TCP on loopback. This
    listens on a free port of 127.0.0.1 and connects to it. Some sandboxes refuse every TCP
    socket, even on loopback (``socket()`` fails with errno 97, EAFNOSUPPORT; unix sockets
    still work); there, and wherever the listener takes no connection, it is ``False``.
    With ``$HELPERS_ASSUME_NO_SOCKETS=1`` it is ``False`` without trying (to rehearse that
    case where sockets work). Like ``slurm_ready``, it returns a pair: unpack it
    (``ok, why = loopback_sockets_work()``), since a pair is always true.
    """
    if os.environ.get(_ASSUME_NO_SOCKETS, "") == "1":
        return False, f"{_ASSUME_NO_SOCKETS}=1: acting as if TCP sockets were refused here"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
            listener.bind((LOOPBACK, 0))
            listener.listen(1)
            listener.settimeout(timeout_s)
            port = listener.getsockname()[1]
            with socket.create_connection((LOOPBACK, port), timeout=timeout_s):
                accepted, _ = listener.accept()
                accepted.close()
    except OSError as err:  # refused, unreachable or timed out: no job can run here
        return False, f"this machine refuses TCP sockets on {LOOPBACK} ({err})"
    return True, f"TCP sockets work on {LOOPBACK}: a listener there took a connection"


def pid_alive(pid: int) -> bool:
    """True while a process with this pid is running (a zombie, ended but not reaped, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - someone else's process reused the pid
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return True


def still_alive(pids: Sequence[int], wait_s: float = 5.0) -> list[int]:
    """The pids of ``pids`` still running after up to ``wait_s`` seconds (empty: all ended).

    A process's own children are reaped at once; orphans it left take a moment longer.
    """
    deadline = time.monotonic() + wait_s
    while True:
        alive = [p for p in pids if pid_alive(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def local_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of locally launched processes: this one's, on CPU, unbuffered, no proxies."""
    env = dict(os.environ)
    # Proxies can send JAX's gRPC traffic astray (JAX warns about it); we only use loopback.
    for key in [k for k in env if k.lower().endswith("_proxy")]:
        del env[key]
    env["PYTHONUNBUFFERED"] = "1"
    env["JAX_PLATFORMS"] = "cpu"
    # These small programs spend far longer in XLA's CPU compiler than running, and its
    # lowest optimisation level cuts that (compat.FAST_CPU_COMPILE). Every local run (the
    # reference too) uses it.
    env["XLA_FLAGS"] = compat.with_fast_cpu_compile(env.get("XLA_FLAGS", ""))
    env.update(extra or {})
    return env


def _end(proc: subprocess.Popen) -> None:
    """End one launched process by its own id (and its process group, which it leads)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            proc.kill()
        except ProcessLookupError:  # pragma: no cover - it ended in between
            pass
    proc.wait(timeout=30)


def _kill_pattern(when: int | str) -> re.Pattern[str]:
    """``kill=(i, 3)`` means "after it prints step 3"; a string is a regular expression."""
    if isinstance(when, bool) or not isinstance(when, int | str):
        raise ValueError(f"launch: kill=(process, when): when={when!r} must be a step or a regex.")
    return re.compile(rf"^step\s+{when}\b" if isinstance(when, int) else when)


def launch(
    commands: Sequence[Sequence[str]],
    *,
    timeout_s: float,
    kill: tuple[int, int | str] | None = None,
    grace_s: float = 30.0,
    echo: bool = True,
    env: dict[str, str] | None = None,
    labels: Sequence[str] | None = None,
) -> LaunchResult:
    """Run ``commands`` (one per process) at once and stream their output, ``[label] line``.

    Args:
      timeout_s: the whole run may take this long; then every process still alive is
        killed and the result says ``timed_out``.
      kill: ``(i, when)``: SIGKILL process ``i`` as soon as it prints a line that matches
        ``when``: a step number (the script's ``step <n>`` line) or a regular expression.
        It shows what the others do when one of them dies.
      grace_s: once a process has died, the others get this long to stop on their own
        (JAX's heartbeat detects it); then the launcher kills them.
      echo: print the lines as they come (the caller's stdout, e.g. a notebook cell). A
        Python traceback is printed as its last line, the exception, and a C++ stack
        trace as one line; the result keeps every line.
      labels: the prefix of each process's lines; default ``p0``, ``p1``, ...

    Every process is started in its own process group and, however this call ends
    (normally, on an error, or on a KeyboardInterrupt), ended by its pid before it returns.
    """
    if labels is None:
        labels = [f"p{i}" for i in range(len(commands))]
    if len(labels) != len(commands):
        raise ValueError(f"launch: {len(labels)} labels for {len(commands)} commands.")
    pattern = None if kill is None else _kill_pattern(kill[1])
    run = _Run(labels, echo, kill[0] if kill is not None else None, pattern)
    try:
        run.start(commands, env)
        run.watch(timeout_s, grace_s)
    finally:
        run.finish()
    run.say(run.result.summary().replace("\n", "\n[launcher] "))
    return run.result


class _Run:
    """The steps of one ``launch``: start the processes, watch their lines and exits until
    they end (or a timeout, or a death plus grace), then end what is left and collect."""

    def __init__(
        self,
        labels: Sequence[str],
        echo: bool,
        kill_index: int | None,
        pattern: re.Pattern[str] | None,
    ) -> None:
        self.labels, self.echo = list(labels), echo
        self.kill_index, self.pattern = kill_index, pattern
        self.t0 = time.monotonic()
        self.lines: queue.Queue[tuple[int, str | None]] = queue.Queue()
        self.procs: list[subprocess.Popen] = []
        self.outcomes: list[ProcessOutcome] = []
        self.readers: list[threading.Thread] = []
        self.result = LaunchResult(self.outcomes, 0.0)
        self.folders = [_Folder() for _ in labels]
        self.open_streams = 0
        self.first_failure: float | None = None

    def say(self, text: str) -> None:
        if self.echo:
            print(f"[launcher] {text}", flush=True)

    def _read(self, i: int, stream: Any) -> None:
        for line in iter(stream.readline, ""):
            self.lines.put((i, line.rstrip("\n")))
        self.lines.put((i, None))

    def start(self, commands: Sequence[Sequence[str]], env: dict[str, str] | None) -> None:
        """Each command in its own process group, its output read by a thread."""
        for i, cmd in enumerate(commands):
            proc = subprocess.Popen(
                list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                env=env, start_new_session=True, bufsize=1,
            )  # fmt: skip
            self.procs.append(proc)
            self.outcomes.append(ProcessOutcome(i, proc.pid, self.labels[i]))
            t = threading.Thread(target=self._read, args=(i, proc.stdout), daemon=True)
            t.start()
            self.readers.append(t)
        self.open_streams = len(self.procs)
        self.say(f"started {len(self.procs)} process(es): pids {[p.pid for p in self.procs]}")

    def handle(self, i: int, line: str) -> None:
        """Keep (and echo) one line; SIGKILL process ``i`` if it is the line to kill after."""
        out, proc = self.outcomes[i], self.procs[i]
        out.lines.append(line)
        if self.echo and not _is_chatter(line):
            for shown in self.folders[i].feed(line):
                print(f"[{out.label}] {shown}", flush=True)
        if self.pattern is None or self.kill_index != i or self.result.killed is not None:
            return
        if self.pattern.search(line) and proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            self.result.killed, self.result.killed_at_s = i, time.monotonic() - self.t0
            out.ended_by = "killed on purpose"
            self.say(f"killed {out.label} (pid {proc.pid}) with SIGKILL after: {line}")

    def _note_exits(self, now: float) -> list[subprocess.Popen]:
        """Record the processes that ended; return those still alive."""
        for out, proc in zip(self.outcomes, self.procs, strict=True):
            if out.returncode is None and proc.poll() is not None:
                out.returncode, out.ended_at_s = proc.returncode, now
                if out.ended_by == "running":
                    out.ended_by = "exited"
                if proc.returncode != 0 and self.first_failure is None:
                    self.first_failure = now
        return [p for p, o in zip(self.procs, self.outcomes, strict=True) if o.returncode is None]

    def _done(self, alive: list[subprocess.Popen], now: float, timeout_s: float,
              grace_s: float) -> bool:  # fmt: skip
        """Whether to stop watching: all ended, the timeout, or a death plus ``grace_s``."""
        if not alive:
            # Every process ended (something they started may still hold a pipe: 5 s more).
            last = max(o.ended_at_s or 0.0 for o in self.outcomes)
            return self.open_streams == 0 or now > last + 5
        pids = [p.pid for p in alive]
        if now > timeout_s:
            self.result.timed_out = True
            self.say(f"timeout: {timeout_s:.0f} s passed; killing pids {pids}")
            return True
        if self.first_failure is not None and now > self.first_failure + grace_s:
            self.say(f"a process died {grace_s:.0f} s ago and pids {pids} are still running: "
                     "killing them")  # fmt: skip
            return True
        return False

    def watch(self, timeout_s: float, grace_s: float) -> None:
        """Take lines as they come until ``_done``."""
        while True:
            try:
                i, line = self.lines.get(timeout=0.05)
                if line is None:
                    self.open_streams -= 1
                else:
                    self.handle(i, line)
            except queue.Empty:
                pass
            now = time.monotonic() - self.t0
            if self._done(self._note_exits(now), now, timeout_s, grace_s):
                return

    def finish(self) -> None:
        """End every process still alive (by its pid), then take the lines left over."""
        for proc, out in zip(self.procs, self.outcomes, strict=True):
            if proc.poll() is None:
                _end(proc)
                out.ended_by = "stopped by launcher"
            if out.returncode is None:
                out.returncode, out.ended_at_s = proc.returncode, time.monotonic() - self.t0
        for t in self.readers:
            t.join(timeout=5)
        while True:  # lines that arrived after the watch ended
            try:
                i, line = self.lines.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.handle(i, line)
        if self.echo:
            for out, folder in zip(self.outcomes, self.folders, strict=False):
                for shown in folder.flush():
                    print(f"[{out.label}] {shown}", flush=True)
        for proc in self.procs:
            if proc.stdout is not None:
                proc.stdout.close()
        self.result.elapsed_s = time.monotonic() - self.t0


# ---------------------------------------------------------------------------
# The series' script, ``python -m helpers.multiprocess``
# ---------------------------------------------------------------------------


def script_command(*args: str) -> list[str]:
    """``python -m helpers.multiprocess ARGS`` with this interpreter."""
    return [sys.executable, "-m", "helpers.multiprocess", *args]


def single_command(num_devices: int, args: Sequence[str] = ()) -> list[str]:
    """The script as a single process with ``num_devices`` simulated devices."""
    return script_command("--num-processes", "1", "--simulated-devices", str(num_devices), *args)


def launch_local(
    num_processes: int = 2,
    devices_per_process: int = 4,
    args: Sequence[str] = (),
    *,
    per_process: dict[int, Sequence[str]] | None = None,
    heartbeat_timeout_s: int = 5,
    timeout_s: float = 180.0,
    kill: tuple[int, int | str] | None = None,
    grace_s: float | None = None,
    echo: bool = True,
) -> LaunchResult:
    """Start ``num_processes`` copies of the script on this machine, as one JAX job.

    Each gets ``devices_per_process`` simulated CPU devices and joins a coordinator on a
    free port of 127.0.0.1 (nothing listens on any other address). ``args`` go to every
    process (``--steps 6 --out results.npz ...``), ``per_process[i]`` to process ``i`` only.
    ``heartbeat_timeout_s`` is how long JAX waits before declaring a silent process dead
    (JAX's default is 100 s; short here so that a failure shows quickly). ``grace_s``
    defaults to ``3 * heartbeat_timeout_s + 10``. See ``launch`` for the rest.
    """
    if num_processes < 1 or devices_per_process < 1:
        raise ValueError(
            f"launch_local: num_processes={num_processes} and "
            f"devices_per_process={devices_per_process} must both be at least 1."
        )
    port = free_loopback_port()
    common = ["--coordinator", f"{LOOPBACK}:{port}", "--num-processes", str(num_processes),
              "--simulated-devices", str(devices_per_process),
              "--heartbeat-timeout", str(heartbeat_timeout_s),
              "--init-timeout", str(int(timeout_s)), *args]  # fmt: skip
    per_process = per_process or {}
    commands = [
        script_command(*common, "--process-id", str(i), *per_process.get(i, ()))
        for i in range(num_processes)
    ]
    if grace_s is None:
        grace_s = 3 * heartbeat_timeout_s + 10
    return launch(
        commands, timeout_s=timeout_s, kill=kill, grace_s=grace_s, echo=echo, env=local_env()
    )


def launch_single(
    num_devices: int = 8,
    args: Sequence[str] = (),
    *,
    timeout_s: float = 180.0,
    echo: bool = True,
) -> LaunchResult:
    """The script as a single process holding all ``num_devices`` simulated devices."""
    return launch(
        [single_command(num_devices, args)],
        timeout_s=timeout_s,
        echo=echo,
        env=local_env(),
        labels=[f"1 process, {num_devices} devices"],
    )


def load_results(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What a run's ``--out`` file holds.

    ``losses`` and ``steps`` (the steps this run trained), ``restored_step`` (the step it
    restored from its checkpoint directory, 0 for a fresh start), the mesh's ``mesh_device_ids`` and ``mesh_process_index``, and
    ``state``: every array of the final train state, whole, by path
    (``params/block_0/up/kernel``, ``opt_state/0/mu/...``); ``params`` is its parameters;
    ``shard_shapes``: the shape of the block of each parameter that process 0's first device
    held, by the same path as ``params``.
    """
    with np.load(path) as z:
        data = {k: z[k] for k in z.files}
    state = {k.removeprefix("state/"): v for k, v in data.items() if k.startswith("state/")}
    shard_shapes = {
        k.removeprefix("shard/"): tuple(int(n) for n in v)
        for k, v in data.items()
        if k.startswith("shard/")
    }
    rest = {k: v for k, v in data.items() if not k.startswith(("state/", "shard/"))}
    params = {k.removeprefix("params/"): v for k, v in state.items() if k.startswith("params/")}
    return {**rest, "state": state, "params": params, "shard_shapes": shard_shapes}
