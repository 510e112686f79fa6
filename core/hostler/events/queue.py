"""Events of the request queue (one stream per engine's queue).

They let a post-mortem say why a request waited: when it arrived, which rule dispatched it and
with what inputs (:func:`hostler.policies.queue.pick_next`'s decision), when it was cancelled,
moved or released. Times (``at``) are readings of the queue's clock: monotonic by default,
the wall clock (epoch seconds) in a :class:`hostler.Runtime`, so they line up with the rest.
Defined here, beside the event base, so that a log's reader registers them without
importing the async driver (:mod:`hostler.runtime.queue`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hostler.events.base import Event, event_type

__all__ = [
    "QueueCancelled",
    "QueueDispatched",
    "QueueEnqueued",
    "QueueMoved",
    "QueueReleased",
    "QueueServed",
]


@event_type("queue.enqueued")
@dataclass(frozen=True, slots=True)
class QueueEnqueued(Event):
    """A request joined ``engine``'s queue (Q2)."""

    engine: str
    id: int
    lane: str
    ambient: bool
    session_id: str | None
    group: str | None
    label: str | None
    at: float


@event_type("queue.dispatched")
@dataclass(frozen=True, slots=True)
class QueueDispatched(Event):
    """A request got its slot after ``waited`` seconds; ``decision`` is Q4's, with its rule."""

    engine: str
    id: int
    lane: str
    waited: float
    at: float
    decision: dict[str, Any]


@event_type("queue.released")
@dataclass(frozen=True, slots=True)
class QueueReleased(Event):
    """A running request gave its slot back after ``ran_for`` seconds (Q3)."""

    engine: str
    id: int
    lane: str
    ran_for: float
    at: float


@event_type("queue.cancelled")
@dataclass(frozen=True, slots=True)
class QueueCancelled(Event):
    """A queued request left without running: ``why`` is cancelled, aborted or timeout."""

    engine: str
    id: int
    lane: str
    why: str
    waited: float
    at: float


@event_type("queue.moved")
@dataclass(frozen=True, slots=True)
class QueueMoved(Event):
    """A queued request swapped places with ``swapped_with`` in its lane (Q8)."""

    engine: str
    id: int
    direction: str
    swapped_with: int
    at: float


@event_type("queue.served")
@dataclass(frozen=True, slots=True)
class QueueServed(Event):
    """A dispatched request reached its engine: what its client waited, all of it.

    ``waited`` runs from ``queue.enqueued`` to now: its place in the queue, the start of its
    engine when it was not running (room made, the process spawned and ready) and the wait
    for one of its engine's slots (``queue.dispatched``'s ``waited`` is the first part only).
    """

    engine: str
    id: int
    lane: str
    waited: float
    at: float
