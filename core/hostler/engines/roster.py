"""Which engine processes this daemon runs: the one answer a stray sweep spares (RD9).

:class:`EngineRoster` is made before anything that builds or keeps supervisors. The factory
that builds each supervisor hands it the roster's :meth:`~EngineRoster.pids` at construction
(``Supervisor(owned=roster.pids)``), and the pool enlists every supervisor it keeps; a sweep
after a failed start then spares every live engine of this daemon, whichever built it.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["EngineRoster"]


class _Running(Protocol):
    """What the roster reads of a supervisor: its key and the pid it holds now."""

    @property
    def key(self) -> str: ...

    @property
    def pid(self) -> int | None: ...


class EngineRoster:
    """The supervisors of one daemon, by key, and the pids they hold now."""

    def __init__(self) -> None:
        self._supervisors: dict[str, _Running] = {}

    def enlist(self, supervisor: _Running) -> None:
        """Count ``supervisor``'s engine as this daemon's (one per key; again: replaced)."""
        self._supervisors[supervisor.key] = supervisor

    def pids(self) -> list[int]:
        """The process ids of every enlisted engine running now (RD9: never swept)."""
        return [pid for s in self._supervisors.values() if (pid := s.pid) is not None]
