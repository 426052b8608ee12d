"""Helpers for the Flax sharding series: device meshes, shard layouts, and what sharding costs.

The notebooks import these names; each one is documented and tested in ``tests/``.
"""

from helpers.checkpoint import (
    SavedArray,
    checkpoint_files,
    failing_writes,
    format_checkpoint_files,
    format_saved_layout,
    paused_writes,
    saved_layout,
)
from helpers.devices import make_mesh, mesh_shape_for, use_simulated_devices
from helpers.draw import (
    device_color,
    draw_mesh,
    draw_param_shardings,
    draw_sharding,
    draw_strategy_guide,
)
from helpers.lesson import check, expect_error
from helpers.measure import (
    collective_stats,
    format_bytes,
    format_collectives,
    memory_per_device,
    planned_bytes_per_device,
    sharding_table,
    step_memory,
)
from helpers.sharding import (
    LOGICAL_RULES,
    STRATEGY_AXES,
    FSDPChoice,
    ShardBlock,
    check_spec,
    fsdp_plan,
    fsdp_specs,
    logical_rules,
    shard_layout,
    shard_tree,
)

__all__ = [
    "SavedArray",
    "checkpoint_files",
    "failing_writes",
    "format_checkpoint_files",
    "format_saved_layout",
    "paused_writes",
    "saved_layout",
    "LOGICAL_RULES",
    "STRATEGY_AXES",
    "FSDPChoice",
    "ShardBlock",
    "check",
    "check_spec",
    "collective_stats",
    "device_color",
    "draw_mesh",
    "draw_param_shardings",
    "draw_sharding",
    "draw_strategy_guide",
    "expect_error",
    "format_bytes",
    "format_collectives",
    "fsdp_plan",
    "fsdp_specs",
    "logical_rules",
    "make_mesh",
    "memory_per_device",
    "mesh_shape_for",
    "planned_bytes_per_device",
    "shard_layout",
    "shard_tree",
    "sharding_table",
    "step_memory",
    "use_simulated_devices",
]
