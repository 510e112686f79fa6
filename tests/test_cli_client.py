"""The client commands against a real HTTP face over stand-in engines (real processes, real HTTP).

The daemon runs on an event loop in a thread (anyio's blocking portal); each command runs
in-process through ``hostler.cli.main``, its output captured (not a terminal: plain tables).
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.from_thread import start_blocking_portal

import hostler
from hostler.cli import main
from hostler.cli.client import check_url, daemon_url
from hostler.cli.load import model_of, step_line
from hostler.cli.models import MODELS_HEADERS
from hostler.cli.plugins import PLUGINS_HEADERS
from hostler.cli.ps import PS_HEADERS, ps_rows
from hostler.cli.remote_capacity import BUDGET_HEADERS, bytes_argument, spillover_argument
from hostler.cli.tables import duration, size
from hostler.engines.supervisor import Supervisor, SupervisorPolicy
from hostler.events.ledger import LedgerMeasured, LedgerReleased, LedgerReserved
from hostler.plugin import LaunchSpec
from hostler.runtime.details import LedgerFold, reason_of
from hostler.serve.app import make_app
from hostler.serve.server import HttpServer

from _fake_engine import BallastEngine
from _pools import BALLAST_MIB, PRICE, World, world_at
from _support import run_cli

TOKEN = "k" * 43
MODELS = {"alpha": "llamacpp:alpha", "beta": "llamacpp:beta", "gamma": "llamacpp:gamma"}


class Daemon:
    """A served runtime: its base URL and the runtime itself."""

    def __init__(self, url: str, runtime: hostler.Runtime, world: World) -> None:
        self.url = url
        self.runtime = runtime
        self.world = world


@contextlib.asynccontextmanager
async def serving(world: World, models: dict[str, str]) -> AsyncIterator[Daemon]:
    build = world.supervisor_factory(BallastEngine(world.tmp_path, BALLAST_MIB, load_seconds=0.3))
    runtime = hostler.Runtime(
        world.store,
        build,
        ledger=world.ledger,
        drain_poll=0.02,
    )
    async with runtime, anyio.create_task_group() as tg:
        server = HttpServer(make_app(runtime, models, token=TOKEN), "127.0.0.1", 0)
        tg.start_soon(server.serve)
        await server.started.wait()
        yield Daemon(f"http://127.0.0.1:{server.port}", runtime, world)
        server.stop()


@contextlib.contextmanager
def daemon_of(tmp_path: Path, models: dict[str, str]) -> Iterator[Daemon]:
    with (
        world_at(tmp_path) as world,
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(serving(world, models)) as daemon,
    ):
        yield daemon


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with daemon_of(tmp_path, MODELS) as served:
        yield served


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        status = main(list(argv))
    except SystemExit as exc:  # argparse's refusal
        status = int(exc.code or 0)
    out, err = capsys.readouterr()
    return status, out, err


def load(capsys: pytest.CaptureFixture[str], daemon: Daemon, model: str) -> str:
    status, out, err = cli(capsys, "load", model, "--url", daemon.url, "--token", TOKEN)
    assert status == 0, err
    return out


# -- pure helpers ------------------------------------------------------------------------------


def test_sizes_and_durations_read_like_people_write_them() -> None:
    assert [size(v) for v in (None, 0, 1023, 1024, 97.4 * 2**20, 3 * 2**30, 2**40)] == [
        "-",
        "0 B",
        "1023 B",
        "1.0 KiB",
        "97.4 MiB",
        "3.0 GiB",
        "1.0 TiB",
    ]
    assert [duration(v) for v in (None, -5, 0, 119.4, 120, 7199, 7200, 172799, 172800)] == [
        "-",
        "0s",
        "0s",
        "119s",
        "2m",
        "120m",
        "2.0h",
        "48.0h",
        "2.0d",
    ]


def test_a_daemon_url_is_http_with_a_host_or_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    assert check_url("http://127.0.0.1:11435/") == "http://127.0.0.1:11435"
    assert check_url("https://box.lan") == "https://box.lan"
    for bad in ("", "127.0.0.1:11435", "ftp://x", "http://", "http://h:99999", "http://a b", "x"):
        with pytest.raises(ValueError, match="is not a daemon URL"):
            check_url(bad)
    with pytest.raises(ValueError, match="is not a daemon URL"):
        check_url("http://h/" + "x" * 2048)

    monkeypatch.delenv("HOSTLER_URL", raising=False)
    assert daemon_url(argparse.Namespace(url=None)) == "http://127.0.0.1:11435"
    assert daemon_url(argparse.Namespace(url=None), default=None) is None
    monkeypatch.setenv("HOSTLER_URL", "http://10.0.0.2:9/")
    assert daemon_url(argparse.Namespace(url=None)) == "http://10.0.0.2:9"
    assert daemon_url(argparse.Namespace(url="http://a:1")) == "http://a:1"
    monkeypatch.setenv("HOSTLER_URL", "nope")
    with pytest.raises(hostler.errors.SettingError, match="HOSTLER_URL"):
        daemon_url(argparse.Namespace(url=None))


def test_budget_sizes_and_spillover_words_parse_or_refuse() -> None:

    assert bytes_argument("auto") == "auto"
    assert bytes_argument(" AUTO ") == "auto"
    assert bytes_argument("0") == 0
    assert bytes_argument("8589934592") == 8 * 2**30
    assert bytes_argument("8G") == 8 * 2**30
    assert bytes_argument("8 GiB") == 8 * 2**30
    assert bytes_argument("512MiB") == 512 * 2**20
    assert bytes_argument("1.5k") == 1536
    assert bytes_argument("1t") == 2**40
    assert bytes_argument(str(2**60)) == 2**60
    for bad in ("-1", "8X", "", "G", "1e9", str(2**60 + 1), "9" * 50):
        with pytest.raises(argparse.ArgumentTypeError):
            bytes_argument(bad)
    assert [spillover_argument(w) for w in ("on", "OFF", "auto")] == [True, False, "auto"]
    with pytest.raises(argparse.ArgumentTypeError, match="on, off or auto"):
        spillover_argument("yes")


def test_reasons_name_the_decision() -> None:
    evicted = {"reason": "evicted", "decision": {"for": "llamacpp:beta:0"}}
    assert reason_of("engine.stop_requested", evicted) == "evicted for llamacpp:beta:0"
    assert reason_of("engine.stop_requested", {"reason": "evicted", "decision": None}) == "evicted"
    assert reason_of("engine.stop_requested", {"reason": "idle"}) == "idle"
    assert reason_of("engine.crashed", {"exit_code": 1, "signal": None}) == "crashed (exit 1)"
    assert reason_of("engine.crashed", {"exit_code": None, "signal": 9}) == "crashed (signal 9)"
    assert reason_of("engine.start_requested", {"cause": "request"}) == "started (request)"
    assert reason_of("engine.failed", {"error": "x" * 500}) == ("failed: " + "x" * 500)[:120]
    assert reason_of("engine.lost", {"cause": "gone"}) == "lost: gone"
    assert reason_of("engine.adopted", {}) == "adopted after a daemon restart"
    assert reason_of("engine.reset", {"cause": "new"}) == "reset (new)"
    assert reason_of("engine.ready", {}) is None


def test_the_ledger_fold_keeps_reserved_and_measured_per_key_of_its_owner() -> None:
    fold = LedgerFold("me")
    fold.apply(LedgerReserved("a", 100, "me", 0, 0, 1000, 1000, True))
    fold.apply(LedgerReserved("b", 7, "other", 0, 100, 1000, 1000, True))
    assert {k: (v.reserved, v.measured) for k, v in fold.rows.items()} == {"a": (100, None)}
    fold.apply(LedgerMeasured("a", 60, "me", 100))
    assert (fold.rows["a"].reserved, fold.rows["a"].measured) == (100, 60)
    fold.apply(LedgerMeasured("c", 5, "me", 9))
    assert (fold.rows["c"].reserved, fold.rows["c"].measured) == (9, 5)
    fold.apply(LedgerReserved("a", 120, "me", 60, 7, 1000, 1000, True))
    assert (fold.rows["a"].reserved, fold.rows["a"].measured) == (120, None)
    fold.apply(LedgerReleased("a", 120, "me", "released"))
    assert "a" not in fold.rows


def test_load_steps_are_those_of_the_model_only() -> None:
    def event(kind: str, stream: str, **payload: Any) -> dict[str, Any]:
        return {"type": kind, "stream": stream, "payload": payload}

    room = event(
        "pool.room_planned",
        "pool/host",
        for_key="llamacpp:gamma:0",
        wanted=2**30,
        shortfall=2**20,
        evict=["llamacpp:alpha:0"],
        drain=None,
        reachable=True,
    )
    assert step_line(room, "gamma") == (
        "room planned for llamacpp:gamma:0: 1.0 GiB needed, 1.0 MiB short; evicting "
        "llamacpp:alpha:0"
    )
    assert step_line(room, "alpha") is None
    short = {**room, "payload": {**room["payload"], "evict": [], "reachable": False}}
    line = step_line(short, "gamma")
    assert line is not None and line.endswith("evicting nothing (not enough can be freed)")
    evict = event(
        "engine.stop_requested",
        "engine/llamacpp:alpha:0",
        reason="evicted",
        decision={"for": "llamacpp:gamma:0"},
    )
    assert step_line(evict, "gamma") == "evicting llamacpp:alpha:0 (for llamacpp:gamma:0)"
    assert step_line(evict, "alpha") is None
    idle = event("engine.stop_requested", "engine/llamacpp:gamma:0", reason="idle")
    assert step_line(idle, "gamma") is None
    spawned = event("engine.spawned", "engine/llamacpp:gamma:0", pid=42, port=9)
    assert step_line(spawned, "gamma") == "spawned llamacpp:gamma:0: pid 42, port 9"
    assert step_line(spawned, "gam") is None
    # a crash by a signal says the signal (a breaking helper saw "exit None" for SIGABRT)
    aborted = event("engine.crashed", "engine/llamacpp:gamma:0", exit_code=None, signal=6)
    assert step_line(aborted, "gamma") == (
        "crashed llamacpp:gamma:0 (killed by signal 6 (SIGABRT); no panic line recognised in "
        "its output; never became ready)"
    )
    assert step_line(event("engine.ready", "engine/llamacpp:gamma:0"), "gamma") == (
        "ready llamacpp:gamma:0"
    )
    assert step_line(event("queue.enqueued", "queue/llamacpp:gamma:0"), "gamma") is None
    assert model_of("llamacpp:alpha:0") == "alpha" and model_of("plain") == "plain"


# -- against the daemon ------------------------------------------------------------------------


def test_ps_is_a_table_with_pinned_columns_and_json_with_documented_keys(
    daemon: Daemon, capsys: pytest.CaptureFixture[str]
) -> None:
    load(capsys, daemon, "alpha")
    status, out, err = cli(capsys, "ps", "--url", daemon.url)
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0].split("  ")[0] == "KEY"
    assert [h for h in PS_HEADERS if h in lines[0]] == list(PS_HEADERS)
    assert PS_HEADERS == (
        "KEY",
        "MODEL",
        "STATE",
        "FOR",
        "PID",
        "PORT",
        "RESERVED",
        "MEASURED",
        "SLOTS",
        "QUEUED",
        "IDLE STOP",
        "LEASE",
        "REASON",
    )
    assert "\x1b[" not in out  # no colour in a pipe
    alpha = next(line for line in lines if line.startswith("llamacpp:alpha:0"))
    pid = daemon.runtime.pool.supervisor("llamacpp:alpha:0").pid
    assert alpha.split()[1:3] == ["alpha", "running"]
    assert str(pid) in alpha.split()
    assert "430.0 MiB" in alpha  # reserved at admission (the price)
    assert alpha.endswith("started (one-shot)")
    committed = daemon.world.ledger.refresh().committed
    assert f"\ncommitted {size(committed)} in the host ledger\n" in out
    status, out, _ = cli(capsys, "ps", "--url", daemon.url, "--json")
    listed = json.loads(out)
    assert set(listed) == {"engines", "queues", "sessions", "ledger", "caches"}
    engine = next(e for e in listed["engines"] if e["key"] == "llamacpp:alpha:0")
    assert set(engine) == {
        "key",
        "state",
        "bytes",
        "last_used_at",
        "recent_hits",
        "busy",
        "draining",
        "pinned",
        "port",
        "pid",
        "progress",
        "state_since",
        "idle_deadline",
        "last_reason",
        "reserved_bytes",
        "measured_bytes",
        "lease",
        "slots",
    }
    assert engine["state"] == "running" and engine["pid"] == pid
    # SLOTS counts what the engine was launched with (its --parallel), not its queue's width,
    # which is one more (a background one-shot's lane): launched with 1, it reads 0/1, not 0/2
    launched = daemon.runtime.pool.supervisor("llamacpp:alpha:0").launch_spec
    assert launched is not None and engine["slots"] == launched.slots == 1
    assert listed["queues"]["llamacpp:alpha:0"]["width"] == 2
    assert " 0/1 " in alpha and "/2 " not in alpha
    assert engine["progress"] is None  # idle, and llama.cpp reads no progress (PG1)
    assert engine["reserved_bytes"] == PRICE
    assert engine["measured_bytes"] == committed  # the ledger holds the measured footprint
    assert BALLAST_MIB * 2**20 < committed < PRICE
    assert size(committed) in alpha
    assert engine["idle_deadline"] is None  # idle_timeout 0: never idle-stopped
    assert engine["lease"] is None
    assert engine["state_since"] <= time.time()


def test_ps_says_why_an_engine_was_evicted_and_load_shows_the_steps(
    daemon: Daemon, capsys: pytest.CaptureFixture[str]
) -> None:
    load(capsys, daemon, "alpha")
    load(capsys, daemon, "beta")
    out = load(capsys, daemon, "gamma")  # 3 × 430 MiB > 1 GiB: one of them goes
    lines = out.splitlines()
    steps = [line.split(None, 1)[1] for line in lines[:-1]]
    assert steps[0].startswith("room planned for llamacpp:gamma:0: 430.0 MiB needed")
    assert "evicting llamacpp:alpha:0 (for llamacpp:gamma:0)" in steps
    assert "starting llamacpp:gamma:0 (one-shot)" in steps
    spawned = next(s for s in steps if s.startswith("spawned llamacpp:gamma:0: pid "))
    assert steps[-1] == "ready llamacpp:gamma:0"
    assert steps.index(spawned) < len(steps) - 1
    assert lines[-1].startswith("gamma: loaded as llamacpp:gamma:0 in ")
    assert lines[-1].endswith(" s")
    _, table, _ = cli(capsys, "ps", "--url", daemon.url)
    alpha = next(line for line in table.splitlines() if line.startswith("llamacpp:alpha:0"))
    assert alpha.split()[2] == "stopped"
    assert alpha.endswith("evicted for llamacpp:gamma:0")
    # loading what already runs shows no step, only the summary
    again = load(capsys, daemon, "gamma")
    assert again.splitlines()[-1].startswith("gamma: loaded as llamacpp:gamma:0 in ")
    assert len(again.splitlines()) == 1
    status, out, _ = cli(capsys, "load", "beta", "--url", daemon.url, "--token", TOKEN, "--json")
    assert status == 0 and json.loads(out) == {
        "model": "beta",
        "key": "llamacpp:beta:0",
        "loaded": True,
    }


#: The columns ``hostler ps`` keeps at 80 columns, whatever else goes.
PS_KEPT = ("KEY", "STATE", "RESERVED", "SLOTS", "IDLE STOP", "REASON")


def _at(capsys: pytest.CaptureFixture[str], columns: str, *argv: str) -> list[str]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("COLUMNS", columns)
        status, out, err = cli(capsys, *argv)
    assert status == 0, err
    return out.splitlines()


def test_every_table_fits_80_columns_and_wide_shows_every_column(
    daemon: Daemon, capsys: pytest.CaptureFixture[str]
) -> None:
    load(capsys, daemon, "alpha")
    load(capsys, daemon, "beta")
    load(capsys, daemon, "gamma")  # one of them evicted: a long REASON
    ps = _at(capsys, "80", "ps", "--url", daemon.url)
    assert all(len(line) <= 80 for line in ps), ps
    shown = [h for h in PS_HEADERS if h in ps[0]]
    assert set(PS_KEPT) <= set(shown) and len(shown) < len(PS_HEADERS)
    evicted = next(line for line in ps if "stopped" in line)
    assert evicted.endswith("…") and "evicted for" in evicted  # cut, not lost
    assert "0/1" in next(line for line in ps if line.startswith("llamacpp:gamma:0"))
    wide = _at(capsys, "80", "ps", "--url", daemon.url, "--wide")
    assert [h for h in PS_HEADERS if h in wide[0]] == list(PS_HEADERS)
    assert any(line.endswith("evicted for llamacpp:gamma:0") for line in wide)
    for argv in (("models",), ("budget",), ("events",)):
        lines = _at(capsys, "80", *argv, "--url", daemon.url)
        assert len(lines) > 1 and all(len(line) <= 80 for line in lines), (argv, lines)
    models = _at(capsys, "80", "models", "--url", daemon.url)
    assert models[0].split() == list(MODELS_HEADERS)  # four columns fit as they are
    budget = _at(capsys, "80", "budget", "--url", daemon.url)
    assert next(line for line in budget if line.startswith("KEY")).split()[:3] == [
        "KEY",
        "BYTES",
        "OWNER",
    ]
    plugins = _at(capsys, "80", "plugins")
    assert plugins[0].split()[:3] == ["PLUGIN", "VERSION", "STATUS"]
    assert all(len(line) <= 80 for line in plugins)
    assert all(len(line) <= 40 for line in _at(capsys, "40", "ps", "--url", daemon.url))


def test_models_lists_ids_engines_and_residency(
    daemon: Daemon, capsys: pytest.CaptureFixture[str]
) -> None:
    load(capsys, daemon, "beta")
    status, out, err = cli(capsys, "models", "--url", daemon.url)
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["MODEL", "SOURCE", "SIZE", "RESIDENT", "RESERVED"]
    assert MODELS_HEADERS == ("MODEL", "SOURCE", "SIZE", "RESIDENT", "RESERVED")
    beta = next(line for line in lines if line.startswith("beta"))
    assert beta.split()[1:4] == ["-", "-", "yes"]  # this app says no source nor size
    gamma = next(line for line in lines if line.startswith("gamma"))
    assert gamma.split()[1:] == ["-", "-", "no", "-"]
    assert max(map(len, lines)) <= 80
    _, out, _ = cli(capsys, "models", "--url", daemon.url, "--json")
    rows = json.loads(out)
    assert [r["id"] for r in rows] == ["alpha", "beta", "gamma"]
    assert set(rows[0]) == {"id", "source", "size_bytes", "engines", "resident", "reserved_bytes"}
    beta_row = rows[1]
    assert beta_row["resident"] is True and beta_row["engines"] == ["llamacpp:beta:0"]
    assert beta_row["reserved_bytes"] is not None and beta_row["reserved_bytes"] > 0


def test_unload_takes_a_model_id_and_unloads_its_engines(
    daemon: Daemon, capsys: pytest.CaptureFixture[str]
) -> None:
    load(capsys, daemon, "beta")
    status, out, err = cli(capsys, "unload", "beta", "--url", daemon.url, "--token", TOKEN)
    assert (status, out) == (0, "llamacpp:beta:0: unloaded\n"), err
    status, out, _ = cli(capsys, "unload", "beta", "--url", daemon.url, "--token", TOKEN)
    assert (status, out) == (0, "beta: was not loaded\n")
    status, out, err = cli(capsys, "unload", "smollm", "--url", daemon.url, "--token", TOKEN)
    assert status == 2 and out == "" and err.count("\n") == 1
    assert err == (
        "hostler: error [usage.invalid]: unload: 'smollm' is neither a model id nor an engine "
        "key (models: alpha, beta, gamma; `hostler ps` lists the keys)\n"
    )
    load(capsys, daemon, "alpha")
    status, out, _ = cli(capsys, "unload", "alpha", "--url", daemon.url, "--token", TOKEN, "--json")
    assert json.loads(out) == [{"key": "llamacpp:alpha:0", "unloaded": True}]


def test_budget_against_the_daemon_reads_and_changes_it_live(
    daemon: Daemon, capsys: pytest.CaptureFixture[str]
) -> None:
    load(capsys, daemon, "alpha")
    status, out, err = cli(capsys, "budget", "--url", daemon.url)
    assert status == 0, err
    assert out.startswith("budget     1.0 GiB (set by the operator; automatic would be ")
    assert "spillover  on (set)" in out
    header = next(line for line in out.splitlines() if line.startswith("KEY"))
    assert header.split() == list(BUDGET_HEADERS)
    assert any(line.startswith("llamacpp:alpha:0") for line in out.splitlines())
    status, out, err = cli(
        capsys, "budget", "--url", daemon.url, "--token", TOKEN, "--set", "2G", "--spillover", "off"
    )
    assert status == 0, err
    assert out.startswith("budget     2.0 GiB (set by the operator")
    assert "spillover  off (set)" in out
    assert daemon.world.ledger.refresh().explicit_budget == 2 * 2**30
    # CB1: under 1 GiB it would not be enforced: refused in one line, the daemon not asked
    status, out, err = cli(
        capsys, "budget", "--url", daemon.url, "--token", TOKEN, "--set", "1023MiB"
    )
    assert (status, out) == (2, "")
    assert err == (
        "hostler: error [usage.invalid]: --set: 1072693248 bytes is under 1 GiB (1073741824 "
        "bytes), the smallest budget hostler enforces (CB1: a smaller one would let every model "
        "start); give at least 1 GiB, or auto for the automatic budget\n"
    )
    assert daemon.world.ledger.refresh().explicit_budget == 2 * 2**30
    status, out, _ = cli(
        capsys, "budget", "--url", daemon.url, "--token", TOKEN, "--set", "auto", "--json"
    )
    snapshot = json.loads(out)
    assert snapshot["overridden"] is False and snapshot["budget"] == snapshot["auto_budget"]
    # the token is needed to change it: a wrong one is one line, exit 1
    status, out, err = cli(capsys, "budget", "--url", daemon.url, "--token", "no", "--set", "1G")
    assert status == 1 and out == ""
    assert err.startswith("hostler: error [daemon.refused]: ")
    assert "/api/budget: 401: this route needs the daemon's token" in err
    assert err.count("\n") == 1


def test_events_against_the_daemon_resume_after_a_seq(
    daemon: Daemon, capsys: pytest.CaptureFixture[str]
) -> None:
    load(capsys, daemon, "alpha")
    status, out, err = cli(
        capsys, "events", "--url", daemon.url, "--stream", "engine/llamacpp:alpha:0", "--json"
    )
    assert status == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert {"seq", "stream", "version", "type", "payload"} <= set(events[0])
    kinds = [e["type"] for e in events]
    assert kinds[:3] == ["engine.start_requested", "engine.spawned", "engine.ready"]
    after = events[1]["seq"]
    status, out, _ = cli(
        capsys,
        "events",
        "--url",
        daemon.url,
        "--stream",
        "engine/llamacpp:alpha:0",
        "--after-seq",
        str(after),
        "--json",
    )
    resumed = [json.loads(line) for line in out.splitlines()]
    assert resumed and all(e["seq"] > after for e in resumed)
    assert resumed[0]["type"] == "engine.ready"
    assert {"seq", "recorded_at", "stream", "version", "type", "payload"} == set(events[0])
    status, out, _ = cli(capsys, "events", "--url", daemon.url, "--type", "engine.ready")
    lines = out.splitlines()
    assert lines[0].split() == ["SEQ", "RECORDED", "(UTC)", "STREAM", "V", "TYPE", "DETAILS"]
    assert len(lines) == 2 and "engine/llamacpp:alpha:0" in lines[1]
    # the same table as the log file's: same columns, same rows, same renderer
    db = str(daemon.world.tmp_path / "events.db")
    status, local, err = cli(capsys, "events", "--db", db, "--type", "engine.ready")
    assert status == 0, err
    assert local == out
    for width in ("80", "100"):
        with pytest.MonkeyPatch.context() as env:
            env.setenv("COLUMNS", width)
            _, narrow, _ = cli(capsys, "events", "--url", daemon.url)
            _, narrow_local, _ = cli(capsys, "events", "--db", db)
        assert narrow == narrow_local
        assert all(len(line) <= int(width) for line in narrow.splitlines())
        header = ["SEQ", "STREAM", "TYPE", "DETAILS"] if width == "80" else ["SEQ", "TIME"]
        assert narrow.splitlines()[0].split()[: len(header)] == header
        assert "engine/llamacpp:alpha:0 " in narrow  # a stream id is not cut at 80
    status, out, err = cli(capsys, "events", "--url", daemon.url, "--limit", "1", "--json")
    assert status == 0 and len(out.splitlines()) == 1
    status, _, err = cli(capsys, "events", "--url", daemon.url, "--tail", "3")
    assert status == 2 and "--tail: only for the log file itself" in err


def test_errors_are_one_line(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = cli(capsys, "load", "nothing", "--url", daemon.url, "--token", TOKEN)
    assert status == 1 and out == ""
    assert err.startswith("hostler: error [daemon.refused]: ")
    assert "404: model 'nothing' is not configured here" in err and err.count("\n") == 1
    status, _, err = cli(capsys, "unload", "llamacpp:alpha:0", "--url", daemon.url, "--token", "x")
    assert status == 1 and "401" in err and err.count("\n") == 1
    status, _, err = cli(capsys, "ps", "--url", "not a url")
    assert status == 2
    assert err.startswith("hostler: error [usage.invalid]: hostler ps: argument --url: ")
    assert err.count("\n") == 1
    status, _, err = cli(capsys, "models", "--url", "http://127.0.0.1:9")
    assert status == 1
    assert err.startswith("hostler: error [daemon.unreachable]: no hostler serve answers")
    status, _, err = cli(capsys, "preview", "alpha", "--url", daemon.url, "--ctx", "512")
    assert status == 2 and "--ctx: only for a local preview" in err
    status, _, err = cli(capsys, "budget", "--url", daemon.url, "--ledger", "/tmp/x.db")
    assert status == 2 and "--ledger reads this host's ledger" in err


def test_an_empty_daemon_lists_nothing_plainly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with daemon_of(tmp_path, {}) as empty:
        status, out, _ = cli(capsys, "ps", "--url", empty.url)
        assert status == 0
        assert out.splitlines()[0].split()[:3] == ["KEY", "MODEL", "STATE"]
        assert "(no engines: the daemon serves no model yet)" in out
        status, out, _ = cli(capsys, "ps", "--url", empty.url, "--json")
        assert json.loads(out)["engines"] == []
        status, out, _ = cli(capsys, "models", "--url", empty.url, "--json")
        assert status == 0 and json.loads(out) == []
        status, out, _ = cli(capsys, "models", "--url", empty.url)
        assert out.splitlines()[0].split() == list(MODELS_HEADERS)
        assert "(no models: " in out


def test_plugins_is_a_table_with_pinned_columns(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = cli(capsys, "plugins")
    assert status == 0
    assert PLUGINS_HEADERS == ("PLUGIN", "VERSION", "STATUS", "ENGINES / ERROR")
    assert out.splitlines()[0].split() == ["PLUGIN", "VERSION", "STATUS", "ENGINES", "/", "ERROR"]
    assert any(line.split()[0] == "llamacpp" for line in out.splitlines()[1:])


def test_ps_rows_say_when_and_why_from_the_daemons_fields() -> None:
    base = {
        "key": "llamacpp:alpha:0",
        "state": "running",
        "bytes": 5 * 2**20,
        "pid": 7,
        "busy": False,
        "state_since": 1000.0,
        "idle_deadline": 1240.0,
        "last_reason": None,
        "reserved_bytes": None,
        "measured_bytes": None,
        "lease": {"slot": "llm", "holder": "chat"},
        "slots": 1,
    }
    queues = {"llamacpp:alpha:0": {"running": 1, "width": 2, "pending": [{}, {}]}}

    def row(**changes: Any) -> dict[str, str]:
        engines = {"now": 1060.0, "engines": [{**base, **changes}]}
        return dict(zip(PS_HEADERS, ps_rows(engines, queues)[0], strict=True))

    first = row()
    assert first["FOR"] == "60s" and first["IDLE STOP"] == "in 3m"
    assert first["RESERVED"] == "5.0 MiB"  # no reservation event known: what is held
    assert first["MEASURED"] == "-" and first["REASON"] == "-"
    assert first["SLOTS"] == "1/1" and first["QUEUED"] == "2" and first["LEASE"] == "chat"
    assert row(slots=4)["SLOTS"] == "1/4"  # as launched, whatever the queue's width
    assert row(slots=None)["SLOTS"] == "-"  # no process: no slots
    assert row(idle_deadline=1060.0)["IDLE STOP"] == "due"
    assert row(idle_deadline=1061.0)["IDLE STOP"] == "in 1s"
    assert row(busy=True)["IDLE STOP"] == "busy"
    assert row(idle_deadline=None)["IDLE STOP"] == "-"
    assert row(lease={"slot": "image", "holder": "comfy"})["LEASE"] == "image:comfy"
    assert row(lease=None)["LEASE"] == "-"
    assert row(state_since=None)["FOR"] == "-"
    assert row(reserved_bytes=2**30, measured_bytes=2**29)["RESERVED"] == "1.0 GiB"
    assert row(reserved_bytes=2**30, measured_bytes=2**29)["MEASURED"] == "512.0 MiB"
    assert row(bytes=0, reserved_bytes=None)["RESERVED"] == "-"
    assert row(pid=None)["PID"] == "-"
    empty = ps_rows({"now": 1.0, "engines": [{**base, "key": "llamacpp:beta:0"}]}, {})
    assert dict(zip(PS_HEADERS, empty[0], strict=True))["SLOTS"] == "0/1"  # no queue yet


@pytest.mark.anyio
async def test_engine_details_give_the_idle_deadline_and_the_lease(tmp_path: Path) -> None:
    with world_at(tmp_path) as world:
        engine = BallastEngine(tmp_path, 1)

        def build(key: str) -> Supervisor:
            run = tmp_path / "run" / key.replace(":", "_")
            return Supervisor(
                key,
                engine,
                lambda port: LaunchSpec(key, world.model, port, ctx_per_slot=512, slots=1),
                world.store,
                run_dir=run,
                token_prefix=world.token,
                policy=SupervisorPolicy(watch_interval=0.05, idle_timeout=300),
                ledger=world.ledger,
                footprint=lambda: PRICE,
            )

        runtime = hostler.Runtime(
            world.store, build, ledger=world.ledger, pinned=["llamacpp:beta:0"]
        )
        async with runtime:
            assert await runtime.report.engine_details() == {}
            key = await runtime.one_shot("llamacpp", "alpha")
            async with runtime.request(key):
                pass
            sup = runtime.pool.supervisor(key)
            details = (await runtime.report.engine_details())[key]
            assert details["idle_deadline"] == sup.last_used + 300
            assert details["state_since"] == sup.engine.changed_at
            assert details["last_reason"] == "started (one-shot)"
            assert details["reserved_bytes"] == PRICE and details["measured_bytes"] > 0
            assert details["lease"] is None
            with anyio.fail_after(20):  # the pinned engine is started by the pool, and kept
                while runtime.pool.supervisor("llamacpp:beta:0").state != "running":
                    await anyio.sleep(0.05)
            pinned = (await runtime.report.engine_details())["llamacpp:beta:0"]
            assert pinned["idle_deadline"] is None and pinned["state_since"] is not None
            runtime.arbiter.set_policy("swap")
            release = await runtime.arbiter.acquire_lease("image", "comfy")  # evicts the llm engine
            details = (await runtime.report.engine_details())[key]
            assert details["lease"] == {"slot": "image", "holder": "comfy"}
            assert details["idle_deadline"] is None  # stopped: nothing to idle-stop
            assert details["reserved_bytes"] is None and details["measured_bytes"] is None
            assert details["last_reason"] == "evicted"
            await release()
            assert (await runtime.report.engine_details())[key]["lease"] is None


def test_events_follow_prints_new_events_as_the_daemon_writes_them(
    daemon: Daemon, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["events", "--url", daemon.url, "-f", "--type", "engine.ready", "--json"]
    with subprocess.Popen(
        [sys.executable, "-c", "import sys; from hostler.cli import main; sys.exit(main())", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as follower:
        try:
            time.sleep(0.5)  # following before anything is ready
            load(capsys, daemon, "beta")
            assert follower.stdout is not None
            ready, _, _ = select.select([follower.stdout], [], [], 30)
            assert ready, "no event within 30 s"
            event = json.loads(follower.stdout.readline())
            assert (event["type"], event["stream"]) == ("engine.ready", "engine/llamacpp:beta:0")
            assert follower.poll() is None  # still following
        finally:
            follower.kill()


def test_hostler_url_points_budget_and_events_at_the_daemon(
    daemon: Daemon, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOSTLER_URL", daemon.url)
    status, out, err = cli(capsys, "budget", "--json")
    assert status == 0, err
    assert json.loads(out)["budget"] == 2**30  # the daemon's ledger, not this host's
    status, out, err = cli(capsys, "events", "--type", "ledger.budget_set", "--json")
    assert status == 0, err
    assert [json.loads(line)["payload"] for line in out.splitlines()] == [
        {"budget": 2**30, "source": "api"}  # ledger.budget_set v2: where it was set
    ]
    monkeypatch.setenv("HOSTLER_URL", "not a url")
    status, _, err = cli(capsys, "ps")
    assert status == 2 and err.startswith("hostler: error [usage.setting]: HOSTLER_URL: ")


def test_the_token_comes_from_the_flag_then_hostler_token_then_the_file(
    daemon: Daemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import argparse

    from hostler.cli.client import token_of
    from hostler.errors import SettingError

    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "token").write_text(TOKEN + "\n")  # the token the daemon holds
    port = daemon.url.rsplit(":", 1)[1]
    args = argparse.Namespace(token=None, data_dir=folder, url=None)
    monkeypatch.delenv("HOSTLER_TOKEN", raising=False)
    monkeypatch.delenv("HOSTLER_URL", raising=False)
    assert token_of(args) is None  # no address file: whose token it is, is unknown
    (folder / "address").write_text(f"http://127.0.0.1:{port}\n")
    assert token_of(args) == TOKEN  # the address file's URL, whose daemon holds the token
    elsewhere = argparse.Namespace(token=None, data_dir=folder, url=f"http://127.0.0.2:{port}")
    assert token_of(elsewhere) is None  # the file's token never goes to another address
    other_port = argparse.Namespace(token=None, data_dir=folder, url="http://127.0.0.1:9")
    assert token_of(other_port) is None
    same = argparse.Namespace(token=None, data_dir=folder, url=f"http://localhost:{port}/")
    assert token_of(same) == TOKEN
    monkeypatch.setenv("HOSTLER_TOKEN", "e" * 32)  # 32: the shortest token
    assert token_of(args) == "e" * 32
    assert token_of(argparse.Namespace(token="x" * 40, data_dir=folder, url=None)) == "x" * 40
    monkeypatch.setenv("HOSTLER_TOKEN", "e" * 31)
    with pytest.raises(SettingError) as refused:
        token_of(args)
    assert "e" * 31 not in refused.value.message  # a secret is never echoed
    monkeypatch.setenv("HOSTLER_TOKEN", "")  # empty counts as unset
    assert token_of(args) == TOKEN


_GARBAGE = {
    "a JSON list": b"[1, 2, 3]",
    "nulls": b'{"engines": null, "queues": null, "data": null}',
    "wrong types": b'{"engines": ["x"], "sessions": {}, "ledger": {}, "now": "x", "last_seq": "y"}',
    "engines without fields": b'{"engines": [{"key": 5}], "now": 1, "last_seq": 1, "data": [5]}',
}


@contextlib.contextmanager
def garbage_daemon(body: bytes) -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def answer(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_DELETE = answer

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


#: (command, garbage) pairs that print a traceback today (the rest answer in one line)
_TRACEBACKS = [
    (("ps",), "a JSON list"),
    (("ps",), "engines without fields"),
    (("ps",), "nulls"),
    (("ps",), "wrong types"),
    (("models",), "a JSON list"),
    (("models",), "engines without fields"),
    (("events",), "a JSON list"),
    (("events",), "wrong types"),
    (("load", "alpha"), "a JSON list"),
    (("load", "alpha"), "engines without fields"),
    (("load", "alpha"), "nulls"),
    (("load", "alpha"), "wrong types"),
    (("unload", "llamacpp:alpha:0"), "a JSON list"),
    (("unload", "llamacpp:alpha:0"), "engines without fields"),
    (("unload", "llamacpp:alpha:0"), "nulls"),
    (("unload", "llamacpp:alpha:0"), "wrong types"),
    (("preview", "alpha"), "a JSON list"),
    (("preview", "alpha"), "engines without fields"),
    (("preview", "alpha"), "wrong types"),
]


@pytest.mark.parametrize(
    ("command", "garbage"), _TRACEBACKS, ids=lambda v: " ".join(v) if isinstance(v, tuple) else v
)
def test_the_cli_against_a_daemon_that_answers_garbage_is_one_line(
    tmp_path: Path, garbage: str, command: tuple[str, ...]
) -> None:
    """Promised: "a mistake is one line naming the cause, never a traceback" (README), and for
    the client commands "A daemon that is not there is one line, exit 1; so is an error answer"
    (docs/serve.md).

    Instead: a daemon (or anything else on the port) that answers 200 with JSON of the wrong
    shape makes ``hostler ps`` / ``models`` / ``events`` / ``load`` / ``unload`` / ``preview``
    print a Python traceback, e.g. ``AttributeError: 'list' object has no attribute 'get'``
    (cli/ps.py line 62), ``KeyError: 'model'`` (cli/load.py line 152), ``ValueError: invalid
    literal for int() with base 10: 'y'`` (cli/remote_events.py line 49).
    """
    with garbage_daemon(_GARBAGE[garbage]) as url:
        result = run_cli(
            *command,
            "--url",
            url,
            "--token",
            "x" * 40,
            env={"HOSTLER_HOME": str(tmp_path)},
            timeout=30,
        )
    assert "Traceback" not in result.stderr, result.stderr[-600:]


def test_budget_set_against_garbage_does_not_report_success(tmp_path: Path) -> None:
    """Promised: ``hostler budget --set`` changes the budget live and an error answer is one line,
    exit 1 (docs/serve.md).

    Instead: against a daemon whose answer is not a budget (``{"engines": null, ...}``) it
    exits 0 and prints ``budget     - (automatic; automatic would be -)`` as if the change took.
    """
    with garbage_daemon(_GARBAGE["nulls"]) as url:
        result = run_cli(
            "budget",
            "--set",
            "2G",
            "--url",
            url,
            "--token",
            "x" * 40,
            env={"HOSTLER_HOME": str(tmp_path)},
            timeout=30,
        )
    assert result.returncode != 0, result.stdout


def test_the_cli_does_not_hand_the_local_token_to_any_url(tmp_path: Path) -> None:
    """Promised: the token guards this machine's daemon; it is "stored 0600" and "the token's
    value is never echoed" (docs/serve.md) — a secret that stays with the daemon it belongs to.

    Instead: every client command reads ``DATA_DIR/token`` and sends it as ``Authorization:
    Bearer <token>`` to whatever ``--url`` / ``$HOSTLER_URL`` names, even for a read
    (``hostler ps``, which needs no token on loopback) and over plain ``http://`` to another
    host. A mistyped or planted ``HOSTLER_URL`` hands the local daemon's secret to a stranger.
    """
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    secret = "s" * 43
    (data / "token").write_text(secret + "\n")
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("authorization", ""))
            body = b'{"engines": [], "sessions": {}, "ledger": {}, "now": 1, "last_seq": 0}'
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.2", 0), Handler)  # "another host"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.2:{server.server_address[1]}"
        run_cli("ps", "--url", url, "--data-dir", str(data), timeout=30)
    finally:
        server.shutdown()
        server.server_close()
    assert seen, "the CLI never called"
    assert not any(secret in header for header in seen), seen


def test_a_401s_source_names_what_the_data_directory_holds(tmp_path: Path) -> None:
    """No token file, a token but no address file, another daemon's address, its own: each
    says what was sent and why (a breaking helper saw "no token file" beside a token)."""
    import argparse

    from hostler.cli.client import credential_of

    url = "http://127.0.0.1:11999"
    args = argparse.Namespace(data_dir=tmp_path, token=None, url=url)
    env = {k: v for k, v in os.environ.items() if k != "HOSTLER_TOKEN"}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "environ", env)
        assert credential_of(args).source == f"no token: {tmp_path} holds no token file"
        (tmp_path / "token").write_text("t" * 40)
        assert credential_of(args).source == (
            f"no token: {tmp_path} holds a token but no address file (a hostler serve of this "
            "data directory writes it at start), so its token is sent nowhere"
        )
        (tmp_path / "address").write_text("http://127.0.0.1:12000\n")
        assert credential_of(args).source == (
            f"no token: {tmp_path}'s daemon listens at http://127.0.0.1:12000"
        )
        (tmp_path / "address").write_text(f"{url}\n")  # but nothing answers there
        assert credential_of(args).token is None


def test_a_stale_address_never_sends_the_token_to_another_daemon(
    daemon: Daemon, tmp_path: Path
) -> None:
    """A data directory's address file left by a stopped daemon, whose port another daemon
    (another data directory's) now holds: the token goes only where ``GET /health`` says it is
    held (a breaking helper's d1 token reached d2's daemon)."""
    import argparse

    from hostler.cli.client import credential_of

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "address").write_text(f"{daemon.url}\n")
    args = argparse.Namespace(data_dir=mine, token=None, url=None)
    env = {k: v for k, v in os.environ.items() if k not in ("HOSTLER_TOKEN", "HOSTLER_URL")}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "environ", env)
        (mine / "token").write_text("o" * 43)  # not the token this daemon holds
        refused = credential_of(args)
        assert refused.token is None
        assert refused.source.startswith(
            f"no token: the hostler serve at {daemon.url} does not hold {mine}'s token"
        )
        (mine / "token").write_text(TOKEN)  # its own daemon's
        assert credential_of(args).token == TOKEN


def test_a_client_command_finds_the_data_directorys_daemon(tmp_path: Path) -> None:
    """After ``hostler serve --port 0``, ``hostler ps`` needs no ``--url`` (DATA_DIR/address);
    budget, preview and events stay local unless told (a breaking helper's first hour)."""
    import argparse

    from hostler.address import DEFAULT_URL
    from hostler.cli.client import daemon_url

    args = argparse.Namespace(data_dir=tmp_path, url=None)
    env = {k: v for k, v in os.environ.items() if k != "HOSTLER_URL"}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "environ", env)
        assert daemon_url(args) == DEFAULT_URL  # no address file
        (tmp_path / "address").write_text("http://127.0.0.1:40123\n")
        assert daemon_url(args) == "http://127.0.0.1:40123"
        assert daemon_url(args, default=None) is None  # a local command stays local
        (tmp_path / "address").write_bytes(b"\xff not a url")
        assert daemon_url(args) == DEFAULT_URL
        env["HOSTLER_URL"] = "http://127.0.0.1:40999"
        assert daemon_url(args) == "http://127.0.0.1:40999"
