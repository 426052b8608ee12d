"""The one place where differences between jax/flax versions are handled.

The series supports the jax/flax range stated in the README. Anything that is
spelled differently across that range goes through a function here, so that the
notebooks and the other helpers modules never test versions themselves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import jax
from jax.sharding import AxisType, Mesh

__all__ = [
    "AxisType",
    "gloo_on_loopback",
    "auto_mesh",
    "backend_started",
    "cost_flops",
    "set_mesh",
]


def backend_started() -> bool:
    """True once JAX has created its backends (after that, the device count is fixed)."""
    from jax._src import xla_bridge

    probe = getattr(xla_bridge, "backends_are_initialized", None)
    if probe is not None:
        return bool(probe())
    return bool(getattr(xla_bridge, "_backends", {}))  # pragma: no cover - older jax


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
