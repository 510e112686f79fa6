"""The request queue's driver (Q2–Q5, Q7–Q10, Q12) and the physical gate (EG1–EG3).

Time is fake: the queue reads ``VirtualClock`` as its clock and sleeps on it, so minutes of queue
time pass in milliseconds and every wait is exact.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import anyio
import pytest
from anyio.lowlevel import checkpoint

from hostler.errors import QueueCancelledError, QueueTimeoutError
from hostler.events.base import Event
from hostler.events.queue import QueueCancelled, QueueDispatched, QueueEnqueued, QueueMoved
from hostler.policies.queue import LaneCaps
from hostler.runtime.gate import RequestGate
from hostler.runtime.queue import RequestQueue, Ticket
from hostler.testing.clock import VirtualClock

pytestmark = pytest.mark.anyio


async def wait_all_tasks_blocked() -> None:
    """Let every ready task run until it blocks (cheaper than anyio's polling helper)."""
    for _ in range(25):
        await checkpoint()


class Harness:
    """Requests held in tasks: each records its ticket and holds the slot until let go."""

    def __init__(self, queue: RequestQueue, tg: anyio.abc.TaskGroup) -> None:
        self.queue = queue
        self.tg = tg
        self.tickets: dict[str, Ticket] = {}
        self.started: list[str] = []
        self.errors: dict[str, BaseException] = {}
        self._go: dict[str, anyio.Event] = {}
        self._scopes: dict[str, anyio.CancelScope] = {}

    async def submit(self, name: str, **kw: Any) -> None:
        self._go[name] = anyio.Event()
        self.tg.start_soon(self._hold, name, kw)
        await wait_all_tasks_blocked()

    async def _hold(self, name: str, kw: dict[str, Any]) -> None:
        with anyio.CancelScope() as scope:
            self._scopes[name] = scope
            try:
                async with self.queue.acquire(label=name, **kw) as ticket:
                    self.tickets[name] = ticket
                    self.started.append(name)
                    await self._go[name].wait()
            except (QueueCancelledError, QueueTimeoutError) as exc:
                self.errors[name] = exc

    async def finish(self, name: str) -> None:
        self._go[name].set()
        await wait_all_tasks_blocked()

    async def abort(self, name: str) -> None:
        self._scopes[name].cancel()
        await wait_all_tasks_blocked()


async def harness(
    stack: AsyncExitStack, **kw: Any
) -> tuple[Harness, RequestQueue, VirtualClock, list[Event]]:
    fake = VirtualClock(start=0.0)
    events: list[Event] = []
    queue = RequestQueue("llama:m", clock=fake, record=events.append, **kw)
    tg = await stack.enter_async_context(anyio.create_task_group())
    stack.callback(tg.cancel_scope.cancel)
    return Harness(queue, tg), queue, fake, events


@pytest.fixture
async def stack() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as opened:
        yield opened


async def test_dispatch_and_release_in_order(stack: AsyncExitStack) -> None:
    h, q, fake, events = await harness(stack, width=1)
    await h.submit("a")
    await h.submit("b")
    assert h.started == ["a"]
    assert q.describe().queued_interactive == 1
    await fake.advance(2.0)
    await h.finish("a")
    assert h.started == ["a", "b"]
    dispatched = [e for e in events if isinstance(e, QueueDispatched)]
    assert [(e.id, e.waited, e.decision["rule"]) for e in dispatched] == [
        (1, 0.0, "oldest"),
        (2, 2.0, "oldest"),
    ]
    assert [type(e).TYPE for e in events] == [
        "queue.enqueued",
        "queue.dispatched",
        "queue.enqueued",
        "queue.released",
        "queue.dispatched",
    ]
    first = events[0]
    assert isinstance(first, QueueEnqueued)
    assert (first.engine, first.lane, first.ambient, first.label) == (
        "llama:m",
        "interactive",
        False,
        "a",
    )
    # release is idempotent: letting go of a released ticket changes nothing
    h.tickets["a"].release()
    assert q.describe().running == 1


async def test_affinity_prefers_the_session_that_ran(stack: AsyncExitStack) -> None:
    h, _, _, events = await harness(stack, width=1)
    await h.submit("s1", session_id="s")
    await h.submit("other", session_id="x")
    await h.submit("s2", session_id="s")
    await h.finish("s1")
    assert h.started == ["s1", "s2"]
    dispatched = [e for e in events if isinstance(e, QueueDispatched)]
    assert dispatched[-1].decision["rule"] == "affinity"
    assert dispatched[-1].decision["score"] == 2
    # a queue with affinity off serves arrival order
    h2, _, _, _ = await harness(stack, width=1, affinity=False)
    await h2.submit("s1", session_id="s")
    await h2.submit("other", session_id="x")
    await h2.submit("s2", session_id="s")
    await h2.finish("s1")
    assert h2.started == ["s1", "other"]


async def flood(h: Harness, fake: VirtualClock, victim: str, seconds: int) -> dict[str, float]:
    """Session ``a`` sends a new request every second while one runs; each runs 1 s."""
    started_at: dict[str, float] = {}
    current = h.started[-1]
    for n in range(1, seconds):
        await fake.advance(0.5)
        await h.submit(f"a{n}", session_id="a")
        await fake.advance(0.5)
        await h.finish(current)
        current = h.started[-1]
        started_at[current] = fake.wall()
        if current == victim:
            break
    return started_at


@pytest.mark.parametrize(
    "victim", [{"lane": "background"}, {"lane": "interactive", "session_id": "b"}]
)
async def test_a_flood_with_affinity_cannot_starve_another_request(
    stack: AsyncExitStack, victim: dict[str, Any]
) -> None:
    h, _, fake, events = await harness(stack, width=1)
    await h.submit("first", session_id="a")
    await fake.advance(0.2)
    await h.submit("victim", **victim)
    started = await flood(h, fake, "victim", 120)  # session a keeps the engine busy
    assert "victim" in started
    waited = started["victim"] - 0.2
    assert 59.99 <= waited <= 61.01
    assert len(h.started) > 55  # the flood really did jump it, for a minute
    last = [e for e in events if isinstance(e, QueueDispatched)][-1]
    assert last.decision["rule"] == "starvation"


async def test_cancel_while_queued(stack: AsyncExitStack) -> None:
    h, q, fake, events = await harness(stack, width=1)
    await h.submit("a")
    await h.submit("b")
    await fake.advance(3.0)
    assert q.cancel(2) is True
    await wait_all_tasks_blocked()
    error = h.errors["b"]
    assert isinstance(error, QueueCancelledError)
    assert error.code == "queue.cancelled"
    assert "request 2 was cancelled while queued for 'llama:m' after waiting 3.0 s" in str(error)
    cancelled = [e for e in events if isinstance(e, QueueCancelled)]
    assert [(e.id, e.why, e.waited) for e in cancelled] == [(2, "cancelled", 3.0)]
    assert q.cancel(2) is False  # gone
    assert q.cancel(1) is False  # running
    assert q.cancel(99) is False
    assert q.describe().queued_interactive == 0


async def test_abort_while_queued_frees_no_slot(stack: AsyncExitStack) -> None:
    h, q, _, events = await harness(stack, width=1)
    await h.submit("a")
    await h.submit("b")
    await h.submit("c")
    await h.abort("b")
    summary = q.describe()
    assert (summary.running, summary.queued_interactive) == (1, 1)
    assert [(e.id, e.why) for e in events if isinstance(e, QueueCancelled)] == [(2, "aborted")]
    await h.finish("a")
    assert h.started == ["a", "c"]
    assert q.describe().running == 1


async def test_move_reorders_a_lane(stack: AsyncExitStack) -> None:
    h, q, _, events = await harness(stack, width=1, affinity=False)
    for name in ("a", "b", "c", "d"):
        await h.submit(name)
    await h.submit("bg", lane="background")
    assert q.positions() == {2: 1, 3: 2, 4: 3, 5: 1}
    assert q.move(4, "up") is True
    assert q.positions() == {2: 1, 3: 3, 4: 2, 5: 1}
    assert q.move(2, "up") is False  # first
    assert q.move(3, "down") is False  # last
    assert q.move(5, "up") is False  # alone in its lane
    assert q.move(1, "up") is False  # running
    moved = [e for e in events if isinstance(e, QueueMoved)]
    assert [(e.id, e.direction, e.swapped_with) for e in moved] == [(4, "up", 3)]
    with pytest.raises(ValueError, match="a move is up or down, not 'left'"):
        q.move(4, "left")  # type: ignore[arg-type]
    await h.finish("a")
    await h.finish("b")
    assert h.started == ["a", "b", "d"]


async def test_describe_summarises(stack: AsyncExitStack) -> None:
    h, q, fake, _ = await harness(stack, width=2, interactive_cap=2, background_cap=1)
    await h.submit("chat", session_id="s", group="g")
    await h.submit("index", lane="background")
    await h.submit("chat2")
    await h.submit("index2", lane="background")
    await fake.advance(1.5)
    summary = q.describe()
    assert (summary.width, summary.interactive_cap, summary.background_cap) == (2, 2, 1)
    assert (summary.running, summary.running_interactive, summary.running_background) == (2, 1, 1)
    assert (summary.queued_interactive, summary.queued_background) == (1, 1)
    assert summary.ambient_held == 0
    assert [(a.label, a.running_for, a.session_id, a.group) for a in summary.active] == [
        ("chat", 1.5, "s", "g"),
        ("index", 1.5, None, None),
    ]
    assert [(p.label, p.position, p.waited) for p in summary.pending] == [
        ("chat2", 1, 1.5),
        ("index2", 1, 1.5),
    ]
    assert h.tickets["chat"].position is None
    assert q.ahead_of(3) == 2  # two run, it is the one interactive queued
    assert q.ahead_of(4) == 3
    assert q.busy is True


async def test_on_wait_reports_how_many_are_ahead_after_the_notice(
    stack: AsyncExitStack,
) -> None:
    h, _, fake, _ = await harness(stack, width=1)
    heard: list[int] = []
    await h.submit("a")
    await h.submit("b")
    await h.submit("c", on_wait=heard.append)
    await fake.advance(0.199)
    assert heard == []
    await fake.advance(0.001)
    assert heard == [2]
    # one acquired at once is never told
    h2, _, fake2, _ = await harness(stack, width=1)
    told: list[int] = []
    await h2.submit("x", on_wait=told.append)
    await fake2.advance(1.0)
    assert told == []


async def test_a_queue_timeout_says_how_long_and_how_many(stack: AsyncExitStack) -> None:
    h, q, fake, events = await harness(stack, width=1)
    await h.submit("a")
    await h.submit("b")
    await h.submit("c", queue_timeout=5.0)
    await fake.advance(4.9)
    assert "c" not in h.errors
    await fake.advance(0.1)
    error = h.errors["c"]
    assert isinstance(error, QueueTimeoutError)
    assert (error.code, error.waited, error.ahead) == ("queue.timeout", 5.0, 2)
    assert "waited 5.0 s in 'llama:m''s queue with 2 ahead of it" in str(error)
    assert [(e.id, e.why) for e in events if isinstance(e, QueueCancelled)] == [(3, "timeout")]
    assert q.describe().queued_interactive == 1


async def test_ambient_work_waits_for_the_quiet_window(stack: AsyncExitStack) -> None:
    h, q, fake, events = await harness(stack, width=1)
    await h.submit("chat")
    await fake.advance(10.0)
    await h.finish("chat")  # activity at t=10
    await h.submit("ambient", lane="background", ambient=True)
    assert h.started == ["chat"]
    assert q.describe().ambient_held == 1
    await fake.advance(179.0)  # t=189: 179 s quiet
    assert h.started == ["chat"]
    await fake.advance(1.0)  # t=190: the window ends; the re-check lands 25 ms later
    assert h.started == ["chat"]
    await fake.advance(0.025)
    assert h.started == ["chat", "ambient"]
    assert q.describe().ambient_held == 0
    dispatched = [e for e in events if isinstance(e, QueueDispatched)][-1]
    assert dispatched.decision["ambient_open"] is True


async def test_ambient_work_alone_from_the_clock_s_zero_runs_after_one_window(
    stack: AsyncExitStack,
) -> None:
    h, q, fake, _ = await harness(stack, width=1)  # the queue (and its quiet clock) at t=0
    await h.submit("ambient", lane="background", ambient=True)
    await fake.advance(180.0)
    assert h.started == []
    await fake.advance(0.025)
    assert h.started == ["ambient"]
    assert q.describe().ambient_held == 0


async def test_a_person_resets_the_quiet_window(stack: AsyncExitStack) -> None:
    h, _, fake, _ = await harness(stack, width=1)
    await h.submit("ambient", lane="background", ambient=True)
    await fake.advance(100.0)
    await h.submit("chat")  # activity at t=100
    await fake.advance(5.0)
    await h.finish("chat")  # activity at t=105
    await fake.advance(179.0)
    assert h.started == ["chat"]
    await fake.advance(1.025)
    assert h.started == ["chat", "ambient"]


async def test_spare_capacity_lets_ambient_work_run_beside_a_person(
    stack: AsyncExitStack,
) -> None:
    h, _, _, _ = await harness(stack, width=3)
    await h.submit("chat")
    await h.submit("ambient", lane="background", ambient=True)
    assert h.started == ["chat", "ambient"]  # 1 running < interactive cap 3 - 1
    await h.submit("ambient2", lane="background", ambient=True)
    assert h.started == ["chat", "ambient"]  # one slot stays free for the next person
    await h.submit("chat2")
    assert h.started == ["chat", "ambient", "chat2"]


async def test_width_changes_live(stack: AsyncExitStack) -> None:
    h, q, _, _ = await harness(stack, width=1)
    for name in ("a", "b", "c"):
        await h.submit(name)
    q.set_width(3)
    await wait_all_tasks_blocked()
    assert h.started == ["a", "b", "c"]
    q.set_width(1)
    await h.submit("d")
    await h.finish("a")
    await h.finish("b")
    assert h.started == ["a", "b", "c"]  # c still runs: the narrower width waits for it
    await h.finish("c")
    assert h.started == ["a", "b", "c", "d"]
    with pytest.raises(ValueError, match="at least 1, not 0"):
        q.set_width(0)


def test_engine_queue_shape() -> None:
    q = RequestQueue.for_engine("llama:m", 4)
    assert q.caps == LaneCaps(5, 4, 3)
    assert RequestQueue.for_engine("ds4:m", 4, single_lane=True).caps == LaneCaps(1, 1, 1)


async def test_release_before_dispatch_does_nothing_and_lanes_are_checked() -> None:
    q = RequestQueue("e", width=1)
    with pytest.raises(ValueError, match="interactive or background, not 'bulk'"):
        async with q.acquire(lane="bulk"):  # type: ignore[arg-type]
            pass
    async with q.acquire() as ticket:
        inside = (ticket.running, q.busy)
    assert inside == (True, True)
    assert (ticket.running, q.busy) == (False, False)
    ticket.release()  # after the block: nothing to give back
    assert q.describe().running == 0


# -- the physical gate ------------------------------------------------------------------


async def test_gate_is_fifo_and_hands_the_slot_over() -> None:
    gate = RequestGate(1)
    order: list[str] = []
    first = await gate.acquire()
    assert (gate.active, gate.waiting, gate.busy) == (1, 0, True)

    async def wait(name: str) -> None:
        held = await gate.acquire()
        order.append(name)
        await checkpoint()
        held.release()

    async with anyio.create_task_group() as tg:
        for name in ("b", "c", "d"):
            tg.start_soon(wait, name)
            await wait_all_tasks_blocked()
        assert gate.waiting == 3
        first.release()
        first.release()  # idempotent: hands over once
        assert (gate.active, gate.waiting) == (1, 2)
    assert order == ["b", "c", "d"]
    assert (gate.active, gate.waiting, gate.busy) == (0, 0, False)


async def test_gate_abort_removes_the_waiter() -> None:
    gate = RequestGate(1)
    held = await gate.acquire()
    async with anyio.create_task_group() as tg:
        tg.start_soon(gate.acquire)
        await wait_all_tasks_blocked()
        assert gate.waiting == 1
        tg.cancel_scope.cancel()
    assert (gate.active, gate.waiting) == (1, 0)
    held.release()
    assert (gate.active, gate.busy) == (0, False)


async def test_gate_width_changes() -> None:
    gate = RequestGate(2)
    a, b = await gate.acquire(), await gate.acquire()
    got: list[int] = []

    async def take() -> None:
        async with gate.slot():
            got.append(1)
            await anyio.sleep_forever()

    async with anyio.create_task_group() as tg:
        tg.start_soon(take)
        await wait_all_tasks_blocked()
        gate.set_width(3)
        await wait_all_tasks_blocked()
        assert (got, gate.active, gate.waiting) == ([1], 3, 0)
        gate.set_width(1)  # narrowed: takes effect as slots free
        a.release()
        assert gate.active == 2
        b.release()
        assert gate.active == 1
        tg.cancel_scope.cancel()
    assert gate.active == 0
    with pytest.raises(ValueError, match="a request gate's width must be at least 1, not 0"):
        RequestGate(0)
