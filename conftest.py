"""How ``pytest`` runs this repository: unit tests, plus every notebook under nbmake.

Each ``notebooks/NN_*.ipynb`` is run end to end by nbmake's runner once per device
count: 8 and 1 by default (a laptop has one device, CI simulates eight). The kernel
of each run gets ``NUM_DEVICES`` in its environment, which the notebook's setup cell
reads. Choose other counts with ``--device-counts=1,2,4,8``, or one count with
``NUM_DEVICES=n pytest``.

Kernels also turn every DeprecationWarning into an error (through an IPython startup
file), so a notebook that uses a deprecated jax/flax/optax API fails here first.

Each notebook run also samples the resident memory of its kernel: a run whose peak
passes ``MEMORY_LIMIT_BYTES`` (1.5 GB, under Binder's 2 GB) fails. With
``NOTEBOOK_STATS=path.jsonl`` set, every run appends its peak memory and wall time
there (``.ci/notebook_stats.py`` turns that into the README's table).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest
from nbmake.pytest_items import NotebookItem

SUPPORTED_COUNTS = (1, 2, 4, 8)
MEMORY_LIMIT_BYTES = int(1.5e9)
DEFAULT_COUNTS = (8, 1)

# Deprecations raised in notebook code (where jax/flax/optax attribute their API
# deprecations) or inside the libraries the series teaches become errors. Those from
# Jupyter's own machinery (e.g. datetime.utcnow on Python 3.12) stay warnings.
_STARTUP = """\
import warnings
warnings.filterwarnings(
    "error",
    category=DeprecationWarning,
    module=r"(__main__|helpers|jax|jaxlib|flax|optax|orbax)(\\.|$)",
)
"""


def _parse_count(raw: str, where: str) -> int:
    try:
        n = int(raw)
    except ValueError:
        raise pytest.UsageError(
            f"{where}={raw!r} is not a whole number; use one of {SUPPORTED_COUNTS}."
        ) from None
    if n not in SUPPORTED_COUNTS:
        raise pytest.UsageError(
            f"{where}={n}: the notebooks are written for {SUPPORTED_COUNTS} simulated devices "
            "(their batch sizes and widths divide by these); pick one of them."
        )
    return n


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--device-counts",
        default=None,
        help="comma-separated NUM_DEVICES values to run every notebook with (default 8,1; "
        "NUM_DEVICES=n alone runs only n)",
    )


def pytest_configure(config: pytest.Config) -> None:
    raw = config.getoption("--device-counts")
    if raw:
        counts = tuple(
            _parse_count(c.strip(), "--device-counts") for c in raw.split(",") if c.strip()
        )
    elif "NUM_DEVICES" in os.environ:
        counts = (_parse_count(os.environ["NUM_DEVICES"], "NUM_DEVICES"),)
    else:
        counts = DEFAULT_COUNTS
    config.stash[_COUNTS] = counts
    # Figures render without a display; kernels started by nbmake inherit these.
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ.setdefault("PYTHONHASHSEED", "0")
    ipython_dir = Path(tempfile.mkdtemp(prefix="ipython-tests-"))
    startup = ipython_dir / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-deprecations-are-errors.py").write_text(_STARTUP)
    os.environ["IPYTHONDIR"] = str(ipython_dir)
    config.add_cleanup(lambda: shutil.rmtree(ipython_dir, ignore_errors=True))


_COUNTS = pytest.StashKey[tuple[int, ...]]()


class NotebookAtCount(NotebookItem):
    """nbmake's notebook item, run with ``NUM_DEVICES`` set for its kernel."""

    def __init__(self, parent: pytest.File, filename: str, count: int) -> None:
        pytest.Item.__init__(
            self, f"{parent.name}[{count} device{'s' if count > 1 else ''}]", parent
        )
        self.filename = filename
        self.count = count

    def runtest(self) -> None:
        old = os.environ.get("NUM_DEVICES")
        os.environ["NUM_DEVICES"] = str(self.count)
        sampler = _KernelMemory()
        start = time.perf_counter()
        sampler.start()
        try:
            super().runtest()
        finally:
            sampler.stop()
            if old is None:
                os.environ.pop("NUM_DEVICES", None)
            else:
                os.environ["NUM_DEVICES"] = old
        wall = time.perf_counter() - start
        stats_path = os.environ.get("NOTEBOOK_STATS")
        if stats_path:
            record = {"notebook": Path(self.filename).name, "devices": self.count,
                      "peak_rss_bytes": sampler.peak, "wall_s": round(wall, 1)}  # fmt: skip
            with open(stats_path, "a") as f:
                f.write(json.dumps(record) + "\n")
        assert sampler.peak < MEMORY_LIMIT_BYTES, (
            f"{Path(self.filename).name} with {self.count} devices peaked at {sampler.peak / 1e9:.2f} GB "
            f"of kernel memory; the limit is {MEMORY_LIMIT_BYTES / 1e9:.1f} GB (Binder has 2 GB)"
        )


class _KernelMemory(threading.Thread):
    """Samples the peak resident memory of this process's child processes (the kernel)."""

    def __init__(self, interval: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.peak = 0
        self._done = threading.Event()

    def run(self) -> None:
        me = psutil.Process()
        while not self._done.is_set():
            total = 0
            for child in me.children(recursive=True):
                try:
                    total += child.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            self._done.wait(self.interval)

    def stop(self) -> None:
        self._done.set()
        self.join()


class NotebookAtCounts(pytest.File):
    def collect(self):  # type: ignore[override]
        for count in self.config.stash[_COUNTS]:
            yield NotebookAtCount.from_parent(self, filename=str(self.path), count=count)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.File | None:
    if (
        file_path.suffix == ".ipynb"
        and file_path.parent.name == "notebooks"
        and file_path.name[:2].isdigit()
    ):
        return NotebookAtCounts.from_parent(parent, path=file_path)
    return None
