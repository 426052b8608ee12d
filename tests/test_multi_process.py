"""Tests for ``helpers.cluster.multiprocess``, the script every process of a JAX job runs.

Its pieces first (no job): how it joins a job, which rows a process loads, and the private
gloo API it relies on failing clearly when a jax upgrade moves it. Then real jobs of two
processes x 4 simulated devices (gloo on loopback): one started the way ``srun`` starts it
trains what one process with 8 devices trains and checkpoints with orbax (each process its
own shards, process 0 commits); that checkpoint restores bitwise in one process on other
layouts; and a process killed in the middle of a save loses nothing: the survivor stops in
bounded time, the partial step is never listed, and a restart continues exactly.

The jobs take a while on a 2-core machine (each process imports JAX and compiles), so they
are small (4 steps) and each runs once per session, even with pytest-xdist's workers. Every
launch has its own timeout, and every launched process is ended by its pid.
"""

from __future__ import annotations

import shutil
import signal
import socket
import sys
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from children import once_per_session
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from helpers import compat, make_mesh
from helpers.cluster import launcher
from helpers.cluster import multiprocess as mp
from helpers.cluster.launcher import still_alive
from helpers.placing.sharding import path_str

ocp = pytest.importorskip("orbax.checkpoint")

JOB_TIMEOUT_S = 300  # per launch of real JAX processes, generous for a busy machine
HEARTBEAT_S = 5
STEPS, SAVE_EVERY = 4, 2
DEATH_SIGNS = (
    "detected fatal errors",
    "heartbeat timeout",
    "Connection reset by peer",
    "Connection closed by peer",
)


# ---------------------------------------------------------------------------
# Small pieces, no JAX job
# ---------------------------------------------------------------------------


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
    assert calls == [((), {})]  # jax.distributed.initialize(), with no arguments

    calls.clear()
    mp.connect(mp.parse_args(["--num-processes", "1"]))  # one process: no distributed runtime
    assert calls == []

    mp.connect(mp.parse_args(["--coordinator", "10.0.0.1:1234", "--num-processes", "2",
                              "--process-id", "1", "--heartbeat-timeout", "7",
                              "--init-timeout", "60"]))  # fmt: skip
    assert calls == [((), {"coordinator_address": "10.0.0.1:1234", "num_processes": 2,
                           "process_id": 1, "initialization_timeout": 60,
                           "heartbeat_timeout_seconds": 7})]  # fmt: skip

    calls.clear()
    mp.connect(mp.parse_args(["--coordinator", "127.0.0.1:4321", "--num-processes", "2",
                              "--process-id", "0"]))  # fmt: skip
    assert calls[0][1]["coordinator_bind_address"] == "127.0.0.1:4321"  # loopback only


def test_the_command_line_and_the_device_counts_it_fits():
    args = mp.parse_args(["--checkpoint-dir", "/ckpt", "--save-every", "3", "--hold-save", "6",
                          "--layout", "fsdp_tp", "--primary-host", "1"])  # fmt: skip
    assert (args.checkpoint_dir, args.save_every, args.hold_save) == ("/ckpt", 3, 6)
    assert (args.layout, args.primary_host, args.steps) == ("fsdp_tp", 1, 3)
    with pytest.raises(SystemExit):
        mp.parse_args(["--layout", "tp"])  # not a layout the script trains
    # The global batch (32) and d_model (64) must split over every device of the job.
    assert [n for n in range(1, 65) if mp.fits(n)] == [1, 2, 4, 8, 16, 32]


def test_process_rows_of_a_single_process_is_the_whole_batch():
    mesh = make_mesh((8, 1), ("data", "model"))
    assert mp.process_rows(NamedSharding(mesh, P("data")), (32, 8, 64)) == [slice(0, 32)]


def test_process_rows_gives_each_block_once_in_order_and_merges_neighbours():
    # Devices of one process at rows 8:12 and 0:4 (two blocks), two replicas of 0:4, and
    # blocks 12:16 and 16:20 that touch (one block).
    blocks = {0: (slice(8, 12),), 1: (slice(0, 4),), 2: (slice(0, 4),), 3: (slice(12, 16),),
              4: (slice(16, 20),), 5: (slice(None, 4),)}  # fmt: skip
    fake = SimpleNamespace(addressable_devices_indices_map=lambda shape: blocks)
    assert mp.process_rows(fake, (32,)) == [slice(0, 4), slice(8, 20)]


def test_batch_rows_makes_any_rows_alone_exactly_as_with_all_the_others():
    cfg = mp.model_config()
    x_all, y_all = mp.batch_rows(cfg, 1, 3, range(cfg.batch))
    x_some, y_some = mp.batch_rows(cfg, 1, 3, [5, 20, 21])
    assert x_all.shape == (cfg.batch, cfg.seq, cfg.d_model) and x_all.dtype == np.float32
    assert np.array_equal(x_some, x_all[[5, 20, 21]]) and np.array_equal(y_some, y_all[[5, 20, 21]])
    assert y_all.dtype == np.int32 and set(np.unique(y_all)) <= set(range(cfg.n_classes))
    assert not np.array_equal(mp.batch_rows(cfg, 1, 4, [5])[0], x_all[[5]])  # another step


def test_gloo_on_loopback_registers_a_cpu_factory(monkeypatch):
    from jax._src import xla_bridge

    calls = []
    monkeypatch.setattr(xla_bridge, "register_backend_factory", lambda *a, **k: calls.append(a))
    compat.gloo_on_loopback(mp.is_loopback)
    assert [c[0] for c in calls] == ["cpu"] and callable(calls[0][1])


def test_gloo_on_loopback_fails_clearly_when_jax_moves_its_private_api(monkeypatch):
    from jax._src import distributed, xla_bridge
    from jax._src.lib import _jax

    registered = []
    monkeypatch.setattr(
        xla_bridge, "register_backend_factory", lambda *a, **k: registered.append(a)
    )
    with monkeypatch.context() as m:  # a jax where the gloo factory moved
        m.delattr(_jax, "make_gloo_tcp_collectives")
        with pytest.raises(RuntimeError, match=rf"jax {jax.__version__} has no "
                           r"jax\._src\.lib\._jax\.make_gloo_tcp_collectives\. .*Nothing was changed"):  # fmt: skip
            compat.gloo_on_loopback(mp.is_loopback)
    with monkeypatch.context() as m:  # ... or the distributed state lost an attribute
        m.setattr(distributed, "global_state", SimpleNamespace(client=None))
        with pytest.raises(RuntimeError, match=r"global_state\.coordinator_address"):
            compat.gloo_on_loopback(mp.is_loopback)
    with monkeypatch.context() as m:  # ... or a module is gone
        m.setitem(sys.modules, "jax._src.lib", None)
        with pytest.raises(RuntimeError, match=r"has no the module jax\._src\.lib"):
            compat.gloo_on_loopback(mp.is_loopback)
    assert registered == []  # nothing was half-done


# ---------------------------------------------------------------------------
# Real JAX jobs, each run once per session (shared by pytest-xdist's workers)
# ---------------------------------------------------------------------------


def _outcome(run: launcher.LaunchResult) -> dict:
    assert still_alive(run.pids) == [], "a launched process outlived its launch"
    return {"lines": [p.lines for p in run.processes], "status": [p.status for p in run.processes],
            "returncodes": [p.returncode for p in run.processes],
            "ended_by": [p.ended_by for p in run.processes],
            "ended_at_s": [p.ended_at_s for p in run.processes],
            "killed": run.killed, "killed_at_s": run.killed_at_s, "timed_out": run.timed_out}  # fmt: skip


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One process with all 8 simulated devices: what the two-process runs must match."""

    def run(d: Path) -> dict:
        out = str(d / "reference.npz")
        args = ["--steps", str(STEPS), "--out", out]
        return _outcome(
            launcher.launch_single(8, args, timeout_s=JOB_TIMEOUT_S, echo=False).check()
        )

    return once_per_session(tmp_path_factory, "reference", run)


def _free_slurm_job_id() -> tuple[int, int]:
    # JAX derives the coordinator's port from the job id (61440 + id % 4096).
    for job_id in range(4096):
        port = 61440 + job_id
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", port))
            return job_id, port
        except OSError:
            continue
    raise RuntimeError("no free port in 61440..65535 for a SLURM-style job")  # pragma: no cover


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two processes started as `srun` starts them (SLURM variables only), checkpointing."""

    def run(d: Path) -> dict:
        job_id, port = _free_slurm_job_id()
        args = ["--simulated-devices", "4", "--steps", str(STEPS), "--save-every", str(SAVE_EVERY),
                "--checkpoint-dir", str(d / "checkpoints"), "--out", str(d / "trained.npz"),
                "--heartbeat-timeout", str(HEARTBEAT_S), "--init-timeout", "120"]  # fmt: skip
        commands = [
            ["env", f"SLURM_JOB_ID={job_id}", "SLURM_STEP_NODELIST=127.0.0.1", "SLURM_NTASKS=2",
             f"SLURM_PROCID={i}", f"SLURM_LOCALID={i}",
             f"JAX_COORDINATOR_BIND_ADDRESS=127.0.0.1:{port}", *launcher.script_command(*args)]
            for i in (0, 1)
        ]  # fmt: skip
        job = launcher.launch(
            commands, timeout_s=JOB_TIMEOUT_S, echo=False, env=launcher.local_env()
        )
        return _outcome(job.check())

    return once_per_session(tmp_path_factory, "trained", run)


def test_a_job_started_by_slurm_trains_what_one_process_trains(trained, reference):
    lines = trained["lines"]
    assert any(line.startswith("process 1 of 2:") for line in lines[1])
    # Each process loads its own half of every batch, and both see the same losses.
    assert any("loads rows 0:16 of each global batch of 32" in line for line in lines[0])
    assert any("loads rows 16:32 of each global batch of 32" in line for line in lines[1])
    steps = [[line for line in lines[i] if line.startswith("step")] for i in (0, 1)]
    assert len(steps[0]) == STEPS and steps[0] == steps[1]

    result = launcher.load_results(trained["dir"] / "trained.npz")
    ref = launcher.load_results(reference["dir"] / "reference.npz")
    assert list(result["mesh_process_index"]) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert result["steps"].tolist() == ref["steps"].tolist() == list(range(1, STEPS + 1))
    np.testing.assert_allclose(result["losses"], ref["losses"], rtol=1e-5, atol=1e-5)
    assert result["params"].keys() == ref["params"].keys() and len(result["params"]) == 16
    for k, v in result["state"].items():  # parameters and Adam's moments alike
        np.testing.assert_allclose(v, ref["state"][k], rtol=1e-5, atol=1e-5, err_msg=k)


def test_each_process_writes_its_own_shards_and_process_0_commits(trained):
    directory = trained["dir"] / "checkpoints"
    assert sorted(p.name for p in directory.iterdir()) == ["2", "4"]
    for step in ("2", "4"):
        item = directory / step / "default"
        for i in (0, 1):  # each process's shards, in its own OCDBT store
            data = [f for f in (item / f"ocdbt.process_{i}").rglob("*") if f.is_file()]
            assert sum(f.stat().st_size for f in data) > 100_000, (step, i)
        # Written once, by the primary host: the tree, the shardings, the index of both stores.
        assert all((item / name).is_file() for name in ("_METADATA", "_sharding", "manifest.ocdbt"))
    lines = trained["lines"]
    assert [ln for ln in lines[0] if "commits step" in ln] == ["process 0 commits step 2",
                                                               "process 0 commits step 4"]  # fmt: skip
    assert not [ln for ln in lines[1] if "commits step" in ln]


@pytest.mark.parametrize(("n", "layout"), [(8, "fsdp"), (4, "fsdp_tp"), (4, "dp")])
def test_the_checkpoint_of_two_processes_restores_bitwise_in_one(trained, n, layout):
    saved = launcher.load_results(trained["dir"] / "trained.npz")["state"]
    cfg = mp.model_config()
    model, optimizer = cfg.model(), mp.make_optimizer()
    x = np.zeros((cfg.batch, cfg.seq, cfg.d_model), np.float32)
    shape = (2, 2) if layout == "fsdp_tp" else (n, 1)
    mesh = make_mesh(shape, ("data", "model"), devices=jax.devices()[:n])
    target = mp.restore_target(model, optimizer, x, mesh, layout)
    with ocp.CheckpointManager(trained["dir"] / "checkpoints") as mngr:
        assert mngr.all_steps() == [2, 4]
        back = mngr.restore(STEPS, args=ocp.args.StandardRestore(target))
    flat = {path_str(p): v for p, v in jax.tree_util.tree_flatten_with_path(back)[0]}
    assert flat.keys() == saved.keys()
    for k, v in flat.items():
        assert v.dtype == saved[k].dtype and np.array_equal(np.asarray(v), saved[k]), k
        assert {d.id for d in v.devices()} <= set(range(n))
    kernel = back["params"]["block_0"]["up"]["kernel"]  # (64, 256): embed x mlp
    expected = {"fsdp": (64 // n, 256), "fsdp_tp": (32, 128), "dp": (64, 256)}[layout]
    assert kernel.sharding.shard_shape(kernel.shape) == expected


@pytest.fixture(scope="module")
def killed_mid_save(tmp_path_factory):
    """Process 1 is killed while its part of the save of step 4 is in flight."""

    def run(d: Path) -> dict:
        args = ["--steps", "300", "--save-every", str(SAVE_EVERY), "--log-every", str(SAVE_EVERY),
                "--checkpoint-dir", str(d / "checkpoints")]  # fmt: skip
        drill = launcher.launch_local(
            2, 4, args, per_process={1: ["--hold-save", "4"]},
            kill=(1, r"started the save of step 4$"), heartbeat_timeout_s=HEARTBEAT_S,
            timeout_s=JOB_TIMEOUT_S, echo=False,
        )  # fmt: skip
        return _outcome(drill)

    return once_per_session(tmp_path_factory, "killed_mid_save", run)


def test_a_process_killed_mid_save_stops_the_job_and_leaves_the_last_commit(killed_mid_save):
    drill = killed_mid_save
    assert drill["killed"] == 1 and not drill["timed_out"]
    assert (
        drill["ended_by"][1] == "killed on purpose" and drill["returncodes"][1] == -signal.SIGKILL
    )
    # The survivor was stopped by JAX itself (not by the launcher), with an error that says why.
    assert drill["ended_by"][0] == "exited" and drill["returncodes"][0] != 0, drill["status"]
    assert drill["ended_at_s"][0] - drill["killed_at_s"] < 3 * HEARTBEAT_S + 10
    assert any(sign in line for line in drill["lines"][0] for sign in DEATH_SIGNS)
    assert not any("commits step 4" in line for line in drill["lines"][0])

    directory = drill["dir"] / "checkpoints"
    names = sorted(p.name for p in directory.iterdir())
    assert names[0] == "2" and len(names) == 2 and names[1].startswith("4.orbax-checkpoint-tmp")
    with ocp.CheckpointManager(
        directory, options=ocp.CheckpointManagerOptions(read_only=True)
    ) as m:
        assert m.all_steps() == [2] and m.latest_step() == 2  # the partial step is never listed


def test_a_restart_after_the_kill_trains_exactly_as_the_uninterrupted_job(
    killed_mid_save, trained, tmp_path
):
    # A copy, so that the drill's own directory stays as the kill left it for the other test.
    directory = tmp_path / "checkpoints"
    shutil.copytree(killed_mid_save["dir"] / "checkpoints", directory)
    out = tmp_path / "resumed.npz"
    args = ["--steps", str(STEPS), "--save-every", str(SAVE_EVERY), "--checkpoint-dir",
            str(directory), "--out", str(out)]  # fmt: skip
    resumed = launcher.launch_local(2, 4, args, timeout_s=JOB_TIMEOUT_S, echo=False).check()
    assert still_alive(resumed.pids) == []
    assert any("restored step 2" in line for line in resumed.lines_of(1))
    got, uninterrupted = (
        launcher.load_results(out),
        launcher.load_results(trained["dir"] / "trained.npz"),
    )
    assert got["restored_step"] == 2 and got["steps"].tolist() == [3, 4]
    assert got["losses"].tolist() == uninterrupted["losses"][2:].tolist()  # bit for bit
    for k, v in got["state"].items():
        assert np.array_equal(v, uninterrupted["state"][k]), k
    assert sorted(p.name for p in directory.iterdir()) == ["2", "4"]  # the debris is gone
