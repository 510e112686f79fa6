"""What ``hostler ps`` shows beyond the pool's snapshot: why, and reserved against measured.

Why each engine is in its state, and what its reservation held at admission against what the
engine measured once ready.

Both are read from the logs (the engine's own stream, the ledger's stream), never guessed:
:func:`last_reason` turns an engine's latest lifecycle decision into one short phrase, and
:class:`LedgerFold` projects the host ledger's folded state onto one owner's keys: reserved
and measured bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hostler.capacity.ledger import LedgerState
from hostler.drivers.host_ledger import catch_up
from hostler.events.base import Event
from hostler.store.log import EventStore

__all__ = ["REASON_TYPES", "EngineBytes", "LedgerFold", "last_reason", "reason_of"]

#: The engine events that say why an engine is in its state (the latest one wins).
REASON_TYPES = (
    "engine.start_requested",
    "engine.stop_requested",
    "engine.crashed",
    "engine.failed",
    "engine.lost",
    "engine.adopted",
    "engine.reset",
)

#: The longest reason phrase (an engine's error text is cut there).
REASON_MAX = 120


def _stopped(payload: Mapping[str, Any]) -> str:
    reason = str(payload.get("reason", "?"))
    decision = payload.get("decision")
    wanted = decision.get("for") if isinstance(decision, Mapping) else None
    return f"{reason} for {wanted}" if reason == "evicted" and wanted else reason


def _crashed(payload: Mapping[str, Any]) -> str:
    if payload.get("signal") is not None:
        return f"crashed (signal {payload['signal']})"
    return f"crashed (exit {payload.get('exit_code')})"


_PHRASES: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "engine.start_requested": lambda p: f"started ({p.get('cause', '?')})",
    "engine.stop_requested": _stopped,
    "engine.crashed": _crashed,
    "engine.failed": lambda p: f"failed: {p.get('error', '?')}",
    "engine.lost": lambda p: f"lost: {p.get('cause', '?')}",
    "engine.adopted": lambda _p: "adopted after a daemon restart",
    "engine.reset": lambda p: f"reset ({p.get('cause', '?')})",
}


def reason_of(event_type: str, payload: Mapping[str, Any]) -> str | None:
    """One short phrase for an engine lifecycle event (None for a type that says no why).

    ``evicted for llamacpp:beta:0`` (the engine the room was made for), ``idle``,
    ``crashed (exit 1)``, ``failed: ...``, ``started (request)``... at most
    :data:`REASON_MAX` characters.
    """
    phrase = _PHRASES.get(event_type)
    return None if phrase is None else phrase(payload)[:REASON_MAX]


def last_reason(store: EventStore, key: str) -> str | None:
    """Why ``key``'s engine is where it is: its latest lifecycle decision (blocking read)."""
    for record in store.read_all(streams=[f"engine/{key}"], types=REASON_TYPES, last=1):
        return reason_of(record.type, record.payload)
    return None


@dataclass(frozen=True, slots=True)
class EngineBytes:
    """One reservation: the bytes it was admitted with, and the engine's measured footprint."""

    reserved: int
    measured: int | None


class LedgerFold:
    """Reserved and measured bytes per key of one ledger owner, read incrementally.

    A projection of the host ledger's own state (:class:`~hostler.capacity.ledger.LedgerState`,
    caught up as the ledger catches up): each :meth:`read` folds only the ledger events written
    since the last one, so a ``ps`` against a long-lived host stays cheap.
    """

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.state = LedgerState()

    def read(self, store: EventStore) -> dict[str, EngineBytes]:
        """Fold what is new in ``store``'s ledger stream; every key's bytes (blocking)."""
        catch_up(store, self.state)
        return self.rows

    def apply(self, event: Event) -> None:
        """Fold one ledger event (another owner's only change the shared ledger)."""
        self.state.apply(event)

    @property
    def rows(self) -> dict[str, EngineBytes]:
        """Each of the owner's keys: the bytes it was admitted with, and those measured."""
        return {
            held.key: EngineBytes(held.reserved, held.measured)
            for held in self.state.reservations.values()
            if held.owner == self.owner
        }
