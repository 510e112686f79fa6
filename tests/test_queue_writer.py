"""The queue and cache events kept for the next write are never lost to a cancelled write.

Found in the suite on a loaded machine (issue 20): the periodic write of the queue events took
its batch, then waited for a worker thread; the runtime closing cancelled it there, before the
write ran, and the batch was gone — a request's ``queue.released`` among it, so the what-if
dropped the request ("the log never saw it end").
"""

from __future__ import annotations

import threading
from pathlib import Path

import anyio
import pytest

from hostler.drivers.offloop import OffLoop
from hostler.events.queue import QueueReleased
from hostler.runtime.writer import QueueEventWriter
from hostler.store.log import EventStore

pytestmark = pytest.mark.anyio


async def test_a_write_cancelled_before_it_ran_keeps_its_events_for_the_next(
    tmp_path: Path,
) -> None:
    offloop = OffLoop(threads=1)
    held = threading.Event()
    release = threading.Event()
    with EventStore.open(tmp_path / "events.db") as store:
        writer = QueueEventWriter(store, offloop)
        writer.record_queue("e:m:0", QueueReleased("e:m:0", 1, "interactive", 0.5, 10.0))
        async with anyio.create_task_group() as tasks:

            def busy() -> None:  # the only worker thread, taken
                held.set()
                release.wait(30)

            tasks.start_soon(offloop.run, busy)
            await anyio.to_thread.run_sync(held.wait)
            with anyio.move_on_after(0.2):  # the write waits for the thread, and is cancelled
                await writer.flush()
            release.set()
        await writer.flush()  # the next write takes what the cancelled one had
        written = [r.type for r in store.read_stream("queue/e:m:0")]
    assert written == ["queue.released"]


async def test_a_write_that_ran_is_not_written_twice(tmp_path: Path) -> None:
    with EventStore.open(tmp_path / "events.db") as store:
        writer = QueueEventWriter(store, OffLoop())
        writer.record_queue("e:m:0", QueueReleased("e:m:0", 1, "interactive", 0.5, 10.0))
        await writer.flush()
        await writer.flush()
        assert [r.type for r in store.read_stream("queue/e:m:0")] == ["queue.released"]
