"""One engine's record: its lifecycle machine and the writes of its events to the log.

Every change of an engine's state is an event on its stream (``engine/<key>``), fired on the
pure machine (:class:`hostler.machines.engine.Engine`, whose ``transitions`` model is the one
legality check) and written through here:

- an **observation** (:meth:`EngineJournal.observe`: it crashed, it is ready, it exited) is kept
  even when the log refuses it — pending in the machine, written by the next write or
  :meth:`EngineJournal.flush` (SF1);
- a **decision** (:meth:`EngineJournal.decide`: start it, stop it) is written before it is
  acted on; one the log refuses is withdrawn and the machine restored (SF2).

The log's health (:class:`~hostler.drivers.loghealth.LogHealth`) is told of every write.
"""

from __future__ import annotations

import copy

import anyio

from hostler.clock import Clock
from hostler.drivers.loghealth import LogHealth
from hostler.drivers.offloop import OffLoop
from hostler.errors import ConcurrencyError, StoreError
from hostler.machines.engine import Engine
from hostler.replay import commit
from hostler.store.log import EventStore

__all__ = ["EngineJournal"]

#: How long a failing log is left alone between two unforced flushes (seconds).
FLUSH_RETRY = 1.0


class EngineJournal:
    """The machine of one engine key and its writes (one at a time).

    Args:
        key: The engine key (for messages).
        engine: Its machine, as the log folded it.
        store: The daemon's event log.
        clock: Wall time for the events, monotonic time for the retry pacing.
        offloop: Where the writes run (each waits for an fsync).
        health: The log's write health, shared with the daemon.
    """

    def __init__(
        self,
        key: str,
        engine: Engine,
        store: EventStore,
        *,
        clock: Clock,
        offloop: OffLoop,
        health: LogHealth,
    ) -> None:
        self.key = key
        self.engine = engine
        self.store = store
        self.health = health
        self._clock = clock
        self._io = offloop
        self._next_flush = 0.0
        self._writing = anyio.Lock()  # fire-and-commit and flushes, one at a time

    async def observe(self, trigger: str, **observation: object) -> None:
        """Record an observation (SF1): what happened is kept even when the log refuses it.

        A write that fails leaves the event pending in the machine, to be written by the
        next write or :meth:`flush`; the caller goes on (the crash happened, the process is
        gone, whether or not the log takes it now).
        """
        async with self._writing:
            self.engine.fire(trigger, at=self._clock.wall(), **observation)
            # while the log refuses writes, the watcher's once-a-second retry takes it (SF4: a
            # shutdown never waits on a lock once per event)
            await self._flush_locked(force=self.health.ok)

    async def decide(self, trigger: str, **observation: object) -> None:
        """Record a decision before acting on it (SF2): unrecorded, it is not taken.

        Held under the write lock from firing to the verdict, so no concurrent flush can
        write a decision that is then withdrawn.

        Raises:
            StoreError: The log refused it; the machine is as it was, nothing is to be done.
        """
        async with self._writing:
            before = copy.deepcopy(self.engine.snapshot())
            event = self.engine.fire(trigger, at=self._clock.wall(), **observation)
            await self._flush_locked(force=True, withdrawable=1)
            if event in self.engine.pending:
                self.engine.pending.remove(event)
                self.engine.restore(before)
                raise self.health.refusal(  # as the failure it is: a busy log is retried in 1 s
                    f"{self.key}: {trigger!r} not done: the event log cannot record it "
                    f"({self.health.error})"
                )

    async def flush(self, *, force: bool = False) -> bool:
        """Write the machine's pending events; whether none are left pending.

        While the log fails, tries at most once a second unless ``force``.
        """
        async with self._writing:
            return await self._flush_locked(force=force)

    async def _flush_locked(self, *, force: bool, withdrawable: int = 0) -> bool:
        # one write at a time per machine: an event fired while a commit of the pending list
        # is in flight would be cleared with it, unwritten
        if not self.engine.pending:
            return True
        now = self._clock.monotonic()
        if not force and now < self._next_flush:
            return False
        waiting = len(self.engine.pending)
        try:
            await self._io.run(self._commit)
        except ConcurrencyError:
            raise  # another writer in our stream: a bug or a copied data directory
        except StoreError as exc:
            self._next_flush = now + FLUSH_RETRY
            # a decision withdrawn on failure never waited: it is not counted as delayed
            self.health.failed(exc, self._clock.wall(), pending=waiting - withdrawable)
            return False
        self.health.wrote(self._clock.wall(), delayed=waiting - 1)
        return True

    def _commit(self) -> None:
        commit(self.store, self.engine, metadata={"actor": "supervisor"})
