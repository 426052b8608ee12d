"""Sphinx configuration of the series' site, built by ``bash .ci/build_site``.

Sphinx with myst-nb and sphinx-book-theme, as JAX's own documentation is built: pure
Python (pip only), nothing fetched at build time, and the pages load no file from another
host. The notebooks are not executed here (``nb_execution_mode = "off"``): ``.ci/build_site``
stages the notebooks that the test run executed on 8 simulated devices, solution cells
tagged to fold, and the README as the landing page (``.ci/stage_site.py``).
"""

from __future__ import annotations

import html
import tomllib
from pathlib import Path
from urllib.parse import urlparse

from docutils import nodes

ROOT = Path(__file__).resolve().parents[1]
REPO_URL = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
BRANCH = "main"
_OWNER, _NAME = urlparse(REPO_URL).path.strip("/").split("/")[:2]
COLAB = f"https://colab.research.google.com/github/{_OWNER}/{_NAME}/blob/{BRANCH}"
BINDER = f"https://mybinder.org/v2/gh/{_OWNER}/{_NAME}/{BRANCH}?urlpath=lab/tree"

project = "Flax models across many devices"
author = "the flax-sharding-course contributors"
extensions = ["myst_nb", "sphinx.ext.githubpages"]
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
root_doc = "index"

# The outputs are the test run's (see .ci/build_site); nothing runs here.
nb_execution_mode = "off"
nb_output_stderr = "show"
nb_merge_streams = True
# Notebook 13b's calculator is an ipywidgets widget. A static page has no kernel to drive it,
# and nbclient keeps no widget state, so the page shows the widget's text form (the plan's
# table) instead, and loads no widget JavaScript from a CDN (the site works offline).
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None)]
nb_ipywidgets_js = {}
myst_heading_anchors = 3

html_theme = "sphinx_book_theme"
html_title = project
html_static_path = ["_static"]
html_css_files = ["site.css"]
html_show_sourcelink = False
html_copy_source = True  # the download button offers the executed .ipynb
# Light unless the reader picks dark: the figures are drawn for a white page. (An empty mode
# also logs "Got invalid theme mode" on a first visit: pydata/pydata-sphinx-theme#1635.)
html_context = {"default_mode": "light"}
html_theme_options = {
    "repository_url": REPO_URL,
    "repository_branch": BRANCH,
    "path_to_docs": "",
    "use_repository_button": True,
    "use_download_button": True,
    "use_fullscreen_button": False,
    "launch_buttons": {
        "binderhub_url": "https://mybinder.org",
        "colab_url": "https://colab.research.google.com",
        "notebook_interface": "jupyterlab",
    },
    "show_toc_level": 2,
    # pydata-sphinx-theme 0.20 adds a header bar holding a second search box unless this is
    # set (executablebooks/sphinx-book-theme#986); the sidebar has the search box.
    "navbar_persistent": [],
}

# The README's and the notebooks' badges are images on colab.research.google.com and
# mybinder.org; the site shows its own buttons instead (the theme's logos, served from
# _static), so that no page loads anything from another host.
_BADGES = {
    "https://colab.research.google.com/assets/colab-badge.svg": (
        "Open in Colab", "images/logo_colab.png"),
    "https://mybinder.org/badge_logo.svg": ("Launch on Binder", "images/logo_binder.svg"),
}  # fmt: skip


def _button(url: str, label: str, icon: str, depth: int) -> str:
    static = "../" * depth + "_static/"
    return (
        f'<a class="launch-badge reference external" href="{html.escape(url)}">'
        f'<img src="{static}{icon}" alt="" />{label}</a>'
    )


def _chinese(app) -> bool:
    return (app.config.language or "en").startswith("zh")


def _chinese_site(app, config) -> None:
    """The Chinese site (``-D language=zh_CN``, built into the English site's ``zh/``)."""
    if _chinese(app):
        config.html_title = f"{project} · 中文版"
        # The theme's launch menu would open the English notebook; the page's buttons open
        # the Chinese one.
        config.html_theme_options = {**config.html_theme_options, "launch_buttons": {}}


def _language_switch(app, doctree: nodes.document, docname: str) -> None:
    """A link to the same page in the other language, under every page's title."""
    depth = docname.count("/")
    if _chinese(app):
        href, label = "../" * (depth + 1) + f"{docname}.html", "English"
    else:
        href, label = "../" * depth + f"zh/{docname}.html", "中文"
    switch = nodes.raw(
        "",
        f'<p class="language-switch"><a class="reference internal" href="{href}" '
        f'hreflang="{"en" if label == "English" else "zh"}">{label}</a></p>',
        format="html",
    )
    section = next(iter(doctree.findall(nodes.section)), None)
    if section is not None:
        section.insert(1, switch)


def _launch_buttons(app, doctree: nodes.document, docname: str) -> None:
    """Replace the badge images by buttons; a notebook's Colab badge gets a Binder one beside it."""
    depth = docname.count("/")
    for ref in list(doctree.findall(nodes.reference)):
        images = [c for c in ref.children if isinstance(c, nodes.image)]
        if len(images) != 1 or images[0]["uri"] not in _BADGES:
            continue
        label, icon = _BADGES[images[0]["uri"]]
        button = _button(ref["refuri"], label, icon, depth)
        if docname.startswith("notebooks/") and label == "Open in Colab":
            notebook = f"{docname}.ipynb"
            if _chinese(app):
                notebook = notebook.replace("notebooks/", "notebooks/zh/", 1)
            if ref["refuri"] != f"{COLAB}/{notebook}":
                raise ValueError(f"{docname}: its Colab badge links to {ref['refuri']}")
            button += _button(
                f"{BINDER}/{notebook}", "Launch on Binder", "images/logo_binder.svg", depth
            )
        ref.replace_self(nodes.raw("", button, format="html"))


def _chinese_search_stemmer(app, exception) -> None:
    """Sphinx 9.0's Chinese search script names a ``ChineseStemmer`` it does not ship, so the
    search page of the Chinese site fails with "ChineseStemmer is not defined"
    (sphinx-doc/sphinx#14229). Chinese search stems Latin words with the English stemmer,
    which the script does define; point it there, as Sphinx's fix (sphinx-doc/sphinx#14416,
    not yet released) does."""
    if exception is not None or not _chinese(app):
        return
    script = Path(app.outdir) / "_static" / "language_data.js"
    text = script.read_text() if script.exists() else ""
    if "= ChineseStemmer" in text and "EnglishStemmer" in text:
        script.write_text(text.replace("= ChineseStemmer", "= EnglishStemmer"))


# The "Plan your model" page (docs/plan.md, staged as the site's plan.html by .ci/stage_site.py)
# runs the planner in the browser: its script and style load on that page only, and it finds
# Pyodide and the planner's modules in the English site's planner/ (.ci/plan_page.py writes
# them once; the Chinese page, one folder down, loads the same files).
PLAN_PAGE = "plan"
PLAN_ASSETS = "planner/"


def _plan_page(app, pagename: str, templatename, context, doctree) -> None:
    if pagename == PLAN_PAGE:
        app.add_css_file("plan.css")
        assets = ("../" if _chinese(app) else "") + PLAN_ASSETS
        app.add_js_file("plan.js", loading_method="defer", **{"data-assets": assets})


def setup(app):
    app.connect("html-page-context", _plan_page)
    app.connect("config-inited", _chinese_site)
    app.connect("build-finished", _chinese_search_stemmer)
    app.connect("doctree-resolved", _launch_buttons)
    app.connect("doctree-resolved", _language_switch)
    return {"parallel_read_safe": True}
