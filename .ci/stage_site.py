"""Stage the site's Sphinx sources: the executed notebooks, and the README as the landing page.

    python .ci/stage_site.py EXECUTED_DIR STAGE_DIR [--zh]

``EXECUTED_DIR`` holds the notebooks a test run executed on 8 simulated devices
(``$EXECUTED_NOTEBOOKS/8``, written by conftest.py with the cells the tests add taken out).
Every committed ``notebooks/NN_*.ipynb`` must be there, with exactly its committed cells
(an executed copy of an older version is refused), and with no error output or traceback:
a deliberate error prints through ``helpers.expect_error``, so any error is a failure.

``STAGE_DIR`` is written anew: ``index.md`` is the README with a table of contents of the
notebooks and of the reference pages (``docs/glossary.md``, ``docs/errata.md``, staged as
``docs/*.md``); ``plan.md`` is ``docs/plan.md``, the page that runs the planner in the
browser (at the site's root: ``plan.html``); ``notebooks/NN_*.ipynb`` are the executed notebooks, each solution cell tagged
``hide-cell`` so that its page folds it (code and output) behind a "Show solution" toggle.
In both, a link to a repository file that is not a page of the site points at it on GitHub.

With ``--zh`` it stages the Chinese site instead (built into the English site's ``zh/``),
under the same page names: ``README.zh.md`` as ``index.md``, ``notebooks/zh/NN_*.ipynb`` as
``notebooks/NN_*.ipynb``, ``docs/zh/*.md`` as ``docs/*.md`` (``docs/zh/plan.md`` as ``plan.md``). A Chinese notebook gets the
outputs of the English run, cell by cell: its code is the English code (``tests/
test_translation.py`` checks that), so nothing is executed twice.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tomllib
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from helpers.lesson import cell_role  # noqa: E402

REPO_URL = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
BRANCH = "main"
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_IMAGES = {".png", ".svg", ".jpg", ".jpeg", ".gif"}
PAGES = ["docs/glossary.md", "docs/errata.md", "docs/terminology.md"]  # after the notebooks
# The Chinese site's pages: where each lives in the repository -> its page in the stage.
# The planner page (docs/conf.py loads its script): staged at the site's root, as plan.html.
PLAN_PAGE = ("docs/plan.md", "plan.md")
ZH_PAGES = {"docs/zh/glossary.md": "docs/glossary.md", "docs/zh/errata.md": "docs/errata.md",
            "docs/terminology.md": "docs/terminology.md", "docs/zh/plan.md": PLAN_PAGE[1]}  # fmt: skip
_SOLUTION_PROMPTS = {"code_prompt_show": "Show solution", "code_prompt_hide": "Hide solution"}


def problems_in(nb: nbformat.NotebookNode) -> list[str]:
    """Error outputs and tracebacks in an executed notebook, one line each."""
    found = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                found.append(f"cell {i}: error output {out.ename}: {out.evalue}".strip())
                continue
            texts = [out.get("text", "")] + [
                v for k, v in out.get("data", {}).items() if k.startswith("text/")
            ]
            if any("Traceback (most recent call last)" in str(t) for t in texts):
                found.append(f"cell {i}: a traceback in its {out.output_type} output")
    return found


def _cells(nb: nbformat.NotebookNode) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source) for c in nb.cells]


def stage_notebook(committed: Path, executed_dir: Path, stage: Path, pages: set[str]) -> list[str]:
    """Copy one executed notebook into the stage, solutions folded; the problems found."""
    executed = executed_dir / committed.name
    if not executed.exists():
        return [f"no executed copy at {executed}"]
    nb = nbformat.read(executed, as_version=4)
    if _cells(nb) != _cells(nbformat.read(committed, as_version=4)):
        return [f"{executed} was executed from another version of the notebook (stale)"]
    found = problems_in(nb)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = site_links(cell.source, "notebooks", pages, stage)
        if cell_role(cell) == "solution":
            cell.metadata["tags"] = [*cell.metadata.get("tags", []), "hide-cell"]
            cell.metadata["mystnb"] = dict(_SOLUTION_PROMPTS)
    nbformat.write(nb, stage / "notebooks" / committed.name)
    return found


def site_links(text: str, folder: str, pages: set[str], stage: Path) -> str:
    """Markdown ``text`` of a document in ``folder`` (of the repository), its links fit for the site.

    A link to a page of the site stays; an image in the repository is copied into the stage
    and stays; a link to any other file or folder of the repository points at it on GitHub.
    URLs, anchors, and targets that do not exist (Sphinx then fails the build) stay as they are.
    """

    def link(m: re.Match[str]) -> str:
        target = m.group(1)
        path, _, anchor = target.partition("#")
        if not path or re.match(r"^[a-z][a-z0-9+.-]*:|^/", target):
            return m.group(0)
        rel = os.path.normpath(os.path.join(folder, path))
        if rel in pages or rel.startswith("..") or not (ROOT / rel).exists():
            return m.group(0)
        if Path(rel).suffix.lower() in _IMAGES:
            (stage / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, stage / rel)
            return m.group(0)
        kind = "tree" if (ROOT / rel).is_dir() else "blob"
        return f"]({REPO_URL}/{kind}/{BRANCH}/{rel}{'#' + anchor if anchor else ''})"

    return _LINK.sub(link, text)


ZH_CAPTIONS = ("Notebook", "参考")
LANGUAGE_LINES = {"**English** · [中文](README.zh.md)", "[English](README.md) · **中文**"}


def landing_page(
    readme: str,
    notebooks: list[Path],
    stage: Path,
    captions: tuple[str, str] = ("Notebooks", "Reference"),
) -> str:
    """The README, its links fit for the site, and the site's table of contents."""
    pages = {f"notebooks/{p.name}" for p in notebooks} | set(PAGES)
    # The READMEs' first lines link each other; every page of the site has its own switch.
    readme = "".join(line for line in readme.splitlines(keepends=True)
                     if line.strip() not in LANGUAGE_LINES)  # fmt: skip
    toc = "\n".join(f"notebooks/{p.stem}" for p in notebooks)
    ref = "\n".join(p.removesuffix(".md") for p in [PLAN_PAGE[1], *PAGES])
    return (
        site_links(readme, "", pages, stage)
        + f"\n\n```{{toctree}}\n:hidden:\n:caption: {captions[0]}\n:maxdepth: 1\n\n{toc}\n```\n"
        + f"\n```{{toctree}}\n:hidden:\n:caption: {captions[1]}\n:maxdepth: 1\n\n{ref}\n```\n"
    )


def zh_links(text: str, folder: str, stage_folder: str, moved: dict[str, str], stage: Path) -> str:
    """``site_links`` for a Chinese file in ``folder``, staged in ``stage_folder``.

    ``moved`` maps each Chinese page's repository path to its page in the stage; a link to one
    of them points at its staged page; any other link is ``site_links``'.
    """

    def link(m: re.Match[str]) -> str:
        path, _, anchor = m.group(1).partition("#")
        rel = os.path.normpath(os.path.join(folder, path)) if path else ""
        if rel not in moved:
            return site_links(m.group(0), folder, set(), stage)
        new = os.path.relpath(moved[rel], stage_folder or ".")
        return f"]({new}{'#' + anchor if anchor else ''})"

    return _LINK.sub(link, text)


def stage_chinese(executed_dir: Path, stage: Path, notebooks: list[Path]) -> list[str]:
    """Stage the Chinese site: its pages, its notebooks with the English run's outputs."""
    moved = {f"notebooks/zh/{p.name}": f"notebooks/{p.name}" for p in notebooks}
    moved |= ZH_PAGES | {"README.zh.md": "index.md"}
    failures = []
    for path in notebooks:
        executed = nbformat.read(stage / "notebooks" / path.name, as_version=4)  # English, staged
        zh = nbformat.read(ROOT / "notebooks" / "zh" / path.name, as_version=4)
        if [c.cell_type for c in zh.cells] != [c.cell_type for c in executed.cells]:
            failures.append(
                f"zh/{path.name}: its cells are not the English ones (run translate.py)"
            )
            continue
        for en_cell, cell in zip(executed.cells, zh.cells, strict=True):
            cell.metadata = en_cell.metadata  # the solutions' folding, as staged
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = en_cell.outputs, en_cell.execution_count
            else:
                cell.source = zh_links(cell.source, "notebooks/zh", "notebooks", moved, stage)
        nbformat.write(zh, stage / "notebooks" / path.name)
    for source, page in ZH_PAGES.items():
        text = (ROOT / source).read_text()
        folder = os.path.dirname(source)
        (stage / page).write_text(zh_links(text, folder, os.path.dirname(page), moved, stage))
    readme = zh_links((ROOT / "README.zh.md").read_text(), "", "", moved, stage)
    (stage / "index.md").write_text(landing_page(readme, notebooks, stage, captions=ZH_CAPTIONS))
    return failures


def main(executed_dir: Path, stage: Path, chinese: bool = False) -> int:
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))  # 01_x, 03b_x, ...
    if stage.exists():
        shutil.rmtree(stage)
    (stage / "notebooks").mkdir(parents=True)
    (stage / "docs").mkdir()
    pages = {f"notebooks/{p.name}" for p in notebooks} | set(PAGES)
    failures = []
    for path in notebooks:
        failures += [f"{path.name}: {p}" for p in stage_notebook(path, executed_dir, stage, pages)]
    if failures:
        print("build_site: the executed notebooks cannot be published:", file=sys.stderr)
        print("\n".join(f"  {f}" for f in failures), file=sys.stderr)
        return 1
    for page in PAGES:
        text = (ROOT / page).read_text()
        (stage / page).write_text(site_links(text, "docs", pages, stage))
    # The planner page moves from docs/ to the root: its links to the notebooks and the
    # other pages follow it, as the Chinese pages' do (zh_links).
    moved = {p: p for p in pages}
    plan = (ROOT / PLAN_PAGE[0]).read_text()
    (stage / PLAN_PAGE[1]).write_text(zh_links(plan, "docs", "", moved, stage))
    readme = (ROOT / "README.md").read_text()
    (stage / "index.md").write_text(landing_page(readme, notebooks, stage))
    if chinese:
        failures = stage_chinese(executed_dir, stage, notebooks)
        if failures:
            print("build_site: the Chinese edition cannot be published:", file=sys.stderr)
            print("\n".join(f"  {f}" for f in failures), file=sys.stderr)
            return 1
    edition = "Chinese" if chinese else "English"
    print(f"build_site: staged {len(notebooks)} executed notebooks ({edition}) from {executed_dir}")
    return 0


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--zh"]
    if len(args) != 2:
        sys.exit(__doc__)
    sys.exit(main(Path(args[0]), Path(args[1]), chinese="--zh" in sys.argv[1:]))
