"""The glossary page (``docs/glossary.md``): every entry links to a notebook that exists,
at a heading that exists, and that notebook's prose mentions the term. The errata page's
(``docs/errata.md``) links land on notebooks and headings too.

An entry is a ``## Term`` heading, a definition, and one line ``Introduced in [...](link)``
whose link is ``../notebooks/NN_name.ipynb`` with an optional ``#anchor``. The term looked
for is the heading up to any `` (``, or one of the forms listed in its parentheses, compared
without case, backticks or hyphens.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
GLOSSARY = ROOT / "docs" / "glossary.md"
_LINK = re.compile(
    r"^Introduced in \[[^\]]+\]\(\.\./notebooks/([^)#]+\.ipynb)(?:#([^)]+))?\)\.$", re.M
)
_SLUG_DROP = re.compile(r"[^\w\u4e00-\u9fff\- ]")


def slugify(title: str) -> str:
    """A heading's anchor on the site: MyST's GitHub-style slug (``myst_heading_anchors``)."""
    return _SLUG_DROP.sub("", title.lower().replace(" ", "-"))


def _entries() -> list[tuple[str, str]]:
    """``(heading, body)`` of each ``## `` entry of the glossary."""
    parts = re.split(r"^## (.+)$", GLOSSARY.read_text(), flags=re.M)
    return list(zip(parts[1::2], parts[2::2], strict=True))


def _plain(text: str) -> str:
    return re.sub(r"[\s-]+", " ", text.replace("`", "").lower())


def _markdown(nb_path: Path) -> list[str]:
    nb = nbformat.read(nb_path, as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "markdown"]


def _anchors(nb_path: Path) -> set[str]:
    """The anchors the site gives a notebook's markdown headings."""
    return {
        slugify(line.lstrip("#").strip())
        for m in _markdown(nb_path)
        for line in m.splitlines()
        if re.match(r"#{1,6} ", line)
    }


def test_the_glossary_has_the_series_terms():
    terms = {_plain(h.split(" (")[0]) for h, _ in _entries()}
    for needed in ["hlo", "shardy", "gspmd", "mfu", "zero", "fsdp", "dp", "tp", "sp", "pp", "cp",
                   "ep", "donation", "logical axis rules", "partitionspec", "namedsharding",
                   "mesh", "check_vma", "threefry", "remat", "all reduce", "all gather",
                   "reduce scatter", "all to all", "collective permute", "microbatch", "bubble",
                   "roofline", "arithmetic intensity", "the scaling book"]:  # fmt: skip
        assert needed in terms, f"docs/glossary.md has no entry for {needed!r}"


@pytest.mark.parametrize("heading,body", _entries(), ids=[h for h, _ in _entries()])
def test_entry_links_to_a_notebook_that_introduces_it(heading, body):
    links = _LINK.findall(body)
    assert len(links) == 1, f"{heading!r}: needs one line 'Introduced in [...](../notebooks/...)'"
    name, anchor = links[0]
    path = ROOT / "notebooks" / name
    assert path.exists(), f"{heading!r} links to {name}, which does not exist"
    markdown = _markdown(path)
    term, _, also = heading.partition(" (")
    forms = [_plain(f) for f in [term, *also.rstrip(")").split(", ")] if f]
    pattern = re.compile("|".join(rf"(?<![a-z0-9]){re.escape(f)}" for f in forms), re.I)
    assert any(pattern.search(_plain(m)) for m in markdown), (
        f"{heading!r}: {name}'s prose never mentions {' or '.join(map(repr, forms))}"
    )
    if anchor:
        assert anchor in _anchors(path), f"{heading!r}: {name} has no heading #{anchor}"


_ANY_NOTEBOOK_LINK = re.compile(r"\]\(\.\./notebooks/([^)#]+\.ipynb)(?:#([^)]+))?\)")


@pytest.mark.parametrize("page", ["glossary.md", "errata.md"])
def test_site_page_links_reach_notebook_headings(page):
    """The glossary's and the errata page's links to notebooks land on a notebook and heading."""
    text = (ROOT / "docs" / page).read_text()
    links = _ANY_NOTEBOOK_LINK.findall(text)
    assert links, f"docs/{page} links to no notebook"
    for name, anchor in links:
        path = ROOT / "notebooks" / name
        assert path.exists(), f"docs/{page} links to {name}, which does not exist"
        if anchor:
            assert anchor in _anchors(path), f"docs/{page}: {name} has no heading #{anchor}"
