"""Measure every notebook's peak kernel memory and wall time, and its reading time.

    python .ci/notebook_stats.py            # runs the notebooks (8 and 1 devices), updates README.md
    python .ci/notebook_stats.py --reading  # prints each notebook's reading time (runs nothing)
    python .ci/notebook_stats.py --reading --write  # ... and rewrites README's learning path

It runs `pytest notebooks` with NOTEBOOK_STATS set (conftest.py samples the kernel's
resident memory during each run), without xdist so runs do not overlap, then
replaces the table between the README's `<!-- notebook-stats -->` markers.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- notebook-stats:start -->", "<!-- notebook-stats:end -->"
NOTEBOOK_GLOB = "[0-9][0-9]*_*.ipynb"  # 01_x, 03b_x, ...

# The one-sitting measure (issue 26): prose read at 200 words a minute, code at 15 non-blank
# lines a minute. The main line is every cell before the first markdown heading that starts
# "Going deeper"; the setup cell is the one code cell allowed over 25 lines.
WORDS_PER_MIN, CODE_LINES_PER_MIN = 200, 15
MAIN_LINE_MAX_MIN, WHOLE_MAX_MIN, CELL_MAX_LINES = 45, 70, 25
_WORD = re.compile(r"[A-Za-z0-9_'`.-]+")
_DEEPER = re.compile(r"^#+\s*going deeper", re.I | re.M)
SETUP_MARK = "Setup: the same first cell"


def reading_stats(ipynb: Path) -> dict:
    """Reading time of one notebook: minutes for the main line and the whole, and long cells.

    Returns ``main_min`` and ``all_min`` (floats), ``words``, ``code_lines`` (whole notebook)
    and ``long_cells``: ``(cell index, non-blank lines)`` of each code cell, the setup cell
    aside, with more than ``CELL_MAX_LINES`` non-blank lines.
    """
    nb = json.loads(Path(ipynb).read_text())
    words = code = main_words = main_code = 0
    deeper = False
    long_cells: list[tuple[int, int]] = []
    for i, cell in enumerate(nb.get("cells", [])):
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else src
        if cell.get("cell_type") == "markdown":
            deeper = deeper or bool(_DEEPER.search(src))
            n = len(_WORD.findall(src))
            words += n
            main_words += 0 if deeper else n
        elif cell.get("cell_type") == "code":
            n = sum(1 for line in src.splitlines() if line.strip())
            code += n
            main_code += 0 if deeper else n
            if n > CELL_MAX_LINES and SETUP_MARK not in src:
                long_cells.append((i, n))
    return {
        "main_min": main_words / WORDS_PER_MIN + main_code / CODE_LINES_PER_MIN,
        "all_min": words / WORDS_PER_MIN + code / CODE_LINES_PER_MIN,
        "words": words,
        "code_lines": code,
        "long_cells": long_cells,
    }


def notebooks() -> list[Path]:
    """Every notebook of the series, in order."""
    return sorted((ROOT / "notebooks").glob(NOTEBOOK_GLOB))


READING_START, READING_END = "<!-- reading-times:start -->", "<!-- reading-times:end -->"
# What each notebook builds on (the notebooks it assumes read), by number.
BUILDS_ON = {
    "01": [], "02": ["01"], "03": ["02"], "03b": ["03"], "04": ["03"], "05": ["02", "03"],
    "06": ["03"], "07": ["02", "03"], "08": ["03"], "09": ["02", "03"], "10": ["07"],
    "11": ["04", "07", "08"], "12": ["03", "07", "08"], "13a": ["03", "07", "08"],
    "13b": ["04", "08", "13a"],
}  # fmt: skip
# Paths through the series by goal: (goal, notebook numbers in reading order).
PATHS = [
    ("The chapter itself (its sections 3.1 to 3.3)", ["01", "02", "03", "03b"]),
    ("Training one model on many GPUs", ["01", "02", "03", "04", "08", "06"]),
    ("Many hosts", ["02", "03", "05", "06"]),
    ("A real model's plan", ["03", "03b", "04", "08", "13a", "13b"]),
]
_ROW = re.compile(
    r"^\| (\w+) \| \[[^\]]*\]\(notebooks/([^)]+\.ipynb)\) \| [^|]* \| (\d+) min \| (\d+) min \|$"
)


def number(ipynb: Path) -> str:
    """A notebook's number as the series writes it: ``01``, ``03b``."""
    return Path(ipynb).name.split("_")[0]


def title(ipynb: Path) -> str:
    """A notebook's title: its first heading, after the ``NN ·`` prefix."""
    for cell in json.loads(Path(ipynb).read_text())["cells"]:
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        for line in src.splitlines():
            if cell["cell_type"] == "markdown" and line.startswith("# "):
                return line[2:].split("·", 1)[-1].strip()
    return Path(ipynb).stem


def learning_path() -> str:
    """The README's learning path: each notebook's reading time and prerequisites, then paths."""
    nbs = {number(p): p for p in notebooks()}
    stats = {n: reading_stats(p) for n, p in nbs.items()}
    lines = ["| # | notebook | builds on | main line | whole |", "|---|---|---|---:|---:|"]
    for n, p in nbs.items():
        needs = BUILDS_ON.get(n)  # a notebook not in BUILDS_ON yet says so, rather than "none"
        before = "(not listed yet)" if needs is None else ", ".join(needs) or "(PyTorch and NumPy)"
        r = stats[n]
        lines.append(
            f"| {n} | [{title(p)}](notebooks/{p.name}) | {before} | "
            f"{r['main_min']:.0f} min | {r['all_min']:.0f} min |"
        )
    lines += [
        "",
        "Reading times are prose words / 200 + non-blank code lines / 15, over the main line "
        '(everything before the notebook\'s "Going deeper" section) and over the whole '
        "notebook; `python .ci/notebook_stats.py --reading --write` recomputes them.",
        "",
        "Paths by goal (main-line minutes, added up). A path that starts past 01 assumes "
        "what the notebooks it skips teach; the table's \"builds on\" column says which.",
        "",
    ]
    for goal, path in PATHS:
        here = [n for n in path if n in nbs]
        total = sum(stats[n]["main_min"] for n in here)
        lines.append(f"- **{goal}**: {' → '.join(here)} (about {total:.0f} min).")
    return "\n".join(lines)


def print_reading_times(write: bool = False) -> int:
    """Print each notebook's reading time; with ``write``, rewrite README's learning path."""
    for p in notebooks():
        r = reading_stats(p)
        long = (
            f", {len(r['long_cells'])} code cells over {CELL_MAX_LINES} lines"
            if r["long_cells"]
            else ""
        )
        print(f"{p.name}: main {r['main_min']:.0f} min, all {r['all_min']:.0f} min{long}")
    if write:
        readme = ROOT / "README.md"
        pre, rest = readme.read_text().split(READING_START, 1)
        _, post = rest.split(READING_END, 1)
        readme.write_text(f"{pre}{READING_START}\n{learning_path()}\n{READING_END}{post}")
        print("README.md: learning path rewritten")
    return 0


def readme_reading_times(readme: str) -> dict[str, tuple[int, int]]:
    """``{notebook file: (main-line minutes, whole minutes)}`` as README's learning path quotes them."""
    block = readme.split(READING_START, 1)[1].split(READING_END, 1)[0]
    return {m[2]: (int(m[3]), int(m[4])) for m in map(_ROW.match, block.splitlines()) if m}


def main() -> int:
    unknown = [a for a in sys.argv[1:] if a not in ("--reading", "--write")]
    if unknown or ("--write" in sys.argv[1:] and "--reading" not in sys.argv[1:]):
        print(
            f"notebook_stats.py: unknown or incomplete arguments {sys.argv[1:]}; usage: "
            "notebook_stats.py [--reading [--write]] (with no argument it runs every notebook)",
            file=sys.stderr,
        )
        return 2
    if "--reading" in sys.argv[1:]:
        return print_reading_times(write="--write" in sys.argv[1:])
    stats = Path(tempfile.mkdtemp()) / "stats.jsonl"
    env = {**os.environ, "NOTEBOOK_STATS": str(stats)}
    env.pop("NUM_DEVICES", None)
    rc = subprocess.call(
        [sys.executable, "-m", "pytest", "-n", "0", "-q", "notebooks"],
        cwd=ROOT,
        env=env,
        timeout=3600,
    )
    if rc != 0:
        return rc
    rows = [json.loads(line) for line in stats.read_text().splitlines()]
    by_nb: dict[str, dict[int, dict]] = {}
    for r in rows:
        by_nb.setdefault(r["notebook"], {})[r["devices"]] = r
    counts = sorted({r["devices"] for r in rows}, reverse=True)
    cpu = f"{os.cpu_count()} CPU cores ({platform.machine()})"
    head = (
        "| notebook | "
        + " | ".join(f"peak memory, {n} dev. | time, {n} dev." for n in counts)
        + " |"
    )
    sep = "|---|" + "---:|---:|" * len(counts)
    lines = [head, sep]
    for nb in sorted(by_nb):
        cells = []
        for n in counts:
            r = by_nb[nb].get(n)
            cells += (
                [f"{r['peak_rss_bytes'] / 2**30:.2f} GiB", f"{r['wall_s']:.0f} s"]
                if r
                else ["-", "-"]
            )
        lines.append(f"| `{nb}` | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        f"Measured by `python .ci/notebook_stats.py` on {cpu}, one notebook at a time: peak resident "
        "memory of the kernel and everything it started, and wall time of the whole run."
    )
    table = "\n".join(lines)
    readme = ROOT / "README.md"
    text = readme.read_text()
    pre, rest = text.split(START, 1)
    _, post = rest.split(END, 1)
    readme.write_text(f"{pre}{START}\n{table}\n{END}{post}")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
