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
    if match:
        amount, unit = float(match.group(1)), match.group(2)
        return now - timedelta(**{_UNITS[unit]: amount})
    try:
        moment = datetime.fromisoformat(cleaned)
    except ValueError:
        raise UsageError(
            f"time {text!r}: use ISO-8601 (2026-11-29T14:02:00, UTC unless an offset is "
            "given) or a relative span like 15m, 2h, 1d"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)
