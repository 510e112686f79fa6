"""The pool's engines by key: each one's supervisor and use, and what a status shows of them.

:class:`EngineTable` is what every part of the pool reads: which engines it keeps, which of
them are up, busy or draining, the pure pool policy's view of each
(:class:`~hostler.policies.pool.PoolEntry`), and the status snapshot (PP16). It builds
nothing: :class:`~hostler.runtime.maker.SupervisorMaker` adds the entries.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field

import anyio

from hostler.capacity.keys import parse_key
from hostler.clock import Clock
from hostler.drivers.host_ledger import HostLedger
from hostler.engines.supervisor import Supervisor
from hostler.machines.engine import EngineState
from hostler.plugin import Progress
from hostler.policies.pool import PoolEntry, demand

__all__ = ["UP", "EngineTable", "Entry", "EntryView", "Flight"]

#: The states of an engine that holds (or is about to hold) its memory.
UP = (EngineState.STARTING, EngineState.RUNNING)


@dataclass(frozen=True, slots=True)
class EntryView:
    """One engine the pool knows, as a status snapshot shows it (PP16)."""

    key: str
    state: str
    bytes: int
    last_used_at: float
    recent_hits: int
    busy: bool
    draining: bool
    pinned: bool
    port: int | None
    pid: int | None
    progress: Progress | None = None  # PG1: the current job's, while busy


class Flight:
    """One build of one key that every concurrent caller waits on (PP1)."""

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.port: int | None = None
        self.error: BaseException | None = None

    async def wait(self) -> int:
        """The built engine's port, once the build ended; its error when it failed."""
        await self.done.wait()
        if self.error is not None:
            raise self.error
        assert self.port is not None  # noqa: S101 - set before done
        return self.port


@dataclass
class Entry:
    """One engine of the pool: its supervisor and how it is used now."""

    supervisor: Supervisor
    last_used_at: float
    hits: tuple[float, ...] = ()
    in_use: int = 0  # requests past the drain gate (using it or about to)
    waiting: int = 0  # callers waiting for it to be built or to end a drain
    draining: bool = False
    drained: anyio.Event = field(default_factory=anyio.Event)
    flight: Flight | None = None

    @property
    def up(self) -> bool:
        """Whether its engine is starting or running."""
        return self.supervisor.state in UP


class EngineTable:
    """The pool's entries by key, and what is read of them (busy, resident, the snapshot).

    Args:
        clock: The pool's clock (a snapshot's "now").
        ledger: The host ledger (what this daemon holds per key; None: nothing).
        busy_hint: Whether an engine has requests queued for it (the request queue's view).
        pinned: Engine keys that stay resident (PP17).
    """

    def __init__(
        self,
        clock: Clock,
        ledger: HostLedger | None,
        busy_hint: Callable[[str], bool] | None,
        pinned: Collection[str],
    ) -> None:
        self._clock = clock
        self._ledger = ledger
        self._busy_hint = busy_hint
        self.pinned = frozenset(pinned)
        #: replicas a reconcile is building: they never make room for each other
        self.protected: set[str] = set()
        self._entries: dict[str, Entry] = {}

    def get(self, key: str) -> Entry | None:
        """``key``'s entry, or None when the pool does not know it."""
        return self._entries.get(key)

    def add(self, key: str, entry: Entry) -> None:
        """Keep ``entry`` as ``key``'s (once: the maker adds each key once)."""
        self._entries[key] = entry

    def items(self) -> Iterator[tuple[str, Entry]]:
        """Every key and entry, in the order they were made."""
        return iter(list(self._entries.items()))

    def engine_keys(self) -> list[str]:
        """Every engine key the pool knows, sorted."""
        return sorted(self._entries)

    def resident(self, key: str) -> bool:
        """Whether ``key`` runs (or is starting) and is not on its way out."""
        entry = self._entries.get(key)
        return entry is not None and entry.up and not entry.draining

    def peek(self, engine: str, model: str) -> list[str]:
        """PP12: the running, non-draining replicas of a model, most recently used first."""
        found = []
        for key, entry in self._entries.items():
            parsed = parse_key(key)
            if parsed is None or (parsed.engine, parsed.model) != (engine, model):
                continue
            if entry.supervisor.state == EngineState.RUNNING and not entry.draining:
                found.append((entry.last_used_at, key))
        return [key for _, key in sorted(found, key=lambda f: (-f[0], f[1]))]

    def busy(self, key: str, entry: Entry, *, queued: bool) -> bool:
        """Whether ``entry`` serves, waits on or builds for requests (the pool's busy, PP4).

        ``queued``: requests waiting in its request queue count too.
        """
        if entry.supervisor.busy or entry.in_use > 0 or entry.flight is not None:
            return True
        return queued and self._busy_hint is not None and self._busy_hint(key)

    def wanted(self, key: str) -> bool:
        """Whether anyone still waits for ``key``'s engine (a request, reconcile, a pin)."""
        entry = self._entries.get(key)
        return key in self.pinned or (entry is not None and entry.waiting > 0)

    def as_policy(self, key: str, entry: Entry, size: int, *, queued: bool = False) -> PoolEntry:
        """``entry`` as the pure pool policy sees it, holding ``size`` bytes."""
        return PoolEntry(
            key,
            size,
            entry.last_used_at,
            entry.hits,
            busy=self.busy(key, entry, queued=queued),
            draining=entry.draining,
        )

    def snapshot(self) -> list[EntryView]:
        """PP16: every known engine, sorted by key."""
        now = self._clock.wall()
        views = []
        for key in sorted(self._entries):
            entry = self._entries[key]
            sup = entry.supervisor
            views.append(
                EntryView(
                    key=key,
                    state=str(sup.state),
                    bytes=self._held_cached(key),
                    last_used_at=entry.last_used_at,
                    recent_hits=demand(self.as_policy(key, entry, 0), now),
                    busy=self.busy(key, entry, queued=True),
                    draining=entry.draining,
                    pinned=key in self.pinned,
                    port=sup.port,
                    pid=sup.pid,
                    progress=sup.progress,
                )
            )
        return views

    def _held_cached(self, key: str) -> int:
        """What this daemon holds for ``key`` in the ledger as last folded (no I/O)."""
        if self._ledger is None:
            return 0
        held = self._ledger.state.held(self._ledger.owner, key)
        return held.bytes if held is not None else 0
