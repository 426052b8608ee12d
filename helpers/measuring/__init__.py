"""Measuring what sharding costs, and predicting it.

``measure`` (bytes per device, step memory, collectives read off the compiled program),
``trace`` (what a profiler trace shows), ``cost_model`` (a step's time from formulas),
``workload`` and ``results`` (what the profile trains, what it records), ``profile`` (the
strategies side by side; its command line is ``python -m helpers.profile``).
"""
