"""The files the site's "Plan your model" page runs on: Pyodide, and the planner's modules.

    python .ci/plan_page.py SITE_DIR

writes ``SITE_DIR/planner/``, which both editions' ``plan.html`` load (``docs/conf.py``):

- ``pyodide/``: CPython compiled to WebAssembly, the five files a page needs (``pyodide.mjs``,
  ``pyodide.asm.mjs``, ``pyodide.asm.wasm``, ``python_stdlib.zip``, ``pyodide-lock.json``),
  taken from the ``pyodide`` package on npm at the version pinned here and checked against
  its published integrity hash. ``npm pack`` fetches the package once; it is kept in
  ``$XDG_CACHE_HOME/flax-sharding/`` (``~/.cache/flax-sharding/``), so later builds read
  it from there and need no network. The page fetches nothing from another host.
- ``helpers.zip``: the series' own planner, the modules ``python -m helpers.plan`` runs
  (standard library only), so that the page runs the same code as the command line.

It fails, saying why, where npm is missing and the package is not cached, where the
download does not match the pinned hash, or where the Pyodide files would pass
``SHIPPED_LIMIT`` bytes.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYODIDE_VERSION = "314.0.8"
# `npm view pyodide@314.0.8 dist.integrity`: the registry's hash of the tarball.
PYODIDE_INTEGRITY = (
    "sha512-74Wq1kXOC+CCEzAfxuRAO701nAcCMLjf8NrwvWpu8S41dVMXwXmLQ05dYB+F4e46AdnGo0oq7YHSVUpHsoarLQ=="
)
PYODIDE_FILES = (
    "pyodide.mjs",
    "pyodide.asm.mjs",
    "pyodide.asm.wasm",
    "python_stdlib.zip",
    "pyodide-lock.json",
)
SHIPPED_LIMIT = 15_000_000  # bytes of Pyodide the site may ship (issue 43)
ASSETS = "planner"  # SITE_DIR/planner/: docs/conf.py points the page here
# The planner and what it imports, none of which needs jax, numpy or matplotlib
# (tests/test_browser.py imports them with those blocked). calculator.py draws with
# matplotlib and ipywidgets: the page draws its own figure.
PLANNER_PACKAGES = ("helpers", "helpers/planning", "helpers/measuring")
PLANNER_LEAVE_OUT = {"helpers/planning/calculator.py"}
PLANNER_MODULES_ELSEWHERE = ("helpers/cli.py", "helpers/measuring/cost_model.py")


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flax-sharding"


def integrity(path: Path) -> str:
    """npm's ``dist.integrity`` of a file: ``sha512-`` and the base64 of its SHA-512."""
    return "sha512-" + base64.b64encode(hashlib.sha512(path.read_bytes()).digest()).decode()


def pyodide_tarball() -> Path:
    """The pinned ``pyodide`` npm tarball: from the cache, else ``npm pack`` (then cached)."""
    cached = cache_dir() / f"pyodide-{PYODIDE_VERSION}.tgz"
    if cached.exists():
        if integrity(cached) == PYODIDE_INTEGRITY:
            return cached
        print(f"plan_page: {cached} does not match the pinned hash; fetching it again")
        cached.unlink()
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit(
            f"plan_page: npm not found, and no cached {cached}: the planner page needs "
            f"pyodide@{PYODIDE_VERSION} from npm (install Node.js and npm, e.g. `apt-get "
            "install npm`)"
        )
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [npm, "pack", f"pyodide@{PYODIDE_VERSION}", "--pack-destination", tmp,
             "--silent"],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        fetched = Path(tmp) / f"pyodide-{PYODIDE_VERSION}.tgz"
        if integrity(fetched) != PYODIDE_INTEGRITY:
            raise SystemExit(
                f"plan_page: npm's pyodide-{PYODIDE_VERSION}.tgz has hash {integrity(fetched)}, "
                f"not the pinned {PYODIDE_INTEGRITY}"
            )
        cached.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(fetched, cached)
    return cached


def write_pyodide(dest: Path) -> int:
    """Extract the page's Pyodide files into ``dest``; their size in bytes."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(pyodide_tarball()) as tar:
        for name in PYODIDE_FILES:
            member = tar.getmember(f"package/{name}")
            source = tar.extractfile(member)
            assert source is not None, name
            (dest / name).write_bytes(source.read())
    return sum((dest / name).stat().st_size for name in PYODIDE_FILES)


def planner_modules(root: Path = ROOT) -> list[str]:
    """The repository paths of the modules the page ships (see ``PLANNER_PACKAGES``)."""
    paths = [f"{p}/__init__.py" for p in PLANNER_PACKAGES]
    paths += sorted(
        str(p.relative_to(root)) for p in (root / "helpers" / "planning").glob("*.py")
    )
    paths += PLANNER_MODULES_ELSEWHERE
    return sorted({p for p in paths if p not in PLANNER_LEAVE_OUT})


def write_planner_zip(dest: Path, root: Path = ROOT) -> int:
    """The planner's modules as a zip (same bytes for the same sources); its size in bytes."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as z:
        for path in planner_modules(root):
            info = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, (root / path).read_bytes())
    return dest.stat().st_size


def main(site: Path) -> int:
    assets = site / ASSETS
    if assets.exists():
        shutil.rmtree(assets)
    size = write_pyodide(assets / "pyodide")
    if size > SHIPPED_LIMIT:
        print(f"plan_page: Pyodide's files take {size:,} bytes, over {SHIPPED_LIMIT:,}",
              file=sys.stderr)  # fmt: skip
        return 1
    zipped = write_planner_zip(assets / "helpers.zip")
    print(
        f"plan_page: {assets}: Pyodide {PYODIDE_VERSION} ({size / 1e6:.1f} MB) and the planner "
        f"({len(planner_modules())} modules, {zipped / 1e3:.0f} kB)"
    )
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1])))
