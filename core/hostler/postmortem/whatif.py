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

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from hostler.capacity.ledger import LedgerLimits
from hostler.capacity.ledger import shortfall as ledger_shortfall
from hostler.policies.eviction import EvictionPolicy, eviction_policy
from hostler.policies.pool import DRAIN_WAIT, drain_bound, drain_verdict
from hostler.policies.queue import Pending
from hostler.policies.room import RoomSearch, Standing, room_step, start_share
from hostler.postmortem.figures import Figures, Tally
from hostler.postmortem.whatif_agenda import (
    ARRIVE,
    DEADLINE,
    GIVE_UP,
    OUTSIDE,
    PATIENCE,
    PLAN,
    READY,
    RECHECK,
    RELEASE,
    UNLOCK,
    Agenda,
    Script,
)
from hostler.postmortem.whatif_engine import BUILDING, DOWN, UP, SimEngine
from hostler.postmortem.workload import Model, Request, Settings, Workload

__all__ = ["DRAIN_POLL", "limits_for", "simulate"]

#: How often the pool looks at a draining victim (seconds); a drain past the bound is given up
#: at the first look after it.
DRAIN_POLL = 0.5


def limits_for(settings: Settings, fast: int | None) -> LedgerLimits:
    """PM22: the ledger limits a what-if runs under: its budget always enforced (as an override).

    Without spillover, co-resident models share the fast budget (``fast``, never above the
    budget); when the log shows none, the ceiling is the budget.
    """
    budget = max(settings.budget, 0)
    quick = budget if fast is None else min(fast, budget)
    ceiling = budget if settings.spillover else quick
    return LedgerLimits(True, budget, quick, settings.spillover, ceiling)


@dataclass
class _Build:
    search: RoomSearch
    delay: float = 0.0  # the longest stop of its victims: the start waits for them (SG2)
    drain: str | None = None
    blocked: bool = False


class _Sim:
    r"""The runtime's queue and pool over :class:`SimEngine`\ s, carried out on an agenda."""

    def __init__(
        self, workload: Workload, settings: Settings, policy: EvictionPolicy, agenda: Agenda
    ) -> None:
        self.settings, self.fast = settings, workload.fast
        start = settings.budget
        if settings.follow_budget and workload.first_budget is not None:
            start = workload.first_budget  # the recorded changes then follow, in time
        self.limits = limits_for(replace(settings, budget=start), workload.fast)
        self.policy = policy
        keys = set(workload.models) | {r.key for r in workload.requests}
        self.engines: dict[str, SimEngine] = {}
        for key in sorted(keys):
            model = workload.models.get(key) or Model(key, 0, 0)
            slots = settings.slots or workload.slots.get(key, 1)
            self.engines[key] = SimEngine(model, max(slots, 1), key in workload.pinned)
        self.resident: dict[str, SimEngine] = {}  # building or up
        self.committed = 0
        self.agenda = agenda
        self.script = Script(workload, agenda)
        self.requests: tuple[Request, ...] = workload.requests
        self.admit: deque[str] = deque()
        self.build: _Build | None = None
        self.tally = Tally(sorted(keys))
        self.arrivals = 0  # the queue order: requests go in line as they arrive here
        self.arrived: dict[int, float] = {}  # when each request waiting for its engine came

    def handle(self, now: float, kind: int, index: int, key: str) -> None:
        """Carry out one event of the agenda."""
        if kind == RELEASE:
            self.release(index, now)
        elif kind == READY:
            self.ready(self.engines[key], now)
        elif kind == GIVE_UP:
            self.give_up(index, now)
        elif kind == ARRIVE:
            self.arrive(index, now)
        elif kind == UNLOCK:
            self.build = None
            self.next_build(now)
        elif kind == RECHECK:
            self.dispatch(self.engines[key], now, asked_at=index)
        elif kind == DEADLINE:
            self.drain_deadline(key, now)
        elif kind == OUTSIDE:
            self.happened(index, now)
        elif kind == PLAN:
            self.admit.append(key)
            self.next_build(now)
        else:
            self.patience(now)

    # -- the queue (Q2-Q5) -------------------------------------------------------------------

    def arrive(self, index: int, now: float) -> None:
        """A request arrives: queued on its engine, and the queue dispatches."""
        request = self.requests[index]
        engine = self.engines[request.key]
        if engine.last_activity is None or not request.ambient:
            engine.active(now)  # its queue is made for its first request; a person uses it
        self.tally.request(engine.key)
        self.arrived[index] = now
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
            self.agenda.push(now + request.gave_up, GIVE_UP, index)
        self.dispatch(engine, now)

    def dispatch(self, engine: SimEngine, now: float, asked_at: int | None = None) -> None:
        """The queue hands out its free slots by its pick; held ambient work is looked at later.

        ``asked_at``: for a re-check, the count of the quiet clock's moves when it was asked.

        Raises:
            RuntimeError: A re-check came when the quiet window it waited for had passed, with
                the quiet clock where it stood when it was asked, and the queue still asks for
                another one: it would ask forever (a defect, never a workload's doing).
        """
        while engine.can_take():
            item = engine.take(now)
            if item is None:
                delay = engine.recheck_in(now)  # Q5
                if delay is not None:
                    if asked_at == engine.quiet_moves:
                        raise RuntimeError(
                            f"what-if: {engine.key}'s ambient re-check at {now:.3f} s changed "
                            "nothing and asked for another: the simulation would never end"
                        )
                    self.agenda.push(now + delay, RECHECK, engine.quiet_moves, engine.key)
                return
            self.tally.wait(engine.key, now - item.enqueued_at)
            self.handed_out(engine, item.id, now)

    def give_up(self, index: int, now: float) -> None:
        """A queued request gave up waiting (its client left)."""
        engine = self.engines[self.requests[index].key]
        if engine.pending.remove(index) is not None:
            self.arrived.pop(index, None)  # it never reached the engine: no whole wait
            self.script.ended(index, now)
            self.dispatch(engine, now)

    # -- the pool: using an engine (PP1) ---------------------------------------------------

    def handed_out(self, engine: SimEngine, index: int, now: float) -> None:
        """A dispatched request goes to its engine's gate, or waits for the engine (built)."""
        engine.used(now)
        if engine.state == UP and not engine.draining:
            self.enter_gate(engine, index, now)
            return
        engine.waiters.append(index)
        if engine.state == DOWN and not engine.draining:
            self.want_build(engine, now)

    def enter_gate(self, engine: SimEngine, index: int, now: float) -> None:
        """Through the engine's physical gate (it runs), or in line for a slot of it."""
        if engine.in_gate < engine.slots:
            engine.in_gate += 1
            request = self.requests[index]
            restore = engine.turn(request.session)  # CC13: part of the client's wait
            if restore is None:
                restore = 0.0
            else:
                self.tally.restore(engine.key)
            arrived = self.arrived.pop(index)
            self.tally.served(engine.key, now + restore - arrived)  # the client's whole wait
            self.agenda.push(now + restore + request.work, RELEASE, index)
        else:
            engine.gate_wait.append(index)

    def release(self, index: int, now: float) -> None:
        """A request ran its course: its slots go back and whatever waited for them goes on."""
        engine = self.engines[self.requests[index].key]
        engine.in_gate -= 1
        engine.end_run(index, now)
        self.script.ended(index, now)
        engine.last_used = now
        if engine.gate_wait:
            self.enter_gate(engine, engine.gate_wait.popleft(), now)
        self.dispatch(engine, now)
        if engine.draining and engine.in_use() == 0:
            self.drained(engine, now)
        else:
            self.look_again(now)

    def ready(self, engine: SimEngine, now: float) -> None:
        """A start ended: it holds what it measured, and its waiters enter its gate."""
        engine.state = UP
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
        event = self.script.outside[index]
        if event.kind == "budget":
            self.budget_changed(event.bytes, now)
        else:
            self.gone(event.key, now, crashed=event.kind == "crashed")

    def gone(self, key: str, now: float, *, crashed: bool) -> None:
        """A crash or an asked-for stop the log records: that engine goes, as it went.

        Only an engine the replay has up (and not draining) goes; its memory is freed, a
        pinned one is started again (PP17), and its queue and a start waiting for room go on.
        """
        engine = self.engines.get(key)
        if engine is None or engine.state != UP or engine.draining:
            return
        self.committed -= engine.unload(crashed=crashed)
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

    def want_build(self, engine: SimEngine, now: float) -> None:
        """The engine is to be started: in line for admission (once priced, if that takes time)."""
        if engine.queued_build:
            return
        engine.queued_build = True
        if engine.model.plan > 0:  # priced and admitted that much later (the other engines
            self.agenda.push(now + engine.model.plan, PLAN, key=engine.key)  # serve on meanwhile)
            return
        self.admit.append(engine.key)
        self.next_build(now)

    def next_build(self, now: float) -> None:
        """One start plans at a time: the next in line, while none is in hand."""
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
                Standing(e.entry(), spoken=e.state == BUILDING or bool(e.waiters), kept=e.pinned)
                for e in self.resident.values()
            ]
            step = room_step(
                build.search, short, standing, now, limits=self.limits, policy=self.policy
            )
            if step.action == "fit":
                self.start(engine, build.search.wanted, now, build.delay)
                return
            if step.action == "wait":
                build.blocked = True  # PP4: wait for them, then look again
                self.agenda.push(build.search.patience_until, PATIENCE)
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
                    bound = drain_bound(build.search.key, DRAIN_WAIT)
                    if bound is not None:  # PP5: a start's drain has none (drain_bound)
                        self.agenda.push(now + bound + DRAIN_POLL, DEADLINE, key=victim.key)
                    return
                self.evict(victim)
                build.delay = max(build.delay, victim.model.stop)

    def start(self, engine: SimEngine, wanted: int, now: float, delay: float) -> None:
        """Reserved: it loads once its victims have stopped; the next start plans then."""
        engine.queued_build = False
        engine.state = BUILDING
        engine.held = wanted
        self.committed += wanted
        self.resident[engine.key] = engine
        self.agenda.push(now + delay + engine.model.cold_start, READY, key=engine.key)
        if delay > 0:  # the admission lock is held until the stops end (SG2, PP4)
            self.agenda.push(now + delay, UNLOCK)
            return
        self.build = None
        self.next_build(now)

    def refuse(self, engine: SimEngine, now: float) -> None:
        """The start is refused: its waiters get the error and give their queue slots back."""
        self.tally.refusal(engine.key)
        engine.queued_build = False
        self.build = None
        waiters, engine.waiters = engine.waiters, []
        for index in waiters:  # each waiter gets the error; its queue slot goes back
            engine.end_run(index, now)
            self.arrived.pop(index, None)
            self.script.ended(index, now)
        self.dispatch(engine, now)
        self.next_build(now)

    def evict(self, engine: SimEngine) -> None:
        """A victim is stopped: its memory is free."""
        self.tally.eviction(engine.key)
        self.committed -= engine.unload()
        del self.resident[engine.key]

    def drained(self, engine: SimEngine, now: float) -> None:
        """A draining victim went idle: evicted, and the build goes on."""
        engine.draining = False
        self.evict(engine)
        build = self.build
        if build is not None and build.drain == engine.key:
            build.drain = None
            build.delay = max(build.delay, engine.model.stop)
            if engine.waiters:  # they waited for its drain: it went, so they build it again
                self.want_build(engine, now)  # PP1
            self.step(now)

    def drain_deadline(self, key: str, now: float) -> None:
        """PP5: a victim still busy past the drain bound stays; the start is refused."""
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

    def patience(self, now: float) -> None:
        """A start that waited for spoken-for engines up to the bound plans again."""
        build = self.build
        if (
            build is not None
            and build.blocked
            and build.drain is None
            and now >= build.search.patience_until
        ):
            self.step(now)


def _run(workload: Workload, settings: Settings, policy: EvictionPolicy) -> Figures:
    """The replay: the recorded arrivals and the agenda's events, in time order."""
    agenda = Agenda()
    sim = _Sim(workload, settings, policy, agenda)
    script = sim.script
    requests, arrivals = workload.requests, script.open
    start = requests[0].at if requests else 0.0
    script.put_outside()
    for engine in sim.engines.values():
        if engine.pinned:
            sim.want_build(engine, start)
    i, n = 0, len(arrivals)
    while i < n or agenda:
        due = agenda.next_at()
        if due is not None and (i >= n or due <= requests[arrivals[i]].at):
            sim.handle(*agenda.pop())
        else:
            index = arrivals[i]
            sim.arrive(index, requests[index].at)
            i += 1
    return sim.tally.figures()


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
    return _run(workload, settings, policy)
