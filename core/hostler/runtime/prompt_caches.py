"""The engines' prompt caches, as the runtime serves them (CC1–CC12, L16).

:class:`PromptCaches` stands between the runtime's engines and its
:class:`~hostler.runtime.cache.CacheController`: it restores the budgets the log recorded
(CC3), registers the cache adapter of each process that serves a key once per launch (L16),
forgets it once that process is gone (its KV cache went with it), and is the operator's face
of the caches (stats, a session's or an engine's invalidation, budgets).
"""

from __future__ import annotations

import logging
from typing import Any

from hostler.drivers.offloop import OffLoop
from hostler.errors import UsageError
from hostler.events.cache import CacheBudgetSet, cache_stream
from hostler.plugin import SessionPrepared
from hostler.runtime.cache import CacheController, CacheStats, TurnUsage
from hostler.runtime.pool import Pool
from hostler.store.log import EventStore

__all__ = ["PromptCaches"]

log = logging.getLogger(__name__)


class PromptCaches:
    """The prompt-cache controller fed with each launch's adapter, and its operator verbs.

    Args:
        controller: The prompt-cache controller.
        pool: The runtime's engines (which process serves a key now).
        store: The runtime's event log (the recorded budgets).
        offloop: Where the log is read.
    """

    def __init__(
        self, controller: CacheController, pool: Pool, store: EventStore, offloop: OffLoop
    ) -> None:
        self._controller = controller
        self._pool = pool
        self._store = store
        self._io = offloop
        self._cached_pid: dict[str, int] = {}  # the process each registered adapter serves

    async def restore_budgets(self) -> None:
        """CC3: the cache budgets the log recorded hold again; a restart resets none of them."""
        store = self._store

        def read() -> list[object]:
            found = store.read_all(types=[CacheBudgetSet.TYPE], stream_prefix=cache_stream(""))
            return [record.event for record in found if not record.damage]

        restored = self._controller.restore_budgets(await self._io.run_patiently(read))
        if restored:
            log.info("hostler: cache budgets restored from the log: %s", restored)

    def fit(self, key: str) -> None:
        """L16: the cache adapter of the process now serving ``key``, registered once per launch."""
        sup = self._pool.supervisor(key)
        spec, pid = sup.launch_spec, sup.pid
        if spec is None or pid is None or self._cached_pid.get(key) == pid:
            return
        self._cached_pid[key] = pid
        adapter = sup.cache_adapter()  # the launch's own: its stop saves through it (CC13)
        if adapter is None:
            self._controller.unregister(key)
        else:
            self._controller.register(key, adapter)  # CC2: a new process starts clean

    def forget_stopped(self) -> None:
        """A registered cache adapter whose process is gone is unregistered (its KV went too)."""
        for key, pid in list(self._cached_pid.items()):
            if self._pool.supervisor(key).pid != pid:
                del self._cached_pid[key]
                self._controller.unregister(key)

    async def prepare(self, key: str, session: str) -> SessionPrepared | None:
        """CC13/L16: ready ``key``'s engine for ``session``'s turn; None when it has no cache.

        The session is bound to a slot, and restored from its file when the engine does not
        hold it; the answer carries the fields its request body must carry.
        """
        self.fit(key)
        return await self._controller.prepare(key, session)

    async def finish(
        self, key: str, session: str, prepared: SessionPrepared, usage: TurnUsage | None
    ) -> None:
        """CC4: the session's turn ended; ``usage`` is what its engine said it read (if it did)."""
        await self._controller.finish_turn(key, session, prepared, usage)

    def extras(self, key: str, session: str) -> dict[str, Any]:
        """The request fields that keep ``session`` on its cache slot (L16's ``id_slot``)."""
        return self._controller.request_extras(key, session)

    def stats(self, key: str) -> CacheStats | None:
        """CC10: ``key``'s cache use, budget, hit rate and sources; None when not registered."""
        self.forget_stopped()
        return self._controller.stats(key)

    async def evict_session(self, session: str) -> None:
        """CC5: drop a session's cached prompt from every engine that holds it."""
        await self._controller.invalidate(session)

    async def clear(self, key: str) -> None:
        """CC6: drop every cached prompt of one engine."""
        await self._controller.invalidate_engine(key)

    async def set_budget(self, key: str, budget: int) -> None:
        """CC3: ``key``'s cache budget in bytes, enforced at once (evicting to 80 %).

        Raises:
            UsageError: ``budget`` is not a number of bytes.
        """
        if type(budget) is not int or budget < 0:
            raise UsageError(f"a cache budget is a number of bytes, not {budget!r}"[:120])
        await self._controller.set_budget(key, budget)
