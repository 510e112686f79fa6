"""Clocks for tests: :class:`FakeClock` pins the wall time, :class:`VirtualClock` fakes it all.

Both are :class:`hostler.clock.Clock` objects, so either can be handed to any driver.

- :class:`FakeClock` moves its wall time only when told; its monotonic time, sleeps and
  timeouts are real. Right where a test drives real processes (whose waits are real) and wants
  the recorded times, the idle instants and the retry instants under its control.
- :class:`VirtualClock` moves everything only when told: wall and monotonic readings, sleeps and
  timeouts. :meth:`VirtualClock.advance` lets every task run until it blocks, then fires the
  timers that fall due in order of their deadlines, so a test runs an hour of supervisor,
  queue or pool time in milliseconds, and :meth:`VirtualClock.autojump` jumps to the next
  timer whenever every task is blocked (trio's ``MockClock(autojump_threshold=0)``).
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import math
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager, asynccontextmanager
from types import TracebackType

import anyio

from hostler.clock import Clock, SystemClock
from hostler.errors import UsageError

__all__ = ["FakeClock", "VirtualClock"]

#: Where both fakes' wall readings start (2027-01-15, a time no real log of a test shares).
DEFAULT_START = 1_800_000_000.0


def _finite_start(start: float) -> float:
    if not math.isfinite(start):
        raise UsageError(f"a clock starts at a finite time, not {start!r}")
    return float(start)


def _checked_step(now: float, seconds: float) -> float:
    if not math.isfinite(seconds) or not math.isfinite(now + seconds):
        raise UsageError(f"a clock moves by a finite number of seconds, not {seconds!r}")
    if seconds < 0:
        raise UsageError(f"a clock does not go back ({seconds} s)")
    return now + seconds


class FakeClock(SystemClock):
    """A wall clock that moves only when told; monotonic time, sleeps and timeouts stay real.

    Args:
        start: The first wall reading (seconds since the epoch).
    """

    def __init__(self, start: float = DEFAULT_START) -> None:
        super().__init__(self.wall)
        self.now = _finite_start(start)

    def wall(self) -> float:
        """The current reading."""
        return self.now

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` (never backward, always finite); returns the new reading."""
        self.now = _checked_step(self.now, seconds)
        return self.now

    def set(self, when: float) -> None:
        """Jump to ``when`` (never backward)."""
        self.advance(when - self.now)


#: How many times :func:`_settle` lets other tasks run before it lets the clock move anyway
#: (a task that spins on checkpoints never blocks).
_SETTLE_ROUNDS = 10_000
#: How long :func:`_settle` waits for worker threads (real seconds) before it gives up on them.
_THREAD_PATIENCE = 60.0


async def _settle() -> None:
    """Return once every other task is blocked on something only time or another task ends.

    A task waiting on a worker thread (a log write, a file read) is not blocked: the real work
    it waits for must finish before virtual time moves on, or the clock would jump past
    timers while a write is under way. anyio's ``wait_all_tasks_blocked`` would also sleep
    0.1 s of real time each time it found a runnable task, making every virtual second cost a
    real tenth; on asyncio the question is answered here by yielding instead.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # not asyncio (trio): its own helper answers
        await anyio.wait_all_tasks_blocked()
        return
    this = asyncio.current_task()
    waited_on_threads = 0.0
    rounds = 0
    while rounds < _SETTLE_ROUNDS and waited_on_threads < _THREAD_PATIENCE:
        await anyio.lowlevel.checkpoint()
        others = [task for task in asyncio.all_tasks() if task is not this]
        if _worker_threads_busy():
            await asyncio.sleep(0.0005)  # real time: a thread is working
            waited_on_threads += 0.0005
            continue
        if all(_blocked(task) for task in others):
            return
        rounds += 1


def _blocked(task: asyncio.Task[object]) -> bool:
    waiter = getattr(task, "_fut_waiter", None)  # what asyncio's own Task waits on, if anything
    return waiter is not None and not waiter.done()


def _worker_threads_busy() -> bool:
    """Whether one of anyio's worker threads is running a call for this event loop.

    Read off anyio's own bookkeeping of its thread pool (a worker leaves the idle list when it
    takes a call and rejoins it, on the loop, when the call's result is handed back). Where
    that bookkeeping is not there to read (another anyio), no thread counts as busy.
    """
    try:
        from anyio._backends import _asyncio as backend  # noqa: PLC0415 - only where asked

        workers = backend._threadpool_workers.get(set())
        idle = backend._threadpool_idle_workers.get(collections.deque())
    except (ImportError, AttributeError, LookupError):
        return False
    return len(workers) > len(idle)


class _Timer:
    """One pending wake-up: its deadline, its order of arrival and what it does when due."""

    __slots__ = ("action", "deadline", "dropped", "order")

    def __init__(self, deadline: float, order: int, action: Callable[[], None]) -> None:
        self.deadline = deadline
        self.order = order
        self.action = action
        self.dropped = False

    def __lt__(self, other: _Timer) -> bool:
        return (self.deadline, self.order) < (other.deadline, other.order)


class _VirtualTimeout:
    """A cancel scope that one of the virtual clock's timers cancels."""

    def __init__(self, clock: VirtualClock, seconds: float) -> None:
        self._clock = clock
        self._seconds = seconds
        self._scope = anyio.CancelScope()
        self._timer: _Timer | None = None

    def __enter__(self) -> anyio.CancelScope:
        scope = self._scope.__enter__()
        if self._seconds <= 0:
            scope.cancel()
        else:
            self._timer = self._clock._arm(self._seconds, scope.cancel)
        return scope

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> bool:
        if self._timer is not None:
            self._timer.dropped = True
        return self._scope.__exit__(kind, error, trace)


class VirtualClock(Clock):
    """Wall time, monotonic time, sleeps and timeouts that move only when the test says so.

    Args:
        start: The first wall reading (seconds since the epoch); the monotonic reading starts
            at 0 and moves with it.
    """

    def __init__(self, start: float = DEFAULT_START) -> None:
        self._wall_start = _finite_start(start)
        self._elapsed = 0.0
        self._timers: list[_Timer] = []
        self._order = itertools.count()
        self._armed: anyio.Event | None = None  # set by the autojumper while it waits

    def wall(self) -> float:
        """Seconds since the epoch: the start plus the virtual time passed."""
        return self._wall_start + self._elapsed

    def monotonic(self) -> float:
        """The virtual time passed since the clock was made."""
        return self._elapsed

    @property
    def pending(self) -> int:
        """How many sleeps and timeouts wait for the clock."""
        return sum(not timer.dropped for timer in self._timers)

    def next_deadline(self) -> float | None:
        """The monotonic reading at which the next timer fires (None: none waits)."""
        self._drop_dead()
        return self._timers[0].deadline if self._timers else None

    async def sleep(self, seconds: float) -> None:
        """Wait until the clock has been moved ``seconds`` on (0 or less: yield once)."""
        if seconds <= 0:
            await anyio.lowlevel.checkpoint()
            return
        woken = anyio.Event()
        timer = self._arm(seconds, woken.set)
        try:
            await woken.wait()
        finally:
            timer.dropped = True

    def move_on_after(self, seconds: float) -> AbstractContextManager[anyio.CancelScope, bool]:
        """A scope cancelled when the clock has been moved ``seconds`` on."""
        return _VirtualTimeout(self, seconds)

    async def advance(self, seconds: float) -> None:
        """Move ``seconds`` on, firing each timer that falls due at its own deadline.

        Every task runs until it blocks before the first timer fires and after each one, so
        what a woken task arms in turn fires too when it falls within the step.
        """
        target = _checked_step(self._elapsed, seconds)
        while True:
            await _settle()
            due = self.next_deadline()
            if due is None or due > target:
                break
            self._fire_until(due)
        self._elapsed = target
        await _settle()

    async def jump(self) -> bool:
        """Move on to the next timer's deadline and fire it; False when none waits."""
        await _settle()
        due = self.next_deadline()
        if due is None:
            return False
        await self.advance(max(due - self._elapsed, 0.0))
        return True

    @asynccontextmanager
    async def autojump(self) -> AsyncIterator[VirtualClock]:
        """Within the block, whenever every other task is blocked, jump to the next timer.

        A block that waits on something no timer ends (a real process, a socket) just waits:
        the clock only jumps over time that nothing but a timer would end.
        """
        async with anyio.create_task_group() as group:
            group.start_soon(self._jump_forever)
            try:
                yield self
            finally:
                group.cancel_scope.cancel()

    async def _jump_forever(self) -> None:
        while True:
            if not await self.jump():
                self._armed = anyio.Event()
                await self._armed.wait()

    def _arm(self, seconds: float, action: Callable[[], None]) -> _Timer:
        timer = _Timer(self._elapsed + seconds, next(self._order), action)
        heapq.heappush(self._timers, timer)
        if self._armed is not None:
            self._armed.set()
        return timer

    def _drop_dead(self) -> None:
        while self._timers and self._timers[0].dropped:
            heapq.heappop(self._timers)

    def _fire_until(self, deadline: float) -> None:
        self._elapsed = max(self._elapsed, deadline)
        while True:
            self._drop_dead()
            if not self._timers or self._timers[0].deadline > deadline:
                return
            timer = heapq.heappop(self._timers)
            timer.dropped = True
            timer.action()
