"""The memory reservation lifecycle: one engine key's claim on the capacity budget.

::

    new/denied/released ──request──▶ requested ──grant──▶ granted ──release──▶ released
                                         └──deny──▶ denied (shortfall, reason)

Each decision records its inputs (budget, what others had committed), so a post-mortem can
re-check it without the machine that made it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

from hostler.events.base import Event, event_type
from hostler.machines.base import LifecycleModel, LifecycleSpec, Step, TransitionEvent

__all__ = [
    "Reservation",
    "ReservationDenied",
    "ReservationGranted",
    "ReservationReleased",
    "ReservationRequested",
    "ReservationState",
]


class ReservationState(StrEnum):
    """Where a reservation is. ``new`` exists only before its first event."""

    NEW = "new"
    REQUESTED = "requested"
    GRANTED = "granted"
    DENIED = "denied"
    RELEASED = "released"


@event_type("reservation.requested")
@dataclass(frozen=True, slots=True)
class ReservationRequested(TransitionEvent):
    """An engine key asked for ``bytes`` of the budget."""

    bytes: int
    owner: str


@event_type("reservation.granted")
@dataclass(frozen=True, slots=True)
class ReservationGranted(TransitionEvent):
    """The bytes fit: ``committed_other`` + ``bytes`` <= ``budget``."""

    bytes: int
    budget: int
    committed_other: int


@event_type("reservation.denied")
@dataclass(frozen=True, slots=True)
class ReservationDenied(TransitionEvent):
    """The bytes did not fit; ``shortfall`` is how many bytes were missing, and why."""

    shortfall: int
    reason: str
    budget: int
    committed_other: int


@event_type("reservation.released")
@dataclass(frozen=True, slots=True)
class ReservationReleased(TransitionEvent):
    """The bytes went back to the budget."""

    cause: str


R = ReservationState
SPEC = LifecycleSpec(
    "reservation",
    ReservationState,
    ReservationState.NEW,
    [
        Step("request", (R.NEW, R.DENIED, R.RELEASED), R.REQUESTED, ReservationRequested),
        Step("grant", (R.REQUESTED,), R.GRANTED, ReservationGranted),
        Step("deny", (R.REQUESTED,), R.DENIED, ReservationDenied),
        Step("release", (R.GRANTED,), R.RELEASED, ReservationReleased),
    ],
)


class Reservation(LifecycleModel):
    """One engine key's memory reservation.

    Attributes:
        requested_bytes: The last amount asked for.
        granted_bytes: What the budget holds for it now (0 unless granted).
        owner: The daemon (or process) that asked.
        shortfall: Missing bytes of the last denial.
        denial_reason: Why the last request was denied.
    """

    SPEC = SPEC
    STREAM_PREFIX = "reservation/"

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.requested_bytes = 0
        self.granted_bytes = 0
        self.owner: str | None = None
        self.shortfall: int | None = None
        self.denial_reason: str | None = None
        self.end_cause: str | None = None

    def _on_requested(self, e: ReservationRequested) -> None:
        self.requested_bytes, self.owner = e.bytes, e.owner
        self.shortfall = self.denial_reason = self.end_cause = None

    def _on_granted(self, e: ReservationGranted) -> None:
        self.granted_bytes = e.bytes

    def _on_denied(self, e: ReservationDenied) -> None:
        self.shortfall, self.denial_reason = e.shortfall, e.reason

    def _on_released(self, e: ReservationReleased) -> None:
        self.granted_bytes = 0
        self.end_cause = e.cause

    _FOLDS: ClassVar[Mapping[type[Event], Callable[[Any, Any], None]]] = {
        ReservationRequested: _on_requested,
        ReservationGranted: _on_granted,
        ReservationDenied: _on_denied,
        ReservationReleased: _on_released,
    }
