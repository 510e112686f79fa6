"""What a recorded log asked of hostler, as a pure :class:`Workload` the what-if replays (PM20).

:func:`workload_from` reads recorded rows (anything with ``seq``, ``stream_id``, ``type``,
``recorded_at``, ``damage`` and the decoded ``event``, as :class:`hostler.store.log.RecordedEvent`
has: the log's payloads are read by the one decoder, never again here) and keeps what the
simulator needs:

- the requests, from each engine's queue stream: when each arrived (the queue's clock), its
  engine key, session, lane, and how long it held its slot once it had run
  (``queue.released.ran_for``, less the cold start it paid, PM21) or, for a request that left the
  queue without running, how long it waited before leaving;
- each model's footprint: what its starts reserved (``ledger.reserved``; a model never
  admitted: what its refused start asked, ``ledger.denied``) and what it was
  measured at (``ledger.measured``), its cold start (``engine.start_requested`` to
  ``engine.ready``) and its stop (``engine.stop_requested`` to ``engine.stopped``), medians;
- the settings in force: the budget and co-residency ceiling of the last ledger decision, the
  spillover choice, the eviction policy the pool named, slots per engine (the queue's
  interactive cap once the engine was launched), and the engines started as pinned;
- CC13: which engines keep their sessions across a stop (``cache.saved`` or
  ``cache.restored`` recorded for them) and what a restore cost (median seconds); the restore
  a request paid inside its ``ran_for`` is taken out of its work, as its cold start is.

Nothing here reads a clock or a file. Rows that are damaged, of unknown types, or whose payload
lacks a field the workload needs are skipped and counted in :attr:`Workload.skipped`.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from hostler.events.base import Event, UnknownEvent, event_class
from hostler.events.cache import CacheRestored, CacheSaved
from hostler.events.ledger import (
    LedgerBudgetSet,
    LedgerDenied,
    LedgerMeasured,
    LedgerReserved,
    LedgerSpilloverSet,
)
from hostler.events.pool import PoolRoomPlanned
from hostler.events.queue import QueueCancelled, QueueDispatched, QueueEnqueued, QueueReleased
from hostler.machines.base import TransitionEvent
from hostler.machines.engine import (
    EngineCrashed,
    EngineReady,
    EngineStartRequested,
    EngineStopped,
    EngineStopRequested,
)
from hostler.policies.eviction import DEFAULT_EVICTION_POLICY

__all__ = [
    "FLUSH_LAG",
    "EventRow",
    "LogRow",
    "Model",
    "Outside",
    "Request",
    "Settings",
    "Workload",
    "median",
    "number",
    "workload_from",
]

#: PM21: how late the runtime may write a queue event after its time (its flush period, s).
FLUSH_LAG = 0.5


class LogRow(Protocol):
    """What the workload reads of a recorded row (:class:`~hostler.store.log.RecordedEvent`)."""

    @property
    def seq(self) -> int:
        """Global position in the log."""
        ...

    @property
    def stream_id(self) -> str:
        """The stream it belongs to."""
        ...

    @property
    def type(self) -> str:
        """The event type."""
        ...

    @property
    def payload(self) -> dict[str, Any]:
        """The payload as stored."""
        ...

    @property
    def recorded_at(self) -> datetime:
        """When the log took it (UTC)."""
        ...

    @property
    def damage(self) -> str:
        """Why it could not be read; empty for a sound row."""
        ...


class EventRow(LogRow, Protocol):
    """A recorded row with its decoded event, as the workload reads it."""

    @property
    def event(self) -> Event | UnknownEvent:
        """The event as decoded (an :class:`~hostler.events.base.UnknownEvent` when it misfits)."""
        ...


@dataclass(frozen=True, slots=True)
class Outside:
    """What the log records happening to an engine that no request asked for (replayed as is).

    Attributes:
        at: When (the engine's clock, seconds).
        key: The engine key.
        kind: ``crashed`` (its process died: ``engine.crashed``), ``unloaded`` (stopped on
            request, not to make room: an operator's unload (PP6), a lease's slot swap (GA1),
            a retire or a reconcile; ``engine.stop_requested``) or ``budget`` (the budget
            became ``bytes``; ``key`` is empty).
        after: The request that ended last before it (index into the requests), or None; a
            replay does it ``gap`` seconds after that request ends, as it sends requests
            (PM21), so it falls between the same two requests.
        gap: Seconds after ``after`` ended.
        bytes: For ``budget``: the budget the ledger's next decision enforced.
    """

    at: float
    key: str
    kind: str
    after: int | None = None
    gap: float = 0.0
    bytes: int = 0


@dataclass(frozen=True, slots=True)
class Request:
    """One recorded request.

    Attributes:
        at: When it joined its engine's queue (the queue's clock, seconds).
        key: The engine key it asked for.
        work: Seconds it held its slot once its engine was up (its recorded ``ran_for`` less
            any cold start it paid, PM21); 0 for one that never ran.
        session: Its session id (queue affinity).
        lane: ``interactive`` or ``background``.
        gave_up: Seconds after arriving at which it left the queue without running (cancelled,
            timed out, aborted); None when it ran.
        group: Its wider affinity key.
        ambient: Ambient background work (held by the queue's quiet gate).
        after: The index (in :attr:`Workload.requests`) of the request it followed: the last
            that ended before it arrived; None when none had.
            A replay sends it ``gap`` seconds after that one ends there (PM21: closed loop).
        gap: Seconds between the end of ``after`` and its arrival, as recorded.
    """

    at: float
    key: str
    work: float
    session: str | None = None
    lane: str = "interactive"
    gave_up: float | None = None
    group: str | None = None
    ambient: bool = False
    after: int | None = None
    gap: float = 0.0


@dataclass(frozen=True, slots=True)
class Model:
    """One engine key's recorded costs.

    Attributes:
        key: The engine key.
        reserve: Bytes a start of it asks the ledger for (its last recorded reservation).
        held: Bytes it holds once ready (its last measurement; else ``reserve``).
        cold_start: Seconds from start asked to ready (median of its recorded starts).
        stop: Seconds an eviction of it takes to finish (median of its recorded stops).
        plan: Seconds from the dispatch of the request a start was made for to that start's
            planning (its price, the admission lock; median): meanwhile the other engines
            serve on, and a replay makes room that much later.
        restore: CC13: seconds a session's restore from its file took (median of the
            recorded ones; 0.0 when it saved sessions but restored none); None when the log
            shows it keeping no session across a stop (a replay restores nothing on it).
    """

    key: str
    reserve: int
    held: int
    cold_start: float = 0.0
    stop: float = 0.0
    plan: float = 0.0
    restore: float | None = None


@dataclass(frozen=True, slots=True)
class Settings:
    """What a what-if may change (PM22).

    Attributes:
        budget: The admission budget in bytes, enforced whatever its size.
        policy: The eviction policy's name (EV1).
        spillover: Whether co-resident models may spill into RAM (the ceiling is the budget);
            without it they share the fast budget.
        slots: Slots per engine for every engine, or None to keep each engine's own.
        follow_budget: Replay the budget changes the log records (the log's own settings
            do, from the budget in force at its first request); a budget you give holds
            throughout.
    """

    budget: int
    policy: str = DEFAULT_EVICTION_POLICY.name
    spillover: bool = True
    slots: int | None = None
    follow_budget: bool = False


@dataclass(frozen=True, slots=True)
class Workload:
    """Everything a what-if replays, pure data.

    Attributes:
        requests: The requests in arrival order.
        models: Each engine key's costs.
        settings: The settings the log was recorded under.
        fast: The fast (accelerator) budget in bytes when the log shows one (a co-residency
            ceiling below the budget), else None: spillover then changes nothing.
        slots: Slots per engine key as launched (1 when the log does not say).
        pinned: Engine keys kept resident (started as ``pinned``).
        skipped: Rows not used, by why (damaged, a field missing...).
        notes: Things a reader of the what-if should know about this log.
        outside: Crashes, asked-for stops and budget changes, in time order: a replay does
            them when the log says they happened (budget changes only under
            ``Settings.follow_budget``).
        first_budget: The budget of the log's first ledger decision (None: no decision).
    """

    requests: tuple[Request, ...]
    models: Mapping[str, Model]
    settings: Settings
    fast: int | None = None
    slots: Mapping[str, int] = field(default_factory=dict)
    pinned: frozenset[str] = frozenset()
    skipped: Mapping[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    outside: tuple[Outside, ...] = ()
    first_budget: int | None = None


def median(values: Iterable[float]) -> float:
    """The median (the mean of the two middle values for an even count); 0 when empty."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return 0.0
    mid = n // 2
    if n % 2:
        return float(ordered[mid])
    return (ordered[mid - 1] + ordered[mid]) / 2


def number(payload: Mapping[str, Any], name: str) -> float | None:
    """``payload[name]`` as a finite float, or None when it is not a finite number."""
    value = payload.get(name)
    if type(value) not in (int, float):
        return None
    number = float(value)  # type: ignore[arg-type]
    return number if math.isfinite(number) else None


def _count(payload: Mapping[str, Any], name: str) -> int | None:
    value = payload.get(name)
    return value if type(value) is int and value >= 0 else None


@dataclass
class _Queued:
    at: float
    key: str
    session: str | None
    lane: str
    group: str | None
    ambient: bool
    dispatched: float | None = None
    ran_for: float | None = None
    gave_up: float | None = None
    released: float | None = None

    def ended(self) -> float:
        """When it left (released, or gave up), on the queue's clock."""
        if self.released is not None:
            return self.released
        return self.at + (self.gave_up or 0.0)


@dataclass
class _Start:
    begin: float  # start asked (or its room planned just before)
    ready: float | None = None


@dataclass
class _Fold:
    queued: list[_Queued] = field(default_factory=list)
    open_queue: dict[tuple[str, int], _Queued] = field(default_factory=dict)
    reserve: dict[str, int] = field(default_factory=dict)
    measured: dict[str, int] = field(default_factory=dict)
    starts: dict[str, list[_Start]] = field(default_factory=dict)
    stopping: dict[str, float] = field(default_factory=dict)
    stops: dict[str, list[float]] = field(default_factory=dict)
    planned: dict[str, float] = field(default_factory=dict)
    budgets: list[int] = field(default_factory=list)
    ceiling: int | None = None
    spillover: bool | None = None
    policy: str | None = None
    slots: dict[str, int] = field(default_factory=dict)
    pinned: set[str] = field(default_factory=set)
    lag: float = math.inf  # min(recorded_at - at) over queue events: their clock's offset
    outside: list[Outside] = field(default_factory=list)
    # (when, budget enforced or None for an operator's change) in log order (PM20)
    budget_points: list[tuple[float, int | None]] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    saving: set[str] = field(default_factory=set)  # keys whose sessions outlive a stop
    # CC13: (key, session, when the log took it, seconds) of each restore that worked
    restores: list[tuple[str, str, float, float]] = field(default_factory=list)

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1


def workload_from(rows: Iterable[EventRow]) -> Workload:
    """PM20: the workload a log records (rows in seq order, each with its decoded event)."""
    fold = _Fold()
    for row in rows:
        if row.damage:
            fold.skip("damaged")
            continue
        event = row.event
        handler = _HANDLERS.get(event.__class__)
        if handler is None:
            if event.__class__ is UnknownEvent and event_class(row.type) in _HANDLERS:
                fold.skip(f"{row.type} without the fields it needs")  # a payload that misfits
            continue
        if not handler(fold, row, event):
            fold.skip(f"{row.type} without the fields it needs")
    return _assemble(fold)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _on_enqueued(fold: _Fold, row: EventRow, e: QueueEnqueued) -> bool:
    at = _finite(e.at)
    if e.id < 0 or at is None or e.lane not in ("interactive", "background"):
        return False
    _saw_queue_time(fold, row, at)
    item = _Queued(at, e.engine, e.session_id, e.lane, e.group, e.ambient is True)
    fold.queued.append(item)
    fold.open_queue[(e.engine, e.id)] = item
    return True


def _on_dispatched(fold: _Fold, row: EventRow, e: QueueDispatched) -> bool:
    at = _finite(e.at)
    if e.id < 0 or at is None:
        return False
    _saw_queue_time(fold, row, at)
    item = fold.open_queue.get((e.engine, e.id))
    if item is not None:
        item.dispatched = at
    cap = _count(e.decision, "interactive_cap")
    if cap is not None and cap > 0:
        fold.slots[e.engine] = cap
    return True


def _on_released(fold: _Fold, row: EventRow, e: QueueReleased) -> bool:
    at, ran = _finite(e.at), _finite(e.ran_for)
    if e.id < 0 or ran is None or at is None:
        return False
    _saw_queue_time(fold, row, at)
    item = fold.open_queue.pop((e.engine, e.id), None)
    if item is not None:
        item.ran_for = max(ran, 0.0)
        item.released = at
    return True


def _on_cancelled(fold: _Fold, row: EventRow, e: QueueCancelled) -> bool:
    at, waited = _finite(e.at), _finite(e.waited)
    if e.id < 0 or waited is None or at is None:
        return False
    _saw_queue_time(fold, row, at)
    item = fold.open_queue.pop((e.engine, e.id), None)
    if item is not None:
        item.gave_up = max(waited, 0.0)
    return True


def _saw_queue_time(fold: _Fold, row: EventRow, at: float) -> None:
    try:
        stamp = row.recorded_at.timestamp()
    except (AttributeError, OverflowError, OSError, ValueError):
        return
    fold.lag = min(fold.lag, stamp - at)


def _engine_key(row: EventRow) -> str | None:
    stream = row.stream_id
    return stream.removeprefix("engine/") if stream.startswith("engine/") else None


def _engine_at(row: EventRow, e: TransitionEvent) -> tuple[str, float] | None:
    key, at = _engine_key(row), _finite(e.at)
    return None if key is None or at is None else (key, at)


def _on_start(fold: _Fold, row: EventRow, e: EngineStartRequested) -> bool:
    found = _engine_at(row, e)
    if found is None:
        return False
    key, at = found
    if e.cause == "pinned":
        fold.pinned.add(key)
    planned = fold.planned.pop(key, None)
    begin = planned if planned is not None and planned <= at else at
    fold.starts.setdefault(key, []).append(_Start(begin))
    return True


def _on_ready(fold: _Fold, row: EventRow, e: EngineReady) -> bool:
    found = _engine_at(row, e)
    if found is None:
        return False
    starts = fold.starts.get(found[0])
    if starts and starts[-1].ready is None:
        starts[-1].ready = found[1]
    return True


def _on_stop_requested(fold: _Fold, row: EventRow, e: EngineStopRequested) -> bool:
    found = _engine_at(row, e)
    if found is None:
        return False
    key, at = found
    if e.reason == "evicted":
        fold.stopping[key] = at
    if e.reason == "user" or (e.reason == "evicted" and not e.made_room):
        # asked for (an operator's unload, a lease's swap, a retire, a reconcile), not chosen
        # to make room: the replay does it when it happened
        fold.outside.append(Outside(at, key, "unloaded"))
    return True


def _on_crashed(fold: _Fold, row: EventRow, e: EngineCrashed) -> bool:
    found = _engine_at(row, e)
    if found is None:
        return False
    if e.reached_ready is not False:  # a start that failed is the start's own outcome
        fold.outside.append(Outside(found[1], found[0], "crashed"))
    return True


def _on_stopped(fold: _Fold, row: EventRow, e: EngineStopped) -> bool:
    found = _engine_at(row, e)
    if found is None:
        return False
    key, at = found
    began = fold.stopping.pop(key, None)
    if began is not None:
        fold.stops.setdefault(key, []).append(max(at - began, 0.0))
    return True


def _on_reserved(fold: _Fold, row: EventRow, e: LedgerReserved | LedgerDenied) -> bool:
    if e.bytes < 0 or e.budget < 0 or e.ceiling < 0:
        return False
    if isinstance(e, LedgerReserved):
        fold.reserve[e.key] = e.bytes
    else:
        fold.planned.pop(e.key, None)  # a refused start: its room plan starts nothing
        # what it asked is its price until a start of it is reserved: never priced at 0
        fold.reserve.setdefault(e.key, e.bytes)
    fold.budgets.append(e.budget)
    fold.budget_points.append((row.recorded_at.timestamp(), e.budget))
    fold.ceiling = e.ceiling
    return True


def _on_measured(fold: _Fold, _row: EventRow, e: LedgerMeasured) -> bool:
    if e.bytes < 0:
        return False
    fold.measured[e.key] = e.bytes
    return True


def _on_budget_set(fold: _Fold, row: EventRow, e: LedgerBudgetSet) -> bool:
    if e.budget is not None and e.budget < 0:
        return False
    # what it came to (a floor, the automatic budget) is what the next decision enforced
    fold.budget_points.append((row.recorded_at.timestamp(), None))
    if e.budget is None:
        return True  # back to automatic: the next decision says what that is
    fold.budgets.append(e.budget)
    return True


def _on_spillover_set(fold: _Fold, _row: EventRow, e: LedgerSpilloverSet) -> bool:
    fold.spillover = e.allowed
    return True


def _on_room_planned(fold: _Fold, _row: EventRow, e: PoolRoomPlanned) -> bool:
    at = _finite(e.at)
    if at is None:
        return False
    fold.planned.setdefault(e.for_key, at)
    eviction = e.decision.get("eviction")
    if isinstance(eviction, str):
        fold.policy = eviction
    return True


def _on_cache_saved(fold: _Fold, _row: EventRow, e: CacheSaved) -> bool:
    fold.saving.add(e.key)
    return True


def _on_cache_restored(fold: _Fold, row: EventRow, e: CacheRestored) -> bool:
    fold.saving.add(e.key)
    seconds = _finite(e.seconds)
    if not e.error and seconds is not None and seconds >= 0:
        fold.restores.append((e.key, e.session, row.recorded_at.timestamp(), seconds))
    return True


_HANDLERS: dict[type[Any], Callable[[_Fold, EventRow, Any], bool]] = {
    CacheSaved: _on_cache_saved,
    CacheRestored: _on_cache_restored,
    QueueEnqueued: _on_enqueued,
    QueueDispatched: _on_dispatched,
    QueueReleased: _on_released,
    QueueCancelled: _on_cancelled,
    EngineStartRequested: _on_start,
    EngineReady: _on_ready,
    EngineStopRequested: _on_stop_requested,
    EngineStopped: _on_stopped,
    EngineCrashed: _on_crashed,
    LedgerReserved: _on_reserved,
    LedgerDenied: _on_reserved,
    LedgerMeasured: _on_measured,
    LedgerBudgetSet: _on_budget_set,
    LedgerSpilloverSet: _on_spillover_set,
    PoolRoomPlanned: _on_room_planned,
}


def _paid_and_planned(fold: _Fold) -> tuple[dict[int, float], dict[str, list[float]]]:
    """PM21: the cold start each request paid inside its ``ran_for``, by its index.

    The queue's clock and the engines' differ by an offset the log does not record; the
    smallest ``recorded_at - at`` of the queue's events bounds it from above (the runtime
    writes them at most :data:`FLUSH_LAG` late). Each start of an engine is paid by the
    earliest request for it that was dispatched before the start (within that lag) and was
    still running when the engine became ready; the time from its dispatch to the start's
    planning is that start's plan delay (by key).
    """
    planned: dict[str, list[float]] = {}
    if not math.isfinite(fold.lag):
        return {}, planned
    by_key: dict[str, list[tuple[float, int, float]]] = {}
    for index, item in enumerate(fold.queued):
        if item.dispatched is not None and item.ran_for is not None:
            by_key.setdefault(item.key, []).append((item.dispatched, index, item.ran_for))
    paid: dict[int, float] = {}
    for key, starts in fold.starts.items():
        candidates = sorted(by_key.get(key, []))
        low = 0  # those before it ended before an earlier start was ready, or paid for one
        for start in starts:
            if start.ready is None:
                continue
            while low < len(candidates):
                dispatched, index, ran_for = candidates[low]
                if index not in paid and dispatched + fold.lag + ran_for + FLUSH_LAG >= start.ready:
                    break
                low += 1
            for dispatched, index, ran_for in candidates[low:]:
                begun = dispatched + fold.lag
                if begun - FLUSH_LAG > start.begin:
                    break  # dispatched after the start: nor are those after it
                if index in paid or begun + ran_for + FLUSH_LAG < start.ready:
                    continue
                paid[index] = min(max(start.ready - start.begin, 0.0), ran_for)
                planned.setdefault(key, []).append(max(start.begin - begun, 0.0))
                break
    return paid, planned


def _restores_paid(fold: _Fold) -> dict[int, float]:
    """CC13: the restore each request paid inside its ``ran_for``, by its index.

    A restore (recorded as it happened, on the log's clock) belongs to the request of its
    session and engine that was running then: dispatched before it and not yet released,
    each within the queue clock's offset and :data:`FLUSH_LAG`; the latest such one.
    """
    if not fold.restores or not math.isfinite(fold.lag):
        return {}
    by_turn: dict[tuple[str, str], list[tuple[float, int, float]]] = {}
    for index, item in enumerate(fold.queued):
        if item.session is not None and item.dispatched is not None and item.ran_for is not None:
            turns = by_turn.setdefault((item.key, item.session), [])
            turns.append((item.dispatched + fold.lag, index, item.ran_for))
    paid: dict[int, float] = {}
    for key, session, at, seconds in fold.restores:
        found = None
        for begun, index, ran_for in by_turn.get((key, session), []):
            if begun - FLUSH_LAG <= at <= begun + ran_for + FLUSH_LAG and (
                found is None or begun >= found[0]
            ):
                found = (begun, index)
        if found is not None:
            paid[found[1]] = paid.get(found[1], 0.0) + seconds
    return paid


def _followed(items: list[_Queued]) -> list[tuple[int | None, float]]:
    """PM21: for each request (in arrival order), the one it followed and the gap after it.

    The one followed is the last to end before it arrived (whatever its session: a client
    that waits for one answer before it asks again is followed faithfully, and its next
    request is not sent into a start the replay has not finished); a request that arrived
    before any had ended follows none.
    """
    ends = sorted(range(len(items)), key=lambda i: items[i].ended())
    last: int | None = None
    found: list[tuple[int | None, float]] = []
    at = 0
    for item in items:
        while at < len(ends) and items[ends[at]].ended() <= item.at:
            last = ends[at]
            at += 1
        found.append((last, 0.0 if last is None else item.at - items[last].ended()))
    return found


def _assemble(fold: _Fold) -> Workload:
    paid, planned = _paid_and_planned(fold)
    restored = _restores_paid(fold)
    kept: list[tuple[_Queued, float]] = []
    for index, item in enumerate(fold.queued):
        if item.ran_for is None and item.gave_up is None:
            fold.skip("queue.enqueued of a request the log never saw end")
            continue
        spent = paid.get(index, 0.0) + restored.get(index, 0.0)
        work = 0.0 if item.ran_for is None else item.ran_for - spent
        kept.append((item, max(work, 0.0)))
    kept.sort(key=lambda pair: pair[0].at)
    followed = _followed([item for item, _ in kept])
    requests = [
        Request(
            item.at,
            item.key,
            work,
            item.session,
            item.lane,
            item.gave_up if item.ran_for is None else None,
            item.group,
            item.ambient,
            after,
            gap,
        )
        for (item, work), (after, gap) in zip(kept, followed, strict=True)
    ]
    keys = {r.key for r in requests} | set(fold.reserve) | set(fold.starts)
    models = {}
    for key in sorted(keys):
        reserve = fold.reserve.get(key, fold.measured.get(key, 0))
        colds = [s.ready - s.begin for s in fold.starts.get(key, []) if s.ready is not None]
        restores = [seconds for k, _, _, seconds in fold.restores if k == key]
        models[key] = Model(
            key,
            reserve,
            fold.measured.get(key, reserve),
            max(median(colds), 0.0),
            median(fold.stops.get(key, [])),
            median(planned.get(key, [])),
            median(restores) if key in fold.saving else None,
        )
    notes = []
    budget = fold.budgets[-1] if fold.budgets else 0
    if not fold.budgets:
        notes.append("the log records no ledger decision: the budget is unknown (0)")
    elif len(set(fold.budgets)) > 1:
        notes.append(
            f"the budget changed during the log; the recorded settings use the last ({budget})"
        )
    fast = fold.ceiling if fold.ceiling is not None and fold.ceiling < budget else None
    spillover = fold.spillover if fold.spillover is not None else fast is None
    if fast is None:
        notes.append("the log shows no fast (accelerator) budget: spillover changes nothing")
    missing = sorted(k for k in keys if k not in fold.reserve and k not in fold.measured)
    if missing:
        notes.append(f"no recorded footprint for {', '.join(missing)}: priced at 0 (runs alone)")
    first, changes = _budget_changes(fold.budget_points)
    settings = Settings(
        budget, fold.policy or DEFAULT_EVICTION_POLICY.name, spillover, None, bool(changes)
    )
    return Workload(
        tuple(requests),
        models,
        settings,
        fast,
        {k: fold.slots.get(k, 1) for k in models},
        frozenset(fold.pinned),
        dict(sorted(fold.skipped.items())),
        tuple(notes),
        _placed([*fold.outside, *changes], [item for item, _ in kept], fold.lag),
        first,
    )


def _budget_changes(points: list[tuple[float, int | None]]) -> tuple[int | None, list[Outside]]:
    """The budget of the first decision, and each change to what the decisions enforced.

    An operator's change is placed when it was made, with what the next decision enforced
    (a live budget is floored, CB1); a decision that enforced another budget with no change
    before it (the automatic budget moved) is a change at that decision.
    """
    first: int | None = None
    current: int | None = None
    changes: list[Outside] = []
    asked_at: float | None = None
    for at, budget in points:
        if budget is None:
            asked_at = at if asked_at is None else asked_at
            continue
        if first is None:
            first = current = budget
        elif budget != current:
            changes.append(
                Outside(at if asked_at is None else asked_at, "", "budget", bytes=budget)
            )
            current = budget
        asked_at = None
    return first, changes


def _placed(outside: list[Outside], items: list[_Queued], lag: float) -> tuple[Outside, ...]:
    """Each outside event after the last request to end before it (PM21's closed loop).

    Requests end on the queue's clock, engines crash on theirs: ``lag`` (the queue events'
    least delay in the log, PM21) puts the two on one.
    """
    offset = lag if math.isfinite(lag) else 0.0
    ends = sorted(range(len(items)), key=lambda i: items[i].ended())
    times = [items[i].ended() + offset for i in ends]
    placed = []
    for event in sorted(outside, key=lambda o: o.at):
        count = bisect.bisect_right(times, event.at)
        last = ends[count - 1] if count else None
        gap = 0.0 if last is None else event.at - (items[last].ended() + offset)
        placed.append(Outside(event.at, event.key, event.kind, last, gap, event.bytes))
    return tuple(placed)
