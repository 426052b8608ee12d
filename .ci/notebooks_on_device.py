#!/usr/bin/env python3
"""Every notebook, top to bottom, on this machine's real devices: what a learner's Run All does.

The device machine has jax, flax and IPython but no Jupyter server (and no sockets, which a
Jupyter kernel needs), so each notebook's code cells are read from its MyST source and run
in order by IPython's ``InteractiveShell`` (magics and ``display`` work as in a kernel),
one notebook per child process, each under a time limit, with ``HELPERS_REAL_DEVICES=1``:

    python3 .ci/notebooks_on_device.py --out "$OUT"              # every notebook
    python3 .ci/notebooks_on_device.py --out "$OUT" 04 11        # some of them
    python3 .ci/notebooks_on_device.py --out /tmp/nb --simulated 01   # here, on CPU devices

``--keep-going`` runs the cells after a failing one too (to list every failure in one
call; later failures may follow from the first). What comes back: ``notebooks.json`` (per
notebook: ran to its end or not, seconds, each failing cell with its error) and
``notebooks-log.tar.gz`` (each notebook's printed output, cell by cell).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "notebooks" / "src"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from accelerator_reference import child_environment, code_cells  # noqa: E402


def _shell() -> Any:
    """IPython's shell without a kernel, or None where IPython is missing."""
    try:
        from IPython.core.interactiveshell import InteractiveShell
    except ImportError:
        return None
    return InteractiveShell.instance()


def run_cells(source: Path, record: Path, keep_going: bool) -> int:
    """Run ``source``'s code cells in one namespace; one JSON line per cell into ``record``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.chdir(SOURCES.parent)
    shell, namespace = _shell(), {"__name__": "__main__"}
    failed = 0
    with open(record, "w", encoding="utf-8") as rec:
        for i, cell in enumerate(code_cells(source.read_text(encoding="utf-8")), 1):
            first = next((s for s in cell.splitlines() if s.strip()), "")
            print(f"\n--- cell {i}: {first[:90]}", flush=True)
            t0 = time.perf_counter()
            error = _run_one(shell, namespace, cell, i)
            row = {"cell": i, "first_line": first[:120], "seconds": time.perf_counter() - t0}
            if error:
                row["error"] = error
                failed += 1
            rec.write(json.dumps(row) + "\n")
            rec.flush()
            plt.close("all")
            if error and not keep_going:
                break
    return 1 if failed else 0


def _run_one(shell: Any, namespace: dict[str, Any], cell: str, i: int) -> str | None:
    """Run one cell; its error as one line (and its traceback printed), or None."""
    if shell is None:
        try:
            exec(compile(cell, f"<cell {i}>", "exec"), namespace)  # noqa: S102
        except BaseException as err:  # noqa: BLE001 - a failing cell is what we record
            traceback.print_exc()
            return f"{type(err).__name__}: {err}".splitlines()[0][:400]
        return None
    # IPython's own code cells: %magics and display() as in a kernel (its comments, written
    # by code_cells for "%" lines, are undone here)
    lines = [ln[2:] if ln.startswith(("# %", "# !")) else ln for ln in cell.splitlines()]
    result = shell.run_cell("\n".join(lines), store_history=False)
    err = result.error_before_exec or result.error_in_exec
    if err is None:
        return None
    return f"{type(err).__name__}: {err}".splitlines()[0][:400]


def _notebooks(names: list[str]) -> list[Path]:
    every = sorted(SOURCES.glob("[0-9]*.md"))
    if not names:
        return every
    picked = [p for p in every if any(p.name.startswith(n) for n in names)]
    if len(picked) < len(names):
        raise SystemExit(f"notebooks_on_device: no notebook matches each of {names}")
    return picked


def run_all(args: argparse.Namespace) -> int:
    out = args.out.resolve()
    env = child_environment(False)
    env["MPLBACKEND"] = "Agg"
    if args.simulated:
        env.pop("HELPERS_REAL_DEVICES", None)
    else:
        env["HELPERS_REAL_DEVICES"] = "1"
    report: dict[str, Any] = {"real_devices": not args.simulated, "notebooks": {}}
    start, logs = time.perf_counter(), []
    for nb in _notebooks(args.names):
        left = args.budget - (time.perf_counter() - start)
        if left < 20:
            report["notebooks"][nb.stem] = {"status": "not run: the call's budget was spent"}
            continue
        log, record = out / f"{nb.stem}.log", out / f"{nb.stem}.cells.jsonl"
        cmd = [sys.executable, __file__, "--child", str(nb), "--out", str(out)]
        cmd += ["--keep-going"] * args.keep_going
        t0 = time.perf_counter()
        with open(log, "w", encoding="utf-8") as f:
            rc = _limited(cmd, min(args.limit, left), f, env)
        cells = [json.loads(x) for x in record.read_text().splitlines()] if record.exists() else []
        bad = [c for c in cells if "error" in c]
        status = "ran to its end" if rc == 0 and cells else f"failed ({rc})"
        report["notebooks"][nb.stem] = {"status": status, "seconds": round(time.perf_counter() - t0, 1),
                                        "cells_run": len(cells), "failures": bad}  # fmt: skip
        print(f"{nb.stem:<32} {status:<16} {time.perf_counter() - t0:6.1f} s  "
              + (bad[0]["error"][:110] if bad else ""), flush=True)  # fmt: skip
        logs += [log, record]
    (out / "notebooks.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    with tarfile.open(out / "notebooks-log.tar.gz", "w:gz") as tar:
        for p in logs:
            tar.add(p, arcname=p.name)
            p.unlink()
    ok = sum(v["status"] == "ran to its end" for v in report["notebooks"].values())
    print(f"{ok} of {len(report['notebooks'])} notebooks ran to their end")
    return 0 if ok == len(report["notebooks"]) else 1


def _limited(cmd: list[str], limit: float, log: Any, env: dict[str, str]) -> int | str:
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                            cwd=ROOT, start_new_session=True)  # fmt: skip
    try:
        return proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        return "timeout"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="notebook prefixes (01, 03b, ...); default: all")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--keep-going", action="store_true", help="run the cells after a failure")
    ap.add_argument("--simulated", action="store_true", help="simulated CPU devices instead")
    ap.add_argument("--limit", type=float, default=150, help="seconds per notebook")
    ap.add_argument("--budget", type=float, default=540, help="seconds for the whole call")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.child:
        return run_cells(args.child, args.out / f"{args.child.stem}.cells.jsonl", args.keep_going)
    return run_all(args)


if __name__ == "__main__":
    sys.exit(main())
