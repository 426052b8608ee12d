"""Run a JAX program in a child process, and name a deadlock when it hangs.

A child that simulates several CPU devices can hang in an XLA:CPU collective (issue 38:
jaxlib 0.8.x on AVX-512 CPUs, at device counts that are not powers of two). XLA itself would
end it only after ``helpers.compat.CPU_COLLECTIVE_FLAGS``' ten minutes; the tests stop it
after ``timeout`` seconds (minutes, not ten) and fail with one line that says what it is:
"XLA CPU collective deadlock at N devices, jaxlib X, CPU Y", then the child's last output.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
from typing import Any

import pytest

from helpers.compat import cpu_description, jaxlib_version

#: XLA:CPU's warning while a device waits in a collective's rendezvous.
STUCK = "This thread has been waiting for"


def deadlock_message(devices: int, flags: str = "") -> str:
    return (
        f"XLA CPU collective deadlock at {devices} devices, jaxlib {jaxlib_version()}, "
        f"CPU {cpu_description()}" + (f"; XLA_FLAGS={flags!r}" if flags else "")
    )


def run_jax_child(
    cmd: list[str], *, devices: int, timeout: float = 240, **kwargs: Any
) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)``,
    failing the test with ``deadlock_message`` if the child outlives ``timeout`` or exits
    after XLA reported a device stuck in a collective."""
    flags = (kwargs.get("env") or {}).get("XLA_FLAGS", "")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as err:  # subprocess.run has killed the child
        tail = (err.stderr or b"")[-1500:]
        tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        stuck = "XLA reported a stuck collective" if STUCK in tail else "no output from XLA"
        pytest.fail(
            f"{deadlock_message(devices, flags)}: killed after {timeout:.0f} s ({stuck}).\n{tail}",
            pytrace=False,
        )
    if proc.returncode != 0 and STUCK in proc.stderr:
        pytest.fail(
            f"{deadlock_message(devices, flags)}: exit {proc.returncode}.\n{proc.stderr[-1500:]}",
            pytrace=False,
        )
    return proc


def once_per_session(tmp_path_factory, name: str, run) -> dict:
    """``run(directory)`` once per session, whichever worker asks first; its JSON result."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by every worker of this session
    directory, done = root / name, root / f"{name}.json"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not done.exists():
                directory.mkdir(exist_ok=True)
                done.write_text(json.dumps(run(directory)))
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return {**json.loads(done.read_text()), "dir": directory}
