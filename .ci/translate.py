"""The Chinese edition (中文版): generated from the English files and gettext catalogues.

    python .ci/translate.py update   # after editing English: refresh every catalogue
    python .ci/translate.py build    # write the Chinese files from English + catalogues
    python .ci/translate.py check    # exit 1, one line per problem, when the editions drift
    python .ci/translate.py stats    # translated / fuzzy / untranslated per catalogue

Each English file has a catalogue ``i18n/zh/<stem>.po`` and a Chinese twin that is
*generated*, never edited: ``notebooks/NN_x.ipynb`` -> ``notebooks/zh/NN_x.ipynb``,
``README.md`` -> ``README.zh.md``, ``docs/x.md`` -> ``docs/zh/x.md``.

An entry (msgid) is one markdown *block*: a paragraph, a heading, a list item separated
by blank lines, a table's row. A block, not a whole cell, so that editing one paragraph of a
long cell leaves the others translated; not a sentence, so that a translator can
reorder the sentences of a paragraph, as Chinese often needs (Sphinx's gettext builder
chose paragraphs for the same reasons). A code cell's comments are entries too: a run of
whole-line comments at one indentation is one entry, a comment after code another. Fenced
code, blocks with no English words (a badge, a formula) and tool pragmas (``# noqa``)
are copied as they are. The code itself is always the English code.

``update`` extracts today's entries, keeps every translation whose msgid is unchanged,
and gives a changed entry the old translation marked ``fuzzy`` (the closest old msgid,
as ``msgmerge`` does) or an empty one. ``check`` fails on an empty or fuzzy entry, on an
entry the English no longer has, on a Chinese file that differs from what ``build``
writes, and on a Chinese notebook whose code, comments stripped, differs from the English.
"""

from __future__ import annotations

import copy
import difflib
import io
import re
import sys
import tokenize
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import polib

ROOT = Path(__file__).resolve().parents[1]
CATALOGUES = ROOT / "i18n" / "zh"
LANGUAGE = "zh_CN"
_REPO = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
REPO_BLOB = (
    _REPO.replace("https://github.com/", "https://colab.research.google.com/github/")
    + "/blob/main/"
)
NOTE = (
    "> **中文版说明：** 正文与代码注释已译成中文（每个 notebook 共用的第一个代码单元除外），"
    "代码与英文版完全相同，运行时打印的输出和图中文字仍是英文。"
)
# The READMEs' first lines link each other: the English line, and what the Chinese README shows.
LANGUAGE_LINE = ("**English** · [中文](README.zh.md)", "[English](README.md) · **中文**")
BINDER_TREE = "?urlpath=lab/tree/notebooks"
_FENCE = re.compile(r"^\s*(```|~~~)")
_PRAGMA = re.compile(r"^\s*(noqa|type:|fmt:|pragma|pylint|ruff:|isort:)")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_WORDS = re.compile(r"[A-Za-z]{2,}")
_MARKER = re.compile(r"^\s*<!--.*-->\s*$")  # an HTML comment alone on its line


# --- which files ------------------------------------------------------------------


@dataclass(frozen=True)
class Doc:
    """One English file, its catalogue and its generated Chinese twin (repository paths)."""

    english: str
    twin: str
    root: Path = ROOT

    @property
    def catalogue(self) -> Path:
        return self.root / CATALOGUES.relative_to(ROOT) / f"{Path(self.english).stem}.po"

    @property
    def is_notebook(self) -> bool:
        return self.english.endswith(".ipynb")


def documents(root: Path = ROOT) -> list[Doc]:
    """Every translated file: the notebooks, the README, and the reference pages."""
    docs = [
        Doc(f"notebooks/{p.name}", f"notebooks/zh/{p.name}", root)
        for p in sorted((root / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
    ]
    docs.append(Doc("README.md", "README.zh.md", root))
    docs += [Doc(f"docs/{n}", f"docs/zh/{n}", root) for n in ("glossary.md", "errata.md", "plan.md")]
    return docs


_TWINS = {d.english: d.twin for d in documents()}


def twin_of(path: str) -> str | None:
    """The Chinese twin of repository path ``path``, if it has one."""
    return _TWINS.get(path)


# --- markdown blocks --------------------------------------------------------------


def split_blocks(text: str) -> list[tuple[str, str]]:
    """``text`` as (block, separator after it) pairs; blank lines inside fences don't split."""
    lines = text.split("\n")
    blocks: list[tuple[str, str]] = []
    current: list[str] = []
    blank: list[str] = []
    fenced = False
    for line in lines:
        if _FENCE.match(line):
            fenced = not fenced
        if not fenced and not line.strip():
            blank.append(line)
            continue
        if blank and current:
            blocks.append(("\n".join(current), "\n" + "\n".join(blank) + "\n"))
            current = []
        elif blank and not current:  # leading blank lines
            blocks.append(("", "\n".join(blank) + "\n"))
        blank = []
        current.append(line)
    if current or blank:
        blocks.append(("\n".join(current), "\n".join(blank) and "\n" + "\n".join(blank)))
    return blocks


def units(block: str) -> list[str]:
    """A block's entries: a table's rows one by one (a changed row leaves the rest), else itself."""
    lines = block.split("\n")
    if len(lines) > 1 and all(
        line.lstrip().startswith("|") or _MARKER.match(line) for line in lines
    ):
        return lines  # a table, perhaps between generated-section markers: row by row
    return [block]


def translatable(block: str) -> bool:
    """A block with English words outside code, links' targets and HTML comments."""
    if _FENCE.match(block):
        return False
    text = re.sub(r"<!--.*?-->", "", block, flags=re.S)
    text = re.sub(r"`[^`]*`", "", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"!\[[^\]]*\]", "", text)
    return bool(_WORDS.search(text))


# --- code comments ----------------------------------------------------------------


@dataclass
class Comment:
    """One entry's worth of comments in a code cell: 0-based line numbers, column, texts."""

    lines: list[int]
    column: int
    texts: list[str]
    trailing: bool

    @property
    def msgid(self) -> str:
        return "\n".join(self.texts)


def _maskable(source: str) -> str:
    """The cell with IPython magics and shell lines blanked, so ``tokenize`` reads it."""
    return "\n".join(
        "" if line.lstrip().startswith(("%", "!")) else line for line in source.split("\n")
    )


def comments(source: str) -> list[Comment]:
    """The translatable comments of a code cell, grouped (see the module docstring)."""
    found: list[Comment] = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(_maskable(source)).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return []
    lines = source.split("\n")
    for tok in tokens:
        if tok.type != tokenize.COMMENT:
            continue
        row, col = tok.start[0] - 1, tok.start[1]
        text = tok.string[1:].removeprefix(" ")
        if _PRAGMA.match(text):
            continue
        trailing = bool(lines[row][:col].strip())
        last = found[-1] if found else None
        if (not trailing and last and not last.trailing and last.column == col
                and last.lines[-1] == row - 1):  # fmt: skip
            last.lines.append(row)
            last.texts.append(text)
        else:
            found.append(Comment([row], col, [text], trailing))
    return [c for c in found if _WORDS.search(c.msgid)]


def strip_comments(source: str) -> str:
    """The code without its comments (and lines left blank by them): what must not differ."""
    lines = source.split("\n")
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(_maskable(source)).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return source
    for tok in reversed([t for t in tokens if t.type == tokenize.COMMENT]):
        row, col = tok.start[0] - 1, tok.start[1]
        lines[row] = lines[row][:col].rstrip()
    return "\n".join(line for line in lines if line.strip())


def translate_comments(source: str, lookup: Callable[[str], str]) -> str:
    """``source`` with each comment entry replaced by its translation (the code untouched)."""
    lines = source.split("\n")
    for c in reversed(comments(source)):
        new = lookup(c.msgid).split("\n")
        if c.trailing:
            row = c.lines[0]
            lines[row] = lines[row][: c.column] + "# " + " ".join(new).strip()
            continue
        indent = lines[c.lines[0]][: c.column]
        lines[c.lines[0] : c.lines[-1] + 1] = [f"{indent}# {t}".rstrip() for t in new]
    return "\n".join(lines)


def _is_setup(nb: nbformat.NotebookNode, index: int) -> bool:
    """The notebook's first code cell, the series' setup cell: the same in both editions."""
    first = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    return index == first


# --- entries of a document --------------------------------------------------------


@dataclass
class Entry:
    msgid: str
    where: list[str] = field(default_factory=list)
    comment: bool = False


def _markdown_units(doc: Doc, root: Path) -> Iterator[tuple[str, str]]:
    """(where, markdown text) for each markdown cell or the whole .md file."""
    if doc.is_notebook:
        nb = nbformat.read(root / doc.english, as_version=4)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "markdown":
                yield f"cell {i}", cell.source
    else:
        yield doc.english, (root / doc.english).read_text()


def entries(doc: Doc, root: Path = ROOT) -> list[Entry]:
    """Today's entries of ``doc``, in document order, each msgid once."""
    found: dict[str, Entry] = {}
    for where, text in _markdown_units(doc, root):
        for block, _ in split_blocks(text):
            for unit in units(block):
                if translatable(unit):
                    found.setdefault(unit, Entry(unit)).where.append(where)
    if doc.is_notebook:
        nb = nbformat.read(root / doc.english, as_version=4)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "code" and not _is_setup(nb, i):
                for c in comments(cell.source):
                    e = found.setdefault(c.msgid, Entry(c.msgid, comment=True))
                    e.where.append(f"cell {i}, line {c.lines[0] + 1}")
    return list(found.values())


# --- catalogues -------------------------------------------------------------------


def _new_catalogue(doc: Doc) -> polib.POFile:
    po = polib.POFile(wrapwidth=0)
    po.metadata = {
        "Project-Id-Version": "flax-sharding-course",
        "Language": LANGUAGE,
        "MIME-Version": "1.0",
        "Content-Type": "text/plain; charset=UTF-8",
        "Content-Transfer-Encoding": "8bit",
    }
    po.header = (
        f"Chinese (zh_CN) translation of {doc.english}. Edit msgstr only; see CONTRIBUTING.md."
    )
    return po


def load(doc: Doc) -> polib.POFile:
    if not doc.catalogue.exists():
        return _new_catalogue(doc)
    return polib.pofile(str(doc.catalogue), wrapwidth=0)


def update(doc: Doc, root: Path = ROOT) -> tuple[int, int, int]:
    """Refresh ``doc``'s catalogue from today's English: (kept, fuzzy, empty) entries."""
    old = load(doc)
    by_id = {e.msgid: e for e in old if not e.obsolete}
    po = _new_catalogue(doc)
    po.metadata = old.metadata or po.metadata
    kept = fuzzy = empty = 0
    fresh = entries(doc, root)
    unused = [e for e in by_id.values() if e.msgid not in {f.msgid for f in fresh}]
    for e in fresh:
        new = polib.POEntry(msgid=e.msgid, msgstr="")
        new.comment = "; ".join(e.where) + (" (code comment)" if e.comment else "")
        if e.msgid in by_id:
            prev = by_id[e.msgid]
            new.msgstr, new.flags = prev.msgstr, list(prev.flags)
            new.previous_msgid = prev.previous_msgid
            new.tcomment = prev.tcomment
            kept += 1
        else:
            near = difflib.get_close_matches(e.msgid, [u.msgid for u in unused], n=1, cutoff=0.6)
            if near and by_id[near[0]].msgstr:
                new.msgstr, new.flags, new.previous_msgid = (
                    by_id[near[0]].msgstr,
                    ["fuzzy"],
                    near[0],
                )
                fuzzy += 1
            else:
                empty += 1
        po.append(new)
    doc.catalogue.parent.mkdir(parents=True, exist_ok=True)
    po.save(str(doc.catalogue))
    return kept, fuzzy, empty


def _lookup(po: polib.POFile) -> Callable[[str], str]:
    table = {e.msgid: e.msgstr for e in po if e.msgstr and not e.obsolete and not e.fuzzy}

    def lookup(msgid: str) -> str:
        return table.get(msgid, msgid)  # untranslated: English (check() reports it)

    return lookup


# --- headings and links -----------------------------------------------------------


def slug(heading: str) -> str:
    """The anchor myst-parser (the site) gives a heading: myst_parser's default_slugify."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[`*]", "", text)
    return re.sub(r"[^\w\u4e00-\u9fff\- ]", "", text.strip().lower().replace(" ", "-"))


def _headings(doc: Doc, lookup: Callable[[str], str], root: Path) -> dict[str, str]:
    """English heading slug -> Chinese heading slug, for the document's headings."""
    found = {}
    for _, text in _markdown_units(doc, root):
        for block, _ in split_blocks(text):
            m = re.match(r"^(#{1,6})\s+(.*)$", block)
            if m and "\n" not in block:
                zh = re.match(r"^#{1,6}\s+(.*)$", lookup(block))
                found[slug(m.group(2))] = slug(zh.group(1) if zh else m.group(2))
    return found


def _relative(target: str, start: str) -> str:
    """Repository path ``target`` as a link from the folder ``start`` ('' is the root)."""
    t, s = Path(target).parts, Path(start).parts if start else ()
    common = 0
    while common < min(len(t), len(s)) and t[common] == s[common]:
        common += 1
    return "/".join([".."] * (len(s) - common) + list(t[common:])) or "."


def rewrite_links(text: str, doc: Doc, anchors: Callable[[str], dict[str, str]]) -> str:
    """Links of ``doc``'s English text, made right for its twin's folder and language."""
    here, there = str(Path(doc.english).parent), str(Path(doc.twin).parent)
    here, there = ("" if here == "." else here), ("" if there == "." else there)

    def link(m: re.Match[str]) -> str:
        target = m.group(1)
        if target.startswith(REPO_BLOB):
            path = target.removeprefix(REPO_BLOB)
            return f"]({REPO_BLOB}{twin_of(path) or path})"
        if target.endswith(BINDER_TREE):  # Binder opens the Chinese notebooks' folder
            return f"]({target}/zh)"
        if target in ("README.md", "README.zh.md") and doc.english == "README.md":
            return m.group(0)  # the language line
        if re.match(r"^[a-z][a-z0-9+.-]*:|^/", target):
            return m.group(0)
        path, _, anchor = target.partition("#")
        repo_path = doc.english if not path else str(Path(here, path)) if here else path
        repo_path = str(Path(repo_path)).replace("\\", "/")
        repo_path = re.sub(r"(^|/)[^/]+/\.\./", r"\1", repo_path)
        twin = twin_of(repo_path) or repo_path
        if anchor and twin_of(repo_path):
            anchor = anchors(repo_path).get(anchor, anchor)
        new = "" if not path else _relative(twin, there)
        return f"]({new}{'#' + anchor if anchor else ''})"

    return _LINK.sub(link, text)


# --- building ---------------------------------------------------------------------


def _translate_markdown(text: str, lookup: Callable[[str], str], fix: Callable[[str], str]) -> str:
    out = []
    for block, sep in split_blocks(text):
        done = [lookup(u) if translatable(u) else u for u in units(block)]
        out.append(fix("\n".join(done)) + sep)
    return "".join(out)


def _with_note(text: str) -> str:
    """The first markdown cell with the edition's note after its badge (or its title)."""
    blocks = split_blocks(text)
    at = next((i for i, (b, _) in enumerate(blocks) if "colab-badge.svg" in b), 0)
    blocks.insert(at + 1, (NOTE, "\n\n"))
    if at + 1 == len(blocks) - 1:  # the note ends the cell: move the separator
        (b, sep), (n, _) = blocks[at], blocks[at + 1]
        blocks[at], blocks[at + 1] = (b, "\n\n"), (n, sep.lstrip("\n"))
    return "".join(b + s for b, s in blocks)


class Builder:
    """Writes the twins; caches catalogues and heading maps across documents."""

    def __init__(self, root: Path = ROOT) -> None:
        self.root = root
        self.docs = {d.english: d for d in documents(root)}
        self._po: dict[str, polib.POFile] = {}
        self._anchors: dict[str, dict[str, str]] = {}

    def lookup(self, doc: Doc) -> Callable[[str], str]:
        if doc.english not in self._po:
            self._po[doc.english] = load(doc)
        return _lookup(self._po[doc.english])

    def anchors(self, path: str) -> dict[str, str]:
        if path not in self._anchors:
            doc = self.docs[path]
            self._anchors[path] = _headings(doc, self.lookup(doc), self.root)
        return self._anchors[path]

    def render(self, doc: Doc) -> str:
        """The Chinese twin's text, as ``build`` writes it."""
        lookup = self.lookup(doc)

        def fix(text: str) -> str:
            return rewrite_links(text, doc, self.anchors)

        if not doc.is_notebook:
            text = (self.root / doc.english).read_text()
            if doc.english == "README.md":
                text = text.replace(LANGUAGE_LINE[0], LANGUAGE_LINE[1])
            return _translate_markdown(text, lookup, fix)
        nb = nbformat.read(self.root / doc.english, as_version=4)
        zh = copy.deepcopy(nb)
        zh.metadata.pop("jupytext", None)
        zh.metadata["language"] = LANGUAGE
        first = True
        for i, cell in enumerate(zh.cells):
            if cell.cell_type == "markdown":
                cell.source = _translate_markdown(cell.source, lookup, fix)
                if first:
                    cell.source, first = _with_note(cell.source), False
            elif cell.cell_type == "code" and not _is_setup(zh, i):
                cell.source = translate_comments(cell.source, lookup)
        return nbformat.writes(zh) + "\n"

    def build_one(self, doc: Doc) -> bool:
        """Write ``doc``'s twin; whether it changed."""
        path = self.root / doc.twin
        text = self.render(doc)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and path.read_text() == text:
            return False
        path.write_text(text)
        return True

    def build(self) -> list[str]:
        return [doc.twin for doc in self.docs.values() if self.build_one(doc)]


# --- checking ---------------------------------------------------------------------


def problems(doc: Doc, builder: Builder | None = None) -> list[str]:
    """Why ``doc``'s Chinese edition is not in step with the English (empty: it is)."""
    builder = builder or Builder()
    root = builder.root
    if not doc.catalogue.exists():
        return [f"{doc.english}: no catalogue {doc.catalogue.relative_to(root)} (run update)"]
    po = builder._po.get(doc.english) or load(doc)
    builder._po[doc.english] = po
    have = {e.msgid: e for e in po if not e.obsolete}
    found = []
    today = entries(doc, root)
    for e in today:
        where = f"{doc.english} ({e.where[0]})"
        short = e.msgid.split("\n")[0][:60]
        if e.msgid not in have:
            found.append(f"{where}: no entry for {short!r} (run update, then translate)")
        elif have[e.msgid].fuzzy:
            found.append(f"{where}: fuzzy translation of {short!r}")
        elif not have[e.msgid].msgstr.strip():
            found.append(f"{where}: untranslated {short!r}")
        else:
            found += [f"{where}: {p} in the translation of {short!r}"
                      for p in structure(e, have[e.msgid].msgstr)]  # fmt: skip
    stale = set(have) - {e.msgid for e in today}
    found += [f"{doc.catalogue.name}: entry no longer in the English (run update): "
              f"{s.split(chr(10))[0][:60]!r}" for s in sorted(stale)]  # fmt: skip
    twin = root / doc.twin
    if not twin.exists():
        return [*found, f"{doc.twin}: missing (run build)"]
    if twin.read_text() != builder.render(doc):
        found.append(f"{doc.twin}: not what build makes from today's English and catalogue")
    if doc.is_notebook:
        found += code_differs(root / doc.english, twin)
    return found


_CODE = re.compile(r"`[^`]+`")
_ITEM = re.compile(r"^\s*([-*+]|\d+[.)])\s")


def structure(entry: Entry, msgstr: str) -> list[str]:
    """What a translation broke of its English block's markdown (empty: nothing)."""
    msgid, found = entry.msgid, []
    if entry.comment:
        return found
    level = re.match(r"^(#{1,6}) ", msgid)
    if level and not msgstr.startswith(level.group(0)):
        found.append(f"not a level-{len(level.group(1))} heading")
    if sorted(_LINK.findall(msgid)) != sorted(_LINK.findall(msgstr)):
        found.append("links whose targets differ from the English")
    if msgid.lstrip().startswith("|") and msgid.count("|") != msgstr.count("|"):
        found.append("a table row with another number of cells")
    spans = [{re.sub(r"\s+", " ", c) for c in _CODE.findall(t)} for t in (msgid, msgstr)]
    missing = spans[0] - spans[1]  # a span the English wraps over two lines may be one line
    if missing:
        found.append(f"code spans dropped or changed: {', '.join(sorted(missing))[:80]}")
    lines = msgstr.split("\n")
    if len(lines) > 1 and not all(
        _ITEM.match(x) or _MARKER.match(x) or x.startswith(("|", ">", "  ")) for x in lines[1:]
    ):
        found.append("a line break inside a paragraph (it renders as a space)")
    return found


def code_differs(english: Path, chinese: Path) -> list[str]:
    """Cells whose type, metadata or code (comments stripped) differ between the editions."""
    en, zh = nbformat.read(english, as_version=4), nbformat.read(chinese, as_version=4)
    if len(en.cells) != len(zh.cells):
        return [f"{chinese.name}: {len(zh.cells)} cells, the English has {len(en.cells)}"]
    found = []
    for i, (a, b) in enumerate(zip(en.cells, zh.cells, strict=True)):
        if a.cell_type != b.cell_type or a.get("metadata") != b.get("metadata"):
            found.append(f"{chinese.name} cell {i}: its type or metadata differ from the English")
        elif a.cell_type == "code" and strip_comments(a.source) != strip_comments(b.source):
            found.append(f"{chinese.name} cell {i}: its code differs from the English")
    return found


def stats(doc: Doc) -> str:
    po = load(doc)
    today = {e.msgid for e in entries(doc)}
    live = [e for e in po if e.msgid in today]
    done = sum(1 for e in live if e.msgstr.strip() and not e.fuzzy)
    fuzzy = sum(1 for e in live if e.fuzzy)
    return (
        f"{doc.catalogue.name}: {done} translated, {fuzzy} fuzzy, {len(today) - done - fuzzy} to do"
    )


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in {"update", "build", "check", "stats"}:
        print("usage: python .ci/translate.py {update|build|check|stats}", file=sys.stderr)
        return 2
    command = argv[0]
    if command == "update":
        for doc in documents():
            kept, fuzzy, empty = update(doc)
            print(f"{doc.catalogue.relative_to(ROOT)}: {kept} kept, {fuzzy} fuzzy, {empty} new")
        return 0
    if command == "stats":
        print("\n".join(stats(d) for d in documents()))
        return 0
    builder = Builder()
    if command == "build":
        written = builder.build()
        print(f"translate: wrote {len(written)} file(s)" + "".join(f"\n  {w}" for w in written))
        return 0
    found = [p for d in documents() for p in problems(d, builder)]
    print("\n".join(found) if found else f"translate: {len(documents())} files in step")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
