"""The supervisor (anyio driver): runs one engine key's process through its lifecycle.

It is built from four drivers that share one :class:`~hostler.engines.hold.EngineParts` (the
engine's record, account, adapter guard, clock and held process): the start
(:mod:`hostler.engines.starter`), the readiness wait (:mod:`hostler.engines.readywait`), the stop
(:mod:`hostler.engines.stopper`) and the watch (:mod:`hostler.engines.watcher`). Each carries out
what a pure core decides (:mod:`hostler.machines.start`, :mod:`~hostler.machines.readiness`,
:mod:`~hostler.machines.stop`, :mod:`~hostler.machines.watch`) within what the engine lifecycle
machine allows, and records every step before acting on it:
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
import time
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hostler.capacity.offload import OffloadPlan
from hostler.clock import ClockLike, as_clock
from hostler.drivers.host_ledger import HostLedger
from hostler.drivers.loghealth import LogHealth
from hostler.drivers.offloop import OffLoop
from hostler.engines.account import EngineAccount
from hostler.engines.child import EngineChild
from hostler.engines.guard import AdapterGuard
from hostler.engines.hold import EngineHold, EngineParts
from hostler.engines.http import HTTP_TRANSPORT, EngineTransport
from hostler.engines.journal import EngineJournal
from hostler.engines.launcher import FixedLauncher, Launch, Launcher
from hostler.engines.logs import DEFAULT_LOG_KEEP, DEFAULT_LOG_MAX_BYTES, LogFollower
from hostler.engines.process import Pidfd, ProcessIdentity
from hostler.engines.readywait import ReadinessDriver, ReadinessPacing
from hostler.engines.rundir import RunDir
from hostler.engines.runner import OS_RUNNER, ProcessRunner
from hostler.engines.sessions import launch_cache
from hostler.engines.starter import EngineStarter, StartSetting, free_port
from hostler.engines.stopper import EngineStopper, StopPacing
from hostler.engines.watcher import EngineWatcher
from hostler.errors import HostlerError
from hostler.machines.engine import Engine, EngineState, StopReason
from hostler.machines.start import StartTries
from hostler.machines.watch import EngineWatch, Now, RequestBegan, RequestEnded
from hostler.plugin import CacheAdapter, EngineAdapter, LaunchSpec, Progress
from hostler.policies.supervision import SupervisionPolicy
from hostler.probes.nvml import NvmlProbe
from hostler.replay import load
from hostler.store.log import EventStore

__all__ = ["Supervisor", "SupervisorPolicy", "free_port"]


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
        self.adapter = adapter
        self.store = store
        self.run_dir = run_dir
        self.token_prefix = token_prefix
        self.policy = policy or SupervisorPolicy()
        self.rules = self.policy.rules
        self.health = health or LogHealth(store.name)
        #: RD9, IN3: the live daemon other than this one that pays for a launch token, if any.
        self.held_by_other = held_by_other
        clock_ = as_clock(clock)
        io = offloop or OffLoop()
        guard = AdapterGuard(key, adapter)
        journal = EngineJournal(
            key, load(store, Engine, key), store, clock=clock_, offloop=io, health=self.health
        )
        watch = EngineWatch(
            self.rules,
            health_interval=self.policy.health_interval,
            log_check_interval=self.policy.log_check_interval,
            pressure=pressure is not None,
            now=Now(clock_.wall(), clock_.monotonic()),
        )
        self._parts = EngineParts(
            key=key,
            adapter=adapter,
            guard=guard,
            journal=journal,
            account=EngineAccount(key, ledger, guard, io, probe),
            hold=EngineHold(),
            watch=watch,
            clock=clock_,
            io=io,
        )
        self._run_dir = RunDir(
            key, run_dir, max_bytes=self.policy.log_max_bytes, keep=self.policy.log_keep, offloop=io
        )
        self._runner = runner
        tries = StartTries(offload=offload, pinned=offload_pinned)
        self._stopper = EngineStopper(
            self._parts, StopPacing(self.policy.stop_grace, self.policy.kill_wait)
        )
        self._readiness = ReadinessDriver(
            self._parts,
            transport,
            self._stopper,
            tries,
            ReadinessPacing(self.policy.readiness_poll, self.policy.panic_exit_wait),
        )
        self._setting = StartSetting(
            store=store,
            health=self.health,
            rules=self.rules,
            startup_timeout=self.policy.startup_timeout,
            token_prefix=token_prefix,
            owned=owned,
            held_by_other=held_by_other,
        )
        self._starter = EngineStarter(
            self._parts,
            self._setting,
            launcher=launcher,
            tries=tries,
            stopper=self._stopper,
            readiness=self._readiness,
            run_dir=self._run_dir,
            runner=runner,
        )
        self._watcher = EngineWatcher(
            self._parts,
            starter=self._starter,
            stopper=self._stopper,
            run_dir=self._run_dir,
            transport=transport,
            interval=self.policy.watch_interval,
            pressure=pressure,
        )

    # -- the facts others read ------------------------------------------------------------------

    @property
    def owned(self) -> Callable[[], Collection[int]] | None:
        """RD9: the live engine pids of every supervisor of this daemon (never swept)."""
        return self._setting.owned

    @property
    def engine(self) -> Engine:
        """The engine's lifecycle machine, as its events say."""
        return self._parts.engine

    @property
    def state(self) -> str:
        """The lifecycle state."""
        return self._parts.state

    @property
    def _child(self) -> EngineChild | None:
        return self._parts.hold.child

    @property
    def pid(self) -> int | None:
        """The live process id, if any."""
        child = self._child
        return child.identity.pid if child else None

    @property
    def port(self) -> int | None:
        """The engine's loopback port while it is up."""
        child = self._child
        return child.identity.port if child else None

    def exited_unseen(self) -> bool:
        """Running, as far as the log knows, though its process is gone (a crash not yet seen).

        The watch sees such an exit at its next tick; a request must not be handed the dead
        port meanwhile (a non-blocking check: ``waitpid`` with no wait, or a pidfd signal 0).
        """
        child = self._child
        return self.state == EngineState.RUNNING and child is not None and not child.proc.alive()

    async def confirm_exit(self, within: float) -> bool:
        """Whether the engine's process is gone, waiting up to ``within`` s for an exit.

        A crash the watch has not yet seen is recorded now. False while a process still runs
        after ``within``: it is alive, just not answering.
        """
        clock = self._parts.clock
        deadline = clock.monotonic() + within
        while self.state == EngineState.RUNNING and not self.exited_unseen():
            if clock.monotonic() >= deadline:
                return False
            await clock.sleep(0.01)  # polled: a child's exit has no event to wait on here
        if self.exited_unseen():
            await self.notice_exit()
        return True

    async def notice_exit(self) -> None:
        """Record a crash :meth:`exited_unseen` found now, as the watch's next tick would."""
        await self._watcher.notice_exit()

    @property
    def launch_spec(self) -> LaunchSpec | None:
        """What the live process was launched with (None when none runs, or it was adopted)."""
        child = self._child
        return child.spec if child else None

    def cache_adapter(self) -> CacheAdapter | None:
        """L16: the prompt-cache adapter of the process running now, made once per launch.

        The stop saves its sessions through the same one (CC13). None when no process runs,
        it was adopted, its engine has no cache, or its plugin raised.
        """
        child = self._child
        return None if child is None else launch_cache(self._parts, child)

    @property
    def startup_timeout(self) -> float:
        """RD7: seconds a start may take: the policy's when set, else the adapter's.

        Raises:
            PluginError: The adapter's ``startup_timeout`` is not a usable number of seconds.
        """
        return self._starter.startup_timeout

    @property
    def log_path(self) -> Path:
        """The engine's output file."""
        return self._run_dir.log_path

    @property
    def offload(self) -> OffloadPlan | None:
        """The offload plan every start uses instead of its spec's own (L13; None: the spec's)."""
        return self._starter.offload

    @property
    def busy(self) -> bool:
        """Requests are in flight."""
        return self._parts.watch.busy

    @property
    def last_used(self) -> float:
        """When the engine was last used (wall time): a request's start or end, or a start."""
        return self._parts.watch.last_used

    @property
    def progress(self) -> Progress | None:
        """PG1: how far the engine's current job has come, while it is busy (else None)."""
        child = self._child
        if not self.busy or child is None:
            return None
        return child.progress

    async def flush(self, *, force: bool = False) -> bool:
        """Write the engine's pending events; whether none are left pending (SF1).

        While the log fails, tries at most once a second unless ``force``.
        """
        return await self._parts.journal.flush(force=force)

    # -- requests and starts -------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def request(self) -> AsyncIterator[int]:
        """Hold the engine for one request: started if needed, never idle-stopped meanwhile."""
        port = await self.ensure_running()
        child = self._child
        if not self.busy and child is not None:
            child.progress = None  # PG1: a new job; the last one's progress is over
        self._parts.observe(RequestBegan())
        try:
            yield port
        finally:
            self._parts.observe(RequestEnded())

    def price(self) -> Launch:
        """The next start's launch, priced now (blocking: run it off the event loop).

        The pool makes room for exactly these bytes and hands the same launch to
        :meth:`ensure_running`; ``hostler preview`` through the daemon shows this price.
        """
        return self._starter.price()

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
        return await self._starter.ensure_running(cause, on_reserved=on_reserved, launch=launch)

    async def start_when_recordable(self, cause: str, *, retry_every: float = 1.0) -> int:
        """:meth:`ensure_running`, tried again while the log cannot record the start (SF2).

        A start the log refused was not taken; once the log takes writes again it is. Any
        other failure (and a corrupt log) ends the attempt with its error.
        """
        return await self._starter.start_when_recordable(cause, retry_every=retry_every)

    async def fail_unstartable(self, exc: HostlerError, cause: str = "config") -> None:
        """Record that the engine cannot be started at all (its plugin is missing or broken).

        Through ``starting`` to ``failed``, naming the cause, unless it is running (adopted):
        then it stays watched, and only a stop can be done to it.
        """
        await self._starter.fail_unstartable(exc, cause)

    # -- stopping and watching -----------------------------------------------------------------

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
        lock = self._parts.hold.lock
        if self.state == EngineState.STARTING and lock.locked():
            self._readiness.interrupt(str(reason))
        async with lock:
            # the start this stop aborted has ended; an abort it never read (it failed before
            # its readiness wait) must not abort the next start
            self._readiness.clear()
            await self._stopper.stop_locked(str(reason), decision, unrecorded_ok=unrecorded_ok)

    async def kill_unrecorded(self) -> bool:
        """Stop the process group without recording it: for a shutdown whose log is broken.

        A shutdown still stops what it owns even when the decision cannot be written; the
        next daemon finds the engine gone (``engine.lost``). Returns whether the group is gone.
        """
        return await self._stopper.kill_unrecorded()

    async def watch(self) -> None:
        """Run forever: notice crashes, probe health, stop idle engines. Cancel to end.

        A step that cannot be recorded (the log's disk is full, say) is not acted on and is
        tried again at the next tick; it never ends the watch, so the engine keeps an owner.
        """
        await self._watcher.watch()

    # -- adoption ------------------------------------------------------------------------------

    def adopt(
        self, identity: ProcessIdentity, pidfd: Pidfd | None = None, spec: LaunchSpec | None = None
    ) -> None:
        """Watch a live process an earlier daemon started (its identity already checked).

        ``pidfd`` is the one reconcile opened before it checked the identity
        (:func:`hostler.engines.process.open_verified`); the supervisor holds it for the
        engine's life and signals through it (SG4). Without one, one is opened here and the
        identity checked again; a process that no longer matches is held without a pidfd,
        reads as dead to the watcher and is never signalled. ``spec`` is what it was launched
        with when the log recorded it (``engine.spawned`` v3): the run then has its
        prompt-cache adapter (CC13) like one this daemon started.
        """
        proc = self._runner.adopt(identity, pidfd)
        child = EngineChild(proc, LogFollower(self.log_path), self._parts.clock.wall(), spec)
        child.reached_ready = True
        self._parts.hold.hold(child)
