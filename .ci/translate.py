"""The Chinese edition (中文版): generated from the English files and gettext catalogues.

    python .ci/translate.py update   # after editing English: refresh every catalogue
    python .ci/translate.py build    # write the Chinese files from English + catalogues
    python .ci/translate.py check    # exit 1, one line per problem, when the editions drift
    python .ci/translate.py stats    # translated / fuzzy / unconfirmed / to do per catalogue
    python .ci/translate.py confirm CATALOGUE TEXT  # accept reviewed, unchanged translations

Each English file has a catalogue ``i18n/zh/<stem>.po`` and a Chinese twin that is
*generated*, never edited: ``notebooks/NN_x.ipynb`` -> ``notebooks/zh/NN_x.ipynb``,
``README.md`` -> ``README.zh.md``, ``docs/x.md`` -> ``docs/zh/x.md``.

An entry (msgid) is one markdown *block*: a paragraph, a heading, a list item separated
by blank lines, a table's row. A block, not a whole cell, so that editing one paragraph of a
long cell leaves the others translated; not a sentence, so that a translator can
reorder the sentences of a paragraph, as Chinese often needs (Sphinx's gettext builder
chose paragraphs for the same reasons). A code cell's comments are entries too: a run of
whole-line comments at one indentation is one entry, a comment after code another; so are
the comments of a fenced shell block in markdown, and a pragma's explanation in words
(``# noqa: F821 (why)``, ``# fmt: skip  # why``: the pragma stays). Fenced code, blocks with no English words (a
badge, a formula) and bare pragmas (``# noqa``) are copied as they are. The sentences the
code prints to the learner are entries too: each string literal given to ``hint=``,
``right=`` or ``why=`` (see ``messages``); ``build`` writes their translations in place of
the English literals, and that is the only code that differs from the English.

``update`` extracts today's entries, keeps every translation whose msgid is unchanged,
and gives a changed entry the old translation marked ``fuzzy`` (the closest old msgid,
as ``msgmerge`` does) or an empty one. Every translation carries a stamp of the English it
was made from (see ``stamp_of``). ``check`` fails on an empty or fuzzy entry, on a
translation stamped from other English and unchanged since (so clearing ``fuzzy`` alone
does not pass), on an entry the English no longer has, on a Chinese file that differs from
what ``build`` writes, and on a Chinese notebook whose code, comments stripped and printed
messages masked, differs from the English.
"""

from __future__ import annotations

import ast
import copy
import difflib
import hashlib
import io
import re
import sys
import tokenize
import tomllib
import unicodedata
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
    "> **中文版说明：** 正文、代码注释、练习检查打印的句子（提示、判定，以及答案错在哪里）和预期报错的"
    "说明已译成中文（每个 notebook 共用的第一个代码单元格除外）；其余代码与英文版完全相同，运行时打印的"
    "其他输出和图中文字仍是英文。"
    "网站上显示的是英文版运行的输出。"
)
# The READMEs' first lines link each other: the English line, and what the Chinese README shows.
LANGUAGE_LINE = ("**English** · [中文](README.zh.md)", "[English](README.md) · **中文**")
BINDER_TREE = "?urlpath=lab/tree/notebooks"
# The README's JupyterLab commands open the notebooks' folder; the Chinese README's open the
# Chinese notebooks' folder, as its Binder link does.
LAB_TREE = re.compile(r"(--LabApp\.default_url=/lab/tree/notebooks)(?=[\s`]|$)", re.M)
_FENCE = re.compile(r"^\s*(```|~~~)")
_PRAGMA_WORD = r"(?:noqa|type:|fmt:|pragma|pylint|ruff:|isort:)"
_PRAGMA = re.compile(rf"^\s*{_PRAGMA_WORD}")
# a pragma followed by an explanation in words: the pragma is kept, the explanation translated
_PRAGMA_SAYS = re.compile(r"^(noqa: *[A-Z]+[0-9]+(?:, *[A-Z]+[0-9]+)* +)(\(.*\))$")
# a pragma, then a comment of its own on the same line: "fmt: skip  # why"
_PRAGMA_THEN = re.compile(rf"^({_PRAGMA_WORD}[^#]*#\s*)(.*\S)$")
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
    pragma: str = ""  # "noqa: F821 " before a translatable explanation, kept as it is

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
        pragma = ""
        if _PRAGMA.match(text):
            said = _PRAGMA_SAYS.match(text) or _PRAGMA_THEN.match(text)  # the why is prose
            if not said:
                continue
            pragma, text = said.groups()
        trailing = bool(lines[row][:col].strip()) or bool(pragma)
        last = found[-1] if found else None
        if pragma:
            found.append(Comment([row], col, [text], trailing, pragma))
        elif (not trailing and last and not last.trailing and last.column == col
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


def translate_comments(
    source: str, lookup: Callable[[str], str], found: list[Comment] | None = None
) -> str:
    """``source`` with each comment entry replaced by its translation (the code untouched)."""
    lines = source.split("\n")
    for c in reversed(comments(source) if found is None else found):
        new = lookup(c.msgid).split("\n")
        if c.trailing:
            row = c.lines[0]
            lines[row] = lines[row][: c.column] + "# " + c.pragma + " ".join(new).strip()
            continue
        indent = lines[c.lines[0]][: c.column]
        lines[c.lines[0] : c.lines[-1] + 1] = [f"{indent}# {t}".rstrip() for t in new]
    return "\n".join(lines)


_SHELL_COMMENT = re.compile(r"(?:^|(?<=\s))# (.*\S)")


def fence_comments(block: str) -> list[Comment]:
    """The comments (``# `` and words, at a line's start or after a space) of a fenced block.

    A shell or Python block in markdown: its comments are prose, like a code cell's; a
    directive such as ``#SBATCH`` or ``#!`` (no space) is not a comment.
    """
    found: list[Comment] = []
    lines = block.split("\n")
    for row, line in enumerate(lines[1:-1], start=1):
        m = _SHELL_COMMENT.search(line)
        if not m or line[: m.start()].count('"') % 2 or line[: m.start()].count("'") % 2:
            continue
        col, trailing = m.start(), bool(line[: m.start()].strip())
        last = found[-1] if found else None
        if (not trailing and last and not last.trailing and last.column == col
                and last.lines[-1] == row - 1):  # fmt: skip
            last.lines.append(row)
            last.texts.append(m.group(1))
        else:
            found.append(Comment([row], col, [m.group(1)], trailing))
    return [c for c in found if _WORDS.search(c.msgid)]


# --- printed messages: the exercises' feedback and the errors' explanations ----------
#
# ``check(answer, verify, hint=..., right=...)`` and ``expect_error(..., why=...)`` print
# sentences to the learner. Each string literal given to a ``hint``, ``right`` or ``why``
# keyword (directly, or through a name assigned a literal anywhere in the notebook, such as
# ``why = "..."``) is an entry, and so is each string literal that a verifier given to
# ``check`` returns (what a wrong answer prints); ``build`` writes its translation in the
# Chinese notebook's code in place of the English literal. That literal is the only code
# that may differ.

MESSAGE_KEYWORDS = ("hint", "right", "why")


@dataclass
class Message:
    """One printed-message literal of a code cell: its span (character offsets) and msgid."""

    start: int
    end: int
    line: int  # 0-based line of its start
    msgid: str  # the string; for an f-string, its text with the ``{...}`` fields as written
    fstring: bool
    lines: int  # how many source lines the literal spans
    indent: str  # the indentation of its continuation lines, when it spans several


def _tree(source: str) -> ast.Module | None:
    try:
        return ast.parse(_maskable(source))
    except SyntaxError:
        return None


def _message_values(node: ast.expr | None) -> list[ast.expr]:
    """The string literals a keyword's value, an assignment or a verifier's return can print
    (``ok or "what is wrong"``: the string operand)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node]
    if isinstance(node, ast.JoinedStr):
        return [node]
    if isinstance(node, ast.IfExp):
        return _message_values(node.body) + _message_values(node.orelse)
    if isinstance(node, ast.BoolOp):
        return [v for value in node.values for v in _message_values(value)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):  # "a " + ("b" if c else "d")
        return _message_values(node.left) + _message_values(node.right)
    return []


def _verifier_returns(fn: ast.FunctionDef | ast.Lambda) -> list[ast.expr]:
    """The string literals a verifier passed to ``check`` can return: what a wrong answer
    prints."""
    if isinstance(fn, ast.Lambda):
        return _message_values(fn.body)
    return [v for node in ast.walk(fn) if isinstance(node, ast.Return)
            for v in _message_values(node.value)]  # fmt: skip


def message_names(sources: list[str]) -> set[str]:
    """Names given to ``hint=``, ``right=`` or ``why=`` anywhere in these cells, and the
    verifiers given to ``check`` (its second argument): their returned strings print too."""
    names = set()
    for source in sources:
        tree = _tree(source)
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, ast.Call):
                for k in node.keywords:
                    if k.arg in MESSAGE_KEYWORDS:
                        names |= _names_in(k.value)
                if _is_check(node) and len(node.args) >= 2:
                    names |= _names_in(node.args[1])
    return names


def _is_check(node: ast.Call) -> bool:
    return isinstance(node.func, ast.Name) and node.func.id == "check"


def _names_in(node: ast.expr) -> set[str]:
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.IfExp):
        return _names_in(node.body) | _names_in(node.orelse)
    return set()


def _template(node: ast.JoinedStr) -> str:
    """An f-string's text as a translator sees it: literal braces doubled, fields as written."""
    out = []
    for v in node.values:
        if isinstance(v, ast.Constant):
            out.append(str(v.value).replace("{", "{{").replace("}", "}}"))
            continue
        assert isinstance(v, ast.FormattedValue)
        expr = ast.unparse(v.value)
        conversion = {-1: "", 115: "!s", 114: "!r", 97: "!a"}[v.conversion]
        spec = ":" + _template(v.format_spec) if isinstance(v.format_spec, ast.JoinedStr) else ""
        out.append("{" + (" " if expr.startswith("{") else "") + expr + conversion + spec + "}")
    return "".join(out)


def messages(source: str, names: set[str] | frozenset[str] = frozenset()) -> list[Message]:
    """The printed-message literals of a code cell, in source order (see above)."""
    tree = _tree(source)
    if tree is None:
        return []
    nodes: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for k in node.keywords:
                if k.arg in MESSAGE_KEYWORDS:
                    nodes += _message_values(k.value)
            if _is_check(node) and len(node.args) >= 2 and isinstance(node.args[1], ast.Lambda):
                nodes += _verifier_returns(node.args[1])
        elif isinstance(node, ast.FunctionDef) and node.name in names:
            nodes += _verifier_returns(node)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id in names for t in node.targets
        ):
            nodes += _message_values(node.value)
    lines = source.split("\n")
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)

    def offset(row: int, col: int) -> int:  # ast's columns count UTF-8 bytes
        return starts[row - 1] + len(lines[row - 1].encode()[:col].decode())

    found = {}
    for n in nodes:
        assert n.end_lineno is not None and n.end_col_offset is not None
        start, end = offset(n.lineno, n.col_offset), offset(n.end_lineno, n.end_col_offset)
        later = lines[n.lineno] if n.end_lineno > n.lineno else ""
        msgid = n.value if isinstance(n, ast.Constant) else _template(n)  # type: ignore[arg-type]
        found[start] = Message(start, end, n.lineno - 1, msgid, isinstance(n, ast.JoinedStr),
                               n.end_lineno - n.lineno + 1,
                               later[: len(later) - len(later.lstrip())])  # fmt: skip
    return [found[k] for k in sorted(found)]  # entries() keeps those with English words


def fields(template: str) -> list[tuple[bool, str]]:
    """An f-string text split into (is a field, text) runs; ``{{`` and ``}}`` stay literal."""
    out: list[tuple[bool, str]] = []
    i = 0
    while i < len(template):
        if template[i : i + 2] in ("{{", "}}"):
            out.append((False, template[i : i + 2]))
            i += 2
        elif template[i] == "{":
            depth, j, quote = 0, i, ""
            while j < len(template):
                ch = template[j]
                if quote:
                    quote = "" if ch == quote else quote
                elif ch in "'\"":
                    quote = ch
                elif ch == "{":
                    depth += 1
                elif ch == "}":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            out.append((True, template[i : j + 1]))
            i = j + 1
        else:
            out.append((False, template[i]))
            i += 1
    return out


def _width(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def _pieces(runs: list[tuple[bool, str]], limit: int, first: int) -> list[list[tuple[bool, str]]]:
    """Runs cut into pieces of at most ``limit`` columns (the first: ``first``), never inside a
    field, an escape or an English word; after punctuation or a space where one is near."""
    pieces: list[list[tuple[bool, str]]] = [[]]
    width, safe, good = 0, 0, 0  # the current piece may be cut after `safe` runs, best `good`
    for k, run in enumerate(runs):
        piece = pieces[-1]
        prev, next_ = (piece[-1][1][-1:] if piece else ""), run[1][:1]
        if piece and (prev == " " or not prev.isascii() or not next_.isascii()):
            safe = len(piece)  # not inside a run of ASCII, such as a name or a number
            if prev in "，。；：、）”" or next_ in "（“" or prev == " " and next_.isascii():
                good = len(piece)
        piece.append(run)
        width += _width(run[1])
        over = width > (first if len(pieces) == 1 else limit)
        if len(pieces) == 1 and over and not good and width <= limit:
            continue  # the first line may run on to a good place to cut
        if over and 0 < safe < len(piece):
            if k < len(runs) - 1:
                cut = good if good > len(piece) // 2 or len(pieces) == 1 and good else safe
                pieces.append(piece[cut:])
                del piece[cut:]
                width, safe, good = sum(_width(r[1]) for r in pieces[-1]), 0, 0
    return [p for p in pieces if p]


def _literal(text: str, fstring: bool, indent: str = "", limit: int = 0, first: int = 0) -> str:
    """A Python string literal (double quotes) for ``text``; cut into pieces over lines
    joined by implicit concatenation when ``limit`` is given (inside brackets only)."""
    esc = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}
    runs = fields(text) if fstring else [(False, ch) for ch in text]
    runs = [(f, t if f else "".join(esc.get(ch, ch) for ch in t)) for f, t in runs]
    out = []
    cut = [runs]
    if limit:  # even pieces: shrink the width while that leaves as many pieces
        cut = _pieces(runs, limit, first or limit)
        for k in range(1, 10):
            tighter = _pieces(runs, limit - 3 * k, (first or limit) - 3 * k)
            if len(tighter) > len(cut):
                break
            cut = tighter
    for piece in cut:
        body = "".join(t for _, t in piece)
        prefix = "f" if fstring and any(f or "{" in t or "}" in t for f, t in piece) else ""
        out.append(f'{prefix}"{body}"')
    return ("\n" + indent).join(out)


def translate_messages(source: str, lookup: Callable[[str], str], names: set[str]) -> str:
    """``source`` with each printed-message literal replaced by its translation."""
    for m in reversed(messages(source, names)):
        zh = lookup(m.msgid)
        if zh == m.msgid:
            continue  # untranslated: the English literal, as written
        limit = first = 0
        if m.lines > 1:  # the English is cut over lines inside brackets: so is the Chinese
            spanned = source.split("\n")[m.line : m.line + m.lines]
            limit = max(30, max(len(x) for x in spanned) - len(m.indent) - 3)
            first = max(20, limit - len(source[: m.start].rsplit("\n", 1)[-1]) + len(m.indent))
        new = _literal(zh, m.fstring, m.indent, limit, first)
        source = source[: m.start] + new + source[m.end :]
    return source


def mask_messages(source: str, names: set[str]) -> str:
    """``source`` with every printed-message literal replaced by ``"…"``: the code around it."""
    for m in reversed(messages(source, names)):
        source = source[: m.start] + '"…"' + source[m.end :]
    return source


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
    message: bool = False  # a printed-message literal of the code (see ``messages``)

    @property
    def kind(self) -> str:
        return " (code comment)" if self.comment else " (printed message)" if self.message else ""


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
            if _FENCE.match(block):
                for c in fence_comments(block):
                    found.setdefault(c.msgid, Entry(c.msgid, comment=True)).where.append(where)
            for unit in units(block):
                if translatable(unit):
                    found.setdefault(unit, Entry(unit)).where.append(where)
    if doc.is_notebook:
        nb = nbformat.read(root / doc.english, as_version=4)
        names = message_names([c.source for c in nb.cells if c.cell_type == "code"])
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "code" and not _is_setup(nb, i):
                for m in messages(cell.source, names):
                    if not _WORDS.search(m.msgid):
                        continue
                    e = found.setdefault(m.msgid, Entry(m.msgid, message=True))
                    e.where.append(f"cell {i}, line {m.line + 1}")
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
        new.comment = "; ".join(e.where) + e.kind
        if e.msgid in by_id:
            prev = by_id[e.msgid]
            new.msgstr, new.flags = prev.msgstr, list(prev.flags)
            new.previous_msgid = prev.previous_msgid
            new.tcomment = prev.tcomment
            if stamp_of(prev):
                _write_stamp(new, *stamp_of(prev))  # type: ignore[misc]
            kept += 1
        else:
            near = difflib.get_close_matches(e.msgid, [u.msgid for u in unused], n=1, cutoff=0.6)
            if near and by_id[near[0]].msgstr:
                prev = by_id[near[0]]
                new.msgstr, new.flags, new.previous_msgid = prev.msgstr, ["fuzzy"], near[0]
                new.tcomment = prev.tcomment
                # the English this translation was made from, so that clearing `fuzzy` alone
                # cannot pass `check`
                _write_stamp(new, *(stamp_of(prev) or (digest(prev.msgid), digest(prev.msgstr))))
                fuzzy += 1
            else:
                empty += 1
        po.append(new)
    restamp(po)
    doc.catalogue.parent.mkdir(parents=True, exist_ok=True)
    po.save(str(doc.catalogue))
    return kept, fuzzy, empty


# --- stamps: the English each translation was made from -----------------------------
#
# Each translated entry carries an extracted comment ``stamp: en=<hash> zh=<hash>``: a hash
# of the English (msgid) its translation was made from, and of that translation (msgstr).
# ``update`` keeps the stamp when it marks an entry fuzzy, so the stamp still names the old
# English. ``build`` restamps an entry whose translation changed (a translator revised it
# for today's English). ``check`` fails on a translation stamped from other English that
# has not changed since: clearing ``#, fuzzy`` alone no longer passes. A translator who
# reviewed such an entry and finds it still right says so with ``confirm``.

_STAMP = re.compile(r"^stamp: en=([0-9a-f]{12}) zh=([0-9a-f]{12})$", re.M)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def stamp_of(entry: polib.POEntry) -> tuple[str, str] | None:
    """(hash of the English, hash of the translation) the entry was stamped with, if any."""
    m = _STAMP.search(entry.comment or "")
    return (m.group(1), m.group(2)) if m else None


def _write_stamp(entry: polib.POEntry, en: str, zh: str) -> None:
    lines = [x for x in (entry.comment or "").split("\n") if x and not _STAMP.match(x)]
    entry.comment = "\n".join([*lines, f"stamp: en={en} zh={zh}"])


def restamp(po: polib.POFile) -> int:
    """Stamp every translated entry whose translation is new or changed: made from today's
    English. A fuzzy entry, and one whose translation did not change, keep their stamps."""
    changed = 0
    for e in po:
        if e.obsolete or e.fuzzy or not e.msgstr.strip():
            continue
        stamp = stamp_of(e)
        if stamp is None or stamp[1] != digest(e.msgstr):
            _write_stamp(e, digest(e.msgid), digest(e.msgstr))
            changed += 1
    return changed


def stale(entry: polib.POEntry) -> str:
    """Why a translated, non-fuzzy entry's stamp does not vouch for it ('' when it does)."""
    stamp = stamp_of(entry)
    if stamp is None or stamp[1] != digest(entry.msgstr):
        return "a translation not stamped since it changed (run build)"
    if stamp[0] != digest(entry.msgid):
        return "a translation made from other English, unchanged since"
    return ""


def confirm(doc: Doc, text: str) -> list[str]:
    """Accept, as reviewed, the unchanged translations of ``doc``'s entries whose English
    contains ``text``: clear ``fuzzy`` and stamp them with today's English. Returns them."""
    po = load(doc)
    done = []
    for e in po:
        if e.obsolete or not e.msgstr.strip() or text not in e.msgid:
            continue
        if e.fuzzy or stale(e):
            e.flags = [f for f in e.flags if f != "fuzzy"]
            e.previous_msgid = None
            _write_stamp(e, digest(e.msgid), digest(e.msgstr))
            done.append(e.msgid.split("\n")[0][:70])
    if done:
        po.save(str(doc.catalogue))
    return done


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
        if _FENCE.match(block):
            out.append(translate_comments(block, lookup, fence_comments(block)) + sep)
            continue
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
                return LAB_TREE.sub(r"\1/zh", _translate_markdown(text, lookup, fix))
            return _translate_markdown(text, lookup, fix)
        nb = nbformat.read(self.root / doc.english, as_version=4)
        zh = copy.deepcopy(nb)
        zh.metadata.pop("jupytext", None)
        zh.metadata["language"] = LANGUAGE
        names = message_names([c.source for c in nb.cells if c.cell_type == "code"])
        first = True
        for i, cell in enumerate(zh.cells):
            if cell.cell_type == "markdown":
                cell.source = _translate_markdown(cell.source, lookup, fix)
                if first:
                    cell.source, first = _with_note(cell.source), False
            elif cell.cell_type == "code" and not _is_setup(zh, i):
                source = translate_messages(cell.source, lookup, names)
                cell.source = translate_comments(source, lookup)
        return nbformat.writes(zh) + "\n"

    def build_one(self, doc: Doc) -> bool:
        """Stamp ``doc``'s revised translations and write its twin; whether the twin changed."""
        if doc.catalogue.exists():
            po = self._po.get(doc.english) or load(doc)
            self._po[doc.english] = po
            if restamp(po):
                po.save(str(doc.catalogue))
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
        elif why := stale(have[e.msgid]):
            hint = (
                f"revise it, or after review: python .ci/translate.py confirm "
                f"{doc.catalogue.stem} {short[:30]!r}"
                if "other English" in why
                else ""
            )
            found.append(f"{where}: {why}: {short!r}" + (f" ({hint})" if hint else ""))
        else:
            found += [f"{where}: {p} in the translation of {short!r}"
                      for p in structure(e, have[e.msgid].msgstr)]  # fmt: skip
    gone = set(have) - {e.msgid for e in today}
    found += [f"{doc.catalogue.name}: entry no longer in the English (run update): "
              f"{s.split(chr(10))[0][:60]!r}" for s in sorted(gone)]  # fmt: skip
    twin = root / doc.twin
    if not twin.exists():
        return [*found, f"{doc.twin}: missing (run build)"]
    if twin.read_text() != builder.render(doc):
        found.append(f"{doc.twin}: not what build makes from today's English and catalogue")
    if doc.is_notebook:
        found += code_differs(root / doc.english, twin)
    return found


_CODE = re.compile(r"`[^`]+`")
# A span of English prose in code font (three words or more, one of them a function word, no
# character of code), such as `128 × the model axis`: the translation may say it in Chinese.
_PROSE_SPAN = re.compile(
    r"^`(?=(?:[^`]*\s){2})(?=[^`]*\b(?:the|of|per|an?|to|and)\b)[^`()=._\"'\[\]:/<>{}]+`$"
)
_ITEM = re.compile(r"^\s*([-*+]|\d+[.)])\s")


def structure(entry: Entry, msgstr: str) -> list[str]:
    """What a translation broke of its English block's markdown (empty: nothing)."""
    msgid, found = entry.msgid, []
    if entry.comment:
        return found
    if entry.message:  # a string in the code: its f-string fields and code spans stay
        ours = sorted(t for f, t in fields(msgid) if f)
        if ours != sorted(t for f, t in fields(msgstr) if f):
            found.append(f"f-string fields other than the English's {', '.join(ours)[:60]}")
        missing = set(_CODE.findall(msgid)) - set(_CODE.findall(msgstr))
        if missing:
            found.append(f"code spans dropped or changed: {', '.join(sorted(missing))[:80]}")
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
    missing = {c for c in missing if not _PROSE_SPAN.match(c)}
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
    names = [
        message_names([c.source for c in nb.cells if c.cell_type == "code"]) for nb in (en, zh)
    ]
    for i, (a, b) in enumerate(zip(en.cells, zh.cells, strict=True)):
        if a.cell_type != b.cell_type or a.get("metadata") != b.get("metadata"):
            found.append(f"{chinese.name} cell {i}: its type or metadata differ from the English")
        elif a.cell_type == "code" and code_of(a.source, names[0]) != code_of(b.source, names[1]):
            found.append(f"{chinese.name} cell {i}: its code differs from the English")
    return found


def code_of(source: str, names: set[str]) -> str:
    """What must be the same in both editions: the code without its comments and with every
    printed-message literal masked (those carry the language)."""
    return strip_comments(mask_messages(source, names))


def stats(doc: Doc) -> str:
    po = load(doc)
    today = {e.msgid for e in entries(doc)}
    live = [e for e in po if e.msgid in today]
    done = sum(1 for e in live if e.msgstr.strip() and not e.fuzzy and not stale(e))
    unconfirmed = sum(1 for e in live if e.msgstr.strip() and not e.fuzzy and stale(e))
    fuzzy = sum(1 for e in live if e.fuzzy)
    to_do = len(today) - done - fuzzy - unconfirmed
    return (
        f"{doc.catalogue.name}: {done} translated, {fuzzy} fuzzy, {unconfirmed} unconfirmed, "
        f"{to_do} to do"
    )


USAGE = "usage: python .ci/translate.py {update|build|check|stats|confirm CATALOGUE TEXT}"


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"update", "build", "check", "stats", "confirm"}:
        print(USAGE, file=sys.stderr)
        return 2
    command = argv[0]
    if command == "confirm":
        by_stem = {d.catalogue.stem: d for d in documents()}
        if len(argv) != 3 or Path(argv[1]).stem not in by_stem or not argv[2].strip():
            print(USAGE + "\n  CATALOGUE: one of " + ", ".join(by_stem), file=sys.stderr)
            return 2
        done = confirm(by_stem[Path(argv[1]).stem], argv[2])
        print(f"translate: confirmed {len(done)} entr{'y' if len(done) == 1 else 'ies'}"
              + "".join(f"\n  {d}" for d in done))  # fmt: skip
        return 0 if done else 1
    if len(argv) != 1:
        print(USAGE, file=sys.stderr)
        return 2
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
