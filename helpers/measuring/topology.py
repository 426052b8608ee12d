"""The real TPU compiler's program for a slice of TPU chips, compiled on any machine.

``libtpu``, the TPU runtime and compiler that ``jax[tpu]`` installs, can compile for a TPU
*topology* without a TPU: ``jax.experimental.topologies.get_topology_desc`` describes a
slice, such as ``"v5e:2x4"`` (8 TPU v5e chips) or ``"v5p:4x8x8"`` (256 TPU v5p chips), and
its devices are abstract: a mesh can be built over them, a step lowered with abstract
arrays (``jax.ShapeDtypeStruct``) and compiled, and nothing runs. The result is the
program XLA:TPU would run on that slice, with its ``memory_analysis()`` per chip, read
with the same ``collective_stats``, ``step_memory`` and ``hlo_schedule`` as a CPU program.
MaxText's ``train_compile.py`` checks its configurations the same way.

``tpu_devices`` returns such devices; ``compile_step(..., devices=tpu_devices())`` and
``compile_zero_step(..., mesh=make_mesh(..., devices=tpu_devices()))`` then compile the
series' own steps for them. A program that needs more than a chip's memory is refused by
the compiler (``RESOURCE_EXHAUSTED``); ``tpu_out_of_memory`` reads what it needed.

On a machine without a TPU, libtpu looks for one when it starts and prints warnings
about the missing TPU metadata; ``tpu_devices`` tells it first that there is no TPU
here to look for (only when this process's JAX runs on CPU devices).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
import re
from pathlib import Path
from typing import Any

from helpers.placing.models import ModelConfig, TransformerConfig

#: The libtpu that ``pip install "jax[tpu]==0.10.2"`` brings: the version CI compiles with.
LIBTPU_PIN = "libtpu==0.0.42.1"

#: What ``.ci/record_tpu_programs.py`` compiled for TPU slices, for a machine without
#: libtpu (Colab, Binder): each entry is a ``program_summary`` or a memory reading, with
#: the topology, the versions and how it was made. CI's pinned entry, which has libtpu,
#: compiles the small ones again and checks they still match (tests/test_topology.py).
RECORDED_PROGRAMS = Path(__file__).with_name("tpu_programs.json")
#: Notebook 03's MLP as it is with 8 devices (``batch``: sequences per chip).
_NB03 = ModelConfig(d_model=128, d_ff=512, n_layers=2, n_classes=16, batch=4, seq=8)
_NB03_DEEP = dataclasses.replace(_NB03, n_layers=4)
_NB03_REMAT = dataclasses.replace(_NB03_DEEP, remat=True)  # nn.remat on every block
#: Notebook 07's MLP as it is with 8 devices (``batch``: sequences per chip).
_NB07 = ModelConfig(d_model=64, d_ff=256, n_layers=4, n_classes=8, batch=2, seq=4)
#: Notebook 08's Transformer as it is with 8 devices (``batch``: sequences per chip).
_NB08 = TransformerConfig(vocab_size=1003, d_model=64, n_heads=8, head_dim=16, d_ff=256,
                          n_layers=2, batch=2, seq=32, vocab_multiple=1024)  # fmt: skip
#: The series' steps the notebooks set beside XLA:CPU's: name -> (strategy, topology, and
#: more keyword arguments of ``compile_step``), each compiled by
#: ``compile_step(strategy, preset, devices=tpu_devices(topology), **kwargs)`` with the
#: ``tiny`` preset unless the entry names another. Add an entry, then run
#: ``python .ci/record_tpu_programs.py --small`` to record it.
TPU_PROGRAMS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "dp, tiny preset, v5e:2x4": ("dp", "v5e:2x4", {}),
    "fsdp, tiny preset, v5e:2x4": ("fsdp", "v5e:2x4", {}),
    # Notebooks 03 and 03b: their MLP as it is with 8 devices (batch: 4 sequences per chip).
    "fsdp, notebook 03's MLP (2 blocks), v5e:2x4": ("fsdp", "v5e:2x4", {"preset": _NB03}),
    "fsdp, notebook 03's MLP (4 blocks), v5e:2x4": ("fsdp", "v5e:2x4", {"preset": _NB03_DEEP}),
    "fsdp + nn.remat, notebook 03's MLP (4 blocks), v5e:2x4": ("fsdp", "v5e:2x4", {"preset": _NB03_REMAT}),
    "fsdp_all, notebook 03's MLP (4 blocks), v5e:2x4": ("fsdp_all", "v5e:2x4", {"preset": _NB03_DEEP}),
    # Notebook 07: its MLP as it is with 8 devices.
    "fsdp, notebook 07's MLP, v5e:2x4": ("fsdp", "v5e:2x4", {"preset": _NB07}),
    # Notebook 08: its Transformer as it is with 8 devices (tp_sp: the whole batch per chip).
    "fsdp, notebook 08's Transformer, v5e:2x4": ("fsdp", "v5e:2x4", {"preset": _NB08}),
    "tp_sp, notebook 08's Transformer, v5e:2x4": ("tp_sp", "v5e:2x4", {"preset": _NB08, "mesh_shape": (1, 8), "batch_per_device": 16}),
}  # fmt: skip
_TOPOLOGY = re.compile(r"^v(?:[2-6])[a-z]*:\d+(?:x\d+){1,2}$")
_OOM = re.compile(
    r"HLO temporaries \(([\d.]+)([KMGT]?)\) exceeds available HBM \(([\d.]+)([KMGT]?)\)"
)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}

__all__ = [
    "LIBTPU_PIN",
    "RECORDED_PROGRAMS",
    "TPU_PROGRAMS",
    "compile_tpu_program",
    "recorded_program",
    "tpu_program",
    "format_programs",
    "program_summary",
    "tpu_compiler_available",
    "tpu_devices",
    "tpu_out_of_memory",
]


def tpu_compiler_available() -> bool:
    """True where ``libtpu`` is installed, so ``tpu_devices`` can compile for TPU chips."""
    return importlib.util.find_spec("libtpu") is not None


def tpu_devices(topology: str = "v5e:2x4") -> list[Any]:
    """The abstract devices of a TPU slice, to compile for (nothing can run on them).

    ``topology`` is a TPU version and the chips along each axis of its torus, as Cloud TPU
    names slices: ``"v5e:2x4"`` (8 v5e chips), ``"v5e:16x16"`` (256), ``"v5p:2x2x2"`` (8
    v5p chips), ``"v5p:4x4x4"`` (64), ``"v5p:4x8x8"`` (256), ``"v6e:2x4"``. A one-chip slice
    is ``"v5e:1x1"``.

    Raises:
      ValueError: ``topology`` is not of that form, or libtpu does not know it.
      RuntimeError: libtpu is not installed (``pip install libtpu==0.0.42.1``, the version
        ``jax[tpu]==0.10.2`` pins).
    """
    if not isinstance(topology, str) or not _TOPOLOGY.match(topology):
        raise ValueError(
            f"tpu_devices: topology={topology!r} must name a TPU slice such as 'v5e:2x4' or "
            "'v5p:4x4x4' (version:chips along each axis)."
        )
    if not tpu_compiler_available():
        raise RuntimeError(
            "tpu_devices: the TPU compiler (libtpu) is not installed here; "
            f"`pip install {LIBTPU_PIN}` adds it (about 700 MB), no TPU needed."
        )
    return list(_devices(topology))


@functools.cache
def _devices(topology: str) -> tuple[Any, ...]:
    import jax
    from jax.experimental import topologies

    from helpers import compat

    if not compat.backend_started() or jax.devices()[0].platform == "cpu":
        compat.quiet_libtpu_without_tpu()
    one_host = {"chips_per_host_bounds": (1, 1, 1)} if topology.endswith(":1x1") else {}
    try:
        desc = topologies.get_topology_desc(platform="tpu", topology_name=topology, **one_host)
    except Exception as err:  # noqa: BLE001 - libtpu's error types are not public
        raise ValueError(
            f"tpu_devices: libtpu does not know topology={topology!r}: "
            f"{str(err).splitlines()[0][:200]}"
        ) from None
    return tuple(desc.devices)


def tpu_out_of_memory(error: BaseException) -> tuple[float, float] | None:
    """``(bytes needed, bytes available)`` per chip from XLA:TPU's refusal to compile a
    program that does not fit ("HLO temporaries (68.38G) exceeds available HBM (15.75G)"),
    or None for any other error. The figures are the compiler's, rounded as it prints them
    (G is 2**30 bytes)."""
    found = _OOM.search(str(error))
    if found is None:
        return None
    need, need_unit, have, have_unit = found.groups()
    return float(need) * _UNITS[need_unit], float(have) * _UNITS[have_unit]


def program_summary(compiled: Any) -> dict[str, Any]:
    """What a compiled step sends and holds, per chip, for setting programs side by side:

    ``collectives``: per kind, ``ops`` by phase (``forward``, ``backward``, ``other``, from
    the JAX operation each came from: ``transpose(...)`` is the backward pass), ``arrays``,
    the element ``dtypes`` it moves and the full size in ``bytes``; ``async``: collectives
    issued as an async ``-start``/``-done`` pair, or started inside a fused computation
    that runs beside them (XLA:TPU's ``AsyncCollectiveStart``); ``memory``: ``step_memory``;
    ``hlo``: per kind, its first line in the program, for reading (no memory layouts,
    metadata, backend configuration or channel ids; cut at 300 characters, keeping its
    ``calls=`` attribute).

    An op's phase comes from its ``op_name`` metadata; an op whose metadata names neither
    ``jvp(...)`` nor ``transpose(...)`` (jax 0.12.1's all-gathers of an FSDP step name the
    parameter they gather) counts as ``other``.
    """
    from helpers.measuring.measure import _phase, collective_ops, step_memory

    text = compiled.as_text()
    kinds: dict[str, dict[str, Any]] = {}
    for op in collective_ops(compiled):
        row = kinds.setdefault(
            op.kind,
            {"ops": {"forward": 0, "backward": 0, "other": 0}, "arrays": 0, "dtypes": set(),
             "bytes": 0},
        )  # fmt: skip
        row["ops"][_phase(op.op_name)] += 1
        row["arrays"] += len(op.arrays)
        row["dtypes"].update(dt for dt, _ in op.arrays)
        row["bytes"] += op.bytes
    for row in kinds.values():
        row["dtypes"] = sorted(row["dtypes"])
    examples, comp = {}, ""
    for line in text.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{"):
            comp = line.split()[1] if line.startswith("ENTRY") else line.split()[0]
        kind = _example_kind(line)
        if kind and kind not in examples and not comp.startswith("%all-reduce-scatter"):
            examples[kind] = _trimmed(line)
    pairs = len(re.findall(r"= [^=]*? (?:all-gather|all-reduce|collective-permute|all-to-all|"
                           r"reduce-scatter)-start\(", text))  # fmt: skip
    fused = len(re.findall(r'custom_call_target="AsyncCollectiveStart"', text))
    return {"collectives": kinds, "async": pairs + fused, "memory": step_memory(compiled),
            "hlo": examples}  # fmt: skip


def _example_kind(line: str) -> str | None:
    """The collective one HLO line issues (a reduce-scatter of XLA:TPU's is the fusion that
    calls ``%all-reduce-scatter``), or None."""
    if "calls=%all-reduce-scatter" in line:
        return "reduce-scatter"
    found = re.search(r"\s(all-gather|all-reduce|reduce-scatter|collective-permute|all-to-all)"
                      r"(?:-start)?\(", line)  # fmt: skip
    return found.group(1) if found and " = " in line else None


def _trimmed(line: str) -> str:
    """An HLO line for reading: no layouts, metadata, backend configuration or channel ids;
    cut at 300 characters, then its ``calls=`` attribute, if it has one, after `` ... ``
    (what a fusion calls, such as XLA:TPU's ``%all-reduce-scatter``, ends a long line)."""
    from helpers.measuring.measure import _HLO_LAYOUT, _without_annotations

    text = _HLO_LAYOUT.sub("", _without_annotations(line.strip()))
    calls = re.search(r"\bcalls=%[\w.-]+", text)
    if len(text) <= 300 or calls is None or calls.start() < 300:
        return text[:300]
    return f"{text[:300]} ... {calls.group(0)}"


def format_programs(programs: dict[str, Any], memory: bool = True) -> str:
    """Compiled steps side by side (name -> compiled step, or its ``program_summary``, as a
    recording holds it): per collective kind, ops in the
    forward and backward pass, element types and full size; then async collectives and,
    unless ``memory=False``, the memory XLA planned per device (its arguments and
    temporaries: figures a table about collectives can leave out where it does not
    explain them)."""
    from helpers.measuring.measure import format_bytes

    sums = {name: c if isinstance(c, dict) else program_summary(c) for name, c in programs.items()}
    rows: list[tuple[str, list[str]]] = []
    for kind in sorted({k for s in sums.values() for k in s["collectives"]}):
        cells = []
        for s in sums.values():
            row = s["collectives"].get(kind)
            ops = row and row["ops"]
            cells.append("-" if row is None else
                         f"{ops['forward']} + {ops['backward']} + {ops['other']}, "
                         f"{'/'.join(row['dtypes'])} {format_bytes(row['bytes'])}")  # fmt: skip
        rows.append((kind, cells))
    rows.append(("async collectives", [str(s["async"]) for s in sums.values()]))
    for key, label in (("argument", "arguments"), ("temp", "temporaries")) if memory else ():
        rows.append((label, [format_bytes(s["memory"][key]) for s in sums.values()]))
    width = 2 + max(len(c) for c in [*sums, *(c for _, cells in rows for c in cells)])
    lines = [f"{'per device':<18}" + "".join(f"{n:>{width}}" for n in sums)]
    lines += [f"{label:<18}" + "".join(f"{c:>{width}}" for c in cells) for label, cells in rows]
    lines.append("collectives: ops in the forward + backward pass + elsewhere (the optimizer, "
                 "the loss, or an op whose metadata names no pass), the element type moved, "
                 "the full (gathered or reduced) size")  # fmt: skip
    return "\n".join(lines)


def recorded_program(name: str) -> dict[str, Any]:
    """One entry of ``RECORDED_PROGRAMS``: what the TPU compiler gave when it was recorded.

    Raises:
      ValueError: no entry is called ``name`` (the message lists them).
    """
    entries = json.loads(RECORDED_PROGRAMS.read_text(encoding="utf-8"))["programs"]
    if name not in entries:
        raise ValueError(
            f"recorded_program: name={name!r} is not recorded; there are {sorted(entries)}."
        )
    return entries[name]


def compile_tpu_program(name: str) -> Any:
    """Compile ``TPU_PROGRAMS[name]`` with the TPU compiler here (libtpu needed)."""
    from helpers.measuring.profile import compile_step

    strategy, topology, kwargs = TPU_PROGRAMS[name]
    kwargs = {"preset": "tiny", **kwargs}
    return compile_step(strategy, devices=tpu_devices(topology), **kwargs).compiled


def tpu_program(name: str) -> tuple[dict[str, Any], str]:
    """``(program_summary, where it comes from)`` of ``TPU_PROGRAMS[name]``.

    On CPU devices with libtpu installed it is compiled here and now; elsewhere (no
    libtpu, or a GPU or TPU running this process) it is read from ``RECORDED_PROGRAMS``,
    which CI checks against a fresh compile. ``HELPERS_TPU_PROGRAMS=recorded`` in the
    environment reads the recording even where libtpu could compile (seconds instead of
    about a minute for a notebook; the notebook tests use it, since tests/test_topology.py
    compiles every entry afresh and compares).

    Raises:
      ValueError: ``name`` is not one of ``TPU_PROGRAMS``, or ``HELPERS_TPU_PROGRAMS`` is
        set to something other than ``recorded`` or ``compiled``.
    """
    if name not in TPU_PROGRAMS:
        raise ValueError(f"tpu_program: name={name!r} must be one of {sorted(TPU_PROGRAMS)}.")
    from helpers.placing.devices import on_cpu

    wanted = os.environ.get("HELPERS_TPU_PROGRAMS", "compiled")
    if wanted not in ("recorded", "compiled"):
        raise ValueError(
            f"tpu_program: the environment's HELPERS_TPU_PROGRAMS={wanted!r} must be "
            "'recorded' (read the recording) or 'compiled' (compile where libtpu can)."
        )
    if wanted == "compiled" and tpu_compiler_available() and on_cpu():
        from importlib.metadata import version

        summary = program_summary(compile_tpu_program(name))
        return summary, f"compiled here by the TPU compiler, libtpu {version('libtpu')}"
    record = json.loads(RECORDED_PROGRAMS.read_text(encoding="utf-8"))
    made = f"{record['date']}, libtpu {record['versions']['libtpu']}"
    return record["programs"][name]["summary"], f"recorded by .ci/record_tpu_programs.py ({made})"
