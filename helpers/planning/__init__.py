"""Planning a real model before renting the GPUs (notebooks 13a and 13b).

``models`` (the shapes of every ``config.json`` family), ``hardware`` (the accelerators and
their networks), ``activations`` (Korthikanti et al.'s count), ``layout`` (degrees, settings,
refusals), ``estimate`` (memory, traffic per axis, step time, optimistic MFU), ``calibration``
(the expected MFU, fitted on ``runs``: published, measured training runs, standard library
only), ``search`` (every layout of a GPU count) and ``plan`` (``plan_model`` and ``python -m
helpers.plan``); ``calculator`` draws a plan and puts it behind widgets. Everything but the
calculator runs on the standard library alone.
"""
