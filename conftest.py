"""Settings shared by the unit tests and the notebook runs (nbmake).

``NUM_DEVICES`` (default 8) is the number of simulated CPU devices every notebook
kernel gets; it is checked here so that a wrong value fails with one clear line.
"""

from __future__ import annotations

import os

import pytest

SUPPORTED_COUNTS = (1, 2, 4, 8)


def pytest_configure(config: pytest.Config) -> None:
    raw = os.environ.setdefault("NUM_DEVICES", "8")
    try:
        n = int(raw)
    except ValueError:
        raise pytest.UsageError(f"NUM_DEVICES={raw!r} is not a whole number; use one of {SUPPORTED_COUNTS}.") from None
    if n not in SUPPORTED_COUNTS:
        raise pytest.UsageError(
            f"NUM_DEVICES={n}: the notebooks are written for {SUPPORTED_COUNTS} simulated devices "
            "(their batch sizes and widths divide by these); pick one of them."
        )
    # Figures render without a display; kernels started by nbmake inherit these.
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ.setdefault("PYTHONHASHSEED", "0")
