"""Pinned engines kept up, sans I/O: when to try a pin that is down again, and when to say so.

PP17 keeps every pinned engine resident. A pin that cannot start (its model is missing, the
budget is too small) is tried again later and later, doubling from a second up to a minute, so
that it does not fill the log with the same refusal every second, and its trouble is said once
per distinct message. :class:`PinKeeper` holds that state for the pool's pin loop, which only
asks it and carries out the starts.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PIN_BACKOFF_MAX", "PIN_BACKOFF_MIN", "PinFailure", "PinKeeper", "pin_blocked"]

#: The first and the longest wait before a failed pin is tried again (seconds).
PIN_BACKOFF_MIN = 1.0
PIN_BACKOFF_MAX = 60.0


@dataclass(frozen=True, slots=True)
class PinFailure:
    """What a failed pin leads to: the wait before its next try, and whether to say why."""

    backoff: float
    say: bool


def pin_blocked(
    *,
    up: bool,
    stopping: bool,
    starting: bool,
    draining: bool,
    locked_until: float | None,
    now: float,
) -> bool:
    """Whether a pin needs no start now: it is up or on its way, or locked out (SP1) until later.

    ``locked_until`` is the restart budget's ``retry_at`` of a failed engine (None: not locked).
    """
    if up or stopping or starting or draining:
        return True
    return locked_until is not None and now < locked_until


class PinKeeper:
    """The pins' retry schedule (monotonic time) and the trouble each last said (pure).

    Args:
        interval: How often the pool looks at its pins: no backoff is shorter.
    """

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._next: dict[str, tuple[float, float]] = {}  # key: (next try, backoff)
        self._said: dict[str, str] = {}

    def due(self, key: str, now: float) -> bool:
        """Whether ``key`` may be tried now."""
        return now >= self._next.get(key, (0.0, 0.0))[0]

    def failed(self, key: str, message: str, now: float) -> PinFailure:
        """A try of ``key`` failed with ``message`` at ``now``: its next wait, doubled."""
        backoff = self._next.get(key, (0.0, 0.0))[1]
        backoff = min(max(backoff * 2, PIN_BACKOFF_MIN, self.interval), PIN_BACKOFF_MAX)
        self._next[key] = (now + backoff, backoff)
        say = self._said.get(key) != message
        self._said[key] = message
        return PinFailure(backoff, say)

    def succeeded(self, key: str) -> None:
        """``key`` is up: its next failure starts the backoff again, and is said."""
        self._next.pop(key, None)
        self._said.pop(key, None)
