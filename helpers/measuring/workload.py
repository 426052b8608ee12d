"""What the profile trains: the models' presets, sized for a mesh.

``helpers.measuring.profile`` measures; this module says *what* it measures. ``workload_for`` is
the one place that maps a model choice (``"mlp"``: the ``MLPStack`` of notebooks 03-06;
``"transformer"``: the ``TransformerLM`` of notebook 08) and a preset (``tiny``,
``gpu_small``, ``gpu``, or a config of your own) to the module, the batch it is fed and
its FLOPs. ``fit_to_mesh`` rounds a preset's widths up so that every mesh axis a strategy
splits them over divides them, so that any device count from 1 to 8 runs;
``degenerate`` says why a strategy on a mesh would not be itself (``tp`` on (N, 1)).
A new model family adds its presets and the branches of ``Workload``.

Every name here is also importable from ``helpers.measuring.profile``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from helpers.placing.devices import mesh_shape_for
from helpers.placing.models import (
    MLPStack,
    ModelConfig,
    TransformerConfig,
    padded_vocab_size,
    synthetic_batch,
    synthetic_tokens,
)
from helpers.placing.sharding import STRATEGY_AXES, logical_rules

P = PartitionSpec
#: The profile's mesh axes: ("data", "model").
AXES = ("data", "model")


# ---------------------------------------------------------------------------
# Presets. ``batch`` is PER DEVICE here: the run multiplies it by the size of the mesh's
# "data" axis (weak scaling: each device keeps the same amount of work as devices are added).
# ---------------------------------------------------------------------------

PRESETS: dict[str, ModelConfig] = {
    # Seconds on simulated CPU devices; f32, because bf16 matmuls on a CPU are emulated.
    "tiny": ModelConfig(d_model=128, d_ff=512, n_layers=2, n_classes=16, batch=4, seq=16),
    # A GPU with < 40 GB (L4, T4, A100-40GB): 134 M parameters, bf16 compute, f32 weights.
    "gpu_small": ModelConfig(
        d_model=2048, d_ff=8192, n_layers=4, n_classes=128, batch=4, seq=1024, dtype=jnp.bfloat16
    ),
    # An H100/H200-class GPU: 537 M parameters, bf16 compute with f32 master weights (MLPStack
    # keeps param_dtype float32; the Dense layers cast kernels to bf16 for the matmuls).
    # Every dimension is a multiple of 128 and each device sees 8 x 2048 = 16,384 tokens, so
    # the step is dominated by (16384 x 4096) @ (4096 x 16384) matmuls. Compiled for CPU
    # (`--dry-run`), DP's step plans about 27 GiB per device: it fits an 80 GB GPU with room.
    "gpu": ModelConfig(
        d_model=4096, d_ff=16384, n_layers=4, n_classes=128, batch=8, seq=2048, dtype=jnp.bfloat16
    ),
}
#: The Transformer's presets (``--model transformer``): the same names and roles as the
#: MLP's. All keep f32 master weights (``param_dtype``). The GPU ones compute in bf16, have
#: every width a multiple of 128 and heads x head_dim = d_model, and pad GPT-2's
#: 50,257-token vocabulary to a multiple of 128 (``vocab_multiple``): 50,304, nanoGPT's
#: size. Their attention is the plain (batch, heads, seq, seq) kind, no flash kernel, so
#: the sequence is kept at 1024; its two matmuls are about 6% of the step's FLOPs
#: (``train_flops_per_step`` counts them, as PaLM does). Memory figures below are the step
#: XLA plans for one CPU device (``--dry-run``): a GPU build plans differently, but it is
#: the same arrays.
TRANSFORMER_PRESETS: dict[str, TransformerConfig] = {
    # Seconds on simulated CPU devices, f32. 8 heads and d_model 128 split evenly over 1, 2,
    # 4 or 8 devices; the vocabulary 1003 -> 1008 over 2, 3, 4, 6, 7 or 8.
    "tiny": TransformerConfig(
        vocab_size=1003, d_model=128, n_heads=8, head_dim=16, d_ff=512, n_layers=2,
        batch=4, seq=32, vocab_multiple=8,
    ),
    # A GPU with < 40 GB (L4, T4, A100-40GB): 204 M parameters, half of them the embedding
    # and the logits; 2 x 1024 tokens per device; DP's step plans about 7.4 GiB.
    "gpu_small": TransformerConfig(
        vocab_size=50257, d_model=1024, n_heads=8, head_dim=128, d_ff=4096, n_layers=8,
        batch=2, seq=1024, vocab_multiple=128, dtype=jnp.bfloat16,
    ),
    # An H100/H200-class GPU: 609 M parameters, 8 x 1024 = 8,192 tokens per device, so the
    # largest matmuls are (8192 x 2048) @ (2048 x 8192) in the MLPs and (8192 x 2048) @
    # (2048 x 50304) for the logits. DP's step plans about 40 GiB on one device (36 GiB
    # each on 8): it fits an 80 GB GPU with room.
    "gpu": TransformerConfig(
        vocab_size=50257, d_model=2048, n_heads=16, head_dim=128, d_ff=8192, n_layers=8,
        batch=8, seq=1024, vocab_multiple=128, dtype=jnp.bfloat16,
    ),
}  # fmt: skip
#: The model choices and their presets (``--model``).
MODEL_PRESETS: dict[str, dict[str, Any]] = {"mlp": PRESETS, "transformer": TRANSFORMER_PRESETS}
#: Presets sized for a GPU: they refuse to *run* on CPU devices unless asked (``allow_cpu``).
GPU_PRESETS = ("gpu_small", "gpu")
#: A width that a mesh axis must divide is rounded up to a multiple of this (and of the axis).
PRESET_MULTIPLE = {"tiny": 8, "gpu_small": 128, "gpu": 128}
#: ``preset="auto"`` picks ``gpu_small`` below this much accelerator memory per device.
SMALL_GPU_BYTES = 40 * 2**30

# ---------------------------------------------------------------------------
# Choosing a preset
# ---------------------------------------------------------------------------


def device_memory_stats(device: Any) -> dict[str, Any] | None:
    """``device.memory_stats()``, or None where the backend has none (a CPU)."""
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - some backends do not implement it
        return None
    return stats or None


def choose_preset(devices: Sequence[Any]) -> str:
    """``tiny`` on CPU devices; on accelerators ``gpu``, or ``gpu_small`` with < 40 GiB each."""
    if devices[0].platform == "cpu":
        return "tiny"
    limits = [
        s["bytes_limit"] for s in map(device_memory_stats, devices) if s and "bytes_limit" in s
    ]
    if limits and min(limits) < SMALL_GPU_BYTES:
        return "gpu_small"
    return "gpu"


def model_of(cfg: ModelConfig | TransformerConfig) -> str:
    """The model choice a config builds: ``"mlp"`` or ``"transformer"``."""
    if isinstance(cfg, TransformerConfig):
        return "transformer"
    if isinstance(cfg, ModelConfig):
        return "mlp"
    raise TypeError(
        f"model_of: {type(cfg).__name__} is neither a ModelConfig nor a TransformerConfig."
    )


def resolve_preset(
    preset: str | ModelConfig | TransformerConfig,
    devices: Sequence[Any],
    model: str | None = None,
) -> tuple[str, ModelConfig | TransformerConfig]:
    """``(name, per-device config)`` for a preset name, ``"auto"`` or a config.

    ``model`` picks the family a preset name belongs to (``MODEL_PRESETS``; default
    ``"mlp"``); a config is its own family, and a ``model`` that contradicts it is refused.
    """
    if isinstance(preset, ModelConfig | TransformerConfig):
        own = model_of(preset)
        if model not in (None, own):
            raise ValueError(
                f"model={model!r}, but preset is a {type(preset).__name__}, the {own!r} "
                f"model's config; drop model= or pass model={own!r}."
            )
        return "custom", preset
    model = "mlp" if model is None else model
    if model not in MODEL_PRESETS:
        raise ValueError(f"model={model!r} is not one of {list(MODEL_PRESETS)}.")
    presets = MODEL_PRESETS[model]
    name = choose_preset(devices) if preset == "auto" else preset
    if name not in presets:
        raise ValueError(
            f"preset={preset!r} is not one of {['auto', *presets]} (or a "
            f"{type(next(iter(presets.values()))).__name__})."
        )
    return name, presets[name]


def describe(cfg: ModelConfig | TransformerConfig) -> str:
    """The model's shape in one line: ``TransformerLM: 2 layers, d_model 128, ...``."""
    if isinstance(cfg, TransformerConfig):
        vocab = f"vocabulary {cfg.vocab_size:,}"
        if cfg.padded_vocab != cfg.vocab_size:
            vocab += f" padded to {cfg.padded_vocab:,}"
        return (
            f"TransformerLM: {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads "
            f"x {cfg.head_dim}, d_ff {cfg.d_ff}, {vocab}"
        )
    return (
        f"MLPStack: {cfg.n_layers} blocks, d_model {cfg.d_model}, d_ff {cfg.d_ff}, "
        f"{cfg.n_classes} classes"
    )


def config_dict(cfg: ModelConfig | TransformerConfig) -> dict[str, Any]:
    """A config as JSON-ready values, with parameter count and compute/param dtypes
    (and, for the Transformer, the padded vocabulary and the matmul parameters)."""
    out = dataclasses.asdict(cfg)
    out["dtype"] = jnp.dtype(cfg.dtype).name
    out["param_dtype"] = jnp.dtype(cfg.model().param_dtype).name
    out["param_count"] = cfg.param_count()
    if isinstance(cfg, TransformerConfig):
        out["padded_vocab"] = cfg.padded_vocab
        out["matmul_params"] = cfg.matmul_params()
    return out


def config_from_dict(d: dict[str, Any], model: str = "mlp") -> ModelConfig | TransformerConfig:
    """The config back from ``config_dict`` (or a result's ``config``; ``model``: its ``model``)."""
    if model not in MODEL_PRESETS:
        raise ValueError(f"config_from_dict: model={model!r} is not one of {list(MODEL_PRESETS)}.")
    cls = TransformerConfig if model == "transformer" else ModelConfig
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in d.items() if k in names}
    for key in ("dtype", "param_dtype"):
        if key in names:
            kwargs[key] = jnp.dtype(kwargs.get(key, "float32"))
    return cls(**kwargs)


# ---------------------------------------------------------------------------
# The workload: a model choice, sized for a mesh
# ---------------------------------------------------------------------------

# Each model's logical axis names (helpers.placing.models) and the config width each one is. No
# preset splits the Transformer's "kv" (head_dim) or "layers"; tp_sp splits the
# activations' "length", which need not divide (XLA pads an uneven activation split).
_LOGICAL_WIDTHS: dict[str, dict[str, str]] = {
    "mlp": {"embed": "d_model", "embed_vec": "d_model", "mlp": "d_ff", "classes": "n_classes"},
    "transformer": {
        "embed": "d_model",
        "norm": "d_model",
        "mlp": "d_ff",
        "heads": "n_heads",
        "vocab": "padded_vocab",
    },
}


def _axis_size(entry: Any, sizes: dict[str, int]) -> int:
    axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
    return math.prod(sizes[a] for a in axes)


def _ceil_to(value: int, step: int) -> int:
    return -(-value // step) * step


def fit_to_mesh(
    cfg: ModelConfig | TransformerConfig,
    strategies: Sequence[str],
    mesh_shape: tuple[int, int],
    multiple: int = 1,
) -> tuple[ModelConfig | TransformerConfig, str]:
    """``cfg`` with every width that a strategy splits rounded up so that its mesh axis divides it.

    A width that ``strategies`` split over a mesh axis (``d_model`` over "data" for FSDP,
    ``d_ff`` over "model" for TP) becomes the next multiple of ``lcm(axis size, multiple)``.
    Returns the config and a sentence saying what changed ("" when nothing did), so that
    any device count from 1 to 8 runs: 6 devices do not divide 4096, but they divide 4224.

    A ``TransformerConfig``'s widths are ``d_model`` (logical ``embed`` and ``norm``),
    ``d_ff`` (``mlp``), ``n_heads`` (``heads``) and the padded vocabulary (``vocab``):

    * a head count is rounded up to a multiple of the axis size alone (not of ``multiple``);
    * where ``d_model = n_heads x head_dim`` (in every preset), the two move together:
      ``n_heads`` becomes the fewest heads that its own split and ``d_model``'s allow, and
      ``d_model`` is ``n_heads x head_dim`` again (``2048 = 16 x 128 -> 2304 = 18 x 128``
      on 3 devices);
    * the vocabulary is padded further, as Megatron-LM pads it for tensor parallelism:
      ``vocab_multiple`` becomes ``lcm(vocab_multiple, axis size, multiple)``.
    """
    sizes = dict(zip(AXES, mesh_shape, strict=True))
    widths = _LOGICAL_WIDTHS[model_of(cfg)]
    ways: dict[str, int] = {}  # width -> the number of pieces the strategies split it into
    users: dict[str, list[str]] = {}
    for strategy in strategies:
        for logical, entry in logical_rules(strategy):
            width = widths.get(logical)
            k = _axis_size(entry, sizes) if width else 1
            if k > 1 and width:
                ways[width] = math.lcm(ways.get(width, 1), k)
                if strategy not in users.setdefault(width, []):
                    users[width].append(strategy)
    short = {w: k for w, k in ways.items() if getattr(cfg, w) % k}  # the widths that must grow
    if not short:
        return cfg, ""

    def why(width: str, it: str = "it") -> str:
        value, k = getattr(cfg, width), ways[width]
        return f"{'/'.join(users[width])} split {it} {k} ways, and {value} % {k} = {value % k}"

    changes: dict[str, int] = {}
    notes: list[str] = []
    tied = isinstance(cfg, TransformerConfig) and cfg.d_model == cfg.n_heads * cfg.head_dim
    if tied and short.keys() & {"d_model", "n_heads"}:
        q, k_embed = cfg.head_dim, ways.get("d_model", 1)
        step = math.lcm(
            ways.get("n_heads", 1),
            k_embed // math.gcd(k_embed, q),
            multiple // math.gcd(multiple, q),
        )
        heads = _ceil_to(cfg.n_heads, step)
        changes.update(n_heads=heads, d_model=heads * q)
        reasons = "; ".join(why(w, w) for w in ("d_model", "n_heads") if w in short)
        notes.append(
            f"n_heads {cfg.n_heads} -> {heads} and d_model {cfg.d_model} -> {heads * q}, "
            f"keeping d_model = n_heads x head_dim ({reasons})"
        )
    for width, k in short.items():
        value = getattr(cfg, width)
        if width in changes:
            continue
        if width == "padded_vocab":
            assert isinstance(cfg, TransformerConfig)
            m = math.lcm(cfg.vocab_multiple, k, multiple)
            changes["vocab_multiple"] = m
            notes.append(
                f"padded_vocab {value} -> {padded_vocab_size(cfg.vocab_size, m)} ({why(width)}; "
                f"vocab_multiple {cfg.vocab_multiple} -> {m})"
            )
        else:
            changes[width] = _ceil_to(value, k if width == "n_heads" else math.lcm(k, multiple))
            notes.append(f"{width} {value} -> {changes[width]} ({why(width)})")
    return dataclasses.replace(cfg, **changes), "; ".join(notes)


@dataclass(frozen=True)
class Workload:
    """A model choice sized for one mesh: what the profile builds, feeds and counts.

    This is the one place that maps a model choice to its module, FLOPs and batch: a new
    model family adds a preset and the branches here. ``cfg`` is a ``ModelConfig`` (the
    MLP stack, fed float vectors by ``synthetic_batch``) or a ``TransformerConfig`` (the
    language model, fed token ids by ``synthetic_tokens``).
    """

    name: str  # preset name, or "custom"
    cfg: ModelConfig | TransformerConfig  # batch is GLOBAL: per device x the "data" axis
    batch_per_device: int
    remat: bool = False
    resized: str = ""  # what fit_to_mesh changed, as a sentence

    @property
    def model_name(self) -> str:
        """``"mlp"`` or ``"transformer"``: the ``--model`` this workload is."""
        return model_of(self.cfg)

    def model(self) -> nn.Module:
        """The Flax module; with ``remat``, its backward pass recomputes the forward,
        collectives included, instead of keeping activations: the whole ``MLPStack`` is
        wrapped in ``nn.remat``; the ``TransformerLM`` wraps each block (``remat=True``)."""
        c = self.cfg
        if isinstance(c, TransformerConfig):
            return dataclasses.replace(c, remat=self.remat).model()
        if not self.remat:
            return c.model()
        return nn.remat(MLPStack)(c.d_model, c.d_ff, c.n_layers, c.n_classes, dtype=c.dtype)

    @property
    def flops_per_step(self) -> float:
        """Model FLOPs of one step, the model's own ``train_flops_per_step()`` (attention
        included for the Transformer; no remat recompute counted): what MFU divides."""
        return self.cfg.train_flops_per_step()

    @property
    def tokens_per_step(self) -> int:
        return self.cfg.batch * self.cfg.seq

    def x_init(self, mesh: Any) -> jax.Array:
        """A dummy input that ``init`` traces the model with (one token, or one vector,
        per row of the "data" axis)."""
        if isinstance(self.cfg, TransformerConfig):
            return jnp.zeros((mesh.shape["data"], 1), jnp.int32)
        return jnp.zeros((mesh.shape["data"], 1, self.cfg.d_model), jnp.float32)

    def abstract_batch(self, mesh: Any) -> tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
        """Shapes, dtypes and shardings of ``batch``'s inputs and labels, for compiling."""
        data, c = NamedSharding(mesh, P("data")), self.cfg
        labels = jax.ShapeDtypeStruct((c.batch, c.seq), jnp.int32, sharding=data)
        if isinstance(c, TransformerConfig):
            return jax.ShapeDtypeStruct((c.batch, c.seq), jnp.int32, sharding=data), labels
        return jax.ShapeDtypeStruct((c.batch, c.seq, c.d_model), jnp.float32, sharding=data), labels

    def batch(self, key: jax.Array, mesh: Any) -> tuple[jax.Array, jax.Array]:
        """One generated batch, split over "data": vectors and their classes for the MLP,
        token ids and the next tokens for the Transformer."""
        data, c = NamedSharding(mesh, P("data")), self.cfg
        make = synthetic_tokens if isinstance(c, TransformerConfig) else synthetic_batch
        return jax.jit(lambda k: make(k, c), out_shardings=(data, data))(key)


def workload_for(
    preset: str | ModelConfig | TransformerConfig,
    strategies: Sequence[str],
    devices: Sequence[Any],
    mesh_shape: tuple[int, int] | None = None,
    batch_per_device: int | None = None,
    remat: bool = False,
    model: str | None = None,
) -> Workload:
    """The model ``compare_strategies`` trains for these arguments (see there).

    ``model`` is ``"mlp"`` (default) or ``"transformer"``; a config given as ``preset``
    is its own model. A preset is resized with ``fit_to_mesh`` to fit the mesh; a config
    is used exactly as given.
    """
    name, base = resolve_preset(preset, devices, model)
    shape = (len(devices), 1) if mesh_shape is None else tuple(mesh_shape)
    per_device = base.batch if batch_per_device is None else batch_per_device
    cfg, resized = base, ""
    if name in PRESET_MULTIPLE:
        cfg, resized = fit_to_mesh(base, strategies, shape, PRESET_MULTIPLE[name])
    cfg = dataclasses.replace(cfg, batch=per_device * shape[0])
    if isinstance(cfg, TransformerConfig):  # its remat is a field: keep the two in step
        remat = remat or cfg.remat
        cfg = dataclasses.replace(cfg, remat=remat)
    return Workload(name, cfg, per_device, remat, resized)


def degenerate(strategy: str, mesh_shape: tuple[int, int]) -> str | None:
    """Why ``strategy`` on a ("data", "model") mesh of ``mesh_shape`` would not be itself; or None.

    On one device every strategy is the same one-device program, which is what a one-GPU
    measurement wants: nothing is degenerate there. On more, a strategy is degenerate when
    an axis it splits over has size 1 (``tp`` on (N, 1) computes the whole step on every
    device; ``hybrid`` is plain DP), or when the devices along an axis it does not use
    repeat each other's work (``dp`` on (4, 2)).
    """
    n = math.prod(mesh_shape)
    if n == 1:
        return None
    sizes = dict(zip(AXES, mesh_shape, strict=True))
    used = STRATEGY_AXES[strategy]
    flat = [a for a in used if sizes[a] == 1]
    repeated = [a for a in AXES if a not in used and sizes[a] > 1]
    if not flat and not repeated:
        return None
    why = []
    if flat:
        why.append(
            f"it splits over {' and '.join(repr(a) for a in used)}, and {flat[0]!r} has size 1"
        )
    if repeated:
        why.append(
            f"the {sizes[repeated[0]]} devices along {repeated[0]!r} would repeat each other's work"
        )
    if len(used) == 1:
        fix = f"use mesh {(n, 1) if used == ('data',) else (1, n)}"
    elif min(mesh_shape_for(n, 2)) > 1:
        fix = f"use a mesh with both axes > 1, e.g. {mesh_shape_for(n, 2)}"
    else:
        fix = f"{n} devices (a prime count) make no mesh with both axes > 1"
    return (
        f"strategy {strategy!r} on mesh {tuple(mesh_shape)} (data, model): {'; '.join(why)}; {fix}."
    )
