"""A small all-reduce, one process per device, with and without XLA's NVSHMEM flag (notebook 07).

``python -m helpers.allreduce_probe`` (``--help`` lists every flag). The code lives in
``helpers/cluster/allreduce_probe.py``; this module only keeps the documented command short.
"""

from helpers.cluster.allreduce_probe import main

if __name__ == "__main__":
    raise SystemExit(main())
