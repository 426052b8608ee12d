"""Notebook 07's GPipe pipeline, as a function notebooks after it can import.

Notebook 07 writes it inline, to teach it: a ``lax.scan`` over ticks inside
``jax.shard_map``; at each tick every stage applies its layer to what it holds and passes
the result one stage on with ``ppermute``, with a tag saying which micro-batch it is.
Its backward is whatever ``jax.grad`` makes of that loop. Notebook 10 starts from it to
show where GPipe's memory goes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from helpers.compat import pvary

__all__ = ["gpipe_pipeline"]


def gpipe_pipeline(
    apply_stage: Callable[[Any, jax.Array], jax.Array], mesh: Mesh, axis: str = "stage"
) -> Callable[[Any, jax.Array], tuple[jax.Array, jax.Array]]:
    """Notebook 07's GPipe forward: a jitted ``(stage_params, micro_batches) -> (outputs, tags)``.

    Args:
      apply_stage: ``(params, x) -> y`` of one stage, with ``y`` of ``x``'s shape.
      mesh: a mesh with an axis ``axis``; stage ``s`` runs on its ``s``-th device.
      axis: the mesh axis of the stages.

    The returned function takes ``stage_params`` stacked along a leading axis of one entry
    per stage (split over ``axis``) and ``micro_batches`` of shape ``(M, ...)`` (every stage
    gets them; only stage 0 reads them). It returns each stage's ``(M, ...)`` outputs
    (``outputs[-1]`` is the last stage's: the model's output) and the ``(stages, M+S-1)``
    tags each stage recorded: the micro-batch it worked on at each tick, ``-1`` when idle.

    Raises:
      ValueError: ``axis`` is not an axis of ``mesh``, or ``apply_stage`` is not callable.
    """
    if not callable(apply_stage):
        raise ValueError(f"gpipe_pipeline: apply_stage must be callable; got {apply_stage!r}.")
    if axis not in mesh.shape:
        raise ValueError(f"gpipe_pipeline: axis={axis!r} is not an axis of the mesh "
                         f"{dict(mesh.shape)}.")  # fmt: skip
    n_stages = mesh.shape[axis]
    to_next = [(i, i + 1) for i in range(n_stages - 1)]  # the last stage sends nothing

    def gpipe(stage_params: Any, micro_batches: jax.Array) -> tuple[jax.Array, jax.Array]:
        params = jax.tree.map(lambda a: a[0], stage_params)  # this stage's layer
        s = jax.lax.axis_index(axis)
        M = micro_batches.shape[0]

        def tick(carry, t):
            held, tag, outputs = carry
            fresh = micro_batches[jnp.minimum(t, M - 1)]  # stage 0 feeds micro-batch t
            x = jnp.where(s == 0, fresh, held)
            tag = jnp.where(s == 0, jnp.where(t < M, t, -1), tag)
            y = jnp.where(tag >= 0, apply_stage(params, x), 0.0)
            done = (s == n_stages - 1) & (tag >= 0)
            outputs = jnp.where(done, outputs.at[jnp.maximum(tag, 0)].set(y), outputs)
            held, sent_tag = jax.lax.ppermute((y, tag), axis, perm=to_next)
            return (held, sent_tag, outputs), tag

        start = pvary((jnp.zeros_like(micro_batches[0]), jnp.int32(-1),
                       jnp.zeros_like(micro_batches)), axis)  # fmt: skip
        (_, _, outputs), tags = jax.lax.scan(tick, start, jnp.arange(M + n_stages - 1))
        return outputs[None], tags[None]

    return jax.jit(jax.shard_map(gpipe, mesh=mesh, in_specs=(P(axis), P()),
                                 out_specs=(P(axis), P(axis))))  # fmt: skip
