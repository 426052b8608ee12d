"""A small all-reduce, one process per device, with and without XLA's NVSHMEM flag.

XLA's NVSHMEM collectives need one device per process (XLA says "NVSHMEM API is only
supported with one device per process", ``xla/stream_executor/cuda/nvshmem.cc``), and
``XLA_FLAGS`` is read once, when a process starts its backend. So the comparison cannot
run inside a notebook's kernel: ``compare_nvshmem_flag`` starts ``num_gpus`` fresh
processes (GPU ``i`` for process ``i``) once without and once with
``--xla_gpu_experimental_enable_nvshmem=true``. Each process all-reduces a small array
with ``jax.shard_map``, checks the sum, times it and prints one ``RESULT {json}`` line: the
time per all-reduce and the ``backend_config`` of the all-reduce in the compiled HLO
(where XLA records which collectives library runs it).

Run by hand, on a machine with two GPUs::

    python -m helpers.allreduce_probe --compare --num-gpus 2

``--platform cpu`` runs the same script on one simulated CPU device per process (gloo
collectives, loopback only): what the tests check, where there is no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from helpers.cli import OneLineParser, host_port, refuse, whole_number
from helpers.cluster.launcher import LOOPBACK, free_loopback_port, launch
from helpers.cluster.multiprocess import connect

NVSHMEM_FLAG = "--xla_gpu_experimental_enable_nvshmem=true"
_RESULT = "RESULT "


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = OneLineParser(
        prog="python -m helpers.allreduce_probe",
        description="Time a small all-reduce, one process per device (see the module doc).",
    )
    p.add_argument(
        "--coordinator", type=host_port, help="HOST:PORT of process 0's coordination service"
    )
    p.add_argument("--num-processes", type=whole_number(1, 65536), default=1)
    p.add_argument("--process-id", type=whole_number(0, 65535), default=0)
    p.add_argument("--platform", choices=("gpu", "cpu"), default="gpu")
    p.add_argument(
        "--nbytes",
        type=whole_number(4, 1 << 34),
        default=1 << 20,
        help="bytes per device (default 1 MiB)",
    )
    p.add_argument(
        "--iters", type=whole_number(1, 100_000), default=20, help="timed all-reduces (default 20)"
    )
    p.add_argument("--init-timeout", type=whole_number(1), default=120)
    p.add_argument("--compare", action="store_true", help="launch the comparison (no GPU arg)")
    p.add_argument(
        "--num-gpus",
        type=whole_number(1, 1024),
        default=2,
        help="with --compare: processes to start",
    )
    args = p.parse_args(argv)
    if args.process_id >= args.num_processes:
        refuse(p, "--process-id", f"0 .. --num-processes - 1 (0 .. {args.num_processes - 1}), "
               f"got {args.process_id}")  # fmt: skip
    args.heartbeat_timeout = None
    args.simulated_devices = 1 if args.platform == "cpu" else None
    return args


def backend_configs(hlo_text: str, op: str = "all-reduce") -> list[str]:
    """The ``backend_config={...}`` of every ``op`` (or ``op-start``) in HLO text, or ``"none"``."""
    out = []
    for line in hlo_text.splitlines():
        if re.search(rf"\s{re.escape(op)}(-start)?\(", line):
            m = re.search(r"backend_config=(\{.*?\})(,\s*\w+=|$)", line)
            out.append(m.group(1) if m else "none")
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    """This process's part: all-reduce ``nbytes`` per device, check it, time it."""
    import jax

    if args.platform == "cpu":
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", 1)
    connect(args)
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from helpers.placing.devices import make_mesh

    n = jax.device_count()
    mesh = make_mesh((n,), ("d",))
    per_device = max(1, args.nbytes // 4)
    sharding = NamedSharding(mesh, P("d"))
    local = np.full((per_device,), float(jax.process_index() + 1), np.float32)
    x = jax.make_array_from_process_local_data(sharding, local, (n * per_device,))
    allreduce = jax.jit(
        jax.shard_map(lambda b: jax.lax.psum(b, "d"), mesh=mesh, in_specs=P("d"), out_specs=P("d"))
    )
    compiled = allreduce.lower(x).compile()
    y = compiled(x)
    want = n * (n + 1) / 2  # every process contributes its id + 1
    ok = bool(all(np.allclose(np.asarray(s.data), want) for s in y.addressable_shards))
    jax.block_until_ready(compiled(x))
    times = []
    for _ in range(args.iters):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(x))
        times.append(time.perf_counter() - t0)
    return {
        "process": jax.process_index(),
        "devices": n,
        "platform": jax.devices()[0].platform,
        "device_kind": jax.devices()[0].device_kind,
        "nbytes_per_device": per_device * 4,
        "correct": ok,
        "median_us": float(np.median(times) * 1e6),
        "backend_configs": backend_configs(compiled.as_text()),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.compare:
        for variant in compare_nvshmem_flag(args.num_gpus, nbytes=args.nbytes, iters=args.iters):
            print(variant.summary())
        return 0
    result = run(args)
    print(_RESULT + json.dumps(result), flush=True)
    return 0


# ---------------------------------------------------------------------------
# The launcher: the same all-reduce without and with the NVSHMEM flag
# ---------------------------------------------------------------------------


def count_gpus() -> int:
    """NVIDIA GPUs on this machine, from ``nvidia-smi -L`` (0 where there is none)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return 0
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def xla_flag_accepted(flag: str, timeout_s: float = 120.0) -> tuple[bool, str]:
    """Whether this jaxlib's XLA accepts ``flag`` in ``XLA_FLAGS``: start a CPU process with it.

    XLA reads ``XLA_FLAGS`` once, when a backend starts, and stops the process on a flag it
    does not know ("Unknown flag in XLA_FLAGS"). Returns ``(True, "")``, or ``(False, the
    line that says why)``.
    """
    env = _probe_env("cpu", flag)
    code = "import jax; jax.devices(); print('backend started')"
    try:
        run_ = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True,
            timeout=timeout_s,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return False, f"the process did not start its backend within {timeout_s:.0f} s"
    if run_.returncode == 0 and "backend started" in run_.stdout:
        return True, ""
    lines = [ln.strip() for ln in (run_.stderr + run_.stdout).splitlines() if ln.strip()]
    why = next((ln for ln in lines if "Unknown flag" in ln), lines[-1] if lines else "")
    return False, why[why.find("Unknown flag") :] if "Unknown flag" in why else why


@dataclass
class Variant:
    """One launch of the probe: what each process reported, or why it did not."""

    name: str
    xla_flags: str
    results: list[dict[str, Any]] = field(default_factory=list)
    failure: str | None = None

    def summary(self) -> str:
        if self.failure:
            return f"{self.name}: did not run ({self.failure})"
        r = self.results[0]
        configs = sorted({c for res in self.results for c in res["backend_configs"]})
        return (
            f"{self.name}: {r['devices']} x {r['device_kind']}, {r['nbytes_per_device']} B per "
            f"device, sum {'correct' if all(x['correct'] for x in self.results) else 'WRONG'}, "
            f"median {max(x['median_us'] for x in self.results):.1f} us per all-reduce; "
            f"all-reduce backend_config: {'; '.join(configs) or 'none'}"
        )


def _probe_env(platform: str, extra_flags: str) -> dict[str, str]:
    env = dict(os.environ)
    for key in [k for k in env if k.lower().endswith("_proxy")]:
        del env[key]
    env["PYTHONUNBUFFERED"] = "1"
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # the notebook's kernel may hold the GPUs
    env.pop("HELPERS_REAL_DEVICES", None)
    flags = " ".join(f for f in (env.get("XLA_FLAGS", ""), extra_flags) if f)
    env["XLA_FLAGS"] = flags
    if platform == "cpu":
        env["JAX_PLATFORMS"] = "cpu"
    else:
        env.pop("JAX_PLATFORMS", None)
    return env


def launch_probe(
    num_processes: int,
    *,
    extra_flags: str = "",
    platform: str = "gpu",
    nbytes: int = 1 << 20,
    iters: int = 20,
    timeout_s: float = 180.0,
    echo: bool = False,
) -> Variant:
    """Start ``num_processes`` probe processes as one job (process ``i`` sees GPU ``i``)."""
    port = free_loopback_port()
    common = ["--coordinator", f"{LOOPBACK}:{port}", "--num-processes", str(num_processes),
              "--platform", platform, "--nbytes", str(nbytes), "--iters", str(iters),
              "--init-timeout", str(int(timeout_s))]  # fmt: skip
    commands = [
        [sys.executable, "-m", "helpers.allreduce_probe", *common, "--process-id", str(i)]
        for i in range(num_processes)
    ]
    # launch() takes one environment for all; each process gets its own GPU through env(1).
    if platform == "gpu":
        commands = [["env", f"CUDA_VISIBLE_DEVICES={i}", *cmd] for i, cmd in enumerate(commands)]
    env = _probe_env(platform, extra_flags)
    name = f"XLA_FLAGS={extra_flags or '(none)'}"
    variant = Variant(name, env["XLA_FLAGS"])
    result = launch(commands, timeout_s=timeout_s, echo=echo, env=env)
    for out in result.processes:
        for line in out.lines:
            if line.startswith(_RESULT):
                variant.results.append(json.loads(line[len(_RESULT) :]))
    if len(variant.results) != num_processes:
        last = [ln for o in result.processes for ln in o.lines if ln.strip()][-3:]
        variant.failure = (
            f"{len(variant.results)} of {num_processes} processes reported; "
            f"exit codes {[o.returncode for o in result.processes]}; last lines: "
            + " | ".join(ln[:160] for ln in last)
        )
    return variant


def compare_nvshmem_flag(num_gpus: int = 2, **kwargs: Any) -> list[Variant]:
    """The probe on ``num_gpus`` GPUs, one process each: without, then with the NVSHMEM flag."""
    return [
        launch_probe(num_gpus, extra_flags="", **kwargs),
        launch_probe(num_gpus, extra_flags=NVSHMEM_FLAG, **kwargs),
    ]


if __name__ == "__main__":
    raise SystemExit(main())
