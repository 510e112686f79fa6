"""Signals reach only the engine they are meant for (SG4), with real processes.

Issue "Bad input and broken storage": a stop or health-restart of an *adopted* engine called
``killpg(pid)`` without re-checking the process; with the daemon stalled and the engine's pid
reused by an unrelated process, that process was killed. Real pid reuse cannot be forced, so
these tests simulate it the way the issue describes it: the supervisor's recorded identity (the
dead engine's start time and launch token) points at the pid of an unrelated live process that
runs in its own session, as a process that took the number would.

Every test runs twice: with pidfds (Linux ≥ 5.3) and with the fallback that re-checks the
recorded identity before each signal (``process.USE_PIDFD = False``).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from hostler import Engine, EventStore, load
from hostler.engines import process as process_module
from hostler.engines.process import (
    LAUNCH_TOKEN_ENV,
    Pidfd,
    ProcessIdentity,
    argv_fingerprint,
    group_is_ours,
    identity_matches,
    leader_alive,
    open_verified,
    spawn_engine,
    terminate_group,
)
from hostler.engines.runner import OsProcess
from hostler.engines.supervisor import Supervisor, SupervisorPolicy, free_port
from hostler.errors import EngineStartError
from hostler.machines.watch import ProbeHealth, StopForHealth
from hostler.plugin import EngineAdapter, LaunchCommand, LaunchSpec
from hostler.probes.host import boot_id, started_since_boot
from hostler.replay import commit

from _fake_engine import FakeEngine
from _support import step_the_clock

pytestmark = pytest.mark.anyio
KEY = "fake:sleeper:0"
TOKEN = "signals-test:0123456789abcdef"
SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]
HAS_PIDFD = hasattr(os, "pidfd_open")


@pytest.fixture(params=["pidfd", "fallback"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run with pidfds, or with the fallback a kernel without ``pidfd_open`` gets."""
    if request.param == "pidfd" and not HAS_PIDFD:
        pytest.skip("this kernel or Python has no pidfd_open")
    monkeypatch.setattr(process_module, "USE_PIDFD", request.param == "pidfd")
    return str(request.param)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Every process a test starts; killed at the end whatever happened."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def sleeper(procs: list[subprocess.Popen[bytes]], token: str | None) -> subprocess.Popen[bytes]:
    """A process in its own session, carrying ``token`` as hostler's engines carry theirs.

    A thread reaps it once it dies, as init reaps an adopted engine whose daemon is gone.
    """
    env = {k: v for k, v in os.environ.items() if k != LAUNCH_TOKEN_ENV}
    if token is not None:
        env[LAUNCH_TOKEN_ENV] = token
    proc = subprocess.Popen(
        SLEEP,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )
    procs.append(proc)
    threading.Thread(target=proc.wait, daemon=True).start()
    wait_until(lambda: env_token(proc.pid) == token)  # exec'd, environment readable
    return proc


def env_token(pid: int) -> str | None:
    try:
        return psutil.Process(pid).environ().get(LAUNCH_TOKEN_ENV)
    except psutil.Error:
        return "?"


def wait_until(predicate: Any, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def identity_of(proc: subprocess.Popen[bytes], token: str = TOKEN) -> ProcessIdentity:
    return ProcessIdentity(
        pid=proc.pid,
        create_time=psutil.Process(proc.pid).create_time(),
        boot_id=boot_id(),
        launch_token=token,
        argv_fingerprint=argv_fingerprint(SLEEP),
        port=free_port(),
        since_boot=started_since_boot(proc.pid),
    )


def kill_and_reap(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    wait_until(lambda: proc.returncode is not None or proc.poll() is not None)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def open_fds() -> int:
    return len(list(Path("/proc/self/fd").iterdir()))


class NothingToStart(EngineAdapter):
    """The adopted engine's kind: a restart is refused (the model is gone), which is recorded."""

    engine_type = "fake"

    def build_command(self, spec: LaunchSpec) -> LaunchCommand:
        raise EngineStartError(f"{spec.key}: nothing to start in this test")


def adopted_supervisor(
    store: EventStore, tmp_path: Path, identity: ProcessIdentity, **policy: Any
) -> Supervisor:
    """A supervisor whose log says ``identity`` was spawned, became ready and was adopted."""
    engine = load(store, Engine, KEY)
    at = time.time()
    engine.fire("start", at=at, cause="test")
    engine.fire("spawned", at=at, **identity.spawned_facts())
    engine.fire("ready", at=at)
    engine.fire("begin_adoption", at=at, daemon_pid=os.getpid())
    engine.fire("adopted", at=at, pid=identity.pid)
    commit(store, engine, metadata={"actor": "test"})
    model = tmp_path / "missing.bin"

    def spec(port: int) -> LaunchSpec:
        return LaunchSpec(KEY, model, port, ctx_per_slot=512, slots=1)

    return Supervisor(
        KEY,
        NothingToStart(),
        spec,
        store,
        run_dir=tmp_path / "run",
        token_prefix="signals-test",
        policy=SupervisorPolicy(**{"watch_interval": 0.05, "stop_grace": 1.0, **policy}),
    )


def stream(store: EventStore) -> list[tuple[str, dict[str, Any]]]:
    return [(r.type, r.payload) for r in store.read_stream(f"engine/{KEY}")]


# -- the identity matches: the engine is stopped ---------------------------------------------


async def test_an_adopted_engine_whose_identity_matches_is_stopped(
    store: EventStore, tmp_path: Path, mode: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    engine = sleeper(procs, TOKEN)
    identity = identity_of(engine)
    sup = adopted_supervisor(store, tmp_path, identity)
    baseline = open_fds()  # the log is open by now
    sup.adopt(identity)
    child = sup._child
    assert child is not None and isinstance(child.proc, OsProcess)
    pidfd = child.proc.pidfd
    assert pidfd.held == (mode == "pidfd")
    assert open_fds() == baseline + (1 if mode == "pidfd" else 0)
    await sup.stop()
    assert not alive(engine.pid)
    assert sup.state == "stopped"
    assert [t for t, _ in stream(store)][-2:] == ["engine.stop_requested", "engine.stopped"]
    assert stream(store)[-1][1]["detail"] == ""  # an ordinary stop: it was signalled
    assert open_fds() == baseline  # the pidfd went with the engine


# -- the pid now names another process: it is never signalled --------------------------------


@pytest.mark.parametrize(
    "case",
    [
        f"{when}/{path}"
        for when in ("before-adoption", "after-adoption")
        for path in ("stop", "health-restart", "watch")
    ],
)
async def test_a_reused_pid_is_never_signalled(
    store: EventStore, tmp_path: Path, mode: str, procs: list[subprocess.Popen[bytes]], case: str
) -> None:
    """The adopted engine died; its pid now names an unrelated process in its own session.

    ``before-adoption``: the recorded identity already points at the stranger when the
    supervisor adopts it. ``after-adoption``: the supervisor adopted the real engine (holding
    its pidfd where there are pidfds), then the engine died and the number was taken.
    """
    when, path = case.split("/")
    engine = sleeper(procs, TOKEN)
    dead = identity_of(engine)
    sup = adopted_supervisor(store, tmp_path, dead, health_failures=1, health_interval=3600)
    baseline = open_fds()  # the log is open by now
    if when == "after-adoption":
        sup.adopt(dead)
    kill_and_reap(engine)
    stranger = sleeper(procs, None)
    reused = dataclasses.replace(dead, pid=stranger.pid)  # the dead engine's facts, its pid
    if when == "before-adoption":
        sup.adopt(reused)
    else:
        assert sup._child is not None
        sup._child.identity = reused
    child = sup._child
    assert child is not None

    if path == "stop":
        await sup.stop()
        assert [t for t, _ in stream(store)][-2:] == ["engine.stop_requested", "engine.stopped"]
        stopped = stream(store)[-1][1]
        assert stopped["exit_code"] is None and stopped["signal"] is None
        assert f"pid {stranger.pid}" in stopped["detail"]
        assert sup.state == "stopped"
    elif path == "health-restart":
        # the stranger does not answer on the engine's port: one failed probe is the last
        (stop,) = await sup._watcher.carry_out(ProbeHealth(), child)
        assert isinstance(stop, StopForHealth) and stop.reason == "health-restart"
        assert await sup._watcher.carry_out(stop, child) == []
        types = [t for t, _ in stream(store)]
        assert types[-4:] == [
            "engine.stop_requested",
            "engine.stopped",
            "engine.start_requested",
            "engine.failed",
        ]
        assert stream(store)[-4][1]["reason"] == "health-restart"
        assert f"pid {stranger.pid}" in stream(store)[-3][1]["detail"]
    else:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(sup.watch)
            with anyio.fail_after(10):
                while sup.state == "running":
                    await anyio.sleep(0.02)
            tasks.cancel_scope.cancel()
        assert sup.state == "backoff"  # the engine is gone: a crash, not the stranger's stop
        assert [t for t, _ in stream(store)][-1] == "engine.crashed"

    assert alive(stranger.pid), "an unrelated process was signalled"
    assert sup._child is None
    assert open_fds() == baseline


# -- a spawned engine: signalled through the pidfd opened at spawn, closed when it is done ----


@pytest.mark.parametrize("end", ["stop", "crash"])
async def test_a_spawned_engine_s_pidfd_is_held_for_its_life_then_closed(
    store: EventStore, tmp_path: Path, mode: str, end: str
) -> None:
    model = tmp_path / "model.bin"
    model.write_bytes(b"weights")
    sup = Supervisor(
        "fake:http:0",
        FakeEngine(tmp_path),
        lambda port: LaunchSpec("fake:http:0", model, port, ctx_per_slot=512, slots=1),
        store,
        run_dir=tmp_path / "run",
        token_prefix="signals-test",
        policy=SupervisorPolicy(watch_interval=0.02),
    )
    await sup.ensure_running()  # once, so that the log, the thread pool and friends are open
    await sup.stop()
    baseline = open_fds()
    await sup.ensure_running()
    child = sup._child
    assert child is not None and isinstance(child.proc, OsProcess)
    pidfd = child.proc.pidfd
    assert pidfd.held == (mode == "pidfd")
    assert open_fds() == baseline + (1 if mode == "pidfd" else 0)
    pid = child.identity.pid
    if end == "stop":
        await sup.stop()
        assert sup.state == "stopped"
    else:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(sup.watch)
            os.kill(pid, signal.SIGKILL)
            with anyio.fail_after(10):
                while sup.state == "running":
                    await anyio.sleep(0.02)
            tasks.cancel_scope.cancel()
        assert sup.state == "backoff"
    assert not alive(pid)
    assert pidfd.fd is None
    assert open_fds() == baseline


# -- the stalled daemon: verified, then replaced before the signal ---------------------------


async def stalled_stop(
    store: EventStore,
    tmp_path: Path,
    procs: list[subprocess.Popen[bytes]],
    monkeypatch: pytest.MonkeyPatch,
) -> subprocess.Popen[bytes]:
    """Adopt a real engine, then let it be replaced during a stall, then stop it.

    The stall: the daemon's identity check said yes (it is made to say yes from here on, as
    it did just before the stall), then the engine died and an unrelated process took its pid
    before the signal was sent. Returns the unrelated process.
    """
    engine = sleeper(procs, TOKEN)
    identity = identity_of(engine)
    sup = adopted_supervisor(store, tmp_path, identity)
    sup.adopt(identity)
    monkeypatch.setattr(process_module, "identity_matches", lambda _identity: (True, ""))
    kill_and_reap(engine)
    stranger = sleeper(procs, None)
    assert sup._child is not None
    sup._child.identity = dataclasses.replace(identity, pid=stranger.pid)
    await sup.stop()
    assert sup.state == "stopped"
    return stranger


@pytest.mark.skipif(not HAS_PIDFD, reason="this kernel or Python has no pidfd_open")
async def test_a_pidfd_held_since_adoption_sends_a_stalled_signal_nowhere(
    store: EventStore,
    tmp_path: Path,
    procs: list[subprocess.Popen[bytes]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(process_module, "USE_PIDFD", True)
    stranger = await stalled_stop(store, tmp_path, procs, monkeypatch)
    assert alive(stranger.pid), "the stalled signal reached the process that took the pid"
    assert "has exited" in stream(store)[-1][1]["detail"]


async def test_without_a_pidfd_the_stall_window_is_real(
    store: EventStore,
    tmp_path: Path,
    procs: list[subprocess.Popen[bytes]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The control for the test above: the same stall, no pidfd, and the stranger is hit.

    It shows that the scenario can hurt, so the pidfd is what saves the stranger there; the
    fallback keeps this window as small as it can by re-checking right before each signal.
    """
    monkeypatch.setattr(process_module, "USE_PIDFD", False)
    stranger = await stalled_stop(store, tmp_path, procs, monkeypatch)
    wait_until(lambda: not alive(stranger.pid))


# -- the pieces: pidfds, their fallback, leaderless groups ------------------------------------


def test_no_pidfd_where_the_kernel_has_none(
    monkeypatch: pytest.MonkeyPatch, procs: list[subprocess.Popen[bytes]]
) -> None:
    proc = sleeper(procs, TOKEN)
    if HAS_PIDFD:
        with_fd = Pidfd.open(proc.pid)
        assert with_fd.held and with_fd.alive() is True
        with_fd.close()
        with_fd.close()  # idempotent
        assert with_fd.fd is None

        def enosys(_pid: int) -> int:
            raise OSError(errno.ENOSYS, "Function not implemented")

        monkeypatch.setattr(os, "pidfd_open", enosys)
        assert Pidfd.open(proc.pid).fd is None
        monkeypatch.delattr(os, "pidfd_open")
    assert Pidfd.open(proc.pid).fd is None  # no os.pidfd_open at all
    monkeypatch.undo()
    monkeypatch.setattr(process_module, "USE_PIDFD", False)
    off = Pidfd.open(proc.pid)
    assert off.fd is None and off.alive() is None
    # the fallback still verifies: the identity is re-read
    assert group_is_ours(proc.pid, identity_of(proc))[0]
    assert not group_is_ours(proc.pid, identity_of(proc, token="someone-else:1"))[0]


@pytest.mark.skipif(not HAS_PIDFD, reason="this kernel or Python has no pidfd_open")
def test_a_pidfd_names_the_process_not_the_number(procs: list[subprocess.Popen[bytes]]) -> None:
    proc = sleeper(procs, TOKEN)
    pidfd, why = open_verified(identity_of(proc))
    assert why == "" and pidfd.held
    kill_and_reap(proc)
    assert pidfd.alive() is False
    pidfd.close()
    with pytest.raises(ProcessLookupError):
        Pidfd.open(proc.pid)
    wrong, why = open_verified(identity_of(sleeper(procs, None), token=TOKEN))
    assert "does not carry the recorded launch token" in why
    assert not wrong.held  # closed at once: a mismatch is never held


async def test_a_spawned_engine_is_signalled_through_its_pidfd(
    tmp_path: Path, mode: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    baseline = open_fds()
    child, identity, pidfd = spawn_engine(
        SLEEP, {}, log_path=tmp_path / "engine.log", launch_token=TOKEN, port=1
    )
    procs.append(child)
    assert pidfd.held == (mode == "pidfd")
    ended = await terminate_group(child.pid, identity=identity, child=child, pidfd=pidfd)
    assert ended.gone and ended.signal == 15 and ended.detail == ""
    pidfd.close()
    assert open_fds() == baseline


def leader_with_a_child(
    procs: list[subprocess.Popen[bytes]], pid_file: Path, token: str | None
) -> tuple[subprocess.Popen[bytes], ProcessIdentity]:
    """An engine-like leader (our token) whose child carries ``token`` (None: no token)."""
    pid_file.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k != LAUNCH_TOKEN_ENV}
    inner = dict(env) if token is None else {**env, LAUNCH_TOKEN_ENV: token}
    code = (
        "import json, pathlib, subprocess, sys; "
        f"p = subprocess.Popen({SLEEP!r}, env=json.loads(sys.argv[1])); "
        "pathlib.Path(sys.argv[2]).write_text(str(p.pid)); "
        "import time; time.sleep(0.3)"
    )
    argv = [sys.executable, "-c", code, json.dumps(inner), str(pid_file)]
    leader = subprocess.Popen(argv, start_new_session=True, env={**env, LAUNCH_TOKEN_ENV: TOKEN})
    procs.append(leader)
    wait_until(lambda: env_token(leader.pid) == TOKEN)
    identity = dataclasses.replace(identity_of(leader), argv_fingerprint=argv_fingerprint(argv))
    return leader, identity


async def test_a_leaderless_group_is_signalled_only_while_its_members_carry_the_token(
    mode: str, procs: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """The leader is gone but left a child in its group: ours only if it carries the token."""
    for token, ours in ((TOKEN, True), (None, False)):
        pid_file = tmp_path / "grandchild.pid"
        leader, identity = leader_with_a_child(procs, pid_file, token)
        pidfd = Pidfd.open(leader.pid)
        leader.wait(10)  # the leader exits and is reaped; its child stays in the group
        grandchild = int(pid_file.read_text())
        assert os.getpgid(grandchild) == leader.pid
        ended = await terminate_group(leader.pid, identity=identity, child=leader, pidfd=pidfd)
        pidfd.close()
        assert ended.gone
        if ours:
            assert ended.detail == ""
            assert not alive(grandchild)
        else:
            assert alive(grandchild), "a group member without the token was signalled"
            assert "does not carry the engine's launch token" in ended.detail
            os.kill(grandchild, signal.SIGKILL)


def test_a_stop_recorded_before_detail_existed_reads_with_an_empty_one() -> None:
    from hostler.events.base import decode
    from hostler.machines.engine import EngineStopped

    old = {"from_state": "stopping", "to_state": "stopped", "at": 1.0}
    event = decode("engine.stopped", 1, {**old, "exit_code": 0, "signal": None})
    assert isinstance(event, EngineStopped)
    assert (event.exit_code, event.signal, event.detail) == (0, None, "")


# -- a clock step moves wall-clock start times, not the process ------------------------------


@pytest.mark.parametrize("step", [-3600.0, 0.2, 86_400.0])
def test_a_clock_step_after_the_spawn_leaves_the_engine_recognised(
    tmp_path: Path,
    procs: list[subprocess.Popen[bytes]],
    monkeypatch: pytest.MonkeyPatch,
    step: float,
) -> None:
    """Issue 19: the spawn recorded a wall-clock start time; after the clock was stepped a
    later daemon read its own live engine as "another process": not adopted, never signalled,
    its ledger bytes freed. The kernel's ticks since boot are what identify the process."""
    child, identity, pidfd = spawn_engine(
        SLEEP, {}, log_path=tmp_path / "engine.log", launch_token=TOKEN, port=1
    )
    procs.append(child)
    pidfd.close()
    wait_until(lambda: env_token(child.pid) == TOKEN)  # exec'd, environment readable
    assert identity.since_boot is not None and identity.since_boot > 0
    step_the_clock(monkeypatch, step)
    # psutil's reading moved with the clock: a wall-clock comparison would call it a stranger
    moved = psutil.Process(child.pid).create_time() - identity.create_time
    assert moved == pytest.approx(step, abs=0.02)
    assert identity_matches(identity) == (True, "")
    verified, why = open_verified(identity)
    assert why == ""
    verified.close()
    assert leader_alive(identity)


def test_the_spawn_record_keeps_the_ticks_since_boot_and_an_old_one_reads_without() -> None:
    from hostler.events.base import decode
    from hostler.machines.engine import EngineSpawned

    facts = {
        "from_state": "starting",
        "to_state": "starting",
        "at": 1.0,
        "pid": 4242,
        "create_time": 1_700_000_000.25,
        "boot_id": "boot",
        "launch_token": TOKEN,
        "argv_fingerprint": "sha256:0",
        "port": 8080,
    }
    old = decode("engine.spawned", 1, dict(facts))
    assert isinstance(old, EngineSpawned) and old.since_boot is None
    new = decode("engine.spawned", 2, {**facts, "since_boot": 1234.56})
    assert isinstance(new, EngineSpawned) and new.since_boot == 1234.56


def test_a_recorded_start_in_ticks_tells_a_stranger_from_the_engine(
    procs: list[subprocess.Popen[bytes]],
) -> None:
    """A process on the pid that started at another tick is another process, whatever the
    wall-clock reading says (here: a wall-clock start that matches exactly)."""
    proc = sleeper(procs, TOKEN)
    real = identity_of(proc)
    assert real.since_boot is not None
    assert identity_matches(real) == (True, "")
    other_tick = dataclasses.replace(real, since_boot=real.since_boot - 1.0)
    assert identity_matches(other_tick) == (False, f"pid {proc.pid} is now another process")
    unknown = dataclasses.replace(real, since_boot=None)  # recorded before ticks were: by wall time
    assert identity_matches(unknown) == (True, "")


async def test_a_daemon_restarted_after_a_clock_step_adopts_its_engine(
    store: EventStore,
    tmp_path: Path,
    procs: list[subprocess.Popen[bytes]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The restart itself: the log's spawn record, the clock stepped an hour, reconcile."""
    from hostler.engines.reconcile import reconcile

    port = free_port()
    prefix = f"clock-step-{os.getpid()}"  # no other test's process carries it: none is reaped
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    child, identity, pidfd = spawn_engine(
        argv, {}, log_path=tmp_path / "engine.log", launch_token=f"{prefix}:1", port=port
    )
    procs.append(child)
    pidfd.close()
    engine = load(store, Engine, KEY)
    at = time.time()
    engine.fire("start", at=at, cause="test")
    engine.fire("spawned", at=at, **identity.spawned_facts())
    engine.fire("ready", at=at)
    commit(store, engine, metadata={"actor": "test"})
    wait_until(lambda: listening(port))
    step_the_clock(monkeypatch, 3600.0)
    outcomes = await reconcile(
        store,
        {KEY: load(store, Engine, KEY)},
        token_prefix=prefix,
        daemon_pid=os.getpid(),
        readiness_path=lambda _key: "/",
        clock=time.time,
    )
    assert [(o.result, o.pid, o.detail) for o in outcomes] == [("adopted", child.pid, "")]
    assert outcomes[0].identity == identity  # read back from the log whole, ticks included
    assert outcomes[0].pidfd is not None
    outcomes[0].pidfd.close()
    assert alive(child.pid)


def listening(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0
