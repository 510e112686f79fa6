"""Events of the host-wide capacity ledger (stream ``ledger/host``).

Defined here, beside the event base, so that ``import hostler`` registers them without
importing the capacity package (``hostler.capacity.events`` re-exports them).
"""

from __future__ import annotations

from dataclasses import dataclass

from hostler.events.base import Event, event_type

__all__ = [
    "LEDGER_STREAM",
    "LedgerBudgetSet",
    "LedgerDenied",
    "LedgerMeasured",
    "LedgerReleased",
    "LedgerReserved",
    "LedgerSpilloverSet",
]

#: The one stream every reservation decision of the host goes through, in order.
LEDGER_STREAM = "ledger/host"


@event_type("ledger.reserved")
@dataclass(frozen=True, slots=True)
class LedgerReserved(Event):
    """``bytes`` are held for ``key`` (replacing ``prior``); the inputs of the decision."""

    key: str
    bytes: int
    owner: str
    prior: int
    committed_other: int
    budget: int
    ceiling: int
    enforced: bool


@event_type("ledger.denied")
@dataclass(frozen=True, slots=True)
class LedgerDenied(Event):
    """A reserve that did not fit: ``shortfall`` bytes were missing; the prior stays."""

    key: str
    bytes: int
    owner: str
    shortfall: int
    reason: str
    committed_other: int
    budget: int
    ceiling: int


@event_type("ledger.released")
@dataclass(frozen=True, slots=True)
class LedgerReleased(Event):
    """``key``'s reservation went back; ``cause`` is ``released`` or ``owner-gone``."""

    key: str
    bytes: int
    owner: str
    cause: str


@event_type("ledger.budget_set")
@dataclass(frozen=True, slots=True)
class LedgerBudgetSet(Event):
    """An operator set the budget (bytes) or went back to the automatic one (None)."""

    budget: int | None


@event_type("ledger.spillover_set")
@dataclass(frozen=True, slots=True)
class LedgerSpilloverSet(Event):
    """An operator allowed or forbade RAM spillover, or went back to automatic (None)."""

    allowed: bool | None


@event_type("ledger.measured")
@dataclass(frozen=True, slots=True)
class LedgerMeasured(Event):
    """A ready engine's measured footprint replaces the estimate it was admitted with."""

    key: str
    bytes: int
    owner: str
    estimated: int
