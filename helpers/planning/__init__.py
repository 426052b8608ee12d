"""Planning a real model before renting the GPUs (notebook 13).

``plan`` (memory per device, traffic per axis and step time; ``python -m helpers.plan``),
``calculator`` (the plan as a figure and as an interactive calculator), and ``runs`` (published,
measured training runs the planner is checked against; standard library only).
"""
