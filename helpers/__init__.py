"""Helpers for the Flax sharding series: device meshes, shard layouts, and what sharding costs.

The notebooks import these names; each one is documented and tested in ``tests/``. The code
is grouped by concern, one subpackage each (its ``__init__.py`` says what is in it):

- ``placing``: devices and meshes, sharding rules, the series' models, the training step, ZeRO;
- ``parallelism``: collectives by hand, pipeline schedules, context and expert parallelism;
- ``measuring``: bytes, memory and collectives of a compiled step, traces, the cost model, and
  the profile that compares strategies;
- ``drawing``: every figure;
- ``cluster``: past one machine: multi-process jobs, their launcher, checkpoints;
- ``planning``: the planner of notebook 13.

``compat.py`` is the one place for differences between jax/flax versions, ``lesson.py`` the
exercise checks and deliberate errors, ``cli.py`` what every command line shares. ``profile.py``,
``plan.py``, ``multiprocess.py`` and ``allreduce_probe.py`` only keep the documented commands
(``python -m helpers.profile``, ...) short.
"""

from helpers.cluster.checkpoint import (
    SavedArray,
    checkpoint_files,
    failing_writes,
    format_checkpoint_files,
    format_saved_layout,
    paused_writes,
    saved_layout,
    wait_for_uncommitted,
)
from helpers.drawing.draw import (
    device_color,
    draw_mesh,
    draw_param_shardings,
    draw_sharding,
    draw_strategy_guide,
)
from helpers.drawing.draw_comm import draw_collective, draw_in_flight, draw_pipeline_schedule
from helpers.drawing.draw_context import draw_causal_work
from helpers.drawing.draw_experts import draw_routing
from helpers.drawing.draw_strategies import plot_memory_vs_traffic
from helpers.lesson import check, expect_error
from helpers.measuring.measure import (
    CollectiveOp,
    collective_ops,
    collective_stats,
    format_bytes,
    format_collectives,
    memory_per_device,
    planned_bytes_per_device,
    sharding_table,
    step_memory,
)
from helpers.measuring.trace import (
    Span,
    TraceSummary,
    exposed_spans,
    find_trace_file,
    format_trace_table,
    read_trace,
    step_ops,
    summarize_trace,
)
from helpers.parallelism.collectives import (
    HLO_NAME,
    Block,
    blocks_by_device,
    chunks_for,
    expected_blocks,
    gpipe_bubble,
    gpipe_schedule,
    hlo_op_sequence,
    read_blocks,
    ring_bytes,
    tag_blocks,
)
from helpers.parallelism.context import (
    attention_block,
    causal_block_work,
    chunk_positions,
    contiguous_chunks,
    online_softmax_combine,
    zigzag_chunks,
)
from helpers.parallelism.experts import (
    MoEMLP,
    MoESpec,
    Routing,
    dispatch_weights,
    expert_capacity,
    expert_parallel_mlp,
    route,
)
from helpers.parallelism.pipeline import gpipe_pipeline
from helpers.parallelism.schedules import (
    PipelineSchedule,
    bubble_fraction,
    dualpipe_table,
    executor_tables,
    gpipe_table,
    in_flight,
    interleaved_bubble,
    interleaved_table,
    one_f_one_b_order,
    one_f_one_b_table,
    simulate,
    stage_layout,
    zero_bubble_table,
)
from helpers.placing.devices import make_mesh, mesh_shape_for, use_simulated_devices
from helpers.placing.sharding import (
    LOGICAL_NAMES,
    LOGICAL_RULES,
    STRATEGY_AXES,
    FSDPChoice,
    ShardBlock,
    UnmappedLogicalNameWarning,
    check_spec,
    format_unmapped,
    fsdp_plan,
    fsdp_specs,
    logical_names,
    logical_rules,
    param_order,
    shard_layout,
    shard_tree,
    unmapped_logical_names,
)

__all__ = [
    "SavedArray",
    "checkpoint_files",
    "failing_writes",
    "format_checkpoint_files",
    "format_saved_layout",
    "paused_writes",
    "saved_layout",
    "wait_for_uncommitted",
    "HLO_NAME",
    "Block",
    "blocks_by_device",
    "bubble_fraction",
    "chunks_for",
    "draw_collective",
    "draw_in_flight",
    "draw_pipeline_schedule",
    "draw_causal_work",
    "draw_routing",
    "plot_memory_vs_traffic",
    "MoEMLP",
    "MoESpec",
    "Routing",
    "dispatch_weights",
    "expert_capacity",
    "expert_parallel_mlp",
    "route",
    "expected_blocks",
    "gpipe_bubble",
    "gpipe_schedule",
    "hlo_op_sequence",
    "read_blocks",
    "ring_bytes",
    "tag_blocks",
    "PipelineSchedule",
    "gpipe_pipeline",
    "dualpipe_table",
    "executor_tables",
    "gpipe_table",
    "in_flight",
    "interleaved_bubble",
    "interleaved_table",
    "one_f_one_b_order",
    "one_f_one_b_table",
    "simulate",
    "stage_layout",
    "zero_bubble_table",
    "attention_block",
    "causal_block_work",
    "chunk_positions",
    "contiguous_chunks",
    "online_softmax_combine",
    "zigzag_chunks",
    "CollectiveOp",
    "HARDWARE",
    "NAMED_MODELS",
    "ModelSpec",
    "Plan",
    "PlanError",
    "format_plan",
    "model_from_hf_config",
    "plan_model",
    "LOGICAL_NAMES",
    "LOGICAL_RULES",
    "STRATEGY_AXES",
    "FSDPChoice",
    "ShardBlock",
    "UnmappedLogicalNameWarning",
    "check",
    "check_spec",
    "collective_ops",
    "collective_stats",
    "device_color",
    "draw_mesh",
    "draw_param_shardings",
    "draw_sharding",
    "draw_strategy_guide",
    "expect_error",
    "format_bytes",
    "format_collectives",
    "format_unmapped",
    "fsdp_plan",
    "fsdp_specs",
    "logical_names",
    "logical_rules",
    "make_mesh",
    "memory_per_device",
    "mesh_shape_for",
    "param_order",
    "planned_bytes_per_device",
    "shard_layout",
    "shard_tree",
    "sharding_table",
    "step_memory",
    "unmapped_logical_names",
    "use_simulated_devices",
    "Span",
    "TraceSummary",
    "exposed_spans",
    "find_trace_file",
    "format_trace_table",
    "read_trace",
    "step_ops",
    "summarize_trace",
]

# helpers.planning.plan and helpers.placing.zero are imported on first use, not here: the
# planner needs no jax at all, and ``python -m helpers.plan`` (helpers/plan.py) imports it once.
_LAZY = {
    "HARDWARE": "helpers.planning.plan",
    "NAMED_MODELS": "helpers.planning.plan",
    "ModelSpec": "helpers.planning.plan",
    "Plan": "helpers.planning.plan",
    "PlanError": "helpers.planning.plan",
    "format_plan": "helpers.planning.plan",
    "model_from_hf_config": "helpers.planning.plan",
    "plan_model": "helpers.planning.plan",
    "ZERO_STAGES": "helpers.placing.zero",
    "init_zero": "helpers.placing.zero",
    "make_zero_train_step": "helpers.placing.zero",
    "zero_specs": "helpers.placing.zero",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'helpers' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
