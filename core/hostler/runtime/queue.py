"""The request queue in front of one engine (driver; Q2–Q5, Q7–Q10, Q12).

Callers wrap the work that needs one of the engine's slots::

    async with queue.acquire(lane="interactive", session_id="s1", label="chat") as ticket:
        ...  # holds a slot; released on exit, whatever happens

What waits, what runs and which queued request gets a freed slot are held and decided by the
pure :class:`hostler.machines.queue.QueueDispatch` (on the rules of
:mod:`hostler.policies.queue`: starvation bound, lanes, ambient gate, affinity); this driver
reports to it what happens, with the time, and carries out its effects: it records each event
(``queue.dispatched`` with the decision's inputs), wakes the waiters and keeps the waits on
time. Cancelling the waiting caller (anyio cancellation) takes it out of the line without using
a slot. Time comes from the injected :class:`~hostler.clock.Clock`: its wall time stamps the
events, its sleeps are the waits on time (the wait notice, the timeout, the ambient re-check),
so a test with :class:`hostler.testing.VirtualClock` runs minutes of queue time in milliseconds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Literal

import anyio

from hostler.clock import SYSTEM_CLOCK, ClockLike, as_clock
from hostler.errors import QueueCancelledError, QueueTimeoutError
from hostler.events.base import Event
from hostler.machines.queue import (
    ActiveRequest,
    Arrival,
    Dismiss,
    Grant,
    Left,
    Moved,
    QueueDispatch,
    QueuedRequest,
    QueueEffect,
    QueueObservation,
    QueueSummary,
    RecheckDue,
    Record,
    Released,
    Resized,
    WakeAmbient,
)
from hostler.policies.queue import (
    AFFINITY_WINDOW,
    AMBIENT_QUIET,
    MAX_WAIT,
    WAIT_NOTICE,
    Lane,
    LaneCaps,
    engine_queue_caps,
)

__all__ = ["ActiveRequest", "QueueSummary", "QueuedRequest", "RequestQueue", "Ticket"]

Recorder = Callable[[Event], None]
_Outcome = Literal["granted", "released", "cancelled", "timeout"]


class Ticket:
    """A request's place in the queue, then its slot; :meth:`release` gives the slot back."""

    __slots__ = (
        "_done",
        "_left",
        "_outcome",
        "_queue",
        "affinity",
        "ambient",
        "enqueued_at",
        "group",
        "id",
        "label",
        "lane",
        "session_id",
        "started_at",
    )

    def __init__(
        self, queue: RequestQueue, request_id: int, arrival: Arrival, enqueued_at: float
    ) -> None:
        self._queue = queue
        self.id = request_id
        self.lane: Lane = arrival.lane
        self.enqueued_at = enqueued_at
        self.ambient = arrival.ambient
        self.session_id = arrival.session_id
        self.group = arrival.group
        self.affinity = arrival.affinity
        self.label = arrival.label
        self.started_at: float | None = None
        self._outcome: _Outcome | None = None
        self._left: Dismiss | None = None  # how it left the queue without running, if it did
        self._done = anyio.Event()

    @property
    def running(self) -> bool:
        """Whether it holds a slot now."""
        return self._outcome == "granted"

    @property
    def order(self) -> int | None:
        """Its rank in its lane (lower goes first, Q8); None once not queued."""
        return self._queue.rank(self.id)

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


class RequestQueue:
    """The logical request queue of one engine (Q1–Q10): the driver of its :class:`QueueDispatch`.

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
        record: Recorder | None = None,
    ) -> None:
        self.engine = engine
        self._clock = as_clock(clock)
        self._record = record
        self._dispatch = QueueDispatch(
            engine,
            width,
            interactive_cap=interactive_cap,
            background_cap=background_cap,
            affinity=affinity,
            quiet_window=quiet_window,
            max_wait=max_wait,
            affinity_window=affinity_window,
            now=self._clock.wall(),  # Q1: the quiet clock starts at construction
        )
        self._tickets: dict[int, Ticket] = {}  # queued or running
        self._wake: anyio.Event | None = None

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
        return self._dispatch.caps

    @property
    def affinity(self) -> bool:
        """Whether the pick prefers requests of what ran last (Q4)."""
        return self._dispatch.affinity

    @property
    def quiet_window(self) -> float:
        """Q5's quiet window in seconds."""
        return self._dispatch.quiet_window

    @property
    def max_wait(self) -> float:
        """Q4's starvation bound in seconds."""
        return self._dispatch.max_wait

    @property
    def affinity_window(self) -> float:
        """How long an ended run still counts for affinity (seconds)."""
        return self._dispatch.affinity_window

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
        arrival = Arrival(lane, ambient, session_id, group, affinity, label)
        now = self._clock.wall()
        request_id, effects = self._dispatch.arrive(arrival, now)
        ticket = Ticket(self, request_id, arrival, now)
        self._tickets[request_id] = ticket
        self._carry_out(effects)
        await self._wait(ticket, queue_timeout, on_wait)
        try:
            yield ticket
        finally:
            ticket.release()

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
                self._observe(Left(ticket.id, "aborted"))  # Q2: an abort consumes no slot
            raise
        left = ticket._left
        if left is not None and left.outcome == "cancelled":
            raise QueueCancelledError(self.engine, ticket.id, left.waited)
        if left is not None:
            raise QueueTimeoutError(self.engine, ticket.id, left.waited, left.ahead)

    async def _notice(self, ticket: Ticket, on_wait: Callable[[int], None]) -> None:
        await self._clock.sleep(WAIT_NOTICE)
        ahead = self.ahead_of(ticket.id)
        if ahead is not None:
            on_wait(ahead)

    async def _expire(self, ticket: Ticket, limit: float) -> None:
        await self._clock.sleep(max(limit, 0.0))
        self._observe(Left(ticket.id, "timeout"))

    async def _ambient_clock(self, ticket: Ticket) -> None:
        # Q5: ambient work held only by the quiet window is looked at again when it ends.
        while ticket._outcome is None:
            delay = self._dispatch.recheck_in(ticket.id, self._clock.wall())
            if delay is None:
                if self._wake is None:
                    self._wake = anyio.Event()
                await self._wake.wait()
            else:
                await self._clock.sleep(delay)
                self._observe(RecheckDue())

    # -- carrying the effects out ------------------------------------------------------------

    def _observe(self, observation: QueueObservation) -> list[QueueEffect]:
        effects = self._dispatch.handle(observation, self._clock.wall())
        self._carry_out(effects)
        return effects

    def _carry_out(self, effects: list[QueueEffect]) -> None:
        for effect in effects:
            match effect:
                case Record(event):
                    if self._record is not None:
                        self._record(event)
                case Grant(request_id, at):
                    ticket = self._tickets[request_id]
                    ticket._outcome = "granted"
                    ticket.started_at = at
                    ticket._done.set()
                case Dismiss(request_id, outcome):
                    ticket = self._tickets.pop(request_id)
                    ticket._outcome = outcome
                    ticket._left = effect
                    ticket._done.set()
                case WakeAmbient():
                    if self._wake is not None:
                        self._wake.set()
                        self._wake = None

    def _release(self, ticket: Ticket) -> None:
        if ticket._outcome != "granted":
            return
        ticket._outcome = "released"
        self._tickets.pop(ticket.id, None)
        self._observe(Released(ticket.id))

    # -- operating on queued requests ----------------------------------------------------

    def cancel(self, request_id: int) -> bool:
        """Q7: take a queued request out; its waiter gets :class:`QueueCancelledError`.

        False when no request with that id is queued (it runs, ended, or never was).
        """
        return bool(self._observe(Left(request_id, "cancelled")))

    def move(self, request_id: int, direction: Literal["up", "down"]) -> bool:
        """Q8: swap a queued request with its neighbour in its lane; False at an edge or unknown."""
        return bool(self._observe(Moved(request_id, direction)))

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
        self._observe(Resized(width, interactive_cap, background_cap))

    # -- looking -------------------------------------------------------------------------

    def position(self, request_id: int) -> int | None:
        """The 1-based place of a queued request among its lane's; None if not queued."""
        return self._dispatch.position(request_id)

    def positions(self) -> dict[int, int]:
        """Every queued request's 1-based place in its lane, by id."""
        return self._dispatch.positions()

    def rank(self, request_id: int) -> int | None:
        """A queued request's rank in its lane (lower goes first, Q8); None if not queued."""
        return self._dispatch.rank(request_id)

    def ahead_of(self, request_id: int) -> int | None:
        """Q10: how many requests are ahead of a queued one; None if it is not queued."""
        return self._dispatch.ahead_of(request_id)

    @property
    def busy(self) -> bool:
        """Whether anything runs or waits (the pool's busy check, EG3)."""
        return self._dispatch.busy

    def describe(self) -> QueueSummary:
        """Q9: what runs, what waits and why, now."""
        return self._dispatch.describe(self._clock.wall())
