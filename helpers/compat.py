"""The one place where differences between jax/flax versions are handled.

The series supports the jax/flax range stated in the README. Anything that is
spelled differently across that range goes through a function here, so that the
notebooks and the other helpers modules never test versions themselves.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import importlib.util
import mmap
import os
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import jax

# What JAX raises for a result whose sharding its "sharding in types" rules cannot decide
# on Explicit mesh axes; jax 0.8-0.12 export it under no public name.
from jax._src.core import ShardingTypeError
from jax.sharding import AxisType, Mesh

# flax 0.12.0 looks up `jax.array_ref` and `jax.ArrayRef` while `flax.nnx` is imported,
# and jax 0.8.0 deprecates both names. Where deprecation warnings from jax and flax are
# errors (this series' kernels and tests), a learner's plain `from flax import nnx` would
# then fail on that pair of versions, for a lookup inside flax. So `flax.nnx` is imported
# here once, with exactly those two warnings silenced, before any notebook imports it
# (the setup cell imports helpers first); later imports find it already loaded. With the
# other version pairs the series tests (jax 0.10.2 / flax 0.12.8, jax 0.12.1 / flax
# 0.12.12), the import warns about nothing and the filter changes nothing.
with warnings.catch_warnings():
    warnings.filterwarnings(
        "ignore", message=r"jax\.(array_ref|ArrayRef) is deprecated", category=DeprecationWarning
    )
    from flax import nnx
# orbax-checkpoint 0.12.8 names jax.sharding.SingleDeviceSharding while it is imported, and
# jax 0.12.1 deprecates that name: the same situation as above, for `import orbax.checkpoint`.
with warnings.catch_warnings():
    warnings.filterwarnings(
        "ignore",
        message=r"jax\.sharding\.SingleDeviceSharding is deprecated",
        category=DeprecationWarning,
    )
    try:
        import orbax.checkpoint  # noqa: F401
    except ImportError:  # pragma: no cover - orbax is in requirements.txt
        pass

__all__ = [
    "AxisType",
    "ShardingTypeError",
    "gloo_on_loopback",
    "auto_mesh",
    "backend_started",
    "patient_cpu_collectives",
    "avx512_deadlock_risk",
    "cap_cpu_isa",
    "cpu_backend_flags",
    "cpu_description",
    "cpu_flags",
    "jaxlib_version",
    "cost_flops",
    "profiler_trace",
    "pvary",
    "saved_residuals",
    "is_nnx_variable",
    "nnx_sharding_names",
    "set_mesh",
]


def is_nnx_variable(x: Any) -> bool:
    """True for an ``nnx.Variable`` (``nnx.Param``, an optimizer's state, an RNG key, ...)."""
    return isinstance(x, nnx.Variable)


def nnx_sharding_names(metadata: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """The sharding annotation in an ``nnx.Variable``'s metadata (``variable.get_metadata()``,
    or a bridged Linen box's ``.metadata``), or None if it has none.

    ``nnx.with_partitioning(init, names)`` stores ``names`` under ``out_sharding`` since
    flax 0.12.4, and under ``sharding_names`` before.
    """
    for key in ("out_sharding", "sharding_names"):
        names = metadata.get(key)
        if names is not None:
            return tuple(names)
    return None


def backend_started() -> bool:
    """True once JAX has created its backends (after that, the device count is fixed)."""
    from jax._src import xla_bridge

    probe = getattr(xla_bridge, "backends_are_initialized", None)
    if probe is not None:
        return bool(probe())
    return bool(getattr(xla_bridge, "_backends", {}))  # pragma: no cover - older jax


#: What tells libtpu, when it starts on a machine with no TPU, that there is none to look
#: for: no metadata server to ask (``TPU_SKIP_MDS_QUERY``), one local host, a slice type
#: for its topology tables, and no lock file (which lets one process at a time hold a TPU). Without them libtpu prints warnings about the metadata it
#: could not find (and JAX falls back to the CPU all the same).
NO_TPU_HERE = {
    # several processes may compile at once (pytest's workers, two notebooks): without a
    # TPU there is no chip to guard, so no lock file is needed
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_ACCELERATOR_TYPE": "v5litepod-8",
    "TPU_WORKER_HOSTNAMES": "localhost",
}


#: Variables a TPU host's runtime sets (or a person who configures libtpu by hand); JAX's
#: own import sets others (``TPU_LIBRARY_PATH``), which say nothing about the machine.
_TPU_HOST_VARIABLES = (
    "TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES", "TPU_WORKER_ID", "TPU_HOST_BOUNDS",
    "TPU_CHIPS_PER_HOST_BOUNDS", "TPU_TOPOLOGY", "TPU_PROCESS_BOUNDS", "TPU_VISIBLE_CHIPS",
)  # fmt: skip


def quiet_libtpu_without_tpu() -> bool:
    """Set ``NO_TPU_HERE`` where libtpu is installed on a machine with no TPU; True if set.

    A machine with a TPU shows it: a device file (``/dev/accel*``, ``/dev/vfio/*``) or the
    ``TPU_*`` environment its runtime sets (``_TPU_HOST_VARIABLES``). Where either is present, or libtpu is not
    installed, nothing changes. Call it before JAX starts its backends.
    """
    import glob
    import importlib.util

    if importlib.util.find_spec("libtpu") is None:
        return False
    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/*"):
        return False
    if any(k in os.environ for k in _TPU_HOST_VARIABLES):
        return False
    for key, value in NO_TPU_HERE.items():
        os.environ.setdefault(key, value)
    return True


#: How long XLA:CPU waits for every simulated device to reach a collective. XLA's default
#: is a warning after 20 s and an abort (SIGABRT, "Termination timeout ... exceeded") 40 s
#: after that: a device thread that reaches an all-reduce a minute after the others kills
#: the whole process. Simulated devices are threads sharing a few cores, so on a busy
#: 2-core machine one can be that late without anything being wrong (the series' issue 25:
#: jax 0.8.0 aborted at 3, 5, 6 and 7 devices). The series waits 10 minutes, and warns
#: after 2, so that only a real deadlock ends the process, with XLA's own message.
CPU_COLLECTIVE_FLAGS = {
    "xla_cpu_collective_call_warn_stuck_timeout_seconds": 120,
    "xla_cpu_collective_call_terminate_timeout_seconds": 600,
}


@functools.cache
def xla_knows_flag(name: str) -> bool:
    """Whether this jaxlib's XLA defines the flag ``name`` (without starting a backend).

    XLA stops the process on a flag it does not know ("Unknown flag in XLA_FLAGS"), so a
    flag is only ever set where jaxlib's shared libraries carry its name. The flags in
    ``CPU_COLLECTIVE_FLAGS`` exist in every jaxlib from 0.8.0 (the oldest this series
    supports) to the newest tested; the check keeps a future jaxlib that drops one safe.
    """
    spec = importlib.util.find_spec("jaxlib")
    needle = name.encode()
    for root in (spec.submodule_search_locations or []) if spec else []:
        for dirpath, _, files in os.walk(root):
            for file in files:
                if ".so" not in file and not file.endswith((".pyd", ".dylib")):
                    continue
                with open(os.path.join(dirpath, file), "rb") as f:
                    try:
                        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                            if m.find(needle) >= 0:
                                return True
                    except ValueError:  # an empty file cannot be mapped
                        continue
    return False


def patient_cpu_collectives() -> str:
    """Add ``CPU_COLLECTIVE_FLAGS`` to ``$XLA_FLAGS`` before JAX starts its CPU backend.

    A flag already in ``$XLA_FLAGS`` wins (yours are kept as they are), and a flag this
    jaxlib does not define is left out. Returns ``$XLA_FLAGS`` as it now stands. XLA reads
    ``$XLA_FLAGS`` when the backend starts, so this must run before that.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    added = [
        f"--{name}={value}"
        for name, value in CPU_COLLECTIVE_FLAGS.items()
        if f"--{name}=" not in flags and xla_knows_flag(name)
    ]
    if added:
        os.environ["XLA_FLAGS"] = " ".join([flags, *added]).strip()
    return os.environ.get("XLA_FLAGS", "")


#: jaxlib versions whose XLA:CPU deadlocks in an all-reduce between simulated devices on
#: CPUs with AVX-512, at device counts that are not powers of two: the series' issue 38,
#: reproduced on an AMD EPYC (Zen 4, CPU family 25 model 17, ``avx512_bf16``) with jaxlib
#: 0.8.0 and 0.8.1 (``python -m helpers.profile --devices 5`` and ``3`` hang; XLA repeats
#: "This thread has been waiting for `all reduce RendezvousKey{...}`"), and passing there
#: with ``--xla_cpu_max_isa=AVX2`` (0.8.0, 26 s) and with jaxlib 0.10.2 unchanged. An Intel
#: Xeon with AVX-512 (Sapphire Rapids) did not hang with 0.8.0. No upstream issue was found
#: that names it. The range is [first, last): 0.9.x to 0.10.1 were never tried on an
#: affected CPU, so they are capped too; the cap changes only how fast the simulated
#: devices compute, never what they compute.
AVX512_DEADLOCK_JAXLIB = ("0.8.0", "0.10.2")
#: The flag and value that avoid it: XLA:CPU generates code for AVX2 at most.
CPU_ISA_CAP = ("xla_cpu_max_isa", "AVX2")


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit()) or "0"
        parts.append(int(digits))
    return tuple(parts)


# The jaxlib versions whose XLA:CPU schedule notebooks 03, 04 and 08 describe: there, a layer
# under ``nn.remat`` in an unrolled step gathers its weights twice and keeps the first copy
# (the backward gathers run early). newer jaxlibs' schedulers free it (0.12.0.1 and 0.12.1 in the version
# matrix); the notebooks assert the old behaviour only where this returns True.
REMAT_KEEPS_GATHERS_JAXLIB = ("0.8.0", "0.11.0")


def remat_keeps_gathers(version: str | None = None) -> bool:
    """Whether this jaxlib schedules an unrolled ``nn.remat`` step as the notebooks describe
    (both gathers of a layer alive at once), i.e. is in ``REMAT_KEEPS_GATHERS_JAXLIB``."""
    version = jaxlib_version() if version is None else version
    first, last = (_version_tuple(v) for v in REMAT_KEEPS_GATHERS_JAXLIB)
    return first <= _version_tuple(version) < last


def jaxlib_version() -> str:
    """The installed jaxlib's version string (without importing more of it)."""
    try:
        return importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a source build
        import jaxlib.version

        return jaxlib.version.__version__


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The instruction-set flags of this machine's CPU (``/proc/cpuinfo``'s ``flags`` line);
    empty where there is no such file (macOS, Windows)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def cpu_description(cpuinfo: str | None = None) -> str:
    """This CPU in one line: its model name and its AVX-512 flags (or "no AVX-512")."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    name = next(
        (
            line.partition(":")[2].strip()
            for line in cpuinfo.splitlines()
            if line.partition(":")[0].strip() == "model name"
        ),
        "unknown CPU",
    )
    avx512 = sorted(f for f in cpu_flags(cpuinfo) if f.startswith("avx512"))
    return f"{name} ({', '.join(avx512) if avx512 else 'no AVX-512'})"


def avx512_deadlock_risk(version: str | None = None, flags: set[str] | None = None) -> bool:
    """Whether this jaxlib on this CPU is in the range ``AVX512_DEADLOCK_JAXLIB`` on a CPU
    with AVX-512 (``avx512f``)."""
    version = jaxlib_version() if version is None else version
    flags = cpu_flags() if flags is None else flags
    first, fixed = (_version_tuple(v) for v in AVX512_DEADLOCK_JAXLIB)
    return "avx512f" in flags and first <= _version_tuple(version) < fixed


def cap_cpu_isa() -> str:
    """Add ``--xla_cpu_max_isa=AVX2`` to ``$XLA_FLAGS`` where ``avx512_deadlock_risk()``.

    Only before JAX starts its CPU backend, only where this jaxlib defines the flag, and
    never over yours: a ``--xla_cpu_max_isa`` already in ``$XLA_FLAGS`` is kept as it is.
    Returns ``$XLA_FLAGS`` as it now stands.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    name, value = CPU_ISA_CAP
    if f"--{name}=" not in flags and avx512_deadlock_risk() and xla_knows_flag(name):
        os.environ["XLA_FLAGS"] = f"{flags} --{name}={value}".strip()
    return os.environ.get("XLA_FLAGS", "")


#: XLA:CPU at its lowest code-generation optimisation level (LLVM's -O0): the series' programs
#: on simulated devices are small, so XLA's CPU compiler takes far longer than they run. Side by
#: side at 8 simulated devices (jaxlib 0.10.2, 2 cores), notebooks 03, 08, 10 and 13a took
#: 112 s together with it and 159 s without. XLA:CPU maps the level to LLVM's code-generation
#: level (``CodeGenOptLevel`` in openxla/xla's ``xla/service/cpu/cpu_compiler.cc``): it changes
#: how fast the devices compute, not the HLO program the notebooks read (its collectives,
#: its buffers). Set on the simulated devices only (``use_simulated_devices`` with
#: ``real_accelerators=False``, and the processes ``launch_local`` starts), never for a GPU or
#: TPU, nor for notebook 04's timings.
FAST_CPU_COMPILE = ("xla_backend_optimization_level", "0")


def with_fast_cpu_compile(flags: str) -> str:
    """``flags`` (an ``XLA_FLAGS`` string) with ``FAST_CPU_COMPILE`` added, unless it holds a
    level already (yours win) or this jaxlib does not define the flag."""
    name, value = FAST_CPU_COMPILE
    if f"--{name}=" in flags or not xla_knows_flag(name):
        return flags
    return f"{flags} --{name}={value}".strip()


def fast_cpu_compiles() -> str:
    """Add ``--xla_backend_optimization_level=0`` (``FAST_CPU_COMPILE``) to ``$XLA_FLAGS``
    (``with_fast_cpu_compile``), before JAX starts its CPU backend. Returns ``$XLA_FLAGS``."""
    flags = with_fast_cpu_compile(os.environ.get("XLA_FLAGS", ""))
    if flags:
        os.environ["XLA_FLAGS"] = flags
    return os.environ.get("XLA_FLAGS", "")


def cpu_backend_flags() -> str:
    """The series' XLA:CPU settings, before the backend starts: patient collectives
    (``patient_cpu_collectives``) and, on the jaxlib versions and CPUs that need it, the
    AVX2 cap (``cap_cpu_isa``). Yours win. Returns ``$XLA_FLAGS``."""
    patient_cpu_collectives()
    return cap_cpu_isa()


def auto_mesh(shape: tuple[int, ...], names: tuple[str, ...], devices: Any = None) -> Mesh:
    """``jax.make_mesh`` with every axis of type ``AxisType.Auto`` (what Linen expects)."""
    kwargs: dict[str, Any] = {"axis_types": (AxisType.Auto,) * len(names)}
    if devices is not None:
        kwargs["devices"] = devices
    return jax.make_mesh(tuple(shape), tuple(names), **kwargs)


@contextlib.contextmanager
def set_mesh(mesh: Mesh) -> Iterator[Mesh]:
    """Make ``mesh`` the current mesh inside a ``with`` block (``jax.set_mesh``)."""
    setter = getattr(jax, "set_mesh", None)
    if setter is None:  # pragma: no cover - older jax
        setter = jax.sharding.use_mesh
    with setter(mesh):
        yield mesh


def cost_flops(compiled: Any) -> float | None:
    """FLOPs of a compiled computation from XLA's cost analysis, or None if unavailable.

    ``cost_analysis()`` returned a list of dicts in older jax and a dict in newer jax.
    """
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - some backends do not implement it
        return None
    if isinstance(cost, list | tuple):
        cost = cost[0] if cost else None
    if not cost or "flops" not in cost:
        return None
    return float(cost["flops"])


@contextlib.contextmanager
def profiler_trace(log_dir: str) -> Iterator[str]:
    """``jax.profiler.trace(log_dir, create_perfetto_trace=True)`` with the options a trace
    reader needs, the same on every supported jax.

    Checked on jax 0.8.0 and 0.10.2: both write ``plugins/profile/<run>/`` under
    ``log_dir`` with ``<host>.xplane.pb`` (XProf's format), ``<host>.trace.json.gz`` and
    ``perfetto_trace.json.gz`` (both the Chrome/Perfetto JSON Trace Event Format, with the
    same events). The Python tracer is switched off (it adds hundreds of thousands of
    events per step and says nothing about XLA's ops). The host tracer stays at level 2:
    with jax 0.8.0 at level 1 the CPU backend records no HLO op at all. The one spelling
    that differs is the CPU backend's matmul: ``dot`` in jax 0.8.0, a ``ynn_fusion`` in
    0.10.2; ``helpers.measuring.trace`` tells collectives from compute by name, so neither matters.
    """
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0
    options.host_tracer_level = 2
    with jax.profiler.trace(log_dir, create_perfetto_trace=True, profiler_options=options):
        yield log_dir


def gloo_on_loopback(coordinator_is_loopback: Any) -> None:
    """Make JAX's CPU gloo collectives listen on 127.0.0.1 only, for one-machine jobs.

    JAX's CPU client makes gloo listen on the address this machine's hostname resolves
    to, and has no public switch for it. For a job whose coordinator is on loopback (a
    simulated, one-machine job) nothing should listen elsewhere, so the CPU backend
    factory is re-registered, before the backend starts, with gloo pinned to 127.0.0.1.
    The factory runs after ``jax.distributed.initialize``, so it sees the coordinator
    address even when JAX detected it (SLURM). ``coordinator_is_loopback(address)``
    decides. Private API: checked on jax 0.8.0, 0.10.2 and 0.12.0.

    Raises:
      RuntimeError: this jax no longer has one of the private names used here (a jax
        upgrade moved it). Nothing has been changed then, and the message says what is
        missing; the fix belongs here, in ``helpers/compat.py``.
    """
    try:
        from jax._src import distributed, xla_bridge
        from jax._src.lib import _jax
    except ImportError as err:
        raise RuntimeError(_gloo_moved(f"the module {err.name}")) from err
    roots = {"jax._src.distributed": distributed, "jax._src.xla_bridge": xla_bridge,
             "jax._src.lib._jax": _jax}  # fmt: skip
    missing = [f"{root}.{path}" for root, path in _GLOO_NAMES if not _has(roots[root], path)]
    if missing:
        raise RuntimeError(_gloo_moved(", ".join(missing)))

    def make_cpu_client() -> Any:
        state = distributed.global_state
        gloo = None
        if state.client is not None and coordinator_is_loopback(state.coordinator_address):
            try:
                gloo = _jax.make_gloo_tcp_collectives(
                    distributed_client=state.client, hostname="127.0.0.1"
                )
            except TypeError as err:  # its signature changed
                what = f"make_gloo_tcp_collectives as called here ({err})"
                raise RuntimeError(_gloo_moved(what)) from err
        return xla_bridge.make_cpu_client(collectives=gloo)

    xla_bridge.register_backend_factory("cpu", make_cpu_client, priority=0, fail_quietly=False)


def pvary(x: Any, axis_name: str | tuple[str, ...]) -> Any:
    """Mark ``x`` as varying over ``axis_name`` inside ``jax.shard_map`` (``check_vma``).

    The value is unchanged; only its type says "may differ per device", so that a loop
    carry or a gradient can be varying from the start. jax 0.8 spells it
    ``jax.lax.pvary(x, axis)``; newer jax ``jax.lax.pcast(x, axis, to="varying")``.
    """
    pcast = getattr(jax.lax, "pcast", None)
    if pcast is not None:
        return pcast(x, axis_name, to="varying")
    return jax.lax.pvary(x, axis_name)  # pragma: no cover - older jax


def saved_residuals(fn: Any, *args: Any) -> list[tuple[jax.ShapeDtypeStruct, str]]:
    """What ``jax.vjp(fn, *args)`` keeps for the backward pass: one ``(shape and dtype,
    where it comes from)`` per residual, in the words of
    ``jax.ad_checkpoint.print_saved_residuals`` ("from the argument x", "named 'q' from
    ...", "output of exp from ..."). Under ``jax.checkpoint`` its policy decides the list;
    see https://docs.jax.dev/en/latest/gradient-checkpointing.html.

    jax 0.8-0.12 print the list publicly (``print_saved_residuals``) and return it only from
    the private ``jax._src.ad_checkpoint.saved_residuals``, read here.
    """
    from jax._src import ad_checkpoint

    return [
        (jax.ShapeDtypeStruct(aval.shape, aval.dtype), str(why))
        for aval, why in ad_checkpoint.saved_residuals(fn, *args)
    ]


# The private names gloo_on_loopback uses: (module, attribute path).
_GLOO_NAMES = (
    ("jax._src.distributed", "global_state.client"),
    ("jax._src.distributed", "global_state.coordinator_address"),
    ("jax._src.xla_bridge", "make_cpu_client"),
    ("jax._src.xla_bridge", "register_backend_factory"),
    ("jax._src.lib._jax", "make_gloo_tcp_collectives"),
)


def _has(obj: Any, dotted: str) -> bool:
    for part in dotted.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def _gloo_moved(what: str) -> str:
    return (
        f"helpers.compat.gloo_on_loopback: jax {jax.__version__} has no {what}. This private "
        "API pins gloo to 127.0.0.1 for simulated multi-process runs; it was checked on jax "
        "0.8.0 to 0.12.0, and a newer jax moved it. Nothing was changed. Update "
        "gloo_on_loopback in helpers/compat.py for this jax, or use the jax version of "
        "requirements.txt."
    )
