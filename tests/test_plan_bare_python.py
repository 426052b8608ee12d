"""``python -m helpers.plan`` runs with the standard library alone (issue 39, item 5).

A virtual environment made with ``python -m venv --without-pip`` has no jax, no numpy and
no matplotlib; with the checkout on its ``PYTHONPATH`` it runs ``--help``, a plan and a
search of LLaMA-3-70B's layouts on 64 H100s (in under 10 s), and ``import helpers`` there
loads none of the other subpackages.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = venv / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    assert python.exists()
    return python


def _run(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), *args], capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": ""},
    )  # fmt: skip


def test_the_bare_environment_has_no_jax_numpy_or_matplotlib(bare_python: Path) -> None:
    for module in ("jax", "numpy", "matplotlib"):
        out = _run(bare_python, "-c", f"import {module}")
        assert out.returncode != 0 and "ModuleNotFoundError" in out.stderr, module


def test_help_a_plan_and_a_search_run_there(bare_python: Path) -> None:
    help_ = _run(bare_python, "-m", "helpers.plan", "--help")
    assert help_.returncode == 0, help_.stderr
    assert help_.stdout.startswith("usage: python -m helpers.plan ")
    plan = _run(bare_python, "-m", "helpers.plan", "--config", "llama3-8b", "--dp", "16",
                "--zero", "3", "--json", "-")  # fmt: skip
    assert plan.returncode == 0, plan.stderr
    data = json.loads(plan.stdout)
    assert data["crossing_axes"] == ["dp"] and data["mfu_expected"] is not None
    start = time.perf_counter()
    search = _run(bare_python, "-m", "helpers.plan", "--config", "llama3-70b", "--gpus", "64",
                  "--hardware", "h100", "--search")  # fmt: skip
    took = time.perf_counter() - start
    assert search.returncode == 0, search.stderr
    assert took < 10, took
    lines = search.stdout.splitlines()
    rows = lines[2 : 2 + 10]  # after the title and the header: one layout a line
    layouts = [line[:26].strip() for line in rows]  # the layout column
    assert all(layouts) and len(set(layouts)) == len(layouts) == 10


def test_import_helpers_there_loads_no_subpackage(bare_python: Path) -> None:
    code = (
        "import sys, helpers; from helpers import plan_model, search_layouts\n"
        "print(sorted(m for m in sys.modules if m.startswith(('jax', 'numpy', 'matplotlib', "
        "'helpers.placing', 'helpers.drawing', 'helpers.cluster'))))"
    )
    out = _run(bare_python, "-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    # a name that needs jax fails when it is used, naming the missing module
    out = _run(bare_python, "-c", "from helpers import use_simulated_devices")
    assert out.returncode != 0 and "No module named 'jax'" in out.stderr
