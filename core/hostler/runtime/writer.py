"""Queue and cache events, kept in memory as they happen and written in batches off the loop.

A request's queue events (``queue.*``, ``queue.served``) and the prompt-cache controller's
(``cache.*``) happen on the event loop, several per request; :class:`QueueEventWriter`
keeps them and writes them per stream, off the loop, every half second (and when a start
must follow its request's arrival in the log, PM21, and when the runtime closes).

Events the log refuses (locked by another writer, a full disk) are owed, not dropped: kept in
the order they happened and written by the first write that gets through, said once when the
log first refuses and once when they are written late. At most :data:`MAX_OWED` are owed (a
day of a busy daemon's requests); past that the oldest go, counted in what is said.
"""

from __future__ import annotations

import logging

from hostler.drivers.offloop import OffLoop
from hostler.errors import HostlerError
from hostler.events.base import Event
from hostler.events.cache import cache_stream
from hostler.store.log import EventStore

__all__ = ["MAX_OWED", "QueueEventWriter"]

log = logging.getLogger(__name__)

#: The most events owed while the log refuses writes (memory: about 200 B each).
MAX_OWED = 200_000


class QueueEventWriter:
    """The queue and cache events not yet written, and their writing, per stream.

    Args:
        store: The runtime's event log.
        offloop: Where the writes run.
    """

    def __init__(self, store: EventStore, offloop: OffLoop) -> None:
        self._store = store
        self._io = offloop
        self._unwritten: list[tuple[str, Event]] = []  # (stream, event), in order
        self._owed = 0  # of those, how many the log refused at least once
        self._lost = 0  # owed events dropped past MAX_OWED, since the log last took a write

    @property
    def owed(self) -> int:
        """How many events the log refused and that wait for the next write."""
        return self._owed

    def record_queue(self, key: str, event: Event) -> None:
        """Keep one of ``key``'s queue events for the next write (stream ``queue/<key>``)."""
        self._unwritten.append((f"queue/{key}", event))

    def record_cache(self, event: Event) -> None:
        """Keep one cache event for the next write (stream ``cache/<its key>``)."""
        self._unwritten.append((cache_stream(getattr(event, "key", "cache")), event))

    async def flush(self) -> None:
        """Write what was kept, per stream, off the event loop; one stream's trouble is its own.

        A write cancelled before it ran (waiting for a worker thread as the runtime closes)
        puts its batch back, first, for the next write: nothing kept is lost to it.
        """
        batch, self._unwritten = self._unwritten, []
        if not batch:
            return
        store = self._store
        ran = False
        refused: list[tuple[str, Event]] = []
        problem = ""

        def write() -> None:
            nonlocal ran, problem
            ran = True
            streams: dict[str, list[Event]] = {}
            for stream, event in batch:
                streams.setdefault(stream, []).append(event)
            for stream, events in streams.items():
                try:
                    store.append(stream, events, expected_version=None)
                except HostlerError as exc:  # owed: kept for the next write, in order
                    refused.extend((stream, event) for event in events)
                    problem = exc.message

        try:
            await self._io.run(write)
        except BaseException:
            if not ran:
                self._unwritten[:0] = batch
            raise
        self._settle(refused, problem)

    def _settle(self, refused: list[tuple[str, Event]], problem: str) -> None:
        """Keep what the log refused (first, in order), and say how the debt changed."""
        if not refused:
            if self._owed:
                log.warning(
                    "hostler: %d queue and cache events written late (the log refused them "
                    "for a while)%s",
                    self._owed,
                    f"; {self._lost} past the {MAX_OWED} owed were lost" if self._lost else "",
                )
            self._owed = self._lost = 0
            return
        if not self._owed:
            log.warning(
                "hostler: %d queue and cache events not recorded yet: %s; owed, written once "
                "the log takes writes again",
                len(refused),
                problem,
            )
        self._unwritten[:0] = refused
        self._owed = len(refused)  # what was owed before was in this batch, first
        overflow = len(self._unwritten) - MAX_OWED
        if overflow > 0:  # the oldest go: memory is bounded whatever the outage
            del self._unwritten[:overflow]
            self._lost += overflow
            self._owed = max(self._owed - overflow, 0)
