"""Multi-process JAX training: the script every process runs, and a local launcher for it.

JAX scales past one machine with one *process per host*. Every process runs this same
script, calls ``jax.distributed.initialize``, sees the devices of every process in
``jax.devices()`` (and its own in ``jax.local_devices()``), builds one global mesh over all
of them, feeds only its own rows of each batch, and runs the same jitted step: XLA inserts
the collectives between processes (NCCL on GPUs, gloo on CPUs).

On a cluster (one process per host; nothing here is simulated)::

    srun python -m helpers.multiprocess --steps 100          # SLURM: initialize() auto-detects
    python -m helpers.multiprocess --coordinator HOST0:1234 --num-processes 2 --process-id 0
    python -m helpers.multiprocess --coordinator HOST0:1234 --num-processes 2 --process-id 1

On one machine, notebook 05 simulates that with ``launch_local``: P processes on the
loopback interface, each with its own simulated CPU devices, their output streamed back
line by line, every process ended by its pid when the call returns. ``run_reference`` runs
the same script as one process holding all P x K devices, to check the two train the same.
"""

from __future__ import annotations

import argparse
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

LOOPBACK = "127.0.0.1"

# The model every process trains (small enough for a 2-core CI machine). The global batch
# and the width d_model must divide by the number of devices: 32 and 64 allow up to 32.
D_MODEL, D_FF, N_LAYERS, N_CLASSES, GLOBAL_BATCH, SEQ = 64, 256, 2, 16, 32, 8
LEARNING_RATE = 1e-2


# ---------------------------------------------------------------------------
# The script: what every process runs
# ---------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m helpers.multiprocess",
        description="Train the series' MLPStack with FSDP over the devices of every process. "
        "Run one copy per host. With no --coordinator/--num-processes/--process-id, "
        "jax.distributed.initialize() detects them itself (SLURM, Open MPI, TPU pods).",
    )
    p.add_argument("--coordinator", help="HOST:PORT of process 0's coordination service")
    p.add_argument(
        "--num-processes",
        type=int,
        help="how many processes in the job (1: no distributed runtime)",
    )
    p.add_argument("--process-id", type=int, help="this process's id, 0 .. num-processes - 1")
    p.add_argument(
        "--simulated-devices",
        type=int,
        metavar="K",
        help="give this process K simulated CPU devices (local runs only; omit on GPUs)",
    )
    p.add_argument("--steps", type=int, default=3, help="training steps (default 3)")
    p.add_argument(
        "--log-every", type=int, default=1, help="print the loss every N steps (default 1)"
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the parameters and the data (default 0)"
    )
    p.add_argument("--out", help="process 0 writes losses and final parameters here (.npz)")
    p.add_argument("--mesh-figure", help="process 0 draws the global mesh here (.png)")
    p.add_argument(
        "--heartbeat-timeout",
        type=int,
        metavar="S",
        help="seconds without a heartbeat after which a process counts as dead "
        "(default: JAX's, 100)",
    )
    p.add_argument(
        "--init-timeout",
        type=int,
        default=300,
        metavar="S",
        help="seconds to wait for every process to join (default 300)",
    )
    return p.parse_args(argv)


def is_loopback(address: str | None) -> bool:
    """True when ``HOST:PORT`` names this machine only (a local, simulated run)."""
    if address is None:
        return False
    host = address.rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1")


def connect(args: argparse.Namespace) -> None:
    """Join the job: ``jax.distributed.initialize`` (skipped for a one-process run).

    Must run before any JAX computation: the backend is created once, and it needs the
    distributed client to know about the other processes' devices.
    """
    import jax

    if args.num_processes == 1 and args.coordinator is None:
        return  # a single process: nothing to join
    kwargs: dict[str, Any] = {"initialization_timeout": args.init_timeout}
    if args.heartbeat_timeout is not None:
        kwargs["heartbeat_timeout_seconds"] = args.heartbeat_timeout
    if is_loopback(args.coordinator):
        # Serve the coordinator on loopback only (JAX's default is every interface).
        kwargs["coordinator_bind_address"] = args.coordinator
    if args.simulated_devices:
        compat.gloo_on_loopback(is_loopback)
    # With all three None (as under `srun`), JAX detects them from the cluster environment.
    jax.distributed.initialize(args.coordinator, args.num_processes, args.process_id, **kwargs)


def process_rows(sharding: Any, global_shape: tuple[int, ...]) -> slice:
    """The rows of a batch of ``global_shape`` that this process must load under ``sharding``.

    They are the union of the row blocks of this process's own (addressable) devices,
    and must be contiguous for ``jax.make_array_from_process_local_data``.
    """
    blocks = sorted(
        (idx[0].start or 0, global_shape[0] if idx[0].stop is None else idx[0].stop)
        for idx in sharding.addressable_devices_indices_map(global_shape).values()
    )
    start, stop = blocks[0][0], max(b for _, b in blocks)
    covered = sum(b - a for a, b in sorted(set(blocks)))
    if covered != stop - start:
        raise ValueError(f"this process's rows {sorted(set(blocks))} are not one contiguous block")
    return slice(start, stop)


def load_batch(key: Any, cfg: Any, x_sharding: Any, y_sharding: Any) -> tuple[Any, Any]:
    """One global batch, of which this process loads only its own rows.

    The whole batch is *generated* identically everywhere from ``key`` (cheap, and it is
    what makes the multi-process run comparable with a single process); each process then
    keeps its rows and ``make_array_from_process_local_data`` stitches the rows of every
    process into one global ``jax.Array``. A real data loader would read only those rows.
    """
    import jax

    from helpers.models import synthetic_batch

    x, labels = synthetic_batch(key, cfg)
    rows = process_rows(x_sharding, x.shape)
    x_local, y_local = np.asarray(x[rows]), np.asarray(labels[rows])
    return (
        jax.make_array_from_process_local_data(x_sharding, x_local, x.shape),
        jax.make_array_from_process_local_data(y_sharding, y_local, labels.shape),
    )


def model_config() -> Any:
    from helpers.models import ModelConfig

    return ModelConfig(d_model=D_MODEL, d_ff=D_FF, n_layers=N_LAYERS, n_classes=N_CLASSES,
                       batch=GLOBAL_BATCH, seq=SEQ)  # fmt: skip


def train(steps: int, seed: int = 0, log_every: int = 1) -> tuple[list[float], Any, Any]:
    """FSDP training over every device of every process. Returns (losses, params, mesh).

    The same code runs in every process, and in a single process: only ``jax.devices()``
    (all devices of the job) and ``process_rows`` (which rows are mine) differ.
    """
    import jax
    import optax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from helpers.devices import make_mesh
    from helpers.train import init_sharded, make_train_step

    cfg = model_config()
    devices = jax.devices()  # every process's devices, not only this one's
    n = len(devices)
    if cfg.batch % n or cfg.d_model % n:
        raise SystemExit(
            f"{n} devices must divide the global batch {cfg.batch} and d_model {cfg.d_model}"
        )
    mesh = make_mesh((n, 1), ("data", "model"), devices=devices)
    model, optimizer = cfg.model(), optax.adam(LEARNING_RATE)
    # init only needs shapes: a host array of the batch's shape, not the data itself.
    x_shape = np.zeros((cfg.batch, cfg.seq, cfg.d_model), np.float32)
    state = init_sharded(model, x_shape, mesh, "fsdp", jax.random.key(seed), optimizer)
    step_fn = make_train_step(model, optimizer, mesh, state, "fsdp")
    x_sharding, y_sharding = NamedSharding(mesh, P("data")), NamedSharding(mesh, P("data"))

    rows = process_rows(x_sharding, x_shape.shape)
    me = jax.process_index()
    print(
        f"process {me} of {jax.process_count()}: local devices "
        f"{[d.id for d in jax.local_devices()]} of {n} global; "
        f"loads rows {rows.start}:{rows.stop} of each global batch of {cfg.batch}",
        flush=True,
    )
    params, opt_state = state.params, state.opt_state
    data_key = jax.random.key(seed + 1)
    losses = []
    for step in range(1, steps + 1):
        x, labels = load_batch(jax.random.fold_in(data_key, step), cfg, x_sharding, y_sharding)
        params, opt_state, loss = step_fn(params, opt_state, x, labels)
        losses.append(float(loss))  # the loss is replicated: every process holds all of it
        if step % log_every == 0 or step == steps:
            print(f"step {step:>3}  loss {losses[-1]:.6f}", flush=True)
    return losses, params, mesh


def save_results(path: str, losses: list[float], params: Any, mesh: Any) -> None:
    """Gather the final parameters to every host and write them with the losses (process 0)."""
    import jax
    from jax.experimental import multihost_utils

    from helpers.sharding import path_str

    # A collective: every process must call it, even those that write nothing.
    full = multihost_utils.process_allgather(params, tiled=True)
    if jax.process_index() != 0:
        return
    flat = {
        "param/" + path_str(p): np.asarray(v)
        for p, v in jax.tree_util.tree_flatten_with_path(full)[0]
    }
    mesh_devices = list(mesh.devices.flat)
    np.savez(
        path,
        losses=np.asarray(losses),
        num_processes=jax.process_count(),
        mesh_device_ids=np.array([d.id for d in mesh_devices]),
        mesh_process_index=np.array([d.process_index for d in mesh_devices]),
        **flat,
    )
    print(
        f"process 0 wrote {len(flat)} parameter arrays and {len(losses)} losses to {path}",
        flush=True,
    )


def draw_global_mesh(path: str, mesh: Any) -> None:
    """Process 0 draws the global mesh: every device, labelled with the process that owns it."""
    import jax

    if jax.process_index() != 0:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from helpers.draw import draw_mesh

    ax = draw_mesh(mesh)
    fig = getattr(ax, "figure", ax)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import jax

    if args.simulated_devices:
        # Before anything starts JAX's backend: afterwards the count cannot change.
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", args.simulated_devices)
    connect(args)
    losses, params, mesh = train(args.steps, args.seed, args.log_every)
    if args.out:
        save_results(args.out, losses, params, mesh)
    if args.mesh_figure:
        draw_global_mesh(args.mesh_figure, mesh)
    print(f"process {jax.process_index()} done", flush=True)
    return 0


# ---------------------------------------------------------------------------
# The local launcher: P processes on one machine, for the notebook and the tests
# ---------------------------------------------------------------------------

_STEP_LINE = re.compile(r"^step\s+(\d+)\b")


def _is_chatter(line: str) -> bool:
    """gloo's "[Gloo] Rank 3 is connected to 7 peer ranks" lines (one per device, often
    interleaved mid-line): kept in the result, not echoed."""
    return "peer ranks" in line or line.strip() == "[Gloo] Rank"


@dataclass
class ProcessOutcome:
    """How one launched process ended."""

    process_id: int
    pid: int
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
            name = signal.Signals(-rc).name
            return f"{self.ended_by}: {name} (returncode {rc})"
        return f"{self.ended_by}: returncode {rc}"


@dataclass
class LaunchResult:
    """What ``launch`` saw: every process's outcome, its output, and the times."""

    processes: list[ProcessOutcome]
    elapsed_s: float
    timed_out: bool = False
    killed: int | None = None  # the process id killed on purpose, if any
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
        rows = [f"  process {p.process_id} (pid {p.pid}): {p.status}"
                + (f" after {p.ended_at_s:.1f} s" if p.ended_at_s is not None else "")
                for p in self.processes]  # fmt: skip
        head = f"{len(self.processes)} process(es), {self.elapsed_s:.1f} s"
        if self.timed_out:
            head += ", TIMED OUT"
        return "\n".join([head, *rows])

    def check(self) -> LaunchResult:
        """Raise ``RuntimeError`` with the summary unless every process exited with 0."""
        if not self.ok:
            raise RuntimeError("the launched processes did not all succeed:\n" + self.summary())
        return self


def free_loopback_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


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


def local_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of locally launched processes: this one's, on CPU, unbuffered, no proxies."""
    env = dict(os.environ)
    # Proxies can send JAX's gRPC traffic astray (JAX warns about it); we only use loopback.
    for key in [k for k in env if k.lower().endswith("_proxy")]:
        del env[key]
    env["PYTHONUNBUFFERED"] = "1"
    env["JAX_PLATFORMS"] = "cpu"
    # These small programs spend far longer in XLA's CPU compiler than running, and its
    # lowest optimisation level cuts that. Every local run (the reference too) uses it.
    flags = env.get("XLA_FLAGS", "")
    if "xla_backend_optimization_level" not in flags:
        env["XLA_FLAGS"] = f"{flags} --xla_backend_optimization_level=0".strip()
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


def launch(
    commands: Sequence[Sequence[str]],
    *,
    timeout_s: float,
    kill: tuple[int, int] | None = None,
    grace_s: float = 30.0,
    echo: bool = True,
    env: dict[str, str] | None = None,
) -> LaunchResult:
    """Run ``commands`` (one per process) at once and stream their output, ``[pI] line``.

    Args:
      timeout_s: the whole run may take this long; then every process still alive is
        killed and the result says ``timed_out``.
      kill: ``(process_id, step)``: SIGKILL that process as soon as it prints ``step <step>``,
        to see what the others do when one of them dies.
      grace_s: once a process has died, the others get this long to stop on their own
        (JAX's heartbeat detects it); then the launcher kills them.
      echo: print the lines as they come (the caller's stdout, e.g. a notebook cell).

    Every process is started in its own process group and, however this call ends
    (normally, on an error, or on a KeyboardInterrupt), ended by its pid before it returns.
    """
    t0 = time.monotonic()
    lines: queue.Queue[tuple[int, str | None]] = queue.Queue()
    procs: list[subprocess.Popen] = []
    outcomes: list[ProcessOutcome] = []
    readers: list[threading.Thread] = []
    result = LaunchResult(outcomes, 0.0)

    def say(text: str) -> None:
        if echo:
            print(f"[launcher] {text}", flush=True)

    def read(i: int, stream: Any) -> None:
        for line in iter(stream.readline, ""):
            lines.put((i, line.rstrip("\n")))
        lines.put((i, None))

    def handle(i: int, line: str) -> None:
        outcomes[i].lines.append(line)
        if echo and not _is_chatter(line):
            print(f"[p{i}] {line}", flush=True)
        if kill is not None and kill[0] == i and result.killed is None:
            m = _STEP_LINE.match(line)
            if m and int(m.group(1)) >= kill[1]:
                os.kill(procs[i].pid, signal.SIGKILL)
                result.killed, result.killed_at_s = i, time.monotonic() - t0
                outcomes[i].ended_by = "killed on purpose"
                say(
                    f"killed process {i} (pid {procs[i].pid}) with SIGKILL after its step {m.group(1)}"
                )

    try:
        for i, cmd in enumerate(commands):
            proc = subprocess.Popen(
                list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                env=env, start_new_session=True, bufsize=1,
            )  # fmt: skip
            procs.append(proc)
            outcomes.append(ProcessOutcome(i, proc.pid))
            t = threading.Thread(target=read, args=(i, proc.stdout), daemon=True)
            t.start()
            readers.append(t)
        say(f"started {len(procs)} process(es): pids {[p.pid for p in procs]}")
        open_streams = len(procs)
        first_failure: float | None = None
        while True:
            try:
                i, line = lines.get(timeout=0.05)
                if line is None:
                    open_streams -= 1
                else:
                    handle(i, line)
            except queue.Empty:
                pass
            now = time.monotonic() - t0
            for out, proc in zip(outcomes, procs, strict=True):
                if out.returncode is None and proc.poll() is not None:
                    out.returncode, out.ended_at_s = proc.returncode, now
                    if out.ended_by == "running":
                        out.ended_by = "exited"
                    if proc.returncode != 0 and first_failure is None:
                        first_failure = now
            alive = [p for p, o in zip(procs, outcomes, strict=True) if o.returncode is None]
            if not alive and open_streams == 0:
                break
            if not alive and now > max(o.ended_at_s or 0.0 for o in outcomes) + 5:
                break  # every process ended, but something they started still holds a pipe
            if alive and now > timeout_s:
                result.timed_out = True
                say(f"timeout: {timeout_s:.0f} s passed; killing pids {[p.pid for p in alive]}")
                break
            if alive and first_failure is not None and now > first_failure + grace_s:
                say(f"a process died {grace_s:.0f} s ago and pids {[p.pid for p in alive]} are "
                    "still running: killing them")  # fmt: skip
                break
    finally:
        for proc, out in zip(procs, outcomes, strict=True):
            if proc.poll() is None:
                _end(proc)
                out.ended_by = "stopped by launcher"
            if out.returncode is None:
                out.returncode, out.ended_at_s = proc.returncode, time.monotonic() - t0
        for t in readers:
            t.join(timeout=5)
        while True:  # lines that arrived after the loop ended
            try:
                i, line = lines.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                handle(i, line)
        for proc in procs:
            if proc.stdout is not None:
                proc.stdout.close()
        result.elapsed_s = time.monotonic() - t0
    say(result.summary().replace("\n", "\n[launcher] "))
    return result


def script_command(*args: str) -> list[str]:
    """``python -m helpers.multiprocess ARGS`` with this interpreter."""
    return [sys.executable, "-m", "helpers.multiprocess", *args]


def launch_local(
    num_processes: int = 2,
    devices_per_process: int = 4,
    *,
    steps: int = 3,
    out: str | None = None,
    mesh_figure: str | None = None,
    log_every: int = 1,
    heartbeat_timeout_s: int = 5,
    timeout_s: float = 180.0,
    kill: tuple[int, int] | None = None,
    grace_s: float | None = None,
    echo: bool = True,
) -> LaunchResult:
    """Start ``num_processes`` copies of the script on this machine, as one JAX job.

    Each gets ``devices_per_process`` simulated CPU devices and joins a coordinator on a
    free port of 127.0.0.1 (nothing listens on any other address). ``heartbeat_timeout_s``
    is how long JAX waits before declaring a silent process dead (JAX's default is 100 s;
    short here so that a failure shows quickly). See ``launch`` for the rest.
    """
    port = free_loopback_port()
    common = ["--coordinator", f"{LOOPBACK}:{port}", "--num-processes", str(num_processes),
              "--simulated-devices", str(devices_per_process), "--steps", str(steps),
              "--log-every", str(log_every), "--heartbeat-timeout", str(heartbeat_timeout_s),
              "--init-timeout", str(int(timeout_s))]  # fmt: skip
    if out:
        common += ["--out", out]
    if mesh_figure:
        common += ["--mesh-figure", mesh_figure]
    commands = [script_command(*common, "--process-id", str(i)) for i in range(num_processes)]
    if grace_s is None:
        grace_s = 3 * heartbeat_timeout_s + 10
    return launch(
        commands, timeout_s=timeout_s, kill=kill, grace_s=grace_s, echo=echo, env=local_env()
    )


def run_reference(
    num_devices: int = 8,
    *,
    steps: int = 3,
    out: str | None = None,
    timeout_s: float = 180.0,
    echo: bool = True,
) -> LaunchResult:
    """The same script as a single process holding all ``num_devices`` simulated devices."""
    args = ["--num-processes", "1", "--simulated-devices", str(num_devices), "--steps", str(steps)]
    if out:
        args += ["--out", out]
    return launch([script_command(*args)], timeout_s=timeout_s, echo=echo, env=local_env())


def load_results(path: str) -> dict[str, Any]:
    """What process 0 wrote: ``losses``, ``params`` (path -> array) and the mesh's owners."""
    with np.load(path) as z:
        data = {k: z[k] for k in z.files}
    params = {k.removeprefix("param/"): v for k, v in data.items() if k.startswith("param/")}
    rest = {k: v for k, v in data.items() if not k.startswith("param/")}
    return {**rest, "params": params}


if __name__ == "__main__":
    sys.exit(main())
