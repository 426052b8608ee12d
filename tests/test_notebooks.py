"""Checks on the notebooks that cost nothing at run time.

Running the notebooks themselves is ``conftest.py``'s job (``pytest`` collects every
``notebooks/*.ipynb``); these tests check the files: each ``notebooks/NN_name.ipynb`` is
paired with ``notebooks/src/NN_name.md`` in the exact form a JupyterLab save writes, no
outputs are committed, no cell relies on the ``raises-exception`` tag, every exercise has
its three parts, the shared setup cell and Colab bootstrap, metadata, and that nothing is
fetched from outside the repository.
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import jupytext
import nbformat
import pytest

from helpers.lesson import exercises

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
SOURCES = NOTEBOOKS / "src"
MDS = sorted(SOURCES.glob("[0-9][0-9]*_*.md"))
IPYNBS = sorted(NOTEBOOKS.glob("[0-9][0-9]*_*.ipynb"))
FIGURES = tomllib.loads((ROOT / "tests" / "figures.toml").read_text())
REPO_URL = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
COLAB_PREFIX = "https://colab.research.google.com/github/" + REPO_URL.removeprefix(
    "https://github.com/"
)


def _code_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code"]


def test_there_are_notebooks():
    assert len(MDS) >= 1


def test_every_notebook_is_a_pair():
    assert [p.stem for p in MDS] == [p.stem for p in IPYNBS], (
        "each notebooks/NN_name.ipynb needs its notebooks/src/NN_name.md and back"
    )
    assert not list(NOTEBOOKS.glob("*.md")), (
        "MyST sources live in notebooks/src/, so that JupyterLab lists each notebook once"
    )


def _committed(path: Path) -> str | None:
    """The file as it stands in git's index (what the next commit holds), or None outside git."""
    if shutil.which("git") is None:
        return None
    rel = path.relative_to(ROOT).as_posix()
    out = subprocess.run(
        ["git", "show", f":{rel}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    return out.stdout if out.returncode == 0 else None


@pytest.mark.parametrize("ipynb", IPYNBS, ids=lambda p: p.name)
def test_committed_ipynb_has_no_outputs(ipynb):
    # What is committed must be clean. A learner's working copy, with the outputs JupyterLab
    # autosaved into it, may differ and must not fail this suite: only git's index is read.
    text = _committed(ipynb)
    if text is None:
        pytest.skip(
            "not a git checkout with this notebook in its index: nothing committed to check"
        )
    nb = nbformat.reads(text, as_version=4)
    dirty = [
        i
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code" and (c.outputs or c.execution_count)
    ]
    assert not dirty, (
        f"{ipynb.name} as staged for commit has outputs in code cells {dirty}; clear them with "
        f"`jupyter nbconvert --clear-output --inplace notebooks/{ipynb.name}` and stage it again"
    )


def _cell_view(nb) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(c.cell_type, c.source.strip(), tuple(c.metadata.get("tags", ()))) for c in nb.cells]


@pytest.mark.parametrize("md", MDS, ids=lambda p: p.name)
def test_pair_in_sync(md):
    ipynb = NOTEBOOKS / f"{md.stem}.ipynb"
    assert _cell_view(jupytext.read(md)) == _cell_view(nbformat.read(ipynb, as_version=4)), (
        f"{md.name} and {ipynb.name} differ: run `jupytext --sync {md.relative_to(ROOT)}`"
    )


@pytest.mark.parametrize("md", MDS, ids=lambda p: p.name)
def test_md_is_what_a_jupyterlab_save_writes(md):
    # Jupytext rewrites the .md from the notebook on every save in JupyterLab. The committed
    # .md must already be that text, so that saving changes nothing in it.
    ipynb = NOTEBOOKS / f"{md.stem}.ipynb"
    config = jupytext.config.load_jupytext_config(str(md))
    written = jupytext.writes(nbformat.read(ipynb, as_version=4), fmt="md:myst", config=config)
    assert written == md.read_text(), (
        f"{md.relative_to(ROOT)} is not in the form a JupyterLab save writes: "
        f"run `jupytext --sync {md.relative_to(ROOT)}`"
    )


@pytest.mark.parametrize("ipynb", IPYNBS, ids=lambda p: p.name)
def test_no_cell_relies_on_raises_exception(ipynb):
    # Colab and VS Code ignore the tag and stop Run All: use helpers.expect_error instead.
    tagged = [
        i
        for i, c in enumerate(nbformat.read(ipynb, as_version=4).cells)
        if "raises-exception" in c.metadata.get("tags", ())
    ]
    assert not tagged, f"{ipynb.name}: cells {tagged} carry raises-exception; use expect_error"


@pytest.mark.parametrize("ipynb", IPYNBS, ids=lambda p: p.name)
def test_exercises_have_three_parts(ipynb):
    nb = nbformat.read(ipynb, as_version=4)
    found = exercises(nb)  # raises when the parts are out of order
    assert found, f"{ipynb.name} has no exercise in the series' pattern (see CONTRIBUTING.md)"
    for stub, check, solution in found:
        stub_src, check_src = nb.cells[stub].source, nb.cells[check].source
        sol = nb.cells[solution]
        assert "..." in stub_src, f"{ipynb.name} cell {stub}: the stub must leave `...` to fill in"
        assert "check(" in check_src, f"{ipynb.name} cell {check}: the check must call check(...)"
        assert sol.metadata.get("jupyter", {}).get("source_hidden") is True, (
            f"{ipynb.name} cell {solution}: a solution is collapsed when opened "
            "(metadata jupyter.source_hidden: true)"
        )
        assert sol.metadata.get("wrong_answer"), (
            f"{ipynb.name} cell {solution}: the solution needs a wrong_answer for the tests"
        )


def test_every_notebook_promises_its_figures():
    assert sorted(FIGURES) == sorted(p.stem for p in IPYNBS), (
        "tests/figures.toml must say how many figures each notebook shows"
    )


@pytest.mark.parametrize("ipynb", IPYNBS, ids=lambda p: p.name)
def test_kernelspec_and_language(ipynb):
    meta = nbformat.read(ipynb, as_version=4).metadata
    assert meta.get("kernelspec", {}).get("name") == "python3"
    assert meta.get("kernelspec", {}).get("language") == "python"
    assert meta.get("language_info", {}).get("name") == "python"


@pytest.mark.parametrize("ipynb", IPYNBS, ids=lambda p: p.name)
def test_first_code_cell_is_the_setup_cell(ipynb):
    first = _code_cells(nbformat.read(ipynb, as_version=4))[0].source
    assert first.startswith("# Setup: the same first cell in every notebook of the series.")
    assert f'REPO_URL = "{REPO_URL}"' in first, "the repository URL must match pyproject.toml"
    assert "from helpers import use_simulated_devices" in first
    assert re.search(r"^devices = use_simulated_devices\(.*\)$", first, re.M)


@pytest.mark.parametrize("ipynb", IPYNBS, ids=lambda p: p.name)
def test_colab_badge_points_at_this_notebook(ipynb):
    nb = nbformat.read(ipynb, as_version=4)
    intro = next(c.source for c in nb.cells if c.cell_type == "markdown")
    assert f"{COLAB_PREFIX}/blob/main/notebooks/{ipynb.name}" in intro
    assert "colab-badge.svg" in intro
    urls = re.findall(
        r"https://colab\.research\.google\.com/github/[^\s)\"]+",
        "\n".join(c.source for c in nb.cells),
    )
    assert all(u.startswith(COLAB_PREFIX) for u in urls), urls


def _bootstrap(ipynb: Path) -> str:
    setup = _code_cells(nbformat.read(ipynb, as_version=4))[0].source
    return setup.split("from helpers import")[0]


@pytest.mark.parametrize("ipynb", IPYNBS, ids=lambda p: p.name)
def test_colab_bootstrap_keeps_colabs_jax(ipynb, monkeypatch):
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append((cmd, kw)))
    monkeypatch.setitem(sys.modules, "google", types.ModuleType("google"))
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    exec(compile(_bootstrap(ipynb), ipynb.name, "exec"), {})
    assert len(calls) == 1
    cmd, kw = calls[0]
    assert cmd[:4] == [sys.executable, "-m", "pip", "install"] and kw.get("check") is True
    assert f"flax-sharding-helpers[checkpoint] @ git+{REPO_URL}" in cmd
    # jax and jaxlib are pinned to the versions already installed, so Colab's GPU build stays.
    for pkg in ("jax", "jaxlib"):
        assert f"{pkg}=={importlib.metadata.version(pkg)}" in cmd
    assert not any(a.startswith("--upgrade") or a == "-U" or a.startswith("--force") for a in cmd)


@pytest.mark.parametrize("ipynb", IPYNBS, ids=lambda p: p.name)
def test_bootstrap_is_a_no_op_off_colab(ipynb, monkeypatch):
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(cmd))
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    exec(compile(_bootstrap(ipynb), ipynb.name, "exec"), {})
    assert calls == []


_FETCHERS = re.compile(
    r"urllib|requests\.|urlopen|wget|curl |http\.client|hf_hub|from_pretrained|load_dataset|tfds\.|"
    r"torchvision\.datasets|keras\.datasets|snapshot_download"
)


@pytest.mark.parametrize("ipynb", IPYNBS, ids=lambda p: p.name)
def test_reads_nothing_from_outside(ipynb):
    for i, cell in enumerate(_code_cells(nbformat.read(ipynb, as_version=4))):
        src = cell.source
        assert not _FETCHERS.search(src), (
            f"{ipynb.name} code cell {i} fetches something: {src[:80]!r}"
        )
        urls = [u for u in re.findall(r"https?://[^\s\"')]+", src) if u != REPO_URL]
        assert not urls, f"{ipynb.name} code cell {i} uses URLs {urls}"
        for path in re.findall(
            r"(?:open|imread|load|read_text|read_bytes)\(\s*[\"']([^\"']+)[\"']", src
        ):
            assert (ipynb.parent / path).exists() or (ROOT / path).exists(), (
                f"{ipynb.name} code cell {i} reads {path!r}, which the repository does not ship"
            )


def test_ruff_clean():
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "helpers", "tests", "notebooks", "conftest.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
