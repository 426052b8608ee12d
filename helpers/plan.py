"""Plan a real model from a shell: memory per device, traffic per axis, step time (notebook 13).

The command line ``python -m helpers.plan --help``; the code lives in ``helpers/planning/plan.py``. This module only
keeps the documented command short.
"""

from helpers.planning.plan import main

if __name__ == "__main__":
    raise SystemExit(main())
