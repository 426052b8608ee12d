"""The small model family that notebooks 03-06, 08 and the profile share.

``MLPStack`` is a transformer-style stack of pre-LayerNorm MLP blocks with residual
connections (the feed-forward half of a transformer layer), followed by a
classification head. Every parameter carries *logical* axis names through
``nn.with_logical_partitioning``, so one model definition can be laid out as DP, FSDP, TP or
hybrid by changing only the rules (see ``helpers.placing.sharding.LOGICAL_RULES``):

  ``embed``     the model width d_model (kernel rows of the up-projection, ...)
  ``mlp``       the hidden width d_ff (split by tensor parallelism)
  ``classes``   the output classes
  ``embed_vec`` the small model-width vectors: LayerNorm scale/bias and the block's
                output bias (replicated by every preset except ``fsdp_all``)

``TransformerLM`` is a small decoder-only language model in the shape of Flax's
``examples/lm1b`` and MaxText: a token embedding, pre-LayerNorm blocks of causal
multi-head attention and an MLP, a final LayerNorm and the logits. Its logical names
are the conventional ones (T5X's ``docs/usage/partitioning.md`` lists them; MaxText
uses the same): ``batch``, ``length`` (activations), ``embed``, ``mlp``, ``heads``,
``kv`` (the per-head width), ``vocab``, and ``norm`` for the LayerNorm vectors
(MaxText's name for them).

Also here: generated data (no downloads) and the loss. No training loops.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from helpers.parallelism.experts import MoEMLP, MoESpec

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


class _ScannedMLPBlock(MLPBlock):
    """One ``MLPBlock`` in the ``(carry, x) -> (carry, y)`` form that ``nn.scan`` runs
    (the same fields; the block itself is its one submodule, ``block``)."""

    @nn.compact
    def __call__(self, x: jax.Array, _: None) -> tuple[jax.Array, None]:
        x = MLPBlock(self.d_model, self.d_ff, self.dtype, self.param_dtype, name="block")(x)
        return nn.with_logical_constraint(x, ("batch", "seq", "embed")), None


def _scanned_blocks(
    block: type, remat: bool, n_layers: int, sizes: tuple, x: jax.Array
) -> jax.Array:
    """``n_layers`` of ``block`` as one ``nn.scan`` named ``blocks`` (parameters stacked on a
    leading ``layers`` axis), each under ``nn.remat`` if asked. Called inside a compact
    ``__call__``, so the scan is that module's child."""
    body = nn.remat(block) if remat else block
    scanned = nn.scan(
        body,
        variable_axes={"params": 0},
        split_rngs={"params": True},
        length=n_layers,
        metadata_params={nn.PARTITION_NAME: "layers"},
    )
    x, _ = scanned(*sizes, name="blocks")(x, None)
    return x


class MLPStack(nn.Module):
    """``n_layers`` MLP blocks on inputs of shape (batch, seq, d_model), then a class head.

    The blocks are ``block_0``, ``block_1``, ... (a Python loop, unrolled in the compiled
    program). ``remat=True`` wraps every block in ``nn.remat`` (``jax.checkpoint``): the
    backward pass recomputes the block's activations from its input. ``scan_layers=True``
    makes them one ``nn.scan`` over the layers instead, as ``TransformerLM`` does: the
    parameters are stacked under ``blocks/block/...`` with a leading dimension of size
    ``n_layers`` (logical name ``layers``), and the compiled program holds one loop body.
    """

    d_model: int = 128
    d_ff: int = 512
    n_layers: int = 2
    n_classes: int = 16
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    remat: bool = False
    scan_layers: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(self.dtype)
        x = nn.with_logical_constraint(x, ("batch", "seq", "embed"))
        sizes = (self.d_model, self.d_ff, self.dtype, self.param_dtype)
        if self.scan_layers:
            x = _scanned_blocks(_ScannedMLPBlock, self.remat, self.n_layers, sizes, x)
        else:
            block = nn.remat(MLPBlock) if self.remat else MLPBlock
            for i in range(self.n_layers):
                x = block(*sizes, name=f"block_{i}")(x)
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
    remat: bool = False
    scan_layers: bool = False

    def model(self) -> MLPStack:
        return MLPStack(
            self.d_model,
            self.d_ff,
            self.n_layers,
            self.n_classes,
            dtype=self.dtype,
            remat=self.remat,
            scan_layers=self.scan_layers,
        )

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


# ---------------------------------------------------------------------------
# A decoder-only Transformer language model
# ---------------------------------------------------------------------------


def _norm(dtype: Any, param_dtype: Any, name: str) -> nn.LayerNorm:
    """A LayerNorm whose scale and bias carry MaxText's logical name ``norm``."""
    return nn.LayerNorm(
        dtype=dtype,
        param_dtype=param_dtype,
        scale_init=nn.with_logical_partitioning(_ones, ("norm",)),
        bias_init=nn.with_logical_partitioning(_zeros, ("norm",)),
        name=name,
    )


def sinusoidal_positions(length: int, d_model: int) -> np.ndarray:
    """Fixed sine/cosine position codes, shape ``(length, d_model)`` (no parameters).

    The same table as Flax's ``examples/lm1b`` ``sinusoidal_init``: sines of geometrically
    spaced frequencies in the first half of the features, cosines in the second.
    """
    half = d_model // 2
    position = np.arange(length)[:, None]
    scale = -np.log(10_000.0) / max(half - 1, 1)
    freq = np.exp(np.arange(half) * scale)
    table = np.zeros((length, d_model), np.float32)
    table[:, :half] = np.sin(position * freq)
    table[:, half : 2 * half] = np.cos(position * freq)
    return table


def _dense_general_init(shape: tuple[int, ...], names: tuple[str, ...]) -> Any:
    """A ``DenseGeneral`` kernel initialiser that carries logical names for all of ``shape``.

    ``nn.DenseGeneral`` calls its ``kernel_init`` with the kernel flattened to 2-D and
    reshapes the result afterwards. Wrapped in ``nn.with_logical_partitioning``, the
    3-name constraint then meets the 2-D array as soon as a mesh is set, and fails
    (google/flax#3676). Here the initialiser draws the flat kernel (so fan-in and fan-out
    are those of the matmul) and returns it already in its real shape.
    """

    def init(key: jax.Array, flat_shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
        return _kernel_init(key, flat_shape, dtype).reshape(shape)

    return nn.with_logical_partitioning(init, names)


def _dense(dtype: Any, param_dtype: Any) -> Any:
    """``dense(features, names, name=...)``: a bias-free ``nn.Dense`` whose kernel carries
    the logical ``names``."""

    def dense(features: int, names: tuple[str, str], name: str) -> nn.Dense:
        return nn.Dense(
            features,
            use_bias=False,
            dtype=dtype,
            param_dtype=param_dtype,
            kernel_init=nn.with_logical_partitioning(_kernel_init, names),
            name=name,
        )

    return dense


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with ``DenseGeneral`` kernels.

    ``query``, ``key`` and ``value`` are ``(embed, heads, kv)`` kernels, ``out`` is
    ``(heads, kv, embed)``: splitting ``heads`` over a mesh axis is Megatron's tensor
    parallelism (each device computes whole heads, one all-reduce adds the outputs).
    """

    n_heads: int
    head_dim: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        def project(name: str) -> jax.Array:
            y = nn.DenseGeneral(
                (self.n_heads, self.head_dim),
                axis=-1,
                use_bias=False,
                dtype=self.dtype,
                param_dtype=self.param_dtype,
                kernel_init=_dense_general_init(
                    (x.shape[-1], self.n_heads, self.head_dim), ("embed", "heads", "kv")
                ),
                name=name,
            )(x)
            return nn.with_logical_constraint(y, ("batch", "length", "heads", "kv"))

        q, k, v = project("query"), project("key"), project("value")
        length = x.shape[1]
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(self.head_dim).astype(self.dtype)
        causal = np.tril(np.ones((length, length), bool))
        scores = jnp.where(causal, scores.astype(jnp.float32), -1e9)
        weights = jax.nn.softmax(scores, axis=-1).astype(self.dtype)
        mixed = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
        mixed = nn.with_logical_constraint(mixed, ("batch", "length", "heads", "kv"))
        return nn.DenseGeneral(
            x.shape[-1],
            axis=(-2, -1),
            use_bias=False,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            kernel_init=_dense_general_init(
                (self.n_heads, self.head_dim, x.shape[-1]), ("heads", "kv", "embed")
            ),
            name="out",
        )(mixed)


class TransformerMLP(nn.Module):
    """``W_down · gelu(W_up · x)``, no biases: Megatron's column- then row-parallel pair."""

    d_ff: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        dense = _dense(self.dtype, self.param_dtype)
        h = dense(self.d_ff, ("embed", "mlp"), name="up")(x)
        h = nn.with_logical_constraint(nn.gelu(h), ("batch", "length", "mlp"))
        return dense(x.shape[-1], ("mlp", "embed"), name="down")(h)


class DecoderBlock(nn.Module):
    """``x + attn(norm(x))``, then ``x + mlp(norm(x))``: one pre-LayerNorm decoder layer.

    With ``moe`` (a ``helpers.parallelism.experts.MoESpec``) the MLP is a mixture of experts
    (``helpers.parallelism.experts.MoEMLP``, still named ``mlp``); without it, ``TransformerMLP``.
    """

    n_heads: int
    head_dim: int
    d_ff: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    moe: MoESpec | None = None

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        h = _norm(self.dtype, self.param_dtype, "attn_norm")(x)
        h = CausalSelfAttention(
            self.n_heads, self.head_dim, self.dtype, self.param_dtype, name="attn"
        )(h)
        x = nn.with_logical_constraint(x + h, ("batch", "length", "embed"))
        h = _norm(self.dtype, self.param_dtype, "mlp_norm")(x)
        if self.moe is None:
            h = TransformerMLP(self.d_ff, self.dtype, self.param_dtype, name="mlp")(h)
        else:
            h = MoEMLP(self.moe, self.d_ff, self.dtype, self.param_dtype, name="mlp")(h)
        return nn.with_logical_constraint(x + h, ("batch", "length", "embed"))


class _ScannedBlock(DecoderBlock):
    """One ``DecoderBlock`` in the ``(carry, x) -> (carry, y)`` form that ``nn.scan`` runs
    (the same fields; the block itself is its one submodule, ``block``)."""

    @nn.compact
    def __call__(self, x: jax.Array, _: None) -> tuple[jax.Array, None]:
        block = DecoderBlock(
            self.n_heads,
            self.head_dim,
            self.d_ff,
            self.dtype,
            self.param_dtype,
            self.moe,
            name="block",
        )
        return block(x), None


class TransformerLM(nn.Module):
    """A decoder-only language model: token ids ``(batch, length)`` -> logits ``(batch, length, vocab)``.

    ``vocab_size`` is the real vocabulary; the embedding table and the logits have
    ``padded_vocab`` rows (at least ``vocab_size``), as real codebases pad it so that a
    mesh axis divides it. The logits of the padding ids are masked to -1e9, so the model
    never predicts them and the loss is that of the unpadded vocabulary. With
    ``remat=True`` every block is wrapped in ``nn.remat``: its activations are recomputed
    in the backward pass instead of kept. With ``moe`` (a ``helpers.parallelism.experts.MoESpec``)
    every block's MLP is a mixture of experts; without it (the default) the model is
    unchanged.

    The blocks are ``block_0``, ``block_1``, ... (a Python loop, unrolled in the
    compiled program). With ``scan_layers=True`` they are one ``nn.scan`` over the
    layers instead, as MaxText's ``scan_layers`` does: the parameters are stacked under
    ``blocks/block/...`` with a leading dimension of size ``n_layers``, logical name
    ``layers``, and the compiled program holds one loop body, not ``n_layers`` copies.
    """

    vocab_size: int = 1003
    padded_vocab: int = 1003
    d_model: int = 64
    n_heads: int = 4
    head_dim: int = 16
    d_ff: int = 256
    n_layers: int = 2
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    remat: bool = False
    scan_layers: bool = False
    moe: MoESpec | None = None

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        if self.padded_vocab < self.vocab_size:
            raise ValueError(
                f"TransformerLM: padded_vocab={self.padded_vocab} is smaller than "
                f"vocab_size={self.vocab_size}."
            )
        x = nn.Embed(
            self.padded_vocab,
            self.d_model,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            embedding_init=nn.with_logical_partitioning(
                nn.initializers.normal(stddev=1.0), ("vocab", "embed")
            ),
            name="token_embed",
        )(tokens)
        x = x + sinusoidal_positions(tokens.shape[1], self.d_model).astype(self.dtype)
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        sizes = (self.n_heads, self.head_dim, self.d_ff, self.dtype, self.param_dtype, self.moe)
        if self.scan_layers:
            x = _scanned_blocks(_ScannedBlock, self.remat, self.n_layers, sizes, x)
        else:
            block = nn.remat(DecoderBlock) if self.remat else DecoderBlock
            for i in range(self.n_layers):
                x = block(*sizes, name=f"block_{i}")(x)
        x = _norm(self.dtype, self.param_dtype, "final_norm")(x)
        logits = _dense(self.dtype, self.param_dtype)(
            self.padded_vocab, ("embed", "vocab"), name="lm_head"
        )(x)
        logits = nn.with_logical_constraint(logits, ("batch", "length", "vocab"))
        logits = logits.astype(jnp.float32)
        if self.padded_vocab > self.vocab_size:
            real = jnp.arange(self.padded_vocab) < self.vocab_size
            logits = jnp.where(real, logits, -1e9)
        return logits


def padded_vocab_size(vocab_size: int, multiple: int) -> int:
    """``vocab_size`` rounded up to a multiple of ``multiple``.

    Megatron-LM pads to ``make_vocab_size_divisible_by`` (128) x the tensor-parallel size
    (``_vocab_size_with_padding`` in ``megatron/training/tokenizer/tokenizer.py``): 128
    keeps the matmuls in GPU-friendly tiles, and the factor makes every split even.
    """
    if vocab_size < 1 or multiple < 1:
        raise ValueError(
            f"padded_vocab_size: vocab_size={vocab_size} and multiple={multiple} must be positive."
        )
    return math.ceil(vocab_size / multiple) * multiple


@dataclass(frozen=True)
class TransformerConfig:
    """Sizes of a ``TransformerLM`` and of the token batches it trains on.

    ``seq`` is the number of input tokens per sequence; ``vocab_multiple`` pads the
    vocabulary (1: no padding). ``branching`` is the synthetic language's number of
    possible next tokens after each token (see ``MarkovLanguage``).
    """

    vocab_size: int = 1003
    d_model: int = 64
    n_heads: int = 4
    head_dim: int = 16
    d_ff: int = 256
    n_layers: int = 2
    batch: int = 16
    seq: int = 32
    vocab_multiple: int = 1
    branching: int = 4
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    remat: bool = False
    scan_layers: bool = False

    @property
    def padded_vocab(self) -> int:
        return padded_vocab_size(self.vocab_size, self.vocab_multiple)

    def model(self) -> TransformerLM:
        return TransformerLM(
            vocab_size=self.vocab_size,
            padded_vocab=self.padded_vocab,
            d_model=self.d_model,
            n_heads=self.n_heads,
            head_dim=self.head_dim,
            d_ff=self.d_ff,
            n_layers=self.n_layers,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            remat=self.remat,
            scan_layers=self.scan_layers,
        )

    def language(self) -> MarkovLanguage:
        return MarkovLanguage(self.vocab_size, self.branching)

    def matmul_params(self) -> int:
        """Parameters that multiply an activation: every kernel and the logits, not the
        embedding table (a lookup) nor the LayerNorm vectors."""
        attn = 4 * self.d_model * self.n_heads * self.head_dim
        mlp = 2 * self.d_model * self.d_ff
        return self.n_layers * (attn + mlp) + self.d_model * self.padded_vocab

    def param_count(self) -> int:
        """Parameters of the model, by formula (checked against init in the tests)."""
        norms = 2 * self.d_model
        per_block = 2 * norms + 4 * self.d_model * self.n_heads * self.head_dim
        per_block += 2 * self.d_model * self.d_ff
        embed = self.padded_vocab * self.d_model
        return embed + self.n_layers * per_block + norms + self.d_model * self.padded_vocab

    def train_flops_per_step(self) -> float:
        """FLOPs of one training step, counted the standard way (PaLM, Appendix B).

        Per token, ``6·N`` for the ``N`` matmul parameters (2 forward, 4 backward) plus
        ``12·L·H·Q·T`` for attention's two matmuls (scores and the weighted sum; ``L``
        layers, ``H`` heads of width ``Q``, ``T`` tokens per sequence), counted over the
        whole ``T x T`` score matrix, as PaLM's MFU does, although causal masking makes
        half of it unused. Chowdhery et al. 2022, arXiv:2204.02311, Appendix B.
        """
        tokens = self.batch * self.seq
        attention = 12 * self.n_layers * self.n_heads * self.head_dim * self.seq
        return float(tokens * (6 * self.matmul_params() + attention))


@dataclass(frozen=True)
class MarkovLanguage:
    """A synthetic language: after each token comes one of ``branching`` fixed successors.

    The successors of every token and their probabilities (halving from the first to the
    last) are drawn once from ``seed``. A model that has learnt them predicts the next
    token with a cross-entropy of ``entropy()`` nats, the lowest loss possible, while
    guessing uniformly costs ``log(vocab_size)``.
    """

    vocab_size: int
    branching: int = 4
    seed: int = 1234

    def __post_init__(self) -> None:
        if not 1 <= self.branching <= self.vocab_size:
            raise ValueError(
                f"MarkovLanguage: branching={self.branching} must be between 1 and "
                f"vocab_size={self.vocab_size}."
            )

    @property
    def probs(self) -> np.ndarray:
        """The probabilities of the 1st, 2nd, ... successor: halving, summing to 1."""
        weights = 0.5 ** np.arange(self.branching)
        return weights / weights.sum()

    @property
    def successors(self) -> np.ndarray:
        """``(vocab_size, branching)``: the possible next tokens of every token."""
        return _successors(self.vocab_size, self.branching, self.seed)

    def entropy(self) -> float:
        """The entropy of the next token given the previous one, in nats."""
        return float(-(self.probs * np.log(self.probs)).sum())

    def sample(self, key: jax.Array, batch: int, length: int) -> jax.Array:
        """``(batch, length)`` int32 tokens: a uniform first token, then the chain."""
        k_first, k_next = jax.random.split(key)
        first = jax.random.randint(k_first, (batch,), 0, self.vocab_size)
        choice = jax.random.choice(
            k_next, self.branching, (length - 1, batch), p=jnp.asarray(self.probs)
        )
        return _run_chain(first, choice, jnp.asarray(self.successors))


@functools.lru_cache(maxsize=8)
def _successors(vocab_size: int, branching: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = [rng.choice(vocab_size, branching, replace=False) for _ in range(vocab_size)]
    table = np.stack(rows).astype(np.int32)
    table.setflags(write=False)  # cached: shared by every caller
    return table


@jax.jit
def _run_chain(first: jax.Array, choice: jax.Array, table: jax.Array) -> jax.Array:
    def step(token: jax.Array, c: jax.Array) -> tuple[jax.Array, jax.Array]:
        nxt = table[token, c]
        return nxt, nxt

    _, rest = jax.lax.scan(step, first, choice)
    return jnp.concatenate([first[:, None], rest.T], axis=1).astype(jnp.int32)


def synthetic_tokens(
    key: jax.Array, cfg: TransformerConfig, batch: int | None = None
) -> tuple[jax.Array, jax.Array]:
    """A batch of the synthetic language: inputs and next-token targets, both ``(batch, seq)``.

    The targets are the inputs shifted by one token. The language is the same for every
    key (``cfg.language()``); the key picks the sentences.
    """
    batch = cfg.batch if batch is None else batch
    tokens = cfg.language().sample(key, batch, cfg.seq + 1)
    return tokens[:, :-1], tokens[:, 1:]
