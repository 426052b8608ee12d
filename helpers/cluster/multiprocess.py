"""The training script that every process of a multi-process JAX job runs (notebook 05).

    srun python -m helpers.multiprocess --steps 100          # Slurm: initialize() detects the job
    python -m helpers.multiprocess --coordinator HOST0:1234 --num-processes 2 --process-id 0

(``helpers/cluster/train.sbatch`` is the Slurm batch script that runs it; ``helpers.cluster.slurm``
submits it.)

Every process runs this same file. It joins the job (``connect``), builds one mesh over
the devices of every process, loads only its own rows of each batch (``load_batch``) and
runs the same jitted FSDP step as notebooks 03-04. With ``--checkpoint-dir`` it saves the
train state with orbax every ``--save-every`` steps, and when that directory already holds
a committed checkpoint it resumes from the newest one, onto whatever mesh this run has.

``helpers.cluster.launcher`` starts it on one machine (P processes on the loopback interface, each
with simulated CPU devices), for notebook 05 and the tests.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from helpers import compat
from helpers.cli import OneLineParser, host_port, refuse, whole_number, writable_path
from helpers.cluster.checkpoint import paused_writes, wait_for_uncommitted

# The model every process trains (small enough for a 2-core CI machine). The global batch
# and the width d_model must divide by the number of devices: 32 and 64 allow up to 32.
D_MODEL, D_FF, N_LAYERS, N_CLASSES, GLOBAL_BATCH, SEQ = 64, 256, 2, 16, 32, 8
LEARNING_RATE = 1e-2
TEACHER_SEED = 1234  # the fixed projection that labels every row (batch_rows)
LAYOUTS = ("fsdp", "fsdp_tp", "dp")  # logical-axis rule presets of helpers.placing.sharding


def parser() -> argparse.ArgumentParser:
    """The script's command line (``python -m helpers.multiprocess --help`` prints it)."""
    p = OneLineParser(
        prog="python -m helpers.multiprocess",
        description="Train the series' MLPStack with FSDP over the devices of every process. "
        "Run one copy per host. With no --coordinator/--num-processes/--process-id, "
        "jax.distributed.initialize() detects them itself (Slurm, Open MPI, TPU pods).",
    )
    add = p.add_argument
    # fmt: off
    add("--coordinator", type=host_port, help="HOST:PORT of process 0's coordination service")
    add("--num-processes", type=whole_number(1, 65536), help="how many processes in the job (1: no distributed runtime)")
    add("--process-id", type=whole_number(0, 65535), help="this process's id, 0 .. num-processes - 1")
    add("--simulated-devices", type=whole_number(1, 512), metavar="K",
        help="give this process K simulated CPU devices (local runs only; omit on GPUs)")
    add("--steps", type=whole_number(1), default=3, help="train until this step (default 3)")
    add("--layout", choices=LAYOUTS, default="fsdp",
        help="sharding rules: fsdp on a (n, 1) mesh (default), fsdp_tp on a 2-D mesh, dp")
    add("--log-every", type=whole_number(1), default=1, help="print the loss every N steps (default 1)")
    add("--seed", type=whole_number(0, 2**32 - 1), default=0, help="seed of the parameters and the data (default 0)")
    add("--checkpoint-dir", metavar="DIR",
        help="save with orbax here (storage every process sees); resume from its newest step")
    add("--save-every", type=whole_number(0), default=0, metavar="S",
        help="save at every step divisible by S (default 0: never)")
    add("--primary-host", type=whole_number(0, 65535), default=0,
        help="the process that commits each checkpoint (orbax's primary_host, default 0)")
    add("--hold-save", type=whole_number(1), metavar="STEP",
        help="fault drill: this process never completes its part of the save of STEP "
        "(on a job's first attempt only: not once Slurm has requeued it)")
    add("--out", type=writable_path, help="process 0 writes the losses and the final train state here (.npz)")
    add("--mesh-figure", type=writable_path, help="process 0 draws the global mesh here (.png)")
    add("--heartbeat-timeout", type=whole_number(1), metavar="S",
        help="seconds without a heartbeat after which a process counts as dead (default: JAX's, 100)")
    add("--init-timeout", type=whole_number(1), metavar="S",
        help="seconds to wait for every process to join (default: JAX's, 300)")
    # fmt: on
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and check the command line: a bad value exits with code 2 and one line naming
    its flag, before JAX starts."""
    p = parser()
    args = p.parse_args(argv)
    n = args.num_processes
    if n is not None and args.process_id is not None and args.process_id >= n:
        refuse(p, "--process-id", f"0 .. --num-processes - 1 (0 .. {n - 1}), got {args.process_id}")
    if n is not None and args.primary_host >= n:
        refuse(p, "--primary-host", f"0 .. {n - 1} (a process of the job), got {args.primary_host}")
    if args.hold_save is not None and not args.checkpoint_dir:
        refuse(p, "--hold-save", "a step of a run that saves (give --checkpoint-dir too)")
    if args.save_every and not args.checkpoint_dir:
        refuse(p, "--save-every", "a period of a run that saves (give --checkpoint-dir too)")
    return args


def is_loopback(address: str | None) -> bool:
    """True when ``HOST:PORT`` names this machine only (a local, simulated run)."""
    if address is None:
        return False
    host = address.rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1")


def first_attempt() -> bool:
    """False in a job that Slurm has requeued: it sets ``SLURM_RESTART_COUNT`` to 1, 2, ..."""
    return os.environ.get("SLURM_RESTART_COUNT", "0") in ("", "0")


def show_detection() -> None:
    """Print JAX's own log lines of ``jax.distributed.initialize`` (the address it chose).

    They are ``INFO`` records of the logger ``jax._src.distributed``, which JAX does not
    show by default; shown here only when JAX detects the job itself (under ``srun``).
    """
    log = logging.getLogger("jax._src.distributed")
    if any(getattr(h, "_shows_detection", False) for h in log.handlers):
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("jax: %(message)s"))
    handler._shows_detection = True  # type: ignore[attr-defined]
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    log.propagate = False  # jax 0.8's own handler on "jax" would print each line again


def connect(args: argparse.Namespace) -> None:
    """Join the job: ``jax.distributed.initialize`` (skipped for a one-process run).

    Must run before any JAX computation: the backend is created once, and it needs the
    distributed client to know about the other processes' devices. Only the flags given are
    passed on: under ``srun`` with none of them, the call is ``jax.distributed.initialize()``.
    """
    import jax

    if args.num_processes == 1 and args.coordinator is None:
        return  # a single process: nothing to join
    given = {"coordinator_address": args.coordinator, "num_processes": args.num_processes,
             "process_id": args.process_id, "initialization_timeout": args.init_timeout,
             "heartbeat_timeout_seconds": args.heartbeat_timeout}  # fmt: skip
    kwargs = {name: value for name, value in given.items() if value is not None}
    if is_loopback(args.coordinator):
        # Serve the coordinator on loopback only (JAX's default is every interface).
        kwargs["coordinator_bind_address"] = args.coordinator
    if args.simulated_devices:
        compat.gloo_on_loopback(is_loopback)
    if not kwargs.keys() & {"coordinator_address", "num_processes", "process_id"}:
        show_detection()  # as under `srun`: JAX reads all three from the cluster's environment
    jax.distributed.initialize(**kwargs)


def process_rows(sharding: Any, global_shape: tuple[int, ...]) -> list[slice]:
    """The rows of a batch of ``global_shape`` that this process must load under ``sharding``.

    They are the row blocks of this process's own (addressable) devices, in order, adjacent
    blocks merged: one block when the process's devices are neighbours along the batch
    axis (this script's meshes), several when they are not. Devices that hold the same rows
    (replicas, e.g. along ``model``) need them once.
    """
    blocks = sorted(
        {
            (idx[0].start or 0, global_shape[0] if idx[0].stop is None else idx[0].stop)
            for idx in sharding.addressable_devices_indices_map(global_shape).values()
        }
    )
    merged: list[list[int]] = []
    for start, stop in blocks:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([start, stop])
    return [slice(start, stop) for start, stop in merged]


def batch_rows(
    cfg: Any, seed: int, step: int, rows: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``rows`` of step ``step``'s global batch: inputs ``(len(rows), seq, d_model)`` and labels.

    Row ``r`` is drawn from its own seed ``(seed, step, r)``, so a process can make its rows
    without making the others, and every process (and a single process making all of them)
    gets the same numbers. Labels come from a fixed random "teacher" projection of each row,
    so that the task is learnable.
    """
    teacher = np.random.default_rng(TEACHER_SEED).standard_normal((cfg.d_model, cfg.n_classes))
    x = np.stack([
        np.random.default_rng((seed, step, r)).standard_normal((cfg.seq, cfg.d_model), np.float32)
        for r in rows
    ])  # fmt: skip
    return x, np.argmax(x.astype(np.float64) @ teacher, axis=-1).astype(np.int32)


def load_batch(cfg: Any, seed: int, step: int, x_sharding: Any, y_sharding: Any) -> tuple[Any, Any]:
    """Step ``step``'s global batch, of which this process makes only its own rows.

    ``process_rows`` says which rows this process's devices hold; it makes those and no
    others (a real data loader would read just those rows from its files), and
    ``make_array_from_process_local_data`` takes them, block after block, as this process's
    part of one global ``jax.Array``: no process holds the rest of the batch.
    """
    import jax

    shape = (cfg.batch, cfg.seq, cfg.d_model)
    rows = [r for block in process_rows(x_sharding, shape) for r in range(block.start, block.stop)]
    x_local, y_local = batch_rows(cfg, seed, step, rows)
    return (
        jax.make_array_from_process_local_data(x_sharding, x_local, shape),
        jax.make_array_from_process_local_data(y_sharding, y_local, shape[:2]),
    )


def model_config() -> Any:
    from helpers.placing.models import ModelConfig

    return ModelConfig(d_model=D_MODEL, d_ff=D_FF, n_layers=N_LAYERS, n_classes=N_CLASSES,
                       batch=GLOBAL_BATCH, seq=SEQ)  # fmt: skip


def make_optimizer() -> Any:
    import optax

    return optax.adam(LEARNING_RATE)


def fits(n_devices: int) -> bool:
    """Whether ``n_devices`` divide the global batch and ``d_model``, as the (n, 1) mesh needs."""
    return GLOBAL_BATCH % n_devices == 0 and D_MODEL % n_devices == 0


def global_mesh(layout: str) -> Any:
    """A ``("data", "model")`` mesh over every device of every process, shaped for ``layout``."""
    import jax

    from helpers.placing.devices import make_mesh, mesh_shape_for

    devices = jax.devices()  # every process's devices, not only this one's
    n = len(devices)
    if not fits(n):
        raise SystemExit(
            f"{n} devices must divide the global batch {GLOBAL_BATCH} and d_model {D_MODEL}"
        )
    shape = mesh_shape_for(n) if layout == "fsdp_tp" else (n, 1)
    return make_mesh(shape, ("data", "model"), devices=devices)


# ---------------------------------------------------------------------------
# Checkpoints: every process writes its own shards, one process commits
# ---------------------------------------------------------------------------

_SAVING: dict[str, int] = {}  # the step being saved, for the commit line
_HELD = contextlib.ExitStack()  # the fault drill's held saves


def open_checkpoints(directory: str, primary_host: int = 0) -> Any:
    """orbax's ``CheckpointManager`` over ``directory``, which every process must see.

    Every process makes the same calls. Each writes the shards its devices hold; once all
    have written (a barrier), the primary host alone commits the step: it renames
    ``<step>.orbax-checkpoint-tmp`` to ``<step>``. orbax calls ``post_finalization_callback``
    on the primary host only, just before that rename, so the line below names the committer.
    """
    import jax
    import orbax.checkpoint as ocp

    me = jax.process_index()

    def committing() -> None:
        print(f"process {me} commits step {_SAVING['step']}", flush=True)

    options = ocp.CheckpointManagerOptions(
        cleanup_tmp_directories=True,  # at open, remove debris of a killed save (<step>.orbax-checkpoint-tmp)
        multiprocessing_options=ocp.options.MultiprocessingOptions(primary_host=primary_host),
        async_options=ocp.options.AsyncOptions(post_finalization_callback=committing),
    )
    if "://" not in directory:  # orbax wants an absolute path (a gs:// URL stays as it is)
        directory = os.path.abspath(directory)
    return ocp.CheckpointManager(directory, options=options)


def save(mngr: Any, step: int, params: Any, opt_state: Any, hold: bool = False) -> None:
    """Start an asynchronous save of ``step``; it commits in the background.

    ``hold`` (the fault drill's ``--hold-save``): this process's part of the save never
    completes, and ``save`` returns once the step's temporary directory exists, so that a
    kill after it lands inside the save.
    """
    import orbax.checkpoint as ocp

    mngr.wait_until_finished()  # the previous save commits first (save() would wait too)
    _SAVING["step"] = step
    if hold:
        _HELD.enter_context(paused_writes())  # never left: this process is to be killed
    mngr.save(step, args=ocp.args.StandardSave({"params": params, "opt_state": opt_state}))
    if hold:
        wait_for_uncommitted(mngr.directory, step)


def restore_target(model: Any, optimizer: Any, x: Any, mesh: Any, layout: str) -> Any:
    """The train state as abstract arrays carrying ``layout``'s shardings on ``mesh``."""
    import flax.linen as nn
    import jax

    from helpers.placing.train import opt_state_shardings, param_shardings

    params = jax.eval_shape(lambda k: nn.meta.unbox(model.init(k, x)["params"]), jax.random.key(0))
    p_shardings = param_shardings(model, x, mesh, layout)
    abstract = {"params": params, "opt_state": jax.eval_shape(optimizer.init, params)}
    shardings = {
        "params": p_shardings,
        "opt_state": opt_state_shardings(optimizer, params, p_shardings, mesh),
    }
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
    )


def start_state(
    model: Any, optimizer: Any, x: Any, mesh: Any, layout: str, seed: int, mngr: Any
) -> tuple[Any, int]:
    """A fresh train state, or the newest committed checkpoint restored onto ``mesh``.

    Returns the state (``helpers.placing.train.ShardedState``) and the step it is at.
    """
    import jax

    from helpers.placing.train import ShardedState, init_sharded

    step = None if mngr is None else mngr.latest_step()  # committed steps only
    if step is None:
        return init_sharded(model, x, mesh, layout, jax.random.key(seed), optimizer), 0
    import orbax.checkpoint as ocp

    target = restore_target(model, optimizer, x, mesh, layout)
    back = mngr.restore(step, args=ocp.args.StandardRestore(target))
    shardings = jax.tree.map(lambda t: t.sharding, target)
    state = ShardedState(
        **back, param_shardings=shardings["params"], opt_shardings=shardings["opt_state"]
    )
    print(
        f"process {jax.process_index()} restored step {step} onto mesh {dict(mesh.shape)}",
        flush=True,
    )
    return state, step


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------


def train(args: argparse.Namespace) -> dict[str, Any]:
    """FSDP training over every device of every process, from step 0 or a checkpoint.

    The same code runs in every process, and in a single process: only ``jax.devices()``
    (all devices of the job) and ``process_rows`` (which rows are mine) differ.
    """
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from helpers.placing.train import make_train_step

    cfg, mesh = model_config(), global_mesh(args.layout)
    model, optimizer = cfg.model(), make_optimizer()
    x_shape = np.zeros((cfg.batch, cfg.seq, cfg.d_model), np.float32)  # init needs shapes only
    mngr = open_checkpoints(args.checkpoint_dir, args.primary_host) if args.checkpoint_dir else None
    state, start = start_state(model, optimizer, x_shape, mesh, args.layout, args.seed, mngr)
    step_fn = make_train_step(model, optimizer, mesh, state, args.layout)
    x_sharding = y_sharding = NamedSharding(mesh, P("data"))

    rows, me = process_rows(x_sharding, x_shape.shape), jax.process_index()
    print(
        f"process {me} of {jax.process_count()}: local devices "
        f"{[d.id for d in jax.local_devices()]} of {mesh.size} global; loads rows "
        f"{', '.join(f'{b.start}:{b.stop}' for b in rows)} of each global batch of {cfg.batch}",
        flush=True,
    )
    params, opt_state, losses = state.params, state.opt_state, []
    for step in range(start + 1, args.steps + 1):
        x, labels = load_batch(cfg, args.seed + 1, step, x_sharding, y_sharding)
        params, opt_state, loss = step_fn(params, opt_state, x, labels)
        losses.append(float(loss))  # the loss is replicated: every process holds all of it
        if step % args.log_every == 0 or step == args.steps:
            print(f"step {step:>3}  loss {losses[-1]:.6f}", flush=True)
        if mngr is not None and args.save_every and step % args.save_every == 0:
            save(mngr, step, params, opt_state, hold=step == args.hold_save and first_attempt())
            print(f"process {me} started the save of step {step}", flush=True)
    if mngr is not None:
        mngr.wait_until_finished()  # a save counts once it is committed
        mngr.close()
    steps = list(range(start + 1, args.steps + 1))
    state = {"params": params, "opt_state": opt_state}
    return {"losses": losses, "steps": steps, "start": start, "state": state, "mesh": mesh}


# ---------------------------------------------------------------------------
# What the notebook reads back
# ---------------------------------------------------------------------------


def save_results(path: str, run: dict[str, Any]) -> None:
    """Gather the final train state to every host and write it with the losses (process 0)."""
    import jax
    from jax.experimental import multihost_utils

    from helpers.placing.sharding import path_str

    # What process 0's first device holds of each parameter, read before the gather.
    shards = {
        "shard/" + path_str(p): np.array(v.addressable_shards[0].data.shape, np.int64)
        for p, v in jax.tree_util.tree_flatten_with_path(run["state"]["params"])[0]
    }
    # A collective: every process must call it, even those that write nothing.
    full = multihost_utils.process_allgather(run["state"], tiled=True)
    if jax.process_index() != 0:
        return
    flat = {
        "state/" + path_str(p): np.asarray(v)
        for p, v in jax.tree_util.tree_flatten_with_path(full)[0]
    }
    mesh_devices = list(run["mesh"].devices.flat)
    np.savez(
        path,
        losses=np.asarray(run["losses"], np.float64),
        steps=np.asarray(run["steps"], np.int64),
        restored_step=run["start"],
        num_processes=jax.process_count(),
        mesh_shape=np.array(run["mesh"].devices.shape),
        mesh_device_ids=np.array([d.id for d in mesh_devices]),
        mesh_process_index=np.array([d.process_index for d in mesh_devices]),
        **shards,
        **flat,
    )
    print(
        f"process 0 wrote {len(flat)} arrays and {len(run['losses'])} losses to {path}", flush=True
    )


def draw_global_mesh(path: str, mesh: Any) -> None:
    """Process 0 draws the global mesh: every device, framed by the process that owns it."""
    import jax

    if jax.process_index() != 0:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from helpers.drawing.draw import draw_mesh

    ax = draw_mesh(mesh)
    fig = getattr(ax, "figure", ax)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import jax

    if args.simulated_devices:
        # Before anything starts JAX's backend: afterwards the count cannot change.
        from helpers import compat

        compat.cpu_backend_flags()  # a late simulated device must not abort the run
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", args.simulated_devices)
    connect(args)
    run = train(args)
    if args.out:
        save_results(args.out, run)
    if args.mesh_figure:
        draw_global_mesh(args.mesh_figure, run["mesh"])
    print(f"process {jax.process_index()} done", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
