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


async def test_events_the_log_refused_are_owed_and_written_once_it_can(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 22: during a 40 s lock (or a full disk) the queue events were said and dropped
    (×46), so metrics, what-if and explain silently missed requests 1–47. They are owed now:
    kept, in order, and written once the log takes writes again; said once, not per write."""
    import sqlite3

    path = tmp_path / "events.db"
    with EventStore.open(path, busy_timeout=0.05) as store:
        writer = QueueEventWriter(store, OffLoop())
        locker = sqlite3.connect(path, isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")  # another writer holds the log
        try:
            for request in range(1, 4):
                writer.record_queue(
                    "e:m:0", QueueReleased("e:m:0", request, "interactive", 0.5, 10.0)
                )
                await writer.flush()  # refused: owed, not dropped
            assert writer.owed == 3
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        writer.record_queue("e:m:0", QueueReleased("e:m:0", 4, "interactive", 0.5, 10.0))
        await writer.flush()
        assert writer.owed == 0
        written = [r.payload["id"] for r in store.read_stream("queue/e:m:0")]
    assert written == [1, 2, 3, 4]  # every one, in the order they happened
    said = [r.message for r in caplog.records if "not recorded" in r.message]
    assert len(said) == 1 and "owed" in said[0]
    assert any("written late" in r.message for r in caplog.records)


async def test_what_is_owed_is_bounded_and_the_loss_is_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memory stays bounded whatever the outage: past MAX_OWED the oldest go, and are counted."""
    import sqlite3

    from hostler.runtime import writer as module

    monkeypatch.setattr(module, "MAX_OWED", 2)
    path = tmp_path / "events.db"
    with EventStore.open(path, busy_timeout=0.05) as store:
        writer = QueueEventWriter(store, OffLoop())
        locker = sqlite3.connect(path, isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")
        try:
            for request in range(1, 4):
                writer.record_queue(
                    "e:m:0", QueueReleased("e:m:0", request, "interactive", 0.5, 10.0)
                )
                await writer.flush()
            assert writer.owed == 2
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        await writer.flush()
        written = [r.payload["id"] for r in store.read_stream("queue/e:m:0")]
    assert written == [2, 3]  # the oldest went
    late = [r.message for r in caplog.records if "written late" in r.message]
    assert late == [
        "hostler: 2 queue and cache events written late (the log refused them for a while); "
        "1 past the 2 owed were lost"
    ]
