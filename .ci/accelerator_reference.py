#!/usr/bin/env python3
"""The measured reference on one accelerator (a GPU or a TPU), in one command.

A session lent the device machine has a few minutes of it, its start included; the
machine has jax, and what its own package index holds (flax, optax, matplotlib), but no
Jupyter and no network. So the call is prepared and rehearsed here, runs once, and brings
back all it measured:

    python3 .ci/accelerator_reference.py --out "$OUT"            # there, from the repo root
    python .ci/accelerator_reference.py --rehearse --out /tmp/ref  # here: CPU devices, tiny sizes
    python .ci/accelerator_reference.py --collect /tmp/ref         # here: the files that came
                                    # back -> helpers/measuring/reference_<chip>.json

Each step runs in a process group of its own, under a time limit, so that a crash, an
out-of-memory or a hang in one (a grandchild included) leaves the others their results
and the chip free; every step prints into log.txt.

  nb04                 notebook 04's code cells in order, read from its MyST source
  profile-mlp          ``python -m helpers.profile --model mlp --preset gpu`` (DP and FSDP)
  profile-transformer  the same for the Transformer (DP)
  trace                a jax.profiler trace of the dp step, read with
                       helpers.measuring.trace and drawn; on two or more GPUs, FSDP with
                       XLA:GPU's latency-hiding scheduler on and off too
  levers               the MLP's one-device step under each lever of ANCHORS.md (bf16
                       compute, widths in multiples of 128, XLA's options, tokens per step,
                       donation, no host sync in the loop), side by side in one process
  plan                 the planner for the Transformer preset's shapes on this chip,
                       against the profile step's measured memory and step time

What comes back (the device tool returns 8 files at most): log.txt, profile-mlp.json,
profile-transformer.json, profile.png, trace.png, trace-raw.tar.gz (the trace itself, to
read again here), levers.json, plan-check.json. A rehearsal's JSON files carry
``"rehearsal": true``: none of them is a measurement. ``--collect`` refuses them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_04 = ROOT / "notebooks" / "src" / "04_profile_dp_vs_fsdp.md"
#: Each step's time limit in seconds on the accelerator (the rehearsal's sizes take far
#: less): 890 s in all, more than one call's 600, so give the device tool ``timeout_s=600``
#: and pick ``--steps`` to fit, or make two calls while the machine is warm. On one TPU v5e
#: chip (2026-12-06) the MLP's profile took about 60 s and the Transformer's 75 s (its
#: compile alone 25 s; an earlier call had stopped it at a 150 s limit during initialisation).
LIMITS = {"nb04": 150, "profile-mlp": 120, "profile-transformer": 420, "trace": 60,
          "levers": 120, "plan": 20}  # fmt: skip
STEPS = tuple(LIMITS)
#: The platforms a measurement may come from.
ACCELERATORS = ("gpu", "tpu")


# ---------------------------------------------------------------------------
# Notebook 04 as a script
# ---------------------------------------------------------------------------


def code_cells(myst: str) -> list[str]:
    """The code cells of a MyST notebook, in order, without their option block.

    A cell opens with ```` ```{code-cell} ```` and may start with a ``---`` YAML block or
    ``:key: value`` lines (jupytext's cell metadata); IPython's ``%`` and ``!`` lines become
    comments, as jupytext writes them into a ``.py``.
    """
    cells: list[str] = []
    body: list[str] | None = None
    for line in myst.splitlines():
        if body is None:
            if line.startswith("```{code-cell}"):
                body = []
        elif line.startswith("```"):
            cells.append("\n".join(_strip_options(body)))
            body = None
        else:
            body.append(line)
    if body is not None:
        raise ValueError("code_cells: the last code cell is never closed with ```")
    return cells


def _strip_options(lines: list[str]) -> list[str]:
    if lines and lines[0].strip() == "---":
        end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
        if end is None:
            raise ValueError("code_cells: a cell's --- option block is never closed")
        lines = lines[end + 1 :]
    while lines and lines[0].startswith(":") and ":" in lines[0][1:]:
        lines = lines[1:]
    return [f"# {line}" if line.lstrip().startswith(("%", "!")) else line for line in lines]


def run_notebook_04(rehearse: bool) -> None:
    """Every code cell of notebook 04 in one namespace, in the notebooks folder, timed."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.chdir(ROOT / "notebooks")
    sys.path.insert(0, str(ROOT))
    namespace: dict[str, Any] = {"__name__": "__main__"}
    for i, cell in enumerate(code_cells(NOTEBOOK_04.read_text(encoding="utf-8")), 1):
        first = next((s for s in cell.splitlines() if s.strip()), "")
        print(f"--- cell {i}: {first[:70]}", flush=True)
        t0 = time.perf_counter()
        exec(compile(cell, f"<notebook 04, cell {i}>", "exec"), namespace)  # noqa: S102
        print(f"--- cell {i}: {time.perf_counter() - t0:.1f} s", flush=True)
    print("notebook 04 ran to its end", "(rehearsal on CPU devices)" if rehearse else "")


# ---------------------------------------------------------------------------
# The steps that need jax (each runs in its own child process)
# ---------------------------------------------------------------------------


def _devices(rehearse: bool) -> list[Any]:
    from helpers import use_simulated_devices

    devices = use_simulated_devices(real_accelerators=False if rehearse else "auto")
    if not rehearse and devices[0].platform not in ACCELERATORS:
        raise SystemExit(
            f"accelerator_reference: found {devices[0].platform} devices, no GPU or TPU; on a "
            "machine without one, rehearse with --rehearse (nothing it writes is a measurement)"
        )
    return devices


def _write(out: Path, name: str, data: dict[str, Any], rehearse: bool) -> None:
    data = {"rehearsal": rehearse, **data}
    (out / name).write_text(json.dumps(data, indent=1, default=str) + "\n", encoding="utf-8")
    print(f"wrote {name}")


def run_profile(out: Path, rehearse: bool, model: str) -> None:
    """``python -m helpers.profile`` as a user types it, for one model: the MLP (DP and
    FSDP, and the figure) or the Transformer (DP only: on one chip FSDP is the same
    program, and its compile and initialisation take most of the step's time)."""
    preset = "tiny" if rehearse else "gpu"
    env = child_environment(rehearse)
    cmd = [sys.executable, "-m", "helpers.profile", "--model", model, "--preset", preset,
           "--json", str(out / f"profile-{model}.json")]  # fmt: skip
    if model == "mlp":
        cmd += ["--plot", str(out / "profile.png")]
    else:
        cmd += ["--strategies", "dp"]
    if rehearse:
        cmd += ["--steps", "2", "--warmup", "1"]
    print("$", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    data = json.loads((out / f"profile-{model}.json").read_text(encoding="utf-8"))
    _write(out, f"profile-{model}.json", data, rehearse)


def run_trace(out: Path, rehearse: bool) -> None:
    """The dp step traced, read and drawn; with 2+ GPUs FSDP with the scheduler on and off."""
    devices = _devices(rehearse)
    where = "rehearsal on CPU devices" if rehearse else f"measured on {devices[0].device_kind}"
    with tempfile.TemporaryDirectory(prefix="reference_trace_") as folder:
        _trace_into(Path(folder), out, devices, where)


def _trace_into(tmp: Path, out: Path, devices: list[Any], where: str) -> None:
    import matplotlib.pyplot as plt

    from helpers import compare_strategies, plot_trace_timeline
    from helpers.measuring.trace import format_trace_table, read_trace, summarize_trace

    (dp,) = compare_strategies(("dp",), preset="auto", steps=3, warmup=2, devices=devices,
                               progress=False, trace_dir=tmp / "dp")  # fmt: skip
    info = {"model": dp.model, "preset": dp.preset, "tokens_per_step": dp.tokens_per_step,
            "flops_formula": dp.flops_formula, "step_median_s": dp.step_median_s}  # fmt: skip
    (tmp / "dp" / "trace-info.json").write_text(json.dumps(info) + "\n", encoding="utf-8")
    with tarfile.open(out / "trace-raw.tar.gz", "w:gz") as tar:
        tar.add(tmp / "dp", arcname="dp")
    print("wrote trace-raw.tar.gz", flush=True)
    traces = {"dp": read_trace(dp.trace_dir)}
    if len(devices) >= 2 and devices[0].platform == "gpu":  # the flag is XLA:GPU's
        for on in (True, False):
            (r,) = compare_strategies(
                ("fsdp",), preset="auto", steps=2, warmup=1, devices=devices, progress=False,
                trace_dir=tmp / f"lhs_{on}",
                compiler_options={"xla_gpu_enable_latency_hiding_scheduler": on},
            )  # fmt: skip
            traces[f"LHS {'on' if on else 'off'}"] = read_trace(r.trace_dir)
    elif len(devices) < 2:
        print("one device: no collectives, so the scheduler has nothing to move (not traced)")
    print(format_trace_table({k: summarize_trace(v) for k, v in traces.items()}, where))
    fig = plot_trace_timeline(traces, where=where)
    fig.savefig(out / "trace.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    print("wrote trace.png")


def _lever_configs(rehearse: bool) -> dict[str, tuple[Any, dict[str, Any] | None, int | None]]:
    """name -> (config, compiler options or None for the default, batch per device or None)."""
    import dataclasses

    import jax.numpy as jnp

    from helpers.measuring.workload import PRESETS

    base = PRESETS["tiny" if rehearse else "gpu"]
    off = (127, 511) if rehearse else (4095, 16383)  # one short of a multiple of 128
    return {
        "baseline: the preset as it is": (base, None, None),
        "f32 compute": (dataclasses.replace(base, dtype=jnp.float32), None, None),
        "widths one short of x128": (
            dataclasses.replace(base, d_model=off[0], d_ff=off[1]), None, None),
        "XLA's default options": (base, {}, None),
        "half the tokens per step": (base, None, max(1, base.batch // 2)),
        "twice the tokens per step": (base, None, base.batch * 2),
    }  # fmt: skip


def run_levers(out: Path, rehearse: bool) -> None:
    """MFU of the MLP's dp step on one device under each lever, side by side."""
    from helpers import compare_strategies

    devices = _devices(rehearse)[:1]
    steps, warmup = (2, 1) if rehearse else (10, 3)
    rows: dict[str, Any] = {}
    for name, (cfg, options, batch) in _lever_configs(rehearse).items():
        try:
            (r,) = compare_strategies(("dp",), preset=cfg, steps=steps, warmup=warmup,
                                      devices=devices, progress=False, batch_per_device=batch,
                                      compiler_options=options, allow_cpu=rehearse)  # fmt: skip
        except Exception as err:  # noqa: BLE001 - one lever's failure must not lose the others
            rows[name] = {"error": f"{type(err).__name__}: {err}"[:500]}
        else:
            rows[name] = {"median_s": r.step_median_s, "mfu": r.mfu, "tokens": r.tokens_per_step,
                          "config": r.config, "step_memory": r.step_memory,
                          "compiler_options": r.compiler_options}  # fmt: skip
        print(f"{name:<44} {_lever_line(rows[name])}", flush=True)
    rows.update(_loop_levers(devices, rehearse))
    where = "rehearsal" if rehearse else devices[0].device_kind
    _write(out, "levers.json", {"device": where, "levers": rows}, rehearse)


def _lever_line(row: dict[str, Any]) -> str:
    if "error" in row:
        return row["error"][:100]
    mfu = "n/a" if row.get("mfu") is None else f"MFU {row['mfu']:.1%}"
    return f"median {row['median_s'] * 1e3:8.2f} ms  {mfu}"


def _loop_levers(devices: list[Any], rehearse: bool) -> dict[str, Any]:
    """Donation on and off, and a host sync (``float(loss)``) in the loop or not: per step."""
    import jax
    import optax

    from helpers.measuring.workload import PRESETS, Workload
    from helpers.placing.devices import make_mesh
    from helpers.placing.sharding import logical_rules
    from helpers.placing.train import init_sharded, make_train_step

    cfg = PRESETS["tiny" if rehearse else "gpu"]
    wl, n = Workload("lever", cfg, cfg.batch, False, ""), 4 if rehearse else 20
    mesh, opt = make_mesh((1, 1), ("data", "model"), devices=devices), optax.adam(1e-3)
    rows = {}
    for donate in (True, False):
        state = init_sharded(wl.model(), wl.x_init(mesh), mesh, "dp", jax.random.key(0), opt)
        step = make_train_step(wl.model(), opt, mesh, state, logical_rules("dp"), donate=donate)
        p, o = state.params, state.opt_state
        batch = wl.batch(jax.random.key(1), mesh)
        for sync in (False, True) if donate else (False,):
            for _ in range(2):
                p, o, loss = step(p, o, *batch)
            jax.block_until_ready((p, o))
            t0 = time.perf_counter()
            for _ in range(n):
                p, o, loss = step(p, o, *batch)
                if sync:
                    float(loss)  # what a logging line in the loop does
            jax.block_until_ready((p, o, loss))
            name = f"donate={donate}, host sync each step={sync}"
            rows[name] = {"per_step_s": (time.perf_counter() - t0) / n, "steps": n}
            print(f"{name:<44} per step {rows[name]['per_step_s'] * 1e3:8.2f} ms", flush=True)
        del p, o, state
    return rows


def run_plan(out: Path, rehearse: bool) -> None:
    """The planner for the profiled Transformer's shapes on this chip, against its measurement."""
    from helpers import plan_model, spec_of_series_model
    from helpers.measuring.workload import config_from_dict

    measured = json.loads((out / "profile-transformer.json").read_text(encoding="utf-8"))
    run = measured["results"][0]
    cfg = config_from_dict(measured["config"], model="transformer")
    spec = spec_of_series_model(cfg, f"notebook 08's Transformer, preset {run['preset']}")
    kind = measured.get("environment", {}).get("device_kind", "")
    hardware = hardware_for(str(kind))
    rows = {}
    for precision in ("f32", "mixed"):  # the profile keeps f32 weights and computes in bf16
        p = plan_model(spec, hardware, dp=1, precision=precision, seq=cfg.seq,
                       micro_batch=measured["batch_per_device"], flash_attention=False,
                       causal=False)  # fmt: skip
        rows[precision] = p.to_json()
        print(f"planner ({precision}): step {p.step_time_s * 1e3:.1f} ms, {p.memory_verdict}; GB "
              f"{ {k: round(v / 1e9, 2) for k, v in p.per_device_bytes.items()} } GB")  # fmt: skip
    got = {"median_s": run.get("step_median_s"), "step_memory": run.get("step_memory"),
           "allocator_peak": run.get("device_peak_bytes"), "mfu": run.get("mfu")}  # fmt: skip
    print(f"measured: {got}")
    _write(out, "plan-check.json", {"spec": str(spec), "planner": rows, "measured": got}, rehearse)


# ---------------------------------------------------------------------------
# The parent: every step, each in a child process under its limit
# ---------------------------------------------------------------------------


def hardware_for(device_kind: str) -> Any:
    """The planner's ``HARDWARE`` entry of a device, by the name of its peak; H200 when the
    device is not in the table (the rehearsal's CPU)."""
    from helpers import HARDWARE, peak_of

    peak = peak_of(device_kind)
    for hw in HARDWARE.values():
        if peak is not None and hw.name.startswith(peak.name.split(" (")[0]):
            return hw
    return HARDWARE["h200"]


# ---------------------------------------------------------------------------
# Here, afterwards: the files that came back, into the committed reference
# ---------------------------------------------------------------------------

_LEVER_LINE = re.compile(r"^(.{44}) median +([\d.]+) ms +MFU ([\d.]+)%$")


def collect(folder: Path) -> dict[str, Any]:
    """What one call measured (its files in ``folder``), as one JSON-ready reference.

    Reads every profile JSON, the levers (``levers.json``, or the lines each lever printed
    into log.txt where the step was stopped before writing it), and the trace. Says what
    is missing rather than inventing it.

    Raises:
      ValueError: no measurement in ``folder``, or a rehearsal's files.
    """
    from helpers.measuring.trace import read_trace, summarize_trace

    profiles = {p.stem.removeprefix("profile-"): json.loads(p.read_text())
                for p in sorted(folder.glob("profile-*.json"))}  # fmt: skip
    if not profiles:
        raise ValueError(f"collect: folder={str(folder)!r} holds no profile-*.json")
    if any(p.get("rehearsal") for p in profiles.values()):
        raise ValueError(f"collect: folder={str(folder)!r} holds a rehearsal, not a measurement")
    env = next(iter(profiles.values()))["environment"]
    ref: dict[str, Any] = {"device_kind": env["device_kind"], "platform": env["platform"],
                           "versions": {k: env[k] for k in ("jax", "jaxlib", "flax", "optax",
                                                            "python")},
                           "profiles": {}, "missing": []}  # fmt: skip
    for model in ("mlp", "transformer"):
        if model not in profiles:
            ref["missing"].append(f"profile-{model}: not in the files that came back")
            continue
        p = profiles[model]
        ref["profiles"][model] = {"preset": p["preset"], "config": p["config"],
                                  "results": [_result(r) for r in p["results"]]}  # fmt: skip
    ref["levers"] = _levers(folder)
    trace = folder / "trace-raw.tar.gz"
    if trace.exists():
        with tempfile.TemporaryDirectory() as tmp:
            with tarfile.open(trace) as tar:
                tar.extractall(tmp, filter="data")
            summary = summarize_trace(read_trace(tmp))
            info = next(Path(tmp).rglob("trace-info.json"), None)
            what = json.loads(info.read_text()) if info else {
                "model": "mlp", "preset": "auto: the profile's choice for this chip, not "
                "recorded by this call (trace-info.json came later)"}  # fmt: skip
        ref["trace"] = {**what, "step_ms": summary.step_ms, "compute_ms": summary.compute_ms,
                        "model_flops": summary.model_flops, "n_steps": summary.n_steps}  # fmt: skip
    else:
        ref["missing"].append("trace: not in the files that came back")
    return ref


def _result(r: dict[str, Any]) -> dict[str, Any]:
    keys = ("strategy", "tokens_per_step", "step_times_s", "step_median_s", "mfu",
            "flops_formula", "flops_hlo_per_device", "step_memory", "device_peak_bytes",
            "peak_name", "peak_flops_per_device", "n_params")  # fmt: skip
    return {k: r.get(k) for k in keys}


def _levers(folder: Path) -> dict[str, Any]:
    if (folder / "levers.json").exists():
        return {"from": "levers.json", **json.loads((folder / "levers.json").read_text())}
    rows = {}
    log = (folder / "log.txt").read_text() if (folder / "log.txt").exists() else ""
    inside = False
    for line in log.splitlines():
        inside = (line.startswith("=== levers") or inside) and not line.startswith("=== levers:")
        found = _LEVER_LINE.match(line) if inside else None
        if found:
            rows[found.group(1).strip()] = {"median_s": float(found.group(2)) / 1e3,
                                            "mfu": float(found.group(3)) / 100}  # fmt: skip
    stopped = re.search(r"=== levers: FAILED \((\w+)\)", log)
    note = f"read from log.txt: the step ended {stopped.group(1)} after these" if stopped else ""
    return {"from": note or "log.txt", "levers": rows}


def child_environment(rehearse: bool, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The children's environment: this repository first on ``PYTHONPATH``, whatever was
    there kept after it (a TPU machine finds its jax through ``PYTHONPATH``)."""
    env = dict(os.environ if environ is None else environ)
    kept = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *kept])
    env["PYTHONUNBUFFERED"] = "1"
    if rehearse:
        env.setdefault("NUM_DEVICES", "2")
    return env


def run_limited(cmd: list[str], *, limit: float, log: Any, env: dict[str, str]) -> int | str:
    """``cmd`` in a process group of its own; past ``limit`` seconds the whole group is killed,
    grandchildren too (a ``python -m helpers.profile`` left running would hold the TPU, and
    every later step would fail on libtpu's lock file). The exit code, or ``"timeout"``."""
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                            start_new_session=True)  # fmt: skip
    try:
        return proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        return "timeout"
    finally:
        _kill_group(proc)


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL every process of ``proc``'s group, then reap ``proc``."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


RUNNERS = {
    "profile-mlp": lambda out, rehearse: run_profile(out, rehearse, "mlp"),
    "profile-transformer": lambda out, rehearse: run_profile(out, rehearse, "transformer"),
    "trace": run_trace,
    "levers": run_levers,
    "plan": run_plan,
}


def _child(step: str, out: Path, rehearse: bool) -> None:
    if step == "nb04":
        run_notebook_04(rehearse)
    else:
        sys.path.insert(0, str(ROOT))
        os.chdir(ROOT)
        RUNNERS[step](out, rehearse)


def _environment(log: Any) -> None:
    for cmd in (["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv"],
                [sys.executable, "-c", "import jax, flax, optax; print('jax', jax.__version__, "
                 "'flax', flax.__version__, 'optax', optax.__version__, jax.devices())"]):  # fmt: skip
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            log.write(done.stdout + done.stderr)
        except (OSError, subprocess.TimeoutExpired) as err:
            log.write(f"{cmd[0]}: {err}\n")
    log.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="folder for what comes back")
    ap.add_argument("--collect", type=Path, metavar="DIR",
                    help="here, afterwards: write the files that came back into "
                         "helpers/measuring/reference_<chip>.json")  # fmt: skip
    ap.add_argument("--date", help="with --collect: the day the call ran (YYYY-MM-DD)")
    ap.add_argument("--rehearse", action="store_true", help="CPU devices, tiny sizes")
    ap.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS))
    ap.add_argument("--child", choices=STEPS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.collect:
        return _collect_into_helpers(args.collect, args.date)
    if args.out is None:
        ap.error("--out is required (or --collect)")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.child:
        _child(args.child, args.out.resolve(), args.rehearse)
        return 0
    env = child_environment(args.rehearse)
    failed = []
    with open(args.out / "log.txt", "w", encoding="utf-8") as log:
        _environment(log)
        for step in args.steps:
            t0 = time.perf_counter()
            log.write(f"\n=== {step} (limit {LIMITS[step]} s) ===\n")
            log.flush()
            cmd = [sys.executable, __file__, "--child", step, "--out", str(args.out.resolve())]
            rc = run_limited(cmd + ["--rehearse"] * args.rehearse, limit=LIMITS[step],
                             log=log, env=env)  # fmt: skip
            took = time.perf_counter() - t0
            log.write(f"=== {step}: {'ok' if rc == 0 else f'FAILED ({rc})'} in {took:.0f} s ===\n")
            log.flush()
            print(f"{step}: {'ok' if rc == 0 else f'FAILED ({rc})'} in {took:.0f} s", flush=True)
            if rc != 0:
                failed.append(step)
    print("failed:", " ".join(failed) if failed else "none", f"(log: {args.out / 'log.txt'})")
    return 1 if failed else 0


def _collect_into_helpers(folder: Path, date: str | None) -> int:
    sys.path.insert(0, str(ROOT))
    from helpers import peak_of

    ref = collect(folder)
    peak = peak_of(ref["device_kind"])
    chip = (peak.name if peak else ref["device_kind"]).lower().replace(" ", "_")
    ref = {"measured_on": f"1 x {ref['device_kind']}", "date": date or "unknown",
           "made_by": "python3 .ci/accelerator_reference.py on the device machine, then "
                      "--collect here", **ref}  # fmt: skip
    path = ROOT / "helpers" / "measuring" / f"reference_{chip}.json"
    path.write_text(json.dumps(ref, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path.relative_to(ROOT)}; missing: {ref['missing'] or 'nothing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
