"""Bad command-line input: one line, the usage exit status, and nothing written.

Each case was a traceback on main (issue "Bad input and broken storage").
"""

from __future__ import annotations

import json
import sqlite3
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from hostler import Engine, EventStore, commit, replay
from hostler.cli import main
from hostler.testing.tiny_gguf import write_tiny_llama

from _support import DEEP, Note, run_cli
from _support import notes_log as _log

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


# -- a database that is neither empty nor hostler's log: refused before anything is written --

ALEMBIC = "CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)"


def _sqlite(*statements: str) -> Callable[[Path], None]:
    """Make a database file with ``statements`` (rollback journal: no WAL files left)."""

    def make(path: Path) -> None:
        conn = sqlite3.connect(path)
        try:
            for statement in statements:
                conn.execute(statement)
            conn.commit()
        finally:
            conn.close()

    return make


def _hostler_log_with(*statements: str) -> Callable[[Path], None]:
    """A real hostler log that someone then added to (and set back to a rollback journal)."""

    def make(path: Path) -> None:
        with EventStore.open(path) as store:
            store.append("test/a", [Note("one")], expected_version=0)
        _sqlite("PRAGMA journal_mode=DELETE", *statements)(path)

    return make


#: (how the file is made, what the refusal names). Each of these was written into before: its
#: journal switched to WAL and its mode to 0600, or hostler's tables created beside its own.
FOREIGN = [
    pytest.param(
        _sqlite(
            ALEMBIC,
            "INSERT INTO alembic_version VALUES ('0001')",
            "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)",
        ),
        "tables: users",
        id="another-alembic-app-at-0001",
    ),
    pytest.param(
        _sqlite("CREATE VIEW important AS SELECT 42"), "views: important", id="only-a-view"
    ),
    pytest.param(
        _sqlite(ALEMBIC, "INSERT INTO alembic_version VALUES ('ae1027a6acf')"),
        "schema revision 'ae1027a6acf', not one of hostler's",
        id="another-alembic-revision",
    ),
    pytest.param(
        _sqlite(
            ALEMBIC,
            "INSERT INTO alembic_version VALUES ('0001')",
            "CREATE TABLE events (id INTEGER PRIMARY KEY, title TEXT, starts_at TEXT)",
        ),
        "a table events that is not hostler's",
        id="another-apps-events-table",
    ),
    pytest.param(
        _sqlite("CREATE TABLE a (x)", "CREATE TABLE b (x)", "CREATE VIEW c AS SELECT 1"),
        "tables: a, b; views: c",
        id="tables-and-a-view",
    ),
    pytest.param(
        _sqlite(*(f"CREATE TABLE t{n} (x)" for n in range(7))),
        "tables: t0, t1, t2, t3, t4, ...",
        id="many-tables",
    ),
    pytest.param(
        _hostler_log_with("CREATE INDEX mine ON events (stream_id)"),
        "indexes: mine",
        id="hostler-log-plus-an-index",
    ),
    pytest.param(
        _hostler_log_with(
            "CREATE TABLE audit (seq)",
            "CREATE TRIGGER copy AFTER INSERT ON events BEGIN INSERT INTO audit VALUES (1); END",
        ),
        "tables: audit; triggers: copy",
        id="hostler-log-plus-a-table-and-trigger",
    ),
    pytest.param(
        _sqlite("CREATE TABLE sqliteXfoo (x)"), "tables: sqliteXfoo", id="not-an-sqlite-internal"
    ),
]


@pytest.mark.parametrize(("make", "named"), FOREIGN)
def test_a_database_not_hostlers_is_refused_with_its_bytes_and_mode_unchanged(
    tmp_path: Path, make: Callable[[Path], None], named: str
) -> None:
    other = tmp_path / "other.db"
    make(other)
    other.chmod(0o644)
    before = (other.read_bytes(), stat.S_IMODE(other.stat().st_mode))
    result = run_cli("events", "--db", str(other), cwd=tmp_path)
    assert result.stderr == (
        f"hostler: error [store.foreign]: {other}: another application's database ({named}); "
        "hostler writes only into an empty database or its own log: choose another file\n"
    )
    assert result.returncode == 1
    assert (other.read_bytes(), stat.S_IMODE(other.stat().st_mode)) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]  # no -wal, no -shm


@pytest.mark.parametrize(("make", "named"), FOREIGN[:2])
def test_hostler_ledger_naming_a_foreign_database_is_refused_untouched(
    tmp_path: Path, make: Callable[[Path], None], named: str
) -> None:
    """``HOSTLER_LEDGER=view.db hostler budget`` created hostler's schema inside it."""
    other = tmp_path / "other.db"
    make(other)
    other.chmod(0o644)
    before = (other.read_bytes(), stat.S_IMODE(other.stat().st_mode))
    result = run_cli("budget", env={"HOSTLER_LEDGER": str(other)}, cwd=tmp_path)
    assert result.stderr == (
        f"hostler: error [store.foreign]: {other}: another application's database ({named}); "
        "hostler writes only into an empty database or its own log: choose another file\n"
    )
    assert result.returncode == 1
    assert (other.read_bytes(), stat.S_IMODE(other.stat().st_mode)) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]


# -- the same shape for the environment, database URLs and paths (exit 1 unless a usage error) --

#: (argv, extra environment, code, exit status, the exact line after "hostler: error [CODE]: ").
EDGE = [
    (
        ["budget"],
        {"HOSTLER_CAPACITY_BUDGET_GB": "twelve"},
        "usage.setting",
        2,
        "HOSTLER_CAPACITY_BUDGET_GB='twelve': expected a number of GiB from 0.001 to 1048576 "
        "(e.g. 24 or 12.5); unset it for the automatic budget",
    ),
    (
        ["budget"],
        {"HOSTLER_CAPACITY_BUDGET_GB": "-5"},
        "usage.setting",
        2,
        "HOSTLER_CAPACITY_BUDGET_GB='-5': expected a number of GiB from 0.001 to 1048576 "
        "(e.g. 24 or 12.5); unset it for the automatic budget",
    ),
    (
        ["budget"],
        {"HOSTLER_CAPACITY_BUDGET_GB": "1e-300"},  # was a budget of 0 bytes
        "usage.setting",
        2,
        "HOSTLER_CAPACITY_BUDGET_GB='1e-300': expected a number of GiB from 0.001 to 1048576 "
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
        ["events", "--db", "postgresql://alice:s3cret@127.0.0.1:1/hostler"],
        {},
        "store.unavailable",
        1,
        "postgresql://alice:***@127.0.0.1:1/hostler: the database server cannot be reached "
        '(connection failed: connection to server at "127.0.0.1", port 1 failed: Connection '
        "refused Is the server running on that host and accepting TCP/IP connections?)",
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
    (  # the daemon and every reading command read HOSTLER_DB the same way
        ["events"],
        {"HOSTLER_DB": "foo://u:SECRET@bar/x"},
        "usage.setting",
        2,
        "HOSTLER_DB: foo://u:***@bar/x: SQLAlchemy knows no database kind 'foo'; use a file "
        "path, sqlite:///PATH or a server URL such as postgresql://USER@HOST/DB",
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


# -- paths: a user nobody knows, a symbolic link loop, a directory that cannot be made --------

NOBODY = "~hostler-no-such-user"
HOMELESS = f"no home directory known for {NOBODY!r}"
LOOP = "cannot be resolved (Too many levels of symbolic links)"

#: (argv, extra environment, code, exit status, the line after "hostler: error [CODE]: ",
#: where {tmp} is the working directory). Each was a RuntimeError or OSError traceback.
PATHS = [
    (
        ["events", "--db", f"{NOBODY}/x.db"],
        {},
        "usage.invalid",
        2,
        f"hostler events: argument --db: '{NOBODY}/x.db': {HOMELESS}",
    ),
    (
        ["events", "--db", "loop/x.db"],
        {},
        "usage.invalid",
        2,
        f"hostler events: argument --db: 'loop/x.db': {LOOP}",
    ),
    (
        ["events", "--data-dir", f"{NOBODY}/d"],
        {},
        "usage.invalid",
        2,
        f"hostler events: argument --data-dir: '{NOBODY}/d': {HOMELESS}",
    ),
    (
        ["state", "--data-dir", "loop/d"],
        {},
        "usage.invalid",
        2,
        f"hostler state: argument --data-dir: 'loop/d': {LOOP}",
    ),
    (
        ["budget", "--ledger", f"{NOBODY}/l.db"],
        {},
        "usage.invalid",
        2,
        f"hostler budget: argument --ledger: '{NOBODY}/l.db': {HOMELESS}",
    ),
    (
        ["preview", f"{NOBODY}/m.gguf"],
        {},
        "usage.invalid",
        2,
        f"hostler preview: argument model: '{NOBODY}/m.gguf': {HOMELESS}",
    ),
    (
        ["preview", "m.gguf", "--mmproj", f"{NOBODY}/p.gguf"],
        {},
        "usage.invalid",
        2,
        f"hostler preview: argument --mmproj: '{NOBODY}/p.gguf': {HOMELESS}",
    ),
    (
        ["preview", "m.gguf", "--ledger", f"{NOBODY}/l.db"],
        {},
        "usage.invalid",
        2,
        f"hostler preview: argument --ledger: '{NOBODY}/l.db': {HOMELESS}",
    ),
    (
        ["daemon", "--config", f"{NOBODY}/c.toml"],
        {},
        "usage.invalid",
        2,
        f"hostler daemon: argument --config: '{NOBODY}/c.toml': {HOMELESS}",
    ),
    (
        ["demo", "--scripted", "--model", f"{NOBODY}/m.gguf"],
        {},
        "usage.invalid",
        2,
        f"hostler demo: argument --model: '{NOBODY}/m.gguf': {HOMELESS}",
    ),
    (
        ["events"],
        {"HOSTLER_HOME": f"{NOBODY}/h"},
        "usage.setting",
        2,
        f"HOSTLER_HOME='{NOBODY}/h': {HOMELESS}; fix the path or unset the variable",
    ),
    (
        ["state"],
        {"HOSTLER_HOME": "loop/h"},
        "usage.setting",
        2,
        f"HOSTLER_HOME='loop/h': {LOOP}; fix the path or unset the variable",
    ),
    (
        ["events"],
        {"XDG_DATA_HOME": NOBODY},
        "usage.setting",
        2,
        f"XDG_DATA_HOME='{NOBODY}': {HOMELESS}; fix the path or unset the variable",
    ),
    (
        ["budget"],
        {"HOSTLER_LEDGER": f"{NOBODY}/l.db"},
        "usage.setting",
        2,
        f"HOSTLER_LEDGER='{NOBODY}/l.db': {HOMELESS}; fix the path or unset the variable",
    ),
    (
        ["budget"],
        {"XDG_STATE_HOME": NOBODY},
        "usage.setting",
        2,
        f"XDG_STATE_HOME='{NOBODY}': {HOMELESS}; fix the path or unset the variable",
    ),
    (
        ["daemon", "--config", "empty.toml"],
        {"HOSTLER_LEDGER": "loop/l.db"},
        "usage.setting",
        2,
        f"HOSTLER_LEDGER='loop/l.db': {LOOP}; fix the path or unset the variable",
    ),
    (
        ["daemon", "--config", "empty.toml", "--data-dir", "afile/sub"],
        {},
        "store.path",
        1,
        "{tmp}/afile/sub: cannot create directory (Not a directory)",
    ),
    (
        ["daemon", "--config", "empty.toml", "--data-dir", "loop/d"],
        {},
        "usage.invalid",
        2,
        f"hostler daemon: argument --data-dir: 'loop/d': {LOOP}",
    ),
]


def _path_playground(tmp_path: Path) -> dict[str, str]:
    """A working directory with a symbolic link loop, a file and an empty config in it."""
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "afile").write_text("x")
    (tmp_path / "empty.toml").write_text("")
    return {
        "HOME": str(tmp_path / "home"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "HOSTLER_HOME": "",
        "HOSTLER_LEDGER": "",
        "HOSTLER_LEDGER_SHARED": "",
    }


@pytest.mark.parametrize("case", PATHS, ids=lambda case: " ".join(case[0]) + str(case[1]))
def test_a_path_that_cannot_be_expanded_resolved_or_created_is_one_line(
    tmp_path: Path, case: tuple[list[str], dict[str, str], str, int, str]
) -> None:
    argv, env, code, status, line = case
    home = _path_playground(tmp_path)
    result = run_cli(*argv, env={**home, **env}, cwd=tmp_path)
    assert result.stderr == f"hostler: error [{code}]: {line.format(tmp=tmp_path)}\n"
    assert result.returncode == status
    assert result.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "empty.toml", "loop"]


@pytest.mark.parametrize("where", ["/proc/1/hostler", "/sys/hostler"])
def test_a_data_dir_the_system_will_not_let_us_create_is_one_line(
    tmp_path: Path, where: str
) -> None:
    """``hostler daemon --data-dir /proc/1/d`` was a FileNotFoundError traceback."""
    home = _path_playground(tmp_path)
    result = run_cli(
        "daemon", "--config", "empty.toml", "--data-dir", where, env=home, cwd=tmp_path
    )
    assert result.stderr.startswith(
        f"hostler: error [store.path]: {where}: cannot create directory ("
    ), result.stderr
    assert result.stderr.endswith(")\n")
    assert len(result.stderr.splitlines()) == 1
    assert result.returncode == 1
    assert not Path(where).exists()


def test_a_path_name_too_long_for_the_kernel_is_one_line(tmp_path: Path) -> None:
    """A 300-character folder name was an ENAMETOOLONG traceback."""
    long = "a" * 300
    for argv, env in (
        (["events", "--db", f"{long}/x.db"], {}),
        (["events", "--data-dir", long], {}),
        (["budget"], {"HOSTLER_LEDGER": f"{tmp_path}/{long}/l.db"}),
        (["events"], {"HOSTLER_HOME": f"{tmp_path}/{long}"}),
    ):
        result = run_cli(*argv, env=env, cwd=tmp_path)
        assert result.returncode in (1, 2), result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert "too long for a path (at most 255 characters a name, 4096 in all)" in lines[0]


def test_a_malformed_device_safety_setting_stops_the_daemon_before_anything(
    tmp_path: Path,
) -> None:
    config = tmp_path / "hostler.toml"
    config.write_text("[daemon]\nidle_timeout = 0\n")
    data = tmp_path / "data"
    home = {"HOME": str(tmp_path / "home"), "XDG_STATE_HOME": str(tmp_path / "state")}
    for name, value, expected in (
        ("HOSTLER_DEVICE_SAFETY_MODE", "loud", "use one of off, observe, guard"),
        ("HOSTLER_DEVICE_SAFETY_MAX_WAIT_MS", "soon", None),
    ):
        result = run_cli(
            "daemon",
            "--config",
            str(config),
            "--data-dir",
            str(data),
            env={**home, name: value},
            cwd=tmp_path,
        )
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith(f"hostler: error [usage.setting]: {name}='{value}': ")
        assert result.stderr.count("\n") == 1
        if expected:
            assert result.stderr.endswith(f"{expected}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hostler.toml"]  # nothing made


def _tamper(path: Path, sql: str, *args: object) -> None:
    with sqlite3.connect(path) as db:
        db.execute("DROP TRIGGER IF EXISTS events_no_update")
        db.execute(sql, args)


def test_a_row_nested_past_the_decoders_depth_is_a_damaged_row_not_a_traceback(
    tmp_path: Path,
) -> None:
    """Was: RecursionError tracebacks in events, explain, replay, whatif, timeline, export."""
    path = _log(tmp_path / "events.db")
    _tamper(path, "UPDATE events SET payload = ? WHERE seq = 3", DEEP)
    with EventStore.open(path) as store:
        rows = list(store.read_all())
    assert [r.damage for r in rows] == ["", "", "payload nests too deep to read", "", "", ""]
    for argv in (
        ["events", "--db", str(path)],
        ["state", "--db", str(path)],
        ["replay", "--verify", str(path)],
        ["whatif", str(path)],
        ["timeline", str(path), "-o", str(tmp_path / "t.svg")],
        ["export", str(path), "-o", str(tmp_path / "e.jsonl")],
    ):
        done = run_cli(*argv)
        assert "Traceback" not in done.stderr, argv
        assert f"{path}: seq 3: payload nests too deep to read" in done.stderr, argv


def test_numbers_in_other_scripts_digits_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: `--slots ٣` (Arabic-Indic three) and `KEY#٣` were read as 3."""
    path = _log(tmp_path / "events.db")
    with pytest.raises(SystemExit) as exited:
        main(["whatif", str(path), "--slots", "٣"])
    assert exited.value.code == 2
    assert "'٣' is not a whole number" in capsys.readouterr().err
    assert main(["explain", "llamacpp:m:0#٣", "--db", str(path)]) == 2
    assert "nothing in this log matches 'llamacpp:m:0#٣'" in capsys.readouterr().err
