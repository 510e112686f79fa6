"""What one engine key's run holds: the parts of its supervisor, and the process it runs now.

A :class:`~hostler.engines.supervisor.Supervisor` is built from a few drivers — the start
(:mod:`hostler.engines.starter`), the readiness wait (:mod:`hostler.engines.readywait`), the stop
(:mod:`hostler.engines.stopper`) and the watch (:mod:`hostler.engines.watcher`) — that share
one :class:`EngineParts`: the engine's record, its account, its adapter's guard, the clock,
and the :class:`EngineHold` of the process it runs now with the lock its starts and stops take.
"""

from __future__ import annotations

from dataclasses import dataclass

import anyio

from hostler.clock import Clock
from hostler.drivers.offloop import OffLoop
from hostler.engines.account import EngineAccount
from hostler.engines.child import EngineChild
from hostler.engines.guard import AdapterGuard
from hostler.engines.journal import EngineJournal
from hostler.machines.engine import Engine
from hostler.machines.watch import EngineWatch, Now, WatchEffect, WatchObservation
from hostler.plugin import EngineAdapter

__all__ = ["EngineHold", "EngineParts"]


class EngineHold:
    """The process an engine key runs now (at most one), and the lock its starts and stops take."""

    def __init__(self) -> None:
        #: held by a start (spawn to ready), a stop, and a watch step that acts
        self.lock = anyio.Lock()
        self._child: EngineChild | None = None

    @property
    def child(self) -> EngineChild | None:
        """The run held now (None: no process)."""
        return self._child

    def hold(self, child: EngineChild) -> None:
        """Hold ``child`` from now on (a run held before is let go of)."""
        if self._child is not None and self._child is not child:
            self._child.proc.close()
        self._child = child

    def drop(self, child: EngineChild) -> None:
        """Let go of a run that is done with: its pidfd closed, no longer ours to watch."""
        child.proc.close()
        if self._child is child:
            self._child = None


@dataclass(frozen=True, slots=True)
class EngineParts:
    """What the drivers of one engine key share.

    Attributes:
        key: The engine key.
        adapter: The engine kind's facts.
        guard: Every call into the adapter (SG3).
        journal: The engine's lifecycle machine and its writes.
        account: Its bytes in the host ledger.
        hold: The process it runs now, and the lock.
        watch: The watch's pure core: requests in flight, last use, health, idle.
        clock: The clock every wait and record reads.
        io: Where blocking writes run.
    """

    key: str
    adapter: EngineAdapter
    guard: AdapterGuard
    journal: EngineJournal
    account: EngineAccount
    hold: EngineHold
    watch: EngineWatch
    clock: Clock
    io: OffLoop

    @property
    def engine(self) -> Engine:
        """The engine's lifecycle machine, as its events say."""
        return self.journal.engine

    @property
    def state(self) -> str:
        """The lifecycle state."""
        return self.journal.engine.state

    def now(self) -> Now:
        """Now on both of the clock's faces (for the watch core)."""
        return Now(self.clock.wall(), self.clock.monotonic())

    def observe(self, observation: WatchObservation) -> list[WatchEffect]:
        """Tell the watch core what happened; the effects it asks for."""
        return self.watch.handle(observation, self.now())
