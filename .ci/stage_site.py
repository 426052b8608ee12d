"""Stage the site's Sphinx sources: the executed notebooks, and the README as the landing page.

    python .ci/stage_site.py EXECUTED_DIR STAGE_DIR

``EXECUTED_DIR`` holds the notebooks a test run executed on 8 simulated devices
(``$EXECUTED_NOTEBOOKS/8``, written by conftest.py with the cells the tests add taken out).
Every committed ``notebooks/NN_*.ipynb`` must be there, with exactly its committed cells
(an executed copy of an older version is refused), and with no error output or traceback:
a deliberate error prints through ``helpers.expect_error``, so any error is a failure.

``STAGE_DIR`` is written anew: ``index.md`` is the README with a table of contents of the
notebooks; ``notebooks/NN_*.ipynb`` are the executed notebooks, each solution cell tagged
``hide-cell`` so that its page folds it (code and output) behind a "Show solution" toggle.
In both, a link to a repository file that is not a page of the site points at it on GitHub.
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


def landing_page(readme: str, notebooks: list[Path], stage: Path) -> str:
    """The README, its links fit for the site, and the site's table of contents."""
    pages = {f"notebooks/{p.name}" for p in notebooks}
    toc = "\n".join(f"notebooks/{p.stem}" for p in notebooks)
    return (
        site_links(readme, "", pages, stage)
        + f"\n\n```{{toctree}}\n:hidden:\n:caption: Notebooks\n:maxdepth: 1\n\n{toc}\n```\n"
    )


def main(executed_dir: Path, stage: Path) -> int:
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
    if stage.exists():
        shutil.rmtree(stage)
    (stage / "notebooks").mkdir(parents=True)
    pages = {f"notebooks/{p.name}" for p in notebooks}
    failures = []
    for path in notebooks:
        failures += [f"{path.name}: {p}" for p in stage_notebook(path, executed_dir, stage, pages)]
    if failures:
        print("build_site: the executed notebooks cannot be published:", file=sys.stderr)
        print("\n".join(f"  {f}" for f in failures), file=sys.stderr)
        return 1
    readme = (ROOT / "README.md").read_text()
    (stage / "index.md").write_text(landing_page(readme, notebooks, stage))
    print(f"build_site: staged {len(notebooks)} executed notebooks from {executed_dir}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
