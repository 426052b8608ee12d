"""Measure every notebook's peak kernel memory and wall time, and write the README table.

    python .ci/notebook_stats.py            # runs the notebooks (8 and 1 devices), updates README.md

It runs `pytest notebooks` with NOTEBOOK_STATS set (conftest.py samples the kernel's
resident memory during each run), without xdist so runs do not overlap, then
replaces the table between the README's `<!-- notebook-stats -->` markers.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- notebook-stats:start -->", "<!-- notebook-stats:end -->"


def main() -> int:
    stats = Path(tempfile.mkdtemp()) / "stats.jsonl"
    env = {**os.environ, "NOTEBOOK_STATS": str(stats)}
    env.pop("NUM_DEVICES", None)
    rc = subprocess.call(
        [sys.executable, "-m", "pytest", "-n", "0", "-q", "notebooks"], cwd=ROOT, env=env,
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
