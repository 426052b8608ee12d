"""DP against FSDP (or any other strategy) from a shell: step time, memory, collectives, MFU.

``python -m helpers.profile`` (``--help`` lists every flag). The code lives in
``helpers/measuring/profile.py``; this module only keeps the documented command short.
"""

from helpers.measuring.profile import main

if __name__ == "__main__":
    raise SystemExit(main())
