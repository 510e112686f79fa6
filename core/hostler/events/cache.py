"""Events of the prompt-cache controller (stream ``cache/<engine key>``).

Defined here, beside the event base, so that a log's reader registers them without
importing the runtime (:mod:`hostler.runtime.cache` records them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hostler.events.base import Event, event_type, upcaster

__all__ = ["CacheBudgetSet", "CacheEvicted", "CacheRestored", "CacheSaved", "cache_stream"]


def cache_stream(key: str) -> str:
    """The stream of one engine's cache decisions."""
    return f"cache/{key}"


@event_type("cache.evicted")
@dataclass(frozen=True, slots=True)
class CacheEvicted(Event):
    """Sessions' prompt caches were dropped from an engine.

    Attributes:
        key: The engine key.
        ids: The sessions evicted, in eviction order.
        reason: ``watermark`` (the budget was reached, CC9), ``invalidate`` (one session was
            invalidated, CC5), ``clear`` (the engine's whole cache was cleared, CC6) or
            ``invalidated`` (CC14: a saved file is gone or was made by another model file or
            engine build, so it can never be restored).
        decision: The decision with every input it used (the eviction plan for ``watermark``).
    """

    key: str
    ids: list[str]
    reason: str
    decision: dict[str, Any]


@event_type("cache.budget_set")
@dataclass(frozen=True, slots=True)
class CacheBudgetSet(Event):
    """An engine's cache budget was set (CC3), or remembered until it registers (CC2).

    Attributes:
        key: The engine key.
        bytes: The new budget.
        previous: The budget it replaces (the default when none was set).
        applied: Whether the engine was registered, so that it took effect at once.
    """

    key: str
    bytes: int
    previous: int
    applied: bool


@event_type("cache.saved", schema_version=2)
@dataclass(frozen=True, slots=True)
class CacheSaved(Event):
    """A session's prompt cache was written to its file by its engine (CC13), or was not.

    Attributes:
        key: The engine key.
        session: The session.
        cause: Why: the stop it came before (``evicted``, ``idle``, ``user``, ``shutdown``,
            ``memory-pressure``, ``unconfigured``), or ``slot-recycled`` (another session took
            its slot).
        tokens: Tokens of KV written (0 when the engine did not say, or nothing was).
        bytes: The file's size as written.
        seconds: How long the save took.
        error: Why it was not saved ("" when it was): its next turn starts cold.
        used_at: When the session last used the engine (epoch seconds; 0.0: not told): the
            file's place in the least-recently-used order (CC14). v2.
    """

    key: str
    session: str
    cause: str
    tokens: int
    bytes: int
    seconds: float
    error: str = ""
    used_at: float = 0.0


@upcaster("cache.saved", from_version=1)
def _saved_v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    payload.setdefault("used_at", 0.0)
    return payload


@event_type("cache.restored")
@dataclass(frozen=True, slots=True)
class CacheRestored(Event):
    """A session coming back to an engine that did not hold it was restored from its file.

    Attributes:
        key: The engine key.
        session: The session.
        tokens: Tokens of KV restored (0 when it failed).
        seconds: How long the restore took.
        error: Why it failed ("" when it did not): the turn runs cold.
    """

    key: str
    session: str
    tokens: int
    seconds: float
    error: str = ""
