"""DP against FSDP (or any other strategy) from a shell: step time, memory, collectives, MFU.

The command line ``PYTHONPATH=. python -m helpers.profile --help``; the code lives in ``helpers/measuring/profile.py``. This module only
keeps the documented command short.
"""

from helpers.measuring.profile import main

if __name__ == "__main__":
    raise SystemExit(main())
