"""Byte units (binary): GiB = 1024**3 bytes throughout hostler."""

from __future__ import annotations

__all__ = ["GIB", "KIB", "MIB", "gib"]

KIB = 1024
MIB = 1024**2
GIB = 1024**3


def gib(value: float) -> int:
    """Bytes of ``value`` GiB, rounded down."""
    return int(value * GIB)
