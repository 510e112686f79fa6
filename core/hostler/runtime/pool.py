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
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
)
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskGroup

from hostler.capacity.keys import parse_key
from hostler.capacity.ledger import shortfall as ledger_shortfall
from hostler.clock import ClockLike, as_clock
from hostler.drivers.host_ledger import HostLedger
from hostler.drivers.offloop import OffLoop
from hostler.engines.launcher import Launch
from hostler.engines.supervisor import Supervisor
from hostler.errors import (
    CapacityDeniedError,
    EngineBusyError,
    HostlerError,
    RuntimeClosedError,
    StartAbandonedError,
    UsageError,
)
from hostler.events.base import Event
from hostler.events.pool import (
    POOL_STREAM,
    PoolDrainEnded,
    PoolDrainStarted,
    PoolRoomPlanned,
)
from hostler.machines.engine import EngineState, StopReason
from hostler.machines.pins import PinKeeper, pin_blocked
from hostler.plugin import Progress
from hostler.policies.eviction import DEFAULT_EVICTION_POLICY, EvictionPolicy
from hostler.policies.pool import (
    DRAIN_WAIT,
    PoolEntry,
    demand,
    drain_step,
    touch,
)
from hostler.policies.room import RoomSearch, Standing, room_step, start_share
from hostler.store.log import EventStore

__all__ = ["DRAIN_POLL", "DrainProgress", "EntryView", "Pool", "ReconcileReport"]

log = logging.getLogger(__name__)

#: How often a draining victim is looked at (seconds; the seed's 500 ms).
DRAIN_POLL = 0.5
#: The most replicas one model may be reconciled to (a typo, not a wish, past it).
MAX_REPLICAS = 64

_UP = (EngineState.STARTING, EngineState.RUNNING)


@dataclass(frozen=True, slots=True)
class EntryView:
    """One engine the pool knows, as a status snapshot shows it (PP16)."""

    key: str
    state: str
    bytes: int
    last_used_at: float
    recent_hits: int
    busy: bool
    draining: bool
    pinned: bool
    port: int | None
    pid: int | None
    progress: Progress | None = None  # PG1: the current job's, while busy


@dataclass(frozen=True, slots=True)
class DrainProgress:
    """A busy engine chosen to make room is still draining (told to drain listeners).

    Attributes:
        key: The draining engine.
        for_key: The engine the room is for (None for an unload or a reconcile).
        waited: Seconds since the drain began.
        limit: Seconds it may take before the eviction gives up (PP5).
    """

    key: str
    for_key: str | None
    waited: float
    limit: float


@dataclass(frozen=True, slots=True)
class ReconcileReport:
    """What a reconcile did (PP10): engines evicted, started, and those that failed (why)."""

    evicted: tuple[str, ...]
    started: tuple[str, ...]
    failed: Mapping[str, str]


class _Flight:
    """One build of one key that every concurrent caller waits on (PP1)."""

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.port: int | None = None
        self.error: BaseException | None = None

    async def wait(self) -> int:
        await self.done.wait()
        if self.error is not None:
            raise self.error
        assert self.port is not None  # noqa: S101 - set before done
        return self.port


@dataclass
class _Entry:
    supervisor: Supervisor
    last_used_at: float
    hits: tuple[float, ...] = ()
    in_use: int = 0  # requests past the drain gate (using it or about to)
    waiting: int = 0  # callers waiting for it to be built or to end a drain
    draining: bool = False
    drained: anyio.Event = field(default_factory=anyio.Event)
    flight: _Flight | None = None


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
    ) -> None:
        self.store = store
        self.eviction = eviction
        self._build_supervisor = build
        self._stopping: list[Callable[[int], Awaitable[None]]] = []
        self.ledger = ledger
        self._clock = as_clock(clock)
        self._io = offloop or OffLoop()
        self.drain_wait = drain_wait
        self.drain_poll = drain_poll
        self._busy_hint = busy_hint
        self.pinned = frozenset(pinned)
        self.pin_interval = pin_interval
        self._entries: dict[str, _Entry] = {}
        self._admission = anyio.Lock()  # one make-room at a time: two never free the same bytes
        self._tg: TaskGroup | None = None
        # each background task runs in a scope of its own, which close() cancels: cancelling
        # the task group's scope would cancel the caller's own block, entered in its task
        self._scopes: set[anyio.CancelScope] = set()
        self._closed = False
        self._drain_listeners: list[Callable[[DrainProgress], None]] = []
        self._protected: set[str] = set()  # replicas a reconcile is building
        self._pins = PinKeeper(pin_interval)  # PP17: the pins' retries and their trouble

    # -- lifetime ------------------------------------------------------------------------------

    async def __aenter__(self) -> Pool:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        for entry in self._entries.values():  # made before the pool was entered
            self._start(entry.supervisor.watch)
        if self.pinned:
            self._start(self._keep_pinned)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
        tg, self._tg = self._tg, None
        if tg is not None:
            await tg.__aexit__(*exc_info)  # type: ignore[arg-type]

    def spawn(self, func: Callable[[], Coroutine[Any, Any, object]]) -> None:
        """Run ``func`` in the pool's task group: it is cancelled when the pool closes."""
        if self._tg is None or self._closed:
            raise RuntimeClosedError("the pool is not entered (use `async with`), or closed")
        self._start(func)

    def _start(self, func: Callable[..., Coroutine[Any, Any, object]], *args: object) -> None:
        """Run ``func(*args)`` in the task group, in a cancel scope of its own (see close)."""
        assert self._tg is not None  # noqa: S101 - callers check

        async def scoped() -> None:
            with anyio.CancelScope() as scope:
                self._scopes.add(scope)
                if self._closed:
                    scope.cancel()
                try:
                    await func(*args)
                finally:
                    self._scopes.discard(scope)

        self._tg.start_soon(scoped)

    @property
    def closed(self) -> bool:
        """Whether the pool takes no new work (closing or closed)."""
        return self._closed

    async def close(self, cause: str = StopReason.SHUTDOWN) -> None:
        """PP8: take no new work, cancel builds in flight, stop every engine; idempotent.

        A build in flight is cancelled, which kills its process group and records the stop
        (``start-cancelled``, SG1); every running engine is stopped (reason ``shutdown``),
        recorded when the log takes it and stopped all the same when it does not (SF2).
        """
        self._closed = True
        for scope in list(self._scopes):  # builds, watches, the pin keeper; not the caller
            scope.cancel()
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as stops:
                for entry in self._entries.values():
                    stops.start_soon(self._stop_for_close, entry.supervisor, str(cause))

    def on_stopping(self, listener: Callable[[int], Awaitable[None]]) -> None:
        """Call ``listener(port)`` just before the pool stops an engine listening on ``port``.

        The HTTP face drops its kept-alive connections to that port here: ``llama-server``
        waits on open connections before it exits (≈ 100 ms a stop), which a swap would pay.
        """
        self._stopping.append(listener)

    async def _tell_stopping(self, supervisor: Supervisor) -> None:
        port = supervisor.port
        if port is None:
            return
        for listener in self._stopping:
            try:
                with anyio.CancelScope(shield=True):
                    await listener(port)
            except Exception:  # a listener's trouble never keeps an engine from stopping
                log.exception("hostler: a stop listener failed for %s", supervisor.key)

    async def _stop_for_close(self, supervisor: Supervisor, cause: str) -> None:
        await self._tell_stopping(supervisor)
        try:
            await supervisor.stop(cause, unrecorded_ok=True)
        except HostlerError as exc:
            log.error("hostler: %s: %s", supervisor.key, exc.message)  # noqa: TRY400
        if supervisor.pid is not None:
            await supervisor.kill_unrecorded()

    def _check_open(self) -> None:
        if self._closed or self._tg is None:
            raise RuntimeClosedError(
                "the runtime is closed (or was never entered with `async with`); "
                "it starts no engine and takes no request"
            )

    # -- what others read ----------------------------------------------------------------------

    def supervisor(self, key: str) -> Supervisor:
        """The supervisor of ``key``, made on first use (building nothing)."""
        entry = self._entries.get(key)
        if entry is None:
            entry = _Entry(self._build_supervisor(key), last_used_at=self._clock.wall())
            if entry.supervisor.owned is None:  # RD9: a sweep spares every engine of ours
                entry.supervisor.owned = self.live_pids
            self._entries[key] = entry
            if self._tg is not None and not self._closed:
                self._start(entry.supervisor.watch)
        return entry.supervisor

    def live_pids(self) -> list[int]:
        """The process ids of every engine the pool's supervisors hold now (RD9: never swept)."""
        return [pid for e in self._entries.values() if (pid := e.supervisor.pid) is not None]

    def engine_keys(self) -> list[str]:
        """Every engine key the pool knows, sorted."""
        return sorted(self._entries)

    def resident(self, key: str) -> bool:
        """Whether ``key`` runs (or is starting) and is not on its way out."""
        entry = self._entries.get(key)
        return entry is not None and entry.supervisor.state in _UP and not entry.draining

    def peek(self, engine: str, model: str) -> list[str]:
        """PP12: the running, non-draining replicas of a model, most recently used first.

        Builds nothing and does not count as use.
        """
        found = []
        for key, entry in self._entries.items():
            parsed = parse_key(key)
            if parsed is None or (parsed.engine, parsed.model) != (engine, model):
                continue
            if entry.supervisor.state == EngineState.RUNNING and not entry.draining:
                found.append((entry.last_used_at, key))
        return [key for _, key in sorted(found, key=lambda f: (-f[0], f[1]))]

    def busy(self, key: str) -> bool:
        """Whether ``key`` serves or waits on requests (the pool's busy, PP4)."""
        entry = self._entries.get(key)
        return entry is not None and self._busy(key, entry, queued=True)

    def _busy(self, key: str, entry: _Entry, *, queued: bool) -> bool:
        if entry.supervisor.busy or entry.in_use > 0 or entry.flight is not None:
            return True
        return queued and self._busy_hint is not None and self._busy_hint(key)

    def snapshot(self) -> list[EntryView]:
        """PP16: every known engine, sorted by key."""
        now = self._clock.wall()
        views = []
        for key in sorted(self._entries):
            entry = self._entries[key]
            sup = entry.supervisor
            views.append(
                EntryView(
                    key=key,
                    state=str(sup.state),
                    bytes=self._held_cached(key),
                    last_used_at=entry.last_used_at,
                    recent_hits=demand(self._as_policy(key, entry, 0), now),
                    busy=self._busy(key, entry, queued=True),
                    draining=entry.draining,
                    pinned=key in self.pinned,
                    port=sup.port,
                    pid=sup.pid,
                    progress=sup.progress,
                )
            )
        return views

    def _held_cached(self, key: str) -> int:
        """What this daemon holds for ``key`` in the ledger as last folded (no I/O)."""
        if self.ledger is None:
            return 0
        held = self.ledger.state.held(self.ledger.owner, key)
        return held.bytes if held is not None else 0

    @contextlib.contextmanager
    def drain_listener(self, callback: Callable[[DrainProgress], None] | None) -> Iterator[None]:
        """Tell ``callback`` how every drain goes while the block runs (NR1's progress)."""
        if callback is None:
            yield
            return
        self._drain_listeners.append(callback)
        try:
            yield
        finally:
            self._drain_listeners.remove(callback)

    def _tell_drain(self, progress: DrainProgress) -> None:
        for listener in list(self._drain_listeners):
            try:
                listener(progress)
            except Exception:  # a caller's progress display never breaks a drain
                log.exception("hostler: a drain progress listener raised")

    # -- using an engine -----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def use(self, key: str, cause: str = "request") -> AsyncIterator[int]:
        """Hold ``key``'s engine for one request, building it (and making room) when needed.

        Waits while it drains (PP1: a draining engine takes no new work); while held, the
        engine counts as busy, so it is neither evicted nor idle-stopped under the request.

        Raises:
            RuntimeClosedError: The pool is closing.
            CapacityDeniedError: It cannot fit, even after evicting what could go.
            EngineBusyError: Room had to be drained from a busy engine that did not finish.
            EngineStartError, RestartBudgetError, PluginError: From its supervisor.
        """
        self._check_open()
        entry = await self._handed_out(key, cause)
        entry.in_use += 1  # no await since it was found running and not draining
        try:
            async with entry.supervisor.request() as port:
                yield port
        finally:
            entry.in_use -= 1
            entry.last_used_at = self._clock.wall()

    async def ensure(self, key: str, cause: str = "request") -> int:
        """PP1: ``key``'s engine running (built once however many ask); return its port."""
        self._check_open()
        entry = await self._handed_out(key, cause)
        port = entry.supervisor.port
        assert port is not None  # noqa: S101 - handed out running
        return port

    async def _handed_out(self, key: str, cause: str) -> _Entry:
        """PP1: the entry once its engine runs and does not drain, built (once) if need be.

        A build that ends while its engine has been chosen to drain is not handed out: its
        waiters wait for the drain like everyone else, then use it or build it again.
        """
        self.supervisor(key)
        entry = self._entries[key]
        now = self._clock.wall()
        touched = touch(self._as_policy(key, entry, 0), now)
        entry.hits, entry.last_used_at = touched.hits, now
        entry.waiting += 1  # until handed out: the caller increments in_use with no await
        try:
            while True:
                while entry.draining:
                    await entry.drained.wait()
                    self._check_open()
                sup = entry.supervisor
                if sup.state == EngineState.RUNNING and sup.port is not None and not entry.flight:
                    return entry
                flight = entry.flight
                if flight is None:
                    self._check_open()
                    flight = entry.flight = _Flight()
                    self._start(self._build, key, entry, flight, cause)
                await flight.wait()
        finally:
            entry.waiting -= 1

    async def _build(self, key: str, entry: _Entry, flight: _Flight, cause: str) -> None:
        try:
            flight.port = await self._admit_and_start(key, entry, cause)
        except anyio.get_cancelled_exc_class():
            flight.error = RuntimeClosedError(f"{key}: not started: the runtime is closing")
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to every waiter, who raises it
            flight.error = exc
        finally:
            entry.flight = None
            flight.done.set()

    async def _admit_and_start(self, key: str, entry: _Entry, cause: str) -> int:
        """Make room and reserve as one step under the admission lock, then load unlocked.

        The lock is let go as soon as the ledger holds the engine's footprint (or the start
        ends first), so no other start can plan with room this one is about to take.
        """
        for attempt in range(2):
            await self._admission.acquire()
            held = True
            hopeless: str | None = None

            def reserved() -> None:
                nonlocal held
                if held:
                    held = False
                    self._admission.release()

            try:
                launch = await self._price(entry.supervisor)
                hopeless = None if launch is None else await self._make_room(key, launch)
                return await entry.supervisor.ensure_running(
                    cause, on_reserved=reserved, launch=launch
                )
            except CapacityDeniedError as exc:
                if hopeless is not None:  # the ledger refused it, recorded: say why in full
                    raise CapacityDeniedError(f"{hopeless} (the ledger: {exc.message})") from None
                if attempt:
                    raise
                # another daemon took the room between our plan and our reservation: once more
            finally:
                reserved()
        raise AssertionError("unreachable")  # pragma: no cover

    # -- making room ---------------------------------------------------------------------------

    async def _price(self, supervisor: Supervisor) -> Launch | None:
        """This start's one price (blocking work, off the loop); None when pricing failed.

        A price that raised is not this pool's to report: the supervisor prices again for
        the start and records the failure on the engine's stream (SG3).
        """
        try:
            return await self._io.run(supervisor.price)
        except anyio.get_cancelled_exc_class():
            raise
        except BaseException:  # noqa: BLE001 - even SystemExit from a plugin: recorded there
            return None

    async def price(self, key: str) -> Launch:
        """``key``'s next launch priced now, as a start would price it (preview; PP1)."""
        return await self._io.run(self.supervisor(key).price)

    async def _make_room(self, key: str, launch: Launch) -> str | None:
        """PP4: evict what the policy picks until ``launch``'s bytes fit.

        Returns None once it fits (or when there is nothing to decide); when even evicting
        everything evictable could not make it fit, evicts nothing and returns why, for the
        denial the ledger then records (the start is still asked of the ledger, so every
        daemon sharing it sees the refusal with its inputs).
        """
        wanted = launch.reserved_bytes
        if self.ledger is None or wanted is None:
            return None
        if type(wanted) is not int or wanted < 0:  # no byte count: a broken plugin, whose
            return None  # start the supervisor refuses and records; nothing is evicted for it
        search = RoomSearch(key, wanted, self._clock.monotonic() + self.drain_wait)
        while True:
            short, held = await self._io.run(self._shortfall, key, wanted)
            now = self._clock.wall()
            standing = [
                Standing(
                    self._as_policy(k, e, held.get(k, 0), queued=True),
                    # an engine being built, or built and not yet handed to those who asked
                    # for it, is spoken for (room_step never evicts it)
                    spoken=e.flight is not None or e.waiting > 0,
                    kept=k in self.pinned or k in self._protected,
                )
                for k, e in self._entries.items()
                if e.supervisor.state in _UP
            ]
            step = room_step(
                search,
                short,
                standing,
                now,
                policy=self.eviction,
                patience_now=self._clock.monotonic(),
            )
            if step.action == "fit":
                return None
            if step.action == "wait":
                await self._clock.sleep(self.drain_poll)  # PP4: wait for them, then look again
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
            await self._record(planned)  # SF2: a decision the log cannot take is not taken
            if step.action == "refuse":
                return step.refusal
            search = step.search
            why = {**decision, "for": key}
            async with anyio.create_task_group() as evictions:
                for victim in step.evict:
                    evictions.start_soon(self._evict_logged, victim, key, why)
            if step.drain is not None:
                await self._drain(step.drain, key, why, self.drain_wait)

    def _shortfall(self, key: str, wanted: int) -> tuple[int, dict[str, int]]:
        """CB5 against the ledger now, and what this daemon holds per key (blocking)."""
        ledger = self.ledger
        assert ledger is not None  # noqa: S101 - only called with a ledger
        limits = ledger.limits()
        state = ledger.state
        wanted = start_share(wanted, limits.budget)
        mine = {h.key: h.bytes for h in state.reservations.values() if h.owner == ledger.owner}
        short = ledger_shortfall(limits, state.committed, wanted, mine.get(key, 0))
        return short, mine

    def _as_policy(self, key: str, entry: _Entry, size: int, *, queued: bool = False) -> PoolEntry:
        return PoolEntry(
            key,
            size,
            entry.last_used_at,
            entry.hits,
            busy=self._busy(key, entry, queued=queued),
            draining=entry.draining,
        )

    async def _evict_logged(self, key: str, for_key: str, why: dict[str, Any]) -> None:
        try:
            await self._drain(key, for_key, why, self.drain_wait)
        except HostlerError as exc:
            log.warning("hostler: %s", exc.message)

    async def _drain(self, key: str, for_key: str | None, why: dict[str, Any], wait: float) -> bool:
        """PP5: no new work for ``key`` from now; evict it once idle, or give up after ``wait``.

        Returns whether it was evicted (False: it was already gone).

        Raises:
            EngineBusyError: Still busy after ``wait`` seconds; it stays, with its memory.
        """
        entry = self._entries.get(key)
        if entry is None or entry.supervisor.state not in _UP:
            return False
        if entry.draining:  # another eviction drains it already: join it
            await entry.drained.wait()
            return entry.supervisor.state not in _UP
        entry.draining = True
        entry.drained = anyio.Event()
        try:
            started = self._clock.wall()
            await self._record(PoolDrainStarted(started, key, for_key, wait))
            while True:
                step = drain_step(
                    busy=self._busy(key, entry, queued=False),
                    up=entry.supervisor.state in _UP,
                    wanted=for_key is None or self._wanted(for_key),
                    started_at=started,
                    now=self._clock.wall(),
                    wait=wait,
                )
                exact, waited = step.decision, step.waited
                if step.action == "wait":
                    self._tell_drain(DrainProgress(key, for_key, waited, wait))
                    await self._clock.sleep(self.drain_poll)
                    continue
                if step.action == "evict":
                    await self._tell_stopping(entry.supervisor)
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
                        f"{key} is busy and did not drain within {wait:g} s; not evicting it"
                        + (f" for {for_key}" if for_key else "")
                        + ": it stays resident. Retry when its requests end"
                    )
                return step.action == "evict"
        finally:
            entry.draining = False
            entry.drained.set()

    def _wanted(self, key: str) -> bool:
        """Whether anyone still waits for ``key``'s engine (a request, reconcile, a pin)."""
        entry = self._entries.get(key)
        return key in self.pinned or (entry is not None and entry.waiting > 0)

    async def _record(self, event: Event) -> None:
        store = self.store
        await self._io.run_patiently(
            lambda: store.append(POOL_STREAM, [event], expected_version=None)
        )

    # -- the operator's verbs ------------------------------------------------------------------

    async def unload_idle(self, key: str, why: dict[str, Any] | None = None) -> bool:
        """PP6: unload ``key`` now if it is idle; False when it is not resident.

        Joins an eviction already draining it. ``why`` is recorded as the stop's decision
        (default: PP6, an operator's unload).

        Raises:
            EngineBusyError: It serves or waits on requests (no drain wait: a person asked).
        """
        entry = self._entries.get(key)
        if entry is None or entry.supervisor.state not in _UP:
            return False
        if key in self.pinned:
            raise UsageError(
                f"{key} is pinned (the config keeps it resident, PP17); unpin it to unload it"
            )
        if entry.draining:
            await entry.drained.wait()
            return entry.supervisor.state not in _UP
        if self._busy(key, entry, queued=True):
            raise EngineBusyError(f"{key} is busy; not unloading it (retry when its requests end)")
        return await self._drain(key, None, why or {"rule": "PP6", "cause": "unload-idle"}, 0.0)

    async def release_idle(self) -> list[str]:
        """PP7: unload every idle engine; return the keys that were busy (left resident)."""
        busy: list[str] = []
        for key in self.engine_keys():
            if key in self.pinned:
                continue  # PP17: kept resident through a reset too
            try:
                await self.unload_idle(key)
            except EngineBusyError:
                busy.append(key)
            except HostlerError as exc:
                log.warning("hostler: %s: %s", key, exc.message)
        return busy

    async def retire(self) -> None:
        """PP9: wait for builds, then evict every engine as its work ends (never cut a request)."""
        self._closed = True
        while True:
            up = [k for k, e in self._entries.items() if e.supervisor.state in _UP or e.flight]
            if not up:
                return
            for key in up:
                entry = self._entries[key]
                if entry.flight is not None:
                    with contextlib.suppress(BaseException):
                        await entry.flight.wait()
                with contextlib.suppress(HostlerError):
                    await self._drain(key, None, {"rule": "PP9", "cause": "retire"}, math.inf)

    async def reconcile(self, targets: Mapping[str, int]) -> ReconcileReport:
        """PP10: hold exactly ``targets[model]`` replicas of each named ``engine:model``.

        Replicas at or above the target count are evicted (a busy one drains; one that stays
        busy is reported, left resident); missing replicas ``0..n-1`` are started. Models not
        named are untouched.
        """
        self._check_open()
        targets = _checked_targets(targets)
        evicted: list[str] = []
        started: list[str] = []
        failed: dict[str, str] = {}
        for key in self.engine_keys():
            parsed = parse_key(key)
            if parsed is None:
                continue
            want = targets.get(f"{parsed.engine}:{parsed.model}")
            if want is None or parsed.replica < want or not self.resident(key):
                continue
            if key in self.pinned:
                failed[key] = f"{key} is pinned (PP17): kept resident"
                continue
            try:
                why = {"rule": "PP10", "target": want}
                if await self._drain(key, None, why, self.drain_wait):
                    evicted.append(key)
            except HostlerError as exc:
                failed[key] = exc.message
        wanted = {f"{model}:{i}" for model, want in targets.items() for i in range(want)}
        self._protected |= wanted  # the replicas asked for never make room for each other
        try:
            for model, want in sorted(targets.items()):
                for replica in range(want):
                    key = f"{model}:{replica}"
                    if self.resident(key):
                        continue
                    try:
                        await self.ensure(key, cause="reconcile")
                        started.append(key)
                    except HostlerError as exc:
                        failed[key] = exc.message
                        for later in range(replica + 1, want):  # they would fail the same way
                            failed[f"{model}:{later}"] = f"not tried: {key} could not start"
                        break
        finally:
            self._protected -= wanted
        started = [key for key in started if self.resident(key)]
        return ReconcileReport(tuple(evicted), tuple(started), failed)

    # -- pinned engines ------------------------------------------------------------------------

    async def _keep_pinned(self) -> None:
        """PP17: start every pinned engine that is down, as soon as its restart budget allows."""
        while not self._closed:
            for key in sorted(self.pinned):
                await self._raise_pinned(key)
            await self._clock.sleep(self.pin_interval)

    async def _raise_pinned(self, key: str) -> None:
        if not self._pins.due(key, self._clock.monotonic()):
            return
        try:
            sup = self.supervisor(key)
            entry = self._entries[key]
            blocked = pin_blocked(
                up=sup.state in _UP,
                stopping=sup.state == EngineState.STOPPING,
                starting=entry.flight is not None,
                draining=entry.draining,
                locked_until=sup.engine.retry_at if sup.state == EngineState.FATAL else None,
                now=self._clock.wall(),
            )
            if blocked:
                return
            await self.ensure(key, cause="pinned")
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:  # noqa: BLE001 - one pinned engine never ends the pool
            message = exc.message if isinstance(exc, HostlerError) else repr(exc)[:300]
            if self._pins.failed(key, message, self._clock.monotonic()).say:
                log.error("hostler: pinned %s: %s", key, message)  # noqa: TRY400
        else:
            self._pins.succeeded(key)


def _checked_targets(targets: Mapping[str, int]) -> dict[str, int]:
    """PP10's input at the edge: ``engine:model`` names and counts from 0 to 64."""
    checked: dict[str, int] = {}
    for model, want in targets.items():
        if parse_key(f"{model}:0") is None or model.count(":") != 1:
            raise UsageError(f"reconcile: {str(model)[:80]!r} is not an engine:model name")
        if type(want) is not int or not 0 <= want <= MAX_REPLICAS:
            raise UsageError(
                f"reconcile: {model}: a replica count from 0 to {MAX_REPLICAS}, not {want!r}"[:200]
            )
        checked[model] = want
    return checked


def _observed(candidates: Iterable[PoolEntry]) -> dict[str, dict[str, Any]]:
    """PM14: each candidate's exact last use and request times (the decision rounds them)."""
    return {c.key: {"last_used_at": c.last_used_at, "hits": list(c.hits)} for c in candidates}
