"""The Chinese edition stays in step with the English (``.ci/translate.py``).

- every Chinese file is what ``build`` makes from today's English and its catalogue, every
  entry is translated (none empty, none fuzzy, none stale), and every translation keeps its
  English block's markdown (heading level, link targets, code spans, table cells);
- each Chinese notebook has the English cells, types and metadata, the same setup cell,
  and the same code once comments are stripped; its badge opens it on Colab, and its first
  cell says, in one sentence, that output and figures stay English;
- and the check bites: an English paragraph edited without its translation, a fuzzy entry,
  and code changed in a Chinese notebook are each reported (on a copy, in a tmp dir).

The Chinese notebooks are checked for structure here, not executed: their code is the
English code, which the notebook tests run.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("translate", ROOT / ".ci" / "translate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["translate"] = module
    spec.loader.exec_module(module)
    return module


T = _load()
DOCS = T.documents()
NOTEBOOKS = [d for d in DOCS if d.is_notebook]
BUILDER = T.Builder()


def test_every_english_file_has_a_twin():
    english = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
    assert english and sorted(Path(d.twin).name for d in NOTEBOOKS) == english
    assert {d.twin for d in DOCS} >= {"README.zh.md", "docs/zh/glossary.md", "docs/zh/errata.md"}


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: Path(d.english).stem)
def test_edition_in_step(doc):
    found = T.problems(doc, BUILDER)
    assert not found, f"{len(found)} problem(s); fix, then `python .ci/translate.py build`:\n" + (
        "\n".join(found[:20])
    )


@pytest.mark.parametrize("doc", NOTEBOOKS, ids=lambda d: Path(d.english).stem)
def test_chinese_notebook_structure(doc):
    en = nbformat.read(ROOT / doc.english, as_version=4)
    zh = nbformat.read(ROOT / doc.twin, as_version=4)
    assert not T.code_differs(ROOT / doc.english, ROOT / doc.twin)
    assert all(not c.get("outputs") for c in zh.cells if c.cell_type == "code"), "outputs committed"
    setup = next(i for i, c in enumerate(en.cells) if c.cell_type == "code")
    assert zh.cells[setup].source == en.cells[setup].source, (
        "the setup cell must be the English one"
    )
    first = zh.cells[0].source
    assert T.NOTE in first and first.count("。") >= 1
    badge = re.search(r"\]\((https://colab\.research\.google\.com/github/[^)]+)\)", first)
    assert badge and badge.group(1) == T.REPO_BLOB + doc.twin, "its Colab badge opens itself"
    for a, b in zip(en.cells, zh.cells, strict=True):  # a translated comment breaks no code
        if a.cell_type == "code":
            assert _parses(T._maskable(b.source)) == _parses(T._maskable(a.source)), b.source
    assert zh.metadata["kernelspec"] == en.metadata["kernelspec"]
    assert "jupytext" not in zh.metadata, "a generated notebook is not a jupytext pair"


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except SyntaxError:
        return False
    return True


def test_blocks_and_comments_round_trip():
    """Splitting and joining gives back the English exactly, so nothing is lost in between."""
    for doc in NOTEBOOKS:
        for cell in nbformat.read(ROOT / doc.english, as_version=4).cells:
            if cell.cell_type == "markdown":
                assert "".join(b + s for b, s in T.split_blocks(cell.source)) == cell.source
            else:
                assert T.translate_comments(cell.source, lambda m: m) == cell.source


def test_comment_translation_keeps_the_code():
    source = "x = 1  # one\n# two\n# lines\nif x:\n    y = 2  # noqa: F841\n"
    zh = T.translate_comments(source, {"one": "一", "two\nlines": "两行"}.get)
    assert zh == "x = 1  # 一\n# 两行\nif x:\n    y = 2  # noqa: F841\n"
    assert T.strip_comments(zh) == T.strip_comments(source)


@pytest.fixture
def copy_of_01(tmp_path):
    """Notebook 01, its catalogue and its Chinese twin, copied into a scratch repository."""
    doc = NOTEBOOKS[0]
    for path in (doc.english, doc.twin, str(doc.catalogue.relative_to(ROOT))):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, tmp_path / path)
    return T.Doc(doc.english, doc.twin, tmp_path), tmp_path


def _edit_english(doc, root, edit):
    path = root / doc.english
    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells[1:] if c.cell_type == "markdown" and len(c.source) > 200)
    cell.source = edit(cell.source)
    nbformat.write(nb, path)


def test_the_copy_starts_in_step(copy_of_01):
    doc, root = copy_of_01
    assert T.problems(doc, T.Builder(root)) == T.problems(NOTEBOOKS[0], BUILDER)


def test_english_edited_without_its_translation_fails(copy_of_01):
    doc, root = copy_of_01
    _edit_english(doc, root, lambda s: s.replace(".", ". A sentence added in English.", 1))
    found = T.problems(doc, T.Builder(root))
    assert any("no entry for" in p for p in found), found
    assert any("not what build makes" in p for p in found), found
    assert any("no longer in the English" in p for p in found), found


def test_update_marks_the_edited_entry_fuzzy_and_check_fails(copy_of_01):
    doc, root = copy_of_01
    _edit_english(doc, root, lambda s: s.replace(".", ". A sentence added in English.", 1))
    kept, fuzzy, new = T.update(doc, root)
    assert (fuzzy, new) == (1, 0), (kept, fuzzy, new)
    T.Builder(root).build_one(doc)
    found = T.problems(doc, T.Builder(root))
    assert found and all("fuzzy" in p or "untranslated" in p for p in found), found


def test_code_changed_in_the_chinese_notebook_fails(copy_of_01):
    doc, root = copy_of_01
    path = root / doc.twin
    nb = nbformat.read(path, as_version=4)
    cell = next(c for i, c in enumerate(nb.cells) if c.cell_type == "code" and i > 2)
    cell.source += "\nprint('edited by hand')"
    nbformat.write(nb, path)
    found = T.problems(doc, T.Builder(root))
    assert any("its code differs from the English" in p for p in found), found
    assert any("not what build makes" in p for p in found), found


def test_a_translation_that_breaks_markdown_is_reported():
    entry = T.Entry("## 2. A heading with [a link](../docs/glossary.md) and `code`")
    assert T.structure(entry, "## 2. 带[链接](../docs/glossary.md)和 `code` 的标题") == []
    broken = T.structure(entry, "### 2. 标题[链接](glossary.md)")
    assert len(broken) == 3, broken  # the level, the link target, the code span
    assert T.structure(T.Entry("One\nparagraph."), "一段\n话。") == [
        "a line break inside a paragraph (it renders as a space)"
    ]
