"""Numbers on the command line, bounded at the edge (a typo never becomes an overflow)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

__all__ = ["MAX_COUNT", "count", "seconds"]

#: The largest count or seq the CLI takes: beyond it SQLite's integers and Python's floats
#: disagree, and no log holds that many events.
MAX_COUNT = 2**53


def count(low: int, high: int = MAX_COUNT) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high``, said plainly otherwise."""

    def parse(text: str) -> int:
        cleaned = text.strip()
        try:
            value = int(cleaned, 10) if cleaned.isascii() else None  # int() reads any digits
        except ValueError:
            value = None
        if value is None:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number")
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{text[:40]} is out of range: use a whole number from {low} to {high}"
            )
        return value

    return parse


def seconds(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds from ``low`` to ``high``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a number of seconds") from None
        if not math.isfinite(value) or not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{text[:40]} is out of range: use seconds from {low:g} to {high:g}"
            )
        return value

    return parse
