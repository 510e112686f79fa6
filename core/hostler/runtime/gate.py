"""The physical request gate of one engine process (EG1–EG3).

The engine runs at most ``width`` generations at once (its launched slot count, not the
logical queue's width). A request holds the gate for one round trip to the engine (EG2), not
for a whole logical turn. Waiters are served first come, first served; a release hands the
slot straight to the next waiter, so nobody who arrives later can slip in between.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

__all__ = ["GateSlot", "RequestGate"]


class GateSlot:
    """One held slot of a :class:`RequestGate`; :meth:`release` gives it back (idempotent)."""

    __slots__ = ("_gate", "_released")

    def __init__(self, gate: RequestGate) -> None:
        self._gate = gate
        self._released = False

    @property
    def released(self) -> bool:
        """Whether the slot was given back."""
        return self._released

    def release(self) -> None:
        """Give the slot back (to the next waiter, if any); a second call does nothing."""
        if self._released:
            return
        self._released = True
        self._gate._release()


class _Waiter:
    __slots__ = ("event", "granted")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.granted = False


class RequestGate:
    """EG1: a FIFO, abortable limit on concurrent requests to one engine process.

    Args:
        width: How many requests the engine serves at once (at least 1).
    """

    def __init__(self, width: int) -> None:
        self._width = _checked(width)
        self._active = 0
        self._waiters: deque[_Waiter] = deque()

    @property
    def width(self) -> int:
        """How many requests may hold the gate at once."""
        return self._width

    @property
    def active(self) -> int:
        """How many requests hold the gate now (can exceed a just-narrowed width)."""
        return self._active

    @property
    def waiting(self) -> int:
        """How many requests wait for the gate."""
        return len(self._waiters)

    @property
    def busy(self) -> bool:
        """EG3: the engine is busy while anything holds or waits for the gate."""
        return self._active > 0 or len(self._waiters) > 0

    def set_width(self, width: int) -> None:
        """Change the width live: a wider gate admits waiters now; a narrower one as slots free."""
        self._width = _checked(width)
        while self._waiters and self._active < self._width:
            self._grant(self._waiters.popleft())
            self._active += 1

    async def acquire(self) -> GateSlot:
        """Take a slot, waiting in line if the gate is full.

        Cancelling the caller while it waits removes it from the line and takes nothing.
        """
        if self._active < self._width and not self._waiters:
            self._active += 1
            return GateSlot(self)
        waiter = _Waiter()
        self._waiters.append(waiter)
        try:
            await waiter.event.wait()
        except BaseException:
            if waiter.granted:  # handed over while being cancelled: pass it on
                GateSlot(self).release()
            else:
                self._waiters.remove(waiter)
            raise
        return GateSlot(self)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[GateSlot]:
        """Hold a slot for the ``async with`` block (EG2: one round trip to the engine)."""
        held = await self.acquire()
        try:
            yield held
        finally:
            held.release()

    def _grant(self, waiter: _Waiter) -> None:
        waiter.granted = True
        waiter.event.set()

    def _release(self) -> None:
        if self._waiters and self._active <= self._width:
            self._grant(self._waiters.popleft())  # handed over: the active count stays
        else:
            self._active -= 1


def _checked(width: int) -> int:
    if width < 1:
        raise ValueError(f"a request gate's width must be at least 1, not {width}")
    return width
