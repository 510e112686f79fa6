"""The event log on a real SQLite file and a real PostgreSQL server: appends, concurrency,
reads, append-only, filters."""

from __future__ import annotations

import sqlite3
import stat
import threading
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from hostler import (
    ConcurrencyError,
    EventStore,
    RecordedEvent,
    StoreError,
    StoreSchemaError,
    UnknownEvent,
    UsageError,
)
from hostler.store.migrate import EVENTS_COLUMNS, SQLITE_OBJECTS

from _support import Note, run_python


def raw_sql(target: str, *statements: str) -> None:
    """Run SQL on a log behind hostler's back (as another program would), one transaction."""
    url = target if "://" in target else f"sqlite:///{target}"
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.exec_driver_sql(statement)
    finally:
        engine.dispose()


def test_append_assigns_versions_and_global_seqs(store: EventStore) -> None:
    first = store.append("s/a", [Note("one"), Note("two")], expected_version=0)
    second = store.append("s/b", [Note("three")], expected_version=0)
    third = store.append("s/a", [Note("four")], expected_version=2)
    assert first.version == 2 and third.version == 3
    assert first.seqs == (1, 2) and second.seqs == (3,) and third.seqs == (4,)
    records = store.read_stream("s/a")
    assert [r.version for r in records] == [1, 2, 3]
    assert [r.event for r in records] == [Note("one"), Note("two"), Note("four")]
    assert all(r.recorded_at.tzinfo is not None for r in records)
    assert store.stream_version("s/a") == 3
    assert store.stream_version("missing") == 0
    assert store.last_seq() == 4 and store.count() == 4


def test_metadata_is_stored_with_hostler_version(store: EventStore) -> None:
    store.append(
        "s/a",
        [Note("x")],
        expected_version=0,
        metadata={
            "correlation_id": "c1",
            "causation_id": 7,
            "actor": "test",
            "policy_version": "p9",
        },
    )
    (record,) = store.read_stream("s/a")
    assert record.metadata["correlation_id"] == "c1"
    assert record.metadata["causation_id"] == 7
    assert record.metadata["policy_version"] == "p9"
    assert record.metadata["hostler_version"]


def test_wrong_expected_version_writes_nothing_of_the_batch(store: EventStore) -> None:
    store.append("s/a", [Note("one")], expected_version=0)
    with pytest.raises(ConcurrencyError) as caught:
        store.append("s/a", [Note("two"), Note("three")], expected_version=0)
    assert caught.value.code == "store.concurrency"
    assert caught.value.actual == 1
    assert "s/a" in str(caught.value)
    # A version ahead of the stream is refused too (no gaps).
    with pytest.raises(ConcurrencyError):
        store.append("s/a", [Note("two")], expected_version=5)
    assert [r.event for r in store.read_stream("s/a")] == [Note("one")]
    assert store.count() == 1


def test_append_any_version_goes_to_the_end(store: EventStore) -> None:
    store.append("s/a", [Note("one")], expected_version=None)
    result = store.append("s/a", [Note("two")], expected_version=None)
    assert result.version == 2


def test_bad_appends_are_usage_errors(store: EventStore) -> None:
    with pytest.raises(UsageError):
        store.append("s/a", [], expected_version=0)
    with pytest.raises(UsageError):
        store.append("", [Note("x")], expected_version=0)
    with pytest.raises(TypeError):
        store.append("s/a", [object()], expected_version=0)  # type: ignore[list-item]
    assert store.count() == 0


def test_concurrent_threads_same_expected_version_exactly_one_wins(store: EventStore) -> None:
    barrier = threading.Barrier(8)
    outcomes: list[str] = []
    lock = threading.Lock()

    def contender(i: int) -> None:
        barrier.wait()
        try:
            store.append("s/race", [Note(f"t{i}", i)], expected_version=0)
        except ConcurrencyError:
            result = "lost"
        else:
            result = "won"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=contender, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["lost"] * 7 + ["won"]
    assert len(store.read_stream("s/race")) == 1


_RACER = """
import sys, time
from hostler import EventStore, ConcurrencyError
from _support import Note
path, start = sys.argv[1], float(sys.argv[2])
with EventStore.open(path) as store:
    while time.time() < start:
        time.sleep(0.001)
    try:
        store.append("s/race", [Note(sys.argv[3])], expected_version=0)
    except ConcurrencyError:
        print("lost")
    else:
        print("won")
"""


def test_concurrent_processes_same_expected_version_exactly_one_wins(
    store: EventStore, log_target: str
) -> None:
    import subprocess
    import sys
    import time

    start = time.time() + 1.5
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, log_target, str(start), f"p{i}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).parent,
        )
        for i in range(4)
    ]
    results = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), results
    assert sorted(out.strip() for out, _ in results) == ["lost"] * 3 + ["won"]
    assert len(store.read_stream("s/race")) == 1


def test_group_commit_shares_commits_between_threads(store: EventStore) -> None:
    def writer(i: int) -> None:
        for n in range(40):
            store.append(f"s/w{i}", [Note("x", n)], expected_version=n)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    commits, appends = store.commit_stats
    assert appends == 320
    assert store.count() == 320
    assert commits < appends, "8 concurrent appenders should share fsyncs"
    for i in range(8):
        assert [r.version for r in store.read_stream(f"s/w{i}")] == list(range(1, 41))


def test_group_commit_isolates_a_conflict_within_a_batch(store: EventStore) -> None:
    """Appends batched into one commit keep their own version checks."""
    store.append("s/shared", [Note("seed")], expected_version=0)
    barrier = threading.Barrier(6)
    errors: list[BaseException] = []

    def writer(i: int) -> None:
        barrier.wait()
        for n in range(30):
            try:
                store.append(f"s/own{i}", [Note("x", n)], expected_version=n)
                store.append("s/shared", [Note("y", i)], expected_version=1)
            except ConcurrencyError:
                pass
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert [r.version for r in store.read_stream("s/shared")] == [1, 2]
    for i in range(6):
        assert len(store.read_stream(f"s/own{i}")) == 30


def test_update_delete_and_truncate_are_refused_by_triggers(
    store: EventStore, log_target: str
) -> None:
    store.append("s/a", [Note("keep me")], expected_version=0)
    with pytest.raises(sa.exc.DBAPIError, match="append-only: UPDATE refused"):
        raw_sql(log_target, "UPDATE events SET type = 'x'")
    with pytest.raises(sa.exc.DBAPIError, match="append-only: DELETE refused"):
        raw_sql(log_target, "DELETE FROM events")
    if "://" in log_target:  # SQLite has no TRUNCATE; PostgreSQL's skips row triggers
        with pytest.raises(sa.exc.DBAPIError, match="append-only: TRUNCATE refused"):
            raw_sql(log_target, "TRUNCATE events")
    assert [r.event for r in store.read_stream("s/a")] == [Note("keep me")]


def test_seq_is_never_reused_after_a_failed_batch(store: EventStore) -> None:
    store.append("s/a", [Note("1")], expected_version=0)
    with pytest.raises(ConcurrencyError):
        store.append("s/a", [Note("bad")], expected_version=0)
    result = store.append("s/b", [Note("2")], expected_version=0)
    assert result.seqs[0] > 1


def test_sqlite_file_settings(sqlite_store: EventStore, log_path: Path) -> None:
    store = sqlite_store
    store.append("s/a", [Note("x")], expected_version=0)
    assert stat.S_IMODE(log_path.stat().st_mode) == 0o600
    raw = sqlite3.connect(log_path)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        raw.close()
    with store._engines.writer.connect() as conn:  # the pragmas of hostler's own connections
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000


def test_read_all_filters(store: EventStore) -> None:
    clock_times = iter(
        datetime(2026, 1, 1, 12, 0, tzinfo=UTC) + timedelta(minutes=m) for m in range(100)
    )
    timed = EventStore(store._engines, name=store.name, lock=None, clock=lambda: next(clock_times))
    timed.append("engine/a", [Note("a1")], expected_version=0)  # 12:00
    timed.append("engine/b", [Note("b1")], expected_version=0)  # 12:01
    timed.append("lease/x", [Note("x1")], expected_version=0)  # 12:02
    timed.append("engine/a", [Note("a2", 2)], expected_version=1)  # 12:03

    def notes(records: Iterable[RecordedEvent]) -> list[str]:
        return [r.event.text for r in records]  # type: ignore[union-attr]

    assert notes(store.read_all()) == ["a1", "b1", "x1", "a2"]
    assert notes(store.read_all(after_seq=2)) == ["x1", "a2"]
    assert notes(store.read_all(until_seq=2)) == ["a1", "b1"]
    assert notes(store.read_all(streams=["engine/a"])) == ["a1", "a2"]
    assert notes(store.read_all(streams=["engine/a", "lease/x"])) == ["a1", "x1", "a2"]
    assert notes(store.read_all(stream_prefix="engine/")) == ["a1", "b1", "a2"]
    assert notes(store.read_all(types=["test.note"], limit=2)) == ["a1", "b1"]
    assert notes(store.read_all(types=["nope"])) == []
    assert notes(store.read_all(types=[])) == []
    assert notes(store.read_all(last=2)) == ["x1", "a2"]
    assert notes(store.read_all(stream_prefix="engine/", last=1)) == ["a2"]
    since = datetime(2026, 1, 1, 12, 1, tzinfo=UTC)
    until = datetime(2026, 1, 1, 12, 2, tzinfo=UTC)
    assert notes(store.read_all(since=since, until=until)) == ["b1", "x1"]
    # "state as of": a stream up to a version or a time
    assert notes(store.read_stream("engine/a", until_version=1)) == ["a1"]
    assert notes(store.read_stream("engine/a", until_time=until)) == ["a1"]
    # a prefix with LIKE wildcards is taken literally
    assert notes(store.read_all(stream_prefix="engine%")) == []


def test_read_all_pages_through_large_logs(store: EventStore) -> None:
    for batch in range(12):
        store.append(
            "s/big",
            [Note("n", batch * 1000 + i) for i in range(1000)],
            expected_version=batch * 1000,
        )
    seqs = [r.seq for r in store.read_all()]
    assert seqs == list(range(1, 12001))
    assert [r.event.n for r in store.read_all(after_seq=11990)] == list(range(11990, 12000))  # type: ignore[union-attr]


def test_unknown_event_type_survives_a_read(store: EventStore, log_target: str) -> None:
    store.append("s/a", [Note("before")], expected_version=0)
    raw_sql(
        log_target,
        "INSERT INTO events (stream_id, version, type, schema_version, payload, metadata, recorded_at) "
        "VALUES ('s/a', 2, 'gone_plugin.model_loaded', 4, '{\"weights\": 123, \"nested\": {\"a\": [1, 2]}}', '{}', "
        "'2026-01-01T00:00:00.000000Z')",
    )
    store.append("s/a", [Note("after")], expected_version=2)
    records = store.read_stream("s/a")
    assert [r.type for r in records] == ["test.note", "gone_plugin.model_loaded", "test.note"]
    unknown = records[1].event
    assert isinstance(unknown, UnknownEvent)
    assert unknown.payload == {"weights": 123, "nested": {"a": [1, 2]}}
    assert unknown.schema_version == 4
    assert "not registered" in unknown.reason


def test_a_payload_that_no_longer_fits_stays_readable(store: EventStore, log_target: str) -> None:
    raw_sql(
        log_target,
        "INSERT INTO events (stream_id, version, type, schema_version, payload, metadata, recorded_at) "
        "VALUES ('s/a', 1, 'test.note', 1, '{\"renamed\": 1}', '{}', '2026-01-01T00:00:00.000000Z')",
    )
    (record,) = store.read_stream("s/a")
    assert isinstance(record.event, UnknownEvent)
    assert "does not fit" in record.event.reason


def test_writes_after_close_are_refused(log_path: Path) -> None:
    store = EventStore.open(log_path)
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        store.append("s/a", [Note("x")], expected_version=0)
    with pytest.raises(StoreError, match="closed"):
        store.last_seq()


def test_a_second_reader_process_sees_committed_events(store: EventStore, log_target: str) -> None:
    store.append("s/a", [Note("hello", 1)], expected_version=0)
    result = run_python(
        "import sys; from hostler import EventStore; import _support\n"
        "with EventStore.open(sys.argv[1]) as s: print([r.event.text for r in s.read_all()])",
        log_target,
        cwd=Path(__file__).parent,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['hello']"


def test_an_unstorable_payload_fails_only_its_own_append(store: EventStore) -> None:
    with pytest.raises(UsageError, match="cannot be stored as JSON"):
        store.append("s/a", [Note("ok"), Note({1, 2})], expected_version=0)  # type: ignore[arg-type]
    assert store.count() == 0
    store.append("s/a", [Note("fine")], expected_version=0)
    assert store.count() == 1


def test_a_writer_in_another_process_is_detected_despite_the_version_cache(
    store: EventStore, log_target: str
) -> None:
    """The store remembers versions it wrote; another process moving a stream on must still
    turn our append into a conflict, never a gap or a duplicate."""
    store.append("s/shared", [Note("mine")], expected_version=0)
    other = run_python(
        "import sys; from hostler import EventStore; from _support import Note\n"
        "with EventStore.open(sys.argv[1]) as s:\n"
        "    s.append('s/shared', [Note('theirs'), Note('theirs2')], expected_version=1)",
        log_target,
    )
    assert other.returncode == 0, other.stderr
    with pytest.raises(ConcurrencyError) as caught:
        store.append("s/shared", [Note("mine again")], expected_version=1)
    assert caught.value.actual == 3
    store.append("s/shared", [Note("after reload")], expected_version=3)
    assert [r.version for r in store.read_stream("s/shared")] == [1, 2, 3, 4]


def test_transact_reads_decides_and_appends_under_the_write_lock(store: EventStore) -> None:
    store.append("s/t", [Note("a", 1), Note("b", 2)], expected_version=0)
    seen: list[list[str]] = []

    def decide(fresh: list[RecordedEvent]) -> tuple[list[Note], int]:
        seen.append([r.event.text for r in fresh])  # type: ignore[union-attr]
        total = sum(r.event.n for r in fresh)  # type: ignore[union-attr]
        return [Note("sum", total)], total

    answer, fresh, result = store.transact("s/t", decide, after_version=0)
    assert answer == 3
    assert [r.version for r in fresh] == [1, 2]
    assert result is not None
    assert result.version == 3
    answer, fresh, result = store.transact("s/t", decide, after_version=3)
    assert (answer, fresh) == (0, [])
    assert seen == [["a", "b"], []]
    assert [r.event for r in store.read_stream("s/t")][-2:] == [Note("sum", 3), Note("sum", 0)]
    # deciding nothing writes nothing
    _, _, none = store.transact("s/t", lambda fresh: ([], None), after_version=4)
    assert none is None
    assert store.stream_version("s/t") == 4


def test_transact_rolls_back_when_decide_raises(store: EventStore) -> None:
    def boom(fresh: list[RecordedEvent]) -> tuple[list[Note], None]:
        raise RuntimeError("policy bug")

    with pytest.raises(RuntimeError, match="policy bug"):
        store.transact("s/t", boom, after_version=0)
    assert store.count() == 0
    store.append("s/t", [Note("still works")], expected_version=0)
    assert store.count() == 1


# -- whose database it is: hostler's own objects, nothing else --------------------------------


def _objects(path: Path) -> set[tuple[str, str]]:
    raw = sqlite3.connect(path)
    try:
        return {
            (str(kind), str(name))
            for kind, name in raw.execute("SELECT type, name FROM sqlite_master")
            if not str(name).lower().startswith("sqlite_")
        }
    finally:
        raw.close()


def test_a_fresh_log_holds_exactly_the_objects_hostler_recognises_as_its_own(
    log_path: Path,
) -> None:
    """The list the foreign-database check trusts is what the migrations make (no more)."""
    EventStore.open(log_path).close()
    assert _objects(log_path) == SQLITE_OBJECTS
    raw = sqlite3.connect(log_path)
    try:
        columns = {row[1] for row in raw.execute("PRAGMA table_info(events)")}
    finally:
        raw.close()
    assert columns == EVENTS_COLUMNS


def test_a_newer_hostlers_log_is_refused_before_anything_is_written(log_path: Path) -> None:
    """Its journal mode and file mode were switched before the revision was read."""
    with EventStore.open(log_path) as store:
        store.append("s/a", [Note("x")], expected_version=0)
    raw = sqlite3.connect(log_path)
    try:
        raw.execute("PRAGMA journal_mode=DELETE")
        raw.execute("UPDATE alembic_version SET version_num = '0099_future'")
        raw.execute("CREATE TABLE snapshots (id INTEGER PRIMARY KEY)")  # made by that newer one
        raw.commit()
    finally:
        raw.close()
    log_path.chmod(0o644)
    before = (log_path.read_bytes(), stat.S_IMODE(log_path.stat().st_mode))
    with pytest.raises(StoreSchemaError, match="schema revision '0099_future' is newer"):
        EventStore.open(log_path)
    assert (log_path.read_bytes(), stat.S_IMODE(log_path.stat().st_mode)) == before
    assert sorted(p.name for p in log_path.parent.iterdir()) == ["events.db"]


def test_a_database_whose_objects_were_all_dropped_is_empty_and_becomes_a_log(
    log_path: Path,
) -> None:
    log_path.parent.mkdir(parents=True)
    raw = sqlite3.connect(log_path)
    try:
        raw.execute("CREATE TABLE gone (x)")
        raw.execute("DROP TABLE gone")
        raw.commit()
    finally:
        raw.close()
    assert log_path.stat().st_size > 0
    with EventStore.open(log_path) as store:
        store.append("s/a", [Note("x")], expected_version=0)
    assert _objects(log_path) == SQLITE_OBJECTS


def test_a_capped_log_fails_as_a_full_disk_and_keeps_what_it_has(tmp_path: Path) -> None:
    """``[daemon] log_max_mib``: past the cap, writes fail with ``store.full``, nothing lost."""
    from hostler.errors import StoreFullError

    path = tmp_path / "capped.db"
    with EventStore.open(path, max_bytes=256 * 1024) as store:

        def fill() -> int:
            for n in range(10_000):
                store.append(f"test/{n}", [Note("x" * 1000)], expected_version=0)
            return 10_000

        with pytest.raises(StoreFullError) as caught:
            fill()
        written = store.count()
        assert caught.value.code == "store.full"
        assert "the disk is full" in caught.value.message
        assert 0 < written < 10_000  # every acknowledged append is still there
        assert {r.stream_id for r in store.read_all()} == {f"test/{n}" for n in range(written)}
    assert path.stat().st_size <= 256 * 1024
    with EventStore.open(path) as uncapped:  # without the cap it takes writes again
        uncapped.append("test/after", [Note("y")], expected_version=0)
        assert uncapped.count() == written + 1
