"""Measure every notebook's peak kernel memory and wall time, and its reading time.

    python .ci/notebook_stats.py            # runs the notebooks (8 and 1 devices), updates README.md
    python .ci/notebook_stats.py --reading  # prints each notebook's reading time (runs nothing)

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


def print_reading_times() -> int:
    """Print each notebook's reading time, as the README's learning path quotes it."""
    for p in notebooks():
        r = reading_stats(p)
        long = (
            f", {len(r['long_cells'])} code cells over {CELL_MAX_LINES} lines"
            if r["long_cells"]
            else ""
        )
        print(f"{p.name}: main {r['main_min']:.0f} min, all {r['all_min']:.0f} min{long}")
    return 0


def main() -> int:
    if "--reading" in sys.argv[1:]:
        return print_reading_times()
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
