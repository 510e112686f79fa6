"""Starts and stops that survive cancellation and failure, with the real llama-server (SG1–SG3).

Each test here reproduces a break reported on main (issue "Promises that hold"): a cancelled
start that left an orphan, a failed stop recorded as a success, a raising plugin that left the
log at ``starting``, measured footprints without GPU memory, a restart budget that forgot its
starts, and an event loop that waited on SQLite.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from hostler import Engine, EventStore, load
from hostler.capacity.budget import HostMemory, compute_budget
from hostler.capacity.learning import CALIBRATION_STREAM
from hostler.capacity.units import GIB, MIB
from hostler.drivers.host_ledger import HostLedger, OwnerIdentity
from hostler.engines import process as process_module
from hostler.engines import runner as runner_module
from hostler.engines.process import Termination
from hostler.engines.supervisor import Supervisor, SupervisorPolicy
from hostler.errors import EngineStartError, PluginError, RestartBudgetError, StoreError
from hostler.machines.engine import StopReason
from hostler.plugin import LaunchCommand, LaunchSpec, Panic, ReadinessProbe
from hostler.probes.nvml import open_nvml
from hostler.testing.tiny_gguf import write_tiny_llama
from hostler_llamacpp import LlamaCppAdapter

pytestmark = pytest.mark.anyio
KEY = "llamacpp:tiny:0"
BUDGET = compute_budget(HostMemory(system_ram=16 * GIB))
ESTIMATE = 64 * MIB


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny.gguf")


@pytest.fixture
def ledger(tmp_path: Path) -> Any:
    with EventStore.open(tmp_path / "ledger.db") as store:
        yield HostLedger(store, OwnerIdentity.current("test"), lambda: BUDGET)


class NeverReady(LlamaCppAdapter):
    """The real llama-server, probed on a path it answers 404 on: it loads forever (until healed)."""

    healed = False

    def readiness(self, spec: LaunchSpec) -> ReadinessProbe:
        probe = super().readiness(spec)
        return probe if self.healed else dataclasses.replace(probe, path="/no-such-path")

    def heal(self) -> None:
        """From now on, probe where the engine answers (a plugin that can tell ready)."""
        self.healed = True


class RaisesInBuild(LlamaCppAdapter):
    """A plugin with a bug in build_command (until it is fixed)."""

    fixed = False

    def build_command(self, spec: LaunchSpec) -> LaunchCommand:
        if not self.fixed:
            raise KeyError("n_gpu_layers")
        return super().build_command(spec)


class RaisesOnLines(LlamaCppAdapter):
    """A plugin whose line classifier breaks once the engine prints."""

    def classify_line(self, line: str) -> Panic | None:
        raise ZeroDivisionError("oops")


def make(
    store: EventStore,
    model: Path,
    tmp_path: Path,
    *,
    adapter: LlamaCppAdapter | None = None,
    ledger: HostLedger | None = None,
    probe: Any = None,
    **policy: Any,
) -> Supervisor:
    return Supervisor(
        KEY,
        adapter or LlamaCppAdapter(),
        lambda port: LaunchSpec(KEY, model, port, ctx_per_slot=512, slots=1, work_dir=tmp_path),
        store,
        run_dir=tmp_path / "run",
        token_prefix="faults",
        policy=SupervisorPolicy(**{"watch_interval": 0.05, **policy}),
        ledger=ledger,
        footprint=(lambda: ESTIMATE) if ledger is not None else None,
        probe=probe,
    )


def stream(store: EventStore) -> list[tuple[str, dict[str, Any]]]:
    return [(r.type, r.payload) for r in store.read_stream(f"engine/{KEY}")]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_a_cancelled_start_kills_the_group_and_the_next_request_works(
    store: EventStore, tiny: Path, tmp_path: Path, ledger: HostLedger
) -> None:
    """Break 2: cancelling ensure_running left the process running in ``starting``."""
    adapter = NeverReady()
    sup = make(store, tiny, tmp_path, adapter=adapter, ledger=ledger)
    with anyio.move_on_after(10) as scope:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(sup.ensure_running)
            while sup.pid is None:
                await anyio.sleep(0.005)
            pid = sup.pid
            await anyio.sleep(0.3)  # it is loading (never ready on this path)
            assert sup.state == "starting"
            tasks.cancel_scope.cancel()
    assert not scope.cancelled_caught
    assert gone(pid)
    assert sup.state == "stopped"
    types_ = [t for t, _ in stream(store)]
    assert types_ == [
        "engine.start_requested",
        "engine.spawned",
        "engine.stop_requested",
        "engine.stopped",
    ]
    assert stream(store)[2][1]["reason"] == "start-cancelled"
    assert stream(store)[2][1]["decision"] == {"cause": "cancelled"}
    assert ledger.refresh().committed == 0  # released once the group was gone
    # not stuck: the next request (with a plugin that can tell ready) starts it
    adapter.heal()
    async with sup.request() as port:
        assert port == sup.port
    await sup.stop()
    assert ledger.refresh().committed == 0


async def test_a_stop_that_cannot_kill_the_group_keeps_its_reservation(
    store: EventStore,
    tiny: Path,
    tmp_path: Path,
    ledger: HostLedger,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Break 4: a group alive after KILL + 5 s was recorded ``stopped`` and released."""
    sup = make(store, tiny, tmp_path, ledger=ledger)
    await sup.ensure_running()
    pid = sup.pid
    assert pid is not None
    real = process_module.terminate_group

    async def unkillable(pgid: int, **_kwargs: object) -> Termination:
        return Termination(None, None, False, f"process group {pgid} is still alive after KILL")

    monkeypatch.setattr(runner_module, "terminate_group", unkillable)
    await sup.stop()
    assert sup.state == "stopping"
    assert [t for t, _ in stream(store)][-2:] == ["engine.stop_requested", "engine.stop_failed"]
    assert stream(store)[-1][1]["pid"] == pid
    held = ledger.refresh().held(ledger.owner, KEY)
    assert held is not None and held.pid == pid  # memory in use is never freed on paper
    with pytest.raises(EngineStartError, match="still does not exit after KILL"):
        await sup.ensure_running()  # never a second copy beside it
    monkeypatch.setattr(runner_module, "terminate_group", real)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(sup.watch)  # retries the stop
        with anyio.fail_after(15):
            while sup.state != "stopped":
                await anyio.sleep(0.05)
        tasks.cancel_scope.cancel()
    assert gone(pid)
    assert ledger.refresh().committed == 0


async def test_a_plugin_that_raises_fails_that_engine_naming_the_plugin(
    store: EventStore, tiny: Path, tmp_path: Path, ledger: HostLedger
) -> None:
    """Break 5: a KeyError in build_command left the log at ``starting``, no failure event."""
    plugin = RaisesInBuild()
    sup = make(store, tiny, tmp_path, adapter=plugin, ledger=ledger)
    with pytest.raises(PluginError, match=r"RaisesInBuild\) raised KeyError: 'n_gpu_layers'"):
        await sup.ensure_running()
    assert sup.state == "fatal"
    failed = stream(store)[-1]
    assert failed[0] == "engine.failed"
    assert "'llamacpp' engine plugin" in failed[1]["error"]
    assert "in build_command" in failed[1]["error"]
    assert ledger.refresh().committed == 0
    # a fixed plugin starts it again
    plugin.fixed = True
    await sup.ensure_running()
    await sup.stop()


async def test_a_plugin_that_raises_while_loading_leaves_no_process(
    store: EventStore, tiny: Path, tmp_path: Path, ledger: HostLedger
) -> None:
    sup = make(store, tiny, tmp_path, adapter=RaisesOnLines(), ledger=ledger)
    with pytest.raises(PluginError, match="ZeroDivisionError: oops in classify_line"):
        await sup.ensure_running()
    spawned = next(p for t, p in stream(store) if t == "engine.spawned")
    assert gone(spawned["pid"])
    assert [t for t, _ in stream(store)][-1] == "engine.failed"
    assert ledger.refresh().committed == 0


def _fake_nvml(per_process: int) -> types.ModuleType:
    """A stand-in NVML (no NVIDIA driver here) that attributes memory to llama-servers."""

    class NvmlError(Exception):
        pass

    def running(_handle: int) -> list[types.SimpleNamespace]:
        return [
            types.SimpleNamespace(pid=p.pid, usedGpuMemory=per_process)
            for p in psutil.process_iter(["name"])
            if p.info["name"] == "llama-server"
        ]

    module = types.ModuleType("fake_pynvml")
    module.__dict__.update(
        {
            "NVMLError": NvmlError,
            "nvmlInit": lambda: None,
            "nvmlShutdown": lambda: None,
            "nvmlDeviceGetCount": lambda: 1,
            "nvmlDeviceGetHandleByIndex": lambda i: i,
            "nvmlDeviceGetComputeRunningProcesses": running,
        }
    )
    return module


async def test_measured_footprints_include_gpu_memory(
    store: EventStore, tiny: Path, tmp_path: Path, ledger: HostLedger
) -> None:
    """Break 6: the supervisor measured without the NVML probe (RSS only)."""
    probe = open_nvml(_fake_nvml(3 * GIB))
    sup = make(store, tiny, tmp_path, ledger=ledger, probe=probe)
    await sup.ensure_running()
    try:
        measured = [r.payload for r in ledger.store.read_stream(CALIBRATION_STREAM)][-1]
        assert measured["gpu"] == 3 * GIB
        assert measured["measured"] == measured["rss"] + 3 * GIB
        held = ledger.refresh().held(ledger.owner, KEY)
        assert held is not None and held.bytes == measured["measured"]
    finally:
        await sup.stop()


async def test_the_restart_budget_survives_a_new_supervisor(
    store: EventStore, tiny: Path, tmp_path: Path
) -> None:
    """Break 7: the budget was an in-memory deque that a daemon restart forgot."""
    first = make(store, tiny, tmp_path, restart_budget=2, lockout=30)
    for _ in range(2):
        await first.ensure_running()
        # a restart for failing health counts (SP1: a chosen stop, say a person's, would not)
        await first.stop(StopReason.HEALTH_RESTART)
    second = make(store, tiny, tmp_path, restart_budget=2, lockout=30)  # a daemon restart
    with pytest.raises(RestartBudgetError, match="started 2 times within 60 s"):
        await second.ensure_running()
    failed = stream(store)[-1]
    assert failed[0] == "engine.failed"
    decision = failed[1]["decision"]
    assert decision["rule"] == "SP1" and decision["restart_budget"] == 2
    assert len(decision["recent_starts"]) == 2
    assert load(store, Engine, KEY).retry_at == pytest.approx(decision["now"] + 30)


async def test_an_idle_stop_records_its_inputs(
    store: EventStore, tiny: Path, tmp_path: Path
) -> None:
    """Break 7: stops recorded only a reason: no threshold, no last use, no policy version."""
    sup = make(store, tiny, tmp_path, idle_timeout=0.4)
    await sup.ensure_running()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(sup.watch)
        with anyio.fail_after(10):
            while sup.state != "stopped":
                await anyio.sleep(0.05)
        tasks.cancel_scope.cancel()
    stop = next(p for t, p in stream(store) if t == "engine.stop_requested")
    assert stop["reason"] == "idle"
    decision = stop["decision"]
    assert decision["policy"] == "supervision" and decision["version"] == 1
    assert decision["rule"] == "SP4" and decision["idle_timeout"] == 0.4
    assert decision["unused_for"] >= 0.4
    assert decision["now"] - decision["last_used"] == pytest.approx(decision["unused_for"])


async def test_the_event_loop_never_waits_on_a_sqlite_lock(tiny: Path, tmp_path: Path) -> None:
    """Break 8: every lifecycle step was a synchronous fsync'd append on the loop."""
    path = tmp_path / "data" / "events.db"
    with EventStore.open(path, owner=True) as store:
        sup = make(store, tiny, tmp_path)
        locked = threading.Event()
        release = threading.Event()

        def hold_the_write_lock() -> None:
            raw = sqlite3.connect(path, isolation_level=None)
            raw.execute("BEGIN IMMEDIATE")
            locked.set()
            release.wait(10)
            raw.execute("COMMIT")
            raw.close()

        holder = threading.Thread(target=hold_the_write_lock)
        holder.start()
        locked.wait(5)
        gaps: list[float] = []

        async def heartbeat() -> None:
            last = time.monotonic()
            while True:
                await anyio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(heartbeat)
            started = time.monotonic()
            tasks.start_soon(sup.ensure_running)
            await anyio.sleep(1.5)  # the start waits on the lock: in a worker thread
            assert sup.state == "starting"
            release.set()
            with anyio.fail_after(30):
                while sup.state != "running":
                    await anyio.sleep(0.02)
            assert time.monotonic() - started >= 1.5
            tasks.cancel_scope.cancel()
        holder.join()
        await sup.stop()
    assert max(gaps) < 0.25, f"the loop stalled for {max(gaps):.3f} s"


async def test_a_log_that_cannot_be_written_never_ends_the_watch_and_shutdown_still_stops(
    store: EventStore,
    tiny: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A full disk made recording a crash raise out of watch() and take the daemon down."""
    sup = make(store, tiny, tmp_path)
    await sup.ensure_running()
    pid = sup.pid
    assert pid is not None

    def full(*_args: object, **_kwargs: object) -> None:
        raise StoreError(f"{store.name}: database error (database or disk is full)")

    monkeypatch.setattr(store, "append", full)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(sup.watch)
        await anyio.sleep(0.3)  # several ticks with nothing to record: fine
        with pytest.raises(StoreError, match="disk is full"):
            await sup.stop()  # a stop that cannot be recorded is not acted on ...
        assert not gone(pid)
        assert await sup.kill_unrecorded()  # ... but a shutdown still stops what it owns
        assert gone(pid)
        tasks.cancel_scope.cancel()
    second = make(store, tiny, tmp_path)
    monkeypatch.undo()
    await second.ensure_running()
    other = second.pid
    assert other is not None
    monkeypatch.setattr(store, "append", full)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(second.watch)
        psutil.Process(other).kill()
        await anyio.sleep(0.6)  # the crash cannot be recorded: the watch logs and carries on
        assert "disk is full" in caplog.text
        tasks.cancel_scope.cancel()  # it was still running: cancelled, not crashed


async def test_a_start_the_log_refused_is_taken_once_the_lock_goes(
    tiny: Path, tmp_path: Path
) -> None:
    """SF2: unrecorded, the start is not taken; then it is, once the log takes writes again.

    Found by a hostile tester: a 3 s lock at autostart and the engine never started.
    """
    path = tmp_path / "events.db"
    with EventStore.open(path, busy_timeout=0.25) as store:
        supervisor = make(store, tiny, tmp_path)
        holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")
        threading.Timer(3.0, lambda: holder.execute("ROLLBACK")).start()
        started = time.monotonic()
        try:
            async with anyio.create_task_group() as watching:
                # the watcher's flushes run meanwhile: none may write the withdrawn decision
                watching.start_soon(supervisor.watch)
                port = await supervisor.start_when_recordable(cause="config", retry_every=0.2)
                watching.cancel_scope.cancel()
            assert time.monotonic() - started >= 2.9  # nothing ran while the lock was held
            assert supervisor.state == "running" and port == supervisor.port
            types = [t for t, _ in stream(store)]
            assert types == ["engine.start_requested", "engine.spawned", "engine.ready"]
            assert supervisor.health.ok
            outage = supervisor.health.take_ended()[0]
            assert outage.code == "store.busy"
            assert outage.delayed == 0  # the refused decision was withdrawn, it never waited
        finally:
            await supervisor.stop()
            holder.close()


#: Logs a fatal line, takes ``argv[2]`` seconds to clean up, then exits 1 (or, with ``hang``,
#: never exits: an engine that announced its death and then stuck).
DYING_SCRIPT = """
import sys, time
print("fatal: couldn't bind HTTP server socket", flush=True)
if sys.argv[2] == "hang":
    while True:
        time.sleep(1)
time.sleep(float(sys.argv[2]))
sys.exit(1)
"""


class SlowToDie(LlamaCppAdapter):
    """An engine that logs its own death, then needs ``cleanup`` seconds to exit."""

    def __init__(self, folder: Path, cleanup: str) -> None:
        self.script = folder / "dying.py"
        self.script.write_text(DYING_SCRIPT)
        self.cleanup = cleanup

    def build_command(self, spec: LaunchSpec) -> LaunchCommand:
        return LaunchCommand([sys.executable, str(self.script), str(spec.port), self.cleanup])

    def classify_line(self, line: str) -> Panic | None:
        return Panic("bind-failed", line) if "couldn't bind" in line else None


async def test_an_engine_that_logs_its_death_is_let_to_exit_by_itself(
    store: EventStore, tiny: Path, tmp_path: Path
) -> None:
    """SG5: the crash records the engine's own exit status, not a SIGTERM raced with it.

    Reported on main: under load, a llama-server that logged "couldn't bind" was signalled
    while it cleaned up, and the crash said ``signal 15`` instead of ``exit 1``.
    """
    sup = make(store, tiny, tmp_path, adapter=SlowToDie(tmp_path, "0.4"))
    with pytest.raises(EngineStartError, match="couldn't bind"):
        await sup.ensure_running()
    crash = next(p for t, p in stream(store) if t == "engine.crashed")
    assert (crash["exit_code"], crash["signal"], crash["panic_kind"]) == (1, None, "bind-failed")


async def test_an_engine_that_logs_its_death_and_hangs_is_killed_after_the_wait(
    store: EventStore, tiny: Path, tmp_path: Path
) -> None:
    sup = make(store, tiny, tmp_path, adapter=SlowToDie(tmp_path, "hang"), panic_exit_wait=0.3)
    started = time.monotonic()
    with pytest.raises(EngineStartError, match="couldn't bind"):
        await sup.ensure_running()
    assert time.monotonic() - started < 5
    crash = next(p for t, p in stream(store) if t == "engine.crashed")
    assert (crash["exit_code"], crash["signal"]) == (None, 15)
    assert sup.state != "running"
