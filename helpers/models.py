"""The small model family that notebooks 03-06 and the profile share.

``MLPStack`` is a transformer-style stack of pre-LayerNorm MLP blocks with residual
connections (the feed-forward half of a transformer layer), followed by a
classification head. Every parameter carries *logical* axis names through
``nn.with_logical_partitioning``, so one model definition can be laid out as DP, FSDP, TP or
hybrid by changing only the rules (see ``helpers.sharding.LOGICAL_RULES``):

  ``embed``     the model width d_model (kernel rows of the up-projection, ...)
  ``mlp``       the hidden width d_ff (split by tensor parallelism)
  ``classes``   the output classes
  ``embed_vec`` the small model-width vectors: LayerNorm scale/bias and the block's
                output bias (replicated by every preset except ``fsdp_all``)

Also here: generated data (no downloads) and the loss. No training loops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

_kernel_init = nn.initializers.lecun_normal()
_zeros = nn.initializers.zeros_init()
_ones = nn.initializers.ones_init()


def _layer_norm(dtype: Any, param_dtype: Any, name: str | None = None) -> nn.LayerNorm:
    return nn.LayerNorm(
        dtype=dtype,
        param_dtype=param_dtype,
        scale_init=nn.with_logical_partitioning(_ones, ("embed_vec",)),
        bias_init=nn.with_logical_partitioning(_zeros, ("embed_vec",)),
        name=name,
    )


class MLPBlock(nn.Module):
    """``x + W_out · gelu(W_in · LayerNorm(x))``: a Megatron column- then row-parallel pair."""

    d_model: int
    d_ff: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        y = _layer_norm(self.dtype, self.param_dtype)(x)
        y = nn.Dense(
            self.d_ff,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            kernel_init=nn.with_logical_partitioning(_kernel_init, ("embed", "mlp")),
            bias_init=nn.with_logical_partitioning(_zeros, ("mlp",)),
            name="up",
        )(y)
        y = nn.gelu(y)
        y = nn.with_logical_constraint(y, ("batch", "seq", "mlp"))
        y = nn.Dense(
            self.d_model,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            kernel_init=nn.with_logical_partitioning(_kernel_init, ("mlp", "embed")),
            bias_init=nn.with_logical_partitioning(_zeros, ("embed_vec",)),
            name="down",
        )(y)
        return x + y


class MLPStack(nn.Module):
    """``n_layers`` MLP blocks on inputs of shape (batch, seq, d_model), then a class head."""

    d_model: int = 128
    d_ff: int = 512
    n_layers: int = 2
    n_classes: int = 16
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(self.dtype)
        x = nn.with_logical_constraint(x, ("batch", "seq", "embed"))
        for i in range(self.n_layers):
            x = MLPBlock(self.d_model, self.d_ff, self.dtype, self.param_dtype, name=f"block_{i}")(
                x
            )
            x = nn.with_logical_constraint(x, ("batch", "seq", "embed"))
        x = _layer_norm(self.dtype, self.param_dtype, name="final_norm")(x)
        logits = nn.Dense(
            self.n_classes,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            kernel_init=nn.with_logical_partitioning(_kernel_init, ("embed", "classes")),
            bias_init=nn.with_logical_partitioning(_zeros, ("classes",)),
            name="head",
        )(x)
        return logits.astype(jnp.float32)


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of an ``MLPStack`` and of the batches it trains on."""

    d_model: int = 128
    d_ff: int = 512
    n_layers: int = 2
    n_classes: int = 16
    batch: int = 32
    seq: int = 8
    dtype: Any = jnp.float32

    def model(self) -> MLPStack:
        return MLPStack(self.d_model, self.d_ff, self.n_layers, self.n_classes, dtype=self.dtype)

    def param_count(self) -> int:
        """Parameters of the model, by formula (checked against init in the tests)."""
        per_block = (
            2 * self.d_model
            + self.d_model * self.d_ff
            + self.d_ff
            + self.d_ff * self.d_model
            + self.d_model
        )
        return (
            self.n_layers * per_block
            + 2 * self.d_model
            + self.d_model * self.n_classes
            + self.n_classes
        )

    def train_flops_per_step(self) -> float:
        """Matmul FLOPs of one training step by formula: 6 x tokens x matmul parameters."""
        matmul_params = self.n_layers * 2 * self.d_model * self.d_ff + self.d_model * self.n_classes
        return 6.0 * self.batch * self.seq * matmul_params


def synthetic_batch(
    key: jax.Array, cfg: ModelConfig, batch: int | None = None
) -> tuple[jax.Array, jax.Array]:
    """A batch of generated data: inputs ``(batch, seq, d_model)`` and integer labels ``(batch, seq)``.

    Labels come from a fixed random "teacher" projection of the inputs, so the task is
    learnable and the loss falls. The teacher is the same for every key.
    """
    batch = cfg.batch if batch is None else batch
    teacher = jax.random.normal(jax.random.key(1234), (cfg.d_model, cfg.n_classes))
    x = jax.random.normal(key, (batch, cfg.seq, cfg.d_model))
    labels = jnp.argmax(x @ teacher, axis=-1)
    return x, labels


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy over every token."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], axis=-1))
