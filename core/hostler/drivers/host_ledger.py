"""The host-wide capacity ledger (driver): one ledger log shared by cooperating hostlers.

Several daemons (one per data directory, or per app embedding hostler), each with its own
event log, reserve memory through one ledger log. Every decision goes through a single stream
with optimistic concurrency: a daemon folds the stream up to its last version, decides with
the pure policy (:mod:`hostler.capacity.ledger`), and appends the decision *expecting* that
version. The log's transactions are the lock, so the sum of granted reservations can never
exceed the budget, whoever asks.

Reservations are filed by (owner, engine key) (OW1) and pay for one engine process, named by
its launch token and, once spawned, its pid and start time. A reservation lives as long as
that process (OW2): when its owner dies, the bytes stay held while the engine still runs, and
are released (``cause="owner-gone"``) only once owner and engine are both gone. A daemon that
adopts a running engine takes its reservation over (OW3), never denied.

Where the ledger lives: by default one per user (``$XDG_STATE_HOME/hostler/ledger.db``), in a
directory only that user can write. A ledger shared by several users is an explicit setting
(``HOSTLER_LEDGER`` + ``HOSTLER_LEDGER_SHARED=1``) in a directory an administrator prepared
with group permissions; hostler refuses a ledger directory that someone else owns.
"""

from __future__ import annotations

import functools
import logging
import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from hostler.capacity.budget import CapacityBudget
from hostler.capacity.ledger import (
    Held,
    LedgerLimits,
    LedgerState,
    ReserveDecision,
    committed_snapshot,
    decide_adopt,
    decide_reserve,
    limits_of,
)
from hostler.engines.process import group_alive, token_holders
from hostler.errors import (
    ConcurrencyError,
    SettingError,
    StoreError,
    StorePathError,
)
from hostler.events.base import Event
from hostler.events.fold import fold, fold_step
from hostler.events.ledger import (
    LEDGER_STREAM,
    LedgerAdopted,
    LedgerBound,
    LedgerBudgetSet,
    LedgerCarried,
    LedgerMeasured,
    LedgerReleased,
    LedgerSpilloverSet,
)
from hostler.paths import env_path, home_dir, user_path
from hostler.probes.host import boot_id, same_start, started_since_boot
from hostler.store.log import EventStore, RecordedEvent

__all__ = [
    "HostLedger",
    "LedgerLocation",
    "OwnerIdentity",
    "catch_up",
    "default_ledger_location",
    "default_ledger_path",
    "engine_alive",
    "fold_records",
    "open_ledger_store",
    "owner_alive",
]

_MAX_ATTEMPTS = 200
log = logging.getLogger(__name__)


def _file_id(path: Path | None) -> tuple[int, int] | None:
    """Which file a path names now (device, inode); None when nothing is there."""
    if path is None:
        return None
    try:
        info = path.stat()
    except OSError:
        return None
    return (info.st_dev, info.st_ino)


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


@dataclass(frozen=True, slots=True)
class LedgerLocation:
    """Where the ledger is, and whether several users share it (group permissions)."""

    path: Path
    shared: bool = False


def default_ledger_path() -> Path:
    """``$HOSTLER_LEDGER``, else ``$XDG_STATE_HOME/hostler/ledger.db`` (one per user)."""
    return default_ledger_location().path


def default_ledger_location() -> LedgerLocation:
    """The ledger the environment names: per user unless ``HOSTLER_LEDGER_SHARED`` is set.

    Raises:
        SettingError: ``HOSTLER_LEDGER_SHARED`` is not a yes/no value, or ``HOSTLER_LEDGER``
            or ``XDG_STATE_HOME`` names a path that cannot be used (``~user`` unknown, a loop).
    """
    shared_text = os.environ.get("HOSTLER_LEDGER_SHARED", "").strip().lower()
    if shared_text not in _TRUE | _FALSE:
        raise SettingError(
            f"HOSTLER_LEDGER_SHARED={shared_text[:40]!r}: use 1 or 0 (yes/no, true/false)"
        )
    shared = shared_text in _TRUE
    configured = env_path("HOSTLER_LEDGER", resolve=True)
    if configured is not None:
        return LedgerLocation(configured, shared)
    base = env_path("XDG_STATE_HOME", resolve=True) or home_dir() / ".local" / "state"
    return LedgerLocation(base / "hostler" / "ledger.db", shared)


def check_ledger_directory(location: LedgerLocation) -> None:
    """Refuse a ledger directory this user cannot trust (OW4).

    Private (the default): created 0700 if missing; it must be ours. Shared: it must already
    exist, be owned by us or root, not be writable by everyone, and belong to a group we are
    in (its files are then created 0660).

    Raises:
        StorePathError: What is wrong, and how to fix it, in one line.
    """
    # where the file really is: a link in a directory of ours to a file in someone else's
    # would put the ledger in their hands
    try:
        directory = user_path(location.path, resolve=True).parent
    except ValueError as exc:
        raise StorePathError(f"{location.path}: {exc}") from None
    if not location.shared:
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise StorePathError(
                f"{directory}: cannot create the ledger directory ({exc.strerror})"
            ) from exc
    try:
        info = directory.stat()
    except OSError as exc:
        raise StorePathError(
            f"{directory}: the shared ledger directory must exist ({exc.strerror}); "
            "an administrator creates it (see docs/capacity.md, 'A ledger shared by several users')"
        ) from exc
    uid = os.geteuid()
    mode = stat.S_IMODE(info.st_mode)
    if not location.shared:
        if info.st_uid != uid:
            raise StorePathError(
                f"{directory}: owned by uid {info.st_uid}, not by you (uid {uid}); hostler will "
                "not keep its ledger where someone else decides. Point HOSTLER_LEDGER at a "
                "directory of your own, or set HOSTLER_LEDGER_SHARED=1 for a group-shared ledger"
            )
        return
    if info.st_uid not in {uid, 0}:
        raise StorePathError(
            f"{directory}: owned by uid {info.st_uid}; a shared ledger directory must belong "
            "to root or to you, so that no other user can replace it"
        )
    if mode & stat.S_IWOTH:
        raise StorePathError(
            f"{directory}: writable by every user (mode {mode:o}); a shared ledger directory "
            "must be writable by its group only (e.g. chmod 2770)"
        )
    if uid != 0 and info.st_gid not in {os.getegid(), *os.getgroups()}:
        raise StorePathError(
            f"{directory}: its group (gid {info.st_gid}) is not one of yours; ask the "
            "administrator to add you to it"
        )


def open_ledger_store(location: LedgerLocation, *, busy_timeout: float | None = None) -> EventStore:
    """Open the ledger's log after checking where it lives (OW4)."""
    check_ledger_directory(location)
    return EventStore.open(location.path, shared=location.shared, busy_timeout=busy_timeout)


@dataclass(frozen=True, slots=True)
class OwnerIdentity:
    """Who holds a reservation: a process, recognisable even after its pid is reused.

    ``since_boot`` is its start in the kernel's ticks since boot (None where the kernel does
    not say, or the owner string predates it): what tells the process apart, since
    ``create_time`` moves when the system clock is set.
    """

    pid: int
    create_time: float
    boot: str
    label: str = "hostler"
    since_boot: float | None = None

    @classmethod
    def current(cls, label: str = "hostler") -> OwnerIdentity:
        """This process."""
        pid = os.getpid()
        created = psutil.Process(pid).create_time()
        return cls(pid, created, boot_id(), label, since_boot=started_since_boot(pid))

    def text(self) -> str:
        """The owner string stored in ledger events: ``label:pid:start:boot``.

        ``start`` is the wall-clock start, then ``+`` and the ticks since boot where known (an
        older hostler reads such a string as no identity at all, and keeps what it holds).
        """
        start = f"{self.create_time:.3f}"
        if self.since_boot is not None:
            start += f"+{self.since_boot:.2f}"
        return f"{self.label}:{self.pid}:{start}:{self.boot}"

    @staticmethod
    def parse(text: str) -> OwnerIdentity | None:
        """The identity in an owner string, or None if it is not one."""
        try:
            rest, boot = text.rsplit(":", 1)
            rest, start = rest.rsplit(":", 1)
            label, pid = rest.rsplit(":", 1)
            created, plus, ticks = start.partition("+")
            since_boot = float(ticks) if plus else None
            return OwnerIdentity(int(pid), float(created), boot, label, since_boot=since_boot)
        except ValueError:
            return None


def owner_alive(text: str, *, this_boot: str, unknown_alive: bool = True) -> bool:
    """Whether the process an owner string names is still the same live process.

    A string that names no process reads as ``unknown_alive``: alive by default, so that a
    reservation nobody can judge is kept.
    """
    owner = OwnerIdentity.parse(text)
    if owner is None:
        return unknown_alive
    if owner.boot != this_boot:
        return False
    return _same_process(owner.pid, owner.create_time, owner.since_boot, tolerance=0.01)


def _same_process(
    pid: int, create_time: float, since_boot: float | None, *, tolerance: float
) -> bool:
    return _holder(pid, create_time, since_boot, tolerance=tolerance) == "same"


def _holder(pid: int, create_time: float, since_boot: float | None, *, tolerance: float) -> str:
    """Who has ``pid`` now: ``same``, ``other`` (the pid was reused) or ``none``.

    ``same``: the process that started at ``create_time`` (within ``tolerance``), or another
    user's (not ours to judge: kept); ``none``: nobody, or a zombie.
    """
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return "none"
        same = same_start(process, wall=create_time, since_boot=since_boot, tolerance=tolerance)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return "none"
    except psutil.AccessDenied:
        return "same"
    return "same" if same else "other"


def engine_alive(held: Held) -> bool:
    """Whether the engine process a reservation pays for still runs (OW2).

    By pid and start time once it was bound; before that by its launch token (a scan of the
    process table, done only for reservations whose owner is gone). A reservation that names
    no process at all (written before OW2) pays for nothing we can find.
    """
    if held.pid is not None and held.create_time is not None:
        # The leader, or what is left of its group: an engine's group outlives a leader that
        # crashed while children hold memory, and the kernel gives no process a pid that still
        # names a group. So a process that has the pid now with another start proves the
        # engine's group gone (the pid was free to reuse), whatever group it leads; without
        # one, a group of that id is the engine's leftovers.
        leader = _holder(held.pid, held.create_time, held.since_boot, tolerance=0.05)
        if leader != "none":
            return leader == "same"
        return group_alive(held.pid)
    if held.token:
        return _token_running(held.token)
    return False


def _token_running(token: str) -> bool:
    return next(token_holders(token.__eq__), None) is not None


def fold_records(state: LedgerState, records: list[RecordedEvent]) -> LedgerState:
    """Fold ledger records newer than ``state.version`` into ``state`` (the one fold)."""
    return fold(state, records)


def catch_up(store: EventStore, state: LedgerState | None = None) -> LedgerState:
    """A ledger state brought up to the store's last ledger event (a fresh one by default)."""
    state = state if state is not None else LedgerState()
    return fold_records(state, store.read_stream(LEDGER_STREAM, after_version=state.version))


class HostLedger:
    """A daemon's handle on the host-wide ledger.

    Every method folds what others decided, decides with the pure rules and records the
    decision (with its inputs) in one transaction. They block on SQLite: async code calls them
    through a worker thread.

    Args:
        store: The ledger's event log (shared by every daemon that cooperates).
        owner: This daemon's identity; recorded on each of its reservations.
        budget: Returns the host's automatic budget (from the latest device sample).
        alive: Decides whether an owner string is a live process (injected in tests).
        engine_alive: Decides whether a reservation's engine process runs (injected in tests).
        reopen: Opens the ledger's file again; given, a ledger file deleted or replaced while
            in use is noticed before each decision and what is still in use carried over (OW6).
    """

    def __init__(
        self,
        store: EventStore,
        owner: OwnerIdentity,
        budget: Callable[[], CapacityBudget],
        *,
        alive: Callable[[str], bool] | None = None,
        engine_alive: Callable[[Held], bool] | None = None,
        reopen: Callable[[], EventStore] | None = None,
    ) -> None:
        self.store = store
        self._reopen = reopen
        self._file = _file_id(store.sqlite_file)
        self.owner = owner.text()
        self._budget = budget
        this_boot = owner.boot
        self._alive = alive or (lambda text: owner_alive(text, this_boot=this_boot))
        self._engine_alive = engine_alive or _engine_alive_default
        self.state = LedgerState()
        self.retries = 0
        # OW7: releases that could not be recorded (ledger locked, disk full), by key: owed,
        # retried by settle_owed() and before every decision, never dropped.
        self.owed: dict[str, str] = {}
        # Several supervisors decide through one handle from worker threads: its state is
        # folded and decided under this lock (never taken on the event loop).
        self._lock = threading.RLock()

    # -- reading -----------------------------------------------------------------------------

    def refresh(self) -> LedgerState:
        """Fold the ledger events written since the last look."""
        with self._lock:
            self.check_file()
            return catch_up(self.store, self.state)

    def check_file(self) -> bool:
        """OW6: if the ledger file was deleted or replaced, reopen it and carry over what runs.

        Every reservation this handle knew of whose engine still runs — or, not yet bound,
        whose owner lives — is written into the new file under its owner
        (``ledger.carried``), so nobody is granted memory those engines hold. Returns whether
        the file had been replaced.
        """
        with self._lock:
            path = self.store.sqlite_file
            if self._reopen is None or path is None or _file_id(path) == self._file:
                return False
            log.warning("hostler: %s was deleted or replaced while in use; carrying over", path)
            known = self.state
            self.store.close()
            self.store = self._reopen()
            self._file = _file_id(path)
            self.state = LedgerState()

            def carry(state: LedgerState) -> tuple[list[Event], None]:
                events: list[Event] = []
                for held in sorted(known.reservations.values(), key=lambda h: h.slot):
                    if held.slot in state.reservations or not self._still_used(held):
                        continue
                    events.append(
                        LedgerCarried(
                            held.key,
                            held.owner,
                            held.bytes,
                            held.token,
                            held.pid,
                            held.create_time,
                            self.owner,
                        )
                    )
                return events, None

            self._decide_locked(carry)
            return True

    def _still_used(self, held: Held) -> bool:
        if held.pid is not None and held.create_time is not None:
            return self._engine_alive(held)
        return held.owner == self.owner or self._alive(held.owner)

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

    def held_by_other(self, token: str) -> str | None:
        """The live owner, other than this daemon, whose reservation pays for ``token``'s engine.

        None when no reservation names the token, or its owner is this daemon or gone.
        """
        held = self.refresh().by_token(token)
        if held is None or held.owner == self.owner or not self._alive(held.owner):
            return None
        return held.owner

    def reserve(self, key: str, wanted: int, *, token: str | None = None) -> ReserveDecision:
        """Reserve ``wanted`` bytes for ``key`` (replacing this daemon's prior), or be denied.

        ``token`` is the launch token of the engine process the bytes are for. Reservations
        whose owner and engine are both gone are released first. The decision is recorded
        (granted or denied, with its inputs) before it is returned.
        """
        decision: ReserveDecision = self._decide(
            lambda state: self._reserve_events(state, key, wanted, token)
        )
        return decision

    def bind(self, key: str, pid: int, create_time: float, since_boot: float | None = None) -> bool:
        """Name the engine process this daemon's reservation for ``key`` pays for (OW2).

        ``since_boot``: its start in ticks since boot, what liveness is judged by when known.
        """

        def events(state: LedgerState) -> tuple[list[Event], bool]:
            held = state.held(self.owner, key)
            if held is None:
                return [], False
            return [LedgerBound(key, self.owner, pid, create_time, since_boot)], True

        bound: bool = self._decide(events)
        return bound

    def release(self, key: str, *, cause: str = "released") -> bool:
        """Release this daemon's reservation for ``key``; False when it held none (CB9)."""
        released: bool = self._decide(lambda state: self._release_events(state, key, cause))
        self.owed.pop(key, None)
        return released

    def release_or_owe(self, key: str, *, cause: str = "released") -> bool:
        """Release ``key`` now, or keep the release owed when the ledger cannot record it (OW7).

        Returns whether it was recorded now. An owed release is retried by
        :meth:`settle_owed` (the daemon calls it every second) and before any other decision
        of this handle, so a dead engine's bytes are never held on paper for good.
        """
        with self._lock:
            self.owed[key] = cause
            try:
                self.settle_owed()
            except StoreError as exc:
                log.warning("hostler: ledger release of %s owed (%s)", key, exc.message)
                return False
            return True

    def settle_owed(self) -> int:
        """Record every owed release (OW7); how many were settled. Raises while it cannot."""
        with self._lock:
            settled = 0
            for key, cause in list(self.owed.items()):
                self._decide_locked(functools.partial(self._release_events, key=key, cause=cause))
                del self.owed[key]
                settled += 1
            return settled

    def _release_events(self, state: LedgerState, key: str, cause: str) -> tuple[list[Event], bool]:
        held = state.held(self.owner, key)
        if held is None:
            return [], False
        return [LedgerReleased(key, held.bytes, held.owner, cause)], True

    def release_token(self, token: str, *, cause: str) -> bool:
        """Release whichever reservation pays for the engine launched with ``token``.

        For an engine a predecessor of this daemon started and that is now known gone.
        """

        def events(state: LedgerState) -> tuple[list[Event], bool]:
            held = state.by_token(token)
            if held is None:
                return [], False
            return [LedgerReleased(held.key, held.bytes, held.owner, cause)], True

        released: bool = self._decide(events)
        return released

    def adopt(
        self, key: str, measured: int, *, token: str | None, pid: int, create_time: float
    ) -> LedgerAdopted:
        """Take over a running engine's memory (OW3): recorded, never denied."""

        def events(state: LedgerState) -> tuple[list[Event], LedgerAdopted]:
            event = decide_adopt(
                state,
                self._budget(),
                key=key,
                owner=self.owner,
                wanted=measured,
                token=token,
                pid=pid,
                create_time=create_time,
            )
            return [event], event

        adopted: LedgerAdopted = self._decide(events)
        return adopted

    def record_measured(self, key: str, measured: int) -> bool:
        """Hold ``measured`` bytes for ``key`` instead of its estimate (the truth beats it).

        Not an admission: the engine already runs. Returns False when ``key`` holds nothing.
        """

        def events(state: LedgerState) -> tuple[list[Event], bool]:
            held = state.held(self.owner, key)
            if held is None:
                return [], False
            return [LedgerMeasured(key, measured, held.owner, held.bytes)], True

        recorded: bool = self._decide(events)
        return recorded

    def set_budget(self, budget: int | None, *, source: str) -> None:
        """Point the ledger at an explicit budget in bytes, or back to automatic (None).

        ``source`` is where it was set (:mod:`hostler.capacity.origin`: ``api``,
        ``config:<file>``, ``env:HOSTLER_BUDGET_BYTES``), recorded for the refusals that ask
        for a larger budget. Not checked against CB1's floor: the edges that take a budget
        from outside refuse one under it. Existing reservations are never touched (CB2): the
        next reserve fails until room is freed.
        """
        self._decide(lambda _state: ([LedgerBudgetSet(budget, source)], None))

    def set_spillover(self, allowed: bool | None) -> None:
        """Allow or forbid RAM spillover, or go back to automatic (None); never evicts (CB3)."""
        self._decide(lambda _state: ([LedgerSpilloverSet(allowed)], None))

    def release_dead_owners(self) -> list[str]:
        """Release every reservation whose owner and engine are both gone; return their keys."""

        def events(state: LedgerState) -> tuple[list[Event], list[str]]:
            reaped = self._reap(state)
            return reaped, [e.key for e in reaped if isinstance(e, LedgerReleased)]

        keys: list[str] = self._decide(events)
        return keys

    def _reap(self, state: LedgerState) -> list[Event]:
        """OW2: what no live process pays for any more goes back.

        A reservation bound to a pid is stale once that process is gone, whoever owns it (an
        owner re-reserving for a new start replaces it with an unbound one first): released
        as ``engine-gone`` — this heals an owner whose own release could not be written. One
        not yet bound goes back only when its owner is gone too and no process carries its
        launch token (``owner-gone``).
        """
        dead = {o for o in state.owners() if o != self.owner and not self._alive(o)}
        released: list[Event] = []
        for held in sorted(state.reservations.values(), key=lambda h: h.slot):
            bound = held.pid is not None and held.create_time is not None
            if bound and not self._engine_alive(held):
                cause = "owner-gone" if held.owner in dead else "engine-gone"
                released.append(LedgerReleased(held.key, held.bytes, held.owner, cause))
            elif not bound and held.owner in dead and not self._engine_alive(held):
                released.append(LedgerReleased(held.key, held.bytes, held.owner, "owner-gone"))
        return released

    def _reserve_events(
        self, state: LedgerState, key: str, wanted: int, token: str | None
    ) -> tuple[list[Event], ReserveDecision]:
        reaped = self._reap(state)
        trial = state.copy()
        for event in reaped:
            trial.apply(event)
        decision = decide_reserve(trial, self._budget(), key, wanted, self.owner, token)
        return [*reaped, decision.event()], decision

    def _decide(self, make: Callable[[LedgerState], tuple[list[Event], Any]]) -> Any:
        with self._lock:
            self.check_file()
            if self.owed:
                self.settle_owed()  # OW7: what is owed goes first, or nothing is decided
            return self._decide_locked(make)

    def _decide_locked(self, make: Callable[[LedgerState], tuple[list[Event], Any]]) -> Any:
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
                first = result.version - len(decided) + 1
                for offset, event in enumerate(decided):
                    fold_step(self.state, first + offset, event)
            return answer
        raise StoreError(
            f"{self.store.name}: the ledger changed under {_MAX_ATTEMPTS} attempts in a row; "
            "too many daemons are deciding at once"
        )


_engine_alive_default = engine_alive
