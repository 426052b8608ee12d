"""Plan a real model from a shell: memory per device, traffic per axis, step time (notebook 13b).

``python -m helpers.plan`` (``--help`` lists every flag). The code lives in
``helpers/planning/plan.py``; this module only keeps the documented command short.
"""

from helpers.planning.plan import main

if __name__ == "__main__":
    raise SystemExit(main())
