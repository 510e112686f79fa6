"""The engine pool (anyio driver): which engines are resident, built once, evicted with reason.

The pool keeps one :class:`~hostler.engines.supervisor.Supervisor` per engine key and decides,
through the pure pool policy (:mod:`hostler.policies.pool`), which resident engines make room
when another must start. What it guarantees (docs/rules.md):

- PP1: concurrent requests for one key join one build; a draining engine is never handed out
  (its new requests wait for the drain to end, then use it if it stayed, or build it again).
- PP4: room is made from idle engines, the least wanted first (fewest requests in the last
  60 s, then the longest unused), evicted together; a start that could not fit even if every
  evictable engine went is refused before anything is unloaded. The decision, with every
  candidate's figures, is recorded (``pool.room_planned``) before any engine is stopped, and
  each victim's stop carries it too.
- PP5: a busy victim is drained: it takes no new work from that instant and gets a bounded
  wait (30 s by default); still busy then, the eviction fails with
  :class:`~hostler.errors.EngineBusyError` and the engine stays, with its reservation. A
  victim's shutdown completes before its reservation is released (the supervisor's SG2).
- PP6–PP10: unload one idle engine, release every idle engine, retire, reconcile replicas.
- PP17: a pinned engine stays resident: it is never a victim, and after a crash it is started
  again as soon as its restart budget allows, not when the next request comes.

Measured bytes beat estimates: a victim's size is what the ledger holds for it, which is the
measured footprint once the engine has been measured.

The pool is the entry point; the work is done by the parts it builds once in ``__init__``:
its entries (:mod:`hostler.runtime.table`), background tasks (:mod:`hostler.runtime.tasks`),
the one maker of supervisors (:mod:`hostler.runtime.maker`), making room and draining
(:mod:`hostler.runtime.room`), starts (:mod:`hostler.runtime.starts`), unloads and reconcile
(:mod:`hostler.runtime.verbs`) and the pin loop (:mod:`hostler.runtime.pinned`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Collection, Coroutine, Mapping
from typing import Any

from hostler.clock import ClockLike, as_clock
from hostler.drivers.host_ledger import HostLedger
from hostler.drivers.offloop import OffLoop
from hostler.engines.launcher import Launch
from hostler.engines.roster import EngineRoster
from hostler.engines.supervisor import Supervisor
from hostler.machines.engine import StopReason
from hostler.policies.eviction import DEFAULT_EVICTION_POLICY, EvictionPolicy
from hostler.policies.pool import DRAIN_WAIT
from hostler.runtime.arbiter import GpuArbiter
from hostler.runtime.maker import SupervisorMaker
from hostler.runtime.pinned import PinnedEngines
from hostler.runtime.room import DrainProgress, RoomDriver, StopNotice
from hostler.runtime.slots import SlotEvictors
from hostler.runtime.starts import Starter
from hostler.runtime.table import EngineTable, EntryView
from hostler.runtime.tasks import PoolTasks
from hostler.runtime.verbs import MAX_REPLICAS, Reconciler, ReconcileReport, Unloader
from hostler.store.log import EventStore

__all__ = ["DRAIN_POLL", "MAX_REPLICAS", "DrainProgress", "EntryView", "Pool", "ReconcileReport"]

#: How often a draining victim is looked at (seconds; the seed's 500 ms).
DRAIN_POLL = 0.5


class Pool:
    """The resident engines of one daemon, made room for by demand and drained with a bound.

    Use it as ``async with Pool(...) as pool:``: builds run in the pool's own task group (a
    caller that gives up waiting does not cancel a build others wait on), and leaving the
    block stops every engine the pool started (PP8).

    Args:
        store: The daemon's event log (pool decisions go to stream ``pool/host``).
        build: Makes the supervisor for an engine key (called once per key).
        ledger: The host ledger (None: no accounting, nothing is ever evicted for room).
        clock: The clock (wall time for the log, monotonic time and sleeps for its waits).
        offloop: Where blocking log and ledger work runs.
        drain_wait: PP5's bound on a busy victim's drain (seconds).
        drain_poll: How often a draining victim is looked at (seconds).
        busy_hint: Whether an engine has requests queued for it (the request queue's view).
        pinned: Engine keys that stay resident (PP17).
        pin_interval: How often pinned engines are checked (seconds).
        eviction: The order idle engines are given up in (EV1; default demand-weighted LRU).
        roster: The daemon's engines, which ``build`` hands each supervisor as ``owned``
            (RD9); every supervisor the pool makes is enlisted there (default: a new one).
        arbiter: The GPU arbiter each engine's evictor is registered with (GA1; None: none).
    """

    def __init__(
        self,
        store: EventStore,
        build: Callable[[str], Supervisor],
        *,
        ledger: HostLedger | None = None,
        clock: ClockLike = time.time,
        offloop: OffLoop | None = None,
        drain_wait: float = DRAIN_WAIT,
        drain_poll: float = DRAIN_POLL,
        busy_hint: Callable[[str], bool] | None = None,
        pinned: Collection[str] = (),
        pin_interval: float = 1.0,
        eviction: EvictionPolicy = DEFAULT_EVICTION_POLICY,
        roster: EngineRoster | None = None,
        arbiter: GpuArbiter | None = None,
    ) -> None:
        self.store = store
        self.ledger = ledger
        self.eviction = eviction
        self.pinned = frozenset(pinned)
        self._roster = roster or EngineRoster()
        the_clock = as_clock(clock)
        io = offloop or OffLoop()
        self._tasks = PoolTasks()
        self._table = EngineTable(the_clock, ledger, busy_hint, self.pinned)
        self._stops = StopNotice()
        self._room = RoomDriver(
            self._table,
            store,
            ledger,
            the_clock,
            io,
            eviction=eviction,
            drain_wait=drain_wait,
            drain_poll=drain_poll,
            stops=self._stops,
        )
        self._unloader = Unloader(self._table, self._room, self._tasks, self._stops)
        evictors = SlotEvictors(arbiter, self._unloader.unload_idle)
        self._maker = SupervisorMaker(
            build,
            self._roster,
            table=self._table,
            tasks=self._tasks,
            evictors=evictors,
            clock=the_clock,
        )
        self._starter = Starter(
            self._table,
            self._maker,
            tasks=self._tasks,
            room=self._room,
            clock=the_clock,
            offloop=io,
        )
        self._reconciler = Reconciler(self._table, self._room, self._starter, self._tasks)
        self._pins = PinnedEngines(
            self.pinned,
            pin_interval,
            table=self._table,
            maker=self._maker,
            starter=self._starter,
            tasks=self._tasks,
            clock=the_clock,
        )

    # -- lifetime ------------------------------------------------------------------------------

    async def __aenter__(self) -> Pool:
        await self._tasks.enter()
        self._maker.watch_all()  # the supervisors made before the pool was entered
        if self.pinned:
            self._tasks.start(self._pins.keep)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
        await self._tasks.exit(*exc_info)

    def spawn(self, func: Callable[[], Coroutine[Any, Any, object]]) -> None:
        """Run ``func`` in the pool's task group: it is cancelled when the pool closes."""
        self._tasks.spawn(func)

    @property
    def closed(self) -> bool:
        """Whether the pool takes no new work (closing or closed)."""
        return self._tasks.closed

    def stop_taking_work(self) -> None:
        """Take no new work from now on and cancel builds in flight (the first step of close).

        A daemon stopping its engines itself calls it first, so that what breaks off meanwhile
        reads as a shutdown, and a request behind a stopped engine is refused, not started.
        """
        self._tasks.cancel()

    async def close(self, cause: str = StopReason.SHUTDOWN) -> None:
        """PP8: take no new work, cancel builds in flight, stop every engine; idempotent.

        A build in flight is cancelled, which kills its process group and records the stop
        (``start-cancelled``, SG1); every running engine is stopped (reason ``shutdown``),
        recorded when the log takes it and stopped all the same when it does not (SF2).
        """
        self.stop_taking_work()  # builds, watches, the pin keeper; not the caller
        await self._unloader.stop_all(str(cause))

    def on_stopping(self, listener: Callable[[int], Awaitable[None]]) -> None:
        """Call ``listener(port)`` just before the pool stops an engine listening on ``port``.

        The HTTP face drops its kept-alive connections to that port here: ``llama-server``
        waits on open connections before it exits (≈ 100 ms a stop), which a swap would pay.
        """
        self._stops.add(listener)

    # -- what others read ----------------------------------------------------------------------

    def supervisor(self, key: str) -> Supervisor:
        """The supervisor of ``key``, made on first use (building nothing)."""
        return self._maker.supervisor(key)

    def live_pids(self) -> list[int]:
        """The process ids of every engine the pool's supervisors hold now (RD9: never swept)."""
        return self._roster.pids()

    def engine_keys(self) -> list[str]:
        """Every engine key the pool knows, sorted."""
        return self._table.engine_keys()

    def resident(self, key: str) -> bool:
        """Whether ``key`` runs (or is starting) and is not on its way out."""
        return self._table.resident(key)

    def peek(self, engine: str, model: str) -> list[str]:
        """PP12: the running, non-draining replicas of a model, most recently used first.

        Builds nothing and does not count as use.
        """
        return self._table.peek(engine, model)

    def busy(self, key: str) -> bool:
        """Whether ``key`` serves or waits on requests (the pool's busy, PP4)."""
        entry = self._table.get(key)
        return entry is not None and self._table.busy(key, entry, queued=True)

    def snapshot(self) -> list[EntryView]:
        """PP16: every known engine, sorted by key."""
        return self._table.snapshot()

    def drain_listener(
        self, callback: Callable[[DrainProgress], None] | None
    ) -> contextlib.AbstractContextManager[None]:
        """Tell ``callback`` how every drain goes while the block runs (NR1's progress)."""
        return self._room.listener(callback)

    # -- using an engine -----------------------------------------------------------------------

    def use(self, key: str, cause: str = "request") -> contextlib.AbstractAsyncContextManager[int]:
        """Hold ``key``'s engine for one request, building it (and making room) when needed.

        See :meth:`hostler.runtime.starts.Starter.use` (PP1: a draining engine takes no new
        work; while held, the engine is neither evicted nor idle-stopped).
        """
        return self._starter.use(key, cause)

    async def ensure(self, key: str, cause: str = "request") -> int:
        """PP1: ``key``'s engine running (built once however many ask); return its port."""
        return await self._starter.ensure(key, cause)

    async def price(self, key: str) -> Launch:
        """``key``'s next launch priced now, as a start would price it (preview; PP1)."""
        return await self._starter.price(key)

    # -- the operator's verbs ------------------------------------------------------------------

    async def unload_idle(self, key: str, why: dict[str, Any] | None = None) -> bool:
        """PP6: unload ``key`` now if it is idle; False when it is not resident.

        Raises:
            UsageError: It is pinned (PP17).
            EngineBusyError: It serves or waits on requests (no drain wait: a person asked).
        """
        return await self._unloader.unload_idle(key, why)

    async def release_idle(self) -> list[str]:
        """PP7: unload every idle engine; return the keys that were busy (left resident)."""
        return await self._unloader.release_idle()

    async def retire(self) -> None:
        """PP9: wait for builds, then evict every engine as its work ends (never cut a request)."""
        await self._unloader.retire()

    async def reconcile(self, targets: Mapping[str, int]) -> ReconcileReport:
        """PP10: hold exactly ``targets[model]`` replicas of each named ``engine:model``."""
        return await self._reconciler.reconcile(targets)
