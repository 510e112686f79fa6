"""Pinned engines kept up (anyio driver, PP17): started again as soon as their budget allows.

:class:`PinnedEngines` is the pool's pin loop: it asks the pure
:class:`~hostler.machines.pins.PinKeeper` when a pin that is down may be tried again (and
whether to say why it failed), and :func:`~hostler.machines.pins.pin_blocked` whether it
needs a start at all, and carries out the starts.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

import anyio

from hostler.clock import Clock
from hostler.errors import HostlerError
from hostler.machines.engine import EngineState
from hostler.machines.pins import PinKeeper, pin_blocked
from hostler.runtime.maker import SupervisorMaker
from hostler.runtime.starts import Starter
from hostler.runtime.table import EngineTable
from hostler.runtime.tasks import PoolTasks

__all__ = ["PinnedEngines"]

log = logging.getLogger(__name__)


class PinnedEngines:
    """PP17: every pinned engine that is down is started, as soon as its restart budget allows.

    Args:
        pinned: The pinned engine keys.
        interval: How often they are looked at (seconds).
        table: The pool's entries.
        maker: Makes a pin's supervisor on first use.
        starter: Starts a pin that is down.
        tasks: The pool's tasks (the loop ends when the pool takes no new work).
        clock: The pool's clock.
    """

    def __init__(
        self,
        pinned: Collection[str],
        interval: float,
        *,
        table: EngineTable,
        maker: SupervisorMaker,
        starter: Starter,
        tasks: PoolTasks,
        clock: Clock,
    ) -> None:
        self._pinned = sorted(pinned)
        self._interval = interval
        self._table = table
        self._maker = maker
        self._starter = starter
        self._tasks = tasks
        self._clock = clock
        self._pins = PinKeeper(interval)  # the pins' retries and their trouble

    async def keep(self) -> None:
        """Look at every pin, then again every ``interval``, until the pool closes."""
        while not self._tasks.closed:
            for key in self._pinned:
                await self._raise(key)
            await self._clock.sleep(self._interval)

    async def _raise(self, key: str) -> None:
        if not self._pins.due(key, self._clock.monotonic()):
            return
        try:
            sup = self._maker.supervisor(key)
            entry = self._table.get(key)
            assert entry is not None  # noqa: S101 - the maker added it
            blocked = pin_blocked(
                up=entry.up,
                stopping=sup.state == EngineState.STOPPING,
                starting=entry.flight is not None,
                draining=entry.draining,
                locked_until=sup.engine.retry_at if sup.state == EngineState.FATAL else None,
                now=self._clock.wall(),
            )
            if blocked:
                return
            await self._starter.ensure(key, cause="pinned")
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:  # noqa: BLE001 - one pinned engine never ends the pool
            message = exc.message if isinstance(exc, HostlerError) else repr(exc)[:300]
            if self._pins.failed(key, message, self._clock.monotonic()).say:
                log.error("hostler: pinned %s: %s", key, message)  # noqa: TRY400
        else:
            self._pins.succeeded(key)
