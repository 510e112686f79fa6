"""Times on the command line: ISO-8601 (UTC when no offset) or relative (``-15m``, ``2h``)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from hostler.errors import UsageError

__all__ = ["parse_moment"]

_RELATIVE = re.compile(r"^-?(\d+(?:\.\d+)?)\s*([smhd])(?:\s*ago)?$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_moment(text: str, *, now: datetime) -> datetime:
    """Parse ``text`` into an aware UTC datetime; relative forms count back from ``now``."""
    cleaned = text.strip()
    match = _RELATIVE.match(cleaned)
    try:
        if match:
            amount, unit = float(match.group(1)), match.group(2)
            return now - timedelta(**{_UNITS[unit]: amount})
        moment = datetime.fromisoformat(cleaned)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.astimezone(UTC)
    except (OverflowError, ValueError) as exc:
        if match or isinstance(exc, OverflowError) or "out of range" in str(exc):
            raise UsageError(
                f"time {text[:60]!r}: out of range (years 1 to 9999, in UTC)"
            ) from None
        raise UsageError(
            f"time {text[:60]!r}: use ISO-8601 (2026-11-29T14:02:00, UTC unless an offset is "
            "given) or a relative span like 15m, 2h, 1d"
        ) from None
