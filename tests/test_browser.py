"""What a reader and a learner see, in a real browser: the built site, and JupyterLab's UI.

Playwright for Python drives Debian's ``chromium`` (never ``playwright install``: its own
browser download is not reachable offline). This file starts chromium itself, headless,
with its DevTools endpoint on loopback, and Playwright connects to it over CDP; so the
browser has a process id, and each test ends it by that id and checks it is gone.

- ``test_built_site_in_a_browser`` reads the site ``.ci/build_site`` built (``$SITE_DIR``,
  else ``_site/``), served on a loopback port. Every notebook page loads and shows at least
  the figures ``tests/figures.toml`` promises at 8 devices, each image with a non-zero
  natural size; no page shows an error output or a traceback, or logs a script error; every
  internal link resolves (anchors included); every page has its Colab and Binder buttons;
  solutions are folded until clicked; search finds a notebook; nothing is fetched from
  another host. A screenshot of one page is saved under the test's tmp dir. The Chinese
  site (``zh/``) is reached through the language switch, and every link and anchor of its
  pages resolves too; one Chinese page shows its figures, no error, the edition's note, and
  buttons that open the Chinese notebook.
- ``test_jupyterlab_runs_notebook_01_through_its_ui`` starts JupyterLab as the README does
  (``test_launch.JupyterServer``: headless, loopback, token) in a copy of the repository,
  opens notebook 01, runs Run > Run All Cells, waits until every cell ran and the kernel is
  idle, saves through the UI, and asserts that no cell has an error output and that the
  loss figure is shown. Then the browser and the server (with its kernel) are stopped by
  their process ids.

Outside CI a test skips, with a message, where chromium (or the built site) is missing.
``.ci/run`` installs chromium and sets ``BROWSER_TESTS=required``, and then they fail
instead: in CI they never skip.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import shutil
import signal
import subprocess
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urldefrag, urlparse

import nbformat
import psutil
import pytest
from test_launch import LOOPBACK, ROOT, JupyterServer, _learner_clone

from helpers.lesson import cell_role

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))  # 01_x, 03b_x, ...
SITE_DEVICES = 8  # the count .ci/build_site renders
REQUIRED = os.environ.get("BROWSER_TESTS") == "required"
SITE_TEST_SCREENSHOT = "02_distributed_definition"


def _missing(what: str) -> None:
    if REQUIRED:
        pytest.fail(f"{what}; BROWSER_TESTS=required (set by .ci/run) forbids skipping")
    pytest.skip(what)


def chromium_executable() -> str:
    """Debian's chromium (or ``$CHROMIUM``); skips outside CI where there is none."""
    found = os.environ.get("CHROMIUM") or shutil.which("chromium")
    if not found or not os.access(found, os.X_OK):
        _missing("no chromium found: `apt-get install chromium` (Debian), or set CHROMIUM=path")
    return str(found)


class Chromium:
    """Headless chromium with its DevTools endpoint on loopback, for Playwright's CDP."""

    def __init__(self, executable: str, profile: Path) -> None:
        self.profile = profile
        self.log = profile.parent / "chromium.log"
        args = [
            executable,
            "--headless=new",
            f"--user-data-dir={profile}",
            f"--remote-debugging-address={LOOPBACK}",
            "--remote-debugging-port=0",  # chromium picks a free port and writes it down
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "about:blank",
        ]
        if os.geteuid() == 0:  # CI runs as root, where chromium's sandbox cannot start
            args.insert(1, "--no-sandbox")
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def endpoint(self, timeout: float = 60) -> str:
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited: {self.log.read_text()[-2000:]}")
            if port_file.exists():
                lines = port_file.read_text().split()
                if lines:
                    return f"http://{LOOPBACK}:{lines[0]}"
            time.sleep(0.2)
        raise TimeoutError("chromium did not open its DevTools port in time")

    def stop(self) -> None:
        """End chromium and every process it started (its own process group), by id."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _group_alive(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (a zombie waiting to be reaped does not)."""
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                return True
        except (OSError, psutil.Error):
            pass
    return False


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@contextlib.contextmanager
def browser_context(tmp_path: Path) -> Iterator[tuple[object, Chromium, list[str]]]:
    """A Playwright browser context on a fresh chromium; yields (context, chromium, offsite).

    Every request to a host other than loopback is refused and its URL recorded in
    ``offsite``: the pages must not need the network.
    """
    from playwright.sync_api import sync_playwright

    chromium = Chromium(chromium_executable(), tmp_path / "chromium-profile")
    offsite: list[str] = []

    def route(r):
        url = urlparse(r.request.url)
        if url.scheme in ("data", "blob", "about") or url.hostname == LOOPBACK:
            r.continue_()
        else:
            offsite.append(r.request.url)
            r.abort()

    try:
        with sync_playwright() as pw:
            browser = pw.chromium.connect_over_cdp(chromium.endpoint())
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            context.route("**/*", route)
            try:
                yield context, chromium, offsite
            finally:
                context.close()
                browser.close()
    finally:
        chromium.stop()


# ---------------------------------------------------------------------------
# The built site
# ---------------------------------------------------------------------------


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@contextlib.contextmanager
def serve(directory: Path) -> Iterator[str]:
    """Serve ``directory`` on a free loopback port, as GitHub Pages would; yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer((LOOPBACK, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{LOOPBACK}:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _promised_figures(config: pytest.Config, stem: str) -> int | None:
    root_conftest = config.pluginmanager.get_plugin(str(ROOT / "conftest.py"))
    return root_conftest.promised_figures(stem, SITE_DEVICES)


_PAGE_FACTS = """async () => {
  const main = document.querySelector("main") || document.body;
  const all = [...document.images];
  for (const img of all) { img.loading = "eager"; }
  await Promise.all(all.map(img => img.decode().catch(() => null)));
  const size = img => [img.naturalWidth, img.naturalHeight];
  return {
    figures: [...document.querySelectorAll(".cell_output img")].map(size),
    broken: all.filter(img => !(img.naturalWidth > 0 && img.naturalHeight > 0)).map(img => img.src),
    text: main.innerText,
    errorOutputs: document.querySelectorAll(".cell_output .traceback, .cell_output .output.error").length,
    links: [...document.querySelectorAll("a[href]")].map(a => a.href),
    ids: [...document.querySelectorAll("[id]")].map(e => e.id),
    buttons: [...document.querySelectorAll("a.launch-badge")].map(a => [a.innerText.trim(), a.href]),
    solutions: [...document.querySelectorAll("details.hide")].map(d => [
      d.querySelector("summary").innerText.trim(), d.open]),
  };
}"""


def test_built_site_in_a_browser(tmp_path, request):
    site = Path(os.environ.get("SITE_DIR") or ROOT / "_site")
    if not (site / "index.html").exists():
        _missing(f"no built site at {site}: run `bash .ci/build_site` first")
    repo = _repository()
    with serve(site) as base, browser_context(tmp_path) as (context, chromium, offsite):
        page = context.new_page()
        script_errors: list[str] = []
        page.on("pageerror", lambda e: script_errors.append(f"{page.url}: {e}"))
        page.on(
            "console",
            lambda m: m.type == "error" and script_errors.append(f"{page.url}: {m.text}"),
        )
        facts: dict[str, dict] = {}

        def visit(url: str) -> dict:
            response = page.goto(url)
            assert response is not None and response.ok, f"{url} did not load: {response}"
            page.wait_for_load_state("load")
            facts[url] = page.evaluate(_PAGE_FACTS)
            return facts[url]

        landing = visit(base + "index.html")
        assert page.title().startswith("Flax models across many devices"), page.title()
        assert [label for label, _ in landing["buttons"]] == ["Open in Colab", "Launch on Binder"]
        assert not landing["broken"], f"index.html: images that did not load: {landing['broken']}"
        assert "English · 中文" not in landing["text"], (
            "the README's language line, beside the switch"
        )
        for path in NOTEBOOKS:
            url = f"{base}notebooks/{path.stem}.html"
            assert url in landing["links"], f"the landing page does not link {path.stem}"
            seen = visit(url)
            where = f"{path.stem}.html"
            promised = _promised_figures(request.config, path.stem) or 0
            assert len(seen["figures"]) >= promised, (
                f"{where} shows {len(seen['figures'])} figures; figures.toml promises {promised}"
            )
            bad = [size for size in seen["figures"] if min(size) <= 0]
            assert not bad, f"{where}: {len(bad)} figure(s) with no natural size"
            assert not seen["broken"], f"{where}: images that did not load: {seen['broken']}"
            assert seen["errorOutputs"] == 0, f"{where} shows an error output"
            assert "Traceback (most recent call last)" not in seen["text"], f"{where}: a traceback"
            notebook = f"notebooks/{path.name}"
            assert seen["buttons"] == [
                ["Open in Colab", f"{repo['colab']}/{notebook}"],
                ["Launch on Binder", f"{repo['binder']}/{notebook}"],
            ], f"{where}: {seen['buttons']}"
            solutions = [c for c in nbformat.read(path, as_version=4).cells
                         if cell_role(c) == "solution"]  # fmt: skip
            assert seen["solutions"] == [["Show solution", False]] * len(solutions), (
                f"{where}: {len(solutions)} solution cells, folded as {seen['solutions']}"
            )
            if solutions:  # a click unfolds the first one
                toggle = page.locator("details.hide").first
                assert not toggle.locator("pre").first.is_visible()
                toggle.locator("summary").click()
                assert toggle.locator("pre").first.is_visible()

        for reference in ("docs/glossary", "docs/errata"):  # linked from the landing page
            url = f"{base}{reference}.html"
            assert url in landing["links"], f"the landing page does not link {reference}"
            visit(url)

        _check_chinese_page(visit, request, base, repo)

        # Every internal link resolves, and so does its anchor, on every page reached from the
        # landing page (the Chinese site's pages too, through the language switch).
        checked: set[str] = set()
        while todo := sorted(
            {x for f in list(facts.values()) for x in f["links"] if x.startswith(base)} - checked
        ):
            for link in todo:
                checked.add(link)
                target, anchor = urldefrag(link)
                if target.endswith(".html") and target not in facts:
                    visit(target)
                if target in facts:
                    assert not anchor or anchor in facts[target]["ids"], f"broken anchor: {link}"
                else:
                    response = context.request.get(target)
                    assert response.ok, f"broken link: {link} ({response.status})"
        assert f"{base}zh/index.html" in facts, "the Chinese site is not reached from the English"

        page.goto(base + "search.html?q=PartitionSpec")
        results = page.locator("#search-results li a")
        results.first.wait_for(timeout=30_000)
        hrefs = [results.nth(i).get_attribute("href") for i in range(results.count())]
        assert any("notebooks/" in (h or "") for h in hrefs), f"search found no notebook: {hrefs}"
        page.goto(base + "zh/search.html?q=PartitionSpec")  # the Chinese site's search works too
        results = page.locator("#search-results li a")
        results.first.wait_for(timeout=30_000)
        hrefs = [results.nth(i).get_attribute("href") for i in range(results.count())]
        assert any("notebooks/" in (h or "") for h in hrefs), f"zh search found nothing: {hrefs}"

        page.goto(f"{base}notebooks/{SITE_TEST_SCREENSHOT}.html")
        shot = tmp_path / f"site-{SITE_TEST_SCREENSHOT}.png"
        page.screenshot(path=str(shot))
        print(f"screenshot: {shot}")
        assert not script_errors, "\n".join(script_errors)
        assert not offsite, f"the site fetched from other hosts: {sorted(set(offsite))}"
        pid = chromium.proc.pid
    assert _gone(pid) and not _group_alive(pid), "chromium is still running"


def _check_chinese_page(visit, request, base: str, repo: dict[str, str]) -> None:
    """One Chinese page (中文版): it loads, shows its figures and no error, and its buttons
    and language switch lead to the Chinese notebook and back to the English page."""
    name = SITE_TEST_SCREENSHOT
    english = f"{base}notebooks/{name}.html"
    chinese = f"{base}zh/notebooks/{name}.html"
    assert chinese in visit(english)["links"], f"{name}.html has no link to its Chinese page"
    seen = visit(chinese)
    promised = _promised_figures(request.config, name) or 0
    assert len(seen["figures"]) >= promised, f"zh/{name}.html shows {len(seen['figures'])} figures"
    assert not seen["broken"] and seen["errorOutputs"] == 0, f"zh/{name}.html: {seen['broken']}"
    assert "Traceback (most recent call last)" not in seen["text"]
    assert "中文版说明" in seen["text"], f"zh/{name}.html does not say it is the Chinese edition"
    assert english in seen["links"], f"zh/{name}.html has no language switch back to English"
    notebook = f"notebooks/zh/{name}.ipynb"
    assert seen["buttons"] == [
        ["Open in Colab", f"{repo['colab']}/{notebook}"],
        ["Launch on Binder", f"{repo['binder']}/{notebook}"],
    ], f"zh/{name}.html: {seen['buttons']}"


def _repository() -> dict[str, str]:
    """The Colab and Binder URL prefixes, from the repository URL in pyproject.toml."""
    url = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
    owner, name = urlparse(url).path.strip("/").split("/")[:2]
    return {
        "colab": f"https://colab.research.google.com/github/{owner}/{name}/blob/main",
        "binder": f"https://mybinder.org/v2/gh/{owner}/{name}/main?urlpath=lab/tree",
    }


# ---------------------------------------------------------------------------
# JupyterLab, as the README starts it
# ---------------------------------------------------------------------------

LAB_NOTEBOOK = "01_linen_basics.ipynb"
LAB_TIMEOUT_S = 420


def _lab_state(page) -> dict:
    """What JupyterLab shows: each code cell's prompt, the kernel's status, any open dialog."""
    return page.evaluate(
        """() => {
      const nb = document.querySelector(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook");
      const prompts = nb ? [...nb.querySelectorAll(".jp-CodeCell .jp-InputPrompt")]
        .map(p => p.textContent.trim()) : [];  // textContent: cells off screen are not laid out
      const kernel = document.querySelector('.jp-StatusBar-TextItem[title^="Change kernel"]');
      const dialog = document.querySelector(".jp-Dialog");
      return {prompts, kernel: kernel ? kernel.textContent.trim() : "",
              dirty: !!document.querySelector(".lm-TabBar-tab.jp-mod-current.jp-mod-dirty"),
              dialog: dialog ? dialog.innerText.slice(0, 2000) : null};
    }"""
    )


def _idle(state: dict) -> bool:
    return state["kernel"].endswith("| Idle")


def test_jupyterlab_runs_notebook_01_through_its_ui(tmp_path):
    clone = _learner_clone(tmp_path)  # the run's outputs and autosaves touch no checkout
    env = {**os.environ, "PYTHONPATH": str(clone)}
    env.pop("NUM_DEVICES", None)  # as the README starts it: 8 simulated devices
    chromium_executable()  # skip (outside CI) before starting anything
    server = JupyterServer(clone, env)
    server_pid, started = server.proc.pid, []
    try:
        server.wait_ready()
        with browser_context(tmp_path) as (context, chromium, _offsite):
            page = context.new_page()
            page.goto(f"{server.base}/lab/tree/notebooks/{LAB_NOTEBOOK}?token={server.token}")
            page.locator(".jp-Notebook .jp-CodeCell").first.wait_for(timeout=120_000)
            _wait(page, _idle, "the kernel to start", 180)
            started = [p.pid for p in psutil.Process(server_pid).children(recursive=True)]
            assert started, "the notebook started no kernel"

            _menu(page, "Run", "runmenu:run-all")  # Run > Run All Cells
            _wait(page, lambda s: any(p == "[*]:" for p in s["prompts"]), "Run All to start", 60)
            state = _wait(
                page,
                lambda s: _idle(s) and "[*]:" not in s["prompts"],
                "every cell to run and the kernel to go idle",
                LAB_TIMEOUT_S,
            )
            _menu(page, "File", "docmanager:save")  # File > Save Notebook
            _wait(page, lambda s: not s["dirty"], "the save to finish", 60)
            saved = _wait_saved(clone / "notebooks" / LAB_NOTEBOOK)

            errors = [
                f"cell {i}: {o.ename}: {o.evalue}"
                for i, c in enumerate(saved.cells)
                for o in c.get("outputs", [])
                if o.output_type == "error"
            ]
            assert not errors, "error output in JupyterLab:\n" + "\n".join(errors)
            unrun = [i for i, c in enumerate(saved.cells) if _unrun(c)]
            assert not unrun, f"cells Run All did not run: {unrun}; prompts {state['prompts']}"

            figure_cells = [
                i
                for i, c in enumerate(saved.cells)
                if any("image/png" in o.get("data", {}) for o in c.get("outputs", []))
            ]
            loss = [i for i in figure_cells if "loss" in saved.cells[i].source]
            assert loss, f"no cell that plots the loss shows a figure (figures in {figure_cells})"
            cell = page.locator(".jp-Notebook .jp-Cell").nth(loss[-1])
            image = cell.locator(".jp-OutputArea-output img").first
            image.scroll_into_view_if_needed()
            size = image.evaluate(
                "img => img.decode().then(() => [img.naturalWidth, img.naturalHeight])"
            )
            assert image.is_visible() and min(size) > 0, f"the loss figure is not shown: {size}"
            cell.screenshot(path=str(tmp_path / "jupyterlab-loss-figure.png"))
            browser_pid = chromium.proc.pid
    finally:
        server.stop()
    assert _gone(browser_pid) and not _group_alive(browser_pid), "chromium is still running"
    assert _gone(server_pid), "the Jupyter server is still running"
    deadline = time.monotonic() + 20
    while not all(_gone(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(_gone(p) for p in started), f"the kernel outlived its server: {started}"


def _menu(page, menu: str, command: str) -> None:
    """Open a menu of JupyterLab's menu bar and click the item that runs ``command``."""
    page.get_by_role("menuitem", name=menu, exact=True).click()
    page.locator(f'.lm-Menu-item[data-command="{command}"]').click()


def _wait(page, done, what: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        state = _lab_state(page)
        if state["dialog"]:
            raise AssertionError(f"JupyterLab shows a dialog:\n{state['dialog']}")
        if done(state):
            return state
        if time.monotonic() > deadline:
            raise TimeoutError(f"JupyterLab: waited {timeout:.0f} s for {what}; last {state}")
        time.sleep(0.5)


def _wait_saved(path: Path, timeout: float = 60) -> nbformat.NotebookNode:
    """The notebook as JupyterLab saved it, once its outputs are on disk."""
    deadline = time.monotonic() + timeout
    while True:
        nb = nbformat.read(path, as_version=4)
        outputs = [o for c in nb.cells for o in c.get("outputs", [])]
        if not any(_unrun(c) for c in nb.cells) or any(o.output_type == "error" for o in outputs):
            return nb
        if time.monotonic() > deadline:
            unrun = [i for i, c in enumerate(nb.cells) if _unrun(c)]
            raise TimeoutError(f"{path.name} as saved: cells {unrun} have no execution count")
        time.sleep(0.5)


def _unrun(cell: nbformat.NotebookNode) -> bool:
    return cell.cell_type == "code" and bool(cell.source.strip()) and not cell.execution_count


def test_jupyterlab_calculator_redraws_when_a_control_moves(tmp_path):
    """Notebook 13's calculator in JupyterLab: choosing another tensor-parallel degree
    redraws the memory figure and rewrites the step-time line."""
    clone = _learner_clone(tmp_path)
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "from helpers.planning.calculator import plan_calculator\n"
            'plan_calculator(model="llama3-8b", hardware="h100", dp=8, zero=3)'
        )
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                 "language": "python"}  # fmt: skip
    nbformat.write(nb, clone / "notebooks" / "calculator.ipynb")
    env = {**os.environ, "PYTHONPATH": str(clone)}
    chromium_executable()
    server = JupyterServer(clone, env)
    server_pid = server.proc.pid
    try:
        server.wait_ready()
        with browser_context(tmp_path) as (context, chromium, _offsite):
            page = context.new_page()
            page.goto(
                f"{server.base}/lab/tree/notebooks/calculator.ipynb?reset&token={server.token}"
            )
            page.locator(".jp-Notebook .jp-CodeCell").first.wait_for(timeout=120_000)
            _wait(page, _idle, "the kernel to start", 180)
            _menu(page, "Run", "runmenu:run-all")
            image = page.locator(".widget-image, .jupyter-widgets img").first
            image.wait_for(timeout=180_000)
            _wait(page, lambda s: _idle(s) and "[*]:" not in s["prompts"], "the cell to run", 180)
            before = image.get_attribute("src")
            line = page.locator(".widget-html-content").first.inner_text()
            assert before and "GB per device" in line, line
            page.get_by_label("tp", exact=True).select_option("2")
            deadline = time.monotonic() + 60
            while image.get_attribute("src") == before and time.monotonic() < deadline:
                time.sleep(0.25)
            assert image.get_attribute("src") != before, "the figure did not change"
            after = page.locator(".widget-html-content").first.inner_text()
            assert after != line and "16 GPUs" in after, after
            page.screenshot(path=str(tmp_path / "jupyterlab-calculator.png"))
            browser_pid = chromium.proc.pid
    finally:
        server.stop()
    assert _gone(browser_pid) and not _group_alive(browser_pid), "chromium is still running"
    assert _gone(server_pid), "the Jupyter server is still running"
