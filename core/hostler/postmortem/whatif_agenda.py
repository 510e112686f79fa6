"""What-if's clock: the timed events still to come, and the workload's order (PM21).

The :class:`Agenda` is a heap of timed events (no clock, no I/O); the :class:`Script` says
when each recorded request and outside event (a crash, a stop, a budget change) comes: when
it was recorded, or a recorded gap after the request it followed ended.
"""

from __future__ import annotations

import heapq

from hostler.postmortem.workload import Workload

__all__ = [
    "ARRIVE",
    "DEADLINE",
    "GIVE_UP",
    "OUTSIDE",
    "PATIENCE",
    "PLAN",
    "READY",
    "RECHECK",
    "RELEASE",
    "UNLOCK",
    "Agenda",
    "Script",
]

# event kinds, in the order they go at one instant
READY, RELEASE, DEADLINE, PATIENCE, GIVE_UP, ARRIVE, UNLOCK, RECHECK, OUTSIDE, PLAN = range(10)


class Agenda:
    """The events to come, earliest first; at one instant by kind, then in the order pushed."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, int, str]] = []
        self._order = 0

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, at: float, kind: int, index: int = -1, key: str = "") -> None:
        """An event of ``kind`` at ``at`` (about event or request ``index``, engine ``key``)."""
        self._order += 1
        heapq.heappush(self._heap, (at, kind, self._order, index, key))

    def next_at(self) -> float | None:
        """When the next event comes (None when none is left)."""
        return self._heap[0][0] if self._heap else None

    def pop(self) -> tuple[float, int, int, str]:
        """The next event: its time, kind, index and key."""
        at, kind, _, index, key = heapq.heappop(self._heap)
        return at, kind, index, key


class Script:
    """Which requests arrive when recorded, and what follows each request once it ended.

    Args:
        workload: The recorded requests and outside events.
        agenda: Where the events that follow a request are put.
    """

    def __init__(self, workload: Workload, agenda: Agenda) -> None:
        self.requests = workload.requests
        self.outside = workload.outside
        self._agenda = agenda
        self._outside_after: dict[int, list[int]] = {}  # request index: crashes, unloads after it
        self._followers: dict[int, list[int]] = {}
        self.open: list[int] = []  # requests that follow none: they arrive when recorded
        for index, request in enumerate(workload.requests):
            if request.after is None or not 0 <= request.after < index:
                self.open.append(index)
            else:
                self._followers.setdefault(request.after, []).append(index)

    def put_outside(self) -> None:
        """The outside events that follow no request go on the agenda at their recorded time."""
        requests = self.requests
        for index, happened in enumerate(self.outside):
            if happened.after is None or not 0 <= happened.after < len(requests):
                self._agenda.push(happened.at, OUTSIDE, index)
            else:
                self._outside_after.setdefault(happened.after, []).append(index)

    def ended(self, index: int, now: float) -> None:
        """A request left (ran, refused, gave up): those that followed it arrive (PM21)."""
        for follower in self._followers.pop(index, ()):
            self._agenda.push(now + self.requests[follower].gap, ARRIVE, follower)
        for happened in self._outside_after.pop(index, ()):
            self._agenda.push(now + self.outside[happened].gap, OUTSIDE, happened)
