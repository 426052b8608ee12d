"""Unit tests run on 8 simulated CPU devices, whatever NUM_DEVICES says for the notebooks.

Property-based tests (``tests/test_props_*.py``) use hypothesis's ``series`` profile: no
deadline (a first JAX compile can take a second), a fixed derandomized search so CI runs
are reproducible, and no example database on disk. ``HYPOTHESIS_PROFILE=explore`` searches
afresh with random seeds and 10x the examples, to hunt for new failures by hand.
"""

import os

from hypothesis import HealthCheck, settings

from helpers import use_simulated_devices

use_simulated_devices(8, quiet=True)

_COMMON = {
    "deadline": None,
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}
settings.register_profile("series", derandomize=True, print_blob=True, **_COMMON)
settings.register_profile("explore", max_examples=1000, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "series"))
