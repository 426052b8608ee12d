"""What every ``python -m helpers.X`` command line shares: one-line refusals, checked flags.

A flag's bad value (out of range, of the wrong kind, or one that leaves nothing to measure)
is refused while the command line is parsed, before any work starts: exit code 2 and one
line on stderr that names the flag and says what it accepts, e.g.::

    python -m helpers.profile: error: argument --steps: a whole number >= 1, got '0'

Never a usage page, never a traceback, never a result computed from an empty batch or
zero devices. This module imports no jax, so a refusal is quick.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from typing import NoReturn

__all__ = ["OneLineParser", "host_port", "refuse", "whole_number", "writable_path"]


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose every refusal is one line on stderr and exit code 2."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


def whole_number(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: a whole number in ``[lo, hi]`` (``hi=None``: no upper bound).

    ``"3"`` and ``"3.0"`` are 3; ``"2.5"``, ``"nan"``, ``"inf"``, ``""`` and words are refused.
    """
    if hi is not None and hi < lo:
        raise ValueError(f"whole_number: hi ({hi}) must be >= lo ({lo}).")
    accepts = f"a whole number >= {lo}" if hi is None else f"a whole number from {lo} to {hi}"

    def parse(text: str) -> int:
        try:
            value = float(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"{accepts}, got {text!r}") from None
        if not math.isfinite(value) or value != int(value):
            raise argparse.ArgumentTypeError(f"{accepts}, got {text!r}")
        n = int(value)
        if n < lo or (hi is not None and n > hi):
            raise argparse.ArgumentTypeError(f"{accepts}, got {text!r}")
        return n

    parse.__name__ = accepts
    return parse


def writable_path(text: str) -> str:
    """An argparse ``type``: a file path whose folder exists (``"-"``, stdout, passes)."""
    if text == "-":
        return text
    if not text.strip():
        raise argparse.ArgumentTypeError("a file path, got ''")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"a file path, got the folder {text!r}")
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"a file in an existing folder, got {text!r}")
    return text


def host_port(text: str) -> str:
    """An argparse ``type``: ``HOST:PORT`` with a port from 1 to 65535."""
    host, sep, port = text.rpartition(":")
    if not sep or not host.strip() or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"HOST:PORT with a port from 1 to 65535, got {text!r}")
    return text


def refuse(parser: argparse.ArgumentParser, flag: str, message: str) -> NoReturn:
    """A refusal that involves two flags, in the same one-line form (exit code 2)."""
    parser.error(f"argument {flag}: {message}")
