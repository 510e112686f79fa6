"""What-if: a recorded workload replayed under other settings, by the runtime's own rules (PM22).

:func:`simulate` is a discrete-event simulator: a heap of timed events, no clock, no I/O. It
runs a :class:`~hostler.postmortem.workload.Workload` under
:class:`~hostler.postmortem.workload.Settings` and asks the very pure functions the runtime
asks: the request queue's pick (:func:`hostler.policies.queue.pick_next`, lanes and caps from
:func:`~hostler.policies.queue.engine_queue_caps`, the ambient gate), the ledger's shortfall
(:func:`hostler.capacity.ledger.shortfall`), the pool's make-room step
(:func:`hostler.policies.room.room_step`, which asks
:func:`~hostler.policies.pool.plan_make_room` with the named eviction policy, EV1), its demand
bookkeeping (:func:`~hostler.policies.pool.touch`) and its drain verdict
(:func:`~hostler.policies.pool.drain_verdict`).

It makes room by the pool's own steps (PP4, PP5, PP17), carrying them out in virtual time
where the pool stops real engines: one start plans at a time; engines being
built or waited on are spoken for and never victims (when only they could free the room, the
start waits for them up to the drain bound, then is refused); a start that could not fit even if
every evictable engine went is refused with nothing evicted; a busy victim is drained, evicted
once idle, and the start is refused if it is still busy past :data:`DRAIN_WAIT` (checked at
the first poll after it); pinned engines are started first and never evicted. What it does not
model is listed in docs/postmortem.md (rule PM24).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from hostler.capacity.ledger import LedgerLimits
from hostler.capacity.ledger import shortfall as ledger_shortfall
from hostler.policies.eviction import EvictionPolicy, eviction_policy
from hostler.policies.pool import DRAIN_WAIT, PoolEntry, drain_verdict, touch
from hostler.policies.queue import (
    AFFINITY_WINDOW,
    RECENT_CAP,
    LaneCaps,
    Pending,
    RecentRun,
    Running,
    ambient_gate_open,
    ambient_recheck_in,
    engine_queue_caps,
    pick_next,
    prune_recent,
)
from hostler.policies.room import RoomSearch, Standing, room_step, start_share
from hostler.postmortem.figures import Figures, Tally
from hostler.postmortem.workload import Model, Request, Settings, Workload

__all__ = ["DRAIN_POLL", "limits_for", "simulate"]

#: How often the pool looks at a draining victim (seconds); a drain past the bound is given up
#: at the first look after it.
DRAIN_POLL = 0.5

_DOWN, _BUILDING, _UP = 0, 1, 2
# event kinds, in the order they go at one instant
_READY, _RELEASE, _DEADLINE, _PATIENCE, _GIVE_UP, _ARRIVE, _UNLOCK, _RECHECK, _OUTSIDE, _PLAN = (
    range(10)
)


def limits_for(settings: Settings, fast: int | None) -> LedgerLimits:
    """PM22: the ledger limits a what-if runs under: its budget always enforced (as an override).

    Without spillover, co-resident models share the fast budget (``fast``, never above the
    budget); when the log shows none, the ceiling is the budget.
    """
    budget = max(settings.budget, 0)
    quick = budget if fast is None else min(fast, budget)
    ceiling = budget if settings.spillover else quick
    return LedgerLimits(True, budget, quick, settings.spillover, ceiling)


_Index = dict[tuple[str, bool, str], dict[int, Pending]]


class _Line:
    """An engine's queued requests, indexed so that a pick is shown only those that can win.

    :func:`~hostler.policies.queue.pick_next` picks, within a lane (and, for ambient work,
    the gate), the first in queue order, or the first of a session or group that runs or ran
    lately. So the first of each (lane, ambient) class, and the first of each class for each
    session and group in those contexts, are all that it can choose among: the pick over them
    is the pick over the whole queue, at a cost that does not grow with the queue (PM22).
    """

    __slots__ = ("by_class", "by_group", "by_session", "items", "non_ambient")

    def __init__(self) -> None:
        self.items: dict[int, Pending] = {}
        self.by_class: dict[tuple[str, bool], dict[int, Pending]] = {}
        self.by_session: _Index = {}
        self.by_group: _Index = {}
        self.non_ambient = 0

    def add(self, item: Pending) -> None:
        self.items[item.id] = item
        self.by_class.setdefault((item.lane, item.ambient), {})[item.id] = item
        if item.session_id is not None:
            key = (item.lane, item.ambient, item.session_id)
            self.by_session.setdefault(key, {})[item.id] = item
        if item.group is not None:
            self.by_group.setdefault((item.lane, item.ambient, item.group), {})[item.id] = item
        if not item.ambient:
            self.non_ambient += 1

    def remove(self, ident: int) -> Pending | None:
        item = self.items.pop(ident, None)
        if item is None:
            return None
        _drop(self.by_class, (item.lane, item.ambient), ident)
        if item.session_id is not None:
            _drop(self.by_session, (item.lane, item.ambient, item.session_id), ident)
        if item.group is not None:
            _drop(self.by_group, (item.lane, item.ambient, item.group), ident)
        if not item.ambient:
            self.non_ambient -= 1
        return item

    def candidates(self, contexts: Iterable[tuple[str | None, str | None]]) -> list[Pending]:
        found = {}
        for members in self.by_class.values():
            first = next(iter(members.values()))
            found[first.id] = first
        if self.by_session or self.by_group:
            sessions = {s for s, _ in contexts}
            groups = {g for _, g in contexts}
            for key, members in self.by_session.items():
                if key[2] in sessions:
                    first = next(iter(members.values()))
                    found[first.id] = first
            for key, members in self.by_group.items():
                if key[2] in groups:
                    first = next(iter(members.values()))
                    found[first.id] = first
        return sorted(found.values(), key=lambda p: p.order)


def _drop(index: dict[Any, dict[int, Pending]], key: Any, ident: int) -> None:
    members = index[key]
    del members[ident]
    if not members:
        del index[key]


class _Engine:
    __slots__ = (
        "caps",
        "drain_started",
        "draining",
        "gate_wait",
        "held",
        "hits",
        "in_gate",
        "key",
        "last_activity",
        "last_used",
        "model",
        "pending",
        "pinned",
        "queued_build",
        "recent",
        "running",
        "slots",
        "state",
        "waiters",
    )

    def __init__(self, model: Model, slots: int, pinned: bool) -> None:
        self.key = model.key
        self.model = model
        self.slots = slots
        self.caps: LaneCaps = engine_queue_caps(slots)
        self.state = _DOWN
        self.held = 0
        self.last_used = 0.0
        self.hits: tuple[float, ...] = ()
        self.pending = _Line()
        self.running: dict[int, Running] = {}  # dispatched: holds a queue slot
        self.recent: tuple[RecentRun, ...] = ()
        self.last_activity: float | None = None  # Q1: the quiet clock starts with its queue
        self.waiters: list[int] = []  # dispatched, waiting for the engine to be up
        self.in_gate = 0
        self.gate_wait: deque[int] = deque()
        self.draining = False
        self.drain_started = 0.0
        self.pinned = pinned
        self.queued_build = False

    def in_use(self) -> int:
        return self.in_gate + len(self.gate_wait)

    def entry(self) -> PoolEntry:
        busy = (
            self.in_use() > 0 or self.state == _BUILDING or bool(self.running or self.pending.items)
        )
        return PoolEntry(
            self.key, self.held, self.last_used, self.hits, busy=busy, draining=self.draining
        )


@dataclass
class _Build:
    search: RoomSearch
    delay: float = 0.0  # the longest stop of its victims: the start waits for them (SG2)
    drain: str | None = None
    blocked: bool = False


class _Sim:
    def __init__(self, workload: Workload, settings: Settings, policy: EvictionPolicy) -> None:
        self.requests: tuple[Request, ...] = workload.requests
        self.settings, self.fast = settings, workload.fast
        start = settings.budget
        if settings.follow_budget and workload.first_budget is not None:
            start = workload.first_budget  # the recorded changes then follow, in time
        self.limits = limits_for(replace(settings, budget=start), workload.fast)
        self.policy = policy
        keys = set(workload.models) | {r.key for r in workload.requests}
        self.engines: dict[str, _Engine] = {}
        for key in sorted(keys):
            model = workload.models.get(key) or Model(key, 0, 0)
            slots = settings.slots or workload.slots.get(key, 1)
            self.engines[key] = _Engine(model, max(slots, 1), key in workload.pinned)
        self.resident: dict[str, _Engine] = {}  # building or up
        self.committed = 0
        self.heap: list[tuple[float, int, int, int, str]] = []
        self.order = 0
        self.admit: deque[str] = deque()
        self.build: _Build | None = None
        self.tally = Tally(sorted(keys))
        self.outside = workload.outside
        self.outside_after: dict[int, list[int]] = {}  # request index: crashes, unloads after it
        self.arrivals = 0  # the queue order: requests go in line as they arrive here
        self.followers: dict[int, list[int]] = {}
        self.open: list[int] = []  # requests that follow none: they arrive when recorded
        for index, request in enumerate(workload.requests):
            if request.after is None or not 0 <= request.after < index:
                self.open.append(index)
            else:
                self.followers.setdefault(request.after, []).append(index)

    # -- the clock of events ---------------------------------------------------------------

    def push(self, at: float, kind: int, index: int = -1, key: str = "") -> None:
        self.order += 1
        heapq.heappush(self.heap, (at, kind, self.order, index, key))

    def run(self) -> Figures:
        requests, arrivals = self.requests, self.open
        start = requests[0].at if requests else 0.0
        for index, happened in enumerate(self.outside):
            if happened.after is None or not 0 <= happened.after < len(requests):
                self.push(happened.at, _OUTSIDE, index)
            else:
                self.outside_after.setdefault(happened.after, []).append(index)
        for engine in self.engines.values():
            if engine.pinned:
                self.want_build(engine, start)
        heap = self.heap
        i, n = 0, len(arrivals)
        while i < n or heap:
            if heap and (i >= n or heap[0][0] <= requests[arrivals[i]].at):
                at, kind, _, index, key = heapq.heappop(heap)
                self.handle(at, kind, index, key)
            else:
                index = arrivals[i]
                self.arrive(index, requests[index].at)
                i += 1
        return self.tally.figures()

    def ended(self, index: int, now: float) -> None:
        """A request left (ran, refused, gave up): those that followed it arrive (PM21)."""
        for follower in self.followers.pop(index, ()):
            self.push(now + self.requests[follower].gap, _ARRIVE, follower)
        for happened in self.outside_after.pop(index, ()):
            self.push(now + self.outside[happened].gap, _OUTSIDE, happened)

    def handle(self, now: float, kind: int, index: int, key: str) -> None:
        if kind == _RELEASE:
            self.release(index, now)
        elif kind == _READY:
            self.ready(self.engines[key], now)
        elif kind == _GIVE_UP:
            self.give_up(index, now)
        elif kind == _ARRIVE:
            self.arrive(index, now)
        elif kind == _UNLOCK:
            self.build = None
            self.next_build(now)
        elif kind == _RECHECK:
            self.dispatch(self.engines[key], now)
        elif kind == _DEADLINE:
            self.drain_deadline(key, now)
        elif kind == _OUTSIDE:
            self.happened(index, now)
        elif kind == _PLAN:
            self.admit.append(key)
            self.next_build(now)
        else:
            self.patience(now)

    # -- the queue (Q2-Q4) -------------------------------------------------------------------

    def arrive(self, index: int, now: float) -> None:
        request = self.requests[index]
        engine = self.engines[request.key]
        if engine.last_activity is None:  # its queue is made for its first request
            engine.last_activity = now
        self.tally.request(engine.key)
        if not request.ambient:
            engine.last_activity = now
        self.arrivals += 1
        engine.pending.add(
            Pending(
                index,
                "background" if request.lane == "background" else "interactive",
                now,
                self.arrivals,
                request.ambient,
                request.session,
                request.group,
            )
        )
        if request.gave_up is not None:
            self.push(now + request.gave_up, _GIVE_UP, index)
        self.dispatch(engine, now)

    def dispatch(self, engine: _Engine, now: float) -> None:
        caps = engine.caps
        line = engine.pending
        while line.items and len(engine.running) < caps.width:
            # the ended runs are pruned as each is added (Q3); the pick itself leaves out those
            # past the affinity window, so pruning again here would change no pick
            running = list(engine.running.values())
            gate = ambient_gate_open(
                caps=caps,
                running=len(running),
                non_ambient_running=sum(1 for r in running if not r.ambient),
                non_ambient_pending=line.non_ambient,
                quiet_for=now - (engine.last_activity or now),
            )
            if len(line.items) == 1:
                shown = list(line.items.values())
            else:
                contexts = [(r.session_id, r.group) for r in running]
                contexts += [(r.session_id, r.group) for r in engine.recent]
                shown = line.candidates(contexts)
            pick = pick_next(
                shown,
                running=running,
                recent=engine.recent,
                caps=caps,
                now=now,
                ambient_open=gate,
            )
            if pick.id is None:
                self.recheck(engine, running, now)
                return
            item = line.remove(pick.id)
            assert item is not None  # noqa: S101 - picked among the queued
            engine.running[item.id] = Running(
                item.id, item.lane, now, item.ambient, item.session_id, item.group
            )
            if not item.ambient:
                engine.last_activity = now
            self.tally.wait(engine.key, now - item.enqueued_at)
            self.handed_out(engine, item.id, now)

    def recheck(self, engine: _Engine, running: list[Running], now: float) -> None:
        """Q5: ambient work held only by the quiet window is looked at again when it ends."""
        line = engine.pending
        if line.non_ambient == len(line.items):
            return  # no ambient work waits
        delay = ambient_recheck_in(
            caps=engine.caps,
            running=len(running),
            non_ambient_running=sum(1 for r in running if not r.ambient),
            non_ambient_pending=line.non_ambient,
            quiet_for=now - (engine.last_activity or now),
        )
        if delay is not None:
            self.push(now + delay, _RECHECK, key=engine.key)

    def give_up(self, index: int, now: float) -> None:
        engine = self.engines[self.requests[index].key]
        if engine.pending.remove(index) is not None:
            self.ended(index, now)
            self.dispatch(engine, now)

    # -- the pool: using an engine (PP1) ---------------------------------------------------

    def handed_out(self, engine: _Engine, index: int, now: float) -> None:
        touched = touch(PoolEntry(engine.key, engine.held, engine.last_used, engine.hits), now)
        engine.hits, engine.last_used = touched.hits, now
        if engine.state == _UP and not engine.draining:
            self.enter_gate(engine, index, now)
            return
        engine.waiters.append(index)
        if engine.state == _DOWN and not engine.draining:
            self.want_build(engine, now)

    def enter_gate(self, engine: _Engine, index: int, now: float) -> None:
        if engine.in_gate < engine.slots:
            engine.in_gate += 1
            self.push(now + self.requests[index].work, _RELEASE, index)
        else:
            engine.gate_wait.append(index)

    def release(self, index: int, now: float) -> None:
        engine = self.engines[self.requests[index].key]
        engine.in_gate -= 1
        self.end_run(engine, index, now)
        self.ended(index, now)
        engine.last_used = now
        if engine.gate_wait:
            self.enter_gate(engine, engine.gate_wait.popleft(), now)
        self.dispatch(engine, now)
        if engine.draining and engine.in_use() == 0:
            self.drained(engine, now)
        else:
            self.look_again(now)

    def end_run(self, engine: _Engine, index: int, now: float) -> None:
        ran = engine.running.pop(index)
        if not ran.ambient:
            engine.last_activity = now
        engine.recent = prune_recent(
            (*engine.recent, RecentRun(ran.session_id, ran.group, now)),
            now,
            window=AFFINITY_WINDOW,
            cap=RECENT_CAP,
        )

    def ready(self, engine: _Engine, now: float) -> None:
        engine.state = _UP
        held = engine.model.held
        self.committed += held - engine.held
        engine.held = held
        self.tally.cold_start(engine.key)
        waiters, engine.waiters = engine.waiters, []
        for index in waiters:
            self.enter_gate(engine, index, now)
        self.look_again(now)

    def look_again(self, now: float) -> None:
        """A start waiting for room (not for a drain) plans again: something changed."""
        if self.build is not None and self.build.blocked and self.build.drain is None:
            self.step(now)

    def happened(self, index: int, now: float) -> None:
        """What the log records that no request asked for, at its place in the replay."""
        event = self.outside[index]
        if event.kind == "budget":
            self.budget_changed(event.bytes, now)
        else:
            self.gone(event.key, now)

    def gone(self, key: str, now: float) -> None:
        """A crash or an asked-for stop the log records: that engine goes, as it went.

        Only an engine the replay has up (and not draining) goes; its memory is freed, a
        pinned one is started again (PP17), and its queue and a start waiting for room go on.
        """
        engine = self.engines.get(key)
        if engine is None or engine.state != _UP or engine.draining:
            return
        engine.state = _DOWN
        self.committed -= engine.held
        engine.held = 0
        self.resident.pop(engine.key, None)
        if engine.pinned:
            self.want_build(engine, now)
        self.dispatch(engine, now)
        self.look_again(now)

    def budget_changed(self, budget: int, now: float) -> None:
        """The log's budget change, under settings that follow it (else nothing happens).

        Nothing is evicted for it (a lower budget binds at the next start); a start waiting
        for room looks again.
        """
        if not self.settings.follow_budget:
            return
        self.limits = limits_for(replace(self.settings, budget=budget), self.fast)
        self.look_again(now)

    # -- the pool: making room (PP4, PP5) --------------------------------------------------

    def want_build(self, engine: _Engine, now: float) -> None:
        if engine.queued_build:
            return
        engine.queued_build = True
        if engine.model.plan > 0:  # priced and admitted that much later (the other engines
            self.push(now + engine.model.plan, _PLAN, key=engine.key)  # serve on meanwhile)
            return
        self.admit.append(engine.key)
        self.next_build(now)

    def next_build(self, now: float) -> None:
        while self.build is None and self.admit:
            key = self.admit.popleft()
            wanted = start_share(self.engines[key].model.reserve, self.limits.budget)
            self.build = _Build(RoomSearch(key, wanted, now + DRAIN_WAIT))
            self.step(now)

    def step(self, now: float) -> None:
        """The pool's make-room steps (:func:`room_step`) for the build in hand, carried out."""
        build = self.build
        assert build is not None  # noqa: S101 - called with a build in hand
        build.blocked = False
        engine = self.engines[build.search.key]
        while True:
            short = ledger_shortfall(self.limits, self.committed, build.search.wanted)
            standing = [
                Standing(e.entry(), spoken=e.state == _BUILDING or bool(e.waiters), kept=e.pinned)
                for e in self.resident.values()
            ]
            step = room_step(build.search, short, standing, now, policy=self.policy)
            if step.action == "fit":
                self.start(engine, build.search.wanted, now, build.delay)
                return
            if step.action == "wait":
                build.blocked = True  # PP4: wait for them, then look again
                self.push(build.search.patience_until, _PATIENCE)
                return
            if step.action == "refuse":
                self.refuse(engine, now)
                return
            build.search = step.search
            for key in step.evict:
                self.evict(self.engines[key])
                build.delay = max(build.delay, self.engines[key].model.stop)
            if step.drain is not None:
                victim = self.engines[step.drain]
                if victim.in_use() > 0:
                    victim.draining = True
                    victim.drain_started = now
                    build.drain = victim.key
                    build.blocked = True
                    self.push(now + DRAIN_WAIT + DRAIN_POLL, _DEADLINE, key=victim.key)
                    return
                self.evict(victim)
                build.delay = max(build.delay, victim.model.stop)

    def start(self, engine: _Engine, wanted: int, now: float, delay: float) -> None:
        """Reserved: it loads once its victims have stopped; the next start plans then."""
        engine.queued_build = False
        engine.state = _BUILDING
        engine.held = wanted
        self.committed += wanted
        self.resident[engine.key] = engine
        self.push(now + delay + engine.model.cold_start, _READY, key=engine.key)
        if delay > 0:  # the admission lock is held until the stops end (SG2, PP4)
            self.push(now + delay, _UNLOCK)
            return
        self.build = None
        self.next_build(now)

    def refuse(self, engine: _Engine, now: float) -> None:
        self.tally.refusal(engine.key)
        engine.queued_build = False
        self.build = None
        waiters, engine.waiters = engine.waiters, []
        for index in waiters:  # each waiter gets the error; its queue slot goes back
            self.end_run(engine, index, now)
            self.ended(index, now)
        self.dispatch(engine, now)
        self.next_build(now)

    def evict(self, engine: _Engine) -> None:
        self.tally.eviction(engine.key)
        engine.state = _DOWN
        self.committed -= engine.held
        engine.held = 0
        del self.resident[engine.key]

    def drained(self, engine: _Engine, now: float) -> None:
        """A draining victim went idle: evicted, and the build goes on."""
        engine.draining = False
        self.evict(engine)
        build = self.build
        if build is not None and build.drain == engine.key:
            build.drain = None
            build.delay = max(build.delay, engine.model.stop)
            self.rebuild_waiters(engine, now)
            self.step(now)

    def drain_deadline(self, key: str, now: float) -> None:
        engine = self.engines[key]
        build = self.build
        if not engine.draining or build is None or build.drain != key:
            return
        verdict = drain_verdict(
            busy=engine.in_use() > 0, started_at=engine.drain_started, now=now, wait=DRAIN_WAIT
        )
        if verdict.action != "busy":  # pragma: no cover - idle victims are evicted at release
            return
        engine.draining = False  # PP5: it stays, busy; the start it drained for is refused
        build.drain = None
        waiters, engine.waiters = engine.waiters, []
        for index in waiters:
            self.enter_gate(engine, index, now)
        self.refuse(self.engines[build.search.key], now)

    def rebuild_waiters(self, engine: _Engine, now: float) -> None:
        """Requests that waited for a victim's drain: it went, so they build it again (PP1)."""
        if engine.waiters:
            self.want_build(engine, now)

    def patience(self, now: float) -> None:
        build = self.build
        if (
            build is not None
            and build.blocked
            and build.drain is None
            and now >= build.search.patience_until
        ):
            self.step(now)


def simulate(
    workload: Workload,
    settings: Settings,
    *,
    policies: Mapping[str, EvictionPolicy] | Iterable[EvictionPolicy] = (),
) -> Figures:
    """PM22: the figures ``workload`` would have given under ``settings``.

    ``policies`` are extra eviction policies (plugins') the settings may name.

    Raises:
        UsageError: ``settings.policy`` names no known policy.
    """
    policy = eviction_policy(settings.policy, policies)
    return _Sim(workload, settings, policy).run()
