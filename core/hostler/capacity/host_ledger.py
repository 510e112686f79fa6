"""The host-wide capacity ledger (driver): one ledger log shared by every hostler on a host.

Several daemons (one per user, or per app embedding hostler), each with its own event log,
reserve memory through one ledger log. Every decision goes through a single stream with
optimistic concurrency: a daemon folds the stream up to its last version, decides with the pure
policy (:mod:`hostler.capacity.ledger`), and appends the decision *expecting* that version. If
another daemon decided in between, the append is refused and the decision is re-made on the
new state. The log's transactions are the lock, so the sum of granted reservations can never
exceed the budget, whoever asks.

A daemon that died without releasing does not strand its bytes: before deciding, reservations
whose owner process is gone (not alive, or another process reusing its pid, or from an earlier
boot) are released with ``cause="owner-gone"``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from hostler.capacity.budget import CapacityBudget
from hostler.capacity.events import (
    LEDGER_STREAM,
    LedgerBudgetSet,
    LedgerMeasured,
    LedgerReleased,
    LedgerSpilloverSet,
)
from hostler.capacity.ledger import (
    LedgerLimits,
    LedgerState,
    ReserveDecision,
    committed_snapshot,
    decide_reserve,
    limits_of,
)
from hostler.errors import ConcurrencyError, StoreError
from hostler.events.base import Event, UnknownEvent
from hostler.probes.host import boot_id
from hostler.store.log import EventStore, RecordedEvent

__all__ = [
    "DEFAULT_LEDGER_PATH",
    "HostLedger",
    "OwnerIdentity",
    "catch_up",
    "default_ledger_path",
    "fold_records",
]

# /var/tmp: one place every user of the host can reach, kept across reboots.
DEFAULT_LEDGER_PATH = Path("/var/tmp/hostler/ledger.db")  # noqa: S108
_MAX_ATTEMPTS = 200


def default_ledger_path() -> Path:
    """``$HOSTLER_LEDGER``, else ``/var/tmp/hostler/ledger.db`` (one per host)."""
    configured = os.environ.get("HOSTLER_LEDGER")
    return Path(configured).expanduser() if configured else DEFAULT_LEDGER_PATH


@dataclass(frozen=True, slots=True)
class OwnerIdentity:
    """Who holds a reservation: a process, recognisable even after its pid is reused."""

    pid: int
    create_time: float
    boot: str
    label: str = "hostler"

    @classmethod
    def current(cls, label: str = "hostler") -> OwnerIdentity:
        """This process."""
        pid = os.getpid()
        return cls(pid, psutil.Process(pid).create_time(), boot_id(), label)

    def text(self) -> str:
        """The owner string stored in ledger events."""
        return f"{self.label}:{self.pid}:{self.create_time:.3f}:{self.boot}"

    @staticmethod
    def parse(text: str) -> OwnerIdentity | None:
        """The identity in an owner string, or None if it is not one."""
        try:
            rest, boot = text.rsplit(":", 1)
            rest, created = rest.rsplit(":", 1)
            label, pid = rest.rsplit(":", 1)
            return OwnerIdentity(int(pid), float(created), boot, label)
        except ValueError:
            return None


def owner_alive(text: str, *, this_boot: str) -> bool:
    """Whether the process an owner string names is still the same live process."""
    owner = OwnerIdentity.parse(text)
    if owner is None:
        return True  # not ours to judge: keep it (conservative)
    if owner.boot != this_boot:
        return False
    try:
        process = psutil.Process(owner.pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return abs(process.create_time() - owner.create_time) < 0.01
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


def fold_records(state: LedgerState, records: list[RecordedEvent]) -> LedgerState:
    """Fold ledger records newer than ``state.version`` into ``state``."""
    for record in records:
        if record.version <= state.version:
            continue
        if not isinstance(record.event, UnknownEvent):
            state.apply(record.event)
        state.version = record.version
    return state


def catch_up(store: EventStore, state: LedgerState | None = None) -> LedgerState:
    """A ledger state brought up to the store's last ledger event (a fresh one by default)."""
    state = state if state is not None else LedgerState()
    return fold_records(state, store.read_stream(LEDGER_STREAM, after_version=state.version))


class HostLedger:
    """A daemon's handle on the host-wide ledger.

    Args:
        store: The ledger's event log (shared by every daemon of the host).
        owner: This daemon's identity; recorded on each of its reservations.
        budget: Returns the host's automatic budget (from the latest device sample).
        alive: Decides whether an owner string is a live process (injected in tests).
    """

    def __init__(
        self,
        store: EventStore,
        owner: OwnerIdentity,
        budget: Callable[[], CapacityBudget],
        *,
        alive: Callable[[str], bool] | None = None,
    ) -> None:
        self.store = store
        self.owner = owner.text()
        self._budget = budget
        this_boot = owner.boot
        self._alive = alive or (lambda text: owner_alive(text, this_boot=this_boot))
        self.state = LedgerState()
        self.retries = 0

    # -- reading -----------------------------------------------------------------------------

    def refresh(self) -> LedgerState:
        """Fold the ledger events written since the last look."""
        return catch_up(self.store, self.state)

    def budget(self) -> CapacityBudget:
        """The host's automatic budget now (before any explicit budget in the ledger)."""
        return self._budget()

    def limits(self) -> LedgerLimits:
        """The limits in force now."""
        return limits_of(self.refresh(), self._budget())

    def snapshot(self) -> dict[str, Any]:
        """The budget, the limits and every reservation with its owner (CB10)."""
        state = self.refresh()
        owners = {h.owner for h in state.reservations.values()}
        return committed_snapshot(state, self._budget(), [o for o in owners if self._alive(o)])

    # -- deciding ----------------------------------------------------------------------------

    def reserve(self, key: str, wanted: int) -> ReserveDecision:
        """Reserve ``wanted`` bytes for ``key`` (replacing its prior reservation), or be denied.

        The decision is recorded (granted or denied, with its inputs) before it is returned.
        """
        decision: ReserveDecision = self._decide(
            lambda state: self._reserve_events(state, key, wanted)
        )
        return decision

    def release(self, key: str, *, cause: str = "released") -> bool:
        """Release ``key``'s reservation; False when it held none (a no-op, CB9)."""

        def events(state: LedgerState) -> tuple[list[Event], bool]:
            held = state.reservations.get(key)
            if held is None:
                return [], False
            return [LedgerReleased(key, held.bytes, held.owner, cause)], True

        released: bool = self._decide(events)
        return released

    def record_measured(self, key: str, measured: int) -> bool:
        """Hold ``measured`` bytes for ``key`` instead of its estimate (the truth beats it).

        Not an admission: the engine already runs. Returns False when ``key`` holds nothing.
        """

        def events(state: LedgerState) -> tuple[list[Event], bool]:
            held = state.reservations.get(key)
            if held is None:
                return [], False
            return [LedgerMeasured(key, measured, held.owner, held.bytes)], True

        recorded: bool = self._decide(events)
        return recorded

    def set_budget(self, budget: int | None) -> None:
        """Point the ledger at an explicit budget in bytes, or back to automatic (None).

        Existing reservations are never touched (CB2): the next reserve fails until room is
        freed.
        """
        self._decide(lambda _state: ([LedgerBudgetSet(budget)], None))

    def set_spillover(self, allowed: bool | None) -> None:
        """Allow or forbid RAM spillover, or go back to automatic (None); never evicts (CB3)."""
        self._decide(lambda _state: ([LedgerSpilloverSet(allowed)], None))

    def release_dead_owners(self) -> list[str]:
        """Release every reservation whose owner is gone; return their keys."""

        def events(state: LedgerState) -> tuple[list[Event], list[str]]:
            reaped = self._reap(state)
            return reaped, [e.key for e in reaped if isinstance(e, LedgerReleased)]

        keys: list[str] = self._decide(events)
        return keys

    def _reap(self, state: LedgerState) -> list[Event]:
        dead = {o for o in state.owners() if o != self.owner and not self._alive(o)}
        return [
            LedgerReleased(h.key, h.bytes, h.owner, "owner-gone")
            for h in sorted(state.reservations.values(), key=lambda h: h.key)
            if h.owner in dead
        ]

    def _reserve_events(
        self, state: LedgerState, key: str, wanted: int
    ) -> tuple[list[Event], ReserveDecision]:
        reaped = self._reap(state)
        trial = LedgerState(dict(state.reservations), state.explicit_budget, state.spillover)
        for event in reaped:
            trial.apply(event)
        decision = decide_reserve(trial, self._budget(), key, wanted, self.owner)
        return [*reaped, decision.event()], decision

    def _decide(self, make: Callable[[LedgerState], tuple[list[Event], Any]]) -> Any:
        decided: list[Event] = []

        def decide(fresh: list[RecordedEvent]) -> tuple[list[Event], Any]:
            # Runs holding the ledger's write lock: nobody can decide in between.
            fold_records(self.state, fresh)
            new_events, answer = make(self.state)
            decided[:] = new_events
            return new_events, answer

        for _attempt in range(_MAX_ATTEMPTS):
            try:
                answer, _, result = self.store.transact(
                    LEDGER_STREAM,
                    decide,
                    after_version=self.state.version,
                    metadata={"actor": self.owner},
                )
            except ConcurrencyError:
                # Only on databases without a whole-database write lock (PostgreSQL).
                self.retries += 1
                continue
            if result is not None:
                for event in decided:
                    self.state.apply(event)
                self.state.version = result.version
            return answer
        raise StoreError(
            f"{self.store.name}: the ledger changed under {_MAX_ATTEMPTS} attempts in a row; "
            "too many daemons are deciding at once"
        )
