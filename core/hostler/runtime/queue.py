"""The request queue in front of one engine (driver; Q2–Q5, Q7–Q10, Q12).

Callers wrap the work that needs one of the engine's slots::

    async with queue.acquire(lane="interactive", session_id="s1", label="chat") as ticket:
        ...  # holds a slot; released on exit, whatever happens

Which queued request gets a freed slot is decided by the pure rules of
:mod:`hostler.policies.queue` (starvation bound, lanes, ambient gate, affinity); each decision
is recorded (``queue.dispatched``) with its inputs. Cancelling the waiting caller (anyio
cancellation) takes it out of the line without using a slot. Time comes from the injected
:class:`~hostler.clock.Clock`: its wall time stamps the events, its sleeps are the waits on
time (the wait notice, the timeout, the ambient re-check), so a test with
:class:`hostler.testing.VirtualClock` runs minutes of queue time in milliseconds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Literal

import anyio

from hostler.clock import SYSTEM_CLOCK, ClockLike, as_clock
from hostler.errors import QueueCancelledError, QueueTimeoutError
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
    WAIT_NOTICE,
    Lane,
    LaneCaps,
    Pending,
    RecentRun,
    Running,
    ahead_of,
    ambient_gate_open,
    ambient_recheck_in,
    engine_queue_caps,
    lane_caps,
    move_pending,
    pick_next,
    prune_recent,
)

__all__ = ["ActiveRequest", "QueueSummary", "QueuedRequest", "RequestQueue", "Ticket"]

Record = Callable[[Event], None]
_Outcome = Literal["granted", "cancelled", "timeout"]


class Ticket:
    """A request's place in the queue, then its slot; :meth:`release` gives the slot back."""

    __slots__ = (
        "_done",
        "_outcome",
        "_queue",
        "_released",
        "affinity",
        "ambient",
        "enqueued_at",
        "group",
        "id",
        "label",
        "lane",
        "order",
        "session_id",
        "started_at",
    )

    def __init__(
        self,
        queue: RequestQueue,
        request_id: int,
        lane: Lane,
        enqueued_at: float,
        *,
        ambient: bool,
        session_id: str | None,
        group: str | None,
        affinity: bool,
        label: str | None,
    ) -> None:
        self._queue = queue
        self.id = request_id
        self.lane: Lane = lane
        self.enqueued_at = enqueued_at
        self.order = request_id
        self.ambient = ambient
        self.session_id = session_id
        self.group = group
        self.affinity = affinity
        self.label = label
        self.started_at: float | None = None
        self._outcome: _Outcome | None = None
        self._done = anyio.Event()
        self._released = False

    @property
    def running(self) -> bool:
        """Whether it holds a slot now."""
        return self._outcome == "granted" and not self._released

    @property
    def position(self) -> int | None:
        """Its 1-based place among the queued requests of its lane; None once not queued."""
        return self._queue.position(self.id)

    @property
    def ahead(self) -> int | None:
        """Q10: how many requests are ahead of it; None once not queued."""
        return self._queue.ahead_of(self.id)

    def release(self) -> None:
        """Give the slot back (Q3); again, or for a request that never ran, it does nothing."""
        self._queue._release(self)

    def _pending_view(self) -> Pending:
        return Pending(
            id=self.id,
            lane=self.lane,
            enqueued_at=self.enqueued_at,
            order=self.order,
            ambient=self.ambient,
            session_id=self.session_id,
            group=self.group,
            affinity=self.affinity,
        )

    def _running_view(self) -> Running:
        assert self.started_at is not None  # noqa: S101 - only asked of running tickets
        return Running(
            id=self.id,
            lane=self.lane,
            started_at=self.started_at,
            ambient=self.ambient,
            session_id=self.session_id,
            group=self.group,
        )


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


class RequestQueue:
    """The logical request queue of one engine (Q1–Q10).

    Args:
        engine: The engine key it serves (named in events and errors).
        width: How many requests may hold a slot at once (Q1).
        interactive_cap: The interactive lane's cap (default: the width; clamped to it).
        background_cap: The background lane's cap (default: the width; clamped to it).
        affinity: Whether the pick prefers requests of what ran last (Q4).
        quiet_window: Q5's quiet window in seconds (0 or less: ambient work is never held).
        max_wait: Q4's starvation bound in seconds.
        affinity_window: How long an ended run still counts for affinity (seconds).
        clock: The clock: wall time for the events, sleeps for the waits on time.
        record: Receives every queue event (``queue.*``), e.g. to append it to the log.

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
        clock: ClockLike = SYSTEM_CLOCK,
        record: Record | None = None,
    ) -> None:
        self.engine = engine
        self._caps_asked = (interactive_cap, background_cap)
        self._caps = lane_caps(width, interactive=interactive_cap, background=background_cap)
        self.affinity = affinity
        self.quiet_window = quiet_window
        self.max_wait = max_wait
        self.affinity_window = affinity_window
        self._clock = as_clock(clock)
        self._record = record
        self._next_id = 1
        self._pending: dict[int, Ticket] = {}
        self._running: dict[int, Ticket] = {}
        self._recent: tuple[RecentRun, ...] = ()
        self._last_activity = self._clock.wall()  # Q1: the quiet clock starts at construction
        self._wake: anyio.Event | None = None
        self._exit_ahead: dict[int, int] = {}  # Q10 at the moment a request timed out

    @classmethod
    def for_engine(
        cls,
        engine: str,
        engine_width: int,
        *,
        configured: int = 1,
        single_lane: bool = False,
        **options: object,
    ) -> RequestQueue:
        """Q12: the queue in front of a local engine with ``engine_width`` slots.

        ``options`` are the other keyword arguments of :class:`RequestQueue`.
        """
        caps = engine_queue_caps(engine_width, configured=configured, single_lane=single_lane)
        return cls(
            engine,
            caps.width,
            interactive_cap=caps.interactive,
            background_cap=caps.background,
            **options,  # type: ignore[arg-type]
        )

    @property
    def caps(self) -> LaneCaps:
        """The width and the lanes' caps now."""
        return self._caps

    # -- acquiring ---------------------------------------------------------------------------

    @asynccontextmanager
    async def acquire(
        self,
        *,
        lane: Lane = "interactive",
        session_id: str | None = None,
        group: str | None = None,
        ambient: bool = False,
        affinity: bool = True,
        label: str | None = None,
        queue_timeout: float | None = None,
        on_wait: Callable[[int], None] | None = None,
    ) -> AsyncIterator[Ticket]:
        """Wait for a slot (Q2), hold it for the ``async with`` block, then release it (Q3).

        Args:
            lane: ``interactive`` (a person waits) or ``background``.
            session_id: The conversation it belongs to (affinity 2).
            group: A wider affinity key, e.g. the agent (affinity 1).
            ambient: Background work done only while nobody uses the engine (Q5).
            affinity: False scores it 0 for affinity whatever it shares.
            label: A name for people (shown by :meth:`describe` and in events).
            queue_timeout: Give up after this many seconds queued (``queue.timeout``); the
                work's own timeouts start only once it holds the slot.
            on_wait: Called once with the number ahead (Q10) if it is still queued after
                :data:`~hostler.policies.queue.WAIT_NOTICE` seconds.

        Raises:
            QueueCancelledError: :meth:`cancel` took it out of the queue.
            QueueTimeoutError: ``queue_timeout`` passed before it got a slot.
        """
        ticket = self._enqueue(
            lane,
            session_id=session_id,
            group=group,
            ambient=ambient,
            affinity=affinity,
            label=label,
        )
        await self._wait(ticket, queue_timeout, on_wait)
        try:
            yield ticket
        finally:
            ticket.release()

    def _enqueue(
        self,
        lane: Lane,
        *,
        session_id: str | None,
        group: str | None,
        ambient: bool,
        affinity: bool,
        label: str | None,
    ) -> Ticket:
        if lane not in ("interactive", "background"):
            raise ValueError(f"a request's lane is interactive or background, not {lane!r}")
        now = self._clock.wall()
        if not ambient:
            self._last_activity = now  # Q2: a non-ambient arrival is activity
        ticket = Ticket(
            self,
            self._next_id,
            lane,
            now,
            ambient=ambient,
            session_id=session_id,
            group=group,
            affinity=affinity,
            label=label,
        )
        self._next_id += 1
        self._pending[ticket.id] = ticket
        self._emit(
            QueueEnqueued(
                self.engine, ticket.id, lane, ambient, session_id, group, label, round(now, 6)
            )
        )
        self._drain()
        return ticket

    async def _wait(
        self, ticket: Ticket, limit: float | None, on_wait: Callable[[int], None] | None
    ) -> None:
        try:
            if ticket._outcome is None:
                async with anyio.create_task_group() as helpers:
                    if on_wait is not None:
                        helpers.start_soon(self._notice, ticket, on_wait)
                    if limit is not None:
                        helpers.start_soon(self._expire, ticket, limit)
                    if ticket.ambient:
                        helpers.start_soon(self._ambient_clock, ticket)
                    await ticket._done.wait()
                    helpers.cancel_scope.cancel()
        except BaseException:
            if ticket._outcome == "granted":
                ticket.release()  # got the slot while being cancelled: give it back
            elif ticket._outcome is None:
                self._leave(ticket, "aborted")  # Q2: abort while queued consumes no slot
            raise
        if ticket._outcome == "cancelled":
            raise QueueCancelledError(self.engine, ticket.id, self._waited(ticket))
        if ticket._outcome == "timeout":
            raise QueueTimeoutError(
                self.engine, ticket.id, self._waited(ticket), self._ahead_at_exit(ticket)
            )

    async def _notice(self, ticket: Ticket, on_wait: Callable[[int], None]) -> None:
        await self._clock.sleep(WAIT_NOTICE)
        ahead = self.ahead_of(ticket.id)
        if ahead is not None:
            on_wait(ahead)

    async def _expire(self, ticket: Ticket, limit: float) -> None:
        await self._clock.sleep(max(limit, 0.0))
        if ticket._outcome is None:
            self._exit_ahead[ticket.id] = self.ahead_of(ticket.id) or 0
            self._leave(ticket, "timeout")

    async def _ambient_clock(self, ticket: Ticket) -> None:
        # Q5: ambient work held only by the quiet window is looked at again when it ends.
        while ticket._outcome is None:
            delay = self._ambient_delay(ticket)
            if delay is None:
                if self._wake is None:
                    self._wake = anyio.Event()
                await self._wake.wait()
            else:
                await self._clock.sleep(delay)
                self._drain()

    def _ambient_delay(self, ticket: Ticket) -> float | None:
        first = next((t for t in self._pending.values() if t.ambient), None)
        if first is not ticket:
            return None  # one timer is enough: the first queued ambient request keeps it
        non_ambient_pending = sum(1 for t in self._pending.values() if not t.ambient)
        return ambient_recheck_in(
            caps=self._caps,
            running=len(self._running),
            non_ambient_running=sum(1 for t in self._running.values() if not t.ambient),
            non_ambient_pending=non_ambient_pending,
            quiet_for=self._clock.wall() - self._last_activity,
            quiet_window=self.quiet_window,
        )

    # -- draining (Q3, Q4) ---------------------------------------------------------------

    def _gate_open(self, now: float) -> bool:
        return ambient_gate_open(
            caps=self._caps,
            running=len(self._running),
            non_ambient_running=sum(1 for t in self._running.values() if not t.ambient),
            non_ambient_pending=sum(1 for t in self._pending.values() if not t.ambient),
            quiet_for=now - self._last_activity,
            quiet_window=self.quiet_window,
        )

    def _drain(self) -> None:
        while self._pending and len(self._running) < self._caps.width:
            now = self._clock.wall()
            self._recent = prune_recent(
                self._recent, now, window=self.affinity_window, cap=RECENT_CAP
            )
            pick = pick_next(
                [t._pending_view() for t in self._pending.values()],
                running=[t._running_view() for t in self._running.values()],
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
            opted_out = sorted(t.id for t in self._pending.values() if not t.affinity)
            inputs = {  # PM18: what the log does not otherwise hold, for replay --verify
                "now": now,
                "max_wait": self.max_wait,
                "window": self.affinity_window,
                "affinity": self.affinity,
                "opted_out": opted_out,
            }
            ticket = self._pending.pop(pick.id)
            ticket._outcome = "granted"
            ticket.started_at = now
            self._running[ticket.id] = ticket
            if not ticket.ambient:
                self._last_activity = now
            self._emit(
                QueueDispatched(
                    self.engine,
                    ticket.id,
                    ticket.lane,
                    round(now - ticket.enqueued_at, 6),
                    round(now, 6),
                    {**pick.decision, "inputs": inputs},
                )
            )
            ticket._done.set()
        self._changed()

    def _changed(self) -> None:
        if self._wake is not None:
            self._wake.set()
            self._wake = None

    def _release(self, ticket: Ticket) -> None:
        if ticket._released or ticket._outcome != "granted":
            return
        ticket._released = True
        self._running.pop(ticket.id, None)
        now = self._clock.wall()
        if not ticket.ambient:
            self._last_activity = now
        self._recent = prune_recent(
            (*self._recent, RecentRun(ticket.session_id, ticket.group, now)),
            now,
            window=self.affinity_window,
            cap=RECENT_CAP,
        )
        started = ticket.started_at if ticket.started_at is not None else now
        self._emit(
            QueueReleased(
                self.engine, ticket.id, ticket.lane, round(now - started, 6), round(now, 6)
            )
        )
        self._drain()

    def _leave(self, ticket: Ticket, why: Literal["cancelled", "aborted", "timeout"]) -> None:
        self._pending.pop(ticket.id, None)
        ticket._outcome = "cancelled" if why == "aborted" else why
        now = self._clock.wall()
        self._emit(
            QueueCancelled(
                self.engine,
                ticket.id,
                ticket.lane,
                why,
                round(now - ticket.enqueued_at, 6),
                round(now, 6),
            )
        )
        ticket._done.set()
        self._drain()  # one fewer waiting may open the ambient gate

    # -- operating on queued requests ----------------------------------------------------

    def cancel(self, request_id: int) -> bool:
        """Q7: take a queued request out; its waiter gets :class:`QueueCancelledError`.

        False when no request with that id is queued (it runs, ended, or never was).
        """
        ticket = self._pending.get(request_id)
        if ticket is None:
            return False
        self._leave(ticket, "cancelled")
        return True

    def move(self, request_id: int, direction: Literal["up", "down"]) -> bool:
        """Q8: swap a queued request with its neighbour in its lane; False at an edge or unknown."""
        if direction not in ("up", "down"):
            raise ValueError(f"a move is up or down, not {direction!r}")
        views = [t._pending_view() for t in self._pending.values()]
        orders = move_pending(views, request_id, direction)
        if orders is None:
            return False
        for ticket_id, order in orders.items():
            self._pending[ticket_id].order = order
        other = next(i for i in orders if i != request_id)
        self._emit(
            QueueMoved(self.engine, request_id, direction, other, round(self._clock.wall(), 6))
        )
        self._drain()
        return True

    def set_width(
        self,
        width: int,
        *,
        interactive_cap: int | None = None,
        background_cap: int | None = None,
    ) -> None:
        """Change the width live (caps default to the ones asked at construction).

        A wider queue dispatches at once; a narrower one lets running requests finish.

        Raises:
            ValueError: ``width`` is below 1.
        """
        asked_interactive, asked_background = self._caps_asked
        self._caps = lane_caps(
            width,
            interactive=asked_interactive if interactive_cap is None else interactive_cap,
            background=asked_background if background_cap is None else background_cap,
        )
        self._drain()

    # -- looking -------------------------------------------------------------------------

    def position(self, request_id: int) -> int | None:
        """The 1-based place of a queued request among its lane's; None if not queued."""
        ticket = self._pending.get(request_id)
        if ticket is None:
            return None
        return 1 + sum(
            1 for t in self._pending.values() if t.lane == ticket.lane and t.order < ticket.order
        )

    def positions(self) -> dict[int, int]:
        """Every queued request's 1-based place in its lane, by id."""
        return {i: p for i in self._pending if (p := self.position(i)) is not None}

    def ahead_of(self, request_id: int) -> int | None:
        """Q10: how many requests are ahead of a queued one; None if it is not queued."""
        ticket = self._pending.get(request_id)
        if ticket is None:
            return None
        return ahead_of(
            ticket.lane,
            running=len(self._running),
            queued_interactive=sum(1 for t in self._pending.values() if t.lane == "interactive"),
            queued_background=sum(1 for t in self._pending.values() if t.lane == "background"),
        )

    @property
    def busy(self) -> bool:
        """Whether anything runs or waits (the pool's busy check, EG3)."""
        return bool(self._running or self._pending)

    def describe(self) -> QueueSummary:
        """Q9: what runs, what waits and why, now."""
        now = self._clock.wall()
        gate = self._gate_open(now)
        active = tuple(
            ActiveRequest(
                t.id,
                t.lane,
                t.ambient,
                t.session_id,
                t.group,
                t.label,
                round(now - (t.started_at if t.started_at is not None else now), 6),
            )
            for t in self._running.values()
        )
        queued = sorted(self._pending.values(), key=lambda t: (t.lane != "interactive", t.order))
        pending = tuple(
            QueuedRequest(
                t.id,
                t.lane,
                t.ambient,
                t.session_id,
                t.group,
                t.label,
                self.position(t.id) or 0,
                round(now - t.enqueued_at, 6),
            )
            for t in queued
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

    # -- helpers -------------------------------------------------------------------------

    def _waited(self, ticket: Ticket) -> float:
        return max(self._clock.wall() - ticket.enqueued_at, 0.0)

    def _ahead_at_exit(self, ticket: Ticket) -> int:
        return self._exit_ahead.pop(ticket.id, 0)

    def _emit(self, event: Event) -> None:
        if self._record is not None:
            self._record(event)
