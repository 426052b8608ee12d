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
- ``attention_block_grads``: the gradients of one such block, recomputed from the whole
  row's output and log-sum-exp (FlashAttention's backward pass), so that a backward pass
  can walk over the key blocks again instead of keeping each block's scores.

Both ``attention_block`` and ``attention_block_grads`` take ``tile``: then they walk over
the keys ``tile`` at a time, holding the scores of one ``(queries, tile)`` tile at a
time, as a fused kernel does on chip; the result is the same.
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
    "attention_block_grads",
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


def _scores(q: jax.Array, k: jax.Array, q_pos: Any, k_pos: Any) -> jax.Array:
    """``(b, q, h, k)`` scaled scores, a future key's set to ``MASKED``."""
    scores = jnp.einsum("bqhd,bkhd->bqhk", q, k) / np.sqrt(q.shape[-1]).astype(q.dtype)
    visible = jnp.asarray(q_pos)[:, None] >= jnp.asarray(k_pos)[None, :]  # (q, k)
    return jnp.where(visible[None, :, None, :], scores, MASKED)


def _one_block(
    q: jax.Array, k: jax.Array, v: jax.Array, q_pos: Any, k_pos: Any
) -> tuple[jax.Array, jax.Array]:
    scores = _scores(q, k, q_pos, k_pos)
    top = jax.lax.stop_gradient(scores.max(axis=-1))  # (b, q, h): for a safe exp
    weights = jnp.exp(scores - top[..., None])
    total = weights.sum(axis=-1)  # >= 1: the top score gives exp(0)
    out = jnp.einsum("bqhk,bkhd->bqhd", weights, v) / total[..., None]
    return out, top + jnp.log(total)


def _check_tile(tile: Any, k_len: int, where: str) -> int | None:
    if tile is None:
        return None
    if isinstance(tile, bool) or not isinstance(tile, (int, np.integer)) or tile < 1:
        raise ValueError(f"{where}: tile={tile!r} must be None or an int >= 1.")
    if k_len % tile:
        raise ValueError(f"{where}: tile={tile} must divide the {k_len} keys.")
    return int(tile)


def _tiles(k: jax.Array, v: jax.Array, k_pos: Any, tile: int) -> tuple:
    """Keys, values and positions cut into ``(n_tiles, ...)`` stacks of ``tile`` keys."""
    n = k.shape[1] // tile

    def cut(a: jax.Array) -> jax.Array:
        return a.reshape(a.shape[0], n, tile, *a.shape[2:]).swapaxes(0, 1)

    return cut(k), cut(v), jnp.asarray(k_pos).reshape(n, tile)


def attention_block(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_pos: jax.Array,
    k_pos: jax.Array,
    *,
    tile: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Causal attention of queries ``q`` against keys ``k`` and values ``v``.

    ``q`` is ``(batch, q_len, heads, head_dim)``, ``k`` and ``v`` ``(batch, k_len, heads,
    head_dim)``; ``q_pos`` and ``k_pos`` are the tokens' positions in the whole sequence:
    query ``i`` sees key ``j`` when ``q_pos[i] >= k_pos[j]``.

    Returns ``(out, lse)``: ``out`` as ``q``, the softmax-weighted values over the keys
    given; ``lse`` ``(batch, q_len, heads)``, the log-sum-exp of each query's scores
    over those keys (about ``MASKED`` where it sees none of them). Two such results over
    two sets of keys combine with ``online_softmax_combine`` into the result over both.

    With ``tile`` (which must divide ``k_len``) the keys are taken ``tile`` at a time in a
    loop, each tile's result combined into the running one: only one ``(q_len, tile)``
    tile of scores exists at a time, where without it the whole ``(q_len, k_len)`` block
    does.

    Raises:
      ValueError: shapes that do not fit, or a bad ``tile`` (checked before any
        computation).
    """
    _check_attention_args(q, k, v, q_pos, k_pos)
    tile = _check_tile(tile, k.shape[1], "attention_block")
    if tile is None or tile == k.shape[1]:
        return _one_block(q, k, v, q_pos, k_pos)
    ks, vs, ps = _tiles(k, v, k_pos, tile)

    def step(i: Any, carry: tuple) -> tuple:
        return online_softmax_combine(*carry, *_one_block(q, ks[i], vs[i], q_pos, ps[i]))

    return jax.lax.fori_loop(1, ks.shape[0], step, _one_block(q, ks[0], vs[0], q_pos, ps[0]))


def _block_grads(
    q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any, q_pos: Any, k_pos: Any
) -> tuple[jax.Array, jax.Array, jax.Array]:
    scale = 1 / np.sqrt(q.shape[-1]).astype(q.dtype)
    p = jnp.exp(_scores(q, k, q_pos, k_pos) - lse[..., None])  # the softmax, recomputed
    dv = jnp.einsum("bqhk,bqhd->bkhd", p, dout)
    dp = jnp.einsum("bqhd,bkhd->bqhk", dout, v)
    ds = p * (dp - (dout * out).sum(axis=-1)[..., None]) * scale  # softmax's backward
    return jnp.einsum("bqhk,bkhd->bqhd", ds, k), jnp.einsum("bqhk,bqhd->bkhd", ds, q), dv


def attention_block_grads(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    out: jax.Array,
    lse: jax.Array,
    dout: jax.Array,
    q_pos: jax.Array,
    k_pos: jax.Array,
    *,
    tile: int | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(dq, dk, dv)``: what the keys ``k``, ``v`` of one block add to attention's gradients.

    ``out`` and ``lse`` are the attention output and log-sum-exp of each query over **all**
    the keys it attends to (not only this block's), ``dout`` the cotangent of ``out``.
    The block's probabilities are recomputed, ``p = exp(scores - lse)``, and pushed
    through the softmax's backward pass, ``ds = p · (dout·vᵀ - rowsum(dout · out))``
    (FlashAttention's backward, Dao et al. 2022, arXiv:2205.14135, Algorithm 4). ``dq``
    is this block's part of the queries' gradient (sum it over the blocks); ``dk`` and
    ``dv`` are the whole gradient of this block's keys and values from these queries.
    With ``tile`` the keys are taken ``tile`` at a time, as in ``attention_block``.

    Raises:
      ValueError: shapes that do not fit, or a bad ``tile``.
    """
    _check_attention_args(q, k, v, q_pos, k_pos)
    for name, a, want in (
        ("out", out, q.shape),
        ("dout", dout, q.shape),
        ("lse", lse, q.shape[:3]),
    ):
        if tuple(getattr(a, "shape", ())) != tuple(want):
            raise ValueError(
                f"attention_block_grads: {name} must have shape {tuple(want)}; got "
                f"{getattr(a, 'shape', type(a).__name__)}."
            )
    tile = _check_tile(tile, k.shape[1], "attention_block_grads")
    if tile is None or tile == k.shape[1]:
        return _block_grads(q, k, v, out, lse, dout, q_pos, k_pos)
    ks, vs, ps = _tiles(k, v, k_pos, tile)

    def step(dq: jax.Array, xs: tuple) -> tuple:
        gq, gk, gv = _block_grads(q, *xs[:2], out, lse, dout, q_pos, xs[2])
        return dq + gq, (gk, gv)

    dq, (dk, dv) = jax.lax.scan(step, jnp.zeros_like(q), (ks, vs, ps))
    return dq, dk.swapaxes(0, 1).reshape(k.shape), dv.swapaxes(0, 1).reshape(v.shape)


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
