"""``hostler.Runtime``: the embedding facade over the pool, router and host ledger.

It mirrors the seed's ``LocalEngineRuntime`` in Python naming: it owns engine lifetime,
admission and making room; it knows nothing of chats, tools or users. A program embeds it as::

    async with Runtime(store, build, ledger=ledger) as runtime:
        key = await runtime.bind("llamacpp", "qwen", session="chat-1")
        async with runtime.request(key) as port:
            ...  # talk to http://127.0.0.1:{port}

Leaving the block stops every engine it started, a build still in flight included (NR3).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import anyio

from hostler.capacity.pricing import LaunchPrice
from hostler.clock import Clock, ClockLike, as_clock
from hostler.drivers.host_ledger import HostLedger
from hostler.drivers.offloop import OffLoop
from hostler.engines.factory import EngineFactory
from hostler.engines.launcher import Launcher
from hostler.engines.price import PricedLaunch
from hostler.engines.roster import EngineRoster
from hostler.engines.supervisor import Supervisor
from hostler.errors import HostlerError, RuntimeClosedError, UsageError
from hostler.events.base import Event
from hostler.events.cache import CacheBudgetSet, cache_stream
from hostler.events.queue import QueueServed
from hostler.policies.eviction import DEFAULT_EVICTION_POLICY, EvictionPolicy
from hostler.policies.pool import DRAIN_WAIT
from hostler.policies.queue import Lane, engine_queue_caps
from hostler.runtime.arbiter import GpuArbiter, Release
from hostler.runtime.cache import CacheController, CacheStats
from hostler.runtime.details import EngineBytes, LedgerFold, last_reason
from hostler.runtime.gate import RequestGate
from hostler.runtime.health import DeviceHealthGate, HealthStatus
from hostler.runtime.pool import DRAIN_POLL, DrainProgress, EntryView, Pool, ReconcileReport
from hostler.runtime.queue import QueueSummary, RequestQueue
from hostler.runtime.router import Router
from hostler.runtime.slots import gpu_slot
from hostler.store.log import EventStore

__all__ = ["LaunchSummary", "Runtime", "RuntimeStatus"]

log = logging.getLogger(__name__)

#: How long a closing runtime waits for the requests still leaving (their servers finishing
#: them) before its last write of queue events (seconds): the HTTP server's graceful bound.
SETTLE_WAIT = 5.0


@dataclass(frozen=True, slots=True)
class LaunchSummary:
    """How a running engine was launched: its process, port and plan (safe facts only)."""

    key: str
    pid: int | None
    port: int | None
    ctx_per_slot: int | None
    slots: int | None
    kv_type: str | None


@dataclass(frozen=True, slots=True)
class RuntimeStatus:
    """A status snapshot that builds nothing and touches nothing (a peek).

    Attributes:
        engines: Every engine the runtime knows (PP16).
        sessions: Bound sessions per engine key.
        ledger: The host ledger's budget, limits and reservations (CB10), or None without one.
        closed: Whether the runtime takes no new work.
    """

    engines: tuple[EntryView, ...]
    sessions: Mapping[str, int]
    ledger: Mapping[str, Any] | None
    closed: bool


def _told(on_wait: Callable[[int], None]) -> Callable[[int], None]:
    """A caller's progress callback that may raise: its bug costs the display, not the request."""

    def tell(ahead: int) -> None:
        try:
            on_wait(ahead)
        except Exception:
            log.exception("hostler: a request's on_wait callback raised")

    return tell


class Runtime:
    """Engine lifetime, admission and routing for one daemon (or one embedding program).

    Args:
        store: The event log every decision is recorded in.
        build: Makes the supervisor of an engine key (once per key): a function, or an
            :class:`~hostler.engines.factory.EngineFactory` (the daemon's), whose
            ``launcher(key)`` :meth:`preview` then asks without building a supervisor.
        ledger: The host ledger that admits engines (None: no accounting).
        clock: The clock every part of the runtime reads (a wall-time callable: a system
            clock with that wall).
        offloop: Where blocking log and ledger work runs.
        drain_wait: How long a busy engine chosen to make room may finish its work (PP5).
        pinned: Engine keys kept resident (PP17).
        arbiter: The GPU arbiter (GA1–GA7); by default one in ``coexist`` mode with no health
            gate, so that nothing waits on a card nobody configured. Every request acquires
            its ``llm`` slot first (EG4), and every engine registers an evictor for it.
        cache: The prompt-cache controller (CC1–CC12); by default one with the 4 GiB
            default budget per engine. Each engine that offers a cache adapter (L16) is
            registered with it when it is launched; the budgets the log recorded
            (``cache.budget_set``) are restored into it when the runtime is entered.
        eviction: The order idle engines are given up in to make room (EV1; default
            demand-weighted LRU).
        roster: The daemon's engines (RD9: a stray sweep spares them): the one ``build``
            hands each supervisor as ``owned=roster.pids``; every supervisor the runtime
            makes is enlisted there. A supervisor built without ``owned`` never sweeps.
    """

    def __init__(
        self,
        store: EventStore,
        build: Callable[[str], Supervisor] | EngineFactory,
        *,
        ledger: HostLedger | None = None,
        clock: ClockLike = time.time,
        offloop: OffLoop | None = None,
        drain_wait: float = DRAIN_WAIT,
        drain_poll: float = DRAIN_POLL,
        pinned: Collection[str] = (),
        pin_interval: float = 1.0,
        arbiter: GpuArbiter | None = None,
        cache: CacheController | None = None,
        eviction: EvictionPolicy = DEFAULT_EVICTION_POLICY,
        roster: EngineRoster | None = None,
    ) -> None:
        self._io = offloop or OffLoop()
        self._clock = as_clock(clock)
        self.arbiter = arbiter or GpuArbiter("coexist", store=store, clock=self._clock)
        self._queues: dict[str, RequestQueue] = {}
        self._gates: dict[str, RequestGate] = {}
        self._unwritten: list[tuple[str, Event]] = []  # queue and cache events, written later
        self._in_flight = 0  # requests inside request(): their queue events end the log
        self._settled = anyio.Event()
        self.cache = cache or CacheController(
            clock=self._clock, record=lambda event: self._unwritten.append(("cache", event))
        )
        self._cached_pid: dict[str, int] = {}  # the process each registered cache adapter serves
        self.store = store
        self.ledger = ledger
        self._launcher: Callable[[str], Launcher | None] | None = (
            None if callable(build) else build.launcher
        )
        self.pool = Pool(
            store,
            build if callable(build) else build.supervisor,
            ledger=ledger,
            clock=self._clock,
            offloop=self._io,
            drain_wait=drain_wait,
            drain_poll=drain_poll,
            pinned=pinned,
            pin_interval=pin_interval,
            busy_hint=lambda key: key in self._queues and self._queues[key].busy,
            eviction=eviction,
            roster=roster,
            arbiter=self.arbiter,  # GA1, GA8: every engine's evictor, under its own slot
        )
        self.router = Router(self.pool, clock=self._clock, offloop=self._io)
        self._ledger_fold: LedgerFold | None = None  # reserved vs measured bytes, for ps

    async def __aenter__(self) -> Runtime:
        await self._restore_cache_budgets()
        await self.pool.__aenter__()
        self.pool.spawn(self._write_queue_events)
        self.pool.spawn(self.cache.run)  # CC8: the engines' own cache truth every 5 s
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        try:
            await self.pool.__aexit__(*exc_info)  # a cancelled caller's exit raises it again
        finally:
            with anyio.CancelScope(shield=True):
                # a request still leaving (its server finishing it, its engine now stopped)
                # records its end before the last write: the log holds every request's end
                if self._in_flight:
                    self._settled = anyio.Event()  # set by the last one out
                    with self._clock.move_on_after(SETTLE_WAIT):
                        await self._settled.wait()
                await self._flush_queue_events()

    async def _restore_cache_budgets(self) -> None:
        """CC3: the cache budgets the log recorded hold again; a restart resets none of them."""
        store = self.store

        def read() -> list[object]:
            found = store.read_all(types=[CacheBudgetSet.TYPE], stream_prefix=cache_stream(""))
            return [record.event for record in found if not record.damage]

        restored = self.cache.restore_budgets(await self._io.run_patiently(read))
        if restored:
            log.info("hostler: cache budgets restored from the log: %s", restored)

    async def _write_queue_events(self, every: float = 0.5) -> None:
        while True:
            await self._clock.sleep(every)
            await self._flush_queue_events()

    async def _flush_queue_events(self) -> None:
        """Write what the queues recorded, per engine stream, off the event loop."""
        batch, self._unwritten = self._unwritten, []
        if not batch:
            return
        store = self.store

        def write() -> None:
            streams: dict[str, list[Event]] = {}
            for key, event in batch:
                stream = f"cache/{getattr(event, 'key', key)}" if key == "cache" else f"queue/{key}"
                streams.setdefault(stream, []).append(event)
            for stream, events in streams.items():  # one stream's trouble is its own
                try:
                    store.append(stream, events, expected_version=None)
                except HostlerError as exc:  # history, not worth a request: said, dropped
                    log.warning(
                        "hostler: %d events of %s not recorded: %s",
                        len(events),
                        stream,
                        exc.message,
                    )

        await self._io.run(write)
        self._forget_stopped_caches()

    def _forget_stopped_caches(self) -> None:
        """A registered cache adapter whose process is gone is unregistered (its KV went too)."""
        for key, pid in list(self._cached_pid.items()):
            if self.pool.supervisor(key).pid != pid:
                del self._cached_pid[key]
                self.cache.unregister(key)

    async def close(self) -> None:
        """Stop every engine (a build in flight included) and take no new work (NR3, PP8)."""
        await self.pool.close()

    # -- looking (peeks: never build, never count as use) ----------------------------------------

    def status(self) -> RuntimeStatus:
        """Every engine, the sessions bound to each, and the ledger as last folded."""
        ledger = None
        if self.ledger is not None:
            ledger = {
                "committed": self.ledger.state.committed,
                "explicit_budget": self.ledger.state.explicit_budget,
                "spillover": self.ledger.state.spillover,
            }
        return RuntimeStatus(
            tuple(self.pool.snapshot()),
            dict(self.router.session_counts()),
            ledger,
            self.pool.closed,
        )

    def engine_status(self, key: str) -> EntryView | None:
        """One engine's snapshot, or None when the runtime does not know it."""
        return next((v for v in self.pool.snapshot() if v.key == key), None)

    async def engine_details(self) -> dict[str, dict[str, Any]]:
        """What ``hostler ps`` shows beyond :meth:`status`, per engine key (builds nothing).

        ``state_since`` (when it entered its state), ``idle_deadline`` (when the idle timeout
        stops it if nothing uses it; None when not running, pinned or never idle-stopped),
        ``last_reason`` (why it is in its state, from its latest lifecycle event),
        ``reserved_bytes`` and ``measured_bytes`` (what its reservation was admitted with and
        its measured footprint once ready; None without one), ``lease`` (the GPU lease held
        now: ``{"slot", "holder"}``, or None). The logs are read off the event loop.
        """
        pinned = self.pool.pinned
        facts: dict[str, dict[str, Any]] = {}
        for key in self.pool.engine_keys():
            sup = self.pool.supervisor(key)
            timeout = sup.rules.idle_timeout
            idle = sup.state == "running" and timeout > 0 and key not in pinned
            facts[key] = {
                "state_since": sup.engine.changed_at,
                "idle_deadline": sup.last_used + timeout if idle else None,
            }
        held = next((row for row in self.leases() if row["state"] == "held"), None)
        lease = None if held is None else {"slot": held["slot"], "holder": held["holder"]}
        ledger = self.ledger
        if ledger is not None and self._ledger_fold is None:
            self._ledger_fold = LedgerFold(ledger.owner)
        fold, store = self._ledger_fold, self.store

        def read() -> tuple[dict[str, str | None], dict[str, EngineBytes]]:
            reasons = {key: last_reason(store, key) for key in facts}
            held = {} if fold is None or ledger is None else fold.read(ledger.store)
            return reasons, held

        reasons, held_bytes = await self._io.run(read)
        for key, row in facts.items():
            bytes_ = held_bytes.get(key)
            row["last_reason"] = reasons.get(key)
            row["reserved_bytes"] = None if bytes_ is None else bytes_.reserved
            row["measured_bytes"] = None if bytes_ is None else bytes_.measured
            row["lease"] = lease
        return facts

    def launch_summaries(self) -> list[LaunchSummary]:
        """How each running engine was launched."""
        found = []
        for key in self.pool.engine_keys():
            sup = self.pool.supervisor(key)
            spec = sup.launch_spec
            if sup.pid is None:
                continue
            found.append(
                LaunchSummary(
                    key,
                    sup.pid,
                    sup.port,
                    spec.ctx_per_slot if spec else None,
                    spec.slots if spec else None,
                    spec.kv_type if spec else None,
                )
            )
        return found

    async def budget(self) -> dict[str, Any]:
        """The ledger's budget, limits and every reservation with its owner (fresh, CB10)."""
        ledger = self._need_ledger()
        snapshot: dict[str, Any] = await self._io.run(ledger.snapshot)
        return snapshot

    async def preview(self, key: str) -> LaunchPrice:
        """What starting ``key`` would plan and reserve now; starts and evicts nothing (NR6).

        The very price the next start of ``key`` takes: the launcher its supervisor prices
        every start with, asked the way the pool asks it before making room (an engine
        factory's launcher needs no supervisor built; a plain build function's does).
        """
        launcher = None if self._launcher is None else self._launcher(key)
        if launcher is None:
            launch = await self.pool.price(key)
        else:
            launch = await self._io.run(launcher.price)
        if not isinstance(launch, PricedLaunch):
            raise UsageError(
                f"{key[:140]}: its supervisor was built with a fixed spec and footprint, "
                "not a planned launch; there is no plan to show"
            )
        return launch.price

    def request_model(self, key: str) -> str | None:
        """RD10: the ``model`` field ``key``'s engine must be sent (None: the client's stands)."""
        return self.pool.supervisor(key).adapter.request_model

    @property
    def clock(self) -> Clock:
        """The clock every part of this runtime reads (the faces' "now" too)."""
        return self._clock

    def ledger_log(self) -> EventStore | None:
        """The host ledger's log when it is another file than the runtime's own log, else None."""
        ledger = self.ledger
        if ledger is None or ledger.store is self.store or ledger.store.name == self.store.name:
            return None
        return ledger.store

    # -- using engines ------------------------------------------------------------------------

    async def bind(
        self,
        engine: str,
        model: str,
        session: str,
        *,
        prior_key: str | None = None,
        on_drain_wait: Callable[[DrainProgress], None] | None = None,
    ) -> str:
        """Bind ``session`` to a replica of ``engine:model`` and have it running (ER2).

        ``on_drain_wait`` is told, about twice a second, how long a busy engine chosen to make
        room has been draining (NR1); cancelling the call stops the waiting, not the build
        other callers may share.
        """
        with self.pool.drain_listener(on_drain_wait):
            return await self.router.bind(engine, model, session, prior_key=prior_key)

    async def one_shot(self, engine: str, model: str) -> str:
        """A running replica of the model for a single call, else replica 0 started (ER3)."""
        return await self.router.one_shot(engine, model)

    async def place(self, engine: str, model: str, session: str | None = None) -> str:
        """The engine key that will serve one request for ``engine:model``; nothing started.

        A session keeps its replica (ER2) or gets the one with the fewest sessions (PP11,
        recorded); a call without one takes a running replica, else replica 0 (ER3). Hand
        the key to :meth:`request`: it takes its place in the queue first and starts the
        engine from there, so the log holds the request before the start made for it.
        """
        return await self.router.place(engine, model, session)

    @contextlib.asynccontextmanager
    async def request(
        self,
        key: str,
        *,
        lane: Lane = "interactive",
        session: str | None = None,
        group: str | None = None,
        ambient: bool = False,
        label: str | None = None,
        queue_timeout: float | None = None,
        on_wait: Callable[[int], None] | None = None,
        cause: str = "request",
    ) -> AsyncIterator[int]:
        """Hold ``key``'s engine for one request (started and made room for when needed).

        In order (EG4): the engine's request queue (lanes, affinity, the starvation bound,
        Q1–Q12; ``on_wait`` is told how many are ahead once it has waited 0.2 s), the GPU's
        ``llm`` slot, the engine itself (built, and room made, if needed), and the physical
        gate as wide as its launched slots (EG1). An engine whose adapter names another GPU
        slot (``gpu_slot = "image"``) takes that slot's exclusive lease first, before the
        queue, and holds it until the request is over, the queue slot given back (GA8).
        Yields the engine's loopback port. While held the engine is busy: never evicted,
        never idle-stopped, and a drain waits for it. ``cause`` is what a start made for it
        records (``engine.start_requested``): ``request``, or ``session``/``one-shot`` for a
        key from :meth:`place`.

        Raises:
            QueueTimeoutError: No slot within ``queue_timeout`` seconds; nothing ran.
            QueueCancelledError: An operator cancelled it while queued.
        """
        if self.pool.closed:
            raise RuntimeClosedError("the runtime is closed; it takes no request")
        if lane not in ("interactive", "background"):
            raise UsageError(
                f"a request's lane is interactive or background, not {str(lane)[:20]!r}"
            )
        if queue_timeout is not None and (
            type(queue_timeout) not in (int, float) or math.isnan(queue_timeout)
        ):
            raise UsageError(
                f"queue_timeout is a number of seconds, not {str(queue_timeout)[:20]!r}"
            )
        self.pool.supervisor(key)  # an engine this runtime can build, or its error: no queue made
        queue = self._queue(key)
        queued = queue.acquire(
            lane=lane,
            session_id=session,
            group=group,
            ambient=ambient,
            label=label,
            queue_timeout=queue_timeout,
            on_wait=None if on_wait is None else _told(on_wait),
        )
        # GA8: image/video work takes its lease first and lets it go last, after its queue slot,
        # so that the slot it hands the card to finds the engine idle and can unload it (GA2);
        # llm work takes its place in the queue, then the GPU slot. Then the engine.
        slot = gpu_slot(self.pool.supervisor(key))
        self._in_flight += 1
        try:
            async with (
                self._lease(slot, key),
                queued as ticket,
                self._acquire(slot),
                self._arrival_written(key),
                self.pool.use(key, cause) as port,
            ):
                self._fit_width(key)
                self._fit_cache(key)
                async with self._gates[key].slot():
                    now = self._clock.wall()
                    waited = round(now - ticket.enqueued_at, 6)
                    served = QueueServed(key, ticket.id, ticket.lane, waited, round(now, 6))
                    self._unwritten.append((key, served))  # the client's whole wait (PM23)
                    yield port
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._settled.set()

    @contextlib.asynccontextmanager
    async def _arrival_written(self, key: str) -> AsyncIterator[None]:
        """Before a start made for a request, its arrival is in the log (PM21).

        Queue events are written in batches (every 0.5 s); a request about to start its
        engine has its own written first, so ``queue.enqueued`` precedes the
        ``engine.start_requested`` made for it in the log's order too. A request for a running
        engine writes nothing here (the hot path stays one batch).
        """
        if not self.pool.resident(key):
            await self._flush_queue_events()
        yield

    @contextlib.asynccontextmanager
    async def _lease(self, slot: str, key: str) -> AsyncIterator[None]:
        """GA8/I4: the exclusive lease of an ``image``/``video`` request, held for all of it.

        Taken before the engine is started; released, shielded from cancellation, however the
        request ends. ``llm`` work holds no lease (nothing happens here).
        """
        if slot == "llm":
            yield
            return
        release = await self.arbiter.acquire_lease(slot, key)
        try:
            yield
        finally:
            with anyio.CancelScope(shield=True):
                await release()

    @contextlib.asynccontextmanager
    async def _acquire(self, slot: str) -> AsyncIterator[None]:
        """GA2: an ``llm`` request's plain acquire of its slot (lease slots: nothing more)."""
        if slot == "llm":
            await self.arbiter.acquire("llm")
        yield

    def _queue(self, key: str) -> RequestQueue:
        queue = self._queues.get(key)
        if queue is None:
            # the runtime's clock: a request's times in the log line up with the engine, pool
            # and ledger events (post-mortem, PM)
            queue = RequestQueue.for_engine(
                key,
                1,
                record=lambda event: self._unwritten.append((key, event)),
                clock=self._clock,
            )
            self._queues[key] = queue
            self._gates[key] = RequestGate(1)
        return queue

    def _fit_width(self, key: str) -> None:
        """PP14: the queue and the gate as wide as the engine's launched slot count."""
        spec = self.pool.supervisor(key).launch_spec
        width = spec.slots if spec is not None else 1
        gate = self._gates[key]
        if gate.width != width:
            gate.set_width(width)
            caps = engine_queue_caps(width)
            self._queues[key].set_width(
                caps.width, interactive_cap=caps.interactive, background_cap=caps.background
            )

    def _fit_cache(self, key: str) -> None:
        """L16: the cache adapter of the process now serving ``key``, registered once per launch."""
        sup = self.pool.supervisor(key)
        spec, pid = sup.launch_spec, sup.pid
        if spec is None or pid is None or self._cached_pid.get(key) == pid:
            return
        self._cached_pid[key] = pid
        try:
            adapter = sup.adapter.cache_adapter(spec)
        except Exception:  # a plugin's bug costs the cache, never the request
            log.exception("hostler: %s: its plugin's cache_adapter raised", key)
            adapter = None
        if adapter is None:
            self.cache.unregister(key)
        else:
            self.cache.register(key, adapter)  # CC2: a new process starts with a clean slate

    # -- owning engines (the daemon that composed this runtime) ------------------------------

    def supervisor(self, key: str) -> Supervisor:
        """``key``'s supervisor, built by the runtime's factory on first use (starts nothing)."""
        return self.pool.supervisor(key)

    def supervisors(self) -> dict[str, Supervisor]:
        """Every engine this runtime built, by key."""
        return {key: self.pool.supervisor(key) for key in self.pool.engine_keys()}

    async def start(self, key: str, cause: str = "request") -> int:
        """``key``'s engine running (room made like any start); its port (PP1)."""
        return await self.pool.ensure(key, cause=cause)

    def on_stopping(self, listener: Callable[[int], Awaitable[None]]) -> None:
        """Call ``listener(port)`` just before an engine listening on ``port`` is stopped."""
        self.pool.on_stopping(listener)

    # -- the prompt cache (CC1-CC12) -------------------------------------------------------------

    def cache_extras(self, key: str, session: str) -> dict[str, Any]:
        """The request fields that keep ``session`` on its cache slot (L16's ``id_slot``)."""
        return self.cache.request_extras(key, session)

    def cache_stats(self, key: str) -> CacheStats | None:
        """CC10: ``key``'s cache use, budget, hit rate and sources; None when not registered."""
        self._forget_stopped_caches()
        return self.cache.stats(key)

    async def evict_session(self, session: str) -> None:
        """CC5: drop a session's cached prompt from every engine that holds it."""
        await self.cache.invalidate(session)

    async def clear_cache(self, key: str) -> None:
        """CC6: drop every cached prompt of one engine."""
        await self.cache.invalidate_engine(key)

    async def set_cache_budget(self, key: str, budget: int) -> None:
        """CC3: ``key``'s cache budget in bytes, enforced at once (evicting to 80 %)."""
        if type(budget) is not int or budget < 0:
            raise UsageError(f"a cache budget is a number of bytes, not {budget!r}"[:120])
        await self.cache.set_budget(key, budget)

    def queues(self) -> dict[str, QueueSummary]:
        """Q9/PP14: every engine's queue — what runs, what waits, positions, the live width.

        Every running engine has one, asked or not, at the width it was launched with.
        """
        for view in self.pool.snapshot():
            if view.state == "running":
                self._queue(view.key)
                self._fit_width(view.key)
        return {key: queue.describe() for key, queue in sorted(self._queues.items())}

    def cancel(self, key: str, request_id: int) -> bool:
        """Q7: cancel a queued request of ``key``'s queue; False when it is not queued."""
        queue = self._queues.get(key)
        return queue is not None and queue.cancel(request_id)

    def move(self, key: str, request_id: int, direction: str) -> bool:
        """Q8: move a queued request up or down its lane; False at an edge or unknown."""
        if direction not in ("up", "down"):
            raise UsageError(f"a queued request moves up or down, not {str(direction)[:20]!r}")
        queue = self._queues.get(key)
        return queue is not None and queue.move(request_id, direction)  # type: ignore[arg-type]

    # -- the GPU ---------------------------------------------------------------------------------

    async def acquire_lease(self, slot: str, holder: str) -> Release:
        """An exclusive GPU lease for a long job (GA3); call the returned release when done.

        In ``swap`` mode it waits for any other lease (breaking one held past the 90-minute
        ceiling, GA4) and evicts the other slots' engines; in ``coexist`` it only runs the
        device health gate.
        """
        return await self.arbiter.acquire_lease(slot, holder)

    async def acquire_lease_with_id(self, slot: str, holder: str) -> tuple[str | None, Release]:
        """:meth:`acquire_lease`, and the lease's id as :meth:`leases` lists it (None: coexist)."""
        return await self.arbiter.acquire_lease_with_id(slot, holder)

    def leases(self) -> list[dict[str, Any]]:
        """The lease held and the leases waiting, with their holders and ages."""
        return self.arbiter.leases()

    def set_gpu_policy(self, policy: str) -> None:
        """``swap``, ``coexist`` or ``auto``, live (GA5): a flip to coexist wakes waiters."""
        self.arbiter.set_policy(policy)

    async def device_health(self) -> HealthStatus | None:
        """The device health gate's status (DH5), or None when no gate is configured."""
        gate: DeviceHealthGate | None = self.arbiter.health_gate
        return None if gate is None else await gate.status()

    async def unload(self, key: str) -> bool:
        """Unload an idle engine now (PP6); False when not resident; EngineBusy when busy."""
        return await self.pool.unload_idle(key)

    async def release_idle(self) -> list[str]:
        """Unload every idle engine (NR4: a live reset); returns the busy keys left resident."""
        return await self.pool.release_idle()

    async def reconcile(self, targets: Mapping[str, int]) -> ReconcileReport:
        """Hold ``targets[engine:model]`` replicas of each named model (PP10)."""
        return await self.pool.reconcile(targets)

    # -- the memory budget, live -----------------------------------------------------------------

    async def set_budget(self, budget: int | None) -> None:
        """An explicit budget in bytes, or None for the automatic one; never evicts (CB2)."""
        ledger = self._need_ledger()
        if budget is not None and (type(budget) is not int or budget < 0):
            raise UsageError(f"a budget is a number of bytes, not {budget!r}")
        await self._io.run(ledger.set_budget, budget)

    async def set_spillover(self, allowed: bool | None) -> None:
        """Allow or forbid RAM spillover, or back to automatic (None); never evicts (CB3)."""
        ledger = self._need_ledger()
        await self._io.run(ledger.set_spillover, allowed)

    def _need_ledger(self) -> HostLedger:
        if self.ledger is None:
            raise UsageError("this runtime keeps no memory ledger")
        return self.ledger
