"""Making room and draining (anyio driver): what ``room_step`` and ``drain_step`` decide, done.

:class:`RoomDriver` carries out the pure steps of :mod:`hostler.policies.room` (PP4: which
engines make room for a start, waiting for spoken-for ones, or refusing before anything is
unloaded) and :func:`hostler.policies.pool.drain_step` (PP5: a victim takes no new work, is
stopped once idle, or is given up on after the drain's bound), recording each decision on
the pool's stream before it is carried out. :class:`StopNotice` tells the listeners (the HTTP
face's kept-alive connections) just before an engine is stopped.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio

from hostler.capacity.ledger import LedgerLimits
from hostler.capacity.ledger import shortfall as ledger_shortfall
from hostler.clock import Clock
from hostler.drivers.host_ledger import HostLedger
from hostler.drivers.offloop import OffLoop
from hostler.engines.launcher import Launch
from hostler.engines.supervisor import Supervisor
from hostler.errors import EngineBusyError, HostlerError, StartAbandonedError
from hostler.events.base import Event
from hostler.events.pool import POOL_STREAM, PoolDrainEnded, PoolDrainStarted, PoolRoomPlanned
from hostler.machines.engine import StopReason
from hostler.policies.eviction import EvictionPolicy
from hostler.policies.pool import PoolEntry, drain_bound, drain_step
from hostler.policies.room import RoomSearch, Standing, room_step, start_share
from hostler.runtime.table import EngineTable, Entry
from hostler.store.log import EventStore

__all__ = ["DrainProgress", "RoomDriver", "StopNotice"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DrainProgress:
    """A busy engine chosen to make room is still draining (told to drain listeners).

    Attributes:
        key: The draining engine.
        for_key: The engine the room is for (None for an unload or a reconcile).
        waited: Seconds since the drain began.
        limit: Seconds it may take before the eviction gives up (PP5; None: as long as the
            start it makes room for is wanted).
    """

    key: str
    for_key: str | None
    waited: float
    limit: float | None


class StopNotice:
    """Who is told ``port`` just before the pool stops the engine listening on it."""

    def __init__(self) -> None:
        self._listeners: list[Callable[[int], Awaitable[None]]] = []

    def add(self, listener: Callable[[int], Awaitable[None]]) -> None:
        """Call ``listener(port)`` before each stop from now on."""
        self._listeners.append(listener)

    async def tell(self, supervisor: Supervisor) -> None:
        """Tell every listener that ``supervisor``'s engine is about to stop (shielded)."""
        port = supervisor.port
        if port is None:
            return
        for listener in self._listeners:
            try:
                with anyio.CancelScope(shield=True):
                    await listener(port)
            except Exception:  # a listener's trouble never keeps an engine from stopping
                log.exception("hostler: a stop listener failed for %s", supervisor.key)


class RoomDriver:
    """PP4's make-room and PP5's bounded drain, over the pool's entries.

    Args:
        table: The pool's entries.
        store: The daemon's event log (decisions go to stream ``pool/host``).
        ledger: The host ledger (None: nothing is ever evicted for room).
        clock: The pool's clock.
        offloop: Where blocking log and ledger work runs.
        eviction: The order idle engines are given up in (EV1).
        drain_wait: PP5's bound on a busy victim's drain (seconds).
        drain_poll: How often a draining victim is looked at (seconds).
        stops: Told just before a victim is stopped.
    """

    def __init__(
        self,
        table: EngineTable,
        store: EventStore,
        ledger: HostLedger | None,
        clock: Clock,
        offloop: OffLoop,
        *,
        eviction: EvictionPolicy,
        drain_wait: float,
        drain_poll: float,
        stops: StopNotice,
    ) -> None:
        self._table = table
        self._store = store
        self._ledger = ledger
        self._clock = clock
        self._io = offloop
        self._eviction = eviction
        self.drain_wait = drain_wait
        self._drain_poll = drain_poll
        self._stops = stops
        self._listeners: list[Callable[[DrainProgress], None]] = []

    async def make_room(self, key: str, launch: Launch) -> str | None:
        """PP4: evict what the policy picks until ``launch``'s bytes fit.

        Returns None once it fits (or when there is nothing to decide); when even evicting
        everything evictable could not make it fit, evicts nothing and returns why, for the
        denial the ledger then records (the start is still asked of the ledger, so every
        daemon sharing it sees the refusal with its inputs).
        """
        wanted = launch.reserved_bytes
        if self._ledger is None or wanted is None:
            return None
        if type(wanted) is not int or wanted < 0:  # no byte count: a broken plugin, whose
            return None  # start the supervisor refuses and records; nothing is evicted for it
        table = self._table
        search = RoomSearch(key, wanted, self._clock.monotonic() + self.drain_wait)
        while True:
            short, held, limits = await self._io.run(self._shortfall, key, wanted)
            now = self._clock.wall()
            standing = [
                Standing(
                    table.as_policy(k, e, held.get(k, 0), queued=True),
                    # an engine being built, or built and not yet handed to those who asked
                    # for it, is spoken for (room_step never evicts it)
                    spoken=e.flight is not None or e.waiting > 0,
                    kept=k in table.pinned or k in table.protected,
                )
                for k, e in table.items()
                if e.up
            ]
            step = room_step(
                search,
                short,
                standing,
                now,
                limits=limits,
                policy=self._eviction,
                patience_now=self._clock.monotonic(),
            )
            if step.action == "fit":
                return None
            if step.action == "wait":
                await self._clock.sleep(self._drain_poll)  # PP4: wait for them, then look again
                continue
            assert step.plan is not None  # noqa: S101 - refuse and unload carry their plan
            decision = {**step.plan.decision, "observed": _observed(step.candidates)}  # PM14
            planned = PoolRoomPlanned(
                at=now,
                for_key=key,
                wanted=wanted,
                shortfall=short,
                evict=list(step.evict),
                drain=step.drain,
                reachable=step.plan.reachable,
                decision=decision,
            )
            await self._decide(planned)  # SF2: a decision the log cannot take is not taken
            if step.action == "refuse":
                return step.refusal
            search = step.search
            why = {**decision, "for": key}
            async with anyio.create_task_group() as evictions:
                for victim in step.evict:
                    evictions.start_soon(self._evict_logged, victim, key, why)
            if step.drain is not None:
                await self.drain(step.drain, key, why, drain_bound(key, self.drain_wait))

    def _shortfall(self, key: str, wanted: int) -> tuple[int, dict[str, int], LedgerLimits]:
        """CB5 against the ledger now, what this daemon holds per key, the limits (blocking)."""
        ledger = self._ledger
        assert ledger is not None  # noqa: S101 - only called with a ledger
        limits = ledger.limits()
        state = ledger.state
        wanted = start_share(wanted, limits.budget)
        mine = {h.key: h.bytes for h in state.reservations.values() if h.owner == ledger.owner}
        short = ledger_shortfall(limits, state.committed, wanted, mine.get(key, 0))
        return short, mine, limits

    async def _evict_logged(self, key: str, for_key: str, why: dict[str, Any]) -> None:
        try:
            await self.drain(key, for_key, why, self.drain_wait)
        except HostlerError as exc:
            log.warning("hostler: %s", exc.message)

    async def drain(
        self, key: str, for_key: str | None, why: dict[str, Any], wait: float | None
    ) -> bool:
        """PP5: no new work for ``key`` from now; evict it once idle, or give up after ``wait``.

        ``wait`` None: no bound but the wish of those who asked for ``for_key`` (PP18).

        Returns whether it was evicted (False: it was already gone).

        Raises:
            EngineBusyError: Still busy after ``wait`` seconds; it stays, with its memory.
            StartAbandonedError: Everyone who asked for ``for_key`` left meanwhile (PP18).
        """
        entry = self._table.get(key)
        if entry is None or not entry.up:
            return False
        if entry.draining:  # another eviction drains it already: join it
            await entry.drained.wait()
            return not entry.up
        started = self._clock.wall()
        # SF2: recorded before it is begun; a log that cannot take it refuses it at once
        await self._decide(PoolDrainStarted(started, key, for_key, wait))
        if _draining(entry):  # another drain began while this one was recorded: join it
            await entry.drained.wait()
            return not entry.up
        entry.draining = True
        entry.drained = anyio.Event()
        try:
            while True:
                step = drain_step(
                    busy=self._table.busy(key, entry, queued=False),
                    up=entry.up,
                    wanted=for_key is None or self._table.wanted(for_key),
                    started_at=started,
                    now=self._clock.wall(),
                    wait=wait,
                )
                exact, waited = step.decision, step.waited
                if step.action == "wait":
                    self._tell_drain(DrainProgress(key, for_key, waited, wait))
                    await self._clock.sleep(self._drain_poll)
                    continue
                if step.action == "evict":
                    await self._stops.tell(entry.supervisor)
                    await entry.supervisor.stop(StopReason.EVICTED, {**why, "drain": exact})
                await self._record(
                    PoolDrainEnded(self._clock.wall(), key, step.outcome, waited, exact)
                )
                if step.action == "abandon":
                    # PP18: everyone who asked for for_key left while this drained: the warm
                    # engine stays, and nothing is started for nobody
                    raise StartAbandonedError(
                        f"{for_key}: not started: everyone who asked for it left while {key} "
                        "drained; it keeps serving"
                    )
                if step.action == "busy":
                    raise EngineBusyError(
                        f"{key} is busy and did not drain within {wait or 0:g} s; not evicting it"
                        + (f" for {for_key}" if for_key else "")
                        + ": it stays resident. Retry when its requests end"
                    )
                return step.action == "evict"
        finally:
            entry.draining = False
            entry.drained.set()

    @contextlib.contextmanager
    def listener(self, callback: Callable[[DrainProgress], None] | None) -> Iterator[None]:
        """Tell ``callback`` how every drain goes while the block runs (NR1's progress)."""
        if callback is None:
            yield
            return
        self._listeners.append(callback)
        try:
            yield
        finally:
            self._listeners.remove(callback)

    def _tell_drain(self, progress: DrainProgress) -> None:
        for listener in list(self._listeners):
            try:
                listener(progress)
            except Exception:  # a caller's progress display never breaks a drain
                log.exception("hostler: a drain progress listener raised")

    async def _decide(self, event: Event) -> None:
        """Record a decision before it is carried out (one try at the store's short wait).

        A log that cannot take it refuses the decision: StoreError (503, with Retry-After).
        """
        store = self._store
        await self._io.run(lambda: store.append(POOL_STREAM, [event], expected_version=None))

    async def _record(self, event: Event) -> None:
        """Record what has happened (a drain's end): patiently, it is history now."""
        store = self._store
        await self._io.run_patiently(
            lambda: store.append(POOL_STREAM, [event], expected_version=None)
        )


def _draining(entry: Entry) -> bool:
    """Whether ``entry`` drains now (read again after an await, which may have changed it)."""
    return bool(entry.draining)


def _observed(candidates: Iterable[PoolEntry]) -> dict[str, dict[str, Any]]:
    """PM14: each candidate's exact last use and request times (the decision rounds them)."""
    return {c.key: {"last_used_at": c.last_used_at, "hits": list(c.hits)} for c in candidates}
