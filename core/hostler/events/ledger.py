"""Events of the host-wide capacity ledger (stream ``ledger/host``).

Defined here, beside the event base, so that a log's reader registers them without
importing the capacity package; the ledger's rules (:mod:`hostler.capacity.ledger`) fold them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hostler.events.base import Event, event_type, upcaster

__all__ = [
    "LEDGER_STREAM",
    "LedgerAdopted",
    "LedgerBound",
    "LedgerBudgetSet",
    "LedgerCarried",
    "LedgerDenied",
    "LedgerMeasured",
    "LedgerReleased",
    "LedgerReserved",
    "LedgerSpilloverSet",
]

#: The one stream every reservation decision of the host goes through, in order.
LEDGER_STREAM = "ledger/host"


@event_type("ledger.reserved", schema_version=2)
@dataclass(frozen=True, slots=True)
class LedgerReserved(Event):
    """``owner`` holds ``bytes`` for ``key`` (replacing its ``prior``); the decision's inputs.

    ``token`` is the launch token of the engine process the bytes are for (schema v2): while a
    process carrying it lives, the reservation outlives its owner (OW2 in docs/rules.md).
    """

    key: str
    bytes: int
    owner: str
    prior: int
    committed_other: int
    budget: int
    ceiling: int
    enforced: bool
    token: str | None = None


@upcaster("ledger.reserved", from_version=1)
def _reserved_v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    payload.setdefault("token", None)
    return payload


@event_type("ledger.bound", schema_version=2)
@dataclass(frozen=True, slots=True)
class LedgerBound(Event):
    """The engine process a reservation pays for exists: its pid and start time.

    ``since_boot`` (v2): its start in the kernel's ticks since boot, exact where the wall-clock
    ``create_time`` moves with a clock adjustment (None: not known, compare the wall clock).
    """

    key: str
    owner: str
    pid: int
    create_time: float
    since_boot: float | None = None


@upcaster("ledger.bound", from_version=1)
def _bound_v1(payload: dict[str, Any]) -> dict[str, Any]:
    """v1 had no ticks since boot: the wall-clock start is all there is."""
    return {**payload, "since_boot": None}


@event_type("ledger.adopted")
@dataclass(frozen=True, slots=True)
class LedgerAdopted(Event):
    """``owner`` took over a running engine's memory (never denied: it is already in use).

    ``from_owner`` held it before (None when nothing did); ``over_budget`` is how many bytes
    the ledger now holds beyond its budget because of it (0 when it fits).
    """

    key: str
    owner: str
    bytes: int
    from_owner: str | None
    token: str | None
    pid: int
    create_time: float
    committed_other: int
    budget: int
    over_budget: int


@event_type("ledger.carried")
@dataclass(frozen=True, slots=True)
class LedgerCarried(Event):
    """A reservation carried into a ledger file that replaced a deleted one (OW6).

    Whoever notices the replacement first writes down every reservation it knew of whose
    engine still runs (or whose start, not yet bound, has a live owner), under its owner.
    """

    key: str
    owner: str
    bytes: int
    token: str | None
    pid: int | None
    create_time: float | None
    carried_by: str


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
    """``owner``'s reservation for ``key`` went back, and why.

    ``cause``: ``released`` (its engine stopped), ``lost`` (its engine was found gone),
    ``owner-gone`` (owner and engine process both gone), ``engine-gone`` (the process it paid
    for is gone though its owner lives: a release that could not be written).
    """

    key: str
    bytes: int
    owner: str
    cause: str


@event_type("ledger.budget_set", schema_version=2)
@dataclass(frozen=True, slots=True)
class LedgerBudgetSet(Event):
    """An operator set the budget (bytes) or went back to the automatic one (None).

    ``source`` says where it was set (schema v2): ``config:<file>`` (a config's ``[budget]
    bytes``, applied at start), ``env:HOSTLER_BUDGET_BYTES`` (the variable in the config's
    place) or ``api`` (``hostler budget --set``, ``PUT /api/budget``); "" when the record does
    not say (v1). :mod:`hostler.capacity.origin` reads it.
    """

    budget: int | None
    source: str = ""


@upcaster("ledger.budget_set", from_version=1)
def _budget_set_v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    payload.setdefault("source", "")
    return payload


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
