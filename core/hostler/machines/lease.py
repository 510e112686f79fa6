"""The GPU lease lifecycle: one holder's claim on a GPU slot (``llm``, ``image``, ``video``).

::

    new ──request──▶ waiting ──grant──▶ held ──release──▶ released
                        └──release──▶ released     └──break──▶ broken (stale)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

from hostler.events.base import Event, event_type
from hostler.machines.base import LifecycleModel, LifecycleSpec, Step, TransitionEvent

__all__ = [
    "Lease",
    "LeaseBroken",
    "LeaseGranted",
    "LeaseReleased",
    "LeaseRequested",
    "LeaseSlot",
    "LeaseState",
]


class LeaseState(StrEnum):
    """Where a lease is. ``new`` exists only before its first event."""

    NEW = "new"
    WAITING = "waiting"
    HELD = "held"
    RELEASED = "released"
    BROKEN = "broken"


class LeaseSlot(StrEnum):
    """The kinds of GPU work that lease separately."""

    LLM = "llm"
    IMAGE = "image"
    VIDEO = "video"


@event_type("lease.requested")
@dataclass(frozen=True, slots=True)
class LeaseRequested(TransitionEvent):
    """A holder asked for a slot (a :class:`LeaseSlot` value) and waits for it."""

    slot: str
    holder: str


@event_type("lease.granted")
@dataclass(frozen=True, slots=True)
class LeaseGranted(TransitionEvent):
    """The slot is the holder's until released or broken; ``expires_at`` bounds staleness."""

    expires_at: float


@event_type("lease.released")
@dataclass(frozen=True, slots=True)
class LeaseReleased(TransitionEvent):
    """The holder let go (or gave up waiting)."""

    cause: str


@event_type("lease.broken")
@dataclass(frozen=True, slots=True)
class LeaseBroken(TransitionEvent):
    """The lease was taken back from a holder that stopped renewing it."""

    reason: str
    stale_for: float


L = LeaseState
SPEC = LifecycleSpec(
    "lease",
    LeaseState,
    LeaseState.NEW,
    [
        Step("request", (L.NEW,), L.WAITING, LeaseRequested),
        Step("grant", (L.WAITING,), L.HELD, LeaseGranted),
        Step("release", (L.WAITING, L.HELD), L.RELEASED, LeaseReleased),
        Step("expire", (L.HELD,), L.BROKEN, LeaseBroken),
    ],
)


class Lease(LifecycleModel):
    """One GPU lease.

    Attributes:
        slot: The GPU slot asked for.
        holder: Who holds (or waits for) it.
        granted_at: When it was granted.
        expires_at: When it goes stale unless renewed.
        end_cause: Why it ended (release cause, or break reason).
    """

    SPEC = SPEC
    STREAM_PREFIX = "lease/"

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.slot: str | None = None
        self.holder: str | None = None
        self.granted_at: float | None = None
        self.expires_at: float | None = None
        self.end_cause: str | None = None

    def _on_requested(self, e: LeaseRequested) -> None:
        self.slot, self.holder = e.slot, e.holder

    def _on_granted(self, e: LeaseGranted) -> None:
        self.granted_at, self.expires_at = e.at, e.expires_at

    def _on_released(self, e: LeaseReleased) -> None:
        self.end_cause = e.cause

    def _on_broken(self, e: LeaseBroken) -> None:
        self.end_cause = e.reason

    _FOLDS: ClassVar[Mapping[type[Event], Callable[[Any, Any], None]]] = {
        LeaseRequested: _on_requested,
        LeaseGranted: _on_granted,
        LeaseReleased: _on_released,
        LeaseBroken: _on_broken,
    }
