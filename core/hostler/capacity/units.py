"""Byte units (binary) and the one rounding rule: GiB = 1024**3 bytes throughout hostler.

Where a rule rounds (a percentage, a byte figure, a GiB with one decimal) it means *half up*,
as the reference system's ``Math.round`` does: 62.5 % reads 63 %, 2.5 rounds to 3 and -2.5 to
-2 (ties go towards positive infinity). Python's :func:`round` rounds ties to even and binary
float formatting rounds the stored value, so neither is used for a rule's figures.
"""

from __future__ import annotations

__all__ = ["GIB", "KIB", "MIB", "format_half_up", "gib", "round_half_up"]

KIB = 1024
MIB = 1024**2
GIB = 1024**3


def gib(value: float) -> int:
    """Bytes of ``value`` GiB, rounded down."""
    return int(value * GIB)


def _ratio(value: int | float, per: int | float) -> tuple[int, int]:
    """``value / per`` as an exact integer fraction with a positive denominator."""
    num, den = value.as_integer_ratio()
    per_num, per_den = per.as_integer_ratio()
    if per_num == 0:
        raise ZeroDivisionError("round_half_up: division by zero")
    num, den = num * per_den, den * per_num
    return (-num, -den) if den < 0 else (num, den)


def round_half_up(value: int | float, per: int | float = 1) -> int:
    """``value / per`` rounded to the nearest integer, ties towards +infinity (exact).

    The quotient is computed on the exact binary values (no float division), so
    ``round_half_up(5, 8 / 100)`` style calls cannot be thrown off by a representation error:
    pass integers where you have them (``round_half_up(100 * part, whole)`` for a percentage).
    Non-finite floats raise ``ValueError``/``OverflowError`` like :func:`round` does.
    """
    num, den = _ratio(value, per)
    return (2 * num + den) // (2 * den)


def format_half_up(value: int | float, places: int, per: int | float = 1) -> str:
    """``value / per`` as fixed-point text with ``places`` decimals, ties rounded half up.

    ``format_half_up(5 * GIB, 1, per=4 * GIB)`` is ``"1.3"`` where ``f"{1.25:.1f}"`` gives
    ``"1.2"``. A result that rounds to zero has no minus sign.
    """
    if places < 0:
        raise ValueError(f"format_half_up: places must be at least 0, not {places}")
    num, den = _ratio(value, per)
    scaled = round_half_up(num * 10**places, den)
    sign = "-" if scaled < 0 else ""
    whole, fraction = divmod(abs(scaled), 10**places)
    return f"{sign}{whole}.{fraction:0{places}d}" if places else f"{sign}{whole}"
