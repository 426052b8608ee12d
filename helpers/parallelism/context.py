"""Context parallelism: the sequence split over devices, and attention put back together.

Notebook 11 writes ring attention by hand in ``jax.shard_map``; the pieces it reuses live
here, with tests:

- ``contiguous_chunks`` and ``zigzag_chunks``: which chunks of the sequence each device
  holds. The sequence is cut into ``2·n`` equal chunks; device ``d`` holds two of them.
- ``chunk_positions``: the token positions a device holds, from such a layout.
- ``causal_block_work``: how many (query chunk, key chunk) score blocks each device must
  compute under a causal mask (a block that lies wholly in the future is skipped).
- ``attention_block``: causal attention of some queries against some keys, returning the
  output *and* the log-sum-exp of each query's scores, so that partial results can be
  combined later.
- ``online_softmax_combine``: that combination, exact up to rounding (the trick of
  FlashAttention and ring attention).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "MASKED",
    "attention_block",
    "causal_block_work",
    "chunk_positions",
    "contiguous_chunks",
    "online_softmax_combine",
    "zigzag_chunks",
]

# The score given to a masked (future) key. Finite, so that a block whose every key is
# masked gives a log-sum-exp near -1e30 and a weight exp(-1e30 - lse) = 0 when combined,
# with no NaN in the values or the gradients (-inf would give inf - inf there).
MASKED = -1e30


def _check_n(n_devices: Any, where: str) -> int:
    if isinstance(n_devices, bool) or not isinstance(n_devices, (int, np.integer)):
        raise ValueError(f"{where}: n_devices={n_devices!r} must be an int >= 1.")
    if n_devices < 1:
        raise ValueError(f"{where}: n_devices={n_devices!r} must be an int >= 1.")
    return int(n_devices)


def contiguous_chunks(n_devices: int) -> tuple[tuple[int, ...], ...]:
    """The plain split: device ``d`` holds chunks ``2d`` and ``2d+1`` of ``2·n`` chunks."""
    n = _check_n(n_devices, "contiguous_chunks")
    return tuple((2 * d, 2 * d + 1) for d in range(n))


def zigzag_chunks(n_devices: int) -> tuple[tuple[int, ...], ...]:
    """The zig-zag split: device ``d`` holds chunks ``d`` and ``2n-1-d`` of ``2·n`` chunks.

    Each device pairs an early chunk (few keys before it) with a late one (many), so that
    every device has the same causal work: ``2n+1`` score blocks.
    """
    n = _check_n(n_devices, "zigzag_chunks")
    return tuple((d, 2 * n - 1 - d) for d in range(n))


def _check_layout(chunks: Any, where: str) -> tuple[tuple[int, ...], ...]:
    try:
        layout = tuple(tuple(int(c) for c in dev) for dev in chunks)
    except TypeError:
        raise ValueError(
            f"{where}: chunks must be a sequence, one sequence of chunk numbers per device; "
            f"got {chunks!r}."
        ) from None
    if not layout or not all(layout):
        raise ValueError(f"{where}: chunks must name at least one chunk for every device.")
    sizes = {len(dev) for dev in layout}
    if len(sizes) != 1:
        raise ValueError(f"{where}: chunks must give every device as many chunks; got {layout}.")
    flat = sorted(c for dev in layout for c in dev)
    if flat != list(range(len(flat))):
        raise ValueError(
            f"{where}: chunks must use each of 0..{len(flat) - 1} exactly once; got {layout}."
        )
    return layout


def chunk_positions(chunks: Sequence[Sequence[int]], length: int) -> np.ndarray:
    """Token positions per device: an ``(n_devices, length // n_devices)`` int array.

    Row ``d`` lists, in order, the positions of the tokens in device ``d``'s chunks, with
    the sequence of ``length`` tokens cut into as many equal chunks as ``chunks`` names.
    Reading the rows one after the other gives the order in which to lay the sequence out
    so that ``P("context")`` hands each device its chunks.
    """
    layout = _check_layout(chunks, "chunk_positions")
    n_chunks = sum(len(dev) for dev in layout)
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
        raise ValueError(f"chunk_positions: length={length!r} must be an int >= 1.")
    if length % n_chunks:
        raise ValueError(
            f"chunk_positions: length={length} must be a multiple of the {n_chunks} chunks."
        )
    size = length // n_chunks
    return np.array(
        [np.concatenate([np.arange(c * size, (c + 1) * size) for c in dev]) for dev in layout]
    )


def causal_block_work(chunks: Sequence[Sequence[int]]) -> np.ndarray:
    """Score blocks each device computes under a causal mask, skipping masked ones.

    The sequence is cut into chunks; a (query chunk ``i``, key chunk ``j``) block holds
    some score a query may see when ``j <= i`` (the diagonal block is half masked, and
    computed). A device computes, for each of its query chunks ``i``, the ``i + 1`` blocks
    ``j = 0..i``. Returns an int array, one entry per device.
    """
    layout = _check_layout(chunks, "causal_block_work")
    return np.array([sum(i + 1 for i in dev) for dev in layout], dtype=int)


def _check_attention_args(q: Any, k: Any, v: Any, q_pos: Any, k_pos: Any) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if getattr(x, "ndim", None) != 4:
            raise ValueError(
                f"attention_block: {name} must be a (batch, length, heads, head_dim) array; "
                f"got shape {getattr(x, 'shape', type(x).__name__)}."
            )
    if k.shape != v.shape:
        raise ValueError(f"attention_block: k {k.shape} and v {v.shape} must have one shape.")
    if q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:]:
        raise ValueError(
            f"attention_block: q {q.shape} and k {k.shape} must agree in batch, heads and head_dim."
        )
    for name, pos, x in (("q_pos", q_pos, q), ("k_pos", k_pos, k)):
        if tuple(getattr(pos, "shape", ())) != (x.shape[1],):
            raise ValueError(
                f"attention_block: {name} must hold one position per token, shape "
                f"({x.shape[1]},); got {getattr(pos, 'shape', type(pos).__name__)}."
            )


def attention_block(
    q: jax.Array, k: jax.Array, v: jax.Array, q_pos: jax.Array, k_pos: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Causal attention of queries ``q`` against keys ``k`` and values ``v``.

    ``q`` is ``(batch, q_len, heads, head_dim)``, ``k`` and ``v`` ``(batch, k_len, heads,
    head_dim)``; ``q_pos`` and ``k_pos`` are the tokens' positions in the whole sequence:
    query ``i`` sees key ``j`` when ``q_pos[i] >= k_pos[j]``.

    Returns ``(out, lse)``: ``out`` as ``q``, the softmax-weighted values over the keys
    given; ``lse`` ``(batch, q_len, heads)``, the log-sum-exp of each query's scores
    over those keys (about ``MASKED`` where it sees none of them). Two such results over
    two sets of keys combine with ``online_softmax_combine`` into the result over both.

    Raises:
      ValueError: shapes that do not fit (checked before any computation).
    """
    _check_attention_args(q, k, v, q_pos, k_pos)
    scores = jnp.einsum("bqhd,bkhd->bqhk", q, k) / np.sqrt(q.shape[-1]).astype(q.dtype)
    visible = jnp.asarray(q_pos)[:, None] >= jnp.asarray(k_pos)[None, :]  # (q, k)
    scores = jnp.where(visible[None, :, None, :], scores, MASKED)
    top = jax.lax.stop_gradient(scores.max(axis=-1))  # (b, q, h): for a safe exp
    weights = jnp.exp(scores - top[..., None])
    total = weights.sum(axis=-1)  # >= 1: the top score gives exp(0)
    out = jnp.einsum("bqhk,bkhd->bqhd", weights, v) / total[..., None]
    return out, top + jnp.log(total)


def online_softmax_combine(
    out_a: jax.Array, lse_a: jax.Array, out_b: jax.Array, lse_b: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Combine attention over two sets of keys into attention over both.

    ``out_a`` is softmax attention over key set A, ``lse_a`` the log-sum-exp of the
    scores over A (as ``attention_block`` returns them); the same for B. Then

        lse = log(exp(lse_a) + exp(lse_b)),
        out = exp(lse_a - lse)·out_a + exp(lse_b - lse)·out_b,

    computed without overflow (the larger log-sum-exp is taken out first). The result is
    attention over A and B together, whatever the order the sets come in.

    Raises:
      ValueError: ``out_a`` and ``out_b`` differ in shape, or a ``lse`` is not the
        shape of its ``out`` without the last dimension.
    """
    if getattr(out_a, "shape", None) != getattr(out_b, "shape", None):
        raise ValueError(
            f"online_softmax_combine: out_a {getattr(out_a, 'shape', out_a)!r} and out_b "
            f"{getattr(out_b, 'shape', out_b)!r} must have one shape."
        )
    for name, lse in (("lse_a", lse_a), ("lse_b", lse_b)):
        if getattr(lse, "shape", None) != out_a.shape[:-1]:
            raise ValueError(
                f"online_softmax_combine: {name} must have shape {out_a.shape[:-1]} (out "
                f"without its last dimension); got {getattr(lse, 'shape', lse)!r}."
            )
    top = jnp.maximum(lse_a, lse_b)
    wa, wb = jnp.exp(lse_a - top), jnp.exp(lse_b - top)
    total = wa + wb  # >= 1
    out = (wa[..., None] * out_a + wb[..., None] * out_b) / total[..., None]
    return out, top + jnp.log(total)
