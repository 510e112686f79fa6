"""Blocking log and ledger work, run off the event loop.

Every append to the event log waits for an fsync, and every ledger decision holds SQLite's
write lock (waiting up to its busy timeout for another daemon's). Async code hands that work
to :class:`OffLoop`, whose worker threads run it while the loop keeps serving; appends that
land at the same moment share one commit (the store's group commit).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.to_thread

from hostler.clock import SYSTEM_CLOCK, Clock
from hostler.errors import StoreBusyError

__all__ = ["DAEMON_BUSY_TIMEOUT", "OffLoop"]

T = TypeVar("T")

#: Seconds one daemon write waits for another process's lock: short, so that no worker thread
#: (which cannot be cancelled) keeps a shutdown waiting; the waiting is done by retrying.
DAEMON_BUSY_TIMEOUT = 0.25


class OffLoop:
    """Runs blocking calls on a few worker threads (``threads`` at most at once).

    A call that was started finishes even if its caller is cancelled (what it wrote stays
    consistent with what the caller believes); the cancellation is delivered afterwards.
    ``clock`` paces :meth:`run_patiently`'s tries.
    """

    def __init__(self, threads: int = 4, clock: Clock = SYSTEM_CLOCK) -> None:
        self._threads = threads
        self._clock = clock
        self._limiter: anyio.CapacityLimiter | None = None

    async def run(self, func: Callable[..., T], *args: object) -> T:
        """``func(*args)`` on a worker thread."""
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self._threads)
        return await anyio.to_thread.run_sync(func, *args, limiter=self._limiter)

    async def run_patiently(
        self, func: Callable[..., T], *args: object, patience: float = 30.0
    ) -> T:
        """``func(*args)`` off the loop, tried again while the database is busy.

        Each try waits at most the store's short busy timeout; between tries the caller can be
        cancelled (a signal is never kept waiting by a lock). After ``patience`` seconds the
        last :class:`~hostler.errors.StoreBusyError` is raised.
        """
        deadline = self._clock.monotonic() + patience
        pause = 0.05
        while True:
            try:
                return await self.run(func, *args)
            except StoreBusyError:
                if self._clock.monotonic() + pause > deadline:
                    raise
            await self._clock.sleep(pause)
            pause = min(pause * 2, 0.5)
