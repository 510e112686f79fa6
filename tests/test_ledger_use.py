"""Which ledger a log's daemon used (``daemon.started`` v2) and which of its rows are the log's."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hostler import EventStore
from hostler.events.daemon import DaemonStarted
from hostler.postmortem.ledger_use import LedgerUse, own_rows, recorded_ledger


@dataclass(frozen=True)
class _Row:
    type: str
    payload: dict[str, Any]
    at: float
    seq: int = 0
    stream_id: str = "s"
    damage: str = ""

    @property
    def recorded_at(self) -> datetime:
        return datetime.fromtimestamp(self.at, UTC)


def _started(at: float, ledger: str | None, owner: str | None) -> _Row:
    return _Row("daemon.started", {"ledger": ledger, "ledger_owner": owner}, at)


def test_the_last_daemons_ledger_is_the_one_read_with_every_owner_it_had_there() -> None:
    rows = [
        _started(100.0, "/l/a.db", "daemon:1"),
        _started(200.0, "/l/b.db", "daemon:2"),
        _started(300.0, "/l/b.db", "daemon:3"),
    ]
    assert recorded_ledger(rows) == LedgerUse(
        Path("/l/b.db"), frozenset({"daemon:2", "daemon:3"}), 200.0
    )


def test_a_log_whose_daemons_named_no_ledger_has_none() -> None:
    assert recorded_ledger([_started(1.0, None, None), _Row("engine.ready", {}, 2.0)]) is None
    assert recorded_ledger([]) is None
    damaged = _Row("daemon.started", {"ledger": "/l/a.db", "ledger_owner": "o"}, 1.0, damage="x")
    assert recorded_ledger([damaged]) is None


def test_own_rows_keep_the_owners_rows_and_host_wide_changes_since_the_first_start() -> None:
    use = LedgerUse(Path("/l/b.db"), frozenset({"daemon:2"}), 200.0)
    mine = _Row("ledger.reserved", {"owner": "daemon:2"}, 150.0)
    theirs = _Row("ledger.reserved", {"owner": "daemon:9"}, 250.0)
    budget_before = _Row("ledger.budget_set", {}, 199.999)
    budget_at = _Row("ledger.budget_set", {}, 200.0)
    spill_after = _Row("ledger.spillover_set", {}, 201.0)
    broken = _Row("ledger.reserved", {}, 10.0, damage="payload is not JSON")
    rows = [mine, theirs, budget_before, budget_at, spill_after, broken]
    assert list(own_rows(use, rows)) == [mine, budget_at, spill_after, broken]


def test_a_v1_daemon_started_is_upcast_to_name_no_ledger(tmp_path: Path) -> None:
    log = tmp_path / "events.db"
    EventStore.open(log).close()
    v1 = {"at": 1.0, "pid": 7, "version": "0.1", "adopted": [], "lost": [], "reaped": []}
    raw = sqlite3.connect(log)
    raw.execute(
        "INSERT INTO events (stream_id, version, type, schema_version, payload, metadata,"
        " recorded_at) VALUES ('daemon/host', 1, 'daemon.started', 1, ?, '{}',"
        " '2026-01-01T00:00:00.000000Z')",
        (json.dumps(v1),),
    )
    raw.commit()
    raw.close()
    with EventStore.open(log) as store:
        (record,) = store.read_stream("daemon/host")
    assert record.schema_version == 1
    assert isinstance(record.event, DaemonStarted)
    assert (record.event.ledger, record.event.ledger_owner) == (None, None)
    assert record.event.pid == 7
