"""Past one machine: jobs of several processes, and checkpoints they resume from.

``launcher`` (start a local multi-process job, stream its output, end it), ``multiprocess``
(the script every process runs: ``python -m helpers.multiprocess``), ``checkpoint`` (what an
orbax save writes, and storage faults), ``allreduce_probe`` (one process per GPU:
``python -m helpers.allreduce_probe``).
"""
