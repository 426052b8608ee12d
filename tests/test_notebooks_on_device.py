"""Tests of .ci/notebooks_on_device.py, which runs the notebooks on a machine's real devices
without Jupyter (the TPU machine of issue 51 has IPython but no kernel and no sockets)."""

from __future__ import annotations

import json
import os
import sys
import tarfile
from pathlib import Path

from children import run_jax_child

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "notebooks_on_device.py"


def test_one_process_runs_a_notebook_and_reports_each_cell(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUM_DEVICES": "1", "MPLBACKEND": "Agg"}
    cmd = [sys.executable, str(SCRIPT), "--simulated", "--one-process", "--keep-going",
           "--out", str(tmp_path), "03b"]  # fmt: skip
    proc = run_jax_child(cmd, devices=1, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "notebooks.json").read_text())
    (name,) = report["notebooks"]
    row = report["notebooks"][name]
    assert name.startswith("03b") and row["status"] == "ran to its end" and not row["failures"]
    assert row["cells_run"] >= 10 and report["one_process"] and not report["real_devices"]
    with tarfile.open(tmp_path / "notebooks-log.tar.gz") as tar:
        names = tar.getnames()
    assert f"{name}.cells.jsonl" in names and "process-1.log" in names


def test_an_unknown_notebook_is_refused(tmp_path):
    proc = run_jax_child([sys.executable, str(SCRIPT), "--out", str(tmp_path), "99"], devices=1,
                         timeout=60, cwd=ROOT)  # fmt: skip
    assert proc.returncode != 0 and "no notebook matches" in proc.stderr
