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
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping

import anyio

from hostler.clock import Clock, ClockLike, as_clock
from hostler.drivers.host_ledger import HostLedger
from hostler.drivers.offloop import OffLoop
from hostler.engines.factory import EngineFactory
from hostler.engines.roster import EngineRoster
from hostler.engines.supervisor import Supervisor
from hostler.policies.eviction import DEFAULT_EVICTION_POLICY, EvictionPolicy
from hostler.policies.pool import DRAIN_WAIT
from hostler.policies.queue import Lane
from hostler.runtime.arbiter import GpuArbiter
from hostler.runtime.cache import CacheController
from hostler.runtime.lanes import EngineLanes
from hostler.runtime.memory import MemoryFace
from hostler.runtime.pool import DRAIN_POLL, DrainProgress, Pool, ReconcileReport
from hostler.runtime.prompt_caches import PromptCaches
from hostler.runtime.queue import QueueSummary
from hostler.runtime.report import EngineReport, LaunchSummary, RuntimeStatus
from hostler.runtime.request_path import Held, RequestPath
from hostler.runtime.router import Router
from hostler.runtime.writer import QueueEventWriter
from hostler.store.log import EventStore

__all__ = ["LaunchSummary", "Runtime", "RuntimeStatus"]

#: How long a closing runtime waits for the requests still leaving (their servers finishing
#: them) before its last write of queue events (seconds): the HTTP server's graceful bound.
SETTLE_WAIT = 5.0


#: How long a request that found its engine not answering waits for the engine's exit.
ENGINE_EXIT_WAIT = 1.0


class Runtime:
    """Engine lifetime, admission and routing for one daemon (or one embedding program).

    The runtime is composed once, here, of parts each face may ask directly:
    :attr:`arbiter` (GPU leases and policy, GA1–GA8), :attr:`caches` (the prompt caches'
    stats, invalidation and budgets, CC1–CC12), :attr:`memory` (the ledger's budget and
    spillover, start previews, NR6) and :attr:`report` (what status and ``hostler ps`` show,
    device health); the requests, bindings and engine ownership are its own methods.

    Args:
        store: The event log every decision is recorded in.
        build: Makes the supervisor of an engine key (once per key): a function, or an
            :class:`~hostler.engines.factory.EngineFactory` (the daemon's), whose
            ``launcher(key)`` a preview then asks without building a supervisor.
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
        io = offloop or OffLoop()
        self._clock = as_clock(clock)
        self.store = store
        self.ledger = ledger
        self.arbiter = arbiter or GpuArbiter("coexist", store=store, clock=self._clock)
        self._writer = QueueEventWriter(store, io)  # queue and cache events, written later
        self.cache = cache or CacheController(clock=self._clock, record=self._writer.record_cache)
        self._lanes = EngineLanes(self._writer, self._clock)
        self.pool = Pool(
            store,
            build if callable(build) else build.supervisor,
            ledger=ledger,
            clock=self._clock,
            offloop=io,
            drain_wait=drain_wait,
            drain_poll=drain_poll,
            pinned=pinned,
            pin_interval=pin_interval,
            busy_hint=self._lanes.busy,
            eviction=eviction,
            roster=roster,
            arbiter=self.arbiter,  # GA1, GA8: every engine's evictor, under its own slot
        )
        self.router = Router(self.pool, clock=self._clock, offloop=io)
        #: the prompt caches: registered per launch, and the operator's verbs (CC1–CC12)
        self.caches = PromptCaches(self.cache, self.pool, store, io)
        #: the memory budget, live, and start previews (CB2, CB3, CB10, NR6)
        self.memory = MemoryFace(
            ledger, store, io, self.pool, None if callable(build) else build.launcher
        )
        #: what status, ``hostler ps`` and the operator's face show (PP16, DH5)
        self.report = EngineReport(
            self.pool, self.router, ledger, arbiter=self.arbiter, store=store, offloop=io
        )
        self._requests = RequestPath(
            self.pool,
            self._lanes,
            self.caches,
            arbiter=self.arbiter,
            writer=self._writer,
            clock=self._clock,
        )

    async def __aenter__(self) -> Runtime:
        await self.caches.restore()
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
                await self._requests.settle(SETTLE_WAIT)
                await self._writer.flush()
                await self.caches.forget_stopped()

    async def _write_queue_events(self, every: float = 0.5) -> None:
        while True:
            await self._clock.sleep(every)
            await self._writer.flush()
            await self.caches.forget_stopped()

    def stop_taking_work(self) -> None:
        """Refuse new work (``shutting-down``) from now on; engines are stopped by the caller."""
        self.pool.stop_taking_work()

    async def close(self) -> None:
        """Stop every engine (a build in flight included) and take no new work (NR3, PP8)."""
        await self.pool.close()

    @property
    def closing(self) -> bool:
        """Whether the runtime takes no new work (it is shutting down, or shut down)."""
        return self.pool.closed

    @property
    def clock(self) -> Clock:
        """The clock every part of this runtime reads (the faces' "now" too)."""
        return self._clock

    # -- looking (peeks: never build, never count as use) ----------------------------------------

    def status(self) -> RuntimeStatus:
        """Every engine, the sessions bound to each, and the ledger as last folded."""
        return self.report.status()

    def request_model(self, key: str) -> str | None:
        """RD10: the ``model`` field ``key``'s engine must be sent (None: the client's stands)."""
        return self.report.request_model(key)

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

    def request(
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
    ) -> contextlib.AbstractAsyncContextManager[int]:
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
        key from :meth:`place`. A ``session``'s prompt cache is made ready as :meth:`hold`
        says; the fields that keep it are :meth:`hold`'s to hand out.

        Raises:
            QueueTimeoutError: No slot within ``queue_timeout`` seconds; nothing ran.
            QueueCancelledError: An operator cancelled it while queued.
        """
        held = self.hold(
            key,
            lane=lane,
            session=session,
            group=group,
            ambient=ambient,
            label=label,
            queue_timeout=queue_timeout,
            on_wait=on_wait,
            cause=cause,
        )
        return _port_of(held)

    def hold(
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
        prompt_cache: bool = True,
    ) -> contextlib.AbstractAsyncContextManager[Held]:
        """:meth:`request`, yielding the engine :class:`Held` (its port, a session's cache).

        A ``session`` on an engine whose plugin has a prompt cache is bound to a slot of it
        and, when the engine does not hold its cache (it was evicted, restarted, or another
        session took the slot), restored from the session's file before its turn runs;
        ``Held.fields`` are what the request body must carry to use it. After the answer,
        hand what the engine said it read to ``caches.finish``. ``prompt_cache`` False (an
        embedding) leaves the session's cache alone.
        """
        return self._requests.request(
            key,
            lane=lane,
            session=session,
            group=group,
            ambient=ambient,
            label=label,
            queue_timeout=queue_timeout,
            on_wait=on_wait,
            cause=cause,
            prompt_cache=prompt_cache,
        )

    def queues(self) -> dict[str, QueueSummary]:
        """Q9/PP14: every engine's queue — what runs, what waits, positions, the live width.

        Every running engine has one, asked or not, at the width it was launched with.
        """
        for view in self.pool.snapshot():
            if view.state == "running":
                self._lanes.fit(view.key, self.pool.supervisor(view.key).launch_spec)
        return self._lanes.describe()

    def cancel(self, key: str, request_id: int) -> bool:
        """Q7: cancel a queued request of ``key``'s queue; False when it is not queued."""
        return self._lanes.cancel(key, request_id)

    def move(self, key: str, request_id: int, direction: str) -> bool:
        """Q8: move a queued request up or down its lane; False at an edge or unknown."""
        return self._lanes.move(key, request_id, direction)

    # -- owning engines (the daemon that composed this runtime) ------------------------------

    def supervisor(self, key: str) -> Supervisor:
        """``key``'s supervisor, built by the runtime's factory on first use (starts nothing)."""
        return self.pool.supervisor(key)

    async def engine_lost(self, key: str) -> bool:
        """A request found ``key``'s engine not answering: whether its process is gone.

        Waits up to a second for an exit under way, and records the crash at once (the watch
        would at its next tick), so that the next request for it starts it again.
        """
        return await self.pool.supervisor(key).confirm_exit(ENGINE_EXIT_WAIT)

    def supervisors(self) -> dict[str, Supervisor]:
        """Every engine this runtime built, by key."""
        return {key: self.pool.supervisor(key) for key in self.pool.engine_keys()}

    async def start(self, key: str, cause: str = "request") -> int:
        """``key``'s engine running (room made like any start); its port (PP1)."""
        return await self.pool.ensure(key, cause=cause)

    def on_stopping(self, listener: Callable[[int], Awaitable[None]]) -> None:
        """Call ``listener(port)`` just before an engine listening on ``port`` is stopped."""
        self.pool.on_stopping(listener)

    async def unload(self, key: str) -> bool:
        """Unload an idle engine now (PP6); False when not resident; EngineBusy when busy."""
        return await self.pool.unload_idle(key)

    async def release_idle(self) -> list[str]:
        """Unload every idle engine (NR4: a live reset); returns the busy keys left resident."""
        return await self.pool.release_idle()

    async def reconcile(self, targets: Mapping[str, int]) -> ReconcileReport:
        """Hold ``targets[engine:model]`` replicas of each named model (PP10)."""
        return await self.pool.reconcile(targets)


@contextlib.asynccontextmanager
async def _port_of(held: contextlib.AbstractAsyncContextManager[Held]) -> AsyncIterator[int]:
    async with held as it:
        yield it.port
