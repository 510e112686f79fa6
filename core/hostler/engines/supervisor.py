"""The supervisor (anyio driver): runs one engine key's process through its lifecycle.

It executes what the engine lifecycle machine allows and records every step in the event log
before acting on it: the start request, the spawned process's identity (before ``ensure_running``
can return), readiness, crashes with their snapshot, and stops with their reason. It probes
readiness and health over HTTP, and stops idle engines. It never restarts a crashed engine by
itself: the next request does, within the restart budget (3 starts per 60 s, then a lock-out).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import anyio
import psutil

from hostler.capacity.host_ledger import HostLedger
from hostler.capacity.measure import LaunchFacts, record_launch
from hostler.engines.http import probe_status
from hostler.engines.logs import LogFollower
from hostler.engines.process import (
    ProcessIdentity,
    spawn_engine,
    terminate_group,
)
from hostler.errors import (
    CapacityDeniedError,
    EngineStartError,
    HostlerError,
    RestartBudgetError,
)
from hostler.machines.engine import Engine, EngineState, StopReason
from hostler.plugin import EngineAdapter, LaunchSpec, Panic
from hostler.replay import commit, load
from hostler.store.log import EventStore

__all__ = ["Supervisor", "SupervisorPolicy"]

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class SupervisorPolicy:
    """Timings and limits (seconds); the defaults are the reference behaviour's."""

    startup_timeout: float = 180.0
    readiness_poll: float = 0.01
    health_interval: float = 15.0
    health_failures: int = 3
    idle_timeout: float = 300.0
    restart_budget: int = 3
    restart_window: float = 60.0
    lockout: float = 60.0
    stop_grace: float = 2.0
    watch_interval: float = 0.1
    pressure_idle: float = 60.0


def free_port() -> int:
    """A free loopback port chosen by the OS (the engine's bind catches a race)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class _Child:
    identity: ProcessIdentity
    process: subprocess.Popen[bytes] | None  # None when adopted from an earlier daemon
    log: LogFollower
    started: float
    spec: LaunchSpec | None = None  # None when adopted
    panic: Panic | None = None
    reached_ready: bool = False
    expected_stop: bool = False
    lines: deque[str] = field(default_factory=lambda: deque(maxlen=200))


class Supervisor:
    """One engine key's process.

    Args:
        key: The engine key.
        adapter: The engine kind's facts.
        spec: Builds the launch spec for a port.
        store: The daemon's event log.
        run_dir: Where the engine's log file and work directory go.
        token_prefix: Identifies this daemon's data directory in launch tokens.
        policy: Timings and limits.
        clock: Wall-clock seconds (injected in tests).
    """

    def __init__(
        self,
        key: str,
        adapter: EngineAdapter,
        spec: Callable[[int], LaunchSpec],
        store: EventStore,
        *,
        run_dir: Path,
        token_prefix: str,
        policy: SupervisorPolicy | None = None,
        clock: Clock = time.time,
        ledger: HostLedger | None = None,
        footprint: Callable[[], int] | None = None,
        pressure: Callable[[], bool] | None = None,
    ) -> None:
        self.key = key
        self.adapter = adapter
        self._spec = spec
        self.store = store
        self.run_dir = run_dir
        self.token_prefix = token_prefix
        self.policy = policy or SupervisorPolicy()
        self._clock = clock
        self.engine = load(store, Engine, key)
        self._child: _Child | None = None
        self._starts: deque[float] = deque()
        self._lock = anyio.Lock()
        self._in_flight = 0
        self.last_used = clock()
        self._health_failures = 0
        self._abort_reason: str | None = None
        self._build = "unknown"
        self.ledger = ledger
        self._footprint = footprint
        self._pressure = pressure

    # -- the facts others read ------------------------------------------------------------------

    @property
    def state(self) -> str:
        """The lifecycle state."""
        return self.engine.state

    @property
    def pid(self) -> int | None:
        """The live process id, if any."""
        return self._child.identity.pid if self._child else None

    @property
    def port(self) -> int | None:
        """The engine's loopback port while it is up."""
        return self._child.identity.port if self._child else None

    @property
    def log_path(self) -> Path:
        """The engine's output file."""
        return self.run_dir / "engine.log"

    @property
    def busy(self) -> bool:
        """Requests are in flight."""
        return self._in_flight > 0

    def _fire(self, trigger: str, **observation: object) -> None:
        self.engine.fire(trigger, at=self._clock(), **observation)
        commit(self.store, self.engine, metadata={"actor": "supervisor"})

    # -- requests ----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def request(self) -> AsyncIterator[int]:
        """Hold the engine for one request: started if needed, never idle-stopped meanwhile."""
        port = await self.ensure_running()
        self._in_flight += 1
        self.last_used = self._clock()
        try:
            yield port
        finally:
            self._in_flight -= 1
            self.last_used = self._clock()

    async def ensure_running(self, cause: str = "request") -> int:
        """Start the engine if needed and wait until ready; return its port.

        Raises:
            RestartBudgetError: It crashed too often; the message says when it may start again.
            EngineStartError: It could not start or become ready; the message carries the
                engine's own error line when it printed one.
        """
        self.last_used = self._clock()
        async with self._lock:
            if self.state == EngineState.RUNNING and self._child is not None:
                return self._child.identity.port
            self._settle_unknown()
            self._check_lockout()
            if self.state == EngineState.FATAL:
                self._fire("reset", cause="new request after a failure")
            try:
                estimate = self._reserve()
            except CapacityDeniedError:
                raise  # recorded in the ledger's log, with its inputs; not the engine's fault
            except HostlerError as exc:
                self._fire("start", cause=cause)
                self._fire("failed", error=exc.message, retry_at=None)
                raise
            try:
                port = await self._start(cause)
            except BaseException:
                self._release()
                raise
            self._learn(estimate)
            return port

    def _reserve(self) -> int:
        """Hold the engine's estimated footprint in the host ledger before it starts."""
        if self.ledger is None or self._footprint is None:
            return 0
        estimate = self._footprint()
        decision = self.ledger.reserve(self.key, estimate)
        if not decision.granted:
            raise CapacityDeniedError(f"{self.key}: {decision.reason}")
        return estimate

    def _release(self) -> None:
        if self.ledger is not None:
            with contextlib.suppress(HostlerError):
                self.ledger.release(self.key)

    def _learn(self, estimate: int) -> None:
        """Measure the ready engine; the ledger holds the truth, and the estimate learns."""
        child = self._child
        if self.ledger is None or child is None or child.spec is None or not estimate:
            return
        spec = child.spec
        facts = LaunchFacts(
            engine_key=self.key,
            model=spec.model.name,
            build=self._build,
            kv_type=spec.kv_type or "f16",
            ctx_total=spec.ctx_per_slot * spec.slots,
            slots=spec.slots,
            estimated=estimate,
        )
        with contextlib.suppress(HostlerError, psutil.Error):
            record_launch(self.ledger, facts, child.identity.pid)

    def _settle_unknown(self) -> None:
        """Record as lost a process the log believes up but this supervisor does not hold.

        That happens when no reconcile ran, or the process was lost; the fresh start follows.
        """
        alive = (EngineState.STARTING, EngineState.RUNNING, EngineState.STOPPING)
        if self._child is None and self.state in (*alive, EngineState.ADOPTING):
            if self.state != EngineState.ADOPTING:
                self._fire("begin_adoption", daemon_pid=os.getpid())
            self._fire("lost", cause="no live process is known to this supervisor")

    def _check_lockout(self) -> None:
        now = self._clock()
        if self.state != EngineState.FATAL or self.engine.retry_at is None:
            return
        if now < self.engine.retry_at:
            when = datetime.fromtimestamp(self.engine.retry_at, UTC).strftime("%H:%M:%S UTC")
            raise RestartBudgetError(
                f"{self.key}: {self.engine.last_error}; hostler will try again at {when} "
                f"(in {self.engine.retry_at - now:.0f} s)"
            )
        self._starts.clear()

    async def _start(self, cause: str) -> int:
        now = self._clock()
        window = self.policy.restart_window
        while self._starts and now - self._starts[0] > window:
            self._starts.popleft()
        if len(self._starts) >= self.policy.restart_budget:
            error = f"started {len(self._starts)} times within {window:.0f} s"
            if self.state in (EngineState.STOPPED, EngineState.BACKOFF):
                # record the refusal on the way through starting, as the machine requires
                self._fire("start", cause=cause)
            self._fire("failed", error=error, retry_at=now + self.policy.lockout)
            self._check_lockout()
        self._starts.append(now)
        self._fire("start", cause=cause)
        port = free_port()
        try:
            spec = self._spec(port)
            if not spec.model.is_file():
                raise EngineStartError(f"{self.key}: model file {spec.model} does not exist")
            command = self.adapter.build_command(spec)
            self._build = self.adapter.build_identity(command)
        except HostlerError as exc:
            self._fire("failed", error=exc.message, retry_at=None)
            raise
        token = f"{self.token_prefix}:{secrets.token_hex(8)}"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if spec.work_dir is not None:
            spec.work_dir.mkdir(parents=True, exist_ok=True)
        follower = LogFollower(self.log_path)
        try:
            process, identity = spawn_engine(
                command.argv,
                command.env,
                log_path=self.log_path,
                launch_token=token,
                port=port,
                cwd=spec.work_dir,
            )
        except OSError as exc:
            message = f"{self.key}: cannot run {command.argv[0]} ({exc.strerror or exc})"
            self._fire("failed", error=message, retry_at=None)
            raise EngineStartError(message) from exc
        child = _Child(identity, process, follower, self._clock(), spec)
        self._child = child
        # Recorded before ensure_running can return: a daemon killed from here on finds it.
        self._fire(
            "spawned",
            pid=identity.pid,
            create_time=identity.create_time,
            boot_id=identity.boot_id,
            launch_token=identity.launch_token,
            argv_fingerprint=identity.argv_fingerprint,
            port=identity.port,
        )
        await self._await_ready(child)
        return port

    async def _await_ready(self, child: _Child) -> None:
        deadline = anyio.current_time() + self.policy.startup_timeout
        while True:
            if self._abort_reason is not None:
                reason, self._abort_reason = self._abort_reason, None
                await self._stop_locked(reason)
                raise EngineStartError(f"{self.key}: start aborted: stop requested ({reason})")
            self._read_lines(child)
            exited = child.process is not None and child.process.poll() is not None
            if (child.panic is not None and child.panic.fatal_at_startup) or exited:
                await self._startup_failed(child, exited=exited)
            status = await probe_status(child.identity.port, self.adapter.readiness_path, wait=1)
            if status is not None and self.adapter.is_ready(status):
                child.reached_ready = True
                self._health_failures = 0
                self._fire("ready")
                return
            if anyio.current_time() > deadline:
                await self._startup_failed(child, exited=False, timed_out=True)
            await anyio.sleep(self.policy.readiness_poll)

    async def _startup_failed(
        self, child: _Child, *, exited: bool, timed_out: bool = False
    ) -> None:
        if not exited:
            child.expected_stop = True
            await terminate_group(child.identity.pid, child=child.process, grace=0.5)
        code, sig = _exit_status(child.process)
        self._read_lines(child, final=True)
        if child.panic is not None:
            reason = child.panic.line
        elif timed_out:
            reason = f"did not become ready within {self.policy.startup_timeout:.0f} s"
        else:
            lines = [line.strip() for line in child.lines if line.strip()]
            errors = [line for line in lines if "error" in line.lower()]
            last = errors[0] if errors else (lines[-1] if lines else "")
            reason = f"exited ({_describe_exit(code, sig)}) before becoming ready" + (
                f": {last.strip()}" if last else ""
            )
        self._record_crash(child, code, sig)
        raise EngineStartError(f"{self.key}: {reason}")

    def _read_lines(self, child: _Child, *, final: bool = False) -> None:
        lines = child.log.flush() if final else child.log.new_lines()
        for line in lines:
            child.lines.append(line)
            panic = self.adapter.classify_line(line)
            if panic is not None and (
                child.panic is None or panic.priority >= child.panic.priority
            ):
                child.panic = panic

    def _record_crash(self, child: _Child, code: int | None, sig: int | None) -> None:
        self._child = None
        self._release()
        if self.state not in (EngineState.STARTING, EngineState.RUNNING):
            return
        panic_kind = child.panic.kind if child.panic else None
        if panic_kind is None and sig == 4:
            panic_kind = "illegal-instruction"
        self._fire(
            "crashed",
            exit_code=code,
            signal=sig,
            reached_ready=child.reached_ready,
            retry_at=self._clock(),
            panic_kind=panic_kind,
            panic_line=child.panic.line if child.panic else None,
            uptime=round(self._clock() - child.started, 3),
            output_tail=child.log.tail(),
        )

    # -- stopping ----------------------------------------------------------------------------

    async def stop(self, reason: StopReason | str = StopReason.USER) -> None:
        """Stop the engine (TERM, TERM, KILL to its process group) and record why.

        A start in progress is aborted at its next readiness poll, not waited for.
        """
        if self.state == EngineState.STARTING and self._lock.locked():
            self._abort_reason = str(reason)
        async with self._lock:
            await self._stop_locked(str(reason))

    async def _stop_locked(self, reason: str) -> None:
        if self.state == EngineState.BACKOFF:
            self._fire("stop", reason=reason)
            return
        if self.state not in (EngineState.STARTING, EngineState.RUNNING):
            return
        child = self._child
        self._fire("stop", reason=reason)
        code = sig = None
        if child is not None:
            child.expected_stop = True
            code, sig = await terminate_group(
                child.identity.pid, child=child.process, grace=self.policy.stop_grace
            )
        self._child = None
        self._fire("exited", exit_code=code, signal=sig)
        self._release()

    # -- watching ----------------------------------------------------------------------------

    async def watch(self) -> None:
        """Run forever: notice crashes, probe health, stop idle engines. Cancel to end."""
        next_health = anyio.current_time() + self.policy.health_interval
        while True:
            await anyio.sleep(self.policy.watch_interval)
            child = self._child
            if child is None or self._lock.locked():
                continue
            if self.state == EngineState.RUNNING and not self._alive(child):
                async with self._lock:
                    if self._child is child and not child.expected_stop:
                        self._read_lines(child, final=True)
                        code, sig = _exit_status(child.process)
                        self._record_crash(child, code, sig)
                continue
            if self.state != EngineState.RUNNING:
                continue
            self._read_lines(child)
            if anyio.current_time() >= next_health:
                next_health = anyio.current_time() + self.policy.health_interval
                await self._health_check(child)
            await self._idle_check()

    def _alive(self, child: _Child) -> bool:
        if child.process is not None:
            return child.process.poll() is None
        try:
            process = psutil.Process(child.identity.pid)
            return process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    async def _health_check(self, child: _Child) -> None:
        status = await probe_status(child.identity.port, self.adapter.readiness_path, wait=2)
        if status is not None and self.adapter.is_ready(status):
            self._health_failures = 0
            return
        self._health_failures += 1
        if self._health_failures >= self.policy.health_failures:
            self._health_failures = 0
            async with self._lock:
                await self._stop_locked(StopReason.HEALTH_RESTART)
            with contextlib.suppress(HostlerError):
                await self.ensure_running(cause="health-restart")

    async def _idle_check(self) -> None:
        unused_for = self._clock() - self.last_used
        if (
            self._pressure is not None
            and unused_for >= self.policy.pressure_idle
            and not self.busy
            and self._pressure()
        ):
            # Memory pressure is a release hint: an engine unused for a while goes early.
            async with self._lock:
                if self.state == EngineState.RUNNING and not self.busy:
                    await self._stop_locked(StopReason.MEMORY_PRESSURE)
            return
        idle = self.policy.idle_timeout
        if idle <= 0 or unused_for < idle:
            return
        if self.busy:
            self.last_used = self._clock()  # defer a whole window
            return
        async with self._lock:
            if self.state == EngineState.RUNNING and not self.busy:
                await self._stop_locked(StopReason.IDLE)

    # -- adoption ------------------------------------------------------------------------------

    def adopt(self, identity: ProcessIdentity) -> None:
        """Watch a live process an earlier daemon started (its identity already checked)."""
        self._child = _Child(identity, None, LogFollower(self.log_path), self._clock())
        self._child.reached_ready = True


def _exit_status(process: subprocess.Popen[bytes] | None) -> tuple[int | None, int | None]:
    if process is None:
        return None, None
    code = process.poll()
    if code is None:
        return None, None
    return (None, -code) if code < 0 else (code, None)


def _describe_exit(code: int | None, sig: int | None) -> str:
    if sig is not None:
        return f"signal {sig}"
    return f"exit code {code}" if code is not None else "exit status unknown"
