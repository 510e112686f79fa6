"""The pool's one maker of supervisors: each key's built once, enlisted, registered, watched.

The first time any part of the pool asks for a key, :class:`SupervisorMaker` builds its
supervisor (the runtime's factory), enlists it in the daemon's
:class:`~hostler.engines.roster.EngineRoster` (RD9: a sweep spares it), registers its GPU
evictor (GA1) and, once the pool is entered, starts its watch.
"""

from __future__ import annotations

from collections.abc import Callable

from hostler.clock import Clock
from hostler.engines.roster import EngineRoster
from hostler.engines.supervisor import Supervisor
from hostler.runtime.slots import SlotEvictors
from hostler.runtime.table import EngineTable, Entry
from hostler.runtime.tasks import PoolTasks

__all__ = ["SupervisorMaker"]


class SupervisorMaker:
    """Makes each key's supervisor once, on first use (building no engine).

    Args:
        build: Makes the supervisor for an engine key (called once per key).
        roster: The daemon's engines (every supervisor made is enlisted).
        table: The pool's entries (the new entry goes there).
        tasks: The pool's tasks (each supervisor's watch runs there).
        evictors: Registers each engine's GPU evictor.
        clock: The pool's clock.
    """

    def __init__(
        self,
        build: Callable[[str], Supervisor],
        roster: EngineRoster,
        *,
        table: EngineTable,
        tasks: PoolTasks,
        evictors: SlotEvictors,
        clock: Clock,
    ) -> None:
        self._build = build
        self._roster = roster
        self._table = table
        self._tasks = tasks
        self._evictors = evictors
        self._clock = clock

    def supervisor(self, key: str) -> Supervisor:
        """The supervisor of ``key``, made on first use (building nothing)."""
        entry = self._table.get(key)
        if entry is None:
            entry = Entry(self._build(key), last_used_at=self._clock.wall())
            self._roster.enlist(entry.supervisor)
            self._evictors.register(entry.supervisor)
            self._table.add(key, entry)
            if self._tasks.running:
                self._tasks.start(entry.supervisor.watch)
        return entry.supervisor

    def watch_all(self) -> None:
        """Start the watch of every supervisor made before the pool was entered."""
        for _, entry in self._table.items():
            self._tasks.start(entry.supervisor.watch)
