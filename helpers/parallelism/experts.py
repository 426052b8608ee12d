"""Mixture of experts: a top-k router with a capacity, its dispatch, and a Linen MoE MLP.

Notebook 12 writes expert parallelism by hand with ``all_to_all``; the pieces it and the
Flax layer share live here, with tests:

- ``expert_capacity``: how many tokens each expert takes from a group of tokens.
- ``route``: each token's top-k experts, their gates, and its slot in each expert's
  buffer; a token past an expert's capacity is dropped (``kept`` is False).
- ``dispatch_weights``: the routing as two ``(tokens, experts, capacity)`` tensors, one
  that copies tokens into the experts' buffers and one that adds the experts' outputs
  back, weighted by the gates (GShard's formulation, Lepikhin et al. 2020,
  arXiv:2006.16668).
- ``expert_parallel_mlp``: one device's program for an MoE MLP whose experts are split
  over a mesh axis, the one notebook 12 writes by hand: route, dispatch into the
  experts' buffers, ``all_to_all`` to the experts' devices, the experts, ``all_to_all``
  back, combine.
- ``MoESpec`` and ``MoEMLP``: the MoE MLP as a Linen module with logical names
  (``expert``, ``embed``, ``mlp``), which ``helpers.placing.models.TransformerLM`` uses when
  given a ``MoESpec``. When the logical-axis rules map ``expert`` to a mesh axis, it runs
  ``expert_parallel_mlp`` in ``jax.shard_map`` over the current mesh.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

__all__ = [
    "MoEMLP",
    "MoESpec",
    "Routing",
    "dispatch_weights",
    "expert_capacity",
    "expected_drop_rate",
    "expert_parallel_mlp",
    "load_balance_loss",
    "route",
]


def _positive_int(value: Any, name: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{where}: {name}={value!r} must be an int >= 1.")
    return int(value)


def expert_capacity(tokens: int, n_experts: int, k: int, capacity_factor: float) -> int:
    """Slots per expert for a group of ``tokens``: ``ceil(capacity_factor · tokens · k / n_experts)``.

    With a factor of 1 the slots hold exactly the ``tokens · k`` choices if the router
    spreads them evenly; a factor above 1 leaves room for an uneven router.
    """
    where = "expert_capacity"
    tokens = _positive_int(tokens, "tokens", where)
    n_experts = _positive_int(n_experts, "n_experts", where)
    k = _positive_int(k, "k", where)
    if k > n_experts:
        raise ValueError(f"{where}: k={k} must be at most n_experts={n_experts}.")
    if isinstance(capacity_factor, bool) or not isinstance(
        capacity_factor, (int, float, np.integer, np.floating)
    ):
        raise ValueError(f"{where}: capacity_factor={capacity_factor!r} must be a number > 0.")
    if not capacity_factor > 0:
        raise ValueError(f"{where}: capacity_factor={capacity_factor!r} must be a number > 0.")
    return max(1, math.ceil(capacity_factor * tokens * k / n_experts - 1e-9))


class Routing(NamedTuple):
    """Where each token goes. Every field is ``(tokens, k)``, choice 0 the strongest.

    ``expert``: the expert chosen; ``gate``: its weight (the router's softmax over the
    ``k`` chosen experts, summing to 1); ``slot``: the token's place in that expert's
    buffer; ``kept``: ``slot < capacity`` (False: dropped, past the capacity).
    """

    expert: jax.Array
    gate: jax.Array
    slot: jax.Array
    kept: jax.Array


def route(logits: jax.Array, k: int, capacity: int) -> Routing:
    """Top-``k`` routing of a group of tokens, given the router's ``(tokens, experts)`` logits.

    Each token takes the ``k`` experts with the largest logits; its gates are the
    softmax of those ``k`` logits (as Mixtral does). Slots are handed out choice by
    choice, as in GShard and Switch: first every token's first choice, in token order,
    then every token's second choice, and so on, so that a token's first choice is
    dropped only when an expert's buffer is full of first choices. A choice that finds
    its expert's ``capacity`` slots taken is dropped.

    Raises:
      ValueError: ``logits`` is not 2-D, or ``k`` or ``capacity`` is not an int >= 1, or
        ``k`` exceeds the number of experts (checked before any computation).
    """
    if getattr(logits, "ndim", None) != 2:
        raise ValueError(
            "route: logits must be a (tokens, experts) array; got shape "
            f"{getattr(logits, 'shape', type(logits).__name__)}."
        )
    k = _positive_int(k, "k", "route")
    capacity = _positive_int(capacity, "capacity", "route")
    n_experts = logits.shape[1]
    if k > n_experts:
        raise ValueError(f"route: k={k} must be at most the {n_experts} experts.")
    top, expert = jax.lax.top_k(logits.astype(jnp.float32), k)
    gate = jax.nn.softmax(top, axis=-1)
    chosen = jax.nn.one_hot(expert, n_experts, dtype=jnp.int32)  # (tokens, k, experts)
    by_choice = chosen.transpose(1, 0, 2).reshape(-1, n_experts)  # choice-major order
    before = jnp.cumsum(by_choice, axis=0) - by_choice  # earlier claims on each expert
    slot = (before * by_choice).sum(-1).reshape(k, -1).T
    return Routing(expert, gate, slot, slot < capacity)


def dispatch_weights(
    routing: Routing, n_experts: int, capacity: int
) -> tuple[jax.Array, jax.Array]:
    """``(dispatch, combine)``, both ``(tokens, experts, capacity)``.

    ``dispatch[t, e, c]`` is 1 when token ``t`` sits in slot ``c`` of expert ``e`` (a
    dropped choice has no slot), so ``einsum("tec,td->ecd", dispatch, x)`` fills the
    experts' buffers; ``combine`` is ``dispatch`` times the gates, so
    ``einsum("tec,ecd->td", combine, y)`` adds each token's expert outputs back.
    """
    n_experts = _positive_int(n_experts, "n_experts", "dispatch_weights")
    capacity = _positive_int(capacity, "capacity", "dispatch_weights")
    if not isinstance(routing, Routing):
        raise ValueError(
            f"dispatch_weights: routing must be what route() returns; got {type(routing).__name__}."
        )
    where = (
        jax.nn.one_hot(routing.expert, n_experts)[..., None]
        * jax.nn.one_hot(jnp.where(routing.kept, routing.slot, capacity), capacity)[..., None, :]
    )  # (tokens, k, experts, capacity); a dropped choice one-hots to nothing
    dispatch = where.sum(axis=1)
    combine = (where * routing.gate[..., None, None]).sum(axis=1)
    return dispatch, combine


def expert_parallel_mlp(
    x: jax.Array,
    router: jax.Array,
    wi: jax.Array,
    wo: jax.Array,
    *,
    k: int,
    capacity: int,
    axis_name: str | None = None,
) -> jax.Array:
    """One device's MoE MLP, its experts split over mesh axis ``axis_name``.

    ``x`` ``(batch, length, embed)``: this device's sequences (each one a routing group);
    ``router`` ``(embed, experts)``: the whole router; ``wi`` ``(local experts, embed,
    mlp)`` and ``wo`` ``(local experts, mlp, embed)``: this device's experts, device ``j``
    holding experts ``j·E/n ... (j+1)·E/n - 1``. Each device routes its own tokens, fills a
    ``(experts, batch, capacity, embed)`` buffer, and one ``all_to_all`` sends every
    device the slices for its experts; a second one brings the outputs home. With
    ``axis_name=None`` every expert is local and nothing moves. Run it inside
    ``jax.shard_map``.
    """
    n_experts = router.shape[-1]
    local = wi.shape[0]
    if n_experts % local:
        raise ValueError(
            f"expert_parallel_mlp: the router's {n_experts} experts must be a multiple of the "
            f"{local} local experts in wi."
        )
    shards = n_experts // local
    if axis_name is None and shards != 1:
        raise ValueError(
            f"expert_parallel_mlp: wi holds {local} of {n_experts} experts, so axis_name must "
            "name the mesh axis that splits them."
        )
    return _experts_from_logits(
        x, jnp.einsum("bsd,de->bse", x, router), wi, wo, k, capacity, axis_name
    )


def _experts_from_logits(
    x: jax.Array,
    logits: jax.Array,
    wi: jax.Array,
    wo: jax.Array,
    k: int,
    capacity: int,
    axis_name: str | None,
) -> jax.Array:
    """``expert_parallel_mlp`` after its router: route ``logits`` ``(batch, length,
    experts)``, dispatch, the experts (with the two ``all_to_all``s), combine. The sharded
    layer calls it with logits it also feeds to the balancing sums, so that the router's
    logits are computed once (one matmul, whose gradient is one array)."""
    n_experts, local = logits.shape[-1], wi.shape[0]
    shards = n_experts // local
    routing = jax.vmap(lambda lg: route(lg, k, capacity))(logits)
    dispatch, combine = jax.vmap(lambda r: dispatch_weights(r, n_experts, capacity))(routing)
    buf = jnp.einsum("bsec,bsd->ebcd", dispatch.astype(x.dtype), x)
    buf = buf.reshape(shards, local, *buf.shape[1:])  # (destination device, its experts, ...)
    if axis_name is not None:
        buf = jax.lax.all_to_all(buf, axis_name, 0, 0, tiled=True)  # now: (source device, ...)
    h = nn.gelu(jnp.einsum("xebcd,edh->xebch", buf, wi))
    y = jnp.einsum("xebch,ehd->xebcd", h, wo)
    if axis_name is not None:
        y = jax.lax.all_to_all(y, axis_name, 0, 0, tiled=True)  # home again: (expert device, ...)
    y = y.reshape(n_experts, *y.shape[2:])
    return jnp.einsum("bsec,ebcd->bsd", combine.astype(y.dtype), y)


def load_balance_loss(logits: jax.Array, k: int) -> jax.Array:
    """Switch Transformer's auxiliary loss for top-``k`` routing: ``E · Σ_e f_e · P_e``.

    ``logits`` are the router's ``(..., experts)`` scores for a batch of tokens (every
    leading axis is tokens). ``f_e`` is the share of the batch's ``tokens · k`` choices
    that go to expert ``e`` (not differentiable: a count); ``P_e`` is the router's
    softmax probability for ``e``, averaged over the tokens (differentiable). Fedus et
    al. 2021 (arXiv:2101.03961, §2.2, eq. 4-6) define it for ``k = 1``; counting all
    ``k`` choices is the usual extension. It is 1 when both are uniform and grows to
    ``E`` as the router sends everything to one expert, so adding ``α`` times it to the
    loss pushes the router towards balance.

    Both ``f`` and ``P`` are sums over the tokens divided by their number, so a device
    holding some of the tokens can compute its ``2·E`` sums alone (``_balance_sums``);
    ``MoEMLP`` adds them over the devices with one ``psum`` inside its ``shard_map``.

    Raises:
      ValueError: ``logits`` has no expert axis, or ``k`` is not an int in
        ``1..experts``.
    """
    if getattr(logits, "ndim", 0) < 1:
        raise ValueError(
            "load_balance_loss: logits must be a (..., experts) array; got shape "
            f"{getattr(logits, 'shape', type(logits).__name__)}."
        )
    n_experts = logits.shape[-1]
    k = _positive_int(k, "k", "load_balance_loss")
    if k > n_experts:
        raise ValueError(f"load_balance_loss: k={k} must be at most the {n_experts} experts.")
    return _balance_from_sums(_balance_sums(logits, k), logits.size // n_experts, k)


def _balance_sums(logits: jax.Array, k: int) -> jax.Array:
    """``(2, experts)``: per expert, how many of the tokens' top-``k`` choices it got (a
    count, without gradient) and its router probability summed over the tokens."""
    flat = logits.reshape(-1, logits.shape[-1]).astype(jnp.float32)
    _, chosen = jax.lax.top_k(jax.lax.stop_gradient(flat), k)
    counts = jax.nn.one_hot(chosen, flat.shape[-1]).sum(axis=(0, 1))
    return jnp.stack([counts, jax.nn.softmax(flat, axis=-1).sum(axis=0)])


def _balance_from_sums(sums: jax.Array, tokens: int, k: int) -> jax.Array:
    """``E · Σ_e f_e · P_e`` from ``_balance_sums`` over ``tokens`` tokens."""
    share, prob = sums[0] / (tokens * k), sums[1] / tokens  # f_e, P_e
    return sums.shape[-1] * jnp.sum(share * prob)


def expected_drop_rate(tokens: int, n_experts: int, k: int, capacity: int) -> float:
    """The share of choices a capacity drops when routing is uniform and independent.

    If each of a group's ``tokens`` picks ``k`` distinct experts uniformly at random,
    an expert receives ``X ~ Binomial(tokens, k / n_experts)`` choices (close to
    ``Poisson(tokens · k / n_experts)``) and drops ``max(X - capacity, 0)`` of them. The
    result is ``E[max(X - capacity, 0)] / E[X]``: what chance alone drops, with no
    router bias. It shrinks as the group grows at a fixed capacity factor, because
    ``X``'s spread grows only as the square root of its mean.
    """
    where = "expected_drop_rate"
    tokens = _positive_int(tokens, "tokens", where)
    n_experts = _positive_int(n_experts, "n_experts", where)
    k = _positive_int(k, "k", where)
    capacity = _positive_int(capacity, "capacity", where)
    if k > n_experts:
        raise ValueError(f"{where}: k={k} must be at most n_experts={n_experts}.")
    p = k / n_experts
    x = np.arange(tokens + 1)
    if p == 1.0:
        pmf = (x == tokens).astype(float)
    else:
        log_pmf = (
            math.lgamma(tokens + 1)
            - np.array([math.lgamma(i + 1) + math.lgamma(tokens - i + 1) for i in x])
            + x * math.log(p)
            + (tokens - x) * math.log1p(-p)
        )
        pmf = np.exp(log_pmf)
    return float((np.maximum(x - capacity, 0) * pmf).sum() / (tokens * p))


@dataclass(frozen=True)
class MoESpec:
    """A mixture-of-experts MLP's shape: ``n_experts`` experts, top-``k`` routing, and the
    capacity factor (slots per expert, relative to an even split of the choices)."""

    n_experts: int = 4
    k: int = 2
    capacity_factor: float = 1.25

    def __post_init__(self) -> None:
        expert_capacity(1, self.n_experts, self.k, self.capacity_factor)  # validates


class MoEMLP(nn.Module):
    """A top-k routed MoE MLP, ``(batch, length, embed) -> (batch, length, embed)``.

    Each sequence is a routing group (its capacity is ``expert_capacity(length, ...)``).
    Parameters: ``router`` ``(embed, experts)``, logical ``("embed", None)``: every
    device routes with the whole router; ``wi`` ``(expert, embed, mlp)`` and ``wo``
    ``(expert, mlp, embed)``. When the logical-axis rules in force map ``expert`` to a
    mesh axis (the series' presets map it to ``None``; notebook 12 adds
    ``("expert", "expert")``), the layer runs
    ``expert_parallel_mlp`` in ``jax.shard_map`` over the current mesh (``jax.set_mesh``),
    the tokens split as the rules split ``batch``: tokens travel to their experts with
    ``all_to_all``; asked for its balancing loss (``mutable=["losses"]``), each device then
    computes the loss's ``2·E`` sums over its own tokens and one ``psum`` adds them (the
    router's logits are never gathered). Otherwise every device runs every expert it is
    given.
    """

    spec: MoESpec
    d_ff: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        e, k = self.spec.n_experts, self.spec.k
        d = x.shape[-1]
        init = nn.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))
        router = self.param(
            "router",
            nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", None)),
            (d, e),
            self.param_dtype,
        ).astype(self.dtype)
        wi = self.param(
            "wi", nn.with_logical_partitioning(init, ("expert", "embed", "mlp")),
            (e, d, self.d_ff), self.param_dtype,
        ).astype(self.dtype)  # fmt: skip
        wo = self.param(
            "wo", nn.with_logical_partitioning(init, ("expert", "mlp", "embed")),
            (e, self.d_ff, d), self.param_dtype,
        ).astype(self.dtype)  # fmt: skip
        capacity = expert_capacity(x.shape[1], e, k, self.spec.capacity_factor)
        # For a training step that asks for it (``mutable=["losses"]``), Switch's balancing
        # loss; for a measurement (``mutable=["intermediates"]``), the share of the choices
        # each expert got and the share of choices dropped. Neither is computed otherwise,
        # nor at initialisation.
        measuring = not self.is_initializing()
        balance = measuring and self.is_mutable_collection("losses")
        if measuring and self.is_mutable_collection("intermediates"):
            logits = jnp.einsum("bsd,de->bse", x, router)
            routing = jax.vmap(lambda lg: route(lg, k, capacity))(logits)
            share = jax.nn.one_hot(routing.expert, e).sum(axis=(0, 1, 2)) / routing.expert.size
            self.sow("intermediates", "expert_share", share)
            self.sow("intermediates", "dropped", 1 - routing.kept.mean())
        # Asked one at a time: in one call Flax would not give "model" to both names.
        (expert_axis,) = nn.logical_to_mesh_axes(("expert",))
        (batch_axes,) = nn.logical_to_mesh_axes(("batch",))
        if expert_axis is None or self.is_initializing():
            if balance:
                self.sow("losses", "load_balance", load_balance_loss(x @ router, k))
            return expert_parallel_mlp(x, router, wi, wo, k=k, capacity=capacity)
        y, sums = _sharded_moe(x, router, wi, wo, k, capacity, expert_axis, batch_axes, balance)
        if balance:
            tokens = x.shape[0] * x.shape[1]
            self.sow("losses", "load_balance", _balance_from_sums(sums, tokens, k))
        return y


def _sharded_moe(
    x: jax.Array,
    router: jax.Array,
    wi: jax.Array,
    wo: jax.Array,
    k: int,
    capacity: int,
    expert_axis: Any,
    batch_axes: Any,
    balance: bool,
) -> tuple[jax.Array, jax.Array | None]:
    """``expert_parallel_mlp`` in ``shard_map`` over the current mesh, the experts split over
    ``expert_axis`` and the tokens over ``batch_axes``; with ``balance``, also the balancing
    loss's ``2·E`` sums (``_balance_sums``), each device's over its own tokens, added with one
    ``psum`` over the devices that split the tokens (no gathered logits); else ``None``."""
    batch = PartitionSpec(batch_axes)

    def per_device(x: jax.Array, router: jax.Array, wi: jax.Array, wo: jax.Array) -> Any:
        if not balance:
            return expert_parallel_mlp(
                x, router, wi, wo, k=k, capacity=capacity, axis_name=expert_axis
            )
        # The logits once, for the routing and the sums alike: computed twice, the router
        # would get two gradient terms, which the compiled step all-reduces separately.
        logits = jnp.einsum("bsd,de->bse", x, router)
        y = _experts_from_logits(x, logits, wi, wo, k, capacity, expert_axis)
        sums = _balance_sums(logits, k)
        return y, (jax.lax.psum(sums, batch_axes) if batch_axes else sums)

    program = jax.shard_map(
        per_device,
        in_specs=(batch, PartitionSpec(), PartitionSpec(expert_axis), PartitionSpec(expert_axis)),
        out_specs=(batch, PartitionSpec()) if balance else batch,
    )  # fmt: skip
    out = program(x, router, wi, wo)
    return out if balance else (out, None)
