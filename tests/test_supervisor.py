"""The supervisor with the real llama-server: start, serve, idle stop, crashes, budget, stops."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import time
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from hostler import Engine, EventStore, load
from hostler.engines.runner import OsProcess
from hostler.engines.supervisor import Supervisor, SupervisorPolicy
from hostler.errors import EngineBinaryError, EngineStartError, RestartBudgetError
from hostler.machines.engine import EngineCrashed, EngineFailed, StopReason
from hostler.plugin import LaunchSpec
from hostler.testing.tiny_gguf import write_tiny_llama
from hostler_llamacpp import LlamaCppAdapter

pytestmark = pytest.mark.anyio
KEY = "llamacpp:tiny:0"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny.gguf")


def make(store: EventStore, model: Path, tmp_path: Path, **policy: Any) -> Supervisor:
    extra = policy.pop("extra_args", {})
    pressure = policy.pop("pressure", None)
    return Supervisor(
        KEY,
        LlamaCppAdapter(),
        lambda port: LaunchSpec(
            KEY, model, port, ctx_per_slot=512, slots=1, work_dir=tmp_path, extra_args=extra
        ),
        store,
        run_dir=tmp_path / "run",
        token_prefix="test",
        policy=SupervisorPolicy(**{"watch_interval": 0.05, **policy}),
        pressure=pressure,
    )


def chat(port: int, n: int = 8) -> dict[str, Any]:
    body = json.dumps(
        {"messages": [{"role": "user", "content": "hello"}], "temperature": 0, "max_tokens": n}
    ).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


async def wait_state(sup: Supervisor, state: str, within: float = 10) -> None:
    """Wait until the supervisor's watcher has moved the engine to ``state``."""
    with anyio.fail_after(within):
        while sup.state != state:
            await anyio.sleep(0.05)


def types_of(store: EventStore) -> list[str]:
    return [r.type for r in store.read_stream(f"engine/{KEY}")]


async def test_spawn_ready_completion_then_idle_stop(
    store: EventStore, tiny: Path, tmp_path: Path
) -> None:
    sup = make(store, tiny, tmp_path, idle_timeout=1.0)
    async with sup.request() as port:
        pid = sup.pid
        assert pid is not None
        reply = await anyio.to_thread.run_sync(chat, port)
        assert reply["choices"][0]["message"]["content"]
        again = await anyio.to_thread.run_sync(chat, port)
        assert (
            again["choices"][0]["message"]["content"] == reply["choices"][0]["message"]["content"]
        )
    assert psutil.Process(pid).environ()["HOSTLER_LAUNCH_TOKEN"].startswith("test:")
    async with anyio.create_task_group() as tg:
        tg.start_soon(sup.watch)
        await wait_state(sup, "stopped")
        tg.cancel_scope.cancel()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert types_of(store) == [
        "engine.start_requested",
        "engine.spawned",
        "engine.ready",
        "engine.stop_requested",
        "engine.stopped",
    ]
    assert load(store, Engine, KEY).stop_reason == "idle"


async def test_busy_engine_is_not_idle_stopped(
    store: EventStore, tiny: Path, tmp_path: Path
) -> None:
    sup = make(store, tiny, tmp_path, idle_timeout=0.3)
    async with anyio.create_task_group() as tg:
        tg.start_soon(sup.watch)
        async with sup.request():
            await anyio.sleep(1.0)
            assert sup.state == "running"
        await wait_state(sup, "stopped")
        tg.cancel_scope.cancel()


async def test_sigkilled_engine_records_a_crash_and_restarts_on_the_next_request(
    store: EventStore, tiny: Path, tmp_path: Path
) -> None:
    sup = make(store, tiny, tmp_path)
    await sup.ensure_running()
    first = sup.pid
    assert first is not None
    async with anyio.create_task_group() as tg:
        tg.start_soon(sup.watch)
        os.kill(first, signal.SIGKILL)
        await wait_state(sup, "backoff")
        tg.cancel_scope.cancel()
    crash = next(r.event for r in store.read_stream(f"engine/{KEY}") if r.type == "engine.crashed")
    assert isinstance(crash, EngineCrashed)
    assert crash.signal == signal.SIGKILL
    assert crash.reached_ready
    assert "llama" in crash.output_tail or "srv" in crash.output_tail
    assert crash.uptime is not None and crash.uptime > 0
    async with sup.request() as port:
        assert sup.pid != first
        reply = await anyio.to_thread.run_sync(chat, port)
        assert reply["choices"]
    await sup.stop()


async def test_a_corrupt_model_fails_readiness_at_once_with_the_engines_own_line(
    store: EventStore, tmp_path: Path
) -> None:
    bad = tmp_path / "corrupt.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 4096)
    sup = make(store, bad, tmp_path, startup_timeout=120)
    with pytest.raises(EngineStartError) as caught:
        await sup.ensure_running()
    # ended by the engine's own line, not by the 120 s timeout (no wall-clock bound: a loaded
    # machine must not fail this)
    assert "did not become ready within" not in str(caught.value)
    assert "gguf" in str(caught.value).lower()
    assert caught.value.code == "engine.start-failed"
    crash = [r.event for r in store.read_stream(f"engine/{KEY}") if r.type == "engine.crashed"][-1]
    assert isinstance(crash, EngineCrashed)
    assert not crash.reached_ready
    assert crash.panic_kind in {"model-unreadable", "model-load-failed"}


async def test_rapid_crashes_hit_the_restart_budget_and_say_when_it_retries(
    store: EventStore, tmp_path: Path
) -> None:
    bad = tmp_path / "corrupt.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 4096)
    sup = make(store, bad, tmp_path)
    for _ in range(3):
        with pytest.raises(EngineStartError):
            await sup.ensure_running()
    with pytest.raises(RestartBudgetError) as caught:
        await sup.ensure_running()
    message = str(caught.value)
    assert "started 3 times within 60 s" in message
    assert "will try again at" in message
    assert sup.state == "fatal"
    assert types_of(store).count("engine.spawned") == 3  # the 4th start never spawned
    with pytest.raises(RestartBudgetError):
        await sup.ensure_running()


async def test_stop_during_an_in_flight_request_ends_the_process_quickly(
    store: EventStore, tiny: Path, tmp_path: Path
) -> None:
    sup = make(store, tiny, tmp_path)
    port = await sup.ensure_running()
    pid = sup.pid
    assert pid is not None

    def long_generation() -> None:
        with contextlib.suppress(OSError):  # the connection drops when the engine stops
            chat(port, n=200_000)

    async with anyio.create_task_group() as tg:
        tg.start_soon(anyio.to_thread.run_sync, long_generation)
        await anyio.sleep(1.0)
        started = time.monotonic()
        await sup.stop()
        elapsed = time.monotonic() - started
    assert elapsed < 5
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert load(store, Engine, KEY).stop_reason == "user"


async def test_missing_binary_is_one_line_and_recorded(
    store: EventStore, tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOSTLER_LLAMA_SERVER", str(tmp_path / "no-such-llama-server"))
    sup = make(store, tiny, tmp_path)
    with pytest.raises(EngineBinaryError) as caught:
        await sup.ensure_running()
    assert str(caught.value) == (
        f"{tmp_path / 'no-such-llama-server'}: llama-server binary not found "
        "(named by $HOSTLER_LLAMA_SERVER)"
    )
    failed = [
        r.event for r in store.read_stream(f"engine/{KEY}") if isinstance(r.event, EngineFailed)
    ]
    assert failed
    assert "not found" in failed[-1].error


async def test_non_executable_binary(
    store: EventStore, tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "llama-server"
    fake.write_text("not a program")
    fake.chmod(stat.S_IRUSR | stat.S_IWUSR)
    monkeypatch.setenv("HOSTLER_LLAMA_SERVER", str(fake))
    sup = make(store, tiny, tmp_path)
    with pytest.raises(EngineBinaryError, match="not executable"):
        await sup.ensure_running()


async def test_missing_model(store: EventStore, tmp_path: Path) -> None:
    sup = make(store, tmp_path / "nope.gguf", tmp_path)
    with pytest.raises(EngineStartError, match=r"model file .*nope\.gguf does not exist"):
        await sup.ensure_running()
    assert "engine.failed" in types_of(store)


async def test_port_already_taken(store: EventStore, tiny: Path, tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        sup = make(store, tiny, tmp_path, extra_args={"port": taken})
        started = time.monotonic()
        with pytest.raises(EngineStartError, match=r"before becoming ready|couldn't bind") as err:
            await sup.ensure_running()
    assert time.monotonic() - started < 30  # fails at once, never waits out the 180 s timeout
    crash = next(r.event for r in store.read_stream(f"engine/{KEY}") if r.type == "engine.crashed")
    assert isinstance(crash, EngineCrashed)
    assert crash.exit_code == 1 and not crash.reached_ready
    # llama-server logs from a worker thread: under load its exit can beat the line to the
    # file. When the line is there, hostler must have classified it and said it.
    if "couldn't bind" in sup.log_path.read_text(errors="replace"):
        assert "couldn't bind" in err.value.message


async def test_memory_pressure_stops_an_unused_engine(
    store: EventStore, tiny: Path, tmp_path: Path
) -> None:
    sup = make(store, tiny, tmp_path, idle_timeout=0, pressure_idle=0.3, pressure=lambda: True)
    await sup.ensure_running()
    async with anyio.create_task_group() as tg:
        tg.start_soon(sup.watch)
        await wait_state(sup, "stopped")
        tg.cancel_scope.cancel()
    assert load(store, Engine, KEY).stop_reason == "memory-pressure"


async def test_a_log_left_running_is_settled_before_a_fresh_start(
    store: EventStore, tiny: Path, tmp_path: Path
) -> None:
    """A supervisor on a log whose engine was left 'running' (no reconcile) records it lost."""
    first = make(store, tiny, tmp_path)
    await first.ensure_running()
    pid = first.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # dies unwatched: the log still says running
    assert first._child is not None and isinstance(first._child.proc, OsProcess)
    assert first._child.proc.popen is not None
    first._child.proc.popen.wait()  # reap it, as the dead daemon's parent would
    second = make(store, tiny, tmp_path)
    assert second.state == "running"
    async with second.request():
        assert second.pid != pid
    assert types_of(store)[3:6] == [
        "engine.adoption_started",
        "engine.lost",
        "engine.start_requested",
    ]
    await second.stop()


async def test_stop_aborts_a_start_in_progress(store: EventStore, tmp_path: Path) -> None:
    # A "model" that never becomes ready: a real process that listens on nothing useful.
    slow = tmp_path / "slow.gguf"
    write_tiny_llama(slow)
    sup = make(
        store, slow, tmp_path, extra_args={"host": "127.0.0.2"}
    )  # binds elsewhere: never ready here
    outcome: list[BaseException] = []

    async def start() -> None:
        try:
            await sup.ensure_running()
        except EngineStartError as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(start)
        with anyio.fail_after(10):
            while sup.pid is None:
                await anyio.sleep(0.02)
        pid = sup.pid
        started = time.monotonic()
        await sup.stop(StopReason.SHUTDOWN)
        assert time.monotonic() - started < 5
    assert outcome
    assert "start aborted: stop requested (shutdown)" in str(outcome[0])
    assert not alive_pid(pid)
    assert sup.state == "stopped"
    assert types_of(store)[-2:] == ["engine.stop_requested", "engine.stopped"]


def alive_pid(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
