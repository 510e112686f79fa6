"""The serve terminal's story: the daemon's recorded events, told as they are written.

The narrator follows the daemon's event log and its ledger's (:func:`hostler.drivers.tail.follow`,
as ``GET /api/events`` does) and gives each event to one :class:`~hostler.postmortem.story.Story`,
which decides whether it makes a line and how it reads; each line goes to the
``hostler.story`` logger at the story's level (detail is DEBUG, the story INFO, trouble
WARNING), so ``hostler serve -q`` / ``-v`` choose how much of it shows. Nothing in the core
prints: what the terminal says is derived from what was recorded.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import anyio

from hostler.clock import Clock
from hostler.drivers.offloop import OffLoop
from hostler.drivers.tail import TAIL_PAGE, follow, page_after
from hostler.errors import StoreError
from hostler.postmortem.story import Story
from hostler.store.log import EventStore, RecordedEvent

__all__ = ["STORY_LOGGER", "Narrator"]

#: The logger the story's lines go to.
STORY_LOGGER = "hostler.story"

log = logging.getLogger(STORY_LOGGER)


class Narrator:
    """Tells ``story`` the events of ``logs`` written after the seqs in ``after``.

    Args:
        logs: The daemon's event log, then its ledger's when that is another store.
        after: For each log, the last seq already there when the daemon started.
        story: The fold that words each event.
        clock: Paces the tails.
        offloop: Where the last pages are read at shutdown.
    """

    def __init__(
        self,
        logs: Sequence[EventStore],
        after: Sequence[int],
        story: Story,
        *,
        clock: Clock,
        offloop: OffLoop,
    ) -> None:
        self._logs = list(logs)
        self._after = list(after)
        self._story = story
        self._clock = clock
        self._io = offloop

    async def run(self) -> None:
        """Tell each new event of every log as it is written, until cancelled."""
        async with anyio.create_task_group() as tasks:
            for index in range(len(self._logs)):
                tasks.start_soon(self._follow, index)

    async def _follow(self, index: int) -> None:
        store = self._logs[index]
        while True:
            try:
                async for page in follow(store, self._after[index], self._clock):
                    self._tell(index, page)
            except StoreError as exc:  # a locked or broken log: the story waits for it
                log.debug("the story could not read the log: %s", exc.message)
                await self._clock.sleep(1.0)

    async def catch_up(self) -> None:
        """Tell what was written since the last page (the shutdown's stops), then return."""
        for index, store in enumerate(self._logs):
            while True:
                try:
                    page = await self._io.run(page_after, store, self._after[index])
                except StoreError:
                    break
                self._tell(index, page)
                if len(page) < TAIL_PAGE:
                    break

    def _tell(self, index: int, page: list[RecordedEvent]) -> None:
        for record in page:
            self._after[index] = max(self._after[index], record.seq)
            line = self._story.tell(
                {
                    "seq": record.seq,
                    "stream": record.stream_id,
                    "type": record.type,
                    "payload": record.payload,
                }
            )
            if line is not None:
                log.log(line.level, "%s", line.text)
