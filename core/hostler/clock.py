"""The one clock every driver reads: wall time, monotonic time, sleeps and timeouts.

A driver (supervisor, pool, queue, health gate, cache controller, runtime, daemon) is handed one
:class:`Clock` and asks it for everything time-shaped: :meth:`Clock.wall` for what it records
(event times, idle and retry instants), :meth:`Clock.monotonic` for deadlines,
:meth:`Clock.sleep` to wait, :meth:`Clock.move_on_after` and :meth:`Clock.fail_after` to bound a
wait. No driver calls ``time.time()``, ``anyio.current_time()`` or ``anyio.sleep()`` itself, so a
test that hands it :class:`hostler.testing.VirtualClock` runs minutes of its time in
milliseconds: the fake's sleeps and timeouts fire when the test moves it, not when seconds pass.

:class:`SystemClock` is the real one. A plain callable returning wall seconds (what hostler's
public constructors took before there was a clock object) is turned into one by
:func:`as_clock`: its wall readings are the callable's, its waits are real.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import anyio

__all__ = ["SYSTEM_CLOCK", "Clock", "ClockLike", "SystemClock", "as_clock"]


class Clock(ABC):
    """Wall time, monotonic time, sleeps and timeouts, from one source.

    Calling a clock reads its wall time, so a clock also fits where a plain wall-time
    callable is taken (the event store's, the arbiter's).
    """

    @abstractmethod
    def wall(self) -> float:
        """Seconds since the epoch: what the log records."""

    @abstractmethod
    def monotonic(self) -> float:
        """Seconds that never go back: what deadlines are measured in."""

    @abstractmethod
    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's time (0 or less: just yield to other tasks)."""

    @abstractmethod
    def move_on_after(self, seconds: float) -> AbstractContextManager[anyio.CancelScope, bool]:
        """A scope whose body is cancelled after ``seconds`` of this clock's time.

        As :func:`anyio.move_on_after`: on the timeout the block is left quietly and the
        scope's ``cancelled_caught`` is true (so, as there, code after the block is reachable
        even when the block always returns).
        """

    @contextmanager
    def fail_after(self, seconds: float) -> Iterator[anyio.CancelScope]:
        """As :meth:`move_on_after`, but leaving on the timeout raises :class:`TimeoutError`."""
        with self.move_on_after(seconds) as scope:
            yield scope
        if scope.cancelled_caught:
            raise TimeoutError(f"timed out after {seconds} s")

    def __call__(self) -> float:
        """The wall time (a clock is also a wall-time callable)."""
        return self.wall()


class SystemClock(Clock):
    """The machine's clocks and the event loop's timers.

    Args:
        wall: The wall-time source (default :func:`time.time`); a test may pin it while keeping
            real waits (see :class:`hostler.testing.FakeClock` for one that moves when told).
    """

    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self._wall = wall

    def wall(self) -> float:
        """The wall-time source's reading."""
        return self._wall()

    def monotonic(self) -> float:
        """:func:`time.monotonic` (the asyncio loop's own clock, so timeouts agree with it)."""
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        """:func:`anyio.sleep`."""
        await anyio.sleep(max(seconds, 0.0))

    def move_on_after(self, seconds: float) -> AbstractContextManager[anyio.CancelScope, bool]:
        """:func:`anyio.move_on_after`."""
        return anyio.move_on_after(seconds)


#: The machine's clock: the default wherever a clock is not handed in.
SYSTEM_CLOCK = SystemClock()

#: What a public constructor takes for its ``clock``: a :class:`Clock`, or a wall-time callable.
ClockLike = Clock | Callable[[], float]


def as_clock(clock: ClockLike) -> Clock:
    """``clock`` itself when it is a :class:`Clock`; a wall-time callable inside a system clock."""
    if isinstance(clock, Clock):
        return clock
    return SystemClock(clock)
