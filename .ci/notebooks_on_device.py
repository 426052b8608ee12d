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
call; later failures may follow from the first). ``--one-process`` runs the notebooks one
after another in one process, each in a fresh IPython shell and namespace, with JAX's
configuration, the environment, the working folder and matplotlib reset between them:
a chip takes seconds to open, and one process opens it once. A learner's kernel is a
process of its own, so this is the faster, slightly less faithful mode; if that process
dies, the parent starts another for the notebooks left. What comes back: ``notebooks.json`` (per
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


def run_cells(source: Path, record: Path, keep_going: bool, limit: float = 0) -> int:
    """Run ``source``'s code cells in one namespace; one JSON line per cell into ``record``.
    With ``limit`` (seconds), a notebook still running past it stops at its next cell."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.chdir(SOURCES.parent)
    shell, namespace = _shell(), {"__name__": "__main__"}
    failed, start = 0, time.perf_counter()
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
            if limit and time.perf_counter() - start > limit:
                rec.write(json.dumps({"cell": i + 1, "first_line": "", "seconds": 0.0,
                                      "error": f"timeout: stopped after {limit:.0f} s"}) + "\n")  # fmt: skip
                failed += 1
                break
    return 1 if failed else 0


def run_many(sources: list[Path], out: Path, keep_going: bool, limit: float) -> int:
    """``--one-process``: each notebook in a fresh shell, the process's state reset between."""
    import gc

    import jax
    from IPython.core.interactiveshell import InteractiveShell

    environ, config = dict(os.environ), dict(jax.config.values)
    for source in sources:
        InteractiveShell.clear_instance()
        print(f"\n===== {source.stem}", flush=True)
        t0 = time.perf_counter()
        rc = run_cells(source, out / f"{source.stem}.cells.jsonl", keep_going, limit)
        (out / f"{source.stem}.done").write_text(f"{rc} {time.perf_counter() - t0:.1f}\n")
        os.environ.clear()
        os.environ.update(environ)
        for key, value in config.items():
            if jax.config.values.get(key) != value:
                try:
                    jax.config.update(key, value)
                except Exception:  # noqa: BLE001 - some settings are fixed once JAX started
                    pass
        jax.clear_caches()
        gc.collect()
    return 0


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
    picked = []  # in the order given: what matters most first, in case the budget ends
    for n in names:
        found = [
            p
            for p in every
            if p.name.startswith(f"{n}_") or p.name.startswith(n) and n[-1:].isalpha()
        ]
        if not found:
            raise SystemExit(f"notebooks_on_device: no notebook matches {n!r}")
        picked += [p for p in found if p not in picked]
    return picked


def run_all(args: argparse.Namespace) -> int:
    out = args.out.resolve()
    env = child_environment(False)
    env["MPLBACKEND"] = "Agg"
    if args.simulated:
        env.pop("HELPERS_REAL_DEVICES", None)
    else:
        env["HELPERS_REAL_DEVICES"] = "1"
    report: dict[str, Any] = {"real_devices": not args.simulated, "notebooks": {},
                              "one_process": args.one_process}  # fmt: skip
    if args.one_process:
        return _report(out, report, _one_process(args, out, env))
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
    return _report(out, report, logs)


def _one_process(args: argparse.Namespace, out: Path, env: dict[str, str]) -> list[Path]:
    """Run the notebooks in as few processes as possible; fill ``report`` from their files."""
    left, start, logs, n = _notebooks(args.names), time.perf_counter(), [], 0
    while left:
        budget = args.budget - (time.perf_counter() - start)
        if budget < 20:
            break
        n += 1
        log = out / f"process-{n}.log"
        cmd = [sys.executable, __file__, "--many", *[str(p) for p in left], "--out", str(out),
               "--limit", str(args.limit)] + ["--keep-going"] * args.keep_going  # fmt: skip
        with open(log, "w", encoding="utf-8") as f:
            rc = _limited(cmd, budget, f, env)
        logs.append(log)
        done = [p for p in left if (out / f"{p.stem}.done").exists()]
        if len(done) < len(left) and rc != "timeout":  # the process died inside a notebook
            died = left[len(done)]
            (out / f"{died.stem}.done").write_text(f"died({rc}) 0\n")
            done.append(died)
        left = [p for p in left if p not in done]
        if rc == "timeout":
            break
    return logs


def _report(out: Path, report: dict[str, Any], logs: list[Path]) -> int:
    for nb in _notebooks([]):
        record, done = out / f"{nb.stem}.cells.jsonl", out / f"{nb.stem}.done"
        if nb.stem in report["notebooks"] or not (record.exists() or done.exists()):
            continue
        cells = [json.loads(x) for x in record.read_text().splitlines()] if record.exists() else []
        rc, seconds = (
            (done.read_text().split() + ["?", "0"])[:2] if done.exists() else ("timeout", "0")
        )
        bad = [c for c in cells if "error" in c]
        status = "ran to its end" if rc == "0" and cells else f"failed ({rc})"
        report["notebooks"][nb.stem] = {"status": status, "seconds": float(seconds),
                                        "cells_run": len(cells), "failures": bad}  # fmt: skip
        print(f"{nb.stem:<32} {status:<16} {float(seconds):6.1f} s  "
              + (bad[0]["error"][:110] if bad else ""), flush=True)  # fmt: skip
        logs += [record] + ([done] if done.exists() else [])
    (out / "notebooks.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    with tarfile.open(out / "notebooks-log.tar.gz", "w:gz") as tar:
        for p in logs:
            if p.exists():
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
    ap.add_argument("--one-process", action="store_true", help="all notebooks in one process")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--many", type=Path, nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.many:
        return run_many(args.many, args.out, args.keep_going, args.limit)
    if args.child:
        return run_cells(args.child, args.out / f"{args.child.stem}.cells.jsonl", args.keep_going)
    return run_all(args)


if __name__ == "__main__":
    sys.exit(main())
