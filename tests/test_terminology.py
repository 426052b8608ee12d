"""The Chinese edition uses one rendering per term: ``docs/terminology.md`` enforced.

The table's last column ("not · 不用") lists the renderings the edition does not use. Every
translation in every catalogue (``i18n/zh/*.po``, the msgstrs, fuzzy ones included: they are
what the next translator starts from) is searched for them, outside what is not a rendering
(code spans, link targets, URLs, HTML comments, quoted English, an English gloss in full-width
brackets, a printed message's f-string fields), and apart from the page's short list of
exceptions, each with its reason. The edition's note that ``.ci/translate.py`` adds to every
Chinese notebook is checked too.

The check bites: a planted inconsistency in a copy of a catalogue is reported.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import polib
import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "terminology.md"
CATALOGUES = sorted((ROOT / "i18n" / "zh").glob("*.po"))

_CHINESE = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
# What a forbidden word may stand in, each replaced by a space before searching:
_NOT_A_RENDERING = [
    re.compile(r"<!--.*?-->", re.S),  # an HTML comment
    re.compile(r"(`+)(?:(?!\1).)+?\1", re.S),  # a code span
    re.compile(r"\]\([^)]*\)"),  # a link's target
    re.compile(r"<https?://[^>]*>|https?://\S+"),  # a URL
    re.compile(rf"“[^“”{_CHINESE}]*”|\"[^\"{_CHINESE}]*\""),  # quoted English
    re.compile(rf"（[^（）{_CHINESE}]*）"),  # an English gloss: 嵌入（embedding）
    re.compile(rf"\{{[^{{}}{_CHINESE}]*\}}"),  # a printed message's f-string field: code
]


@dataclass(frozen=True)
class Term:
    english: str
    chinese: str
    forbidden: tuple[str, ...]

    def patterns(self) -> list[tuple[str, re.Pattern[str]]]:
        out = []
        for word in self.forbidden:
            if len(word) > 2 and word.startswith("/") and word.endswith("/"):
                out.append((word, re.compile(word[1:-1])))
            elif word.isascii():
                out.append((word, re.compile(
                    rf"(?<![-\w]){re.escape(word)}(?:s|es|d|ed|ing)?(?![-\w])", re.I
                )))  # fmt: skip
            else:
                out.append((word, re.compile(re.escape(word))))
        return out


def _rows(text: str, header: str) -> list[list[str]]:
    """The rows (cells stripped) of the markdown table whose header row starts with ``header``."""
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def terms(text: str | None = None) -> list[Term]:
    text = PAGE.read_text() if text is None else text
    return [
        Term(r[0], r[1], tuple(w.strip() for w in r[3].split("、") if w.strip()))
        for r in _rows(text, "| English | 中文 |")
    ]


def exceptions(text: str | None = None) -> set[tuple[str, str, str]]:
    """(catalogue stem, first words of the English, forbidden word) that may stand."""
    text = PAGE.read_text() if text is None else text
    return {(r[0], r[1].strip("`"), r[2]) for r in _rows(text, "| catalogue |")}


def searchable(msgstr: str) -> str:
    for pattern in _NOT_A_RENDERING:
        msgstr = pattern.sub(" ", msgstr)
    return msgstr


def findings(paths: list[Path], extra: dict[str, str] | None = None) -> list[str]:
    """One line per forbidden rendering found in the catalogues' translations (and in the
    texts of ``extra``, by name)."""
    table, allowed = terms(), exceptions()
    texts: list[tuple[str, str, str]] = [
        (p.stem, e.msgid, e.msgstr)
        for p in paths
        for e in polib.pofile(str(p), wrapwidth=0)
        if e.msgstr and not e.obsolete
    ]
    texts += [(name, name, text) for name, text in (extra or {}).items()]
    found = []
    for stem, msgid, msgstr in texts:
        text = searchable(msgstr)
        for term in table:
            for word, pattern in term.patterns():
                for m in pattern.finditer(text):
                    if any(stem == c and msgid.startswith(e) and word == w for c, e, w in allowed):
                        continue
                    around = text[max(0, m.start() - 25) : m.end() + 25].replace("\n", " ")
                    found.append(
                        f"{stem}: {msgid[:40]!r}: {word!r} ({term.english} is "
                        f"{term.chinese.split('；')[0]}): …{around}…"
                    )
    return found


def test_the_table_parses_and_forbids_what_the_issue_named():
    table = {t.english: t for t in terms()}
    assert len(table) > 100
    assert "gather" in table["gather (the all-gather of a sharded array)"].forbidden
    assert "代价模型" in table["cost model"].forbidden
    for english in ("model parallelism (MP)", "sharding strategy", "lazy initialisation"):
        assert english in table, english
    assert table["GPU memory (HBM), a GPU's device memory"].chinese.startswith("显存")
    # issue 52's list: one rendering each for backend, mask, partitioner, helper, unpipelined
    for english, word in [("backend (XLA's CPU, GPU or TPU backend)", "backend"),
                          ("mask (attention mask, padding mask)", "mask"),
                          ("SPMD partitioner", "切分器"), ("unpipelined", "不切流水线"),
                          ("detour (what \"Going deeper\" holds)", "题外话")]:  # fmt: skip
        assert word in table[english].forbidden, english
    helper = dict(table["helper functions; the `helpers` package"].patterns())
    assert any(p.search("每个 helper 要么") for p in helper.values())
    assert not any(p.search("helpers 包里的 GPipe") for p in helper.values())
    for term in table.values():
        assert all(p.pattern for _, p in term.patterns())
        rendering = searchable(term.chinese.split("；")[0])  # not what it forbids
        assert not any(p.search(rendering) for _, p in term.patterns()), term
    assert all(len(e) == 3 and e[1] and e[2] for e in exceptions())


def test_every_exception_is_still_needed():
    """An exception that no longer matches anything is dead weight: remove it."""
    table = [w for t in terms() for w in t.forbidden]
    for stem, start, word in exceptions():
        assert word in table, (stem, start, word)
        po = ROOT / "i18n" / "zh" / f"{stem}.po"
        entries = [e for e in polib.pofile(str(po)) if e.msgid.startswith(start) and e.msgstr]
        assert entries, f"{stem}: no entry starts with {start!r}"
        term = next(t for t in terms() if word in t.forbidden)
        pattern = dict(term.patterns())[word]
        assert any(pattern.search(searchable(e.msgstr)) for e in entries), (stem, start, word)


def test_the_catalogues_use_one_rendering_per_term():
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("translate", ROOT / ".ci" / "translate.py")
    translate = sys.modules.get("translate")
    if translate is None:
        translate = importlib.util.module_from_spec(spec)
        sys.modules["translate"] = translate
        spec.loader.exec_module(translate)
    found = findings(CATALOGUES, {"translate.NOTE": translate.NOTE})
    assert not found, f"{len(found)} rendering(s) docs/terminology.md forbids:\n" + "\n".join(
        found[:40]
    )


def test_what_is_not_a_rendering_is_not_reported():
    text = searchable(
        "XLA 的 `gather` 算子；all-gather 与 reduce-scatter；收集（gather）；"
        '[链接](https://x.org/gather) 和 “Open trace file”、"block_0"；持有 {blocks:.1f} 个块'
    )
    assert not any(p.search(text) for t in terms() for _, p in t.patterns()), text


def test_a_planted_inconsistency_fails(tmp_path):
    """Bare "gather", "cell" and 代价模型 planted in a copy of a catalogue are each reported."""
    source = ROOT / "i18n" / "zh" / "01_linen_basics.po"
    copy = tmp_path / source.name
    shutil.copy2(source, copy)
    assert findings([copy]) == findings([source])  # the copy starts as the original
    po = polib.pofile(str(copy), wrapwidth=0)
    entry = next(e for e in po if e.msgstr and not e.msgid.startswith("#"))
    entry.msgstr += " 每个 kernel 只 gather 一次；下面的 cell 用代价模型估算。"
    po.save(str(copy))
    found = [f for f in findings([copy]) if f not in findings([source])]
    assert len(found) == 3, found
    for word in ("'gather'", "'cell'", "'代价模型'"):
        assert any(f": {word} (" in f for f in found), (word, found)


@pytest.mark.parametrize("word", ["gathered", "Cells", "blocks", "embeddings", "losses"])
def test_an_english_word_matches_in_its_forms(word):
    hits = [w for t in terms() for w, p in t.patterns() if p.search(searchable(f"每个 {word} 都"))]
    assert hits, word
