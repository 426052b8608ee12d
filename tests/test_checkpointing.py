"""helpers.cluster.checkpoint, and the orbax guarantees notebook 06 teaches, on 8 simulated CPU devices.

Besides the helpers themselves, these tests pin down what the notebook relies on, so that an
orbax upgrade that changes it fails here first: a sharded train state saved on 8-device
FSDP comes back bitwise equal on other layouts; a save that fails, or whose process is
killed, before its commit leaves the previous checkpoint restorable; ``close()`` finishes
an asynchronous save, and a script that ends without it loses that checkpoint.
"""
# The devices must be set before any other JAX use, so imports follow that call.
# ruff: noqa: E402

from helpers import use_simulated_devices

use_simulated_devices(8, quiet=True)

import logging
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from helpers import make_mesh
from helpers.cluster.checkpoint import (
    TMP_SUFFIX,
    checkpoint_files,
    failing_writes,
    format_checkpoint_files,
    format_saved_layout,
    paused_writes,
    saved_layout,
    wait_for_uncommitted,
)
from helpers.placing.models import ModelConfig, synthetic_batch
from helpers.placing.train import init_sharded, opt_state_shardings, param_shardings

ocp = pytest.importorskip("orbax.checkpoint")


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def _abstract(tree, shardings=None):
    """ShapeDtypeStructs of ``tree``, with ``shardings`` (default: the arrays' own)."""
    if shardings is None:
        shardings = jax.tree.map(lambda a: a.sharding, tree)
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shardings
    )


def _bitwise_equal(a_tree, b_tree) -> bool:
    same = jax.tree.map(
        lambda a, b: (
            np.asarray(a).dtype == np.asarray(b).dtype
            and np.array_equal(np.asarray(a), np.asarray(b))
        ),
        a_tree,
        b_tree,
    )
    return all(jax.tree.leaves(same))


@pytest.fixture(scope="module")
def mesh8():
    return make_mesh((8, 1), ("data", "model"))


def _small_state(mesh, value: float):
    """A sharded kernel, a replicated vector and a step counter, all derived from ``value``."""
    w = jnp.arange(64 * 32, dtype=jnp.float32).reshape(64, 32) + value
    return {
        "w": jax.device_put(w, NamedSharding(mesh, P("data"))),
        "b": jax.device_put(jnp.full((32,), value, jnp.float32), NamedSharding(mesh, P())),
        "step": jnp.asarray(int(value), jnp.int32),
    }


# ---------------------------------------------------------------------------
# What lands on disk
# ---------------------------------------------------------------------------


def test_checkpoint_files_and_listing(tmp_path):
    (tmp_path / "3" / "default" / "d").mkdir(parents=True)
    (tmp_path / "3" / "commit_success.txt").write_text("ok")
    (tmp_path / "3" / "default" / "_METADATA").write_bytes(b"x" * 100)
    for i, size in enumerate((1000, 24)):
        (tmp_path / "3" / "default" / "d" / f"{i:032x}").write_bytes(b"y" * size)

    files = checkpoint_files(tmp_path)
    assert files == {
        "3/commit_success.txt": 2,
        "3/default/_METADATA": 100,
        "3/default/d/" + f"{0:032x}": 1000,
        "3/default/d/" + f"{1:032x}": 24,
    }
    listing = format_checkpoint_files(tmp_path)
    lines = [line.split() for line in listing.splitlines()]
    assert lines[0][0] == f"{tmp_path.name}/" and lines[0][-3:] == ["in", "4", "files"]
    assert ["<2", "data", "files>", "1.0", "KiB"] in lines  # hashed names folded: 1024 B together
    assert not any(f"{0:032x}" in line for line in listing.splitlines())
    assert ["_METADATA", "100", "B"] in lines
    assert len(format_checkpoint_files(tmp_path, max_depth=1).splitlines()) == 2  # root and 3/
    # max_depth=2 lists one level more: 3/'s entries, with default/ as its summary line only.
    two = [line.split()[0] for line in format_checkpoint_files(tmp_path, max_depth=2).splitlines()]
    assert two == [f"{tmp_path.name}/", "3/", "default/", "commit_success.txt"]
    three = format_checkpoint_files(tmp_path, max_depth=3)
    assert "_METADATA" in three and "d/" in three and "data files>" not in three
    with pytest.raises(FileNotFoundError):
        checkpoint_files(tmp_path / "missing")


def test_saved_layout_records_spec_mesh_and_chunks(tmp_path, mesh8):
    with ocp.CheckpointManager(tmp_path) as mngr:
        mngr.save(1, args=ocp.args.StandardSave(_small_state(mesh8, 1.0)))
        mngr.wait_until_finished()
        layout = {a.path: a for a in saved_layout(mngr.item_metadata(1))}
        table = format_saved_layout(mngr.item_metadata(1))

    w, b = layout["w"], layout["b"]
    assert (w.shape, w.dtype, w.saved_spec) == ((64, 32), "float32", ("data",))
    assert w.saved_mesh == {"data": 8, "model": 1}
    assert w.chunk_shape == (8, 32) and w.chunks == 8  # one chunk per device's shard
    assert b.saved_spec == () and b.chunks * int(np.prod(b.chunk_shape)) == 32  # written once
    assert "P('data')" in table and "saved from mesh {'data': 8, 'model': 1}" in table
    with pytest.raises(ValueError, match="no saved array"):
        format_saved_layout(mngr.item_metadata(1), prefix="nothing/")


# ---------------------------------------------------------------------------
# Save on 8-device FSDP, restore elsewhere
# ---------------------------------------------------------------------------

CFG = ModelConfig(d_model=64, d_ff=128, n_layers=1, n_classes=8, batch=16, seq=4)


@pytest.fixture(scope="module")
def saved_train_state(mesh8, tmp_path_factory):
    """The train state of an FSDP model on 8 devices, saved at step 1.

    Returns (directory, host copy of the state, model, x, optimizer). Adam's moments are
    filled with values that differ per element (from the parameters), so that a block
    restored to the wrong place cannot pass for the right one.
    """
    model, optimizer = CFG.model(), optax.adam(1e-2)
    x, _ = synthetic_batch(jax.random.key(0), CFG)
    st = init_sharded(model, x, mesh8, "fsdp", jax.random.key(1), optimizer)
    adam, rest = st.opt_state[0], st.opt_state[1:]
    adam = adam._replace(
        count=adam.count + 7,
        mu=jax.tree.map(lambda p: 0.5 * p + 0.25, st.params),
        nu=jax.tree.map(lambda p: p * p, st.params),
    )
    state = {"params": st.params, "opt_state": (adam, *rest), "step": jnp.asarray(1, jnp.int32)}
    placed_like_init = jax.tree.map(
        lambda a, s: a.sharding.is_equivalent_to(s, a.ndim), state["opt_state"], st.opt_shardings
    )
    assert all(jax.tree.leaves(placed_like_init))
    directory = tmp_path_factory.mktemp("fsdp8")
    with ocp.CheckpointManager(directory) as mngr:
        mngr.save(1, args=ocp.args.StandardSave(state))
    return directory, jax.tree.map(np.asarray, state), model, x, optimizer


LAYOUTS = {
    "same FSDP 8": ((8, 1), 8, "fsdp"),
    "FSDP on the first 4 devices": ((4, 1), 4, "fsdp"),
    "DP 8": ((8, 1), 8, "dp"),
    "FSDP x TP (4, 2)": ((4, 2), 8, "fsdp_tp"),
}


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda s: s.replace(" ", "_"))
def test_restore_onto_another_layout_is_bitwise_equal(saved_train_state, layout):
    directory, expected, model, x, optimizer = saved_train_state
    shape, n_devices, rules = LAYOUTS[layout]
    mesh = make_mesh(shape, ("data", "model"), devices=jax.devices()[:n_devices])
    abstract_params = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), expected["params"]
    )
    p_shardings = param_shardings(model, x, mesh, rules)
    shardings = {
        "params": p_shardings,
        "opt_state": opt_state_shardings(optimizer, abstract_params, p_shardings, mesh),
        "step": NamedSharding(mesh, P()),
    }
    target = _abstract(expected, shardings)
    with ocp.CheckpointManager(directory) as mngr:
        restored = mngr.restore(1, args=ocp.args.StandardRestore(target))

    assert jax.tree.structure(restored) == jax.tree.structure(target)
    assert _bitwise_equal(restored, expected)
    placed = jax.tree.map(
        lambda r, t: r.sharding.is_equivalent_to(t.sharding, r.ndim), restored, target
    )
    assert all(jax.tree.leaves(placed))
    used = {d.id for a in jax.tree.leaves(restored) for d in a.devices()}
    assert used == set(range(n_devices))
    kernel = restored["params"]["block_0"]["up"]["kernel"]  # (64, 128): embed x mlp
    expected_shard = {
        "fsdp": (64 // shape[0], 128),
        "dp": (64, 128),
        "fsdp_tp": (64 // shape[0], 128 // shape[1]),
    }
    assert kernel.sharding.shard_shape(kernel.shape) == expected_shard[rules]


# ---------------------------------------------------------------------------
# Nothing lost
# ---------------------------------------------------------------------------


def test_paused_writes_holds_the_commit_until_the_block_ends(tmp_path, mesh8):
    original = ocp.type_handlers.get_type_handler(jax.Array)
    with ocp.CheckpointManager(tmp_path) as mngr:
        with paused_writes():
            mngr.save(1, args=ocp.args.StandardSave(_small_state(mesh8, 1.0)))
            time.sleep(0.2)  # time enough for an unpaused save of these few KiB to commit
            assert wait_for_uncommitted(tmp_path, 1).name.startswith("1" + TMP_SUFFIX)
            assert mngr.is_saving_in_progress()
            assert not (tmp_path / "1").exists()
        mngr.wait_until_finished()
        assert not mngr.is_saving_in_progress()
        assert _names(tmp_path) == ["1"] and mngr.all_steps() == [1]
    assert ocp.type_handlers.get_type_handler(jax.Array) is original


def test_wait_written_waits_for_the_array_data_but_not_the_commit(tmp_path, mesh8):
    state = {"w": jax.device_put(jax.random.normal(jax.random.key(0), (512, 256)),
                                 NamedSharding(mesh8, P("data")))}  # fmt: skip
    with ocp.CheckpointManager(tmp_path) as mngr:
        with paused_writes() as paused:
            with pytest.raises(ValueError, match="no save started"):
                paused.wait_written()
            mngr.save(1, args=ocp.args.StandardSave(state))
            assert paused.wait_written(timeout=60) >= 1
            held = checkpoint_files(tmp_path)
            assert mngr.is_saving_in_progress() and not (tmp_path / "1").exists()
            assert all(path.startswith("1" + TMP_SUFFIX) for path in held)
        mngr.wait_until_finished()
    committed = checkpoint_files(tmp_path)

    def array_data(files):
        return sum(size for path, size in files.items() if "/ocdbt.process_" in path)

    # 512 KiB of random floats do not compress: all of it was on disk before the commit.
    assert array_data(held) == array_data(committed) > 400 * 1024
    assert _names(tmp_path) == ["1"]


def _failed_save_then_restart(directory: Path, mesh, cleanup: bool) -> list[str]:
    """Step 1 saved, step 2 failed, then a restarted job saves step 3: what is left."""
    with ocp.CheckpointManager(directory) as mngr:
        mngr.save(1, args=ocp.args.StandardSave(_small_state(mesh, 1.0)))
        mngr.wait_until_finished()
        with failing_writes():
            mngr.save(2, args=ocp.args.StandardSave(_small_state(mesh, 2.0)))
            with pytest.raises(OSError):
                mngr.wait_until_finished()
    options = ocp.CheckpointManagerOptions(cleanup_tmp_directories=cleanup)
    with ocp.CheckpointManager(directory, options=options) as restarted:
        restarted.save(3, args=ocp.args.StandardSave(_small_state(mesh, 3.0)))
    return _names(directory)


def test_only_cleanup_removes_the_debris_of_a_step_not_saved_again(tmp_path, mesh8):
    """Notebook 06 section 6: the restart saves another step, so only the option clears the
    failed step's temporary directory (a save of the same step would remove it anyway)."""
    kept = _failed_save_then_restart(tmp_path / "off", mesh8, cleanup=False)
    assert len(kept) == 3 and {"1", "3"} <= set(kept)
    assert any(n.startswith("2" + TMP_SUFFIX) for n in kept)  # the debris stayed
    assert _failed_save_then_restart(tmp_path / "on", mesh8, cleanup=True) == ["1", "3"]


def test_a_second_save_of_the_failed_step_removes_its_debris_without_cleanup(tmp_path, mesh8):
    """Why notebook 06 must not restart at the failed step: orbax's own save of step 2
    deletes the leftover ``2.orbax-checkpoint-tmp`` first (``_create_tmp_directory``)."""
    with ocp.CheckpointManager(tmp_path) as mngr:
        with failing_writes():
            mngr.save(2, args=ocp.args.StandardSave(_small_state(mesh8, 2.0)))
            with pytest.raises(OSError):
                mngr.wait_until_finished()
    assert any(n.startswith("2" + TMP_SUFFIX) for n in _names(tmp_path))
    with ocp.CheckpointManager(tmp_path) as mngr:  # cleanup_tmp_directories is off by default
        mngr.save(2, args=ocp.args.StandardSave(_small_state(mesh8, 2.0)))
    assert _names(tmp_path) == ["2"]


def test_failed_save_leaves_previous_checkpoint_restorable(tmp_path, mesh8):
    good = _small_state(mesh8, 1.0)
    expected = jax.tree.map(np.asarray, good)
    absl_filters = list(logging.getLogger("absl").filters)
    original = ocp.type_handlers.get_type_handler(jax.Array)

    mngr = ocp.CheckpointManager(tmp_path)
    mngr.save(1, args=ocp.args.StandardSave(good))
    mngr.wait_until_finished()
    with failing_writes() as injected:
        mngr.save(2, args=ocp.args.StandardSave(_small_state(mesh8, 2.0)))  # returns normally
        with pytest.raises(OSError, match="No space left on device") as raised:
            mngr.wait_until_finished()
    assert raised.value is injected
    mngr.close()
    assert ocp.type_handlers.get_type_handler(jax.Array) is original
    assert logging.getLogger("absl").filters == absl_filters

    # On disk: step 1 committed, step 2 only a temporary directory.
    names = _names(tmp_path)
    assert "1" in names and "2" not in names and any(n.startswith("2" + TMP_SUFFIX) for n in names)

    # A restarted job sees step 1 only and gets it back bitwise.
    options = ocp.CheckpointManagerOptions(cleanup_tmp_directories=True)
    with ocp.CheckpointManager(tmp_path, options=options) as restarted:
        assert restarted.all_steps() == [1] and restarted.latest_step() == 1
        back = restarted.restore(1, args=ocp.args.StandardRestore(_abstract(good)))
        assert _bitwise_equal(back, expected)
        # Its first save waits for the clean-up it started: the debris is gone.
        restarted.save(3, args=ocp.args.StandardSave(_small_state(mesh8, 3.0)))
    assert _names(tmp_path) == ["1", "3"]


def test_failing_writes_custom_error_and_quiet_logs(tmp_path, mesh8, caplog):
    error = ConnectionError("storage went away (test)")
    with ocp.CheckpointManager(tmp_path) as mngr, caplog.at_level(logging.ERROR, logger="absl"):
        with failing_writes(error):
            mngr.save(1, args=ocp.args.StandardSave(_small_state(mesh8, 1.0)))
            with pytest.raises(ConnectionError):
                mngr.wait_until_finished()
        assert not [
            r for r in caplog.records if "storage went away" in r.getMessage() or r.exc_info
        ]
        with failing_writes(ValueError("loud failure (test)"), quiet=False):
            mngr.save(2, args=ocp.args.StandardSave(_small_state(mesh8, 2.0)))
            with pytest.raises(ValueError, match="loud failure"):
                mngr.wait_until_finished()
        assert any(r.exc_info and "loud failure" in str(r.exc_info[1]) for r in caplog.records)
    assert "1" not in _names(tmp_path) and "2" not in _names(tmp_path)


def test_keep_last_n_deletes_older_checkpoints(tmp_path, mesh8):
    options = ocp.CheckpointManagerOptions(preservation_policy=ocp.checkpoint_managers.LatestN(2))
    with ocp.CheckpointManager(tmp_path, options=options) as mngr:
        for step in range(1, 6):
            mngr.save(step, args=ocp.args.StandardSave({"step": jnp.asarray(step)}))
            assert mngr.all_steps() == list(range(max(1, step - 1), step + 1))
    assert _names(tmp_path) == ["4", "5"]


# Child processes: the same script, ended three ways. It runs on 2 simulated devices.
_CHILD = textwrap.dedent("""
    import sys, time
    from helpers import use_simulated_devices
    use_simulated_devices(2, quiet=True)
    import jax.numpy as jnp
    import orbax.checkpoint as ocp
    from helpers.cluster.checkpoint import paused_writes, wait_for_uncommitted

    directory, ending = sys.argv[1], sys.argv[2]
    mngr = ocp.CheckpointManager(directory)
    w = jnp.arange(1024 * 1024, dtype=jnp.float32).reshape(1024, 1024)
    if ending == "killed":
        mngr.save(1, args=ocp.args.StandardSave({"w": w}))
        mngr.wait_until_finished()
        with paused_writes():
            mngr.save(2, args=ocp.args.StandardSave({"w": w + 1}))
            wait_for_uncommitted(directory, 2)  # so that the kill lands mid-save
            print("SAVING 2", flush=True)
            time.sleep(600)  # killed here, mid-save
    mngr.save(1, args=ocp.args.StandardSave({"w": w}))
    if ending == "close":
        mngr.close()
    print("DONE", flush=True)
""")


def _start_child(tmp_path: Path, ending: str) -> tuple[subprocess.Popen, Path]:
    """Run ``_CHILD`` in a fresh Python; its stderr (orbax's logs) goes to ``<ending>.log``."""
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    directory = tmp_path / ending
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    with open(tmp_path / f"{ending}.log", "w") as log:  # the child keeps its own copy
        proc = subprocess.Popen(
            [sys.executable, str(script), str(directory), ending],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=env,
        )
    return proc, directory


def _wait_for_line(proc: subprocess.Popen, marker: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        line = proc.stdout.readline()
        if not line:  # the child ended before saying it
            raise AssertionError(f"child exited with {proc.wait()} before printing {marker!r}")
        if line.strip() == marker:
            return
    raise AssertionError(f"child did not print {marker!r} within {timeout} s")


def _stop(proc: subprocess.Popen) -> None:
    """Kill the child (by its pid) if it is still running, and reap it."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()


def test_killed_while_saving_keeps_previous_checkpoint(tmp_path):
    proc, directory = _start_child(tmp_path, "killed")
    try:
        _wait_for_line(proc, "SAVING 2", timeout=240)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        _stop(proc)

    names = _names(directory)
    assert "1" in names and "2" not in names and any(n.startswith("2" + TMP_SUFFIX) for n in names)
    mesh = make_mesh((8,), ("data",))
    target = {
        "w": jax.ShapeDtypeStruct(
            (1024, 1024), jnp.float32, sharding=NamedSharding(mesh, P("data"))
        )
    }
    with ocp.CheckpointManager(directory) as mngr:
        assert mngr.all_steps() == [1]
        back = mngr.restore(1, args=ocp.args.StandardRestore(target))
    assert np.array_equal(
        np.asarray(back["w"]), np.arange(1024 * 1024, dtype=np.float32).reshape(1024, 1024)
    )


def test_close_finishes_the_async_save_and_ending_without_it_loses_it(tmp_path):
    procs = {}
    for ending in ("close", "end"):  # both at once: each child spends seconds importing jax
        (tmp_path / ending).mkdir()
        procs[ending] = _start_child(tmp_path / ending, ending)
    exited = {}
    try:
        for ending, (proc, _) in procs.items():
            _wait_for_line(proc, "DONE", timeout=240)  # the script reached its last line
            try:  # close() finishes the save: allow a loaded machine time to write it
                exited[ending] = proc.wait(timeout=120 if ending == "close" else 15)
            except subprocess.TimeoutExpired:  # stuck in interpreter shutdown
                exited[ending] = None
    finally:
        for proc, _ in procs.values():
            _stop(proc)
    assert exited["close"] == 0
    assert _names(procs["close"][1]) == ["1"]
    # Without close() the save never commits: at interpreter shutdown orbax's background
    # thread either fails (the process exits 0) or waits for signals that never come (the
    # process hangs in shutdown). Either way only the temporary directory is left.
    assert exited["end"] in (0, None)
    assert [n for n in _names(procs["end"][1]) if not n.startswith("1" + TMP_SUFFIX)] == []


def test_listing_survives_files_vanishing_mid_listing(tmp_path):
    """A save in flight creates and deletes lock files while notebook 06 lists the folder."""
    import threading

    from helpers.cluster.checkpoint import checkpoint_files

    (tmp_path / "keep.bin").write_bytes(b"x" * 10)
    stop = threading.Event()

    def churn() -> None:
        i = 0
        while not stop.is_set():
            d = tmp_path / f"step_{i % 3}.orbax-checkpoint-tmp"
            d.mkdir(exist_ok=True)
            (d / "manifest.ocdbt.__lock").write_bytes(b"")
            (d / "manifest.ocdbt.__lock").unlink()
            d.rmdir()
            i += 1

    worker = threading.Thread(target=churn)
    worker.start()
    try:
        for _ in range(1000):
            assert checkpoint_files(tmp_path)["keep.bin"] == 10
    finally:
        stop.set()
        worker.join()


def test_wait_for_uncommitted_finds_the_temporary_directory_or_says_what_is_missing(tmp_path):
    (tmp_path / "3").mkdir()  # a committed step is not what it waits for
    with pytest.raises(TimeoutError, match=r"no 3\.orbax-checkpoint-tmp\* in .* after 0\.05 s"):
        wait_for_uncommitted(tmp_path, 3, timeout=0.05)
    tmp = tmp_path / f"3{TMP_SUFFIX}-1764590000"
    tmp.mkdir()
    assert wait_for_uncommitted(tmp_path, 3, timeout=0.05) == tmp
    (tmp_path / f"30{TMP_SUFFIX}").mkdir()
    assert wait_for_uncommitted(tmp_path, 3, timeout=0.0) == tmp  # not step 30's
    with pytest.raises(TimeoutError, match="no 4"):
        wait_for_uncommitted(tmp_path, 4, timeout=0.0)
