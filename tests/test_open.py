"""Opening a log: migrations, schema checks, and one-line errors for bad paths and files."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from hostler import (
    EventStore,
    StoreCorruptError,
    StoreForeignError,
    StoreLockedError,
    StorePathError,
    StoreSchemaError,
)
from hostler.store.migrate import head_revision
from hostler.store.schema import metadata

from _support import Note, run_cli, run_python


def _tables(path: Path) -> set[str]:
    raw = sqlite3.connect(path)
    try:
        return {
            r[0]
            for r in raw.execute(
                "SELECT name FROM sqlite_master WHERE type IN ('table', 'trigger')"
            )
        }
    finally:
        raw.close()


def test_migrates_an_empty_file_to_head_and_reopens_idempotently(log_path: Path) -> None:
    with EventStore.open(log_path) as store:
        store.append("s/a", [Note("x")], expected_version=0)
    assert {"events", "alembic_version", "events_no_update", "events_no_delete"} <= _tables(
        log_path
    )
    for _ in range(2):
        with EventStore.open(log_path) as store:
            assert store.count() == 1
    raw = sqlite3.connect(log_path)
    try:
        assert raw.execute("SELECT version_num FROM alembic_version").fetchall() == [
            (head_revision(),)
        ]
    finally:
        raw.close()


def test_migrated_schema_matches_the_metadata(log_path: Path) -> None:
    EventStore.open(log_path).close()
    engine = sa.create_engine(f"sqlite:///{log_path}")
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), metadata)
    finally:
        engine.dispose()
    assert diff == []


def test_migration_is_one_transaction(log_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failing migration step leaves no half-made schema behind."""
    from alembic import op

    real_create_index = op.create_index
    calls = {"n": 0}

    def failing_create_index(*args: object, **kwargs: object) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("disk said no")
        real_create_index(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(op, "create_index", failing_create_index)
    with pytest.raises(RuntimeError, match="disk said no"):
        EventStore.open(log_path)
    assert _tables(log_path) == set()
    monkeypatch.undo()
    with EventStore.open(log_path) as store:
        assert store.count() == 0


def test_a_newer_schema_is_refused_with_a_clear_message(log_path: Path) -> None:
    with EventStore.open(log_path) as store:
        store.append("s/a", [Note("x")], expected_version=0)
    raw = sqlite3.connect(log_path)
    try:
        raw.execute("UPDATE alembic_version SET version_num = '0099_future'")
        raw.commit()
    finally:
        raw.close()
    with pytest.raises(StoreSchemaError) as caught:
        EventStore.open(log_path)
    message = str(caught.value)
    assert str(log_path) in message
    assert "0099_future" in message and "newer" in message and "upgrade hostler" in message
    assert caught.value.code == "store.schema-too-new"
    # untouched
    raw = sqlite3.connect(log_path)
    try:
        assert raw.execute("SELECT count(*) FROM events").fetchone() == (1,)
    finally:
        raw.close()


def test_another_applications_database_is_refused_and_left_untouched(log_path: Path) -> None:
    """hostler writes only into an empty database or its own log (never someone else's)."""
    log_path.parent.mkdir(parents=True)
    raw = sqlite3.connect(log_path)
    raw.execute("CREATE TABLE unrelated (x)")
    raw.commit()
    raw.close()
    before = log_path.read_bytes()
    with pytest.raises(
        StoreForeignError, match=r"another application's database \(tables: unrelated\)"
    ):
        EventStore.open(log_path)
    assert log_path.read_bytes() == before
    assert _tables(log_path) == {"unrelated"}
    empty = log_path.parent / "empty.db"
    sqlite3.connect(empty).close()  # an empty SQLite file is fine: it becomes a log
    with EventStore.open(empty) as store:
        store.append("s/a", [Note("x")], expected_version=0)


def test_path_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(StorePathError) as caught:
        EventStore.open(tmp_path)
    assert str(caught.value) == f"{tmp_path}: is a directory, not an event log file"


def test_corrupt_file(tmp_path: Path) -> None:
    bad = tmp_path / "events.db"
    bad.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(StoreCorruptError) as caught:
        EventStore.open(bad)
    message = str(caught.value)
    assert message.startswith(f"{bad}: not a readable hostler event log")
    assert "\n" not in message


def test_truncated_database(tmp_path: Path) -> None:
    good = tmp_path / "events.db"
    with EventStore.open(good) as store:
        for i in range(200):
            store.append("s/a", [Note("x" * 200, i)], expected_version=i)
    data = good.read_bytes()
    good.write_bytes(data[:100] + b"\x00" * 4000)
    for side in ("-wal", "-shm"):
        Path(f"{good}{side}").unlink(missing_ok=True)
    with pytest.raises(StoreCorruptError), EventStore.open(good) as store:
        list(store.read_all())


_HOLDER = """
import sys, time
from hostler import EventStore
store = EventStore.open(sys.argv[1], owner=True)
print("held", flush=True)
time.sleep(60)
"""


def test_a_log_owned_by_another_daemon_is_refused(log_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(log_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(StoreLockedError) as caught:
            EventStore.open(log_path, owner=True)
        message = str(caught.value)
        assert message == (
            f"{log_path}.lock: the event log is owned by another hostler daemon "
            f"(pid {holder.pid}); stop it or use another data directory"
        )
        # readers are not owners: the CLI can still read while the daemon runs
        with EventStore.open(log_path) as reader:
            assert reader.count() == 0
    finally:
        holder.kill()
        holder.communicate()
    # the kernel drops the lock with its holder: no stale lock after a crash
    deadline = time.monotonic() + 5
    while True:
        try:
            EventStore.open(log_path, owner=True).close()
            break
        except StoreLockedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_deleting_the_lock_file_does_not_admit_a_second_owner(log_path: Path) -> None:
    """Break found by a hostile test: after ``rm events.db.lock`` two daemons shared a log."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(log_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        Path(f"{log_path}.lock").unlink()
        with pytest.raises(StoreLockedError) as caught:
            EventStore.open(log_path, owner=True)
        assert str(caught.value) == (
            f"{log_path}: the event log is owned by another hostler daemon (its lock file "
            "events.db.lock was deleted or replaced); stop that daemon first"
        )
    finally:
        holder.kill()
        holder.communicate()
    EventStore.open(log_path, owner=True).close()  # nothing stale once the holder is gone


def test_two_owners_in_one_process_conflict(log_path: Path) -> None:
    with EventStore.open(log_path, owner=True), pytest.raises(StoreLockedError):
        EventStore.open(log_path, owner=True)


def test_unwritable_directory(tmp_path: Path) -> None:
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o555)
    tmp_path.chmod(0o755)
    try:
        result = run_python(
            "import sys\nfrom hostler import EventStore, HostlerError\n"
            "try:\n    EventStore.open(sys.argv[1])\n"
            "except HostlerError as exc:\n    print(type(exc).__name__, exc)\n",
            str(locked / "events.db"),
            obey_file_modes=True,
        )
    finally:
        locked.chmod(0o755)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"StorePathError {locked / 'events.db'}: cannot open for writing (Permission denied)"
    )


@pytest.mark.parametrize("case", ["directory", "corrupt", "unwritable", "locked"])
def test_cli_gives_one_line_errors_naming_the_file(tmp_path: Path, case: str) -> None:
    tmp_path.chmod(0o755)
    target = tmp_path / "events.db"
    obey = False
    holder = None
    if case == "directory":
        target.mkdir()
        expected = "is a directory"
    elif case == "corrupt":
        target.write_bytes(b"garbage" * 500)
        expected = "not a readable hostler event log"
    elif case == "unwritable":
        EventStore.open(target).close()
        tmp_path.chmod(0o555)
        target.chmod(0o444)
        obey = True
        expected = "cannot open for writing"
    else:
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(target)], stdout=subprocess.PIPE, text=True
        )
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        expected = "owned by another hostler daemon"
    try:
        if case == "locked":
            result = run_cli("demo", "--scripted", "--db", str(target))
        else:
            result = run_cli("events", "--db", str(target), obey_file_modes=obey)
    finally:
        tmp_path.chmod(0o755)
        if holder is not None:
            holder.kill()
            holder.communicate()
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(target) in lines[0] and expected in lines[0]
    assert lines[0].startswith("hostler: error [store.")
