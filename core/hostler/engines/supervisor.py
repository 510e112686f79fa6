"""The supervisor (anyio driver): runs one engine key's process through its lifecycle.

It executes what the engine lifecycle machine allows and what the pure supervision policy
(:mod:`hostler.policies.supervision`) decides, and records every step before acting on it:
the start request, the spawned process's identity (before ``ensure_running`` can return),
readiness, crashes with their snapshot, and stops with their reason and the policy inputs
that produced them. Every log and ledger write runs off the event loop (:class:`OffLoop`).

What it guarantees (docs/rules.md, SG1–SG4):

- A start that is cancelled, or whose plugin raises, never leaves a process behind: the group
  is killed (shielded from the cancellation) and the outcome recorded (SG1).
- A reservation is released only once the process group is verifiably gone; a group that
  outlives KILL is recorded (``engine.stop_failed``) and keeps its reservation (SG2).
- A raising adapter fails that engine with ``engine.failed`` naming the plugin (SG3).
- A signal reaches only the engine: its group is re-checked immediately before each one,
  through the pidfd held since spawn or adoption where the kernel has pidfds, else through
  the recorded identity; an engine whose pid is now another process's counts as gone and is
  never signalled (SG4).
- ``engine.log`` is capped: rotated by copy-then-truncate once over ``log_max_bytes``, the
  newest ``log_keep`` copies kept (:func:`hostler.engines.logs.rotate_log`).
- It never restarts a crashed engine by itself: the next request does, within the restart
  budget, whose window is rebuilt from the log (SP1).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import secrets
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import anyio

from hostler.capacity.offload import OffloadPlan
from hostler.clock import ClockLike, as_clock
from hostler.drivers.host_ledger import HostLedger
from hostler.drivers.loghealth import LogHealth
from hostler.drivers.offloop import OffLoop
from hostler.engines.account import EngineAccount
from hostler.engines.child import EngineChild
from hostler.engines.guard import AdapterGuard
from hostler.engines.http import HTTP_TRANSPORT, EngineTransport, Probe
from hostler.engines.journal import EngineJournal
from hostler.engines.launcher import FixedLauncher, Launch, Launcher
from hostler.engines.logs import (
    DEFAULT_LOG_KEEP,
    DEFAULT_LOG_MAX_BYTES,
    LogFollower,
)
from hostler.engines.process import (
    Pidfd,
    ProcessIdentity,
    Termination,
)
from hostler.engines.resweep import anchors_of, sweep_strays
from hostler.engines.rundir import RunDir
from hostler.engines.runner import OS_RUNNER, ProcessRunner
from hostler.errors import (
    CapacityDeniedError,
    ConcurrencyError,
    EngineStartError,
    HostlerError,
    ModelFileError,
    PluginError,
    RestartBudgetError,
    StoreCorruptError,
    StoreError,
)
from hostler.events.offload import OffloadDegraded, offload_stream
from hostler.machines.engine import Engine, EngineState, StopReason
from hostler.machines.readiness import (
    AbortStart,
    Answered,
    BecomeReady,
    FailStart,
    Look,
    Looked,
    Pause,
    Paused,
    ReadinessObservation,
    ReadinessWait,
    SendProbe,
)
from hostler.machines.start import (
    AskSweep,
    AttemptBegan,
    EnsureBegan,
    GiveUp,
    Launched,
    RecordDegrade,
    Recorded,
    Retry,
    StartEnded,
    StartFailed,
    StartTries,
    Sweep,
    SweepAnswered,
    Swept,
)
from hostler.machines.watch import (
    BecameReady,
    EngineWatch,
    FinishStop,
    HealthProbed,
    Now,
    PressureRead,
    ProbeHealth,
    ReadLines,
    ReadPressure,
    RecordCrash,
    RequestBegan,
    RequestEnded,
    RotateLog,
    StartAsked,
    StopForHealth,
    StopIdle,
    Ticked,
    WatchBegan,
    WatchEffect,
    WatchObservation,
)
from hostler.plugin import (
    EngineAdapter,
    LaunchCommand,
    LaunchSpec,
    Progress,
    ReadinessProbe,
    json_fields_match,
    launch_command,
    timing_problem,
)
from hostler.pluginhost import answer_problem
from hostler.policies.supervision import (
    SupervisionPolicy,
    decide_start,
)
from hostler.probes.nvml import NvmlProbe
from hostler.replay import load
from hostler.store.log import EventStore

__all__ = ["Supervisor", "SupervisorPolicy"]

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class SupervisorPolicy:
    """Timings and limits (seconds); the defaults are the reference behaviour's.

    The decision thresholds (restart budget, health failures, idle and pressure timeouts)
    go to the pure policy (:attr:`rules`); the rest are the driver's own pacing.
    ``startup_timeout`` None (default) is the adapter's own (RD7); a number overrides it.
    """

    startup_timeout: float | None = None
    readiness_poll: float = 0.01
    health_interval: float = 15.0
    health_failures: int = 3
    idle_timeout: float = 300.0
    restart_budget: int = 3
    restart_window: float = 60.0
    lockout: float = 60.0
    stop_grace: float = 2.0
    kill_wait: float = 5.0
    panic_exit_wait: float = 2.0
    watch_interval: float = 0.1
    pressure_idle: float = 60.0
    log_max_bytes: int = DEFAULT_LOG_MAX_BYTES
    log_keep: int = DEFAULT_LOG_KEEP
    log_check_interval: float = 1.0

    @property
    def rules(self) -> SupervisionPolicy:
        """The thresholds the pure supervision policy decides with."""
        return SupervisionPolicy(
            restart_budget=self.restart_budget,
            restart_window=self.restart_window,
            lockout=self.lockout,
            health_failures=self.health_failures,
            idle_timeout=self.idle_timeout,
            pressure_idle=self.pressure_idle,
        )


def free_port() -> int:
    """A free loopback port chosen by the OS (the engine's bind catches a race)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Supervisor:
    """One engine key's process.

    Args:
        key: The engine key.
        adapter: The engine kind's facts.
        spec: Builds the launch spec for a port (with ``footprint``: a
            :class:`~hostler.engines.launcher.FixedLauncher`); None when ``launcher`` is given.
        store: The daemon's event log.
        run_dir: Where the engine's log file and work directory go.
        token_prefix: Identifies this daemon's data directory in launch tokens.
        policy: Timings and limits.
        clock: The driver's clock (wall time for the log, monotonic time and sleeps for its
            waits); a plain wall-time callable is taken as a system clock with that wall.
        ledger: The host ledger to reserve in (None: no accounting).
        footprint: The bytes to reserve before a start (with ``spec``).
        launcher: Where each start's priced launch comes from (the daemon's
            :class:`~hostler.engines.launcher.LedgerLauncher`), instead of ``spec`` and
            ``footprint``.
        pressure: Whether the host is under memory pressure now.
        probe: NVML, so that measured footprints include GPU memory.
        offloop: Where blocking log and ledger writes run.
        health: The log's write health, shared with the daemon (SF1–SF3).
        offload: A GPU offload plan every start uses instead of the spec's own (None: the
            spec's); set by the OOM ladder (L13) once a start died of GPU out-of-memory.
        offload_pinned: The operator pinned every offload setting: no ladder.
        runner: Spawns, adopts and stops the engine's process (default: real processes).
        transport: Asks the engine's HTTP readiness and health (default: real HTTP).
    """

    def __init__(
        self,
        key: str,
        adapter: EngineAdapter,
        spec: Callable[[int], LaunchSpec] | None,
        store: EventStore,
        *,
        run_dir: Path,
        token_prefix: str,
        policy: SupervisorPolicy | None = None,
        clock: ClockLike = time.time,
        ledger: HostLedger | None = None,
        footprint: Callable[[], int] | None = None,
        pressure: Callable[[], bool] | None = None,
        probe: NvmlProbe | None = None,
        offloop: OffLoop | None = None,
        health: LogHealth | None = None,
        offload: OffloadPlan | None = None,
        offload_pinned: bool = False,
        owned: Callable[[], Collection[int]] | None = None,
        held_by_other: Callable[[str], str | None] | None = None,
        launcher: Launcher | None = None,
        runner: ProcessRunner = OS_RUNNER,
        transport: EngineTransport = HTTP_TRANSPORT,
    ) -> None:
        if launcher is None:
            if spec is None:
                raise TypeError("a Supervisor takes a spec (and footprint) or a launcher")
            launcher = FixedLauncher(spec, footprint)
        elif spec is not None or footprint is not None:
            raise TypeError("a Supervisor takes a launcher or a spec and footprint, not both")
        self.key = key
        self._runner = runner
        self._transport = transport
        self._tries = StartTries(offload=offload, pinned=offload_pinned)
        #: RD9: the live engine pids of every supervisor of this daemon (never swept); None:
        #: not known, so no stray is ever swept. A pool sets it for the supervisors it makes.
        self.owned = owned
        #: RD9, IN3: the live daemon other than this one that pays for a launch token, if any.
        self.held_by_other = held_by_other
        self.adapter = adapter
        self._guard = AdapterGuard(key, adapter)
        #: one launch per start: its bytes and its spec made together (price once)
        self._launcher: Launcher = launcher
        self.store = store
        self.run_dir = run_dir
        self.token_prefix = token_prefix
        self.policy = policy or SupervisorPolicy()
        self.rules = self.policy.rules
        self._clock = as_clock(clock)
        self._io = offloop or OffLoop()
        self._run_dir = RunDir(
            key,
            run_dir,
            max_bytes=self.policy.log_max_bytes,
            keep=self.policy.log_keep,
            offloop=self._io,
        )
        self.health = health or LogHealth(store.name)
        self._journal = EngineJournal(
            key, load(store, Engine, key), store, clock=self._clock, offloop=self._io,
            health=self.health,
        )  # fmt: skip
        self._child: EngineChild | None = None
        self._lock = anyio.Lock()
        self._pressure = pressure
        self._watch = EngineWatch(
            self.rules,
            health_interval=self.policy.health_interval,
            log_check_interval=self.policy.log_check_interval,
            pressure=pressure is not None,
            now=self._now(),
        )
        self._abort_reason: str | None = None
        #: the readiness wait in flight (a probe or the pause between two), which a stop
        #: cancels at once: a hanging probe never delays a stop (RD1)
        self._waiting: anyio.CancelScope | None = None
        self._build = "unknown"
        self._account = EngineAccount(key, ledger, self._guard, self._io, probe)

    # -- the facts others read ------------------------------------------------------------------

    @property
    def engine(self) -> Engine:
        """The engine's lifecycle machine, as its events say."""
        return self._journal.engine

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
    def launch_spec(self) -> LaunchSpec | None:
        """What the live process was launched with (None when none runs, or it was adopted)."""
        return self._child.spec if self._child else None

    @property
    def startup_timeout(self) -> float:
        """RD7: seconds a start may take: the policy's when set, else the adapter's.

        Raises:
            PluginError: The adapter's ``startup_timeout`` is not a usable number of seconds.
        """
        if self.policy.startup_timeout is not None:
            return self.policy.startup_timeout
        problem = timing_problem(self.adapter)
        if problem is not None:
            raise self._guard.fault(f"has a bad timing: {problem}")
        return float(self.adapter.startup_timeout)

    @property
    def log_path(self) -> Path:
        """The engine's output file."""
        return self._run_dir.log_path

    @property
    def offload(self) -> OffloadPlan | None:
        """The offload plan every start uses instead of its spec's own (L13; None: the spec's)."""
        return self._tries.offload

    @property
    def busy(self) -> bool:
        """Requests are in flight."""
        return self._watch.busy

    @property
    def last_used(self) -> float:
        """When the engine was last used (wall time): a request's start or end, or a start."""
        return self._watch.last_used

    def _now(self) -> Now:
        return Now(self._clock.wall(), self._clock.monotonic())

    def _observe(self, observation: WatchObservation) -> list[WatchEffect]:
        return self._watch.handle(observation, self._now())

    @property
    def progress(self) -> Progress | None:
        """PG1: how far the engine's current job has come, while it is busy (else None)."""
        if not self.busy or self._child is None:
            return None
        return self._child.progress

    async def flush(self, *, force: bool = False) -> bool:
        """Write the engine's pending events; whether none are left pending (SF1).

        While the log fails, tries at most once a second unless ``force``.
        """
        return await self._journal.flush(force=force)

    # -- requests ----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def request(self) -> AsyncIterator[int]:
        """Hold the engine for one request: started if needed, never idle-stopped meanwhile."""
        port = await self.ensure_running()
        if not self.busy and self._child is not None:
            self._child.progress = None  # PG1: a new job; the last one's progress is over
        self._observe(RequestBegan())
        try:
            yield port
        finally:
            self._observe(RequestEnded())

    def price(self) -> Launch:
        """The next start's launch, priced now (blocking: run it off the event loop).

        The pool makes room for exactly these bytes and hands the same launch to
        :meth:`ensure_running`; ``hostler preview`` through the daemon shows this price.
        """
        return self._guard.call("estimate_footprint", self._launcher.price)

    async def ensure_running(
        self,
        cause: str = "request",
        *,
        on_reserved: Callable[[], None] | None = None,
        launch: Launch | None = None,
    ) -> int:
        """Start the engine if needed and wait until ready; return its port.

        Cancelling it while the engine loads kills the process group (shielded) and records
        the stop (reason ``start-cancelled``); nothing is left running or held.

        Raises:
            RestartBudgetError: It started too often; the message says when it may again.
            CapacityDeniedError: The ledger refused its footprint (recorded there).
            EngineStartError: It could not start or become ready; the message carries the
                engine's own error line when it printed one.
            PluginError: Its plugin raised; the engine is recorded failed, naming it.

        A start that dies of GPU out-of-memory is tried again at once with the next offload
        plan down the L13 ladder (recorded as ``offload.degraded``), within the restart budget.
        ``on_reserved`` is called as soon as the footprint is held in the ledger (the pool
        makes room and reserves as one step, then lets others plan while this engine loads).
        ``launch`` is the first start's launch as the caller priced it (the pool, which made
        room for its bytes); None: priced here. A retry down the ladder prices again.
        """
        self._observe(StartAsked())
        async with self._lock:
            self._tries.handle(EnsureBegan(can_sweep=self.owned is not None))
            while True:
                outcome = await self._attempt(cause, on_reserved, launch)
                if isinstance(outcome, int):
                    return outcome
                cause, launch = outcome.cause, None

    async def _attempt(
        self, cause: str, on_reserved: Callable[[], None] | None, launch: Launch | None
    ) -> int | Retry:
        """One start (under the lock): the port, or the retry the start's failure leads to."""
        self._tries.handle(AttemptBegan())
        if self.state == EngineState.RUNNING and self._child is not None:
            return self._child.identity.port
        if self.health.corrupt is not None:
            raise StoreCorruptError(
                f"{self.key}: not started: the event log is corrupt ({self.health.corrupt}); "
                "hostler starts no new work until it is restored (docs/daemon.md)"
            )
        await self._finish_failed_stop()
        await self._settle_unknown()
        self._check_lockout()
        if self.state == EngineState.FATAL:
            await self._journal.decide("reset", cause="new request after a failure")
        await self._check_budget(cause)
        token = f"{self.token_prefix}:{secrets.token_hex(8)}"
        try:
            if launch is None:  # pricing reads the model, the ledger and the calibration
                launch = await self._io.run(self.price)
            reserved = await self._account.reserve(token, launch)
        except CapacityDeniedError:
            raise  # recorded in the ledger's log, with its inputs; not the engine's fault
        except HostlerError as exc:
            await self._journal.observe("start", cause=cause)
            await self._fail(exc)
            raise
        if on_reserved is not None:
            on_reserved()
        try:
            port = await self._start(cause, token, launch, reserved)
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await self._abandon(exc)
            retry = await self._after_failed_start(exc)
            if retry is None:
                raise
            return retry
        await self._learn(reserved or 0)
        return port

    async def _after_failed_start(self, exc: BaseException) -> Retry | None:
        """Carry out what the tries say follows a failed start: the retry, or None."""
        start_error = isinstance(exc, EngineStartError)
        message = exc.message if isinstance(exc, HostlerError) else ""
        effects = self._tries.handle(StartFailed(start_error, message))
        while effects:
            match effects[0]:
                case Retry() as retry:
                    return retry
                case GiveUp():
                    return None
                case RecordDegrade() as degrade:
                    effects = self._tries.handle(Recorded(await self._record_degrade(degrade)))
                case AskSweep(message):
                    effects = self._tries.handle(SweepAnswered(await self._sweep_wanted(message)))
                case Sweep(argv):
                    effects = self._tries.handle(Swept(await self._sweep(argv)))
        return None

    async def _record_degrade(self, degrade: RecordDegrade) -> bool:
        """L13: record ``offload.degraded`` before the next plan is tried; whether it was."""
        launched, plan = degrade.launched, degrade.plan
        event = OffloadDegraded(
            self._clock.wall(), self.key, degrade.panic, _plan_dict(launched), _plan_dict(plan)
        )
        store = self.store
        try:
            await self._io.run(
                lambda: store.append(offload_stream(self.key), [event], expected_version=None)
            )
        except HostlerError:
            return False
        log.warning(
            "hostler: %s: out of GPU memory as %s; retrying as %s",
            self.key,
            launched.kind,
            plan.kind,
        )
        return True

    async def _sweep_wanted(self, message: str) -> bool:
        """RD9 (SV10a): whether the adapter says this failure may be a stale engine's.

        A raising adapter fails the engine (SG3).
        """
        try:
            return self._guard.ask(
                "on_exited_before_ready",
                self.adapter.on_exited_before_ready,
                message,
                returns=bool,
            )
        except PluginError as fault:  # SG3: the crash is recorded; the engine fails too
            with anyio.CancelScope(shield=True):
                await self._fail(fault)
            raise

    async def _sweep(self, argv: tuple[str, ...]) -> int:
        """RD9: stop this data directory's unowned strays named by the launch; how many.

        The strays are named by the launch's binary or model
        (:func:`hostler.engines.resweep.sweep_strays`).
        """
        owned = self.owned
        if owned is None:
            return 0
        swept = await sweep_strays(
            self.token_prefix,
            owned=owned(),
            anchors=anchors_of(argv),
            held_by_other=self.held_by_other,
            offloop=self._io,
            clock=self._clock,
        )
        if swept:
            pids = ", ".join(str(stray.pid) for stray in swept)
            log.warning("hostler: %s: retrying after stopping stray engine(s) %s", self.key, pids)
        return len(swept)

    async def start_when_recordable(self, cause: str, *, retry_every: float = 1.0) -> int:
        """:meth:`ensure_running`, tried again while the log cannot record the start (SF2).

        A start the log refused was not taken; once the log takes writes again it is. Any
        other failure (and a corrupt log) ends the attempt with its error.
        """
        while True:
            try:
                return await self.ensure_running(cause=cause)
            except (StoreCorruptError, ConcurrencyError):
                raise
            except StoreError:
                await self._clock.sleep(retry_every)

    async def fail_unstartable(self, exc: HostlerError, cause: str = "config") -> None:
        """Record that the engine cannot be started at all (its plugin is missing or broken).

        Through ``starting`` to ``failed``, naming the cause, unless it is running (adopted):
        then it stays watched, and only a stop can be done to it.
        """
        log.error("hostler: %s", exc.message)
        async with self._lock:
            if self.state == EngineState.FATAL:
                return
            if self.state not in (EngineState.STOPPED, EngineState.BACKOFF):
                return
            await self._journal.observe("start", cause=cause)
            await self._journal.observe("failed", error=exc.message, retry_at=None)

    async def _check_budget(self, cause: str) -> None:
        """SP1: refuse (recorded, with the start times counted) past the restart budget."""
        verdict = decide_start(self.rules, self.engine.start_times, self._clock.wall())
        if verdict.allowed:
            return
        if self.state in (EngineState.STOPPED, EngineState.BACKOFF):
            # record the refusal on the way through starting, as the machine requires
            await self._journal.observe("start", cause=cause)
        await self._journal.observe(
            "failed", error=verdict.error, retry_at=verdict.retry_at, decision=verdict.decision
        )
        self._check_lockout()

    async def _learn(self, estimate: int) -> None:
        child = self._child
        if child is not None and child.spec is not None:
            await self._account.learn(child.spec, child.identity.pid, estimate, self._build)

    async def _settle_unknown(self) -> None:
        """Record as lost a process the log believes up but this supervisor does not hold.

        That happens when no reconcile ran, or the process was lost; the fresh start follows.
        """
        alive = (EngineState.STARTING, EngineState.RUNNING, EngineState.STOPPING)
        if self._child is None and self.state in (*alive, EngineState.ADOPTING):
            if self.state != EngineState.ADOPTING:
                await self._journal.observe("begin_adoption", daemon_pid=os.getpid())
            await self._journal.observe("lost", cause="no live process is known to this supervisor")

    async def _finish_failed_stop(self) -> None:
        """A group that outlived an earlier stop: try again; refuse to start a second one."""
        if self.state != EngineState.STOPPING or self._child is None:
            return
        await self._stop_locked(StopReason.USER)
        if self._child is not None:
            raise EngineStartError(
                f"{self.key}: pid {self._child.identity.pid} from the last run still does not "
                "exit after KILL; hostler will not start a second copy while it holds memory"
            )

    def _check_lockout(self) -> None:
        now = self._clock.wall()
        if self.state != EngineState.FATAL or self.engine.retry_at is None:
            return
        if now < self.engine.retry_at:
            when = datetime.fromtimestamp(self.engine.retry_at, UTC).strftime("%H:%M:%S UTC")
            raise RestartBudgetError(
                f"{self.key}: {self.engine.last_error}; hostler will try again at {when} "
                f"(in {self.engine.retry_at - now:.0f} s)"
            )

    def _launch_spec(self, port: int, launch: Launch, reserved: int | None) -> LaunchSpec:
        """The spec of this start, as the adapter will see it.

        The priced launch's spec, with the bytes the ledger reserved (RD8), the offload plan the L13
        ladder chose, and the model as the adapter validated it (RD2).
        """
        spec = self._guard.ask("the launch spec", launch.spec, port, returns=LaunchSpec)
        if reserved is not None:  # RD8: what the ledger holds for this launch, to the byte
            spec = dataclasses.replace(spec, reserved_bytes=reserved)
        if self.offload is not None:  # a degraded plan (L13) outlives the start that chose it
            spec = dataclasses.replace(spec, offload=self.offload)
        try:  # RD2: absolute, and a file or a directory as the adapter says
            model: object = self._guard.call(
                "validate_model", self.adapter.validate_model, spec.model
            )
        except HostlerError as exc:
            path = spec.model.absolute()
            if isinstance(exc, ModelFileError) and not path.exists():
                kind = {"file": "model file", "directory": "model directory"}
                what = kind.get(self.adapter.model_kind, "model")
                raise EngineStartError(f"{self.key}: {what} {path} does not exist") from exc
            raise EngineStartError(f"{self.key}: {exc.message}") from exc
        problem = answer_problem(model, Path)
        if isinstance(model, Path) and not model.is_absolute():
            problem = f"returned {repr(model)[:60]}"
        if problem is not None or not isinstance(model, Path):
            raise self._guard.fault(f"{problem} from validate_model")
        return dataclasses.replace(spec, model=model)

    async def _start(
        self, cause: str, token: str, launch: Launch, reserved: int | None = None
    ) -> int:
        await self._journal.decide("start", cause=cause)  # SF2: no start without its record
        timeout = self.startup_timeout  # RD7: a bad adapter timing fails before any spawn
        port = free_port()
        spec = self._launch_spec(port, launch, reserved)
        probe = self._guard.ask("readiness", self.adapter.readiness, spec, returns=ReadinessProbe)
        # RD5: the adapter's argv, then the operator's extra_args (unless it places them)
        command = self._guard.ask(
            "build_command", launch_command, self.adapter, spec, returns=LaunchCommand
        )
        self._tries.handle(Launched(spec.offload, tuple(command.argv)))
        self._build = self._guard.ask(
            "build_identity", self.adapter.build_identity, command, returns=str
        )
        self._run_dir.prepare(spec.work_dir)
        await self._run_dir.rotate()  # an earlier run's output may have filled it
        follower = LogFollower(self.log_path)
        try:
            proc = self._runner.spawn(
                command.argv,
                command.env,
                log_path=self.log_path,
                launch_token=token,
                port=port,
                cwd=spec.work_dir,
            )
        except (OSError, ValueError) as exc:  # ValueError: a NUL in argv or environment
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            message = f"{self.key}: cannot run {command.argv[0]} ({reason})"
            raise EngineStartError(message) from exc
        identity = proc.identity
        child = EngineChild(proc, follower, self._clock.wall(), spec)
        child.startup_timeout = timeout
        if probe.ready_line is not None:
            child.ready_line = re.compile(probe.ready_line)
        self._child = child
        # Recorded before ensure_running can return: a daemon killed from here on finds it.
        await self._journal.observe(
            "spawned",
            pid=identity.pid,
            create_time=identity.create_time,
            boot_id=identity.boot_id,
            launch_token=identity.launch_token,
            argv_fingerprint=identity.argv_fingerprint,
            port=identity.port,
        )
        await self._account.bind(identity)
        await self._await_ready(child, probe)
        return port

    async def _abandon(self, exc: BaseException) -> None:
        """Settle a start that did not finish (SG1): no process left, the outcome recorded."""
        if self.state != EngineState.STARTING:
            # already settled (crash, refusal or abort recorded); free what no process holds
            if self._child is None:
                await self._account.release()
            return
        if isinstance(exc, HostlerError):
            await self._fail(exc)
            return
        why = "cancelled" if isinstance(exc, anyio.get_cancelled_exc_class()) else repr(exc)
        reason = StopReason.START_CANCELLED if why == "cancelled" else StopReason.START_FAILED
        await self._stop_locked(reason, {"cause": why[:500]})

    async def _terminate(
        self, child: EngineChild, *, grace: float, second_grace: float = 1.0
    ) -> Termination:
        """TERM, TERM, KILL the child's group, re-checked before each signal (SG4).

        Through the pidfd held since spawn or adoption where there is one, else the unreaped
        child or the recorded identity: a group that is not the engine's any more is never
        signalled and counts as gone (the Termination's ``detail`` says why).
        """
        child.expected_stop = True
        ended = await child.proc.terminate(
            grace=grace,
            second_grace=second_grace,
            kill_wait=self.policy.kill_wait,
            clock=self._clock,
        )
        if ended.detail and ended.gone:
            log.warning("hostler: %s: not signalled: %s", self.key, ended.detail)
        return ended

    def _drop(self, child: EngineChild) -> None:
        """Forget a child that is done with: its pidfd closed, no longer ours to watch."""
        child.proc.close()
        if self._child is child:
            self._child = None

    async def _kill_child(self, grace: float = 0.5) -> Termination | None:
        child = self._child
        if child is None:
            return None
        ended = await self._terminate(child, grace=grace)
        if ended.gone:
            self._drop(child)
        return ended

    async def _probe_ready(self, child: EngineChild, probe: ReadinessProbe, wait: float) -> bool:
        """RD1: whether the adapter's readiness probe passes now (waiting at most ``wait``)."""
        assert probe.path is not None  # noqa: S101 - the wait sends no probe without a path
        try:
            answer = await self._transport.probe(
                Probe(
                    child.identity.port, probe.path, probe.method, probe.body, probe.content_type
                ),
                wait=wait,
                clock=self._clock,
            )
        except ValueError as exc:  # a probe altered after it was checked: cannot be sent
            raise self._guard.fault(f"gave a readiness probe that cannot be sent: {exc}") from exc
        if answer is None:
            return False
        status, body = answer
        if probe.expect_json is not None and not json_fields_match(body, probe.expect_json):
            return False
        return self._guard.ask(
            "is_ready_response", self.adapter.is_ready_response, status, body, returns=bool
        )

    async def _await_ready(self, child: EngineChild, probe: ReadinessProbe) -> None:
        """Carry out the readiness wait (RD1, :mod:`hostler.machines.readiness`) to its end.

        ``startup_timeout`` bounds the whole wait, a probe in flight included; a stop asked
        meanwhile cancels the probe or pause in flight at once (:meth:`_interruptible`) and
        the engine is stopped here, under the lock the start holds.
        """
        wait = ReadinessWait(
            began=self._clock.monotonic(),
            timeout=child.startup_timeout,
            poll=self.policy.readiness_poll,
            probe_wait=probe.wait,
            has_probe=probe.path is not None,
        )
        effects = wait.start()
        while True:
            seen: ReadinessObservation
            match effects[0]:
                case Look():
                    seen = self._look(child)
                case SendProbe(within):
                    ready = await self._interruptible(self._probe_ready(child, probe, within))
                    seen = Answered(bool(ready), interrupted=self._stop_asked())
                case Pause(seconds):
                    await self._interruptible(self._clock.sleep(seconds))
                    seen = Paused()
                case AbortStart(reason):
                    self._abort_reason = None
                    await self._stop_locked(reason)
                    raise EngineStartError(f"{self.key}: start aborted: stop requested ({reason})")
                case FailStart(exited, timed_out):
                    await self._startup_failed(child, exited=exited, timed_out=timed_out)
                case BecomeReady():
                    child.reached_ready = True
                    self._observe(BecameReady())
                    await self._journal.observe("ready")
                    return
            effects = wait.handle(seen, self._clock.monotonic())

    def _look(self, child: EngineChild) -> Looked:
        """What a look at the starting engine sees (its new lines read first)."""
        if self._abort_reason is not None:
            return Looked(abort=self._abort_reason)
        self._read_lines(child)
        return Looked(
            exited=child.proc.exit_status() is not None,
            fatal=child.panic is not None and child.panic.fatal_at_startup,
            line_pending=child.ready_line is not None and not child.saw_ready_line,
        )

    def _stop_asked(self) -> bool:
        """Whether a stop has asked the start in progress to abort (read after each await)."""
        return self._abort_reason is not None

    async def _interruptible(self, step: Awaitable[T]) -> T | None:
        """``await step`` in a scope that :meth:`stop` cancels; None when it was cancelled."""
        with anyio.CancelScope() as scope:
            self._waiting = scope
            try:
                if self._abort_reason is None:  # a stop asked before this step began
                    return await step
            finally:
                self._waiting = None
        if isinstance(step, Coroutine):
            step.close()  # never started: no "coroutine was never awaited" warning
        return None

    async def _startup_failed(
        self, child: EngineChild, *, exited: bool, timed_out: bool = False
    ) -> NoReturn:
        if not exited and child.panic is not None:
            # SG5: an engine that logged its own death is let to finish dying, so the crash
            # records its own exit status, not the SIGTERM we would otherwise race it with.
            await self._await_own_exit(child, self.policy.panic_exit_wait)
        self._read_lines(child, final=True)
        panic = child.panic.kind if child.panic is not None else None
        self._tries.handle(StartEnded(panic, timed_out=timed_out))
        reason = child.failure_reason(timed_out=timed_out)
        await self._record_crash(child)
        raise EngineStartError(f"{self.key}: {reason}")

    async def _await_own_exit(self, child: EngineChild, within: float) -> bool:
        """Whether our own child exits by itself within ``within`` seconds (polled, 10 ms).

        An adopted engine is not our child (no exit status to wait for): False at once.
        """
        if not child.proc.own:
            return False
        deadline = self._clock.monotonic() + within
        while child.proc.exit_status() is None:
            if self._clock.monotonic() >= deadline:
                return False
            await self._clock.sleep(0.01)
        return True

    def _read_lines(self, child: EngineChild, *, final: bool = False) -> None:
        child.read_lines(self._guard, final=final)

    async def _record_crash(self, child: EngineChild) -> None:
        """The leader died unasked: make sure its group is gone too, record, then release."""
        ended = await self._terminate(child, grace=0.2, second_grace=0.2)
        status = child.proc.exit_status()
        code, sig = (status.code, status.signal) if status is not None else (None, None)
        self._drop(child)
        with anyio.CancelScope(shield=True):  # gone: its record and its bytes, whatever comes
            if self.state in (EngineState.STARTING, EngineState.RUNNING):
                panic_kind = child.panic.kind if child.panic else None
                if panic_kind is None and sig == 4:
                    panic_kind = "illegal-instruction"
                await self._journal.observe(
                    "crashed",
                    exit_code=code,
                    signal=sig,
                    reached_ready=child.reached_ready,
                    retry_at=self._clock.wall(),
                    panic_kind=panic_kind,
                    panic_line=child.panic.line if child.panic else None,
                    uptime=round(self._clock.wall() - child.started, 3),
                    output_tail=child.log.tail(),
                )
            if ended.gone:
                await self._account.release()

    # -- stopping ----------------------------------------------------------------------------

    async def stop(
        self,
        reason: StopReason | str = StopReason.USER,
        decision: dict[str, Any] | None = None,
        *,
        unrecorded_ok: bool = False,
    ) -> None:
        """Stop the engine (TERM, TERM, KILL to its process group) and record why.

        A start in progress is aborted at once: a readiness probe or pause in flight is
        cancelled and the start's own task stops the engine. An engine that had already died
        on its own is recorded as crashed first (SG7), then the stop. When the
        group outlives KILL, that is recorded (``engine.stop_failed``) and its reservation is
        kept; the watch loop tries again. The stop is a decision: when the log cannot record
        it, it is not taken (StoreError) — unless ``unrecorded_ok`` (a shutdown), when the
        engine is stopped anyway and its events kept pending for a later write (SF2).
        """
        if self.state == EngineState.STARTING and self._lock.locked():
            self._abort_reason = str(reason)
            if self._waiting is not None:
                self._waiting.cancel()  # the probe in flight ends now, not at its wait
        async with self._lock:
            # the start this stop aborted has ended; an abort it never read (it failed before
            # its readiness wait) must not abort the next start
            self._abort_reason = None
            await self._stop_locked(str(reason), decision, unrecorded_ok=unrecorded_ok)

    async def _stop_locked(
        self, reason: str, decision: dict[str, Any] | None = None, *, unrecorded_ok: bool = False
    ) -> None:
        record = self._journal.observe if unrecorded_ok else self._journal.decide
        await self._crashed_before_stop()
        if self.state == EngineState.BACKOFF:
            await record("stop", reason=reason, decision=decision)
            return
        if self.state in (EngineState.STARTING, EngineState.RUNNING):
            await record("stop", reason=reason, decision=decision)
        elif self.state != EngineState.STOPPING:
            return
        child = self._child
        code = sig = None
        detail = ""
        if child is not None:
            ended = await self._terminate(child, grace=self.policy.stop_grace)
            if not ended.gone:
                await self._journal.observe(
                    "stop_failed", pid=child.identity.pid, detail=ended.detail
                )
                return  # still ours, still held: memory in use is never freed on paper
            code, sig, detail = ended.exit_code, ended.signal, ended.detail
            self._drop(child)
        with anyio.CancelScope(shield=True):  # the process is gone: record it and free its bytes
            await self._journal.observe("exited", exit_code=code, signal=sig, detail=detail)
            await self._account.release()

    async def _crashed_before_stop(self) -> None:
        """SG7: an engine that died on its own before a stop is recorded as crashed first.

        A stop (an eviction, say) may come before the watch has looked: signalling and reaping
        the corpse would record its death as the stop's (``engine.stopped signal=9``) and lose
        the crash (its output tail, the restart budget, ``hostler explain``). The death is an
        observation of the past, recorded as the watch would (SF1) and its reservation freed;
        the stop then finds the engine in ``backoff`` and records its decision from there.

        Only for an engine this daemon spawned, whose exit status it holds: an adopted one
        that reads as dead may be a pid now another process's, which the stop's own check
        (SG4) records as not signalled, naming the stranger.
        """
        child = self._child
        alive = (EngineState.STARTING, EngineState.RUNNING)
        if child is None or not child.proc.own or child.expected_stop:
            return
        if self.state not in alive or child.proc.exit_status() is None:
            return
        with contextlib.suppress(PluginError):  # a broken classify_line costs the panic only
            self._read_lines(child, final=True)
        await self._record_crash(child)

    # -- watching ----------------------------------------------------------------------------

    async def watch(self) -> None:
        """Run forever: notice crashes, probe health, stop idle engines. Cancel to end.

        A step that cannot be recorded (the log's disk is full, say) is not acted on and is
        tried again at the next tick; it never ends the watch, so the engine keeps an owner.
        """
        self._observe(WatchBegan())
        complained: str | None = None
        while True:
            await self._clock.sleep(self.policy.watch_interval)
            try:
                await self.flush()  # SF1: what the log refused is retried, oldest first
                await self._watch_once()
                complained = None
            except HostlerError as exc:
                if exc.message != complained:  # once per distinct trouble, not every tick
                    log.error("hostler: %s: %s", self.key, exc.message)  # noqa: TRY400
                    complained = exc.message

    async def _watch_once(self) -> None:
        child = self._child
        if child is None or self._lock.locked():
            return
        effects = self._observe(Ticked(self.state, self._alive(child)))
        try:
            while effects:
                effect, *rest = effects
                effects = [*await self._carry_out(effect, child), *rest]
        except PluginError as exc:
            async with self._lock:
                if self._child is child:
                    await self._fail(exc)

    async def _carry_out(self, effect: WatchEffect, child: EngineChild) -> list[WatchEffect]:
        """Do one of the watch's effects; the effects its answer leads to."""
        match effect:
            case FinishStop():
                async with self._lock:
                    if self._child is child:
                        await self._stop_locked(StopReason.USER)
            case RecordCrash():
                async with self._lock:
                    if self._child is child and not child.expected_stop:
                        with contextlib.suppress(PluginError):  # costs the panic, not the crash
                            self._read_lines(child, final=True)
                        await self._record_crash(child)
            case ReadLines():
                self._read_lines(child)
            case RotateLog():
                if await self._run_dir.rotate():
                    self._read_lines(child)  # what it wrote meanwhile, from the rotated copy
            case ProbeHealth():
                return self._observe(HealthProbed(await self._probe_health(child)))
            case ReadPressure():
                pressure = self._pressure
                under = pressure is not None and await self._io.run(pressure)
                return self._observe(PressureRead(under))
            case StopIdle(reason, decision):
                async with self._lock:
                    if self.state == EngineState.RUNNING and not self.busy:
                        await self._stop_locked(reason, decision)
            case StopForHealth(reason, decision):
                async with self._lock:
                    await self._stop_locked(reason, decision)
                with contextlib.suppress(HostlerError):
                    await self.start_when_recordable(cause="health-restart")
        return []

    async def kill_unrecorded(self) -> bool:
        """Stop the process group without recording it: for a shutdown whose log is broken.

        A shutdown still stops what it owns even when the decision cannot be written; the
        next daemon finds the engine gone (``engine.lost``). Returns whether the group is gone.
        """
        ended = await self._kill_child(grace=self.policy.stop_grace)
        return ended is None or ended.gone

    async def _fail(self, exc: HostlerError) -> None:
        """Fail the engine (starting or running): its process killed, then ``engine.failed``.

        The reservation goes back only once no process holds it (SG2).
        """
        ended = await self._kill_child()
        await self._journal.observe("failed", error=exc.message, retry_at=None)
        if ended is None or ended.gone:
            await self._account.release()

    def _alive(self, child: EngineChild) -> bool:
        """Whether the leader still runs; a pid now another process's reads as dead (SG4)."""
        return child.proc.alive()

    async def _probe_health(self, child: EngineChild) -> bool:
        """Whether the engine answers its readiness path as ready now."""
        try:
            answer = await self._transport.probe(
                Probe(child.identity.port, self.adapter.readiness_path),
                wait=2,
                clock=self._clock,
                with_body=False,
            )
        except ValueError as exc:  # a readiness_path set on the instance, past the class check
            raise self._guard.fault(f"has a readiness_path that cannot be sent: {exc}") from exc
        return answer is not None and self._guard.ask(
            "is_ready", self.adapter.is_ready, answer[0], returns=bool
        )

    # -- adoption ------------------------------------------------------------------------------

    def adopt(self, identity: ProcessIdentity, pidfd: Pidfd | None = None) -> None:
        """Watch a live process an earlier daemon started (its identity already checked).

        ``pidfd`` is the one reconcile opened before it checked the identity
        (:func:`hostler.engines.process.open_verified`); the supervisor holds it for the
        engine's life and signals through it (SG4). Without one, one is opened here and the
        identity checked again; a process that no longer matches is held without a pidfd,
        reads as dead to the watcher and is never signalled.
        """
        if self._child is not None:
            self._child.proc.close()
        proc = self._runner.adopt(identity, pidfd)
        self._child = EngineChild(proc, LogFollower(self.log_path), self._clock.wall())
        self._child.reached_ready = True


def _plan_dict(plan: OffloadPlan) -> dict[str, Any]:
    return {"kind": str(plan.kind), "n_cpu_moe": plan.n_cpu_moe, "reason": plan.reason}
