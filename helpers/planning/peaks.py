"""Peak memory per device: the points the planner's memory margin is calibrated on
(``PEAK_POINTS``), each reported by a run's authors, or computed by a compiler.

Pure data, standard library only (as ``helpers.planning.runs``), so that the planner can read
it in a bare Python or in Pyodide. ``helpers.planning.margins`` plans each point's layout
and derives a margin per runtime, ZeRO stage and recompute schedule from the ratios
``(peak - parameters - optimizer state - gathered weights) / (gradients + activations)``.

Two kinds of witness (neither a TPU allocator's measured peak):

- **GPU** (``runtime="gpu"``): torchtitan's published Llama 3.1 benchmarks on H100s
  (pytorch/torchtitan ``docs/performance.md`` at commit d4c86e375, the same tables in
  ``benchmarks/llama3_h100_202412_torchtitan.md`` at b5bcd76), run with torchtitan at
  9dec370ad26b5f8e9a7333a0e36165018262644b. Their "Memory(GiB)" is what that commit's
  ``train.py`` logs, ``torch.cuda.memory_stats()["reserved_bytes.all.peak"]`` (the caching
  allocator's peak reservation; ``torchtitan/metrics.py``), "stable across the whole training
  process", the maximum over GPUs. The GPUs are Grand Teton's H100s "equipped with 96GB
  HBM2e": the published peaks (up to 84.5 GiB, 90.7e9 bytes) exceed what an H100 80GB
  reports (85.52e9 bytes), so these runs are calibration points here, not runs the planner
  could place on ``h100``. The GPU's capacity does not enter the ratio; a point's need is
  set against the bytes it ran on (``ran_on_hbm``: 96e9, the docs' "96GB" read as 10^9 bytes,
  as what such a GPU reports is not published there).
- **TPU** (``runtime="tpu"``): what the TPU compiler (libtpu) laid out for one ZeRO-3 step of
  the series' Transformer at LLaMA-3-8B's shapes (``helpers/measuring/tpu_programs.json``,
  recorded by ``.ci/record_tpu_programs.py``; notebook 13a prints them): ``memory_analysis()``'s
  arguments plus temporaries per chip, compiled for 8, 64 and 256 TPU v5p chips; and the same
  memory analysis of one DP step of notebook 08's Transformer that ran on a TPU v5e chip
  (``_CHIP_V5E`` below).

The torchtitan runs' settings, read at 9dec370 (``train_configs/llama3_8b.toml``,
``llama3_70b.toml``, ``torchtitan/parallelisms/parallelize_llama.py``, ``train.py``,
``torchtitan/models/llama/model.py``): FSDP2 shards parameters, gradients and Adam over the
data-parallel (and context-parallel) ranks and re-shards each block after its forward pass
(ZeRO-3), bf16 parameters in the step and f32 reduce-scatters (``MixedPrecisionPolicy``);
the logits stay bf16 and the loss casts them to f32 before ``F.cross_entropy`` (loss
"upcast"); attention is PyTorch's fused SDPA; "selective" activation checkpointing is the
per-op policy (``selective_ac_option = 'op'`` in ``llama3_8b.toml``). Rows run with
``torch.compile`` and Float8 linears are marked so in ``name``: compiled kernels keep other
temporaries (Table 1: 77.0 GiB compiled against 82.4 eager).

``REPORTED_OUTCOMES`` holds configurations whose source reports only whether they fit:
torchtitan's April 2024 table for Llama 2 on 64 A100s (80GB), where local batch 2 with the
per-op policy ran out of memory for the 70B model and batch 1 did not. They carry no peak and
calibrate nothing; ``tests/test_plan_margins.py`` checks the planner's verdict against them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["REPORTED_OUTCOMES", "PEAK_POINTS", "PeakPoint"]

_GIB = 2**30


@dataclass(frozen=True)
class PeakPoint:
    """One configuration with its peak (in ``PEAK_POINTS``: reported by its authors, or
    computed by the TPU compiler) or, in ``REPORTED_OUTCOMES``, only whether it fit; see the
    module docstring.

    ``model`` is a Hugging Face ``config.json`` dict, or ``{"spec": {...}}``: the keyword
    arguments of a ``helpers.planning.models.ModelSpec``. ``peak_bytes`` is the published
    peak in bytes (``peak_published`` as the source prints it); ``outcome`` is "ran" or "oom"
    for a point that reports only that.
    """

    key: str
    name: str
    source: str
    runtime: str
    model: dict
    hardware: str
    dp: int = 1
    tp: int = 1
    cp: int = 1
    zero: int = 3
    micro_batch: int = 1
    seq: int = 8192
    remat: str = "none"
    precision: str = "mixed"
    flash_attention: bool = True
    loss: str = "fused"
    peak_bytes: float | None = None
    peak_published: str = ""
    outcome: str = "ran"
    assumptions: str = ""
    # The bytes of the device the run ran on, where they differ from ``hardware``'s
    # (torchtitan's H100s had 96 GB, not the 80 of ``HARDWARE["h100"]``), and their source;
    # ``helpers.planning.margins.point_hardware`` judges a point on them. The ratio does
    # not depend on them.
    ran_on_hbm: float | None = None
    ran_on: str = ""


def _llama31(hidden: int, layers: int, heads: int, ffn: int) -> dict:
    """Llama 3.1 (meta-llama/Llama-3.1-8B and -70B config.json): 8 KV heads, vocabulary
    128,256, untied output; torchtitan's ``ModelArgs`` at 9dec370 give the same widths
    (``ffn_dim_multiplier`` 1.3: 14,336 and 28,672)."""
    return {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": 8,
        "intermediate_size": ffn,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
    }


def _llama2(hidden: int, layers: int, heads: int, kv: int, ffn: int) -> dict:
    """Llama 2 13B and 70B (torchtitan's ``ModelArgs`` at 1ea476e9: 13,824 and 28,672 wide;
    the Llama 2 tokenizer's 32,000 tokens)."""
    return {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "intermediate_size": ffn,
        "vocab_size": 32000,
        "tie_word_embeddings": False,
    }


#: The series' Transformer at LLaMA-3-8B's shapes (``.ci/record_tpu_programs.py``'s
#: ``llama_config``; ``spec_of_series_model`` of it, which a test checks).
_SERIES_8B = {
    "spec": {
        "name": "LLaMA-3-8B shapes (the series' Transformer)", "hidden": 4096, "n_layers": 32,
        "n_heads": 32, "n_kv_heads": 32, "ffn": 14336, "vocab": 128256, "head_dim": 128,
        "mlp_matrices": 2, "norm_vectors": 2, "family": "series", "vocab_multiple": 1,
    }
}  # fmt: skip

_TITAN = (
    "pytorch/torchtitan docs/performance.md @ d4c86e375 (benchmarks/"
    "llama3_h100_202412_torchtitan.md @ b5bcd76), torchtitan @ 9dec370"
)
_TITAN_GPU = (
    "H100 96GB: Grand Teton's H100s 'equipped with 96GB HBM2e' (docs/performance.md @ "
    "d4c86e375), taken as 96e9 bytes; what such a GPU reports is not published there"
)
_TITAN_8B = (
    "llama3_8b.toml: seq_len 8192, selective_ac_option 'op'; the table: local batch 2; 8 "
    "KV heads, fused attention; bf16 mixed precision (f32 sharded parameters, gradients and "
    "Adam: 16 bytes per parameter over the FSDP ranks, as the planner's 'mixed')."
)
_TPU = "helpers/measuring/tpu_programs.json (.ci/record_tpu_programs.py), entry"
_TPU_NOTE = (
    "compile_zero_step(stage 3), f32 parameters and Adam (precision 'f32'), one 2,048-token "
    "sequence per chip, no remat, the series' unfused attention (flash_attention False), "
    "its f32 cross-entropy (loss 'plain' in f32). Peak = memory_analysis() arguments + "
    "temporaries per chip."
)


def _titan(key: str, name: str, table: str, peak_gib: float, **layout: object) -> PeakPoint:
    return PeakPoint(
        key=key, name=name, source=f"{_TITAN}, {table}", runtime="gpu", hardware="h100",
        peak_bytes=peak_gib * _GIB, peak_published=f"{peak_gib} GiB (max reserved)",
        loss="upcast", ran_on_hbm=96e9, ran_on=_TITAN_GPU, **layout,  # type: ignore[arg-type]
    )  # fmt: skip


def _tpu(chips: int, topology: str, argument: int, temp: int) -> PeakPoint:
    return PeakPoint(
        key=f"xla-tpu-llama3-8b-shapes-zero3-{chips}",
        name=f"LLaMA-3-8B shapes, ZeRO-3 on {chips} TPU v5p chips (XLA:TPU)",
        source=f"{_TPU} 'llama3-8b shapes, zero-3, {topology}'", runtime="tpu",
        model=_SERIES_8B, hardware="tpu-v5p", dp=chips, zero=3, seq=2048, precision="f32",
        flash_attention=False, loss="plain", peak_bytes=float(argument + temp),
        peak_published=f"argument {argument:,} + temp {temp:,} bytes", assumptions=_TPU_NOTE,
    )  # fmt: skip


#: Notebook 08's Transformer, preset ``gpu`` (``helpers.measuring.profile``'s
#: ``MODEL_PRESETS["transformer"]["gpu"]``: its vocabulary 50,257 padded to 50,304).
_SERIES_GPU = {
    "spec": {
        "name": "notebook 08's Transformer, preset gpu", "hidden": 2048, "n_layers": 8,
        "n_heads": 16, "n_kv_heads": 16, "ffn": 8192, "vocab": 50304, "head_dim": 128,
        "mlp_matrices": 2, "norm_vectors": 2, "family": "series", "vocab_multiple": 1,
    }
}  # fmt: skip

#: A step that ran on a real chip, not only compiled for one:
#: ``helpers/measuring/reference_tpu_v5e.json`` (``.ci/accelerator_reference.py``, step
#: ``profile-transformer``, one TPU v5e chip, 2026-12-06, jax 0.10.2; notebook 04's Going
#: deeper prints it). The "peak" is what the compiler laid out for it, ``memory_analysis()``'s
#: arguments + temporaries, 15,772,161,024 bytes, under the chip's 16,911,433,728; it is not
#: a measured allocator peak (the one recorded beside it, 7,339,773,440 bytes, is only 34 MB
#: above the arguments alone and far below arguments + temporaries, so it is not used). The
#: program holds 12 bytes per parameter in its arguments (f32 parameters and Adam), where
#: the planner's "mixed" counts 14 (bf16 parameters, f32 master and Adam): part of the ratio
#: below 1 is that difference.
_CHIP_V5E = PeakPoint(
    key="tpu-v5e-chip-series-gpu-dp",
    name="notebook 08's Transformer (gpu preset), DP on one TPU v5e chip (ran)",
    source="helpers/measuring/reference_tpu_v5e.json, profiles.transformer (the compiler's "
    "memory analysis of a step that ran on the chip)",
    runtime="tpu", model=_SERIES_GPU, hardware="tpu-v5e", dp=1, zero=0, micro_batch=8,
    seq=1024, precision="mixed", flash_attention=False, loss="plain",
    peak_bytes=float(7_305_282_048 + 8_466_877_440),
    peak_published="argument 7,305,282,048 + temp 8,466,877,440 bytes",
    assumptions="param_dtype f32, dtype bf16 (counted as 'mixed': 16 bytes per parameter); "
    "Adam; no remat; the series' unfused attention; batch 8 x 1,024 tokens.",
)  # fmt: skip

#: The calibration points (``source`` says which kind each is): **reported**, the GPU
#: points, peaks torchtitan's authors published for runs on H100s (measured by them, by the
#: caching allocator); **compiled**, the TPU v5p points, ``memory_analysis()`` of programs
#: the TPU compiler laid out for slices that no program ran on (computed, not measured); and
#: **run on a chip**, ``_CHIP_V5E``, the same memory analysis of a step that did run on one
#: TPU v5e chip (still the compiler's layout, not an allocator's measured peak).
PEAK_POINTS: tuple[PeakPoint, ...] = (
    _titan(
        "torchtitan-llama3.1-8b-8-fsdp-op",
        "Llama 3.1 8B, 8 H100, FSDP, per-op AC (torchtitan)",
        "Table 1 row 'FSDP'",
        82.4,
        model=_llama31(4096, 32, 32, 14336),
        dp=8,
        micro_batch=2,
        remat="op",
        assumptions=_TITAN_8B,
    ),
    _titan(
        "torchtitan-llama3.1-8b-128-fsdp-op",
        "Llama 3.1 8B, 128 H100, FSDP, per-op AC (torchtitan)",
        "Table 3 row 'FSDP'",
        67.0,
        model=_llama31(4096, 32, 32, 14336),
        dp=128,
        micro_batch=2,
        remat="op",
        assumptions=_TITAN_8B,
    ),
    _titan(
        "torchtitan-llama3.1-8b-8-fsdp-op-compile",
        "Llama 3.1 8B, 8 H100, FSDP, per-op AC, torch.compile (torchtitan)",
        "Table 1 row 'FSDP + torch.compile'",
        77.0,
        model=_llama31(4096, 32, 32, 14336),
        dp=8,
        micro_batch=2,
        remat="op",
        assumptions=_TITAN_8B,
    ),
    _titan(
        "torchtitan-llama3.1-8b-128-fsdp-op-compile",
        "Llama 3.1 8B, 128 H100, FSDP, per-op AC, torch.compile (torchtitan)",
        "Table 3 row 'FSDP + torch.compile'",
        62.0,
        model=_llama31(4096, 32, 32, 14336),
        dp=128,
        micro_batch=2,
        remat="op",
        assumptions=_TITAN_8B,
    ),
    *(
        _titan(
            f"torchtitan-llama3.1-8b-fsdp{8 // cp}-cp{cp}-full-compile-float8",
            f"Llama 3.1 8B, 8 H100, FSDP {8 // cp} x CP {cp}, {seq:,} tokens, full AC, "
            "torch.compile + Float8 (torchtitan)",
            f"Table 2 row 'FSDP {8 // cp}, CP {cp}'",
            gib,
            model=_llama31(4096, 32, 32, 14336),
            dp=8 // cp,
            cp=cp,
            seq=seq,
            micro_batch=1,
            remat="full",
            assumptions="Table 2: local batch 1, full activation checkpointing, torch.compile "
            "and Float8 linears; the rest as llama3_8b.toml. Context parallelism shards FSDP "
            "over dp x cp (the planner's data-parallel group).",
        )
        for cp, seq, gib in (
            (1, 32768, 83.9),
            (2, 65536, 84.2),
            (4, 131072, 84.0),
            (8, 262144, 84.5),
        )
    ),  # fmt: skip
    _titan(
        "torchtitan-llama3.1-70b-256-fsdp32-tp8-full-compile-float8",
        "Llama 3.1 70B, 256 H100, FSDP 32 x TP 8, full AC, torch.compile + Float8 (torchtitan)",
        "Table 4 row '2D'",
        71.9,
        model=_llama31(8192, 80, 64, 28672),
        dp=32,
        tp=8,
        micro_batch=16,
        remat="full",
        assumptions="Table 4: local batch 16, full activation checkpointing, torch.compile and "
        "Float8 linears; llama3_70b.toml: seq_len 8192, TP 8 with sequence parallelism and "
        "loss parallelism (the logits stay split over tp).",
    ),
    _tpu(8, "v5p:2x2x2", 10440786432, 66710025376),
    _tpu(64, "v5p:4x4x4", 1310704128, 66837898880),
    _tpu(256, "v5p:4x8x8", 332481024, 66766562368),
    _CHIP_V5E,
)

_TITAN_A100 = (
    "pytorch/torchtitan docs/performance.md @ 1ea476e9f (April 2024), 'Llama 2' table on 64 "
    "A100 (80GB), FSDP"
)
_A100_NOTE = (
    "train_configs/llama2_70b.toml and llama2_13b.toml @ 1ea476e9f: seq_len 4096; the model "
    "casts its logits to f32 (loss 'upcast'; train.py keeps them until the backward pass, 4 "
    "bytes per token and vocabulary entry more than counted); per-op policy as at 9dec370 "
    "(parallelize_llama.py's no_recompute_list)."
)

REPORTED_OUTCOMES: tuple[PeakPoint, ...] = (
    PeakPoint(
        key="torchtitan-llama2-70b-64-a100-op-batch2-oom",
        name="Llama 2 70B, 64 A100, FSDP, local batch 2, per-op AC: OOM (torchtitan)",
        source=f"{_TITAN_A100}: row '70B | 2 | selective op | OOM | OOM'",
        runtime="gpu",
        model=_llama2(8192, 80, 64, 8, 28672),
        hardware="a100-80gb",
        dp=64,
        micro_batch=2,
        seq=4096,
        remat="op",
        loss="upcast",
        outcome="oom",
        assumptions=_A100_NOTE,
    ),
    PeakPoint(
        key="torchtitan-llama2-70b-64-a100-op-batch1",
        name="Llama 2 70B, 64 A100, FSDP, local batch 1, per-op AC: ran (torchtitan)",
        source=f"{_TITAN_A100}: row '70B | 1 | selective op | 355 | 50.8%'",
        runtime="gpu",
        model=_llama2(8192, 80, 64, 8, 28672),
        hardware="a100-80gb",
        dp=64,
        micro_batch=1,
        seq=4096,
        remat="op",
        loss="upcast",
        assumptions=_A100_NOTE,
    ),
    PeakPoint(
        key="torchtitan-llama2-70b-64-a100-full-batch2",
        name="Llama 2 70B, 64 A100, FSDP, local batch 2, full AC: ran (torchtitan)",
        source=f"{_TITAN_A100}: row '70B | 2 | full | 353 | 50.5%'",
        runtime="gpu",
        model=_llama2(8192, 80, 64, 8, 28672),
        hardware="a100-80gb",
        dp=64,
        micro_batch=2,
        seq=4096,
        remat="full",
        loss="upcast",
        assumptions=_A100_NOTE,
    ),
    PeakPoint(
        key="torchtitan-llama2-13b-64-a100-op-batch2",
        name="Llama 2 13B, 64 A100, FSDP, local batch 2, per-op AC: ran (torchtitan)",
        source=f"{_TITAN_A100}: row '13B | 2 | selective op | 1904 | 53.8%'",
        runtime="gpu",
        model=_llama2(5120, 40, 40, 40, 13824),
        hardware="a100-80gb",
        dp=64,
        micro_batch=2,
        seq=4096,
        remat="op",
        loss="upcast",
        assumptions=_A100_NOTE,
    ),
    PeakPoint(
        key="torchtitan-llama2-13b-64-a100-none-batch2",
        name="Llama 2 13B, 64 A100, FSDP, local batch 2, no AC: ran (torchtitan)",
        source=f"{_TITAN_A100}: row '13B | 2 | no | 2162 | 61.1%'",
        runtime="gpu",
        model=_llama2(5120, 40, 40, 40, 13824),
        hardware="a100-80gb",
        dp=64,
        micro_batch=2,
        seq=4096,
        remat="none",
        loss="upcast",
        assumptions=_A100_NOTE,
    ),
)
