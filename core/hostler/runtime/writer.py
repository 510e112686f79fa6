"""Queue and cache events, kept in memory as they happen and written in batches off the loop.

A request's queue events (``queue.*``, ``queue.served``) and the prompt-cache controller's
(``cache.*``) happen on the event loop, several per request; :class:`QueueEventWriter`
keeps them and writes them per stream, off the loop, every half second (and when a start
must follow its request's arrival in the log, PM21, and when the runtime closes).
"""

from __future__ import annotations

import logging

from hostler.drivers.offloop import OffLoop
from hostler.errors import HostlerError
from hostler.events.base import Event
from hostler.events.cache import cache_stream
from hostler.store.log import EventStore

__all__ = ["QueueEventWriter"]

log = logging.getLogger(__name__)


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

        def write() -> None:
            nonlocal ran
            ran = True
            streams: dict[str, list[Event]] = {}
            for stream, event in batch:
                streams.setdefault(stream, []).append(event)
            for stream, events in streams.items():
                try:
                    store.append(stream, events, expected_version=None)
                except HostlerError as exc:  # history, not worth a request: said, dropped
                    log.warning(
                        "hostler: %d events of %s not recorded: %s",
                        len(events),
                        stream,
                        exc.message,
                    )

        try:
            await self._io.run(write)
        except BaseException:
            if not ran:
                self._unwritten[:0] = batch
            raise
