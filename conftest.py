"""How ``pytest`` runs this repository: unit tests, plus every notebook end to end.

Each ``notebooks/NN_*.ipynb`` runs once per device count, 8 and 1 by default (CI simulates
eight devices; a laptop has one). Choose others with ``--device-counts=3,5,7`` (any count
from 1 to 8), or one count with ``NUM_DEVICES=n pytest``. The kernel gets ``NUM_DEVICES``
in its environment, which the notebook's setup cell reads, and imports ``helpers`` from
this checkout (``PYTHONPATH``), whatever is installed.

A notebook runs the way a learner's kernel runs it: figures render inline, and the run
must show at least the number of figures ``tests/figures.toml`` promises for it.

Exercises (a stub cell tagged ``exercise``, a ``check`` cell, a ``solution`` cell; see
CONTRIBUTING.md) are run all three ways:

- at every count but 1, the notebook runs as Run All runs it, plus one cell the tests
  add after each check: the exercise's ``wrong_answer`` (cell metadata of the solution)
  followed by the check again. The check must print ``not attempted yet`` for the stub,
  reject the wrong answer, and the solution cell must print that it is correct;
- at 1 device, every ``solution`` cell is removed: the notebook must still run to the
  end, and every check must say ``not attempted yet``.

Kernels turn every DeprecationWarning from the libraries the series teaches into an error
(through an IPython startup file), so a deprecated API fails here first.

Each run samples the resident memory of its kernel and fails past ``MEMORY_LIMIT_BYTES``
(1.5 GB, under Binder's 2 GB). Environment variables keep what a run produced:
``NOTEBOOK_STATS=file.jsonl`` (peak memory and wall time, for ``.ci/notebook_stats.py``),
``NOTEBOOK_FIGURES=dir`` (every figure as a PNG, to look at) and
``EXECUTED_NOTEBOOKS=dir`` (``dir/<count>/<name>.ipynb`` with its outputs, the cells the
tests added taken out again: what ``.ci/build_site`` renders).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

import nbformat
import psutil
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError
from nbmake.nb_result import NotebookError, NotebookResult
from nbmake.pytest_items import NotebookFailedException, NotebookItem

from helpers.lesson import NOT_ATTEMPTED, RIGHT, WRONG, cell_role, exercises

ROOT = Path(__file__).resolve().parent
SUPPORTED_COUNTS = tuple(range(1, 9))
MEMORY_LIMIT_BYTES = int(1.5e9)
DEFAULT_COUNTS = (8, 1)
FIGURES = tomllib.loads((ROOT / "tests" / "figures.toml").read_text())
# $XLA_FLAGS as pytest started, before tests/conftest.py's use_simulated_devices added the
# series' flags for this worker: a notebook's kernel starts with it, as a learner's kernel
# does, and its own setup cell adds what the notebook asks for (notebook 04 asks for no
# FAST_CPU_COMPILE, since it times steps).
_XLA_FLAGS_AT_START = os.environ.get("XLA_FLAGS")
IMAGE_TYPES = ("image/png", "image/svg+xml", "image/jpeg")

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


def _set_env(name: str, value: str | None) -> None:
    """Set ``$name`` to ``value``, or unset it where ``value`` is None."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _parse_count(raw: str, where: str) -> int:
    try:
        n = int(raw)
    except ValueError:
        raise pytest.UsageError(
            f"{where}={raw!r} is not a whole number; use a device count from 1 to 8."
        ) from None
    if n not in SUPPORTED_COUNTS:
        raise pytest.UsageError(
            f"{where}={n}: the notebooks run on 1 to 8 simulated devices; pick a count in that range."
        )
    return n


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--device-counts",
        default=None,
        help="comma-separated NUM_DEVICES values (1-8) to run every notebook with (default "
        "8,1; NUM_DEVICES=n alone runs only n)",
    )


_COUNTS = pytest.StashKey[tuple[int, ...]]()


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
    os.environ.setdefault("PYTHONHASHSEED", "0")
    # Kernels import helpers from this checkout, even where another copy is installed.
    path = os.environ.get("PYTHONPATH", "")
    if str(ROOT) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), path) if p)
    ipython_dir = Path(tempfile.mkdtemp(prefix="ipython-tests-"))
    startup = ipython_dir / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-deprecations-are-errors.py").write_text(_STARTUP)
    os.environ["IPYTHONDIR"] = str(ipython_dir)
    config.add_cleanup(lambda: shutil.rmtree(ipython_dir, ignore_errors=True))


# ---------------------------------------------------------------------------
# Exercises: find them, and build the notebook a run executes
# ---------------------------------------------------------------------------


def _injected(source: str, role: str, exercise: int) -> Any:
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["added_by_tests"] = {"role": role, "exercise": exercise}
    return cell


def notebook_variant(nb: Any, with_solutions: bool) -> tuple[Any, list[dict[str, int]]]:
    """The notebook a test run executes, and where each exercise's parts ended up.

    With solutions: after each check cell, one added cell that sets the exercise's
    ``wrong_answer`` and runs the check again. Without: every solution cell removed.
    """
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    found = exercises(nb)
    cells, where = [], []
    position = {}
    for index, cell in enumerate(nb.cells):
        position[index] = len(cells)
        role = cell_role(cell)
        if role == "solution" and not with_solutions:
            continue
        cells.append(cell)
        if role == "check" and with_solutions:
            k = next(n for n, ex in enumerate(found) if ex[1] == index)
            solution = nb.cells[found[k][2]]
            wrong = solution.metadata.get("wrong_answer")
            if not wrong:
                raise ValueError(
                    f"the solution cell {found[k][2]} has no 'wrong_answer' metadata "
                    "(see CONTRIBUTING.md)"
                )
            cells.append(_injected(f"{wrong}\n{cell.source}", "wrong", k))
    for _stub, chk, sol in found:
        entry = {"check": position[chk], "wrong": position[chk] + 1}
        if with_solutions:
            entry["solution"] = position[sol]
        where.append(entry)
    nb.cells = cells
    return nb, where


def _text(cell: Any) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            parts.append(out.text)
        elif "data" in out:
            parts.append(str(out.data.get("text/plain", "")))
    return "".join(parts)


def exercise_problems(nb: Any, where: list[dict[str, int]], with_solutions: bool) -> list[str]:
    """What an executed variant did wrong with its exercises (empty when all is well)."""
    problems = []
    for k, entry in enumerate(where, start=1):
        said = _text(nb.cells[entry["check"]])
        if NOT_ATTEMPTED not in said:
            problems.append(
                f"exercise {k}: the check did not say {NOT_ATTEMPTED!r} for the stub: {said!r}"
            )
        if not with_solutions:
            continue
        said = _text(nb.cells[entry["wrong"]])
        if WRONG not in said:
            problems.append(f"exercise {k}: the check did not reject the wrong answer: {said!r}")
        said = _text(nb.cells[entry["solution"]])
        if RIGHT not in said:
            problems.append(f"exercise {k}: the solution cell did not print {RIGHT!r}: {said!r}")
    return problems


def images(nb: Any) -> list[tuple[int, str, bytes]]:
    """Every image output of an executed notebook: ``(cell index, mime type, bytes)``."""
    out = []
    for i, cell in enumerate(nb.cells):
        for o in cell.get("outputs", []):
            for mime in IMAGE_TYPES:
                if mime in o.get("data", {}):
                    data = o.data[mime]
                    raw = data.encode() if mime == "image/svg+xml" else base64.b64decode(data)
                    out.append((i, mime, raw))
    return out


def promised_figures(stem: str, count: int) -> int | None:
    """How many figures ``tests/figures.toml`` promises for a notebook at ``count`` devices.

    An entry is a number (the same at every count) or a table of counts with a ``default``:
    ``03_sharding_strategies = { default = 5, 1 = 1 }``.
    """
    entry = FIGURES.get(stem)
    if isinstance(entry, dict):
        return entry.get(str(count), entry.get("default"))
    return entry


def without_added_cells(nb: Any) -> Any:
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    nb.cells = [c for c in nb.cells if "added_by_tests" not in c.get("metadata", {})]
    return nb


# ---------------------------------------------------------------------------
# The notebook items
# ---------------------------------------------------------------------------


class NotebookAtCount(NotebookItem):
    """One notebook run at one device count, in the variant that count runs (see above)."""

    def __init__(self, parent: pytest.File, filename: str, count: int) -> None:
        pytest.Item.__init__(
            self, f"{parent.name}[{count} device{'s' if count > 1 else ''}]", parent
        )
        self.filename = filename
        self.count = count

    def runtest(self) -> None:
        path = Path(self.filename)
        with_solutions = self.count != 1
        nb, where = notebook_variant(nbformat.read(path, as_version=4), with_solutions)
        old = os.environ.get("NUM_DEVICES")
        os.environ["NUM_DEVICES"] = str(self.count)
        # The TPU compiler's programs (tpu_program) do not depend on the simulated count:
        # the notebooks read the recording, which tests/test_topology.py compiles afresh
        # (where libtpu is installed) and compares, so no notebook run compiles them again.
        old_tpu = os.environ.get("HELPERS_TPU_PROGRAMS")
        if old_tpu is None:
            os.environ["HELPERS_TPU_PROGRAMS"] = "recorded"
        old_xla = os.environ.get("XLA_FLAGS")
        _set_env("XLA_FLAGS", _XLA_FLAGS_AT_START)
        sampler = _KernelMemory()
        start = time.perf_counter()
        sampler.start()
        error = None
        try:
            error = _execute(nb, path, self.config.option.nbmake_timeout)
        finally:
            sampler.stop()
            _set_env("NUM_DEVICES", old)
            if old_tpu is None:
                os.environ.pop("HELPERS_TPU_PROGRAMS", None)
            _set_env("XLA_FLAGS", old_xla)
        wall = time.perf_counter() - start
        self._keep(nb, path, sampler.peak, wall)
        if error is not None:
            raise NotebookFailedException(NotebookResult(nb=nb, error=error))
        problems = exercise_problems(nb, where, with_solutions)
        figures = len(images(nb))
        promised = promised_figures(path.stem, self.count)
        if promised is None:
            problems.append(f"tests/figures.toml says nothing about {path.stem}")
        elif figures < promised:
            problems.append(
                f"the run showed {figures} figure(s); tests/figures.toml promises {promised}"
            )
        assert not problems, f"{path.name} with {self.count} device(s): " + "; ".join(problems)
        assert sampler.peak < MEMORY_LIMIT_BYTES, (
            f"{path.name} with {self.count} devices peaked at {sampler.peak / 1e9:.2f} GB "
            f"of kernel memory; the limit is {MEMORY_LIMIT_BYTES / 1e9:.1f} GB (Binder has 2 GB)"
        )

    def repr_failure(self, excinfo: Any, style: Any = None) -> Any:
        if isinstance(excinfo.value, AssertionError):  # what the run showed, in one message
            return str(excinfo.value).split("\nassert ")[0]
        return super().repr_failure(excinfo, style)

    def _keep(self, nb: Any, path: Path, peak: int, wall: float) -> None:
        stats_path = os.environ.get("NOTEBOOK_STATS")
        if stats_path:
            record = {"notebook": path.name, "devices": self.count,
                      "peak_rss_bytes": peak, "wall_s": round(wall, 1)}  # fmt: skip
            with open(stats_path, "a") as f:
                f.write(json.dumps(record) + "\n")
        figures_dir = os.environ.get("NOTEBOOK_FIGURES")
        if figures_dir:
            out = Path(figures_dir)
            out.mkdir(parents=True, exist_ok=True)
            for k, (cell, mime, raw) in enumerate(images(nb)):
                ext = {"image/png": "png", "image/svg+xml": "svg", "image/jpeg": "jpg"}[mime]
                (out / f"{path.stem}-{self.count}dev-{k:02d}-cell{cell}.{ext}").write_bytes(raw)
        executed_dir = os.environ.get("EXECUTED_NOTEBOOKS")
        if executed_dir:
            out = Path(executed_dir) / str(self.count)
            out.mkdir(parents=True, exist_ok=True)
            nbformat.write(without_added_cells(nb), out / path.name)


def _execute(nb: Any, path: Path, timeout: int) -> NotebookError | None:
    """Run ``nb`` in a fresh kernel in ``path``'s folder; the first error, or None."""
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        record_timing=True,
        resources={"metadata": {"path": str(path.parent)}},
    )
    try:
        client.execute()
    except CellExecutionError:
        pass
    except CellTimeoutError as err:
        trace = err.args[0]
        return NotebookError(summary=trace.split("\n")[0], trace=trace, failing_cell_index=-1)
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                tb = "\n".join(out.get("traceback", []))
                rule = 75 * "-"
                added = " (a cell the tests added)" if "added_by_tests" in cell.metadata else ""
                return NotebookError(
                    summary=f"{out.ename}: {out.evalue}",
                    trace=f"{rule}\ncell {i}{added}:\n{cell.source}\n{tb}",
                    failing_cell_index=i,
                )
    return None


class _KernelMemory(threading.Thread):
    """Samples the peak resident memory of the processes this process starts from now on
    (the kernel), and of everything they start.

    Children that were already running when the sampler was made are not the notebook's, nor
    is anything they start later: a process an earlier test in the same pytest-xdist worker
    left behind (one a loaded machine was slow to end) once added 1.3 GB to three notebooks
    that ran after it, and 1 GB to another.
    """

    def __init__(self, interval: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.peak = 0
        self._done = threading.Event()
        self._before = {p.pid for p in psutil.Process().children()}

    def _tree_rss(self) -> int:
        me = psutil.Process()
        total = 0
        for child in me.children():
            if child.pid in self._before:
                continue
            try:
                # Between fork and exec a child is a copy of this pytest worker (its RSS is the
                # worker's, 2 GB late in a run), not yet the kernel: on a busy machine that
                # window is long enough to be sampled, and once failed notebook 01 at 2.49 GB.
                if child.cmdline() == me.cmdline():
                    continue
                tree = [child, *child.children(recursive=True)]
            except psutil.Error:
                continue
            for proc in tree:
                try:
                    total += proc.memory_info().rss
                except psutil.Error:
                    pass
        return total

    def run(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, self._tree_rss())
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


# Tests known to take tens of seconds on 2 cores (pytest --durations), run first with the
# notebooks so that pytest-xdist's workers end on short tests instead of one waiting for the
# other's last notebook (longest first: the tail of a run is what CI's minutes lose).
_SLOW_FIRST = ("test_launch.py", "test_runs.py", "test_zero.py", "test_every_count.py",
               "test_props_context.py", "test_profile.py", "test_props_experts.py")  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        if isinstance(item, NotebookAtCount):
            return 0
        return 1 if item.path.name in _SLOW_FIRST else 2

    items.sort(key=rank)  # stable: each group keeps its collection order
