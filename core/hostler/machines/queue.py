"""One engine's request queue, sans I/O: what waits, what runs, and who goes next (Q2–Q10).

:class:`QueueDispatch` holds the queue's state (the queued requests and their ranks, the
running ones, the runs that ended lately for affinity, when a person last used the engine)
and sequences the dispatch loop around :func:`hostler.policies.queue.pick_next`. The driver
(:class:`hostler.runtime.queue.RequestQueue`) reports what happened, with the time it read,
and carries out the effects in order::

    arrive(Arrival)          → Record(queue.enqueued), then the drain
    Released(id)             → Record(queue.released), then the drain     (nothing: not running)
    Left(id, why)            → Record(queue.cancelled), Dismiss(id), then the drain
                                                                          (nothing: not queued)
    Moved(id, up | down)     → Record(queue.moved), then the drain        (nothing: at an edge)
    Resized(width, caps)     → the drain
    RecheckDue()             → the drain (the ambient re-check's time came)

    the drain: while a slot is free and the pick names a request:
                   Record(queue.dispatched), Grant(id)
               then WakeAmbient() (what the ambient re-check waits for may have changed)

An observation that changes nothing returns no effects.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from hostler.events.base import Event
from hostler.events.queue import (
    QueueCancelled,
    QueueDispatched,
    QueueEnqueued,
    QueueMoved,
    QueueReleased,
)
from hostler.policies.queue import (
    AFFINITY_WINDOW,
    AMBIENT_QUIET,
    MAX_WAIT,
    RECENT_CAP,
    Lane,
    LaneCaps,
    Pending,
    RecentRun,
    Running,
    ahead_of,
    ambient_gate_open,
    ambient_recheck_in,
    lane_caps,
    move_pending,
    pick_next,
    prune_recent,
)

__all__ = [
    "ActiveRequest",
    "Arrival",
    "Dismiss",
    "Grant",
    "Left",
    "Moved",
    "QueueDispatch",
    "QueueEffect",
    "QueueObservation",
    "QueueSummary",
    "QueuedRequest",
    "RecheckDue",
    "Record",
    "Released",
    "Resized",
    "WakeAmbient",
]

# -- what the queue shows (Q9) -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ActiveRequest:
    """Q9: a request holding a slot, and for how long (seconds)."""

    id: int
    lane: Lane
    ambient: bool
    session_id: str | None
    group: str | None
    label: str | None
    running_for: float


@dataclass(frozen=True, slots=True)
class QueuedRequest:
    """Q9: a queued request, its 1-based place in its lane, and how long it has waited."""

    id: int
    lane: Lane
    ambient: bool
    session_id: str | None
    group: str | None
    label: str | None
    position: int
    waited: float


@dataclass(frozen=True, slots=True)
class QueueSummary:
    """Q9: the queue at a glance (``ambient_held``: queued ambient requests the gate holds)."""

    engine: str
    width: int
    interactive_cap: int
    background_cap: int
    running: int
    running_interactive: int
    running_background: int
    queued_interactive: int
    queued_background: int
    ambient_held: int
    active: tuple[ActiveRequest, ...]
    pending: tuple[QueuedRequest, ...]


# -- observations ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Arrival:
    """A request asks for a slot (Q2): its lane, its affinity keys and a name for people.

    ``ambient``: background work done only while nobody uses the engine (Q5); ``affinity``
    False scores it 0 for affinity whatever it shares (Q4).
    """

    lane: Lane
    ambient: bool = False
    session_id: str | None = None
    group: str | None = None
    affinity: bool = True
    label: str | None = None


@dataclass(frozen=True, slots=True)
class Released:
    """The request ``id`` gave its slot back (Q3)."""

    id: int


@dataclass(frozen=True, slots=True)
class Left:
    """The queued request ``id`` left without running (Q7): cancelled, aborted or timed out."""

    id: int
    why: Literal["cancelled", "aborted", "timeout"]


@dataclass(frozen=True, slots=True)
class Moved:
    """Q8: the queued request ``id`` is to swap places with its neighbour in its lane."""

    id: int
    direction: Literal["up", "down"]


@dataclass(frozen=True, slots=True)
class Resized:
    """The width changes live; a cap left None is the one asked at construction."""

    width: int
    interactive_cap: int | None = None
    background_cap: int | None = None


@dataclass(frozen=True, slots=True)
class RecheckDue:
    """The time :meth:`QueueDispatch.recheck_in` named has come: the ambient gate may be open."""


QueueObservation = Released | Left | Moved | Resized | RecheckDue

# -- effects -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Record:
    """Record this ``queue.*`` event."""

    event: Event


@dataclass(frozen=True, slots=True)
class Grant:
    """Wake the waiter of request ``id``: it holds a slot since ``at``."""

    id: int
    at: float


@dataclass(frozen=True, slots=True)
class Dismiss:
    """Wake the waiter of request ``id``: it left the queue after ``waited`` seconds.

    ``outcome`` is what its waiter is told (an abort is told as a cancel); ``ahead`` is how
    many were ahead of it as it left (Q10).
    """

    id: int
    outcome: Literal["cancelled", "timeout"]
    waited: float
    ahead: int


@dataclass(frozen=True, slots=True)
class WakeAmbient:
    """The queue changed: an ambient re-check waiting for a change asks :meth:`recheck_in` again."""


QueueEffect = Record | Grant | Dismiss | WakeAmbient


class QueueDispatch:
    """The state and the dispatch sequencing of one engine's request queue (pure).

    Args:
        engine: The engine key it serves (named in its events).
        width: How many requests may hold a slot at once (Q1).
        interactive_cap: The interactive lane's cap (default: the width; clamped to it).
        background_cap: The background lane's cap (default: the width; clamped to it).
        affinity: Whether the pick prefers requests of what ran last (Q4).
        quiet_window: Q5's quiet window in seconds (0 or less: ambient work is never held).
        max_wait: Q4's starvation bound in seconds.
        affinity_window: How long an ended run still counts for affinity (seconds).
        now: When the queue was made: the quiet window starts then (Q1).

    Raises:
        ValueError: ``width`` is below 1.
    """

    def __init__(
        self,
        engine: str,
        width: int = 1,
        *,
        interactive_cap: int | None = None,
        background_cap: int | None = None,
        affinity: bool = True,
        quiet_window: float = AMBIENT_QUIET,
        max_wait: float = MAX_WAIT,
        affinity_window: float = AFFINITY_WINDOW,
        now: float,
    ) -> None:
        self.engine = engine
        self._caps_asked = (interactive_cap, background_cap)
        self._caps = lane_caps(width, interactive=interactive_cap, background=background_cap)
        self.affinity = affinity
        self.quiet_window = quiet_window
        self.max_wait = max_wait
        self.affinity_window = affinity_window
        self._next_id = 1
        self._pending: dict[int, Pending] = {}
        self._running: dict[int, Running] = {}
        self._labels: dict[int, str | None] = {}
        self._recent: tuple[RecentRun, ...] = ()
        self._last_activity = now

    @property
    def caps(self) -> LaneCaps:
        """The width and the lanes' caps now."""
        return self._caps

    # -- what happened ---------------------------------------------------------------------

    def arrive(self, arrival: Arrival, now: float) -> tuple[int, list[QueueEffect]]:
        """Queue ``arrival`` at ``now``: its id, and the effects (its dispatch among them).

        Raises:
            ValueError: The lane is neither interactive nor background.
        """
        lane = arrival.lane
        if lane not in ("interactive", "background"):
            raise ValueError(f"a request's lane is interactive or background, not {lane!r}")
        request_id = self._next_id
        self._next_id += 1
        if not arrival.ambient:
            self._last_activity = now  # Q2: a non-ambient arrival is activity
        self._pending[request_id] = Pending(
            request_id,
            lane,
            now,
            request_id,  # a request's rank is its id until a move swaps it (Q8)
            ambient=arrival.ambient,
            session_id=arrival.session_id,
            group=arrival.group,
            affinity=arrival.affinity,
        )
        self._labels[request_id] = arrival.label
        enqueued = QueueEnqueued(
            self.engine,
            request_id,
            lane,
            arrival.ambient,
            arrival.session_id,
            arrival.group,
            arrival.label,
            round(now, 6),
        )
        return request_id, [Record(enqueued), *self._drain(now)]

    def handle(self, observation: QueueObservation, now: float) -> list[QueueEffect]:
        """Take ``observation`` made at ``now``: what the driver carries out, in order.

        Raises:
            ValueError: A move's direction is neither up nor down, or a width is below 1.
        """
        match observation:
            case Released(request_id):
                return self._release(request_id, now)
            case Left(request_id, why):
                return self._leave(request_id, why, now)
            case Moved(request_id, direction):
                return self._move(request_id, direction, now)
            case Resized(width, interactive_cap, background_cap):
                asked_interactive, asked_background = self._caps_asked
                self._caps = lane_caps(
                    width,
                    interactive=asked_interactive if interactive_cap is None else interactive_cap,
                    background=asked_background if background_cap is None else background_cap,
                )
                return self._drain(now)
            case RecheckDue():
                return self._drain(now)

    def _release(self, request_id: int, now: float) -> list[QueueEffect]:
        run = self._running.pop(request_id, None)
        if run is None:
            return []
        self._labels.pop(request_id, None)
        if not run.ambient:
            self._last_activity = now
        self._recent = prune_recent(
            (*self._recent, RecentRun(run.session_id, run.group, now)),
            now,
            window=self.affinity_window,
            cap=RECENT_CAP,
        )
        released = QueueReleased(
            self.engine, run.id, run.lane, round(now - run.started_at, 6), round(now, 6)
        )
        return [Record(released), *self._drain(now)]

    def _leave(
        self, request_id: int, why: Literal["cancelled", "aborted", "timeout"], now: float
    ) -> list[QueueEffect]:
        if request_id not in self._pending:
            return []
        ahead = self.ahead_of(request_id) or 0  # Q10 as it leaves, for a timeout's message
        item = self._pending.pop(request_id)
        self._labels.pop(request_id, None)
        waited = now - item.enqueued_at
        cancelled = QueueCancelled(
            self.engine, item.id, item.lane, why, round(waited, 6), round(now, 6)
        )
        outcome: Literal["cancelled", "timeout"] = "timeout" if why == "timeout" else "cancelled"
        dismiss = Dismiss(item.id, outcome, max(waited, 0.0), ahead)
        return [Record(cancelled), dismiss, *self._drain(now)]  # one fewer may open the gate

    def _move(
        self, request_id: int, direction: Literal["up", "down"], now: float
    ) -> list[QueueEffect]:
        if direction not in ("up", "down"):
            raise ValueError(f"a move is up or down, not {direction!r}")
        orders = move_pending(list(self._pending.values()), request_id, direction)
        if orders is None:
            return []
        for item_id, order in orders.items():
            self._pending[item_id] = dataclasses.replace(self._pending[item_id], order=order)
        other = next(i for i in orders if i != request_id)
        moved = QueueMoved(self.engine, request_id, direction, other, round(now, 6))
        return [Record(moved), *self._drain(now)]

    # -- the drain (Q3, Q4) ----------------------------------------------------------------

    def _gate_open(self, now: float) -> bool:
        others_running, others_pending = self._non_ambient()
        return ambient_gate_open(
            caps=self._caps,
            running=len(self._running),
            non_ambient_running=others_running,
            non_ambient_pending=others_pending,
            quiet_for=now - self._last_activity,
            quiet_window=self.quiet_window,
        )

    def _non_ambient(self) -> tuple[int, int]:
        """How many non-ambient requests run, and how many wait."""
        return (
            sum(1 for r in self._running.values() if not r.ambient),
            sum(1 for p in self._pending.values() if not p.ambient),
        )

    def _drain(self, now: float) -> list[QueueEffect]:
        effects: list[QueueEffect] = []
        while self._pending and len(self._running) < self._caps.width:
            self._recent = prune_recent(
                self._recent, now, window=self.affinity_window, cap=RECENT_CAP
            )
            pick = pick_next(
                list(self._pending.values()),
                running=list(self._running.values()),
                recent=self._recent,
                caps=self._caps,
                now=now,
                ambient_open=self._gate_open(now),
                affinity=self.affinity,
                max_wait=self.max_wait,
                window=self.affinity_window,
            )
            if pick.id is None:
                break
            inputs = {  # PM18: what the log does not otherwise hold, for replay --verify
                "now": now,
                "max_wait": self.max_wait,
                "window": self.affinity_window,
                "affinity": self.affinity,
                "opted_out": sorted(p.id for p in self._pending.values() if not p.affinity),
            }
            item = self._pending.pop(pick.id)
            self._running[item.id] = Running(
                item.id, item.lane, now, item.ambient, item.session_id, item.group
            )
            if not item.ambient:
                self._last_activity = now
            dispatched = QueueDispatched(
                self.engine,
                item.id,
                item.lane,
                round(now - item.enqueued_at, 6),
                round(now, 6),
                {**pick.decision, "inputs": inputs},
            )
            effects += [Record(dispatched), Grant(item.id, now)]
        effects.append(WakeAmbient())
        return effects

    # -- looking ---------------------------------------------------------------------------

    def recheck_in(self, request_id: int, now: float) -> float | None:
        """Q5: seconds until the queued ambient request ``request_id`` should be looked at again.

        None when no timer is needed for it: it is not the first queued ambient request (one
        timer is enough), or no wait on time can open the gate (see
        :func:`~hostler.policies.queue.ambient_recheck_in`).
        """
        first = next((p for p in self._pending.values() if p.ambient), None)
        if first is None or first.id != request_id:
            return None
        others_running, others_pending = self._non_ambient()
        return ambient_recheck_in(
            caps=self._caps,
            running=len(self._running),
            non_ambient_running=others_running,
            non_ambient_pending=others_pending,
            quiet_for=now - self._last_activity,
            quiet_window=self.quiet_window,
        )

    def position(self, request_id: int) -> int | None:
        """The 1-based place of a queued request among its lane's; None if not queued."""
        item = self._pending.get(request_id)
        if item is None:
            return None
        return 1 + sum(
            1 for p in self._pending.values() if p.lane == item.lane and p.order < item.order
        )

    def positions(self) -> dict[int, int]:
        """Every queued request's 1-based place in its lane, by id."""
        return {i: p for i in self._pending if (p := self.position(i)) is not None}

    def rank(self, request_id: int) -> int | None:
        """A queued request's rank in its lane (lower goes first, Q8); None if not queued."""
        item = self._pending.get(request_id)
        return None if item is None else item.order

    def ahead_of(self, request_id: int) -> int | None:
        """Q10: how many requests are ahead of a queued one; None if it is not queued."""
        item = self._pending.get(request_id)
        if item is None:
            return None
        return ahead_of(
            item.lane,
            running=len(self._running),
            queued_interactive=sum(1 for p in self._pending.values() if p.lane == "interactive"),
            queued_background=sum(1 for p in self._pending.values() if p.lane == "background"),
        )

    @property
    def busy(self) -> bool:
        """Whether anything runs or waits."""
        return bool(self._running or self._pending)

    def describe(self, now: float) -> QueueSummary:
        """Q9: what runs, what waits and why, at ``now``."""
        gate = self._gate_open(now)
        active = tuple(
            ActiveRequest(
                r.id,
                r.lane,
                r.ambient,
                r.session_id,
                r.group,
                self._labels.get(r.id),
                round(now - r.started_at, 6),
            )
            for r in self._running.values()
        )
        queued = sorted(self._pending.values(), key=lambda p: (p.lane != "interactive", p.order))
        pending = tuple(
            QueuedRequest(
                p.id,
                p.lane,
                p.ambient,
                p.session_id,
                p.group,
                self._labels.get(p.id),
                self.position(p.id) or 0,
                round(now - p.enqueued_at, 6),
            )
            for p in queued
        )
        return QueueSummary(
            engine=self.engine,
            width=self._caps.width,
            interactive_cap=self._caps.interactive,
            background_cap=self._caps.background,
            running=len(active),
            running_interactive=sum(1 for a in active if a.lane == "interactive"),
            running_background=sum(1 for a in active if a.lane == "background"),
            queued_interactive=sum(1 for q in pending if q.lane == "interactive"),
            queued_background=sum(1 for q in pending if q.lane == "background"),
            ambient_held=0 if gate else sum(1 for q in pending if q.ambient),
            active=active,
            pending=pending,
        )
