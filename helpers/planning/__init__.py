"""Planning a real model before renting the GPUs (notebook 13).

``plan`` (memory per device, traffic per axis and step time; ``python -m helpers.plan``), and
``calculator`` (the plan as a figure and as an interactive calculator).
"""
