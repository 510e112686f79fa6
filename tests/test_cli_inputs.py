"""Bad command-line input: one line, the usage exit status, and nothing written.

Each case was a traceback on main (issue "Bad input and broken storage").
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from hostler import Engine, EventStore, commit, replay
from hostler.testing.tiny_gguf import write_tiny_llama

from _support import Note, run_cli

BAD = [
    (["events", "--since", "1000000000d"], "out of range"),
    (["events", "--until", "9999-12-31T23:59:59-05:00"], "out of range"),
    (["events", "--since", "0001-01-01T00:00:00+05:00"], "out of range"),
    (["state", "--until", "99999999999999999999d"], "out of range"),
    (["events", "--after-seq", str(2**70)], "--after-seq: 1180591620717411303424 is out of range"),
    (["events", "--tail", str(2**70)], "--tail: 1180591620717411303424 is out of range"),
    (["events", "--tail", "0"], "--tail: 0 is out of range: use a whole number from 1"),
    (["events", "--limit", "-3"], "--limit: -3 is out of range"),
    (["events", "--limit", "ten"], "--limit: 'ten' is not a whole number"),
    (["state", "--until-seq", str(2**70)], "--until-seq: 1180591620717411303424 is out of range"),
    (["events", "-f", "--interval", "-1"], "--interval: -1 is out of range"),
    (["events", "-f", "--interval", "nan"], "--interval: nan is out of range"),
    (["events", "--bogus"], "unrecognized arguments: --bogus"),
]


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "events.db"
    with EventStore.open(path) as store:
        store.append("test/a", [Note("one")], expected_version=0)
    return path


@pytest.mark.parametrize(("argv", "words"), BAD)
def test_bad_arguments_are_one_line_with_exit_2(log: Path, argv: list[str], words: str) -> None:
    result = run_cli(*argv, "--db", str(log))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("hostler: error [usage.invalid]: "), lines[0]
    assert words in lines[0], lines[0]
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_a_preview_window_or_slot_count_past_any_model_is_refused_at_once(tmp_path: Path) -> None:
    """``preview --slots 10000000`` ran for a minute; a window past 2^24 is a typo."""
    for option, value in (("--slots", "10000000"), ("--ctx", "99999999999"), ("--ctx", "0")):
        result = run_cli("preview", str(tmp_path / "m.gguf"), option, value)
        assert result.returncode == 2
        assert f"argument {option}: {value} is out of range" in result.stderr


def test_preview_takes_1024_slots_and_refuses_1025(tmp_path: Path) -> None:
    """The edge of the slot limit (MAX_SLOTS), through the real command."""
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    ledger = tmp_path / "ledger.db"
    at = run_cli("preview", str(model), "--slots", "1024", "--ctx", "256", "--ledger", str(ledger))
    assert at.returncode in {0, 3}, at.stderr  # fits or not on this host: planned, quickly
    assert "  - slots: 1024 (configured)" in at.stdout
    over = run_cli("preview", str(model), "--slots", "1025", "--ledger", str(ledger))
    assert over.returncode == 2
    assert over.stderr == (
        "hostler: error [usage.invalid]: hostler preview: argument --slots: 1025 is out of "
        "range: use a whole number from 1 to 1024\n"
    )


def test_another_applications_database_is_never_written(tmp_path: Path) -> None:
    """``hostler events --db other-app.db`` added hostler's tables to it and exited 0."""
    other = tmp_path / "other-app.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
        conn.execute("INSERT INTO invoices VALUES (1, 9.5)")
    before = other.read_bytes()
    result = run_cli("events", "--db", str(other))
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"hostler: error [store.foreign]: {other}: another application's database (tables: "
        "invoices); hostler writes only into an empty database or its own log: choose another file"
    )
    assert other.read_bytes() == before
    with sqlite3.connect(other) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert tables == {"invoices"}


# -- the same shape for the environment, database URLs and paths (exit 1 unless a usage error) --

#: (argv, extra environment, code, exit status, the exact line after "hostler: error [CODE]: ").
EDGE = [
    (
        ["budget"],
        {"HOSTLER_CAPACITY_BUDGET_GB": "twelve"},
        "usage.setting",
        2,
        "HOSTLER_CAPACITY_BUDGET_GB='twelve': expected a positive number of GiB up to 1048576 "
        "(e.g. 24 or 12.5); unset it for the automatic budget",
    ),
    (
        ["budget"],
        {"HOSTLER_CAPACITY_BUDGET_GB": "-5"},
        "usage.setting",
        2,
        "HOSTLER_CAPACITY_BUDGET_GB='-5': expected a positive number of GiB up to 1048576 "
        "(e.g. 24 or 12.5); unset it for the automatic budget",
    ),
    (
        ["budget"],
        {"HOSTLER_LEDGER_SHARED": "maybe"},
        "usage.setting",
        2,
        "HOSTLER_LEDGER_SHARED='maybe': use 1 or 0 (yes/no, true/false)",
    ),
    (
        ["preview", "m.gguf", "--kv", "bogus"],
        {},
        "usage.invalid",
        2,
        "hostler preview: argument --kv: invalid choice: 'bogus' (choose from 'f32', 'f16', "
        "'bf16', 'q8_0', 'q5_1', 'q5_0', 'q4_1', 'q4_0', 'iq4_nl')",
    ),
    (
        ["events", "--db", "postgresql://alice:s3cret@db.example/hostler"],
        {},
        "store.driver-missing",
        1,
        "postgresql://alice:***@db.example/hostler: the database driver 'psycopg' is not "
        "installed; install it next to hostler (pip install 'psycopg[binary]') or name another "
        "driver in the URL",
    ),
    (
        ["events", "--db", "postgresql+asyncpg://db.example/hostler"],
        {},
        "store.driver-missing",
        1,
        "postgresql+asyncpg://db.example/hostler: the database driver 'asyncpg' is not "
        "installed; install it next to hostler (pip install 'asyncpg') or name another driver "
        "in the URL",
    ),
    (
        ["state", "--db", "foo://bar"],
        {},
        "store.url",
        1,
        "foo://bar: SQLAlchemy knows no database kind 'foo'; use a file path, sqlite:///PATH or "
        "a server URL such as postgresql://USER@HOST/DB",
    ),
    (
        ["events", "--db", "postgresql://h:port/d"],
        {},
        "store.url",
        1,
        "postgresql://h:port/d: not a database URL (invalid literal for int() with base 10: "
        "'port'); give a file path or sqlite:///PATH, postgresql://USER@HOST/DB ...",
    ),
    (
        ["events", "--db", "sqlite://"],
        {},
        "store.path",
        1,
        "sqlite://: hostler needs a file for its event log, not memory",
    ),
]


@pytest.mark.parametrize("case", EDGE)
def test_environment_urls_and_choices_are_one_line(
    tmp_path: Path, case: tuple[list[str], dict[str, str], str, int, str]
) -> None:
    argv, env, code, status, line = case
    home = {"HOME": str(tmp_path / "home"), "XDG_STATE_HOME": str(tmp_path / "state")}
    result = run_cli(*argv, env={**home, **env}, cwd=tmp_path)
    assert result.stderr == f"hostler: error [{code}]: {line}\n"
    assert result.returncode == status
    assert result.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, home included


def test_a_data_dir_that_is_a_file_is_a_usage_error(tmp_path: Path) -> None:
    """``--data-dir FILE`` was a FileExistsError."""
    (tmp_path / "afile").write_text("x")
    for command in (["events"], ["state"], ["daemon", "--config", "x.toml"], ["demo"]):
        result = run_cli(*command, "--data-dir", "afile", cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert result.stderr == (
            f"hostler: error [usage.invalid]: hostler {command[0]}: argument --data-dir: "
            f"{tmp_path / 'afile'}: exists and is not a directory\n"
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def _damage(path: Path, *updates: str) -> None:
    """Damage rows the way a disk or a hand edit could (the append-only triggers dropped)."""
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TRIGGER events_no_update")
        for sql in updates:
            conn.execute(sql)


def test_damaged_rows_are_named_by_seq_and_the_rest_still_listed(tmp_path: Path) -> None:
    """A payload that is not JSON or a time that is not a time was a traceback in both."""
    path = tmp_path / "events.db"
    with EventStore.open(path) as store:
        for n in range(6):
            store.append(f"test/{n}", [Note(f"n{n}")], expected_version=0)
    _damage(
        path,
        "UPDATE events SET payload = '{not json' WHERE seq = 2",
        "UPDATE events SET recorded_at = 'yesterday' WHERE seq = 3",
        "UPDATE events SET payload = '[1, 2]' WHERE seq = 4",
        "UPDATE events SET version = 'x' WHERE seq = 5",
    )
    listed = run_cli("events", "--db", str(path), "--json")
    assert listed.returncode == 1
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [r["seq"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r.get("damaged") for r in rows] == [
        None,
        "payload is not JSON",
        "recorded_at 'yesterday' is not a time",
        "payload is not a JSON object",
        "version or schema version is not a whole number",
        None,
    ]
    assert rows[5]["payload"] == {"text": "n5", "n": 0}
    warned = listed.stderr.splitlines()
    assert warned[0] == (
        f"hostler: warning [store.damaged-row]: {path}: seq 2: payload is not JSON "
        "(listed, not folded)"
    )
    assert len(warned) == 4
    assert "Traceback" not in listed.stderr
    table = run_cli("events", "--db", str(path))
    assert table.returncode == 1
    assert "[DAMAGED ROW: payload is not JSON]" in table.stdout
    assert "n5" in table.stdout


def test_replay_skips_damaged_rows_by_seq_and_folds_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    with EventStore.open(path) as store:
        engine = Engine("llamacpp:m:0")
        engine.fire("start", at=1.0, cause="request")
        commit(store, engine)
        engine.fire(
            "spawned",
            at=1.1,
            pid=7,
            create_time=1.0,
            boot_id="b",
            launch_token="t",
            argv_fingerprint="f",
            port=1,
        )
        commit(store, engine)
        engine.fire("ready", at=2.0)
        commit(store, engine)
    _damage(path, "UPDATE events SET payload = 'garbage' WHERE seq = 3")
    with EventStore.open(path) as store:
        world = replay(store)
    assert world.damaged == [(3, "payload is not JSON")]
    assert world.engines["llamacpp:m:0"].state == "starting"
    # not folded, but it holds its place in the stream: the next append expects version 4
    # (a stale version here made the daemon's next write a bogus "another writer" conflict)
    assert world.engines["llamacpp:m:0"].version == 3
    assert world.events == 3
    result = run_cli("state", "--db", str(path))
    assert result.returncode == 1
    assert result.stderr == (
        f"hostler: warning [store.damaged-row]: {path}: seq 3: payload is not JSON "
        "(listed, not folded)\n"
    )
    assert "llamacpp:m:0" in result.stdout
