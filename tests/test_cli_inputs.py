"""Bad command-line input: one line, the usage exit status, and nothing written.

Each case was a traceback on main (issue "Bad input and broken storage").
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from hostler import EventStore
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
