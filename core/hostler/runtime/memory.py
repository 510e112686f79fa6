"""The host ledger as the runtime's operator reads and sets it, and a start's price, previewed.

:class:`MemoryFace` shows the ledger's budget, limits and every reservation (CB10), sets an
explicit budget and the RAM spillover live (CB2, CB3: never evicting by themselves), names
the ledger's own log when it is another file than the runtime's, and previews what starting
an engine would plan and reserve (NR6) with the very launcher its starts are priced with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hostler.capacity.origin import API_SOURCE, floor_problem
from hostler.capacity.pricing import LaunchPrice
from hostler.drivers.host_ledger import HostLedger
from hostler.drivers.offloop import OffLoop
from hostler.engines.launcher import Launcher
from hostler.engines.price import PricedLaunch
from hostler.errors import UsageError
from hostler.runtime.pool import Pool
from hostler.store.log import EventStore

__all__ = ["MemoryFace"]


class MemoryFace:
    """The memory budget, live, and start previews.

    Args:
        ledger: The host ledger (None: the runtime keeps no ledger; its verbs refuse).
        store: The runtime's event log.
        offloop: Where ledger work runs.
        pool: The runtime's engines (a supervisor's price when no launcher is known).
        launcher: ``launcher(key)`` of the runtime's engine factory (None: a plain build
            function, whose supervisor prices a preview).
    """

    def __init__(
        self,
        ledger: HostLedger | None,
        store: EventStore,
        offloop: OffLoop,
        pool: Pool,
        launcher: Callable[[str], Launcher | None] | None,
    ) -> None:
        self._ledger = ledger
        self._store = store
        self._io = offloop
        self._pool = pool
        self._launcher = launcher

    async def budget(self) -> dict[str, Any]:
        """The ledger's budget, limits and every reservation with its owner (fresh, CB10)."""
        ledger = self._need_ledger()
        snapshot: dict[str, Any] = await self._io.run(ledger.snapshot)
        return snapshot

    async def set_budget(self, budget: int | None) -> None:
        """An explicit budget in bytes, or None for the automatic one; never evicts (CB2).

        Recorded as set by the API (``hostler budget --set``, ``PUT /api/budget``).

        Raises:
            UsageError: Not a number of bytes, or under CB1's 1 GiB floor (it would not be
                enforced).
        """
        ledger = self._need_ledger()
        if budget is not None and (type(budget) is not int or budget < 0):
            raise UsageError(f"a budget is a number of bytes, not {budget!r}")
        problem = None if budget is None else floor_problem(budget)
        if problem is not None:
            raise UsageError(problem)
        await self._io.run(lambda: ledger.set_budget(budget, source=API_SOURCE))

    async def set_spillover(self, allowed: bool | None) -> None:
        """Allow or forbid RAM spillover, or back to automatic (None); never evicts (CB3)."""
        ledger = self._need_ledger()
        await self._io.run(ledger.set_spillover, allowed)

    def ledger_log(self) -> EventStore | None:
        """The host ledger's log when it is another file than the runtime's own log, else None."""
        ledger = self._ledger
        if ledger is None or ledger.store is self._store or ledger.store.name == self._store.name:
            return None
        return ledger.store

    async def preview(self, key: str) -> LaunchPrice:
        """What starting ``key`` would plan and reserve now; starts and evicts nothing (NR6).

        The very price the next start of ``key`` takes: the launcher its supervisor prices
        every start with, asked the way the pool asks it before making room (an engine
        factory's launcher needs no supervisor built; a plain build function's does).
        """
        launcher = None if self._launcher is None else self._launcher(key)
        if launcher is None:
            launch = await self._pool.price(key)
        else:
            launch = await self._io.run(launcher.price)
        if not isinstance(launch, PricedLaunch):
            raise UsageError(
                f"{key[:140]}: its supervisor was built with a fixed spec and footprint, "
                "not a planned launch; there is no plan to show"
            )
        return launch.price

    def _need_ledger(self) -> HostLedger:
        if self._ledger is None:
            raise UsageError("this runtime keeps no memory ledger")
        return self._ledger
