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
  buttons that open the Chinese notebook. The planner page (``plan.html``, see below) is
  checked too, with every request outside the site still refused.
- The planner page, ``plan.html`` (``_check_plan_page``): ``helpers.plan``'s own modules, run
  by Pyodide in the page. On a first visit (a fresh browser context) it is ready, the first
  plan shown, within ``PLAN_READY_S`` on an idle machine (the limit grows with the load per
  core); it ships under 15 MB of Pyodide and exactly the repository's planner; for
  ``PLAN_CONFIGS`` random valid configurations (a seeded generator: named and pasted models,
  every hardware, degrees, ZeRO, remat, batch, margin and other flags), and for the invalid
  ones it draws on the way, the page shows what ``python -m helpers.plan`` prints in a
  subprocess for the same flags: the same JSON (``--json -``) and table, or the same one-line
  refusal; three chosen bad inputs show theirs; a search of LLaMA-3-70B's layouts on 64 H100s
  is the command's, drawn one row per layout. The Chinese page (``zh/plan.html``, the
  language switch's target) shows its labels in Chinese, runs the same search from its
  address, and a refusal. Screenshots of both pages are saved under the test's tmp dir.
- ``test_the_planner_page_ships_a_planner_that_needs_no_jax`` (no browser): the zip of the
  planner's modules that ``.ci/plan_page.py`` writes for the page runs a plan, a search, a
  ``--params`` plan and a pasted ``config.json`` in a Python where jax, numpy, matplotlib and
  ipywidgets cannot be imported, from the zip alone.
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
import importlib.util
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urldefrag, urlparse

import nbformat
import psutil
import pytest
from test_launch import LOOPBACK, ROOT, JupyterServer, _learner_clone

from helpers.lesson import cell_role
from helpers.planning.activations import REMATS
from helpers.planning.hardware import HARDWARE
from helpers.planning.models import NAMED_MODELS

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
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.connect_over_cdp(chromium.endpoint())
            context = offline_context(browser, offsite)
            try:
                yield context, chromium, offsite
            finally:
                context.close()
                browser.close()
    finally:
        chromium.stop()


def offline_context(browser, offsite: list[str]):
    """A new browser context (its own cache) at desktop size, which refuses every request
    to a host other than loopback and records its URL in ``offsite``."""

    def route(r):
        url = urlparse(r.request.url)
        if url.scheme in ("data", "blob", "about") or url.hostname == LOOPBACK:
            r.continue_()
        else:
            offsite.append(r.request.url)
            r.abort()

    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.route("**/*", route)
    return context


# ---------------------------------------------------------------------------
# The built site
# ---------------------------------------------------------------------------


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # not a page left mid-download
            super().handle_error(request, client_address)


@contextlib.contextmanager
def serve(directory: Path) -> Iterator[str]:
    """Serve ``directory`` on a free loopback port, as GitHub Pages would; yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = _QuietServer((LOOPBACK, 0), handler)
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

        for reference in ("docs/glossary", "docs/errata", "plan"):  # linked from the landing page
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
        _check_plan_page(context, site, base, tmp_path)
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
# The planner page: python -m helpers.plan, run by Pyodide in plan.html
# ---------------------------------------------------------------------------

PLAN_CONFIGS = 20  # random valid configurations the page must plan as the command line does
PLAN_SEED = 43
PLAN_READY_S = 5.0  # the first plan shown, on an idle machine (see _ready_limit)
PYODIDE_LIMIT = 15_000_000  # bytes of Pyodide the site may ship
PLAN_TIMEOUT_MS = 180_000
# Hugging Face config.json files to paste: a LLaMA-style dense model, GPT-2, an MoE.
PASTED_CONFIGS = (
    {"_name_or_path": "mistral-7b-like", "model_type": "mistral", "hidden_size": 4096,
     "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
     "intermediate_size": 14336, "vocab_size": 32000},
    {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257},
    {"_name_or_path": "mixtral-like", "model_type": "mixtral", "hidden_size": 4096,
     "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
     "intermediate_size": 14336, "vocab_size": 32000, "num_local_experts": 8,
     "num_experts_per_tok": 2},
)  # fmt: skip
# Three inputs the command refuses, each with the start of its one-line message:
# (flags, pasted config.json or None, Search instead of Plan).
BAD_PLANS = (
    (["--config", "llama3-8b", "--hardware", "h100", "--tp", "3"], None, False),
    (["--config", "config.json", "--hardware", "h100"], "{ not json", False),
    (["--config", "llama3-70b", "--hardware", "h100"], None, True),
)
SEARCH = ["--config", "llama3-70b", "--hardware", "h100", "--gpus", "64"]


def _plan_page_module():
    """``.ci/plan_page.py``, which writes the page's Pyodide and planner files."""
    spec = importlib.util.spec_from_file_location("plan_page", ROOT / ".ci" / "plan_page.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ready_limit() -> float:
    """``PLAN_READY_S`` on an idle machine. On a busy one (CI shares 2 cores) the page waits
    for the CPU like every process, so the limit grows with the load per core."""
    return PLAN_READY_S * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def _random_plan(rng: random.Random) -> tuple[list[str], str | None]:
    """The flags of a plan (valid or not: the command decides) and the config.json to paste."""
    pasted = None
    if rng.random() < 0.25:
        config = rng.choice(PASTED_CONFIGS)
        pasted, model = json.dumps(config, indent=2), "config.json"
        moe = "num_local_experts" in config
    else:
        model = rng.choice(sorted(NAMED_MODELS))
        moe = NAMED_MODELS[model].is_moe
    flags = ["--config", model, "--hardware", rng.choice(sorted(HARDWARE))]
    degrees = {"dp": rng.choice([1, 2, 4, 8, 16, 32]), "tp": rng.choice([1, 1, 2, 4, 8]),
               "pp": rng.choice([1, 1, 2, 4]), "cp": rng.choice([1, 1, 1, 1, 2]),
               "ep": rng.choice([1, 2, 8]) if moe else 1}  # fmt: skip
    flags += [x for axis, d in degrees.items() if d > 1 for x in (f"--{axis}", str(d))]
    zero = rng.choice([0, 1, 2, 3])
    flags += ["--zero", str(zero)] if zero else []
    flags += ["--keep-gathered"] if zero == 3 and rng.random() < 0.3 else []
    remat = rng.choice(REMATS)
    flags += ["--remat", remat] if remat != "none" else []
    flags += ["--precision", "f32"] if rng.random() < 0.15 else []
    seq = rng.choice([2048, 4096, 4096, 8192])
    flags += ["--seq", str(seq)] if seq != 4096 else []
    micro = rng.choice([1, 1, 2])
    flags += ["--micro-batch", str(micro)] if micro > 1 else []
    if rng.random() < 0.3:
        ranks = degrees["dp"] * degrees["ep"] * micro
        flags += ["--global-batch", str(ranks * rng.choice([1, 2, 4, 8]))]
    flags += ["--gpus", str(math.prod(degrees.values()))] if rng.random() < 0.3 else []
    margin = rng.choice(["", "", "1", "1.2", "1.5", "2"])  # "": the calibrated margin
    flags += ["--margin", margin] if margin else []
    others = [["--grad-dtype", "fp32"], ["--tp-overlap"], ["--no-flash"],
              ["--cross-node", "hierarchical"], ["--per-node", "4"], ["--link-gbps", "200"],
              ["--virtual-stages", "2"]]  # fmt: skip
    for more in rng.sample(others, k=rng.choice([0, 0, 1, 2])):
        flags += more
    return flags, pasted


def _pairs(args: list[str]) -> list[tuple[str, ...]]:
    """A command line as (flag, value) and (flag,) groups, sorted: the flags, in any order."""
    groups: list[tuple[str, ...]] = []
    for arg in args:
        if arg.startswith("--") or not groups:
            groups.append((arg,))
        else:
            groups[-1] += (arg,)
    return sorted(groups)


def _cli(flags: list[str], pasted: str | None, where: Path) -> subprocess.CompletedProcess[str]:
    """``python -m helpers.plan FLAGS`` in a subprocess, in ``where`` (with the pasted file)."""
    if pasted is not None:
        (where / "config.json").write_text(pasted)
    return subprocess.run(
        [sys.executable, "-m", "helpers.plan", *flags], cwd=where, capture_output=True,
        text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


_PLANNER_STATE = """() => {
  const root = document.getElementById("planner");
  const out = root.querySelector(".planner-output");
  const text = sel => { const e = out && out.querySelector(sel); return e ? e.textContent : null; };
  const figure = out && out.querySelector("svg.planner-figure");
  return {
    runs: +(root.dataset.runs || 0), failed: root.dataset.failed || null,
    argv: out && out.dataset.argv ? JSON.parse(out.dataset.argv) : null,
    code: out ? +out.dataset.code : null, error: text(".planner-error"),
    json: text(".planner-json"), table: text(".planner-table"),
    command: text(".planner-command"), rows: figure ? +figure.dataset.plans : 0,
    buttons: [...root.querySelectorAll("button.planner-run")].map(b => b.textContent),
  };
}"""


def _wait_ready(page) -> dict:
    page.wait_for_function(
        "() => { const r = document.getElementById('planner');"
        " return r && (r.dataset.readyMs || r.dataset.failed); }",
        timeout=PLAN_TIMEOUT_MS,
    )
    state = page.evaluate(_PLANNER_STATE)
    assert not state["failed"], f"the planner did not start: {state['failed']}"
    return state


def _plan_in_page(page, flags: list[str], pasted: str | None, search: bool) -> dict:
    """Set the page's form to ``flags`` (flags without a control go to "More flags"), press
    Plan or Search, and return what the page then shows."""
    controls = set(page.evaluate(
        "() => [...document.querySelectorAll('#planner [data-flag]')].map(e => e.dataset.flag)"
    ))  # fmt: skip
    page.evaluate("""() => {
      for (const c of document.querySelectorAll('#planner [data-flag]')) {
        if (c.type === 'checkbox') c.checked = false;
        else c.value = c.dataset.default || '';
      }
    }""")
    more: list[str] = []
    groups = [g for g in _pairs(flags) if g != ("--search",)]
    for group in groups:
        flag = group[0]
        where = page.locator(f'#planner [data-flag="{flag}"]')
        if flag == "--keep-gathered":
            where.check()
        elif flag in controls and len(group) == 2 and where.evaluate("e => e.tagName") == "SELECT":
            where.select_option(group[1])
        elif flag in controls and len(group) == 2:
            where.fill(group[1])
        else:
            more += group
    page.locator('#planner [data-flag="more"]').fill(" ".join(more))
    if pasted is not None:
        page.locator('#planner [data-flag="config-text"]').fill(pasted)
    before = page.evaluate(_PLANNER_STATE)["runs"]
    page.locator(f'#planner button[data-mode="{"search" if search else "plan"}"]').click()
    page.wait_for_function(
        "n => +(document.getElementById('planner').dataset.runs || 0) > n",
        arg=before, timeout=PLAN_TIMEOUT_MS,
    )  # fmt: skip
    return page.evaluate(_PLANNER_STATE)


def _same_numbers(page: object, cli: object) -> bool:
    """``page`` and ``cli`` are the same JSON, floats equal to 1e-12 relative: the page's Python
    runs on Pyodide's libm, whose ``exp`` and ``log`` (the geometric-mean factor) may differ from
    the native one in the last bit (CI saw 0.37142914758377044 against ...7703)."""
    if isinstance(page, float) or isinstance(cli, float):
        return isinstance(page, int | float) and isinstance(cli, int | float) and math.isclose(
            page, cli, rel_tol=1e-12, abs_tol=1e-300
        )  # fmt: skip
    if isinstance(page, dict) and isinstance(cli, dict):
        return page.keys() == cli.keys() and all(_same_numbers(page[k], cli[k]) for k in page)
    if isinstance(page, list) and isinstance(cli, list):
        return len(page) == len(cli) and all(map(_same_numbers, page, cli))
    return type(page) is type(cli) and page == cli


def _same_as_cli(seen: dict, flags: list[str], pasted: str | None, where: Path) -> bool:
    """The page showed what ``python -m helpers.plan`` prints for ``flags``; True if valid."""
    search = "--search" in flags
    said = f"the page's {seen['argv']} for {flags}"
    assert _pairs(seen["argv"]) == _pairs(flags), said
    as_json = _cli([*flags, "--json", "-"], pasted, where)
    assert seen["code"] == as_json.returncode, f"{said}: exit {as_json.returncode}, page {seen}"
    if as_json.returncode != 0:
        line = as_json.stderr.strip().splitlines()[-1]
        assert line.startswith("python -m helpers.plan: error: "), line
        assert seen["error"] == line, f"{said}: the page says {seen['error']!r}, not {line!r}"
        assert seen["json"] is None and seen["table"] is None and seen["rows"] == 0
        return False
    data = json.loads(as_json.stdout)
    assert _same_numbers(json.loads(seen["json"]), data), (
        f"{said}: the JSON differs:\n{seen['json']}"
    )
    assert seen["rows"] == (len(data) if search else 1), f"{said}: {seen['rows']} rows drawn"
    table = _cli(flags, pasted, where).stdout.rstrip("\n")
    if search:  # the first line says how long the search took
        table, seen_table = (re.sub(r" in \d+\.\d s", "", t) for t in (table, seen["table"]))
    else:
        seen_table = seen["table"]
    assert seen_table == table, f"{said}: the table differs"
    return True


def _screenshot(page, path: Path) -> None:
    """The whole page as a reader sees it at the top: nothing focused (the theme's "skip to
    main content" link shows while it has the focus)."""
    page.evaluate(
        "() => { document.activeElement && document.activeElement.blur(); scrollTo(0, 0); }"
    )
    page.screenshot(path=str(path), full_page=True)


def _check_plan_page(context, site: Path, base: str, tmp_path: Path) -> None:
    """The planner page: see the module docstring."""
    pyodide = site / "planner" / "pyodide"
    shipped = sorted(p.name for p in pyodide.iterdir())
    module = _plan_page_module()
    assert shipped == sorted(module.PYODIDE_FILES), shipped
    size = sum(p.stat().st_size for p in pyodide.iterdir())
    assert size < PYODIDE_LIMIT, f"the site ships {size:,} bytes of Pyodide"
    with zipfile.ZipFile(site / "planner" / "helpers.zip") as z:
        assert sorted(z.namelist()) == module.planner_modules(ROOT), z.namelist()
        stale = [n for n in z.namelist() if z.read(n) != (ROOT / n).read_bytes()]
        assert not stale, f"the site's planner is not the repository's: {stale}"

    # A context of its own: a first visit, with nothing of Pyodide in the browser's cache.
    offsite: list[str] = []
    cold = offline_context(context.browser, offsite)
    page = cold.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    response = page.goto(base + "plan.html")
    assert response is not None and response.ok
    first = _wait_ready(page)
    ready_ms = int(page.evaluate("document.getElementById('planner').dataset.readyMs"))
    timings = page.evaluate("document.getElementById('planner').dataset.timings")
    limit = _ready_limit()
    print(f"plan.html: ready in {ready_ms / 1000:.1f} s (Pyodide, planner, first plan at "
          f"{timings} ms; limit {limit:.1f} s at load {os.getloadavg()[0]:.1f}); "
          f"{size / 1e6:.1f} MB of Pyodide")  # fmt: skip
    assert ready_ms < 1000 * limit, f"plan.html took {ready_ms} ms to show its first plan"
    work = tmp_path / "cli"
    work.mkdir()
    assert _same_as_cli(first, first["argv"], None, work)  # the plan it opens with

    rng, valid, drawn = random.Random(PLAN_SEED), 0, 0
    while valid < PLAN_CONFIGS:
        drawn += 1
        assert drawn <= 4 * PLAN_CONFIGS, f"only {valid} valid plans in {drawn} draws"
        flags, pasted = _random_plan(rng)
        seen = _plan_in_page(page, flags, pasted, search=False)
        valid += _same_as_cli(seen, flags, pasted, work)
    print(f"plan.html: {valid} valid and {drawn - valid} refused plans as the command's")

    for flags, pasted, search in BAD_PLANS:
        seen = _plan_in_page(page, flags, pasted, search)
        assert not _same_as_cli(seen, flags + ["--search"] * search, pasted, work), flags
        assert page.locator(".planner-error[role=alert]").is_visible(), flags

    seen = _plan_in_page(page, SEARCH, None, search=True)
    assert _same_as_cli(seen, [*SEARCH, "--search"], None, work)
    assert seen["rows"] == 10, seen["rows"]
    assert seen["command"].startswith("python -m helpers.plan --config llama3-70b")
    _screenshot(page, tmp_path / "plan-page.png")

    # The Chinese page: reached through the language switch; a search linked by its address.
    switch = page.locator("p.language-switch a")
    assert switch.get_attribute("href") == "zh/plan.html", switch.get_attribute("href")
    hashed = "#" + "&".join([*SEARCH, "--search"])
    response = page.goto(f"{base}zh/plan.html{hashed}")
    assert response is not None and response.ok
    seen = _wait_ready(page)
    assert seen["buttons"] == ["规划这个布局", "搜索这些 GPU 的所有布局"], seen["buttons"]
    assert _same_as_cli(seen, [*SEARCH, "--search"], None, work)
    assert "乐观 / 预期" in (page.locator("svg.planner-figure").text_content() or "")
    _screenshot(page, tmp_path / "plan-page-zh.png")
    flags, pasted, search = BAD_PLANS[0]
    assert not _same_as_cli(_plan_in_page(page, flags, pasted, search), flags, pasted, work)
    cold.close()
    print(f"screenshots: {tmp_path / 'plan-page.png'}, {tmp_path / 'plan-page-zh.png'}")
    assert not errors, "\n".join(errors)
    assert not offsite, f"the planner page fetched from other hosts: {sorted(set(offsite))}"


def test_the_planner_page_ships_a_planner_that_needs_no_jax(tmp_path):
    planner = tmp_path / "helpers.zip"
    module = _plan_page_module()
    module.write_planner_zip(planner, ROOT)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(PASTED_CONFIGS[0]))
    code = f"""
import contextlib, io, json, sys, zipfile
for name in ("jax", "jaxlib", "numpy", "matplotlib", "ipywidgets", "flax", "optax"):
    sys.modules[name] = None  # `import {{name}}` raises ImportError
sys.path.insert(0, {str(planner)!r})
names = [n[:-3].replace("/", ".").removesuffix(".__init__")
         for n in zipfile.ZipFile({str(planner)!r}).namelist()]
for name in names:
    __import__(name)
from helpers.planning.plan import main
for argv in (["--config", "llama3-8b", "--dp", "8", "--zero", "3"],
             ["--config", "llama3-8b", "--gpus", "8", "--search", "--top", "3"],
             ["--params", "7000000000", "--dp", "8"],
             ["--config", {str(config)!r}, "--tp", "2"]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv + ["--json", "-"]) == 0, argv
    json.loads(out.getvalue())
print(sorted(names) == sorted(m for m in sys.modules if m.startswith("helpers")), len(names))
"""
    out = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=300,
        cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    # every module of the zip imported, and nothing from outside it (-I: no PYTHONPATH)
    assert out.stdout.split() == ["True", str(len(module.planner_modules(ROOT)))], out.stdout


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
    """Notebook 13b's calculator in JupyterLab: choosing another tensor-parallel degree
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
