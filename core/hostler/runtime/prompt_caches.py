"""The engines' prompt caches, as the runtime serves them (CC1–CC12, L16).

:class:`PromptCaches` stands between the runtime's engines and its
:class:`~hostler.runtime.cache.CacheController`: it restores the budgets the log recorded
(CC3) and the session files the engines left on disk (CC14), registers the cache adapter of each
process that serves a key once per launch (L16), retires it once that process is gone (its
memory went with it; the files its stop saved stay, counted against its budget), and is the
operator's face of the caches (stats, a session's or an engine's invalidation, budgets).
"""

from __future__ import annotations

import logging
from typing import Any

from hostler.drivers.offloop import OffLoop
from hostler.errors import UsageError
from hostler.events.cache import CacheSaved, cache_stream
from hostler.machines.saved_files import fold_saved_files
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
        self._seen: dict[str, int] = {}  # how far each engine's cache stream was folded

    async def restore(self) -> None:
        """What the log says of the caches holds again after a restart.

        CC3: the budgets recorded; CC14: the session files each engine left on disk, and
        one token's cost as its saves measured it.
        """
        store = self._store

        def read() -> list[Any]:
            return [r for r in store.read_all(stream_prefix=cache_stream("")) if not r.damage]

        records = await self._io.run_patiently(read)
        restored = self._controller.restore_budgets(record.event for record in records)
        if restored:
            log.info("hostler: cache budgets restored from the log: %s", restored)
        self._controller.restore_files(fold_saved_files(records))
        for record in records:
            self._seen[record.stream_id] = max(self._seen.get(record.stream_id, 0), record.version)

    async def fit(self, key: str) -> None:
        """L16: the cache adapter of the process now serving ``key``, registered once per launch.

        A previous process's adapter is retired first (its stop's saves folded in), and the
        files counted for ``key`` are checked against what the new process can restore.
        """
        sup = self._pool.supervisor(key)
        spec, pid = sup.launch_spec, sup.pid
        if spec is None or pid is None or self._cached_pid.get(key) == pid:
            return
        if key in self._cached_pid:
            await self._retire(key)
        self._cached_pid[key] = pid
        adapter = sup.cache_adapter()  # the launch's own: its stop saves through it (CC13)
        if adapter is None:
            self._controller.unregister(key)
        else:
            self._controller.register(key, adapter)  # CC2: a new process starts clean
            await self._controller.verify_files(key)

    async def forget_stopped(self) -> None:
        """A registered cache adapter whose process is gone is retired (its memory went too).

        CC14: the saves its stop wrote are read from the log first, so that the files it left
        stay counted against its budget (and are enforced).
        """
        for key, pid in list(self._cached_pid.items()):
            if self._pool.supervisor(key).pid != pid:
                await self._retire(key)

    async def _retire(self, key: str) -> None:
        self._cached_pid.pop(key, None)
        stream, store = cache_stream(key), self._store
        after = self._seen.get(stream, 0)

        def read() -> list[Any]:
            return store.read_stream(stream, after_version=after)

        try:
            records = await self._io.run(read)
        except Exception:  # an unreadable log costs the files' accounting, not the runtime
            log.warning("hostler: could not read %s's cache saves", key, exc_info=True)
            records = []
        if records:
            self._seen[stream] = records[-1].version
        saves = [r.event for r in records if isinstance(r.event, CacheSaved)]
        await self._controller.retire(key, saves)

    async def prepare(self, key: str, session: str) -> SessionPrepared | None:
        """CC13/L16: ready ``key``'s engine for ``session``'s turn; None when it has no cache.

        The session is bound to a slot, and restored from its file when the engine does not
        hold it; the answer carries the fields its request body must carry.
        """
        await self.fit(key)
        return await self._controller.prepare(key, session)

    async def finish(
        self, key: str, session: str, prepared: SessionPrepared, usage: TurnUsage | None
    ) -> None:
        """CC4: the session's turn ended; ``usage`` is what its engine said it read (if it did)."""
        await self._controller.finish_turn(key, session, prepared, usage)

    def extras(self, key: str, session: str) -> dict[str, Any]:
        """The request fields that keep ``session`` on its cache slot (L16's ``id_slot``)."""
        return self._controller.request_extras(key, session)

    async def stats(self, key: str) -> CacheStats | None:
        """CC10: ``key``'s cache use, budget, hit rate and sources; None when not registered.

        CC14: an engine that stopped still shows the files it left (``running`` False).
        """
        await self.forget_stopped()
        return self._controller.stats(key)

    async def all_stats(self) -> list[CacheStats]:
        """CC10/CC14: every engine's cache, its saved files included, by key."""
        await self.forget_stopped()
        found = (self._controller.stats(key) for key in self._controller.keys())  # noqa: SIM118 - not a dict
        return [stats for stats in found if stats is not None]

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
