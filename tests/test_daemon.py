"""The daemon as a real process: restart = replay + reconcile (adopt, lose, reap)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from hostler import EventStore, replay
from hostler.engines.reconcile import DAEMON_STREAM
from hostler.engines.supervisor import free_port
from hostler.testing.tiny_gguf import TinyModel, write_tiny_llama
from hostler_llamacpp.binary import find_llama_server

from _support import REPO

KEYS = ("llamacpp:alpha:0", "llamacpp:beta:0")


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    models = tmp_path / "models"
    models.mkdir()
    write_tiny_llama(models / "alpha.gguf", TinyModel(seed=1))
    write_tiny_llama(models / "beta.gguf", TinyModel(seed=2))
    config = tmp_path / "hostler.toml"
    config.write_text(
        '[daemon]\nidle_timeout = 0\nhealth_interval = 5\nledger = "ledger.db"\n'
        + "".join(
            f'\n[[engines]]\nkey = "{key}"\nmodel = "models/{key.split(":")[1]}.gguf"\nctx = 512\n'
            for key in KEYS
        )
    )
    data = tmp_path / "data"
    yield config, data
    # nothing of this data directory may be left running, whatever happened
    id_file = data / "daemon-id"
    prefix = id_file.read_text().strip() + ":" if id_file.exists() else None
    for process in psutil.process_iter(["pid"]):
        try:
            token = process.environ().get("HOSTLER_LAUNCH_TOKEN", "")
        except (psutil.Error, OSError):
            continue
        if prefix and token.startswith(prefix):
            process.kill()


def start_daemon(config: Path, data: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from hostler.cli import main; sys.exit(main())",
                "daemon",
                "--config",
                str(config),
                "--data-dir",
                str(data),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO / "tests",
        )


def wait_for(predicate, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("timed out")


def events(data: Path, stream: str | None = None) -> list[tuple[str, str, dict]]:  # type: ignore[type-arg]
    path = data / "events.db"
    if not path.exists():
        return []
    with EventStore.open(path) as store:
        return [
            (r.stream_id, r.type, r.payload)
            for r in store.read_all(streams=[stream] if stream else None)
        ]


def count(data: Path, key: str, kind: str) -> int:
    return sum(1 for stream, t, _ in events(data) if stream == f"engine/{key}" and t == kind)


def engines(data: Path) -> dict[str, tuple[str, int | None, int | None]]:
    with EventStore.open(data / "events.db") as store:
        world = replay(store)
    return {
        key: (e.state, e.pid, int(e.identity["port"]) if e.identity else None)
        for key, e in world.engines.items()
    }


def alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def chat(port: int) -> str:
    body = json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "temperature": 0, "max_tokens": 4}
    ).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return str(json.loads(response.read())["choices"][0]["message"]["content"])


def daemon_starts(data: Path) -> list[dict]:  # type: ignore[type-arg]
    return [p for _, t, p in events(data, DAEMON_STREAM) if t == "daemon.started"]


def test_a_killed_daemons_engines_are_adopted_without_reload(
    setup: tuple[Path, Path], tmp_path: Path
) -> None:
    config, data = setup
    first = start_daemon(config, data, tmp_path / "daemon1.log")
    try:
        wait_for(lambda: all(count(data, k, "engine.ready") == 1 for k in KEYS))
        before = engines(data)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert all(alive(pid) for _, pid, _ in before.values()), "engines must outlive the daemon"
        second = start_daemon(config, data, tmp_path / "daemon2.log")
        try:
            wait_for(lambda: len(daemon_starts(data)) == 2)
            started = daemon_starts(data)[-1]
            assert sorted(started["adopted"]) == sorted(KEYS)
            assert started["lost"] == [] and started["reaped"] == []
            after = engines(data)
            for key in KEYS:
                assert after[key][0] == "running"
                assert after[key][1] == before[key][1]  # same pid: adopted, not reloaded
                assert count(data, key, "engine.spawned") == 1
                assert count(data, key, "engine.adopted") == 1
                assert chat(after[key][2])  # type: ignore[arg-type]
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(30)
        for key in KEYS:
            assert not alive(before[key][1]), "a clean shutdown stops the engines"
            assert engines(data)[key][0] == "stopped"
        assert any(t == "daemon.stopped" for _, t, _ in events(data, DAEMON_STREAM))
    finally:
        for proc in (first,):
            if proc.poll() is None:
                proc.kill()


def test_an_engine_killed_while_the_daemon_was_down_is_lost_and_released(
    setup: tuple[Path, Path], tmp_path: Path
) -> None:
    config, data = setup
    first = start_daemon(config, data, tmp_path / "daemon1.log")
    wait_for(lambda: all(count(data, k, "engine.ready") == 1 for k in KEYS))
    before = engines(data)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    victim, survivor = KEYS
    os.kill(before[victim][1], signal.SIGKILL)  # type: ignore[arg-type]
    wait_for(lambda: not alive(before[victim][1]))
    second = start_daemon(config, data, tmp_path / "daemon2.log")
    try:
        wait_for(lambda: len(daemon_starts(data)) == 2)
        started = daemon_starts(data)[-1]
        assert started["lost"] == [victim]
        assert started["adopted"] == [survivor]
        lost = [p for s, t, p in events(data) if s == f"engine/{victim}" and t == "engine.lost"]
        assert lost and "exited" in lost[0]["cause"]
        with EventStore.open(tmp_path / "ledger.db") as ledger:
            released = [r.payload for r in ledger.read_all() if r.type == "ledger.released"]
        assert any(r["key"] == victim for r in released)
        # the lost engine is autostarted again by the new daemon (a fresh spawn)
        wait_for(lambda: count(data, victim, "engine.ready") == 2)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(30)


def test_a_stray_with_our_token_is_reaped_and_a_stranger_is_never_touched(
    setup: tuple[Path, Path], tmp_path: Path
) -> None:
    config, data = setup
    data.mkdir(parents=True)
    (data / "daemon-id").write_text("hostler-teststray\n")
    model = tmp_path / "models" / "alpha.gguf"
    binary = str(find_llama_server())

    def launch(env_token: str | None) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env.pop("HOSTLER_LAUNCH_TOKEN", None)
        if env_token:
            env["HOSTLER_LAUNCH_TOKEN"] = env_token
        return subprocess.Popen(
            [
                binary,
                "-m",
                str(model),
                "--host",
                "127.0.0.1",
                "--port",
                str(free_port()),
                "-c",
                "256",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )

    stray = launch("hostler-teststray:leftover")
    stranger = launch(None)  # the same binary and model, but not ours
    other_daemons = launch("hostler-someoneelse:abc")  # another data directory's engine
    daemon = start_daemon(config, data, tmp_path / "daemon.log")
    try:
        wait_for(lambda: len(daemon_starts(data)) == 1)
        assert daemon_starts(data)[0]["reaped"] == [stray.pid]
        wait_for(lambda: stray.poll() is not None)
        assert stranger.poll() is None
        assert other_daemons.poll() is None
        reaped = [p for _, t, p in events(data, DAEMON_STREAM) if t == "daemon.reaped"]
        assert reaped[0]["launch_token"] == "hostler-teststray:leftover"
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
        for proc in (stray, stranger, other_daemons):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_bad_engine_is_recorded_and_the_daemon_stays_up(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path / "good.gguf")
    config = tmp_path / "hostler.toml"
    config.write_text(
        '[daemon]\nidle_timeout = 0\nledger = "ledger.db"\n'
        '\n[[engines]]\nkey = "llamacpp:missing:0"\nmodel = "nope.gguf"\nctx = 512\n'
        '\n[[engines]]\nkey = "llamacpp:good:0"\nmodel = "good.gguf"\nctx = 512\n'
    )
    data = tmp_path / "data"
    daemon = start_daemon(config, data, tmp_path / "daemon.log")
    try:
        wait_for(lambda: count(data, "llamacpp:good:0", "engine.ready") == 1)
        failed = [
            p
            for s, t, p in events(data)
            if s == "engine/llamacpp:missing:0" and t == "engine.failed"
        ]
        assert failed
        assert failed[0]["error"] == f"{tmp_path / 'nope.gguf'}: no such model file"
        assert daemon.poll() is None  # still up
        samples = [p for _, t, p in events(data, "device/host") if t == "device.sampled"]
        assert len(samples) == 1  # the observation the budget came from
        assert samples[0]["system_ram"] > 0
        log = (tmp_path / "daemon.log").read_text()
        assert "nope.gguf: no such model file" in log
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
        assert daemon.returncode == 0


def test_config_errors_are_one_line(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[[engines]]\nkey = "not a key"\nmodel = "x.gguf"\n')
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from hostler.cli import main; sys.exit(main())",
            "daemon",
            "--config",
            str(config),
            "--data-dir",
            str(tmp_path / "d"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO / "tests",
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"hostler: error [usage.invalid]: {config}: engines[0]: key 'not a key' must look like engine:model:replica"
    )
