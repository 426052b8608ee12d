"""Every figure of the series, in the series' device colours.

``draw`` (meshes, shard layouts, bytes per device, and the colours every figure shares), and
one module per topic: ``draw_comm`` (collectives, pipeline schedules), ``draw_context``,
``draw_experts``, ``draw_profile``, ``draw_strategies``.
"""
