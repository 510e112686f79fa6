"""The ``hostler`` command line, run as real processes on real logs."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hostler
from hostler import Engine, EventStore, commit
from hostler.cli import main

from _support import REPO, Note, run_cli


@pytest.fixture(scope="module")
def demo_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("home")
    result = run_cli("demo", "--scripted", "--data-dir", str(data))
    assert result.returncode == 0, result.stderr
    assert "demo event log:" in result.stdout
    assert "engine.crashed" in result.stdout
    assert "ENGINES" in result.stdout and "stop_reason=idle" in result.stdout
    return data / "demo" / "events.db"


def _json_lines(*args: str) -> list[dict[str, object]]:
    result = run_cli("events", *args, "--json")
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_demo_writes_a_replayable_log(demo_log: Path) -> None:
    with EventStore.open(demo_log) as store:
        assert store.count() == 17
    rows = _json_lines("--db", str(demo_log))
    assert [r["seq"] for r in rows] == list(range(1, 18))
    assert rows[0]["type"] == "reservation.requested"
    assert rows[0]["metadata"]["actor"] == "demo"  # type: ignore[index]


def test_demo_can_run_again(tmp_path: Path) -> None:
    for _ in range(2):
        result = run_cli("demo", "--scripted", "--data-dir", str(tmp_path))
        assert result.returncode == 0, result.stderr
    with EventStore.open(tmp_path / "demo" / "events.db") as store:
        assert store.count() == 17


def test_events_table(demo_log: Path) -> None:
    result = run_cli("events", "--db", str(demo_log))
    lines = result.stdout.splitlines()
    assert lines[0].split()[:4] == ["SEQ", "RECORDED", "(UTC)", "STREAM"]
    assert len(lines) == 18
    crash = next(line for line in lines if "engine.crashed" in line)
    assert "running→backoff" in crash and "signal=9" in crash


def test_events_filters(demo_log: Path) -> None:
    db = ("--db", str(demo_log))
    assert {r["type"] for r in _json_lines(*db, "--type", "engine.crashed")} == {"engine.crashed"}
    both = _json_lines(*db, "--type", "engine.crashed", "--type", "reservation.denied")
    assert [r["type"] for r in both] == ["reservation.denied", "engine.crashed"]
    leases = _json_lines(*db, "--stream", "lease/llm-1")
    assert [r["version"] for r in leases] == [1, 2, 3]
    engines = _json_lines(*db, "--stream-prefix", "engine/")
    assert len(engines) == 9
    assert [r["seq"] for r in _json_lines(*db, "--tail", "2")] == [16, 17]
    assert [r["seq"] for r in _json_lines(*db, "--limit", "2")] == [1, 2]
    assert [r["seq"] for r in _json_lines(*db, "--after-seq", "15")] == [16, 17]
    assert len(_json_lines(*db, "--since", "1h")) == 17
    assert _json_lines(*db, "--until", "1h") == []
    future = run_cli("events", *db, "--since", "2999-01-01T00:00:00")
    assert future.returncode == 0
    assert future.stdout == "" and "no events match" in future.stderr


def test_state_as_of_a_seq(demo_log: Path) -> None:
    result = run_cli("state", "--db", str(demo_log), "--until-seq", "9")
    assert result.returncode == 0, result.stderr
    assert "as of seq 9" in result.stdout
    engine_line = next(
        line for line in result.stdout.splitlines() if "smollm2" in line and "v3" in line
    )
    assert "running" in engine_line
    now = json.loads(run_cli("state", "--db", str(demo_log), "--json").stdout)
    assert now["Engine"]["llamacpp:smollm2-135m:0"]["state"] == "stopped"
    assert now["Reservation"]["llamacpp:qwen2.5-14b:0"]["denial_reason"] == "budget"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("events", "--since", "yesterday-ish"), "time 'yesterday-ish': use ISO-8601"),
        (("events", "--limit", "0"), "--limit: 0 is out of range: use a whole number from 1"),
        (("events", "--follow", "--until", "1h"), "contradict"),
    ],
)
def test_usage_errors_are_one_line(demo_log: Path, args: tuple[str, ...], message: str) -> None:
    result = run_cli(*args, "--db", str(demo_log))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("hostler: error [usage.invalid]: ")
    assert message in result.stderr


def test_missing_log_is_not_created_by_readers(tmp_path: Path) -> None:
    result = run_cli("events", "--data-dir", str(tmp_path))
    assert result.returncode == 1
    assert f"{tmp_path / 'events.db'}: no event log here yet" in result.stderr
    assert not (tmp_path / "events.db").exists()


def test_follow_prints_new_events_as_they_land(tmp_path: Path) -> None:
    log = tmp_path / "events.db"
    with EventStore.open(log, owner=True) as store:
        store.append("s/a", [Note("first")], expected_version=0)
        follower = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from hostler.cli import main; sys.exit(main())",
                "events",
                "--db",
                str(log),
                "--json",
                "--follow",
                "--interval",
                "0.05",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO / "tests",
        )
        try:
            assert follower.stdout is not None
            assert json.loads(follower.stdout.readline())["payload"]["text"] == "first"
            engine = Engine("e:1:0")
            engine.fire("start", at=time.time(), cause="request")
            commit(store, engine)
            line = json.loads(follower.stdout.readline())
            assert line["type"] == "engine.start_requested"
            assert line["stream_id"] == "engine/e:1:0"
        finally:
            follower.terminate()
            follower.communicate(timeout=10)


def test_version_flag() -> None:
    result = run_cli("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("hostler 0.")


def test_the_live_demo_runs_a_real_engine(tmp_path: Path) -> None:
    result = run_cli("demo", "--data-dir", str(tmp_path), timeout=120)
    assert result.returncode == 0, result.stderr
    assert "ready on 127.0.0.1:" in result.stdout
    assert "it answered" in result.stdout
    assert "every reservation released" in result.stdout
    with EventStore.open(tmp_path / "demo" / "events.db") as store:
        types = [r.type for r in store.read_all()]
    assert types == [
        "engine.start_requested",
        "engine.spawned",
        "engine.ready",
        "engine.crashed",
        "engine.start_requested",
        "engine.spawned",
        "engine.ready",
        "engine.stop_requested",
        "engine.stopped",
    ]


def test_python_dash_m_hostler_is_the_cli() -> None:
    """``python -m hostler`` runs the CLI (a venv without the console script), exit codes too."""
    run = functools.partial(subprocess.run, capture_output=True, text=True, timeout=60)
    shown = run([sys.executable, "-m", "hostler", "--version"])
    assert (shown.returncode, shown.stdout.strip()) == (0, f"hostler {hostler.__version__}")
    wrong = run([sys.executable, "-m", "hostler", "nosuch"])
    assert wrong.returncode == 2
    assert wrong.stderr.startswith("hostler: error [usage.invalid]: ")
    assert len(wrong.stderr.strip().splitlines()) == 1


def test_an_interrupt_while_a_command_loads_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: a KeyboardInterrupt traceback when Ctrl-C came while the command's module loaded."""
    import importlib

    def interrupted(name: str) -> object:
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib, "import_module", interrupted)
    assert main(["state"]) == 130
    assert capsys.readouterr().err == "hostler: interrupted\n"
