"""Tests of .ci/accelerator_reference.py, the prepared call on a GPU or TPU (issues 45, 51).

The call gets one chance on a machine lent by lot, so its plumbing is rehearsed here on
two simulated CPU devices with the tiny presets: every step but notebook 04 (whose cells
tests/test_notebooks.py runs) must write what it promises. Nothing here is a GPU result,
and the files say so (``"rehearsal": true``). ``.ci/run`` deselects the rehearsal (about
45 s of CPU) to keep CI under 40 minutes; run it before a device call.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import pytest
from children import run_jax_child

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "accelerator_reference.py"


def _module():
    spec = importlib.util.spec_from_file_location("accelerator_reference", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_notebook_04_as_a_script():
    """Every code cell of 04's MyST source, options dropped, compiles; as many as the .ipynb."""
    mod = _module()
    cells = mod.code_cells(mod.NOTEBOOK_04.read_text(encoding="utf-8"))
    ipynb = json.loads((ROOT / "notebooks" / "04_profile_dp_vs_fsdp.ipynb").read_text())
    assert len(cells) == sum(c["cell_type"] == "code" for c in ipynb["cells"])
    for i, cell in enumerate(cells, 1):
        compile(cell, f"cell {i}", "exec")
        assert not cell.startswith(("---", ":", "jupyter:")), cell[:80]


def test_code_cells_options_and_magics():
    mod = _module()
    md = "x\n```{code-cell} ipython3\n---\ntags: [solution]\n---\n%time y = 1\nz = 2\n```\n"
    md += "```{code-cell} ipython3\n:tags: [hide-input]\nw = 3\n```\n"
    assert mod.code_cells(md) == ["# %time y = 1\nz = 2", "w = 3"]
    with pytest.raises(ValueError, match="never closed"):
        mod.code_cells("```{code-cell} ipython3\nx = 1\n")
    with pytest.raises(ValueError, match="option block"):
        mod.code_cells("```{code-cell} ipython3\n---\ntags: []\nx = 1\n```\n")


def test_rehearsal_writes_everything(tmp_path):
    """The call's steps on 2 CPU devices: each ends well, and each file holds what it says."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUM_DEVICES": "2", "MPLBACKEND": "Agg"}
    cmd = [sys.executable, str(SCRIPT), "--rehearse", "--out", str(tmp_path),
           "--steps", "profile-mlp", "profile-transformer", "trace", "levers", "plan"]  # fmt: skip
    proc = run_jax_child(cmd, devices=2, timeout=240, env=env, cwd=ROOT)
    log = (
        (tmp_path / "log.txt").read_text(encoding="utf-8")
        if (tmp_path / "log.txt").exists()
        else ""
    )
    assert proc.returncode == 0, proc.stdout[-1500:] + log[-3000:]
    assert "failed: none" in proc.stdout
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {"log.txt", "profile-mlp.json", "profile-transformer.json", "profile.png",
                     "trace.png", "trace-raw.tar.gz", "levers.json", "plan-check.json"}  # fmt: skip
    assert len(names) <= 8  # what the device tool brings back
    for name in names - {"log.txt", "profile.png", "trace.png", "trace-raw.tar.gz"}:
        assert json.loads((tmp_path / name).read_text())["rehearsal"] is True, name
    levers = json.loads((tmp_path / "levers.json").read_text())["levers"]
    assert len(levers) == 9 and not [k for k, v in levers.items() if "error" in v]
    plan = json.loads((tmp_path / "plan-check.json").read_text())
    assert set(plan["planner"]) == {"f32", "mixed"} and plan["measured"]["median_s"] > 0
    # XLA:GPU's scheduler flag is compared on 2+ GPUs only; CPU devices skip it quietly
    assert "LHS on" not in log


def test_the_children_keep_the_machines_pythonpath_after_the_repository():
    mod = _module()
    env = mod.child_environment(False, {"PYTHONPATH": "/opt/jax-site:/tmp/site"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/opt/jax-site", "/tmp/site"]
    assert mod.child_environment(True, {})["NUM_DEVICES"] == "2"


def test_a_step_past_its_limit_is_killed_with_its_grandchildren(tmp_path):
    """A step's child starts a grandchild (as the profile step starts python -m
    helpers.profile) and both outlive the limit: the whole process group is killed."""
    mod = _module()
    marker = tmp_path / "grandchild.pid"
    code = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(marker)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    )
    with open(tmp_path / "log.txt", "w") as log:
        rc = mod.run_limited([sys.executable, "-c", code], limit=3, log=log, env=dict(os.environ))
    assert rc == "timeout"
    pid = int(marker.read_text())
    for _ in range(50):  # killed: gone, or a zombie waiting for init to reap it
        stat = Path(f"/proc/{pid}/stat")
        if not stat.exists() or stat.read_text().split(")")[-1].split()[0] in ("Z", "X"):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the grandchild {pid} still runs after its step was killed")


def test_collect_turns_a_calls_files_into_the_reference_and_refuses_a_rehearsal(tmp_path):
    mod = _module()
    with pytest.raises(ValueError, match="holds no profile"):
        mod.collect(tmp_path)
    (tmp_path / "profile-mlp.json").write_text(json.dumps({"rehearsal": True}))
    with pytest.raises(ValueError, match="rehearsal"):
        mod.collect(tmp_path)
    ref = json.loads((ROOT / "helpers" / "measuring" / "reference_tpu_v5e.json").read_text())
    assert ref["device_kind"] == "TPU v5 lite" and ref["date"] == "2026-12-06"
    mlp = ref["profiles"]["mlp"]["results"][0]
    # the MFU the profile reported is FLOPs / median step / peak (issue 51's measure)
    by_hand = mlp["flops_formula"] / mlp["step_median_s"] / 197e12
    assert abs(mlp["mfu"] - by_hand) < 0.01 and 0.5 < mlp["mfu"] < 0.9
