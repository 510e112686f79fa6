"""The start of an engine (anyio driver): priced, reserved, recorded, spawned, made ready.

One start at a time per engine key, under the hold's lock: the restart budget (SP1) and the
lockout are checked, the launch priced once (or taken as the pool priced it) and reserved in
the host ledger, ``engine.start_requested`` recorded before the spawn (SF2), the spawned
process's identity recorded before the start can return, and the readiness wait carried out
(:mod:`hostler.engines.readywait`). What follows a failed start — the OOM ladder's next plan
(L13), one sweep of strays and one retry (RD9), or giving up — is the pure
:class:`~hostler.machines.start.StartTries`'s to decide; this driver carries it out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import secrets
import socket
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio

from hostler.capacity.cpu_limits import weights_unrunnable
from hostler.capacity.offload import OffloadPlan
from hostler.drivers.loghealth import LogHealth
from hostler.engines.child import EngineChild
from hostler.engines.hold import EngineParts
from hostler.engines.launched import spec_record
from hostler.engines.launcher import Launch, Launcher
from hostler.engines.logs import LogFollower
from hostler.engines.readywait import ReadinessDriver
from hostler.engines.resweep import anchors_of, sweep_strays
from hostler.engines.rundir import RunDir
from hostler.engines.runner import ProcessRunner
from hostler.engines.sessions import launch_cache
from hostler.engines.stopper import EngineStopper
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
from hostler.events.cpu import CPU_STREAM, CpuUnsupported
from hostler.events.offload import OffloadDegraded, offload_stream
from hostler.machines.engine import EngineState, StopReason
from hostler.machines.start import (
    AskSweep,
    AttemptBegan,
    EnsureBegan,
    GiveUp,
    Launched,
    RecordCpuLimit,
    RecordDegrade,
    Recorded,
    Retry,
    StartFailed,
    StartTries,
    Sweep,
    SweepAnswered,
    Swept,
)
from hostler.machines.watch import StartAsked
from hostler.plugin import (
    LaunchCommand,
    LaunchSpec,
    ReadinessProbe,
    launch_command,
    timing_problem,
)
from hostler.pluginhost import answer_problem
from hostler.policies.supervision import SupervisionPolicy, decide_start
from hostler.probes.cpu import cpu_identity
from hostler.store.log import EventStore

__all__ = ["EngineStarter", "StartSetting", "free_port"]

log = logging.getLogger(__name__)


def free_port() -> int:
    """A free loopback port chosen by the OS (the engine's bind catches a race)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True, slots=True)
class StartSetting:
    """Where and under what rules an engine key's starts run.

    Attributes:
        store: The daemon's event log (``offload.degraded`` and ``cpu.unsupported`` go there).
        health: The log's write health (no start while it is corrupt).
        rules: The restart budget and lockout (SP1).
        startup_timeout: RD7: the operator's bound on a start (None: the adapter's).
        token_prefix: Identifies this daemon's data directory in launch tokens.
        owned: RD9: the live engine pids of this daemon (never swept); None: no sweep.
        held_by_other: RD9, IN3: the live daemon other than this one that pays for a token.
    """

    store: EventStore
    health: LogHealth
    rules: SupervisionPolicy
    startup_timeout: float | None
    token_prefix: str
    owned: Callable[[], Collection[int]] | None = None
    held_by_other: Callable[[str], str | None] | None = None


class EngineStarter:
    """Starts one engine key's process and waits until it is ready.

    Args:
        parts: What the engine's drivers share.
        setting: Where and under what rules the starts run.
        launcher: Where each start's priced launch comes from (price once).
        tries: What follows a failed start (L13, RD9).
        stopper: Ends a start that did not finish (SG1), and a failed one.
        readiness: The readiness wait.
        run_dir: The engine's log file and work directory.
        runner: Spawns the engine's process.
    """

    def __init__(
        self,
        parts: EngineParts,
        setting: StartSetting,
        *,
        launcher: Launcher,
        tries: StartTries,
        stopper: EngineStopper,
        readiness: ReadinessDriver,
        run_dir: RunDir,
        runner: ProcessRunner,
    ) -> None:
        self._key = parts.key
        self._parts = parts
        self._adapter = parts.adapter
        self._guard = parts.guard
        self._journal = parts.journal
        self._account = parts.account
        self._hold = parts.hold
        self._clock = parts.clock
        self._io = parts.io
        self._setting = setting
        self._launcher = launcher
        self._tries = tries
        self._stopper = stopper
        self._readiness = readiness
        self._run_dir = run_dir
        self._runner = runner
        self._build = "unknown"
        self._launched_spec: LaunchSpec | None = None  # the last start's (L22 names its model)

    @property
    def startup_timeout(self) -> float:
        """RD7: seconds a start may take: the policy's when set, else the adapter's.

        Raises:
            PluginError: The adapter's ``startup_timeout`` is not a usable number of seconds.
        """
        if self._setting.startup_timeout is not None:
            return self._setting.startup_timeout
        problem = timing_problem(self._adapter)
        if problem is not None:
            raise self._guard.fault(f"has a bad timing: {problem}")
        return float(self._adapter.startup_timeout)

    @property
    def offload(self) -> OffloadPlan | None:
        """The offload plan every start uses instead of its spec's own (L13; None: the spec's)."""
        return self._tries.offload

    def price(self) -> Launch:
        """The next start's launch, priced now (blocking: run it off the event loop)."""
        return self._guard.call("estimate_footprint", self._launcher.price)

    async def ensure_running(
        self,
        cause: str = "request",
        *,
        on_reserved: Callable[[], None] | None = None,
        launch: Launch | None = None,
    ) -> int:
        """Start the engine if needed and wait until ready; return its port.

        See :meth:`hostler.engines.supervisor.Supervisor.ensure_running`.
        """
        self._parts.observe(StartAsked())
        async with self._hold.lock:
            self._tries.handle(EnsureBegan(can_sweep=self._setting.owned is not None))
            while True:
                outcome = await self._attempt(cause, on_reserved, launch)
                if isinstance(outcome, int):
                    return outcome
                cause, launch = outcome.cause, None

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
        async with self._hold.lock:
            state = self._parts.state
            if state == EngineState.FATAL:
                return
            if state not in (EngineState.STOPPED, EngineState.BACKOFF):
                return
            await self._journal.observe("start", cause=cause)
            await self._journal.observe("failed", error=exc.message, retry_at=None)

    async def _attempt(
        self, cause: str, on_reserved: Callable[[], None] | None, launch: Launch | None
    ) -> int | Retry:
        """One start (under the lock): the port, or the retry the start's failure leads to."""
        self._tries.handle(AttemptBegan())
        child = self._hold.child
        if self._parts.state == EngineState.RUNNING and child is not None:
            return child.identity.port
        if self._setting.health.corrupt is not None:
            raise StoreCorruptError(
                f"{self._key}: not started: the event log is corrupt "
                f"({self._setting.health.corrupt}); hostler starts no new work until it is "
                "restored (docs/daemon.md)"
            )
        await self._stopper.finish_failed_stop()
        await self._settle_unknown()
        self._check_lockout()
        if self._parts.state == EngineState.FATAL:
            await self._journal.decide("reset", cause="new request after a failure")
        await self._check_budget(cause)
        token = f"{self._setting.token_prefix}:{secrets.token_hex(8)}"
        try:
            if launch is None:  # pricing reads the model, the ledger and the calibration
                launch = await self._io.run(self.price)
            reserved = await self._account.reserve(token, launch)
        except CapacityDeniedError:
            raise  # recorded in the ledger's log, with its inputs; not the engine's fault
        except StoreError:
            raise  # a log or ledger that cannot be read or written: not taken, not the engine's
        except HostlerError as exc:
            await self._journal.observe("start", cause=cause)
            await self._stopper.fail(exc)
            raise
        if on_reserved is not None:
            on_reserved()
        try:
            port = await self._start(cause, token, launch, reserved)
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await self._abandon(exc)
            retry = await self._after_failed_start(exc)
            if isinstance(retry, HostlerError):
                raise retry from exc
            if retry is None:
                raise
            return retry
        await self._learn(reserved or 0)
        return port

    async def _after_failed_start(self, exc: BaseException) -> Retry | HostlerError | None:
        """Carry out what the tries say follows a failed start.

        The retry; or the error to raise instead of ``exc`` (L22: weights this CPU cannot
        run, said with the fix); or None (``exc`` stands).
        """
        start_error = isinstance(exc, EngineStartError)
        message = exc.message if isinstance(exc, HostlerError) else ""
        effects = self._tries.handle(StartFailed(start_error, message))
        unrunnable: HostlerError | None = None
        while effects:
            match effects[0]:
                case Retry() as retry:
                    return retry
                case GiveUp():
                    return unrunnable
                case RecordCpuLimit() as limit:
                    recorded = await self._record_cpu_limit(limit, message)
                    if limit.what == "weights":
                        unrunnable = EngineStartError(weights_unrunnable(self._key, message))
                    effects = self._tries.handle(Recorded(recorded))
                case RecordDegrade() as degrade:
                    effects = self._tries.handle(Recorded(await self._record_degrade(degrade)))
                case AskSweep(message):
                    effects = self._tries.handle(SweepAnswered(await self._sweep_wanted(message)))
                case Sweep(argv):
                    effects = self._tries.handle(Swept(await self._sweep(argv)))
        return None

    async def _record_cpu_limit(self, limit: RecordCpuLimit, message: str) -> bool:
        """L22: record what this build cannot run on this CPU; whether the log took it."""
        spec = self._launched_spec
        model = spec.model.name if spec is not None else ""
        if spec is not None:
            with contextlib.suppress(HostlerError):  # a raising plugin costs the model's name
                model = self._guard.ask(
                    "model_identity", self._adapter.model_identity, spec.model, returns=str
                )
        event = CpuUnsupported(
            at=self._clock.wall(),
            key=self._key,
            build=self._build or "unknown",
            cpu=cpu_identity(),
            what=limit.what,
            kv_type=limit.kv_type,
            model=model,
            message=message[:500],
        )
        store = self._setting.store
        try:
            await self._io.run(lambda: store.append(CPU_STREAM, [event], expected_version=None))
        except HostlerError:
            return False
        return True

    async def _record_degrade(self, degrade: RecordDegrade) -> bool:
        """L13: record ``offload.degraded`` before the next plan is tried; whether it was."""
        launched, plan = degrade.launched, degrade.plan
        event = OffloadDegraded(
            self._clock.wall(), self._key, degrade.panic, _plan_dict(launched), _plan_dict(plan)
        )
        store = self._setting.store
        try:
            await self._io.run(
                lambda: store.append(offload_stream(self._key), [event], expected_version=None)
            )
        except HostlerError:
            return False
        log.warning(
            "hostler: %s: out of GPU memory as %s; retrying as %s",
            self._key,
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
                self._adapter.on_exited_before_ready,
                message,
                returns=bool,
            )
        except PluginError as fault:  # SG3: the crash is recorded; the engine fails too
            with anyio.CancelScope(shield=True):
                await self._stopper.fail(fault)
            raise

    async def _sweep(self, argv: tuple[str, ...]) -> int:
        """RD9: stop this data directory's unowned strays named by the launch; how many."""
        owned = self._setting.owned
        if owned is None:
            return 0
        swept = await sweep_strays(
            self._setting.token_prefix,
            owned=owned(),
            anchors=anchors_of(argv),
            held_by_other=self._setting.held_by_other,
            offloop=self._io,
            clock=self._clock,
        )
        if swept:
            pids = ", ".join(str(stray.pid) for stray in swept)
            log.warning("hostler: %s: retrying after stopping stray engine(s) %s", self._key, pids)
        return len(swept)

    async def _check_budget(self, cause: str) -> None:
        """SP1: refuse (recorded, with the start times counted) past the restart budget."""
        engine = self._parts.engine
        verdict = decide_start(self._setting.rules, engine.start_times, self._clock.wall())
        if verdict.allowed:
            return
        if self._parts.state in (EngineState.STOPPED, EngineState.BACKOFF):
            # record the refusal on the way through starting, as the machine requires
            await self._journal.observe("start", cause=cause)
        await self._journal.observe(
            "failed", error=verdict.error, retry_at=verdict.retry_at, decision=verdict.decision
        )
        self._check_lockout()

    async def _learn(self, estimate: int) -> None:
        child = self._hold.child
        if child is not None and child.spec is not None:
            await self._account.learn(child.spec, child.identity.pid, estimate, self._build)

    async def _settle_unknown(self) -> None:
        """Record as lost a process the log believes up but this supervisor does not hold.

        That happens when no reconcile ran, or the process was lost; the fresh start follows.
        """
        alive = (EngineState.STARTING, EngineState.RUNNING, EngineState.STOPPING)
        state = self._parts.state
        if self._hold.child is None and state in (*alive, EngineState.ADOPTING):
            if state != EngineState.ADOPTING:
                await self._journal.observe("begin_adoption", daemon_pid=os.getpid())
            await self._journal.observe("lost", cause="no live process is known to this supervisor")

    def _check_lockout(self) -> None:
        now = self._clock.wall()
        engine = self._parts.engine
        if engine.state != EngineState.FATAL or engine.retry_at is None:
            return
        if now < engine.retry_at:
            when = datetime.fromtimestamp(engine.retry_at, UTC).strftime("%H:%M:%S UTC")
            raise RestartBudgetError(
                f"{self._key}: {engine.last_error}; hostler will try again at {when} "
                f"(in {engine.retry_at - now:.0f} s)"
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
        if self._tries.kv_type is not None:  # L22: so does the KV type a SIGILL left
            spec = dataclasses.replace(spec, kv_type=self._tries.kv_type)
        try:  # RD2: absolute, and a file or a directory as the adapter says
            model: object = self._guard.call(
                "validate_model", self._adapter.validate_model, spec.model
            )
        except HostlerError as exc:
            path = spec.model.absolute()
            if isinstance(exc, ModelFileError) and not path.exists():
                kind = {"file": "model file", "directory": "model directory"}
                what = kind.get(self._adapter.model_kind, "model")
                raise EngineStartError(f"{self._key}: {what} {path} does not exist") from exc
            raise EngineStartError(f"{self._key}: {exc.message}") from exc
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
        probe = self._guard.ask("readiness", self._adapter.readiness, spec, returns=ReadinessProbe)
        # RD5: the adapter's argv, then the operator's extra_args (unless it places them)
        command = self._guard.ask(
            "build_command", launch_command, self._adapter, spec, returns=LaunchCommand
        )
        self._tries.handle(Launched(spec.offload, tuple(command.argv), spec.kv_type))
        self._launched_spec = spec
        self._build = self._guard.ask(
            "build_identity", self._adapter.build_identity, command, returns=str
        )
        self._run_dir.prepare(spec.work_dir)
        await self._run_dir.rotate()  # an earlier run's output may have filled it
        log_path = self._run_dir.log_path
        follower = LogFollower(log_path)
        try:
            proc = self._runner.spawn(
                command.argv,
                command.env,
                log_path=log_path,
                launch_token=token,
                port=port,
                cwd=spec.work_dir,
            )
        except (OSError, ValueError) as exc:  # ValueError: a NUL in argv or environment
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            message = f"{self._key}: cannot run {command.argv[0]} ({reason})"
            raise EngineStartError(message) from exc
        identity = proc.identity
        child = EngineChild(proc, follower, self._clock.wall(), spec)
        child.startup_timeout = timeout
        if probe.ready_line is not None:
            child.ready_line = re.compile(probe.ready_line)
        self._hold.hold(child)
        # Recorded before ensure_running can return: a daemon killed from here on finds it.
        await self._journal.observe(
            "spawned", **identity.spawned_facts(), launched=spec_record(spec)
        )
        await self._account.bind(identity)
        await self._readiness.await_ready(child, probe)
        # L16/CC13: the launch's cache adapter, made now and off the loop (a plugin may read
        # files to make it: llama.cpp's stamps the model file its saved states belong to)
        await self._parts.io.run(launch_cache, self._parts, child)
        return port

    async def _abandon(self, exc: BaseException) -> None:
        """Settle a start that did not finish (SG1): no process left, the outcome recorded."""
        if self._parts.state != EngineState.STARTING:
            # already settled (crash, refusal or abort recorded); free what no process holds
            if self._hold.child is None:
                await self._account.release()
            return
        if isinstance(exc, HostlerError):
            await self._stopper.fail(exc)
            return
        why = "cancelled" if isinstance(exc, anyio.get_cancelled_exc_class()) else repr(exc)
        reason = StopReason.START_CANCELLED if why == "cancelled" else StopReason.START_FAILED
        await self._stopper.stop_locked(reason, {"cause": why[:500]})


def _plan_dict(plan: OffloadPlan) -> dict[str, Any]:
    return {"kind": str(plan.kind), "n_cpu_moe": plan.n_cpu_moe, "reason": plan.reason}
