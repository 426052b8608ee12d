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


@pytest.mark.parametrize("doc", NOTEBOOKS, ids=lambda d: Path(d.english).stem)
def test_no_fenced_diagram_stays_english(doc):
    """A fenced block in markdown is copied into the Chinese edition as it is, but for its
    comments (a shell block's ``# ...``): a fence with no language, a text diagram, would stay
    English there (02's section 1 did). Draw such a figure as a table or as prose instead."""
    nb = nbformat.read(ROOT / doc.english, as_version=4)
    bare = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        opening = True
        for line in cell.source.split("\n"):
            fence = re.match(r"\s*(```|~~~)(.*)$", line)
            if fence:
                if opening and not fence.group(2).strip():
                    bare.append(f"cell {i}")
                opening = not opening
    assert not bare, f"fenced blocks without a language (copied untranslated): {bare}"


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


# --- the fuzzy loophole: a translation records the English it was made from ---------


def _strip_fuzzy(doc):
    """What the loophole did: delete every `#, fuzzy` mark, leave the Chinese as it was."""
    po = T.polib.pofile(str(doc.catalogue), wrapwidth=0)
    for e in po:
        if e.fuzzy:
            e.flags.remove("fuzzy")
    po.save(str(doc.catalogue))


def test_clearing_fuzzy_without_touching_the_chinese_fails(copy_of_01):
    """The old way: edit the English, update, delete `#, fuzzy`, build. It no longer passes."""
    doc, root = copy_of_01
    _edit_english(doc, root, lambda s: s.replace(".", ". A sentence added in English.", 1))
    T.update(doc, root)
    _strip_fuzzy(doc)
    T.Builder(root).build_one(doc)  # build restamps only a translation that changed
    found = T.problems(doc, T.Builder(root))
    assert len(found) == 1 and "made from other English, unchanged since" in found[0], found
    assert "translate.py confirm 01_linen_basics" in found[0], found


def test_a_revised_or_confirmed_translation_passes(copy_of_01):
    doc, root = copy_of_01
    _edit_english(doc, root, lambda s: s.replace(".", ". A sentence added in English.", 1))
    T.update(doc, root)
    fuzzy = next(e for e in T.load(doc) if e.fuzzy)
    stem = fuzzy.msgid.split("\n")[0][:30]
    assert T.confirm(doc, stem) == [fuzzy.msgid.split("\n")[0][:70]]  # reviewed, unchanged
    T.Builder(root).build_one(doc)
    assert T.problems(doc, T.Builder(root)) == []
    # or revised: the translator changes the Chinese and clears the mark; build stamps it
    _edit_english(doc, root, lambda s: s.replace("A sentence added", "One sentence added", 1))
    T.update(doc, root)
    po = T.polib.pofile(str(doc.catalogue), wrapwidth=0)
    entry = next(e for e in po if e.fuzzy)
    entry.flags.remove("fuzzy")
    entry.msgstr += "（新增一句。）"
    po.save(str(doc.catalogue))
    builder = T.Builder(root)
    builder.build_one(doc)
    assert T.problems(doc, T.Builder(root)) == []


def test_every_translation_is_stamped_with_its_english():
    for doc in DOCS:
        for e in T.load(doc):
            if e.msgstr and not e.fuzzy and not e.obsolete:
                assert T.stamp_of(e) == (T.digest(e.msgid), T.digest(e.msgstr)), e.msgid[:60]


# --- the sentences the exercises and the expected errors print ----------------------


def test_every_hint_right_and_why_is_an_entry():
    """Each `hint=`/`right=`/`why=` of the English notebooks is a literal the catalogue holds:
    given directly, or through a name assigned a literal in the notebook."""
    for doc in NOTEBOOKS:
        nb = nbformat.read(ROOT / doc.english, as_version=4)
        code = [c.source for c in nb.cells if c.cell_type == "code"]
        names = T.message_names(code)
        assigned = {m.msgid for s in code for m in T.messages(s, names)}
        have = {e.msgid for e in T.entries(doc)}
        for source in code:
            for node in ast.walk(ast.parse(T._maskable(source))):
                for k in getattr(node, "keywords", []) if isinstance(node, ast.Call) else []:
                    if k.arg in T.MESSAGE_KEYWORDS:
                        assert T._message_values(k.value) or T._names_in(k.value), (
                            f"{doc.english}: {k.arg}= is neither a literal nor a name: "
                            + ast.unparse(k.value)
                        )
        assert assigned and assigned <= have | {m for m in assigned if not T._WORDS.search(m)}
        assert not any(re.search("[\u4e00-\u9fff]", m) for m in assigned), "Chinese in English"


def test_a_message_is_replaced_in_the_code_and_nothing_else():
    source = (
        'why = "The count is fixed."\n'
        'check(a, verify, right=WHY_RIGHT, hint="Count the "\n'
        '      "devices: `jax.devices()` lists them, all of them, in order.")\n'
        'WHY_RIGHT = f"{n} devices, {{one}} \\"each\\"."\n'
        "with expect_error(ValueError, why=why):\n"
        "    pass\n"
    )
    names = T.message_names([source])
    assert names == {"WHY_RIGHT", "why", "verify"}  # verify: check's verifier (none here)
    found = [m.msgid for m in T.messages(source, names)]
    assert found == [
        "The count is fixed.",
        "Count the devices: `jax.devices()` lists them, all of them, in order.",
        '{n} devices, {{one}} "each".',
    ]
    zh = {
        found[0]: "设备数是固定的。",
        found[
            1
        ]: "数一数设备：`jax.devices()` 会按顺序把它们全部列出来，一个不落，这句话写得长一些。",
        found[2]: "{n} 个设备，{{one}}“每个”。",
    }
    out = T.translate_messages(source, lambda m: zh.get(m, m), names)
    assert T.mask_messages(out, names) == T.mask_messages(source, names)
    namespace: dict = {"n": 4, "check": lambda *a, **k: k, "a": 0, "verify": 0}
    exec(out.split("with")[0].replace("right=WHY_RIGHT, ", ""), namespace)  # noqa: S102
    assert namespace["why"] == zh[found[0]] and namespace["WHY_RIGHT"] == "4 个设备，{one}“每个”。"
    hint_lines = [line for line in out.split("\n") if "数一数" in line or line.startswith("      ")]
    assert len(hint_lines) >= 2, out  # cut over lines, as the English was, to its width
    widest = max(len(line) for line in source.split("\n"))
    assert all(T._width(line) <= widest + 12 for line in hint_lines), out
    assert T.structure(T.Entry(found[2], message=True), "{m} 个设备") == [
        "f-string fields other than the English's {n}"
    ]


def test_what_a_verifier_returns_is_an_entry_and_nothing_else_is():
    """A wrong answer prints the string its verifier returns: each such literal (``return
    "..."``, ``ok or f"..."``, either branch of ``x if c else "..."``, a lambda's) is an
    entry; the verifier's docstring, its other strings and a nested helper's non-string
    return are not."""
    source = (
        "def verify_rows(rows):\n"
        '    """Rows of device 0, in order."""\n'
        "    if rows is None:\n"
        '        return "Return the rows, not None."\n'
        "    def inner(r):\n"
        "        return r[::2]\n"
        '    key = "rows"\n'
        '    return rows == [0, 1] or f"device 0 holds {rows}, not rows 0 and 1"\n'
        "\n"
        'check(answer, verify_rows, hint="Look at the mesh.")\n'
        'check(n, lambda k: True if k == 3 else "three, not {k}".format(k=k))\n'
        'check(m, lambda k: k == 2 or "two devices hold it")\n'
    )
    names = T.message_names([source])
    assert "verify_rows" in names
    found = [m.msgid for m in T.messages(source, names)]
    assert found == [
        "Return the rows, not None.",
        "device 0 holds {rows}, not rows 0 and 1",
        "Look at the mesh.",
        "two devices hold it",
    ]
    zh = {found[0]: "返回这些行，而不是 None。", found[1]: "设备 0 持有 {rows}，不是第 0 和第 1 行"}
    out = T.translate_messages(source, lambda m: zh.get(m, m), names)
    assert T.mask_messages(out, names) == T.mask_messages(source, names)
    namespace: dict = {"check": lambda *a, **k: None, "answer": 0, "n": 0, "m": 0}
    exec(out, namespace)  # noqa: S102
    assert namespace["verify_rows"](None) == zh[found[0]]
    assert namespace["verify_rows"]([2]) == "设备 0 持有 [2]，不是第 0 和第 1 行"


def _literal_value(node, literals):
    if isinstance(node, ast.Name):
        return literals.get(node.id, "")
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.JoinedStr):  # fields rendered as "…": only the words matter here
        return "".join(v.value if isinstance(v, ast.Constant) else "…" for v in node.values)
    return ""


@pytest.mark.parametrize("doc", NOTEBOOKS, ids=lambda d: Path(d.english).stem)
def test_the_chinese_stub_check_answers_in_chinese(doc, capsys):
    """The first check call of each Chinese notebook, given the stub's `...`, prints the
    Chinese "not attempted yet"; and every expect_error's `why` there is Chinese."""
    from helpers.lesson import NOT_ATTEMPTED, NOT_ATTEMPTED_ZH, check, expect_error

    nb = nbformat.read(ROOT / doc.twin, as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    literals = {}
    for source in code:
        for node in ast.walk(ast.parse(T._maskable(source))):
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                literals[node.targets[0].id] = _literal_value(node.value, {})
    calls = [
        node
        for c in nb.cells
        if c.cell_type == "code" and "check" in c.metadata.get("tags", [])
        for node in ast.walk(ast.parse(T._maskable(c.source)))
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "check"
    ]
    assert calls, "no exercise check"
    said = {k.arg: _literal_value(k.value, literals) for k in calls[0].keywords}
    check(..., lambda answer: True, hint=said.get("hint", ""), right=said.get("right", ""))
    out = capsys.readouterr().out
    assert out.startswith(NOT_ATTEMPTED_ZH) and NOT_ATTEMPTED not in out, out
    whys = [
        _literal_value(k.value, literals)
        for source in code
        for node in ast.walk(ast.parse(T._maskable(source)))
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "expect_error"
        for k in node.keywords
        if k.arg == "why"
    ]
    for why in whys:
        with expect_error(ValueError, why=why):
            raise ValueError("x")
        assert capsys.readouterr().out.startswith("预期之中的报错："), why


def test_the_chinese_readme_opens_the_chinese_notebooks():
    """Its JupyterLab commands open notebooks/zh, as its Binder badge does; nothing else of the
    command changes, and the comments of its shell blocks are Chinese."""
    en, zh = (ROOT / "README.md").read_text(), (ROOT / "README.zh.md").read_text()
    lab = re.findall(r"--LabApp\.default_url=\S+", en)
    assert lab and all(u == "--LabApp.default_url=/lab/tree/notebooks" for u in lab)
    assert re.findall(r"--LabApp\.default_url=\S+", zh) == [u + "/zh" for u in lab]
    assert "?urlpath=lab/tree/notebooks/zh" in zh
    assert "# then open" in en and "# then open" not in zh and "# 然后打开 _site/index.html" in zh


def test_a_pragma_keeps_its_codes_and_translates_its_reason():
    source = "x = f(0)  # noqa: F821 (meant to fail)\ny = 2  # noqa: E731\n"
    zh = T.translate_comments(source, {"(meant to fail)": "（本来就该出错）"}.get)
    assert zh == "x = f(0)  # noqa: F821 （本来就该出错）\ny = 2  # noqa: E731\n"


def test_a_comment_after_a_pragma_on_the_same_line_is_translated():
    source = "rows = [f(s) for s in r]  # fmt: skip  # per step: the busiest\nz = 1  # fmt: skip\n"
    assert [c.msgid for c in T.comments(source)] == ["per step: the busiest"]
    zh = T.translate_comments(source, {"per step: the busiest": "每一步：最忙的"}.get)
    assert zh == "rows = [f(s) for s in r]  # fmt: skip  # 每一步：最忙的\nz = 1  # fmt: skip\n"


def test_a_returned_concatenation_is_an_entry_per_string():
    """``return "DeepSpeed refuses " + ("ZeRO-3 ..." if c else f"ZeRO-2 ...")`` (13b's
    exercise): each string of a ``+`` is an entry, translated in place (a native reader found
    it left in English)."""
    source = (
        "def verify_kw(p):\n"
        '    return "refuses " + ("ZeRO-3 with MoE" if p == 3 else f"ZeRO-2 with pp {p}")\n'
        "\n"
        "check(answer, verify_kw)\n"
    )
    names = T.message_names([source])
    found = [m.msgid for m in T.messages(source, names)]
    assert found == ["refuses ", "ZeRO-3 with MoE", "ZeRO-2 with pp {p}"]
    zh = {found[0]: "不允许", found[1]: "有 MoE 时用 ZeRO-3", found[2]: "在 pp {p} 时用 ZeRO-2"}
    out = T.translate_messages(source, lambda m: zh.get(m, m), names)
    assert T.mask_messages(out, names) == T.mask_messages(source, names)
    namespace: dict = {"check": lambda *a, **k: None, "answer": 0}
    exec(out, namespace)  # noqa: S102
    assert namespace["verify_kw"](3) == "不允许有 MoE 时用 ZeRO-3"
    assert namespace["verify_kw"](2) == "不允许在 pp 2 时用 ZeRO-2"
