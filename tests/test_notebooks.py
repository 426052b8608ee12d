"""Checks on the notebooks that cost nothing at run time.

Running the notebooks themselves is nbmake's job (``pytest`` collects every
``notebooks/*.ipynb``); these tests check the files: jupytext pairs in sync, no
outputs committed, the shared setup cell and Colab bootstrap, metadata, and that
nothing is fetched from outside the repository.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import jupytext
import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
MDS = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.md"))
IPYNBS = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
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
        "each NN_name.md needs its NN_name.ipynb and back"
    )


@pytest.mark.parametrize("ipynb", IPYNBS, ids=lambda p: p.name)
def test_ipynb_has_no_outputs(ipynb):
    nb = nbformat.read(ipynb, as_version=4)
    dirty = [
        i
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code" and (c.outputs or c.execution_count)
    ]
    assert not dirty, (
        f"{ipynb.name}: code cells {dirty} carry outputs; regenerate with jupytext --to ipynb"
    )


def _cell_view(nb) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(c.cell_type, c.source.strip(), tuple(c.metadata.get("tags", ()))) for c in nb.cells]


@pytest.mark.parametrize("md", MDS, ids=lambda p: p.name)
def test_pair_in_sync(md):
    ipynb = md.with_suffix(".ipynb")
    assert _cell_view(jupytext.read(md)) == _cell_view(nbformat.read(ipynb, as_version=4)), (
        f"{md.name} and {ipynb.name} differ: run `jupytext --to ipynb {md.relative_to(ROOT)}`"
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
    )
    assert out.returncode == 0, out.stdout + out.stderr
