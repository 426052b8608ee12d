#!/usr/bin/env python3
"""Issue 45's one call on an H200: every GPU measurement the issue asks for, in one command.

A session that is lent the device machine has about 15 minutes of it, starts included,
and that machine has jax (CUDA), flax, optax and matplotlib, but no Jupyter and no
network. So the call is prepared and rehearsed here, runs once, and brings back all it
measured:

    python3 .ci/h200_reference.py --out "$OUT"               # there, from the repo root
    python .ci/h200_reference.py --rehearse --out /tmp/h200    # here: CPU devices, tiny sizes

Each step runs in a child process of its own, under a time limit, so that a crash or an
out-of-memory in one leaves the others their results; every step prints into log.txt.

  nb04     notebook 04's code cells in order, read from its MyST source (as a script)
  profile  ``python -m helpers.profile`` with the GPU preset, the MLP and the Transformer
  trace    a jax.profiler trace of the dp step, read with helpers.measuring.trace and drawn;
           with two or more GPUs, FSDP with the latency-hiding scheduler on and off too
  levers   the MLP's one-device step under each lever of ANCHORS.md (bf16 compute, widths
           in multiples of 128, XLA's GPU options, tokens per step, donation, no host
           sync in the loop), side by side in one process
  plan     the planner for the Transformer preset's shapes on one H200, against the
           profile step's measured memory and step time

What comes back (the device tool returns 8 files at most): log.txt, profile-mlp.json,
profile-transformer.json, profile.png, trace.png, trace-raw.tar.gz (the trace itself, to
read again here if helpers.measuring.trace misreads it), levers.json, plan-check.json.
A rehearsal's JSON files carry ``"rehearsal": true``: none of them is a GPU result.
"""

from __future__ import annotations

import argparse
import json
import os
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
#: Each step's time limit in seconds (on the H200; the rehearsal's sizes take far less). They
#: sum to 400 s: with the machine's start (a minute or two) one call takes under 9 of the
#: session's 15 device minutes, and ``--steps`` reruns only what failed. Call it with the
#: device tool's ``timeout_s=450``. Notebook 04 gets the most: on one GPU it compiles the
#: ``gpu`` preset's step six times (sections 2, 4 and exercise 1).
LIMITS = {"nb04": 150, "profile": 150, "trace": 60, "levers": 120, "plan": 20}
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


def run_profile(out: Path, rehearse: bool) -> None:
    """``python -m helpers.profile`` as a user types it, for the MLP and the Transformer."""
    preset = "tiny" if rehearse else "gpu"
    env = child_environment(rehearse)
    for model in ("mlp", "transformer"):
        cmd = [sys.executable, "-m", "helpers.profile", "--model", model, "--preset", preset,
               "--json", str(out / f"profile-{model}.json")]  # fmt: skip
        if model == "mlp":
            cmd += ["--plot", str(out / "profile.png")]
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
    with tempfile.TemporaryDirectory(prefix="h200_trace_") as folder:
        _trace_into(Path(folder), out, devices, where)


def _trace_into(tmp: Path, out: Path, devices: list[Any], where: str) -> None:
    import matplotlib.pyplot as plt

    from helpers import compare_strategies, plot_trace_timeline
    from helpers.measuring.trace import format_trace_table, read_trace, summarize_trace

    (dp,) = compare_strategies(("dp",), preset="auto", steps=3, warmup=2, devices=devices,
                               progress=False, trace_dir=tmp / "dp")  # fmt: skip
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
    """The planner for the profiled Transformer's shapes on one H200, against its measurement."""
    from helpers import HARDWARE, plan_model, spec_of_series_model
    from helpers.measuring.workload import config_from_dict

    measured = json.loads((out / "profile-transformer.json").read_text(encoding="utf-8"))
    run = measured["results"][0]
    cfg = config_from_dict(measured["config"], model="transformer")
    spec = spec_of_series_model(cfg, f"notebook 08's Transformer, preset {run['preset']}")
    kind = measured.get("environment", {}).get("device_kind", "")
    hardware = HARDWARE["tpu-v5e"] if "v5" in str(kind).lower() else HARDWARE["h200"]
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


RUNNERS = {"profile": run_profile, "trace": run_trace, "levers": run_levers, "plan": run_plan}


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
    ap.add_argument("--out", type=Path, required=True, help="folder for what comes back")
    ap.add_argument("--rehearse", action="store_true", help="CPU devices, tiny sizes")
    ap.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS))
    ap.add_argument("--child", choices=STEPS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
