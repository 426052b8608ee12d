#!/usr/bin/env python3
"""Record what the real TPU compiler (libtpu) gives for the notebooks' TPU programs.

The notebooks compile for a slice of TPU chips where libtpu is installed (CI's pinned
entry, `pip install -r requirements-tpu-compiler.txt`) and read this recording where it is
not (Colab, Binder): `helpers/measuring/tpu_programs.json`. Nothing runs on a TPU; the
compiles run on this machine's CPU.

    python .ci/record_tpu_programs.py            # every entry (the LLaMA-3-8B ones take
                                                 # about 5 minutes each on 2 cores)
    python .ci/record_tpu_programs.py --small    # only the entries CI compiles again

tests/test_topology.py (CI's pinned entry) compiles the small entries again and fails if
they no longer match, so the recording cannot drift from what the compiler gives.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: LLaMA-3-8B's shapes under ZeRO-3, one 2,048-token sequence per chip, for notebook 13a.
LLAMA_SLICES = ("v5e:2x4", "v5p:2x2x2", "v5p:4x4x4", "v5p:4x8x8")


def small_entry(name: str) -> dict[str, Any]:
    from helpers import TPU_PROGRAMS, program_summary
    from helpers.measuring.topology import compile_tpu_program

    return {
        "topology": TPU_PROGRAMS[name][1],
        "summary": program_summary(compile_tpu_program(name)),
    }


def llama_config(chips: int) -> Any:
    from helpers.placing.models import TransformerConfig

    return TransformerConfig(vocab_size=128256, d_model=4096, n_heads=32, head_dim=128,
                             d_ff=14336, n_layers=32, batch=chips, seq=2048,
                             scan_layers=True)  # fmt: skip


def llama_entry(topology: str) -> dict[str, Any]:
    """Memory per chip of one ZeRO-3 step of LLaMA-3-8B's shapes (f32 Adam, no remat, no
    flash attention, as notebook 13a compiles it on CPU), or what the compiler said it
    needed when it refused the program."""
    import optax

    from helpers import make_mesh, step_memory, tpu_devices, tpu_out_of_memory
    from helpers.placing.zero import compile_zero_step

    chips = tpu_devices(topology)
    cfg = llama_config(len(chips))
    mesh = make_mesh((len(chips),), ("data",), devices=chips)
    t0 = time.perf_counter()
    entry: dict[str, Any] = {"topology": topology, "chips": len(chips),
                             "device_kind": chips[0].device_kind,
                             "tokens": [cfg.batch, cfg.seq]}  # fmt: skip
    try:
        compiled = compile_zero_step(cfg.model(), (cfg.batch, cfg.seq), mesh, optax.adam(1e-3), 3)
    except Exception as err:  # noqa: BLE001 - XLA's error class is not public
        found = tpu_out_of_memory(err)
        if found is None:
            raise
        entry["refused"] = {"needed_bytes": found[0], "available_bytes": found[1],
                            "message": str(err).splitlines()[0][:300]}  # fmt: skip
    else:
        entry["memory"] = step_memory(compiled)
    entry["compile_seconds"] = round(time.perf_counter() - t0, 1)
    return entry


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {p: version(p) for p in ("jax", "jaxlib", "libtpu", "flax", "optax")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="only the entries CI compiles again")
    args = ap.parse_args(argv)
    from helpers import RECORDED_PROGRAMS, TPU_PROGRAMS, use_simulated_devices

    use_simulated_devices(1, quiet=True)
    old = json.loads(RECORDED_PROGRAMS.read_text()) if RECORDED_PROGRAMS.exists() else {}
    programs = dict(old.get("programs", {}))
    for name in TPU_PROGRAMS:
        programs[name] = small_entry(name)
        print(f"recorded {name}", flush=True)
    if not args.small:
        for topology in LLAMA_SLICES:
            name = f"llama3-8b shapes, zero-3, {topology}"
            programs[name] = llama_entry(topology)
            print(f"recorded {name}: {programs[name].get('memory') or programs[name]['refused']}",
                  flush=True)  # fmt: skip
    record = {
        "made_by": "python .ci/record_tpu_programs.py (the TPU compiler, libtpu, on a CPU "
                   "machine; nothing ran on a TPU)",
        "date": datetime.date.today().isoformat(),
        "versions": versions(),
        "programs": programs,
    }  # fmt: skip
    RECORDED_PROGRAMS.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {RECORDED_PROGRAMS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
