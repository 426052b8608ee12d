"""Device setup for the series: simulated CPU devices, and meshes that fit them.

Every notebook starts with ``use_simulated_devices()``. It must run before JAX
starts its backend: once JAX has created its devices their number is fixed for
the life of the process, and a later request is silently ignored by JAX itself.
This module turns that silent trap into a clear error.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import jax
from jax.sharding import Mesh

from helpers import compat

DEFAULT_NUM_DEVICES = 8
_ENV_COUNT = "NUM_DEVICES"
_ENV_REAL = "HELPERS_REAL_DEVICES"


def _requested_count(n: int | None) -> int:
    if n is None:
        raw = os.environ.get(_ENV_COUNT, str(DEFAULT_NUM_DEVICES))
        try:
            n = int(raw)
        except ValueError:
            raise ValueError(
                f"NUM_DEVICES={raw!r} is not a whole number; set it to a device count such as 8 or 1."
            ) from None
        source = f"NUM_DEVICES={raw}"
    else:
        source = f"n={n}"
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(
            f"use_simulated_devices: {source} must be a positive device count (got {n!r})."
        )
    return n


def _describe(devices: Sequence[jax.Device]) -> str:
    kinds = sorted({d.device_kind for d in devices})
    return f"{len(devices)} {devices[0].platform.upper()} device(s) ({', '.join(kinds)})"


def use_simulated_devices(
    n: int | None = None, *, real_accelerators: bool | str | None = None, quiet: bool = False
) -> list[jax.Device]:
    """Run JAX on ``n`` simulated CPU devices, print what we got, and return ``jax.devices()``.

    Args:
      n: how many devices. Defaults to ``$NUM_DEVICES``, or 8 when that is unset.
      real_accelerators: ``False`` (the default): simulated CPU devices, even on a machine
        with a GPU, so notebooks 01-03 show the same thing everywhere. ``True``: the
        machine's real devices as JAX finds them (``n`` is ignored). ``"auto"``: real GPUs
        or TPUs when there are any, otherwise ``n`` simulated CPU devices (notebook 04).
        ``$HELPERS_REAL_DEVICES=1`` turns ``True`` on for every notebook.
      quiet: do not print the one-line summary.

    Calling it again with the same ``n`` returns quietly, so re-running a cell works. Before
    JAX starts, it adds the series' XLA:CPU flags to ``$XLA_FLAGS`` (yours win):
    ``compat.cpu_backend_flags`` and, for simulated devices only, ``compat.fast_cpu_compiles``.

    Raises:
      ValueError: ``n`` (or ``$NUM_DEVICES``) is not a positive whole number.
      RuntimeError: JAX's backend has already started with a different device count or
        platform. JAX cannot change that inside a running process: restart the kernel.
    """
    if real_accelerators is None:
        real_accelerators = os.environ.get(_ENV_REAL, "") == "1"

    if real_accelerators not in (True, False, "auto"):
        raise ValueError(
            f"use_simulated_devices: real_accelerators={real_accelerators!r} must be True, False or 'auto'."
        )

    if real_accelerators is not False and not compat.backend_started():
        compat.quiet_libtpu_without_tpu()  # libtpu installed, no TPU: no metadata warnings
    if real_accelerators is True:
        devices = jax.devices()
        if not quiet:
            print(
                f"JAX {jax.__version__}: using this machine's real devices: {_describe(devices)}."
            )
        return devices

    want = _requested_count(n)
    if not compat.backend_started():
        compat.cpu_backend_flags()
    if real_accelerators == "auto":
        if not compat.backend_started():
            jax.config.update("jax_num_cpu_devices", want)
        devices = jax.devices()
        if devices[0].platform != "cpu":
            if not quiet:
                print(
                    f"JAX {jax.__version__}: using this machine's accelerators: {_describe(devices)}."
                )
            return devices
    if compat.backend_started():
        return _started_cpu_devices(want, real_accelerators == "auto", quiet)
    compat.fast_cpu_compiles()  # real_accelerators=False: "auto" started its backend above
    return _start_cpu_devices(want, quiet)


def _started_cpu_devices(want: int, auto: bool, quiet: bool) -> list[jax.Device]:
    """The devices of a backend already running: ``want`` CPU devices, or a RuntimeError."""
    devices = jax.devices()
    if devices[0].platform == "cpu" and len(devices) == want:
        if auto and not quiet:
            print(
                f"JAX {jax.__version__}: no GPU or TPU found; running on {_describe(devices)}, "
                "simulated on this machine's CPU."
            )
        return devices
    raise RuntimeError(
        f"use_simulated_devices(n={want}): JAX has already started with "
        f"{_describe(devices)}, and a running process cannot change its device count. "
        "Restart the kernel (Kernel > Restart) and run this cell before any other JAX code."
    )


def _start_cpu_devices(want: int, quiet: bool) -> list[jax.Device]:
    """Start JAX's CPU backend with ``want`` simulated devices and say so."""
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", want)
    devices = jax.devices()
    if len(devices) != want:  # pragma: no cover - defensive: JAX ignored the request
        raise RuntimeError(f"asked JAX for {want} CPU devices but got {len(devices)}")
    if not quiet:
        print(
            f"JAX {jax.__version__}: running on {_describe(devices)}, simulated on this machine's CPU."
        )
        if want == 1:
            print(
                "Only one device: there is nothing to split, so every sharding below places "
                "whole arrays on device 0. Set NUM_DEVICES=8 (or call "
                "use_simulated_devices(8) in a fresh kernel) to see arrays spread out."
            )
    return devices


def on_cpu(devices: Sequence[jax.Device] | None = None) -> bool:
    """True when ``devices`` (default: ``jax.devices()``) are CPU devices: the series'
    simulated devices, whose programs XLA:CPU compiles. False on a GPU or a TPU.

    A lesson that reads XLA:CPU's program (its temporaries, the order of its instructions,
    the ops it forms) checks this and, on an accelerator, says so and steps aside: the
    accelerator's compiler lays out the same step in its own way.
    """
    devices = list(jax.devices() if devices is None else devices)
    if not devices:
        raise ValueError("on_cpu: devices is empty; pass the devices a notebook runs on.")
    return devices[0].platform == "cpu"


def make_mesh(
    shape: Sequence[int], names: Sequence[str], *, devices: Sequence[jax.Device] | None = None
) -> Mesh:
    """A device mesh whose axes are all ``AxisType.Auto`` (what Flax Linen expects).

    ``shape`` may use ``-1`` once, for "all remaining devices".

    Raises:
      ValueError: ``shape`` and ``names`` differ in length, a size is not positive, or the
        mesh needs more devices than are available.
    """
    shape = list(shape)
    names = tuple(names)
    devices = list(jax.devices() if devices is None else devices)
    if len(shape) != len(names):
        raise ValueError(
            f"make_mesh: shape {tuple(shape)} has {len(shape)} axes but names {names} has {len(names)}."
        )
    if shape.count(-1) > 1:
        raise ValueError(f"make_mesh: shape {tuple(shape)} may use -1 at most once.")
    if -1 in shape:
        rest = math.prod(s for s in shape if s != -1)
        if rest <= 0 or len(devices) % rest:
            raise ValueError(
                f"make_mesh: cannot fill -1 in shape {tuple(shape)} with {len(devices)} devices."
            )
        shape[shape.index(-1)] = len(devices) // rest
    for name, size in zip(names, shape, strict=True):
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"make_mesh: axis '{name}' has size {size!r}; sizes must be positive.")
    need = math.prod(shape)
    if need > len(devices):
        raise ValueError(
            f"make_mesh: mesh shape {tuple(shape)} with axes {names} needs {need} devices, "
            f"but only {len(devices)} are available. Use mesh_shape_for({len(devices)}, ...) "
            "to pick a shape that fits."
        )
    return compat.auto_mesh(tuple(shape), names, devices=devices[:need])


def mesh_shape_for(n_devices: int, n_axes: int = 2, *, prefer: str = "first") -> tuple[int, ...]:
    """A mesh shape with ``n_axes`` axes that uses all ``n_devices`` and is as square as possible.

    ``prefer="first"`` puts the larger factor first (e.g. 8 devices, 2 axes -> (4, 2));
    ``"last"`` puts it last. With one device every axis has size 1.
    """
    if isinstance(n_devices, bool) or not isinstance(n_devices, int) or n_devices < 1:
        raise ValueError(
            f"mesh_shape_for: n_devices={n_devices!r} must be a whole number, at least 1."
        )
    if isinstance(n_axes, bool) or not isinstance(n_axes, int) or n_axes < 1:
        raise ValueError(f"mesh_shape_for: n_axes={n_axes!r} must be a whole number, at least 1.")
    if prefer not in ("first", "last"):
        raise ValueError(f"mesh_shape_for: prefer={prefer!r} must be 'first' or 'last'.")

    # Among all ways to write n_devices as n_axes factors, the one whose sorted factors are
    # lexicographically smallest from the largest down: the smallest largest axis, then the
    # smallest second-largest, ... (72 on 2 axes -> (9, 8), not the (12, 6) a greedy
    # split of prime factors gives).
    def factorings(n: int, k: int, most: int) -> list[list[int]]:
        if k == 1:
            return [[n]] if n <= most else []
        return [
            [d, *rest]
            for d in range(min(n, most), 0, -1)
            if n % d == 0
            for rest in factorings(n // d, k - 1, d)
        ]

    shape = min(factorings(n_devices, n_axes, n_devices))
    shape.sort(reverse=(prefer == "first"))
    return tuple(shape)
