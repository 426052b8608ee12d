"""Checks on the notebooks that cost nothing at run time.

Running the notebooks themselves is ``conftest.py``'s job (``pytest`` collects every
``notebooks/*.ipynb``); these tests check the files: each ``notebooks/NN_name.ipynb`` is
paired with ``notebooks/src/NN_name.md`` in the exact form a JupyterLab save writes, no
outputs are committed, no cell relies on the ``raises-exception`` tag, every exercise has
its three parts, the shared setup cell and Colab bootstrap, metadata, that nothing is
fetched from outside the repository, and that each notebook reads in one sitting.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
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
MDS = sorted(SOURCES.glob("[0-9][0-9]*_*.md"))  # 01_x, 03b_x, ...
IPYNBS = sorted(NOTEBOOKS.glob("[0-9][0-9]*_*.ipynb"))
FIGURES = tomllib.loads((ROOT / "tests" / "figures.toml").read_text())
REPO_URL = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
COLAB_PREFIX = "https://colab.research.google.com/github/" + REPO_URL.removeprefix(
    "https://github.com/"
)


def _load_stats() -> types.ModuleType:
    """`.ci/notebook_stats.py`, the one implementation of the reading-time measure."""
    spec = importlib.util.spec_from_file_location(
        "notebook_stats", ROOT / ".ci" / "notebook_stats.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


STATS = _load_stats()


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


@pytest.mark.parametrize("ipynb", IPYNBS, ids=lambda p: p.name)
def test_reads_in_one_sitting(ipynb):
    """Issue 26: main line <= 45 min, whole <= 70, no code cell but the setup over 25 lines."""
    r = STATS.reading_stats(ipynb)
    problems = []
    if r["main_min"] > STATS.MAIN_LINE_MAX_MIN:
        problems.append(
            f"its main line (every cell before a heading starting 'Going deeper') reads in "
            f"{r['main_min']:.1f} min, over {STATS.MAIN_LINE_MAX_MIN}"
        )
    if r["all_min"] > STATS.WHOLE_MAX_MIN:
        problems.append(
            f"the whole notebook reads in {r['all_min']:.1f} min, over {STATS.WHOLE_MAX_MIN}"
        )
    for i, n in r["long_cells"]:
        problems.append(
            f"cell {i} (counting every cell from 0) has {n} non-blank code lines, over {STATS.CELL_MAX_LINES}"
        )
    assert not problems, (
        f"{ipynb.name} does not read in one sitting (prose words / {STATS.WORDS_PER_MIN} + "
        f"non-blank code lines / {STATS.CODE_LINES_PER_MIN}): " + "; ".join(problems)
    )


def test_readme_quotes_each_notebooks_reading_time():
    """README's learning path gives every notebook's reading time within 2 minutes of the measure.

    After a notebook changes, `python .ci/notebook_stats.py --reading --write` rewrites it.
    """
    quoted = STATS.readme_reading_times((ROOT / "README.md").read_text())
    wrong = []
    for ipynb in IPYNBS:
        r = STATS.reading_stats(ipynb)
        if ipynb.name not in quoted:
            wrong.append(f"{ipynb.name}: no row in README's learning path")
            continue
        main, whole = quoted[ipynb.name]
        if abs(main - r["main_min"]) > 2 or abs(whole - r["all_min"]) > 2:
            wrong.append(
                f"{ipynb.name}: README says {main} / {whole} min, the measure gives "
                f"{r['main_min']:.0f} / {r['all_min']:.0f}"
            )
    assert not wrong, (
        "README's reading times are stale (run `python .ci/notebook_stats.py --reading --write`): "
        + "; ".join(wrong)
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


# Issue 52: a claim is printed by a cell, cited with a link, or deleted. These phrases mark
# a result the learner cannot see (another run, another version, a run "we" made).
UNSEEN_RUNS_EN = re.compile(
    r"not\s+shown\s+here|when\s+we\s+ran|seen\s+in\s+the\s+version\s+matrix|in\s+a\s+run\s+we\s+tried",
    re.IGNORECASE,
)
UNSEEN_RUNS_ZH = re.compile(r"这里没有展示|此处未展示|我们运行时|在版本矩阵中|我们试过的一次")


def test_no_prose_cites_a_run_the_learner_cannot_see():
    english = [*sorted((ROOT / "notebooks" / "src").glob("*.md")), ROOT / "README.md",
               *sorted((ROOT / "docs").glob("*.md"))]  # fmt: skip
    chinese = [*sorted((ROOT / "notebooks" / "zh").glob("*.ipynb")), ROOT / "README.zh.md",
               *sorted((ROOT / "docs" / "zh").glob("*.md"))]  # fmt: skip
    found = []
    for path, pattern in [(p, UNSEEN_RUNS_EN) for p in english] + [
        (p, UNSEEN_RUNS_ZH) for p in chinese
    ]:
        text = path.read_text(encoding="utf-8")
        for m in pattern.finditer(text):
            found.append(f"{path.relative_to(ROOT)}: ...{text[max(0, m.start() - 60) : m.end()]!r}")
    assert not found, "prose that cites a run the learner cannot see:\n" + "\n".join(found)
