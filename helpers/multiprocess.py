"""The training script every process of a multi-process JAX job runs (notebook 05).

``python -m helpers.multiprocess`` (``--help`` lists every flag). The code lives in
``helpers/cluster/multiprocess.py``; this module only keeps the documented command short.
"""

from helpers.cluster.multiprocess import main

if __name__ == "__main__":
    raise SystemExit(main())
