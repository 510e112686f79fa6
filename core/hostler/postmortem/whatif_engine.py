"""What-if's engines: each one's request queue (Q2-Q5) and its standing in the pool (PP1).

A :class:`SimEngine` is the what-if's stand-in for an engine with its queue: the queue's
pick is :func:`hostler.policies.queue.pick_next` over the candidates its :class:`QueueLine`
shows, and its demand is the pool's own bookkeeping (:func:`hostler.policies.pool.touch`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from hostler.policies.pool import PoolEntry, touch
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
from hostler.postmortem.workload import Model

__all__ = ["BUILDING", "DOWN", "UP", "QueueLine", "SimEngine"]

#: An engine's states in the what-if: not resident, being built (or waited on), serving.
DOWN, BUILDING, UP = 0, 1, 2

_Index = dict[tuple[str, bool, str], dict[int, Pending]]


class QueueLine:
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
        """Queue ``item`` last."""
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
        """Take request ``ident`` out of the queue (None when it is not queued)."""
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
        """The requests a pick can choose among, given the (session, group) of runs, in order."""
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


class SimEngine:
    """One engine in the what-if: its state and memory, its queue, its runs and its gate.

    Args:
        model: What the workload recorded of it (sizes, start and stop times).
        slots: Its physical slots (the gate's width; the queue's width follows from them).
        pinned: Started first and never evicted (PP17).
    """

    __slots__ = (
        "caps",
        "drain_started",
        "draining",
        "files",
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
        "quiet_moves",
        "recent",
        "running",
        "sessions",
        "slots",
        "state",
        "waiters",
    )

    def __init__(self, model: Model, slots: int, pinned: bool) -> None:
        self.key = model.key
        self.model = model
        self.slots = slots
        self.caps: LaneCaps = engine_queue_caps(slots)
        self.state = DOWN
        self.held = 0
        self.last_used = 0.0
        self.hits: tuple[float, ...] = ()
        self.pending = QueueLine()
        self.running: dict[int, Running] = {}  # dispatched: holds a queue slot
        self.recent: tuple[RecentRun, ...] = ()
        self.last_activity: float | None = None  # Q1: the quiet clock starts with its queue
        self.quiet_moves = 0  # how often the quiet clock was set: a re-check asked at one count
        self.waiters: list[int] = []  # dispatched, waiting for the engine to be up
        self.in_gate = 0
        self.gate_wait: deque[int] = deque()
        self.draining = False
        self.drain_started = 0.0
        self.pinned = pinned
        self.queued_build = False
        self.sessions: set[str] = set()  # CC13: sessions its running launch holds
        self.files: set[str] = set()  # sessions saved to files by its stops

    def turn(self, session: str | None) -> float | None:
        """CC13: a session's turn reaches it; the seconds of its restore, None when none.

        A session this launch does not hold, saved by an earlier stop, is restored (the
        model's recorded median); an engine the log shows keeping no session restores none.
        Within one launch a session is taken as held (slot recycling is not replayed).
        """
        restore = self.model.restore
        if session is None or restore is None:
            return None
        restored = session not in self.sessions and session in self.files
        self.sessions.add(session)
        return restore if restored else None

    def sessions_end(self, *, saved: bool) -> None:
        """CC13: its launch ends; a stop saves what it held, a crash loses it."""
        if saved:
            self.files |= self.sessions
        self.sessions = set()

    def in_use(self) -> int:
        """Requests in its gate or waiting at it."""
        return self.in_gate + len(self.gate_wait)

    def entry(self) -> PoolEntry:
        """What the pool's policies see of it (busy while it has work or is being built)."""
        busy = (
            self.in_use() > 0 or self.state == BUILDING or bool(self.running or self.pending.items)
        )
        return PoolEntry(
            self.key, self.held, self.last_used, self.hits, busy=busy, draining=self.draining
        )

    # -- the queue (Q2-Q5) -------------------------------------------------------------------

    def active(self, now: float) -> None:
        """The quiet clock (Q5) starts again at ``now``: its queue was made, or a person used it."""
        self.last_activity = now
        self.quiet_moves += 1

    def quiet_for(self, now: float) -> float:
        """Q5: how long the quiet clock has run at ``now`` (0 before its queue was made)."""
        # a clock set at 0.0 is a time like any other, not "never set"
        return 0.0 if self.last_activity is None else now - self.last_activity

    def can_take(self) -> bool:
        """Requests are queued and a queue slot is free."""
        return bool(self.pending.items) and len(self.running) < self.caps.width

    def take(self, now: float) -> Pending | None:
        """The queue's pick, given its slot (it runs from ``now``), or None: the pick holds all."""
        caps = self.caps
        line = self.pending
        # the ended runs are pruned as each is added (Q3); the pick itself leaves out those
        # past the affinity window, so pruning again here would change no pick
        running = list(self.running.values())
        gate = ambient_gate_open(
            caps=caps,
            running=len(running),
            non_ambient_running=sum(1 for r in running if not r.ambient),
            non_ambient_pending=line.non_ambient,
            quiet_for=self.quiet_for(now),
        )
        if len(line.items) == 1:
            shown = list(line.items.values())
        else:
            contexts = [(r.session_id, r.group) for r in running]
            contexts += [(r.session_id, r.group) for r in self.recent]
            shown = line.candidates(contexts)
        pick = pick_next(
            shown,
            running=running,
            recent=self.recent,
            caps=caps,
            now=now,
            ambient_open=gate,
        )
        if pick.id is None:
            return None
        item = line.remove(pick.id)
        assert item is not None  # noqa: S101 - picked among the queued
        self.running[item.id] = Running(
            item.id, item.lane, now, item.ambient, item.session_id, item.group
        )
        if not item.ambient:
            self.active(now)
        return item

    def recheck_in(self, now: float) -> float | None:
        """Q5: when ambient work held only by the quiet window is to be looked at again."""
        line = self.pending
        if line.non_ambient == len(line.items):
            return None  # no ambient work waits
        running = list(self.running.values())
        return ambient_recheck_in(
            caps=self.caps,
            running=len(running),
            non_ambient_running=sum(1 for r in running if not r.ambient),
            non_ambient_pending=line.non_ambient,
            quiet_for=self.quiet_for(now),
        )

    def end_run(self, index: int, now: float) -> None:
        """Request ``index`` gave its queue slot back (ran, or its start was refused)."""
        ran = self.running.pop(index)
        if not ran.ambient:
            self.active(now)
        self.recent = prune_recent(
            (*self.recent, RecentRun(ran.session_id, ran.group, now)),
            now,
            window=AFFINITY_WINDOW,
            cap=RECENT_CAP,
        )

    # -- the pool ----------------------------------------------------------------------------

    def used(self, now: float) -> None:
        """PP1: a request was handed to it: its demand counts it."""
        touched = touch(PoolEntry(self.key, self.held, self.last_used, self.hits), now)
        self.hits, self.last_used = touched.hits, now

    def unload(self, *, crashed: bool = False) -> int:
        """It goes down (evicted, crashed or stopped); the bytes it held are returned.

        CC13: a stop saves the sessions it held (they are restored at their next turn); a
        crash loses them.
        """
        self.sessions_end(saved=not crashed)
        freed = self.held
        self.state = DOWN
        self.held = 0
        return freed
