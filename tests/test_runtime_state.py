"""The runtime as of a moment: the pure fold, its JSON, snapshots beside the log, ``state --at``."""

from __future__ import annotations

import json
import sqlite3
import zlib
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

from hostler import EventStore
from hostler.cli import main
from hostler.events.base import Event
from hostler.events.daemon import DaemonStarted
from hostler.events.ledger import (
    LedgerAdopted,
    LedgerBudgetSet,
    LedgerDenied,
    LedgerMeasured,
    LedgerReleased,
    LedgerReserved,
    LedgerSpilloverSet,
)
from hostler.events.queue import (
    QueueCancelled,
    QueueDispatched,
    QueueEnqueued,
    QueueMoved,
    QueueReleased,
)
from hostler.events.router import SessionBound
from hostler.machines.engine import (
    EngineAdopted,
    EngineCrashed,
    EngineReady,
    EngineSpawned,
    EngineStartRequested,
    EngineStopped,
    EngineStopRequested,
)
from hostler.machines.lease import LeaseGranted, LeaseReleased, LeaseRequested
from hostler.postmortem.runtime_state import STATE_SCHEMA, RuntimeState, fold_rows
from hostler.postmortem.snapshots import (
    MAX_BODY,
    MAX_RATIO,
    SIDECAR_SUFFIX,
    SNAPSHOT_EVERY,
    SNAPSHOT_SCHEMA,
    SnapshotCache,
    as_of,
    seq_at,
    world_from_json,
    world_to_json,
)
from hostler.replay import replay

T0 = datetime(2026, 11, 29, 14, 0, tzinfo=UTC)
MIB = 2**20
A, B = "llamacpp:a:0", "llamacpp:b:0"


class Log:
    """A real log whose recorded time moves one second per append."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.now = T0
        self.store = EventStore.open(path, clock=lambda: self.now)

    def add(self, stream: str, *events: Event) -> int:
        self.now += timedelta(seconds=1)
        return self.store.append(stream, list(events), expected_version=None).seqs[-1]


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    made = Log(tmp_path / "events.db")
    yield made
    made.store.close()


def state_of(log: Log, until_seq: int | None = None) -> RuntimeState:
    state = RuntimeState()
    for page in log.store.read_rows(until_seq=until_seq):
        fold_rows(state, page)
    return state


def life(log: Log, key: str = A, pid: int = 100, size: int = 900 * MIB) -> None:
    log.add("ledger/host", LedgerReserved(key, size, "me", 0, 0, 4096 * MIB, 4096 * MIB, True))
    log.add(f"engine/{key}", EngineStartRequested("stopped", "starting", 1.0, "request"))
    log.add(
        f"engine/{key}", EngineSpawned("starting", "starting", 2.0, pid, 2.0, "b", "t", "f", 4000)
    )
    log.add(f"engine/{key}", EngineReady("starting", "running", 3.0))
    log.add("ledger/host", LedgerMeasured(key, size - MIB, "me", size))


def test_constants() -> None:
    assert STATE_SCHEMA == 1
    assert SNAPSHOT_SCHEMA == 2
    assert (MAX_RATIO, MAX_BODY) == (64, 256 * 2**20)
    assert SNAPSHOT_EVERY == 50_000
    assert SIDECAR_SUFFIX == ".snapshots"


def test_an_empty_log_is_an_empty_runtime(log: Log) -> None:
    state = state_of(log)
    assert state == RuntimeState()
    assert state.budget == {
        "budget": None,
        "ceiling": None,
        "enforced": None,
        "explicit": None,
        "spillover": None,
    }
    assert state.resident == {} and state.committed == 0


def test_engines_carry_state_process_and_reserved_against_measured_bytes(log: Log) -> None:
    life(log)
    state = state_of(log)
    assert state.engines[A] == {
        "state": "running",
        "pid": 100,
        "port": 4000,
        "reserved": 900 * MIB,
        "measured": 899 * MIB,
        "since": 4,
    }
    assert state.reservations[A] == {"owner": "me", "bytes": 899 * MIB, "measured": 899 * MIB}
    assert state.committed == 899 * MIB and set(state.resident) == {A}
    assert state.budget["budget"] == 4096 * MIB and state.budget["enforced"] is True
    # stopping keeps it resident until it exits; then its process and bytes are gone
    log.add(f"engine/{A}", EngineStopRequested("running", "stopping", 4.0, "user"))
    assert set(state_of(log).resident) == {A}
    log.add(f"engine/{A}", EngineStopped("stopping", "stopped", 5.0, 0, None))
    log.add("ledger/host", LedgerReleased(A, 899 * MIB, "me", "released"))
    after = state_of(log)
    assert after.engines[A] == {
        "state": "stopped",
        "pid": None,
        "port": None,
        "reserved": None,
        "measured": None,
        "since": 7,
    }
    assert after.resident == {} and after.reservations == {} and after.committed == 0


def test_a_crash_drops_the_process_and_an_adoption_brings_a_pid(log: Log) -> None:
    life(log)
    log.add(
        f"engine/{A}",
        EngineCrashed("running", "backoff", 4.0, None, 9, True, 5.0, None, None, 1.0),
    )
    assert state_of(log).engines[A]["pid"] is None
    log.add(f"engine/{A}", EngineStartRequested("backoff", "starting", 6.0, "request"))
    assert state_of(log).engines[A]["state"] == "starting"
    log.add("ledger/host", LedgerAdopted(B, "new", 5 * MIB, "old", None, 7, 1.0, 0, 9 * MIB, 0))
    log.add(f"engine/{B}", EngineStartRequested("stopped", "starting", 1.0, "request"))
    log.add(f"engine/{B}", EngineAdopted("starting", "running", 2.0, 77))
    state = state_of(log)
    assert state.reservations[B] == {"owner": "new", "bytes": 5 * MIB, "measured": None}
    assert state.engines[B]["pid"] == 77 and state.budget["budget"] == 9 * MIB


def test_budget_settings_and_denials(log: Log) -> None:
    log.add("ledger/host", LedgerBudgetSet(8192 * MIB))
    log.add("ledger/host", LedgerSpilloverSet(False))
    log.add("ledger/host", LedgerDenied(A, MIB, "me", MIB, "budget", 0, 512 * MIB, 600 * MIB))
    budget = state_of(log).budget
    assert budget == {
        "budget": 512 * MIB,
        "ceiling": 600 * MIB,
        "enforced": None,
        "explicit": 8192 * MIB,
        "spillover": False,
    }
    log.add("ledger/host", LedgerBudgetSet(None))
    log.add("ledger/host", LedgerSpilloverSet(None))
    budget = state_of(log).budget
    assert budget["explicit"] is None and budget["spillover"] is None


def test_leases_are_kept_while_waiting_or_held(log: Log) -> None:
    log.add("lease/one", LeaseRequested("new", "waiting", 1.0, "image", "comfy"))
    assert state_of(log).leases == {
        "one": {
            "slot": "image",
            "holder": "comfy",
            "state": "waiting",
            "granted_at": None,
            "expires_at": None,
        }
    }
    log.add("lease/one", LeaseGranted("waiting", "held", 2.0, 99.0))
    held = state_of(log).leases["one"]
    assert held["state"] == "held" and held["granted_at"] == 2.0 and held["expires_at"] == 99.0
    log.add("lease/one", LeaseReleased("held", "released", 3.0, "released"))
    assert state_of(log).leases == {}


def _enqueue(log: Log, n: int, key: str = A) -> None:
    log.add(f"queue/{key}", QueueEnqueued(key, n, "interactive", False, None, None, None, 1.0))


def test_queues_hold_waiting_and_running_requests_until_a_new_daemon(log: Log) -> None:
    for n in (1, 2, 3):
        _enqueue(log, n)
    log.add(f"queue/{A}", QueueDispatched(A, 1, "interactive", 0.1, 1.1, {}))
    log.add(f"queue/{A}", QueueMoved(A, 3, "up", 2, 1.2))
    assert state_of(log).queues == {A: {"waiting": [3, 2], "running": [1]}}
    log.add(f"queue/{A}", QueueCancelled(A, 2, "interactive", "timeout", 9.0, 10.0))
    log.add(f"queue/{A}", QueueMoved(A, 3, "up", 2, 1.2))  # 2 is gone: nothing moves
    assert state_of(log).queues == {A: {"waiting": [3], "running": [1]}}
    log.add(f"queue/{A}", QueueReleased(A, 1, "interactive", 2.0, 3.0))
    log.add(f"queue/{A}", QueueDispatched(A, 3, "interactive", 0.1, 1.1, {}))
    log.add(f"queue/{A}", QueueReleased(A, 3, "interactive", 2.0, 3.0))
    assert state_of(log).queues == {}  # an empty queue is not listed
    _enqueue(log, 1, B)
    assert state_of(log).queues == {B: {"waiting": [1], "running": []}}
    log.add("daemon/host", DaemonStarted(1.0, 1, "v", [], [], []))
    assert state_of(log).queues == {}


def test_sessions_follow_their_last_binding(log: Log) -> None:
    log.add("router/host", SessionBound(1.0, "s1", A, "first", {}))
    log.add("router/host", SessionBound(1.0, "s2", A, "balanced", {}))
    log.add("router/host", SessionBound(2.0, "s1", B, "respawned", {}))
    assert state_of(log).sessions == {"s1": B, "s2": A}


def test_rows_that_do_not_fit_are_listed_and_skipped() -> None:
    state = RuntimeState()
    rows: list[Sequence[Any]] = [
        (1, "ledger/host", 1, "ledger.released", 1, "not json"),
        (2, "ledger/host", 2, "ledger.released", 1, "[1, 2]"),
        (3, "ledger/host", 3, "ledger.released", 1, '{"key": 5}'),
        (4, "queue/x", 1, "queue.enqueued", 1, '{"engine": "x"}'),
        (5, "oops/x", 1, "engine.ready", 1, '{"to_state": "running"}'),
        (6, "engine/x", 1, "engine.ready", 1, '{"to_state": 3}'),
        (7, "other/x", 1, "plugin.thing", 1, "not json either"),
        (8, "router/host", 1, "router.bound", 1, {"session": "s", "key": A}),
    ]
    fold_rows(state, rows)
    assert state.unreadable == [1, 2, 3, 4, 5, 6]
    assert state.last_seq == 8 and state.events == 8
    assert state.sessions == {"s": A}  # a payload a driver decoded already is taken as is


def test_json_both_ways(log: Log) -> None:
    life(log)
    _enqueue(log, 4)
    log.add("lease/one", LeaseRequested("new", "waiting", 1.0, "image", "comfy"))
    log.add("router/host", SessionBound(1.0, "s1", A, "first", {}))
    state = state_of(log)
    text = json.dumps(state.to_json())
    again = RuntimeState.from_json(json.loads(text))
    assert again == state and again.to_json()["schema"] == STATE_SCHEMA
    bads: list[Any] = [
        None,
        [],
        {**state.to_json(), "schema": STATE_SCHEMA + 1},
        {**state.to_json(), "last_seq": "7"},
        {**state.to_json(), "engines": []},
        {k: v for k, v in state.to_json().items() if k != "queues"},
    ]
    for bad in bads:
        with pytest.raises(ValueError, match=r"runtime state|whole number|object of objects"):
            RuntimeState.from_json(bad)


def test_the_world_survives_its_json(log: Log) -> None:
    life(log)
    log.add("lease/one", LeaseRequested("new", "waiting", 1.0, "image", "comfy"))
    world = replay(log.store)
    again = world_from_json(json.loads(json.dumps(world_to_json(world))))
    assert again.snapshot() == world.snapshot()
    assert (again.last_seq, again.events, again.other) == (
        world.last_seq,
        world.events,
        world.other,
    )
    with pytest.raises(ValueError, match="lifecycle world"):
        world_from_json({"models": {"Nope": {}}, "last_seq": 1})


# -- snapshots -------------------------------------------------------------------------------------


def busy_log(log: Log, lives: int = 12) -> None:
    for n in range(lives):
        key = f"llamacpp:m{n % 3}:0"
        life(log, key, pid=100 + n)
        _enqueue(log, n, key)
        log.add("router/host", SessionBound(1.0, f"s{n}", key, "first", {}))
        log.add(f"engine/{key}", EngineStopRequested("running", "stopping", 4.0, "idle"))
        log.add(f"engine/{key}", EngineStopped("stopping", "stopped", 5.0, 0, None))
        log.add("ledger/host", LedgerReleased(key, 899 * MIB, "me", "released"))


def fresh(log: Log, seq: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
    world = replay(log.store, until_seq=seq)
    state = state_of(log, seq)
    return world.snapshot(), state.to_json()


def test_resuming_from_snapshots_gives_the_same_answer_at_every_seq(log: Log) -> None:
    busy_log(log)
    cache = SnapshotCache.beside(log.store)
    assert cache is not None and cache.path == log.path.with_name("events.db.snapshots")
    end = log.store.last_seq()
    assert end == 12 * 10
    first = as_of(log.store, end, cache=cache, every=10)
    assert first.resumed_from == 0 and first.saved == end // 10 and cache.count() == end // 10
    for seq in range(end + 1):
        answer = as_of(log.store, seq, cache=cache, every=10)
        assert answer.resumed_from == seq // 10 * 10
        assert answer.saved == 0
        assert (answer.world.snapshot(), answer.state.to_json()) == fresh(log, seq)
    whole = as_of(log.store, None, cache=cache, every=10)
    assert whole.world.last_seq == end and whole.resumed_from == end // 10 * 10


def test_without_a_cache_nothing_is_saved_and_the_answer_is_the_same(log: Log) -> None:
    busy_log(log, 2)
    answer = as_of(log.store, 7)
    assert answer.resumed_from == 0 and answer.saved == 0
    assert (answer.world.snapshot(), answer.state.to_json()) == fresh(log, 7)
    assert not log.path.with_name("events.db.snapshots").exists()
    with pytest.raises(ValueError, match="every 1 event"):
        as_of(log.store, 7, every=0)


def test_a_snapshot_of_another_log_is_thrown_away(tmp_path: Path) -> None:
    first = Log(tmp_path / "events.db")
    busy_log(first, 3)
    cache = SnapshotCache.beside(first.store)
    assert cache is not None
    as_of(first.store, None, cache=cache, every=5)
    assert cache.count() == 6
    first.store.close()
    # the log is replaced by another whose rows differ from seq 1 on
    for suffix in ("", "-wal", "-shm"):
        Path(f"{first.path}{suffix}").unlink(missing_ok=True)
    second = Log(first.path)
    second.add("lease/x9", LeaseRequested("new", "waiting", 1.0, "video", "x"))
    busy_log(second, 1)
    log_rows = second.store.last_seq() - 1
    cache = SnapshotCache.beside(second.store)
    assert cache is not None
    answer = as_of(second.store, None, cache=cache, every=5)
    assert answer.resumed_from == 0
    assert (answer.world.snapshot(), answer.state.to_json()) == fresh(second, None)
    assert cache.count() == (log_rows + 1) // 5
    second.store.close()


def test_a_snapshot_of_another_schema_or_damaged_is_rebuilt(log: Log) -> None:
    busy_log(log, 3)
    cache = SnapshotCache.beside(log.store)
    assert cache is not None
    as_of(log.store, None, cache=cache, every=10)
    with sqlite3.connect(cache.path) as conn:
        conn.execute("UPDATE snapshots SET schema = 999 WHERE seq = 10")
        conn.execute("UPDATE snapshots SET body = ? WHERE seq = 20", (zlib.compress(b"{}"),))
    answer = as_of(log.store, 25, cache=cache, every=10)
    # 20 was damaged (and so dropped with everything after it), 10 of another schema
    assert answer.resumed_from == 0 and answer.saved == 2
    assert (answer.world.snapshot(), answer.state.to_json()) == fresh(log, 25)
    with sqlite3.connect(cache.path) as conn:
        body = conn.execute("SELECT body FROM snapshots WHERE seq = 20").fetchone()[0]
    stored = msgspec.json.decode(zlib.decompress(body))
    assert stored["state"]["last_seq"] == 20 and stored["world"]["last_seq"] == 20


def test_a_symlinked_cache_is_never_followed(log: Log, tmp_path: Path) -> None:
    """Was: a cache linked to another log wrote its table into that log (store.foreign)."""
    busy_log(log, 2)
    victim = tmp_path / "victim.db"
    victim.write_bytes(b"not touched")
    link = log.path.with_name("events.db.snapshots")
    link.symlink_to(victim)
    cache = SnapshotCache.beside(log.store)
    assert cache is not None and not cache.usable()
    answer = as_of(log.store, None, cache=cache, every=5)
    assert answer.saved == 0 and answer.resumed_from == 0 and cache.count() == 0
    assert (answer.world.snapshot(), answer.state.to_json()) == fresh(log, None)
    assert victim.read_bytes() == b"not touched" and link.is_symlink()


def test_a_body_inflating_past_its_bounds_is_a_miss(log: Log) -> None:
    """Was: a 2 MB crafted cache took 4.3 GB of memory (a decompression bomb)."""
    busy_log(log, 3)
    cache = SnapshotCache.beside(log.store)
    assert cache is not None
    as_of(log.store, None, cache=cache, every=10)
    with sqlite3.connect(cache.path) as conn:
        body = conn.execute("SELECT body FROM snapshots WHERE seq = 20").fetchone()[0]
        sound = zlib.decompress(body)
        padded = sound[:-1] + b" " * (1000 * len(body)) + sound[-1:]  # still valid JSON
        conn.execute("UPDATE snapshots SET body = ? WHERE seq = 20", (zlib.compress(padded, 9),))
    answer = as_of(log.store, 25, cache=cache, every=10)
    assert answer.resumed_from == 10  # 20 inflated past 64 times its size: dropped
    assert (answer.world.snapshot(), answer.state.to_json()) == fresh(log, 25)


def test_a_log_differing_only_in_payloads_is_another_log(log: Log) -> None:
    """Was: a redacted import at a log's path was answered from the unredacted log's cache."""
    busy_log(log, 3)
    cache = SnapshotCache.beside(log.store)
    assert cache is not None
    as_of(log.store, None, cache=cache, every=10)
    with sqlite3.connect(log.path) as conn:
        conn.execute("DROP TRIGGER IF EXISTS events_no_update")
        conn.execute(
            "UPDATE events SET payload = json_set(payload, '$.key', 'other') WHERE seq = 20"
        )
    answer = as_of(log.store, 25, cache=cache, every=10)
    assert answer.resumed_from == 10


def test_an_unwritable_cache_is_only_a_miss(log: Log, tmp_path: Path) -> None:
    busy_log(log, 2)
    blocked = SnapshotCache(tmp_path / "no-such-dir" / "x.snapshots")
    answer = as_of(log.store, None, cache=blocked, every=5)
    assert answer.saved == 0 and blocked.count() == 0
    assert (answer.world.snapshot(), answer.state.to_json()) == fresh(log, None)


def test_seq_at_a_time(log: Log) -> None:
    busy_log(log, 1)  # one row a second from T0 + 1 s
    assert seq_at(log.store, T0) == 0
    assert seq_at(log.store, T0 + timedelta(seconds=1)) == 1
    assert seq_at(log.store, T0 + timedelta(seconds=4.5)) == 4
    assert seq_at(log.store, T0 + timedelta(days=1)) == 10


# -- the CLI ---------------------------------------------------------------------------------------


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        status = main(list(argv))
    except SystemExit as exc:
        status = int(exc.code or 0)
    out, err = capsys.readouterr()
    return status, out, err


def test_state_at_a_seq_or_a_time_and_the_old_spellings_agree(
    log: Log, capsys: pytest.CaptureFixture[str]
) -> None:
    busy_log(log, 2)
    log.add("lease/one", LeaseRequested("new", "waiting", 1.0, "image", "comfy"))
    log.store.close()
    db = ("--db", str(log.path))
    moment = (T0 + timedelta(seconds=4.5)).isoformat()
    answers = [
        json.loads(cli(capsys, "state", *db, "--json", *how)[1])
        for how in (
            ("--at", "4"),
            ("--until-seq", "4"),
            ("--at", moment),
            ("--until", moment),
            ("--at", "4", "--no-snapshots"),
        )
    ]
    assert all(a == answers[0] for a in answers)
    first = answers[0]
    assert first["as_of"] == {
        "seq": 4,
        "recorded_at": (T0 + timedelta(seconds=4)).isoformat(),
        "events": 4,
    }
    assert first["runtime"]["engines"]["llamacpp:m0:0"]["state"] == "running"
    assert first["Engine"]["llamacpp:m0:0"]["state"] == "running"
    status, out, _ = cli(capsys, "state", *db)
    assert status == 0
    assert out.splitlines()[0].startswith("as of seq 21 (21 events replayed), recorded ")
    assert "GPU LEASES (1)" in out and "RESIDENT ENGINES (0)" in out
    assert "  one                  waiting  slot=image holder=comfy expires_at=None" in out
    status, out, _ = cli(capsys, "state", *db, "--at", "3")
    assert "RESIDENT ENGINES (1)" in out
    assert "pid=100 port=4000 reserved=900.0 MiB measured=-" in out


def test_state_refuses_two_moments_and_bad_ones(
    log: Log, capsys: pytest.CaptureFixture[str]
) -> None:
    busy_log(log, 1)
    log.store.close()
    db = ("--db", str(log.path))
    status, _, err = cli(capsys, "state", *db, "--at", "3", "--until-seq", "3")
    assert status == 2 and "give one of --at, --until-seq and --until" in err
    status, _, err = cli(capsys, "state", *db, "--at", "99999999999999999999")
    assert status == 2 and "a seq is at most 9223372036854775807" in err
    status, _, err = cli(capsys, "state", *db, "--at", "soon")
    assert status == 2 and "time 'soon': use ISO-8601" in err
    status, out, _ = cli(capsys, "state", *db, "--at", "0", "--json")
    assert status == 0 and json.loads(out)["as_of"]["seq"] == 0
    status, out, _ = cli(capsys, "state", *db, "--at", "2000-01-01")
    assert status == 0 and out.startswith("as of seq 0 (0 events replayed)\n")
