"""Breaks a hostile tester found in the daemon after issue 8's first slices, each now a test.

A typo in one engine's plugin name, or a plugin whose adapter raises (even ``SystemExit``),
stopped the whole daemon and left the adopted engines unowned; a damaged row of an engine's
history gave a misleading "another writer" error; a three-second lock at autostart meant the
engine never started (tests/test_supervisor_faults.py); a FIFO in place of an engine's log hung the event loop.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hostler import EventStore
from hostler.engines.reconcile import DAEMON_STREAM
from hostler.testing.tiny_gguf import write_tiny_llama

from _daemons import alive, count, engines, events, kill_leftovers, start_daemon, wait_for
from _support import run_cli

GOOD = "llamacpp:good:0"

_RAISING_PLUGIN = """
from hostler.plugin import hookimpl
from hostler_llamacpp import LlamaCppAdapter


class RaisesAtInit(LlamaCppAdapter):
    engine_type = "raisesinit"

    def __init__(self):
        raise RuntimeError("no GPU driver here")


class ExitsInBuild(LlamaCppAdapter):
    engine_type = "exitsbuild"

    def build_command(self, spec):
        raise SystemExit(3)


class Interrupted(BaseException):
    pass


class BreaksOut(LlamaCppAdapter):
    engine_type = "breaksout"

    def build_command(self, spec):
        raise Interrupted("not an Exception at all")


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("and its message cannot be read either")


class BadMessage(LlamaCppAdapter):
    engine_type = "badmessage"

    def build_command(self, spec):
        raise Unprintable()


class NegativeFootprint(LlamaCppAdapter):
    engine_type = "negative"

    def estimate_footprint(self, geometry, spec):
        return -5


@hookimpl
def register_engines(register):
    for adapter in (RaisesAtInit, ExitsInBuild, BreaksOut, BadMessage, NegativeFootprint):
        register(adapter)
"""


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    write_tiny_llama(tmp_path / "good.gguf")
    site = tmp_path / "site"
    (site / "hostler_test_raising").mkdir(parents=True)
    (site / "hostler_test_raising" / "__init__.py").write_text(_RAISING_PLUGIN)
    dist = site / "hostler_test_raising-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: hostler-test-raising\nVersion: 0.1\n"
    )
    (dist / "entry_points.txt").write_text("[hostler]\nraising = hostler_test_raising\n")
    data = tmp_path / "data"
    yield site, data
    kill_leftovers(data)


def _config(tmp_path: Path, *keys: str) -> Path:
    config = tmp_path / "hostler.toml"
    config.write_text(
        '[daemon]\nidle_timeout = 0\nledger = "ledger.db"\n'
        + "".join(f'\n[[engines]]\nkey = "{key}"\nmodel = "good.gguf"\nctx = 512\n' for key in keys)
    )
    return config


def test_a_broken_plugin_or_a_typo_fails_its_engine_and_the_adopted_ones_keep_an_owner(
    tmp_path: Path, setup: tuple[Path, Path]
) -> None:
    site, data = setup
    env = {"PYTHONPATH": str(site)}
    first = start_daemon(_config(tmp_path, GOOD), data, tmp_path / "d1.log", env=env)
    wait_for(lambda: count(data, GOOD, "engine.ready") == 1)
    pid = engines(data)[GOOD][1]
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    keys = (
        GOOD,
        "lamacpp:typo:0",
        "raisesinit:m:0",
        "exitsbuild:m:0",
        "breaksout:m:0",
        "badmessage:m:0",
        "negative:m:0",
    )
    second = start_daemon(_config(tmp_path, *keys), data, tmp_path / "d2.log", env=env)
    try:
        for key in keys[1:]:
            wait_for(lambda k=key: count(data, k, "engine.failed") == 1)
        failed = {s: p["error"] for s, t, p in events(data) if t == "engine.failed"}
        assert failed["engine/lamacpp:typo:0"] == (
            "lamacpp:typo:0: no plugin provides engine 'lamacpp' (loaded: badmessage, "
            "breaksout, ds4, exitsbuild, llamacpp, mlx, negative, raisesinit, sdcpp)"
        )
        assert "raised Interrupted: not an Exception at all in " in failed["engine/breaksout:m:0"]
        assert (
            "raised Unprintable: (its message could not be read) in "
            in failed["engine/badmessage:m:0"]
        )
        assert (
            "returned -5 from estimate_footprint, not a byte count"
            in (failed["engine/negative:m:0"])
        )
        assert failed["engine/raisesinit:m:0"] == (
            "raisesinit:m:0: the 'raisesinit' engine plugin "
            "(hostler_test_raising.RaisesAtInit) raised RuntimeError: no GPU driver here while "
            "its adapter was built"
        )
        assert "raised SystemExit: 3" in failed["engine/exitsbuild:m:0"]
        assert second.poll() is None
        started = [p for _, t, p in events(data, DAEMON_STREAM) if t == "daemon.started"]
        assert started[-1]["adopted"] == [GOOD]
        assert engines(data)[GOOD][1] == pid and alive(pid)  # adopted, still owned
        ends = [t for _, t, _ in events(data, DAEMON_STREAM)]
        assert ends == ["daemon.started", "daemon.gap", "daemon.started"]
        with EventStore.open(data / "events.db") as store:  # the gap is the new daemon's first word
            rows = [(r.seq, r.type) for r in store.read_all()]
        gap_seq = next(seq for seq, kind in rows if kind == "daemon.gap")
        first_start = next(seq for seq, kind in rows if kind == "daemon.started")
        with EventStore.open(data / "events.db") as store:
            (gap,) = store.read_all(types=["daemon.gap"])
        # "events after seq N may be missing": N is the dead daemon's, not the new one's plugins
        told = [kind for seq, kind in rows if first_start < seq <= gap.payload["last_seq"]]
        assert "plugin.loaded" not in told and gap.payload["last_seq"] == gap_seq - 1, rows
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(30)
    assert second.returncode == 0
    assert not alive(pid)
    assert "Traceback" not in (tmp_path / "d2.log").read_text()


#: (how the row is damaged, what the daemon says of it)
DAMAGE = [
    ("'not json'", "seq {seq} (payload is not JSON)"),
    (
        "json_set(payload, '$.create_time', 'yesterday')",
        "seq {seq} (not an event this hostler can fold: a payload that does not fit its type, "
        "an unknown type, or a newer schema)",
    ),
    # well typed, but no process's: pid 0 had the live engine reaped, -1 and port 70000 crashed
    ("json_set(payload, '$.pid', 0)", f"{GOOD} records an impossible pid (0)"),
    ("json_set(payload, '$.pid', -1)", f"{GOOD} records an impossible pid (-1)"),
    ("json_set(payload, '$.port', 70000)", f"{GOOD} records an impossible port (70000)"),
    (
        "json_set(payload, '$.since_boot', -5)",
        f"{GOOD} records an impossible start since boot (-5.0)",
    ),
]


def _damage(path: Path, seq: int, payload_sql: str) -> None:
    """Damage one row the way a disk or a hand edit could (the append-only trigger dropped)."""
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TRIGGER events_no_update")
        conn.execute(f"UPDATE events SET payload = {payload_sql} WHERE seq = ?", (seq,))  # noqa: S608


@pytest.mark.parametrize(("payload_sql", "why"), DAMAGE)
def test_a_damaged_engine_history_refuses_the_start_naming_the_seq_and_the_engine(
    tmp_path: Path, setup: tuple[Path, Path], payload_sql: str, why: str
) -> None:
    """A misfit ``engine.spawned`` was skipped: the live engine was reaped as a stray."""
    _, data = setup
    config = _config(tmp_path, GOOD)
    first = start_daemon(config, data, tmp_path / "d1.log")
    wait_for(lambda: count(data, GOOD, "engine.ready") == 1)
    pid = engines(data)[GOOD][1]
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    with sqlite3.connect(data / "events.db") as conn:
        seq = conn.execute(
            "SELECT seq FROM events WHERE type = 'engine.spawned' AND stream_id = ?",
            (f"engine/{GOOD}",),
        ).fetchone()[0]
    _damage(data / "events.db", seq, payload_sql)
    result = run_cli("daemon", "--config", str(config), "--data-dir", str(data))
    assert result.returncode == 1
    assert result.stderr == (
        f"hostler: error [store.damaged-row]: {data / 'events.db'}: rows of the engines' "
        f"history cannot be read: {why.format(seq=seq)}; hostler starts no work on a "
        "damaged log: restore it from a backup, or move it aside (it stays readable with "
        "`hostler events --db`); engines of this data directory still run unsupervised (pids "
        f"{pid}): stop them (kill -TERM), or move the log aside and restart the daemon, which "
        "stops them as strays (docs/daemon.md)\n"
    )
    assert alive(pid)


def test_a_fifo_in_place_of_the_engine_log_fails_that_engine_and_sigterm_still_works(
    tmp_path: Path, setup: tuple[Path, Path]
) -> None:
    _, data = setup
    run = data / "run" / "llamacpp_good_0"
    run.mkdir(parents=True, mode=0o700)
    os.mkfifo(run / "engine.log", 0o600)
    daemon = start_daemon(_config(tmp_path, GOOD), data, tmp_path / "d.log")
    try:
        wait_for(lambda: count(data, GOOD, "engine.failed") == 1)
        failed = next(p for s, t, p in events(data) if t == "engine.failed")
        assert failed["error"].startswith(f"{run / 'engine.log'}: cannot open the engine log")
    finally:
        started = time.monotonic()
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
    assert time.monotonic() - started < 5
    assert daemon.returncode == 0


def test_a_symlinked_engine_log_is_never_followed(tmp_path: Path, setup: tuple[Path, Path]) -> None:
    """Rotation would have truncated the file the link points at, and written into it."""
    _, data = setup
    precious = tmp_path / "precious.bin"
    precious.write_bytes(b"keep me" * 1000)
    run = data / "run" / "llamacpp_good_0"
    run.mkdir(parents=True, mode=0o700)
    (run / "engine.log").symlink_to(precious)
    daemon = start_daemon(_config(tmp_path, GOOD), data, tmp_path / "d.log")
    try:
        wait_for(lambda: count(data, GOOD, "engine.failed") == 1)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
    assert precious.read_bytes() == b"keep me" * 1000
    assert oct(precious.stat().st_mode & 0o777) == oct(0o644 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_two_keys_never_share_a_run_directory() -> None:
    """``a/0`` and ``a 0`` both became ``a_0``: one engine read the other's log and was killed."""
    from hostler.engines.factory import run_dir_name as _safe

    names = {_safe(k) for k in ("llamacpp:tiny/0:0", "llamacpp:tiny 0:0", "llamacpp:tiny_0:0")}
    assert len(names) == 3
    assert _safe("llamacpp:qwen2.5-7b:0") == "llamacpp_qwen2.5-7b_0"  # plain keys: readable
    assert _safe("llamacpp:tiny/0:0").startswith("llamacpp_tiny_0_0-")
    assert _safe("llamacpp:tiny_0:0").startswith("llamacpp_tiny_0_0-")
    assert all(len(n) <= 200 for n in names)


def test_a_symlinked_run_directory_is_never_followed(
    tmp_path: Path, setup: tuple[Path, Path]
) -> None:
    _, data = setup
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o755)
    (outside / "engine.log.1").write_text("precious")
    (data / "run").mkdir(parents=True, mode=0o700)
    (data / "run" / "llamacpp_good_0").symlink_to(outside)
    daemon = start_daemon(_config(tmp_path, GOOD), data, tmp_path / "d.log")
    try:
        wait_for(lambda: count(data, GOOD, "engine.failed") == 1)
        failed = next(p for s, t, p in events(data) if t == "engine.failed")
        assert failed["error"] == (
            f"{GOOD}: {data / 'run' / 'llamacpp_good_0'} is a symbolic link; hostler keeps an "
            "engine's log and work files only in a directory of its own: remove the link"
        )
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
    assert sorted(p.name for p in outside.iterdir()) == ["engine.log.1"]
    assert (outside / "engine.log.1").read_text() == "precious"
    assert outside.stat().st_mode & 0o777 == 0o755 & ~_umask()


def test_an_exception_whose_message_raises_anything_is_still_described() -> None:
    from hostler.pluginhost import describe_exception

    class Unreadable(BaseException):
        def __str__(self) -> str:
            raise KeyboardInterrupt

    assert describe_exception(Unreadable()) == "Unreadable: (its message could not be read)"
