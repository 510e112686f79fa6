"""The supervisor on in-memory processes and HTTP, in virtual time (D6 of "one core").

Every test here runs minutes of an engine's life — loads, readiness waits, crashes, stops and
their escalation, health strikes, idle stops — in milliseconds, on
:class:`hostler.testing.clock.VirtualClock` with :class:`hostler.testing.fake_process.FakeRunner`
and ``FakeTransport`` behind the supervisor's real seams. No process is spawned and no socket
opened; the event log is a real SQLite file.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from hostler.engines.http import Probe
from hostler.engines.supervisor import Supervisor, SupervisorPolicy
from hostler.errors import EngineStartError
from hostler.machines import Engine
from hostler.plugin import LaunchSpec
from hostler.replay import load
from hostler.store.log import EventStore
from hostler.testing.clock import VirtualClock
from hostler.testing.fake_engine import FakeEngineAdapter
from hostler.testing.fake_process import FAKE_PID_BASE, FakeProcess, FakeRunner, FakeTransport

pytestmark = pytest.mark.anyio

KEY = "fake:m:0"
T0 = 1_800_000_000.0  # the virtual clock's first wall reading


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EventStore]:
    with EventStore.open(tmp_path / "events.db", owner=True) as opened:
        yield opened


@pytest.fixture
async def clock() -> AsyncIterator[VirtualClock]:
    virtual = VirtualClock()
    async with virtual.autojump():
        yield virtual


class Rig:
    """A supervisor over a fake runner and transport, on the virtual clock."""

    def __init__(
        self, tmp_path: Path, store: EventStore, clock: VirtualClock, **policy: Any
    ) -> None:
        model = tmp_path / "m.gguf"
        model.write_bytes(b"weights")
        self.clock = clock
        self.store = store
        self.runner = FakeRunner(clock, ready_after=30.0)
        self.transport = FakeTransport(self.runner)
        timings = {"idle_timeout": 0, "watch_interval": 1.0, "readiness_poll": 0.5, **policy}
        self.supervisor = Supervisor(
            KEY,
            FakeEngineAdapter(),
            lambda port: LaunchSpec(KEY, model, port, ctx_per_slot=512, slots=1),
            store,
            run_dir=tmp_path / "run",
            token_prefix="virtual-test",
            policy=SupervisorPolicy(**timings),
            clock=clock,
            runner=self.runner,
            transport=self.transport,
        )

    @property
    def process(self) -> FakeProcess:
        return self.runner.processes[-1]

    def types(self) -> list[str]:
        return [r.type for r in self.store.read_all() if r.stream_id == f"engine/{KEY}"]

    def engine(self) -> Engine:
        return load(self.store, Engine, KEY)


@pytest.fixture
def rig(tmp_path: Path, store: EventStore, clock: VirtualClock) -> Rig:
    return Rig(tmp_path, store, clock)


async def test_a_start_waits_for_readiness_on_the_clock(rig: Rig) -> None:
    began = rig.clock.monotonic()
    port = await rig.supervisor.ensure_running()
    assert rig.clock.monotonic() - began == pytest.approx(30.0, abs=0.5)  # the load, virtual
    assert rig.supervisor.state == "running" and port == rig.process.identity.port
    assert rig.process.identity.pid >= FAKE_PID_BASE  # never a real process's pid
    assert rig.types() == ["engine.start_requested", "engine.spawned", "engine.ready"]
    assert all(p == Probe(port, "/health") for p in rig.transport.probes)
    await rig.supervisor.stop()
    assert rig.process.signals == [signal.SIGTERM]
    assert rig.types()[-2:] == ["engine.stop_requested", "engine.stopped"]


async def test_an_engine_that_never_answers_fails_at_its_startup_timeout(
    tmp_path: Path, store: EventStore, clock: VirtualClock
) -> None:
    rig = Rig(tmp_path, store, clock, startup_timeout=90.0)
    rig.runner.ready_after = None
    began = clock.monotonic()
    with pytest.raises(EngineStartError, match="did not become ready within 90 s"):
        await rig.supervisor.ensure_running()
    assert clock.monotonic() - began == pytest.approx(90.0, abs=0.6)
    assert rig.process.signals == [signal.SIGTERM]  # stopped, never left loading
    assert rig.supervisor.state == "backoff"


async def test_an_exit_before_ready_names_its_status_and_the_engines_own_line(rig: Rig) -> None:
    def dies(process: FakeProcess) -> None:
        process.log("error: unknown model architecture: 'fake2'")
        process.crash(signum=None, code=1)

    rig.runner.on_spawn = dies
    with pytest.raises(EngineStartError) as caught:
        await rig.supervisor.ensure_running()
    assert caught.value.message == (
        f"{KEY}: exited (exit code 1) before becoming ready: "
        "error: unknown model architecture: 'fake2'"
    )
    crashed = [r for r in rig.store.read_all() if r.type == "engine.crashed"][-1].payload
    assert (crashed["exit_code"], crashed["signal"], crashed["reached_ready"]) == (1, None, False)


async def test_the_watch_records_a_crash_and_a_request_restarts_it(rig: Rig) -> None:
    await rig.supervisor.ensure_running()
    first = rig.process
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(rig.supervisor.watch)
        first.crash(signum=signal.SIGKILL)
        while rig.supervisor.state == "running":
            await rig.clock.sleep(1.0)
        tasks.cancel_scope.cancel()
    assert rig.supervisor.state == "backoff"
    assert rig.types()[-1] == "engine.crashed"
    await rig.supervisor.ensure_running()
    assert rig.process is not first and rig.supervisor.state == "running"


async def test_an_engine_deaf_to_the_first_term_is_stopped_by_the_second(
    tmp_path: Path, store: EventStore, clock: VirtualClock
) -> None:
    rig = Rig(tmp_path, store, clock, stop_grace=2.0)
    await rig.supervisor.ensure_running()
    rig.process.ignores_term = 1
    began = clock.monotonic()
    await rig.supervisor.stop()
    assert rig.process.signals == [signal.SIGTERM, signal.SIGTERM]
    assert clock.monotonic() - began == pytest.approx(2.0)  # one grace, on the clock
    assert rig.engine().state == "stopped"


async def test_a_group_that_outlives_kill_keeps_the_engine_stopping(
    tmp_path: Path, store: EventStore, clock: VirtualClock
) -> None:
    rig = Rig(tmp_path, store, clock, stop_grace=2.0, kill_wait=5.0)
    await rig.supervisor.ensure_running()
    rig.process.unkillable = True
    began = clock.monotonic()
    await rig.supervisor.stop()
    assert clock.monotonic() - began == pytest.approx(2.0 + 1.0 + 5.0)  # grace, grace, KILL
    assert rig.process.signals == [signal.SIGTERM, signal.SIGTERM, signal.SIGKILL]
    assert rig.supervisor.state == "stopping"
    assert rig.types()[-1] == "engine.stop_failed"
    with pytest.raises(EngineStartError, match="still does not exit after KILL"):
        await rig.supervisor.ensure_running()


async def test_three_failed_health_probes_restart_the_engine(
    tmp_path: Path, store: EventStore, clock: VirtualClock
) -> None:
    rig = Rig(tmp_path, store, clock, health_interval=15.0, health_failures=3)
    await rig.supervisor.ensure_running()
    first = rig.process
    answers = {"healthy": True}

    def handler(_probe: Probe, process: FakeProcess | None) -> tuple[int, bytes] | None:
        if process is None or not process.ready:
            return None if process is None else (503, b"")
        return (200, b"") if answers["healthy"] or process is not first else (500, b"")

    rig.transport.handler = handler
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(rig.supervisor.watch)
        await clock.sleep(20.0)
        assert rig.supervisor.state == "running" and rig.process is first
        answers["healthy"] = False
        began = clock.monotonic()
        while rig.process is first or rig.supervisor.state != "running":
            await clock.sleep(1.0)
        tasks.cancel_scope.cancel()
    timeline = [
        (r.type, r.payload["at"] - T0) for r in store.read_all() if r.stream_id == f"engine/{KEY}"
    ]
    # ready at 30 s; healthy probes at 45; unhealthy from 50: probes at 60, 75 and 90 fail,
    # the third stops it and starts it again, ready 30 s later
    assert began == 50.0
    assert timeline == [
        ("engine.start_requested", 0.0),
        ("engine.spawned", 0.0),
        ("engine.ready", 30.0),
        ("engine.stop_requested", 90.0),
        ("engine.stopped", 90.0),
        ("engine.start_requested", 90.0),
        ("engine.spawned", 90.0),
        ("engine.ready", 120.0),
    ]
    stops = [r.payload for r in store.read_all() if r.type == "engine.stop_requested"]
    assert stops[-1]["reason"] == "health-restart"
    assert stops[-1]["decision"]["consecutive_failures"] == 3


async def test_an_idle_engine_stops_at_its_timeout_and_a_busy_one_does_not(
    tmp_path: Path, store: EventStore, clock: VirtualClock
) -> None:
    rig = Rig(tmp_path, store, clock, idle_timeout=300.0)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(rig.supervisor.watch)
        async with rig.supervisor.request():
            ready_at = clock.wall()
            await clock.sleep(600.0)  # a long request: never idle while it runs
            assert rig.supervisor.state == "running"
        ended = clock.wall()
        while rig.supervisor.state == "running":
            await clock.sleep(1.0)
        tasks.cancel_scope.cancel()
    stop = [r.payload for r in store.read_all() if r.type == "engine.stop_requested"][-1]
    assert stop["reason"] == "idle"
    assert stop["decision"]["last_used"] == pytest.approx(ended)
    timeline = [
        (r.type, r.payload["at"] - T0) for r in store.read_all() if r.stream_id == f"engine/{KEY}"
    ]
    # ready at 30 s, used until 630 s (never idle meanwhile), stopped 300 s after that
    assert (ready_at - T0, ended - T0) == (30.0, 630.0)
    assert timeline[-3:] == [
        ("engine.ready", 30.0),
        ("engine.stop_requested", 930.0),
        ("engine.stopped", 930.0),
    ]
