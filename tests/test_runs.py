"""Properties of notebook runs: the same numbers twice, and deprecations fail loudly."""

from __future__ import annotations

import os
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[1]

# Lines that report a duration or a speed legitimately differ between runs.
_TIMING = re.compile(
    r"\b(time|timing|timed|ms|µs|seconds?|sec|s/step|steps?/s|tokens/s|it/s|elapsed|faster|slower|ratio|took|wall)\b",
    re.I,
)
_ADDRESS = re.compile(r"0x[0-9a-f]+")


def _run(path: Path, count: int) -> list[str]:
    nb = nbformat.read(path, as_version=4)
    old = os.environ.get("NUM_DEVICES")
    os.environ["NUM_DEVICES"] = str(count)
    try:
        NotebookClient(
            nb,
            timeout=600,
            kernel_name="python3",
            resources={"metadata": {"path": str(path.parent)}},
        ).execute()
    finally:
        if old is None:
            os.environ.pop("NUM_DEVICES", None)
        else:
            os.environ["NUM_DEVICES"] = old
    lines = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        # A print may arrive as several stream messages: join the cell's text before
        # splitting it into lines.
        texts = []
        for out in cell.outputs:
            if out.output_type == "error":
                texts.append(f"\n{out.ename}: {out.evalue}\n")
            elif out.output_type == "stream":
                texts.append(out.text)
            else:
                texts.append("\n" + str(out.get("data", {}).get("text/plain", "")) + "\n")
        for line in "".join(texts).splitlines():
            if line and not _TIMING.search(line):
                lines.append(f"[{i}] {_ADDRESS.sub('0x?', line)}")
    return lines


def test_notebook_prints_the_same_numbers_twice():
    path = ROOT / "notebooks" / "01_linen_basics.ipynb"
    first, second = _run(path, 2), _run(path, 2)
    assert len(first) > 20, "the notebook printed too little to compare"
    assert first == second


def test_kernels_turn_deprecations_into_errors(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import warnings\nwarnings.warn('old API', DeprecationWarning)")
    ]
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    with pytest.raises(CellExecutionError, match="old API"):
        NotebookClient(
            nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
        ).execute()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "NUM_DEVICES=0: the notebooks run on 1 to 8 simulated devices"),
        ("16", "NUM_DEVICES=16: the notebooks run on 1 to 8 simulated devices"),
        ("many", "NUM_DEVICES='many' is not a whole number"),
    ],
)
def test_wrong_device_count_gets_one_clear_line(value, message):
    import subprocess
    import sys

    env = {**os.environ, "NUM_DEVICES": value}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-n",
            "0",
            "tests/test_runs.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 4  # pytest's usage error
    assert message in out.stderr
    assert "Traceback" not in out.stderr + out.stdout


def test_a_notebooks_memory_leaves_out_processes_started_before_it():
    """conftest's sampler counts the kernel a run starts (and its children), not a process an
    earlier test in the same worker left running: that once failed notebooks 01 and 02."""
    import importlib.util
    import subprocess
    import sys
    import time

    import psutil

    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    root_conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(root_conftest)
    hold = "import sys, time; x = bytearray(int(sys.argv[1])); x[::4096] = b'1' * len(x[::4096]); time.sleep(float(sys.argv[2]))"  # noqa: E501
    leftover = subprocess.Popen([sys.executable, "-c", hold, str(400_000_000), "60"])
    try:
        deadline = time.monotonic() + 60
        while psutil.Process(leftover.pid).memory_info().rss < 350_000_000:
            assert time.monotonic() < deadline, "the leftover process never grew"
            time.sleep(0.1)
        sampler = root_conftest._KernelMemory(interval=0.05)
        sampler.start()
        subprocess.run([sys.executable, "-c", hold, str(60_000_000), "1"], check=True, timeout=120)
        sampler.stop()
    finally:
        leftover.kill()
        leftover.wait(timeout=30)
    assert 50_000_000 < sampler.peak < 300_000_000, sampler.peak


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")
# Python 3.12 warns that fork() in a multi-threaded process may deadlock the child; this
# child only sleeps and calls os._exit, taking no lock, so the fork is safe and deliberate.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_notebooks_memory_leaves_out_a_child_that_has_not_exec_d_yet():
    """A child between fork and exec is a copy of the pytest worker, with the worker's RSS;
    the sampler must not count it as the kernel."""
    import importlib.util
    import os
    import time

    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    root_conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(root_conftest)
    ballast = bytearray(300_000_000)  # this process's pages, which a fork shares
    ballast[::4096] = b"1" * len(ballast[::4096])
    sampler = root_conftest._KernelMemory(interval=0.05)
    sampler.start()
    pid = os.fork()
    if pid == 0:  # the child: still this program, as before an exec
        time.sleep(1.0)
        os._exit(0)
    os.waitpid(pid, 0)
    sampler.stop()
    del ballast
    assert sampler.peak < 100_000_000, sampler.peak
