"""The daemon survives its storage (SF1–SF4), with real files, a real engine and real signals.

Each case broke on main (issue "Bad input and broken storage"): a log locked by another writer
while an engine crashed killed the daemon and lost the crash; a locked ledger dropped the
release; SIGTERM under a held lock took 23 s; a full disk killed the daemon, and a shutdown on
a full disk left the engine running; a corrupt log left the engines unsupervised in silence.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from hostler import EventStore
from hostler.drivers.host_ledger import catch_up
from hostler.engines.reconcile import DAEMON_STREAM
from hostler.testing.tiny_gguf import TinyModel, write_tiny_llama

from _daemons import alive, count, engines, events, kill_leftovers, start_daemon, wait_for
from _support import run_cli

KEYS = ("llamacpp:alpha:0", "llamacpp:beta:0")


def _config(tmp_path: Path, keys: tuple[str, ...] = KEYS) -> Path:
    models = tmp_path / "models"
    models.mkdir(exist_ok=True)
    for n, key in enumerate(keys):
        write_tiny_llama(models / f"{key.split(':')[1]}.gguf", TinyModel(seed=n + 1))
    config = tmp_path / "hostler.toml"
    config.write_text(
        '[daemon]\nidle_timeout = 0\nledger = "ledger.db"\n'
        + "".join(
            f'\n[[engines]]\nkey = "{key}"\nmodel = "models/{key.split(":")[1]}.gguf"\nctx = 512\n'
            for key in keys
        )
    )
    return config


@pytest.fixture
def data(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "data"
    yield path
    kill_leftovers(path)


@contextmanager
def write_lock(path: Path) -> Iterator[None]:
    """Another process holds the database's write lock (BEGIN IMMEDIATE) until the block ends."""
    code = (
        "import sqlite3, sys\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)\n"
        "c.execute('BEGIN IMMEDIATE')\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n"
        "c.execute('ROLLBACK')\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        yield
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(10)
        if holder.stdout is not None:
            holder.stdout.close()


def _kill_engine(data: Path, key: str) -> int:
    pid = engines(data)[key][1]
    assert pid is not None and alive(pid)
    os.killpg(pid, signal.SIGKILL)
    return pid


def _ledger_events(tmp_path: Path) -> list[tuple[str, dict]]:  # type: ignore[type-arg]
    with EventStore.open(tmp_path / "ledger.db") as store:
        return [(r.type, r.payload) for r in store.read_all()]


def _stop(daemon: subprocess.Popen[bytes], timeout: float = 30) -> float:
    started = time.monotonic()
    daemon.send_signal(signal.SIGTERM)
    daemon.wait(timeout)
    return time.monotonic() - started


def test_a_crash_while_another_writer_holds_the_log_is_kept_and_written_late(
    tmp_path: Path, data: Path
) -> None:
    config = _config(tmp_path)
    daemon = start_daemon(config, data, tmp_path / "daemon.log")
    try:
        wait_for(lambda: all(count(data, k, "engine.ready") == 1 for k in KEYS))
        with write_lock(data / "events.db"):
            dead = _kill_engine(data, KEYS[0])
            time.sleep(3)
            assert daemon.poll() is None, "the daemon survives a log it cannot write"
            assert count(data, KEYS[0], "engine.crashed") == 0  # not yet: the lock is held
        wait_for(lambda: count(data, KEYS[0], "engine.crashed") == 1, timeout=15)
        wait_for(
            lambda: any(t == "daemon.log_recovered" for _, t, _ in events(data, DAEMON_STREAM)),
            timeout=15,
        )
        recovered = [p for _, t, p in events(data, DAEMON_STREAM) if t == "daemon.log_recovered"]
        assert recovered[0]["code"] == "store.busy"
        assert recovered[0]["until"] - recovered[0]["since"] >= 2
        assert recovered[0]["delayed"] >= 1
        assert not alive(dead)
        assert engines(data)[KEYS[1]][0] == "running"  # the other engine never noticed
        released = [p["key"] for t, p in _ledger_events(tmp_path) if t == "ledger.released"]
        assert KEYS[0] in released
        log = (tmp_path / "daemon.log").read_text()
        assert "the event log cannot be written" in log
        assert "takes writes again" in log
        assert "Traceback" not in log
    finally:
        assert _stop(daemon) < 10
    assert daemon.returncode == 0


def test_a_locked_ledger_owes_the_release_and_records_it_when_free(
    tmp_path: Path, data: Path
) -> None:
    config = _config(tmp_path, KEYS[:1])
    daemon = start_daemon(config, data, tmp_path / "daemon.log")
    try:
        wait_for(lambda: count(data, KEYS[0], "engine.ready") == 1)
        with write_lock(tmp_path / "ledger.db"):
            _kill_engine(data, KEYS[0])
            wait_for(lambda: count(data, KEYS[0], "engine.crashed") == 1, timeout=15)
            time.sleep(2)  # past the daemon's own lock wait: the release is owed now
            released = [t for t, _ in _ledger_events(tmp_path) if t == "ledger.released"]
            assert released == []
        wait_for(
            lambda: any(t == "ledger.released" for t, _ in _ledger_events(tmp_path)), timeout=10
        )
        with EventStore.open(tmp_path / "ledger.db") as store:
            assert catch_up(store).reservations == {}
        assert "ledger release of llamacpp:alpha:0 owed" in (tmp_path / "daemon.log").read_text()
    finally:
        _stop(daemon)
    assert daemon.returncode == 0


def test_sigterm_under_a_held_lock_stops_everything_within_two_seconds(
    tmp_path: Path, data: Path
) -> None:
    config = _config(tmp_path)
    daemon = start_daemon(config, data, tmp_path / "daemon.log")
    wait_for(lambda: all(count(data, k, "engine.ready") == 1 for k in KEYS))
    pids = [engines(data)[k][1] for k in KEYS]
    with write_lock(data / "events.db"):
        took = _stop(daemon)
        assert daemon.returncode == 0
        assert took < 2.0, f"SIGTERM took {took:.1f} s under a held lock"
        assert not any(alive(pid) for pid in pids)
    # the stop could not be written: the next start says so (daemon.gap), and finds them lost
    again = start_daemon(config, data, tmp_path / "daemon2.log")
    try:
        wait_for(lambda: any(t == "daemon.gap" for _, t, _ in events(data, DAEMON_STREAM)))
        wait_for(lambda: all(count(data, k, "engine.ready") == 2 for k in KEYS))
        started = [p for _, t, p in events(data, DAEMON_STREAM) if t == "daemon.started"][-1]
        assert sorted(started["lost"]) == sorted(KEYS)
    finally:
        _stop(again)


def _can_mount() -> bool:
    return os.geteuid() == 0 and Path("/proc/mounts").exists()


@contextmanager
def small_disk(path: Path, size: str = "8m") -> Iterator[Path]:
    """A real, small filesystem (tmpfs) at ``path``."""
    path.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(disk: Path) -> Path:
    filler = disk / "filler"
    with filler.open("wb") as out:
        chunk = b"\0" * 65536
        try:
            while True:
                out.write(chunk)
                out.flush()
        except OSError:
            pass
    return filler


@pytest.mark.skipif(not _can_mount(), reason="needs root to mount a tmpfs")
def test_a_full_disk_never_kills_the_daemon_and_a_shutdown_on_it_stops_every_engine(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    with small_disk(tmp_path / "disk") as disk:
        data = disk / "data"
        daemon = start_daemon(config, data, tmp_path / "daemon.log")
        try:
            wait_for(lambda: all(count(data, k, "engine.ready") == 1 for k in KEYS))
            committed = events(data)
            filler = _fill(disk)
            dead = _kill_engine(data, KEYS[0])
            time.sleep(3)
            assert daemon.poll() is None, "a full disk never kills the daemon"
            assert not alive(dead)
            filler.unlink()
            wait_for(lambda: count(data, KEYS[0], "engine.crashed") == 1, timeout=15)
            assert events(data)[: len(committed)] == committed  # no committed event lost
            wait_for(
                lambda: any(
                    p["code"] == "store.full"
                    for _, t, p in events(data, DAEMON_STREAM)
                    if t == "daemon.log_recovered"
                ),
                timeout=15,
            )
            survivor = engines(data)[KEYS[1]][1]
            _fill(disk)
            took = _stop(daemon)
            assert daemon.returncode == 0
            assert took < 5
            assert not alive(survivor), "a shutdown on a full disk still stops every engine"
            assert kill_leftovers(data) == []
            log = (tmp_path / "daemon.log").read_text()
            assert "events could not be written before exit" in log
            assert "Traceback" not in log
        finally:
            if daemon.poll() is None:
                daemon.kill()
            kill_leftovers(data)


def test_a_corrupt_log_at_start_is_one_line_naming_the_engines_it_leaves(
    tmp_path: Path, data: Path
) -> None:
    config = _config(tmp_path, KEYS[:1])
    first = start_daemon(config, data, tmp_path / "daemon.log")
    wait_for(lambda: count(data, KEYS[0], "engine.ready") == 1)
    pid = engines(data)[KEYS[0]][1]
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    for suffix in ("-wal", "-shm"):
        Path(f"{data / 'events.db'}{suffix}").unlink(missing_ok=True)
    with (data / "events.db").open("r+b") as db:
        db.write(b"this is not a database, it was overwritten" * 10)
    second = run_cli("daemon", "--config", str(config), "--data-dir", str(data))
    assert second.returncode == 1
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1, second.stderr
    assert lines[0].startswith(f"hostler: error [store.corrupt]: {data / 'events.db'}: ")
    assert (
        f"engines of this data directory still run unsupervised (pids {pid}): stop them "
        "(kill -TERM), or move the log aside and restart the daemon" in lines[0]
    )
    assert alive(pid), "the operator decides: nothing is killed behind their back"


def test_a_log_that_turns_corrupt_while_running_stops_new_work_and_keeps_the_rest_watched(
    tmp_path: Path, data: Path
) -> None:
    config = _config(tmp_path)
    daemon = start_daemon(config, data, tmp_path / "daemon.log")
    try:
        wait_for(lambda: all(count(data, k, "engine.ready") == 1 for k in KEYS))
        survivor = engines(data)[KEYS[1]][1]
        dead = engines(data)[KEYS[0]][1]
        db = data / "events.db"
        with sqlite3.connect(db) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size = db.stat().st_size
        with db.open("r+b") as out:
            out.seek(4096)
            out.write(os.urandom(size - 4096))  # every page past the header is garbage now
        assert dead is not None
        os.killpg(dead, signal.SIGKILL)
        wait_for(lambda: "is corrupt" in (tmp_path / "daemon.log").read_text(), timeout=15)
        time.sleep(1)
        assert daemon.poll() is None, "a corrupt log never takes the daemon down"
        assert alive(survivor), "the running engine is left running, still supervised"
        log = (tmp_path / "daemon.log").read_text()
        assert "no new work starts; running engines stay supervised" in log
        assert "Traceback" not in log
    finally:
        took = _stop(daemon)
    assert daemon.returncode == 0
    assert took < 5
    assert not alive(survivor), "stopping the daemon stops what it supervised"


def test_a_log_that_turns_corrupt_stops_new_work_but_keeps_watching(tmp_path: Path) -> None:
    """SF3 in the supervisor: after a corrupt-log error, starts are refused, in one line."""
    from hostler.drivers.loghealth import LogHealth
    from hostler.errors import StoreCorruptError

    health = LogHealth("events.db")
    health.failed(StoreCorruptError("events.db: database disk image is malformed"), 1.0, pending=1)
    assert health.corrupt == "events.db: database disk image is malformed"
    assert health.status()["writable"] is False
    health.wrote(2.0)
    assert health.ok
    assert health.corrupt is not None  # a write that went through does not undo corruption


def test_a_damaged_page_start_up_would_not_read_is_found_at_start(tmp_path: Path) -> None:
    """Issue 22: a page damaged in the middle of the log went unnoticed at start (the rows
    start-up reads were whole) while ``PRAGMA integrity_check`` reported it; the daemon then
    met it mid-run. Start-up now checks every page (SQLite's quick_check) and refuses."""
    from hostler.config import DaemonConfig
    from hostler.daemon_parts.ownership import open_owned_log
    from hostler.errors import StoreCorruptError
    from hostler.events.daemon import DaemonStopped

    data = tmp_path / "data"
    data.mkdir()
    log = data / "events.db"
    with EventStore.open(log, owner=True) as store:
        for stream in range(40):
            events = [DaemonStopped(at=float(n), pid=n) for n in range(100)]
            store.append(f"test/{stream}", events, expected_version=None)
    size = log.stat().st_size
    with log.open("r+b") as file:  # a stretch of one page in the middle, as a bad sector would
        file.seek(size // 2 - (size // 2) % 4096 + 100)
        file.write(b"\xff" * 200)
    with EventStore.open(log) as store:
        assert store.last_seq() == 4000  # what a start reads is whole
        with pytest.raises(StoreCorruptError):
            store.check_integrity()
    with pytest.raises(StoreCorruptError) as refused:
        open_owned_log(DaemonConfig(data_dir=data))
    assert refused.value.message.startswith(f"{log}: damaged pages (*** in database main *** ")
    assert refused.value.message.endswith("; no engine of this data directory is running")


def test_a_decision_a_locked_log_refused_is_told_as_a_busy_log() -> None:
    """Issue 22: a held lock was answered ``Retry-After: 10`` (a plain store error) though the
    docs say 1 s for a busy log: the refusal now keeps the kind of the failure."""
    from hostler.drivers.loghealth import LogHealth
    from hostler.errors import StoreBusyError, StoreError, StoreFullError
    from hostler.serve.errors import http_error_for

    health = LogHealth("events.db")
    health.failed(StoreBusyError("events.db: locked"), 1.0, pending=1)
    busy = health.refusal("'start' not done")
    assert type(busy) is StoreBusyError and http_error_for(busy).retry_after == 1
    health.failed(StoreFullError("events.db: full"), 2.0, pending=1)
    assert type(health.refusal("'start' not done")) is StoreFullError
    assert type(LogHealth("events.db").refusal("x")) is StoreError  # no failure known


def test_a_log_held_locked_at_start_is_refused_at_once_not_waited_on_in_silence(
    tmp_path: Path,
) -> None:
    """A writer holding the log's lock (a file not yet in WAL mode) made the daemon's start
    wait 30 s without a word (the check of whose file it is waited SQLite's long timeout)."""
    from hostler.config import DaemonConfig
    from hostler.daemon_parts.ownership import open_owned_log
    from hostler.errors import StoreBusyError

    data = tmp_path / "data"
    data.mkdir()
    log = data / "events.db"
    EventStore.open(log).close()  # a log, at head
    holder = sqlite3.connect(log, timeout=0)
    holder.execute("PRAGMA journal_mode=DELETE")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        began = time.monotonic()
        with pytest.raises(StoreBusyError) as refused:
            open_owned_log(DaemonConfig(data_dir=data))
        assert time.monotonic() - began < 5
        assert "locked by another writer" in refused.value.message
    finally:
        holder.rollback()
        holder.close()


def test_a_start_with_the_database_away_names_the_engines_it_leaves(tmp_path: Path) -> None:
    """As a corrupt log's refusal does (SF3): the engines of this data directory that still
    run, unsupervised, while no daemon can start."""
    from hostler.config import DaemonConfig
    from hostler.daemon_parts.ownership import open_owned_log
    from hostler.errors import StoreUnavailableError

    config = DaemonConfig(data_dir=tmp_path / "data", log="postgresql+psycopg://u@127.0.0.1:1/x")
    with pytest.raises(StoreUnavailableError) as refused:
        open_owned_log(config)
    assert refused.value.message.endswith("; no engine of this data directory is running")
