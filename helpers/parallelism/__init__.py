"""The strategies that split more than the batch and the parameters, written out by hand.

``collectives`` (which device holds which block, what each collective costs), ``schedules``
and ``pipeline`` (pipeline parallelism: tick tables, the GPipe function), ``context``
(context parallelism: the sequence split over devices), ``experts`` (expert parallelism: a
router, its dispatch, a mixture-of-experts layer). Of ``helpers`` they import only
``compat``.
"""
