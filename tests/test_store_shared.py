"""One log, several processes: a tail that misses no committed row, and one owner at a time.

On SQLite and on a real PostgreSQL server (``log_target``). On PostgreSQL rows used to commit
out of seq order: a tail reading ``after_seq`` missed 17 of 1,000 rows appended by concurrent
writers, and ``owner=True`` gave no exclusivity.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hostler import EventStore, StoreError, StoreLockedError, UsageError
from hostler.errors import StoreUnavailableError

from _postgres import throwaway_cluster
from _support import Note

#: Each writer process appends this many single-event appends to a stream of its own.
APPENDS = 250
WRITERS = 4

_WRITER = """
import sys
from hostler import EventStore
from _support import Note
target, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
with EventStore.open(target) as store:
    for n in range(count):
        store.append(f"w/{name}", [Note(name, n)], expected_version=n)
print("done")
"""


def test_a_tail_misses_no_row_that_concurrent_writers_commit(log_target: str) -> None:
    """Read ``after_seq`` in a loop while four processes append: every row is seen, once."""
    with EventStore.open(log_target) as reader:
        writers = [
            subprocess.Popen(
                [sys.executable, "-c", _WRITER, log_target, f"p{i}", str(APPENDS)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=Path(__file__).parent,
            )
            for i in range(WRITERS)
        ]
        seen: list[tuple[str, int]] = []
        position = 0

        def drain() -> None:
            nonlocal position
            for record in reader.read_all(after_seq=position):
                seen.append((record.stream_id, record.version))
                position = record.seq

        while any(w.poll() is None for w in writers):
            drain()
        drain()
        results = [w.communicate(timeout=60) for w in writers]
        assert all(w.returncode == 0 for w in writers), results
        expected = {(f"w/p{i}", v) for i in range(WRITERS) for v in range(1, APPENDS + 1)}
        assert len(seen) == len(set(seen)), "a row was read twice"
        assert set(seen) == expected, f"the tail missed {len(expected - set(seen))} rows"


def test_one_owner_at_a_time(log_target: str) -> None:
    """A second owner of the same log is refused while the first holds it, admitted after."""
    with EventStore.open(log_target, owner=True) as first:
        first.append("s/a", [Note("mine")], expected_version=0)
        with pytest.raises(StoreLockedError, match="owned by another hostler daemon"):
            EventStore.open(log_target, owner=True)
        with EventStore.open(log_target) as reader:  # readers are never refused
            assert reader.count() == 1
    with EventStore.open(log_target, owner=True) as second:  # closed: released at once
        assert second.count() == 1


def test_a_stopped_server_is_store_unavailable_and_writes_resume_once_it_is_back() -> None:
    """PostgreSQL stopped under an open log: one clear error per write, then writes again."""
    with throwaway_cluster() as cluster:
        target = cluster.new_database()
        with EventStore.open(target, owner=True) as store:
            store.append("s/a", [Note("before")], expected_version=0)
            cluster.stop("fast")
            with pytest.raises(StoreUnavailableError) as caught:
                store.append("s/a", [Note("while down")], expected_version=1)
            assert caught.value.code == "store.unavailable"
            assert "\n" not in caught.value.message
            with pytest.raises(StoreUnavailableError):
                store.count()
            cluster.start()
            store.append("s/a", [Note("after")], expected_version=1)
            assert [r.event for r in store.read_all()] == [Note("before"), Note("after")]


def test_the_owner_lock_lost_with_a_server_restart_is_taken_again_or_writes_are_refused() -> None:
    """A restart ends the owner's session (the server drops its advisory lock): the owner's next
    write takes it again; had another daemon taken it meanwhile, the write is refused."""
    with throwaway_cluster() as cluster:
        target = cluster.new_database()
        with EventStore.open(target, owner=True) as first:
            first.append("s/a", [Note("1")], expected_version=0)
            cluster.stop("fast")
            cluster.start()
            first.append("s/a", [Note("2")], expected_version=1)  # the lock is taken again
            with pytest.raises(StoreLockedError):
                EventStore.open(target, owner=True)
            cluster.stop("fast")
            with pytest.raises(StoreUnavailableError):
                first.append("s/a", [Note("lost")], expected_version=2)
            cluster.start()
            with EventStore.open(target, owner=True) as usurper:  # came first after the restart
                with pytest.raises(StoreLockedError, match="owned by another hostler daemon"):
                    first.append("s/a", [Note("refused")], expected_version=2)
                assert [r.event for r in usurper.read_all()] == [Note("1"), Note("2")]


def test_hosts_of_a_fleet_share_one_database_each_with_its_own_part_and_owner(pg_url: str) -> None:
    """Two hosts append the same stream ids without a conflict; each host has one owner; every
    event names its host; a reader asks for a host by name and an unknown one is refused."""
    from hostler.store.postgres import fleet_hosts

    with (
        EventStore.open(pg_url, owner=True, host="gpu1") as one,
        EventStore.open(pg_url, owner=True, host="gpu2") as two,
    ):
        one.append("engine/llamacpp:alpha:0", [Note("on gpu1")], expected_version=0)
        two.append("engine/llamacpp:alpha:0", [Note("on gpu2")], expected_version=0)
        two.append("engine/llamacpp:alpha:0", [Note("again")], expected_version=1)
        with pytest.raises(StoreLockedError, match="for host 'gpu1'"):
            EventStore.open(pg_url, owner=True, host="gpu1")
        with EventStore.open(pg_url, host="gpu1") as reader:
            (record,) = reader.read_all()
            assert record.event == Note("on gpu1") and record.metadata["host"] == "gpu1"
        with EventStore.open(pg_url, host="gpu2") as reader:
            assert [r.event for r in reader.read_stream("engine/llamacpp:alpha:0")] == [
                Note("on gpu2"),
                Note("again"),
            ]
        with pytest.raises(StoreError, match=r"no host 'gpu3' in this log \(hosts: gpu1, gpu2\)"):
            EventStore.open(pg_url, host="gpu3")
        with pytest.raises(UsageError, match="not a host name"):
            EventStore.open(pg_url, host="GPU 1")
        with EventStore.open(pg_url) as whole:
            assert whole.count() == 0  # the database's own log is apart from its hosts'
            assert fleet_hosts(whole._engines.reader) == ["gpu1", "gpu2"]


def test_a_follower_of_the_log_lives_through_a_server_restart(tmp_path: Path) -> None:
    """`hostler events -f` once ended with store.unavailable when PostgreSQL stopped: it says
    so once, waits, and shows what is appended after the server is back."""
    import select

    with throwaway_cluster() as cluster:
        target = cluster.new_database()
        with EventStore.open(target) as store:
            store.append("s/a", [Note("before")], expected_version=0)
        follower = subprocess.Popen(
            [sys.executable, "-c", "import sys; from hostler.cli import main; sys.exit(main())",
             "events", "-f", "--json", "--interval", "0.1", "--db", target],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert follower.stdout is not None and follower.stderr is not None
        try:
            assert '"before"' in follower.stdout.readline()
            cluster.stop("fast")
            said = follower.stderr.readline()  # the outage, said once, while it waits
            assert "[store.unavailable]" in said and "waiting" in said, said
            assert follower.poll() is None
            cluster.start()
            with EventStore.open(target) as store:
                store.append("s/a", [Note("after")], expected_version=1)
            ready, _, _ = select.select([follower.stdout], [], [], 60)
            assert ready, "nothing shown within 60 s of the server's return"
            assert '"after"' in follower.stdout.readline()
        finally:
            follower.terminate()
            follower.communicate(timeout=30)


def test_another_applications_alembic_database_is_foreign_not_too_new(pg_url: str) -> None:
    """A database of another alembic project was told 'newer than this hostler knows'."""
    import sqlalchemy as sa

    from hostler.errors import StoreForeignError

    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE alembic_version (version_num varchar(32) PRIMARY KEY)")
        conn.exec_driver_sql("INSERT INTO alembic_version VALUES ('abc123deadbe')")
    engine.dispose()
    with pytest.raises(StoreForeignError, match="another application's database"):
        EventStore.open(pg_url)


def test_one_unreadable_host_does_not_hide_the_rest_of_the_fleet(pg_url: str) -> None:
    """`hostler state` of a fleet failed whole when one host's part could not be read."""
    import sqlalchemy as sa

    from _support import run_cli

    with EventStore.open(pg_url, owner=True, host="gpu1") as one:
        one.append("s/a", [Note("on gpu1")], expected_version=0)
    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:  # a part hostler cannot read: not its table
        conn.exec_driver_sql('CREATE SCHEMA "hostler_host_bad"')
        conn.exec_driver_sql('CREATE TABLE "hostler_host_bad".events (x int)')
    engine.dispose()
    shown = run_cli("state", "--db", pg_url)
    assert shown.returncode == 1
    assert "HOST bad\nerror [store.foreign]" in shown.stdout
    assert "HOST gpu1\n" in shown.stdout and "1 events" in shown.stdout.split("HOST gpu1")[1]
    assert shown.stderr.count("\n") == 1 and "[store.foreign]" in shown.stderr
