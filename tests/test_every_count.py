"""A collective-heavy training step at every device count from 1 to 8, each in a process of
its own (a process's device count is fixed once JAX starts).

This is the program that aborted jax 0.8.0 at 3, 5, 6 and 7 devices on a busy 2-core
machine (issue 25): XLA:CPU's in-process rendezvous kills the process (SIGABRT,
"Termination timeout ... exceeded") when one simulated device reaches an all-reduce a
minute after the others. ``use_simulated_devices`` now gives XLA:CPU ten minutes
(``helpers.compat.CPU_COLLECTIVE_FLAGS``). Each run has a timeout, so a real deadlock fails
its test in minutes instead of stalling the suite. CI runs this file in every matrix entry,
under ``-n auto`` like the rest
(the pinned and newest entries at 1, 3 and 8 devices only).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from children import run_jax_child

from helpers.compat import CPU_COLLECTIVE_FLAGS, avx512_deadlock_risk

ROOT = Path(__file__).resolve().parents[1]
# .ci/run's pinned and newest entries name fewer counts (EVERY_COUNT="1 3 8"), to keep CI under
# 45 minutes: the aborts of issue 25 were jax 0.8.0's (the oldest entry, which runs every count).
COUNTS = [int(c) for c in os.environ.get("EVERY_COUNT", "1 2 3 4 5 6 7 8").split()]


@pytest.mark.parametrize("count", COUNTS)
def test_dp_and_fsdp_transformer_steps_run_at_every_count(count, tmp_path):
    out = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    env.pop("XLA_FLAGS", None)  # the series' own flags, as a learner gets them
    cmd = [sys.executable, "-m", "helpers.profile", "--model", "transformer", "--preset", "tiny",
           "--devices", str(count), "--steps", "2", "--warmup", "1", "--json", str(out)]  # fmt: skip
    proc = run_jax_child(cmd, devices=count, cwd=ROOT, env=env, timeout=240)
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    )
    assert "Termination timeout" not in proc.stderr
    report = json.loads(out.read_text())
    assert report["environment"]["device_count"] == count
    flags = report["environment"]["xla_flags"]
    for name, seconds in CPU_COLLECTIVE_FLAGS.items():
        assert f"--{name}={seconds}" in flags, flags
    # The AVX2 cap is applied exactly where this jaxlib and this CPU need it (issue 38).
    assert ("--xla_cpu_max_isa=AVX2" in flags) == avx512_deadlock_risk(), flags
    dp, fsdp = report["results"]
    if count > 1:  # the collectives this test is about: DP's all-reduce, FSDP's all-gather
        assert "all-reduce" in dp["collectives"]
        assert "all-gather" in fsdp["collectives"]
    assert dp["losses"] == pytest.approx(fsdp["losses"], rel=1e-5)


_LATE = """
import sys, time
import numpy as np
from helpers import use_simulated_devices
use_simulated_devices(3, quiet=True)
import jax, jax.numpy as jnp
from jax.experimental import io_callback
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((3,), ("d",), axis_types=(jax.sharding.AxisType.Explicit,))
def nap(i):
    if int(i) == 0:
        time.sleep(float(sys.argv[1]))  # device 0 reaches the all-reduce late
    return np.int32(0)
def f(x):
    late = io_callback(nap, jax.ShapeDtypeStruct((), jnp.int32), jax.lax.axis_index("d"))
    return jax.lax.psum(x + late, "d")
step = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("d"), out_specs=P()))
x = jax.device_put(jnp.arange(3.0), NamedSharding(mesh, P("d")))
print("sum", float(step(x)[0]), flush=True)
"""


def _late_device(seconds: float, xla_flags: str | None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("XLA_FLAGS", None)
    if xla_flags is not None:
        env["XLA_FLAGS"] = xla_flags
    return subprocess.run(
        [sys.executable, "-c", _LATE, str(seconds)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_the_rendezvous_flags_are_what_aborts_a_late_device():
    """The cause, shown small: with XLA's termination timeout at 2 s (your ``XLA_FLAGS`` win
    over the series' own), a device 6 s late kills the process as issue 25's run died."""
    warn, terminate = CPU_COLLECTIVE_FLAGS
    died = _late_device(6, f"--{warn}=1 --{terminate}=2")
    assert died.returncode != 0 and "Termination timeout" in died.stderr, died.stderr[-2000:]


def test_a_late_device_does_not_abort_with_the_series_flags():
    """Device 0 reaches its all-reduce 6 s after the others: with the series' flags (warn
    after 120 s, give up after 600 s more) the step just waits for it, with no warning."""
    ok = _late_device(6, None)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "sum 3.0" in ok.stdout and "may be stuck" not in ok.stderr


def test_a_hung_child_is_named_a_deadlock_within_its_timeout():
    """A child that hangs is killed after the test's timeout (minutes in the tests above;
    2 s here), and the failure says what it is, with the jaxlib and the CPU (issue 38)."""
    import time

    from children import deadlock_message

    hang = "import sys, time; print('This thread has been waiting for', file=sys.stderr, flush=True); time.sleep(60)"
    start = time.monotonic()
    with pytest.raises(pytest.fail.Exception) as failed:
        run_jax_child([sys.executable, "-c", hang], devices=5, timeout=2)
    assert time.monotonic() - start < 30
    message = str(failed.value)
    assert message.startswith(deadlock_message(5)), message
    assert "killed after 2 s (XLA reported a stuck collective)" in message
    assert "jaxlib " in message and "CPU " in message
