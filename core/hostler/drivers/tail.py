"""Follow an event log: every event after a seq, then each new one as it is written.

The one tail of a live log: the HTTP face's event stream (``GET /api/events``) and the serve
terminal's story (:mod:`hostler.daemon_parts.narrator`) both read through it. The log is read
in pages off the event loop; a page shorter than :data:`TAIL_PAGE` means the tail caught up,
and it looks again after :data:`TAIL_POLL` seconds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio.to_thread

from hostler.clock import ClockLike, as_clock
from hostler.store.log import EventStore, RecordedEvent

__all__ = ["TAIL_PAGE", "TAIL_POLL", "follow", "page_after"]

#: How often a tail that caught up looks for new events (seconds).
TAIL_POLL = 0.25
#: How many events one read returns at most.
TAIL_PAGE = 500


def page_after(store: EventStore, after: int) -> list[RecordedEvent]:
    """The next page of ``store``'s events after seq ``after`` (blocking: run it off the loop)."""
    return list(store.read_all(after_seq=after, limit=TAIL_PAGE))


async def follow(
    store: EventStore,
    after: int,
    clock: ClockLike,
    *,
    poll: float = TAIL_POLL,
) -> AsyncIterator[list[RecordedEvent]]:
    """Pages of ``store``'s events after seq ``after``, for ever (until the caller stops).

    Each page is read in a worker thread, so the loop runs between pages: a consumer that
    writes a page at once gives the loop a chance to notice a closed connection before the
    next. A look that finds nothing new yields an empty page, once per ``poll``: a consumer
    that should stop (its daemon shutting down) gets the turn to say so.
    """
    timer = as_clock(clock)
    while True:
        page = await anyio.to_thread.run_sync(page_after, store, after)
        if page:
            after = page[-1].seq
        yield page
        if len(page) < TAIL_PAGE:
            await timer.sleep(poll)
