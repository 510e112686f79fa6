"""The daemon: keeps configured engines under supervision, and survives its own restarts.

On start it replays its event log, reconciles the live process table (adopting engines that
are still ours, reporting lost ones, reaping strays), re-derives the host ledger's
reservations from the survivors, then supervises every configured engine until SIGTERM or
SIGINT, when it stops them (reason ``shutdown``). Killed with SIGKILL, it leaves its engines
running; the next daemon on the same data directory adopts them without a reload.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import math
import os
import re
import secrets
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import anyio
import psutil

from hostler._version import __version__
from hostler.capacity.budget import CapacityBudget
from hostler.capacity.keys import parse_key
from hostler.config import DaemonConfig, EngineConfig, load_config
from hostler.drivers.host_ledger import (
    HostLedger,
    LedgerLocation,
    OwnerIdentity,
    open_ledger_store,
)
from hostler.drivers.loghealth import LogHealth
from hostler.drivers.offloop import DAEMON_BUSY_TIMEOUT, OffLoop
from hostler.engines.launcher import LedgerLauncher
from hostler.engines.price import LaunchRequest
from hostler.engines.process import token_holders
from hostler.engines.reconcile import DAEMON_STREAM, Outcome, reconcile
from hostler.engines.supervisor import Supervisor, SupervisorPolicy
from hostler.errors import (
    ConcurrencyError,
    EngineStartError,
    HostlerError,
    PluginError,
    RuntimeClosedError,
    StoreBusyError,
    StoreCorruptError,
    StoreDamagedRowError,
    StoreError,
    UnknownEngineError,
    UsageError,
)
from hostler.events.base import Event
from hostler.events.daemon import (
    DaemonGap,
    DaemonLogRecovered,
    DaemonStarted,
    DaemonStopped,
)
from hostler.machines.engine import StopReason
from hostler.paths import private_dir, private_file
from hostler.plugin import (
    EngineAdapter,
    LaunchCommand,
    LaunchSpec,
    timing_problem,
    validate_options,
)
from hostler.pluginhost import PluginHost, plugin_fault
from hostler.policies.eviction import EvictionPolicy, eviction_policy
from hostler.probes.device import DEVICE_STREAM, budget_from, sample_device
from hostler.probes.nvml import NvmlProbe, open_nvml
from hostler.probes.process import measure_process
from hostler.replay import replay
from hostler.runtime.arbiter import GpuArbiter
from hostler.runtime.facade import Runtime
from hostler.runtime.health import DeviceHealthGate, HealthSample, nvml_sampler
from hostler.serve.access import check_exposure
from hostler.serve.app import make_app
from hostler.serve.server import (
    ADDRESS_FILE,
    HttpServer,
    bind_listener,
    is_loopback,
    load_token,
)
from hostler.store.log import EventStore

__all__ = [
    "Daemon",
    "DaemonConfig",
    "DaemonStarted",
    "EngineConfig",
    "check_engine_options",
    "load_config",
]

log = logging.getLogger(__name__)
T = TypeVar("T")
PLUGIN_STREAM = "plugins/host"


def daemon_id(data_dir: Path) -> str:
    """This data directory's identity in launch tokens (created once, kept)."""
    path = data_dir / "daemon-id"
    try:
        return path.read_text(encoding="ascii").strip()
    except OSError:
        private_dir(data_dir)
        value = f"hostler-{secrets.token_hex(6)}"
        private_file(path, value + "\n")
        return value


def _safe(key: str) -> str:
    """A file name for a key's run directory, one per key (two keys never share one).

    ``:`` becomes ``_`` (``llamacpp:qwen:0`` → ``llamacpp_qwen_0``). A key that holds ``_``
    itself or any character outside ``[A-Za-z0-9.:-]`` could then meet another's name, so it
    gets a short hash of itself appended: ``a/0``, ``a 0`` and ``a_0`` stay apart.
    """
    safe = key.replace(":", "_")
    if re.fullmatch(r"[A-Za-z0-9.:-]+", key):
        return safe
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", key)
    return f"{safe[:180]}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


class DeviceWatch:
    """Samples the device now and then; records a sample when the budget's inputs change."""

    def __init__(self, store: EventStore, probe: NvmlProbe, interval: float = 30.0) -> None:
        self.store = store
        self.probe = probe
        self.interval = interval
        self.budget: CapacityBudget
        self._last: tuple[object, ...] | None = None

    def sample(self) -> None:
        """Take a sample; record it if RAM, cards or the override changed."""
        sample = sample_device(self.probe, at=time.time())
        fingerprint = (
            sample.system_ram,
            tuple((g["uuid"], g["total"]) for g in sample.gpus),
            sample.budget_override_gib,
        )
        if fingerprint != self._last:
            self.store.append(DEVICE_STREAM, [sample], expected_version=None)
            self._last = fingerprint
        self.budget = budget_from(sample)

    async def run(self) -> None:
        """Sample every ``interval`` seconds until cancelled; a failed sample is tried later."""
        complained = ""
        while True:
            await anyio.sleep(self.interval)
            try:
                await anyio.to_thread.run_sync(self.sample)
                complained = ""
            except HostlerError as exc:  # the log or the probe: the old budget stands
                if exc.message != complained:
                    log.error("hostler: device sample not recorded: %s", exc.message)  # noqa: TRY400
                    complained = exc.message


class Daemon:
    """The long-running process behind ``hostler daemon``."""

    def __init__(self, config: DaemonConfig, *, listen: tuple[str, int] | None = None) -> None:
        self.config = config
        self.listen = listen
        self._listener: socket.socket | None = None
        self.http: HttpServer | None = None
        self.runtime: Runtime | None = None
        self.ready = anyio.Event()
        self.offloop = OffLoop()
        self.probe: NvmlProbe | None = None
        self.health = LogHealth(str(config.data_dir / "events.db"))
        self.ledger: HostLedger | None = None
        self._started = False
        self._store: EventStore | None = None
        self._adapters: dict[str, EngineAdapter] = {}
        self._plugins: PluginHost | None = None
        self._token_prefix = ""  # daemon_id() writes into the data directory: made at start-up
        self._health_gate: DeviceHealthGate | None = None
        self._adopted: set[str] = set()  # engine keys reconcile adopted (configured or not)
        self._scope: anyio.CancelScope | None = None
        self._stop_cause: str | None = None

    @staticmethod
    def _check_listen(listen: tuple[str, int]) -> None:
        host, port = listen
        if not host or not 0 <= port <= 65535:
            raise UsageError(f"cannot listen on {host!r}:{port}: give a host and a port 0-65535")

    async def _start_http(self, tasks: anyio.abc.TaskGroup) -> None:
        """The HTTP face (docs/serve.md) on the runtime, listening once the engines are settled."""
        assert self.listen is not None  # noqa: S101 - callers check
        assert self.runtime is not None  # noqa: S101 - made by _run
        host, port = self.listen
        config = self.config
        token: str | None
        if config.auth == "none":  # loopback only (check_exposure): every route open
            token, where = None, "no token: every route is open to this machine's users"
        elif config.token is not None:
            token, where = config.token, "the token is HOSTLER_TOKEN"
        else:
            token = await self.offloop.run(load_token, config.data_dir)
            where = f"the token is in {config.data_dir / 'token'}"
        models: dict[str, str] = {}
        for engine in config.engines:
            parsed = parse_key(engine.key)
            if parsed is not None:
                models.setdefault(parsed.model, f"{parsed.engine}:{parsed.model}")
        app = make_app(
            self.runtime,
            models,
            token=token,
            public=not is_loopback(host),
            open_routes=config.auth == "none",
        )
        sock, self._listener = self._listener, None
        server = HttpServer(app, host, port, sock=sock)
        self.http = server
        tasks.start_soon(server.serve)
        await server.started.wait()
        where_file = config.data_dir / ADDRESS_FILE  # the client commands send the token there
        url = f"http://{host if ':' not in host else f'[{host}]'}:{server.port}"
        await self.offloop.run(lambda: private_file(where_file, url + "\n"))
        log.info(
            "hostler: serving on http://%s:%d (%d models; %s)",
            host,
            server.port,
            len(models),
            where,
        )
        if not models:
            log.warning(
                "hostler: no models to serve: put *.gguf files in %s (HOSTLER_MODELS_DIR), or "
                "give --config FILE with [[models]] (docs/daemon.md)",
                config.data_dir / "models",
            )

    async def _health_sample(self) -> HealthSample:
        """The health gate's NVML sample, through the daemon's one probe once it is open."""
        if self.probe is None:
            return HealthSample(error="the GPU probe is not open yet")
        return await nvml_sampler(self.probe)()

    @property
    def supervisors(self) -> dict[str, Supervisor]:
        """The engines this daemon owns (its runtime's pool), by key."""
        if self.runtime is None:
            return {}
        pool = self.runtime.pool
        return {key: pool.supervisor(key) for key in pool.engine_keys()}

    async def run(self, *, handle_signals: bool = True) -> None:
        """Run until SIGTERM or SIGINT (or :meth:`stop`, or cancellation).

        ``handle_signals=False`` leaves the process's signals to the embedding program
        (:func:`hostler.open_daemon`).
        """
        config = self.config
        location = config.ledger_location()  # a bad setting refused before anything is made
        # DH1: HOSTLER_DEVICE_SAFETY_* refused in one line before anything is made, too
        self._health_gate = DeviceHealthGate.from_environment(sampler=self._health_sample)
        if self.listen is not None:
            self._check_listen(self.listen)
            check_exposure(*self.listen, config.auth)  # before anything is made
            # the address first: one in use (another hostler serve) is refused before the data
            # directory is touched; connections queue until the face serves them
            self._listener = bind_listener(*self.listen)
        try:
            await self._run_bound(location, handle_signals=handle_signals)
        finally:
            if self._listener is not None:
                self._listener.close()  # never served (a failed start): the address is freed
                self._listener = None

    async def _run_bound(self, location: LedgerLocation, *, handle_signals: bool) -> None:
        config = self.config
        private_dir(config.data_dir)
        # Listen before taking anything over: a SIGTERM during start-up is a shutdown too.
        receiver = (
            anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT)
            if handle_signals
            else contextlib.nullcontext(_never())
        )
        with receiver as signals:
            store = await self.offloop.run(self._open_log)
            with store:
                ledger_store = open_ledger_store(location, busy_timeout=DAEMON_BUSY_TIMEOUT)
                try:
                    await self._run(store, ledger_store, signals)
                finally:
                    ledger_store.close()

    def _open_log(self) -> EventStore:
        """The data directory's log, owned; a corrupt one names the engines it leaves (SF3)."""
        path = self.config.data_dir / "events.db"
        try:
            return EventStore.open(
                path,
                owner=True,
                busy_timeout=DAEMON_BUSY_TIMEOUT,
                max_bytes=self.config.log_max_bytes,
            )
        except StoreCorruptError as exc:
            raise StoreCorruptError(exc.message + self._orphans_note()) from None

    def _orphans_note(self) -> str:
        prefix = f"{daemon_id(self.config.data_dir)}:"
        pids = sorted(p.pid for p, _ in token_holders(lambda t: t.startswith(prefix)))
        if not pids:
            return "; no engine of this data directory is running"
        return (
            f"; engines of this data directory still run unsupervised (pids "
            f"{', '.join(map(str, pids[:20]))}): stop them (kill -TERM), or move the log aside "
            "and restart the daemon, which stops them as strays (docs/daemon.md)"
        )

    async def _run(
        self, store: EventStore, ledger_store: EventStore, signals: AsyncIterator[int]
    ) -> None:
        received: list[str] = []
        failed: list[HostlerError] = []
        self._store = store
        runtime = Runtime(
            store,
            self._build_supervisor,
            offloop=self.offloop,
            pinned=[e.key for e in self.config.engines if e.pinned],
            # GA7: "auto" (the default [arbiter] policy) shares the card (a ledger admits
            # co-residents); the health gate runs
            # before GPU work (DH4, mode observe unless HOSTLER_DEVICE_SAFETY_MODE says)
            arbiter=GpuArbiter(self.config.arbiter, health_gate=self._health_gate, store=store),
        )
        self.runtime = runtime
        # the runtime's pool outlives the daemon's tasks: it is left after the shutdown
        async with runtime:
            await self._run_tasks(store, ledger_store, signals, received, failed)
        if failed:
            raise failed[0]

    def stop(self, cause: str = "closed") -> None:
        """Shut down as on SIGTERM: every engine stopped and recorded, then :meth:`run` returns."""
        self._stop_cause = cause
        if self._scope is not None:
            self._scope.cancel()

    async def _run_tasks(
        self,
        store: EventStore,
        ledger_store: EventStore,
        signals: AsyncIterator[int],
        received: list[str],
        failed: list[HostlerError],
    ) -> None:
        health = self.health
        ledger: HostLedger | None = None
        try:
            async with anyio.create_task_group() as tasks:
                self._scope = tasks.cancel_scope
                if self._stop_cause is not None:
                    tasks.cancel_scope.cancel()
                tasks.start_soon(self._listen, signals, tasks.cancel_scope, received)
                try:
                    ledger = await self._start_up(store, ledger_store, health, tasks)
                except HostlerError as exc:
                    failed.append(exc)  # said in one line once what it took over is stopped
                    tasks.cancel_scope.cancel()
                else:
                    if self.listen is not None:
                        await self._start_http(tasks)
                    self.ready.set()
        finally:
            # Whatever ended the daemon (a signal, or a bug in a task), it stops what it owns.
            with anyio.CancelScope(shield=True):
                cause = received[0] if received else (self._stop_cause or "error")
                await self._shutdown(store, cause)
                if ledger is not None:
                    ledger.store.close()  # the one it reopened, if the file was replaced
            if self.probe is not None:
                self.probe.close()

    @staticmethod
    async def _listen(
        signals: AsyncIterator[int], scope: anyio.CancelScope, received: list[str]
    ) -> None:
        async for signum in signals:
            received.append(signal.Signals(signum).name)
            scope.cancel()
            return

    async def _start_up(  # noqa: PLR0915 - the start-up sequence, in order, in one place
        self,
        store: EventStore,
        ledger_store: EventStore,
        health: LogHealth,
        tasks: anyio.abc.TaskGroup,
    ) -> HostLedger:
        config = self.config
        io = self.offloop

        def record(event: Event) -> None:
            store.append(PLUGIN_STREAM, [event], expected_version=None)

        plugins = await io.run_patiently(lambda: PluginHost(record=record).load())
        eviction = _eviction_of(config.eviction, plugins)  # PM17: an unknown name stops here
        # RD6: an unknown option stops here, in a model's table or an engine's defaults
        check_engine_options(config.engines, plugins, config.default_options)
        probe = await io.run(open_nvml)
        self.probe = probe
        device = DeviceWatch(store, probe)
        await io.run_patiently(device.sample)
        location = config.ledger_location()
        ledger = HostLedger(
            ledger_store,
            OwnerIdentity.current("hostler-daemon"),
            lambda: device.budget,
            reopen=lambda: open_ledger_store(location, busy_timeout=DAEMON_BUSY_TIMEOUT),
        )
        self.ledger = ledger
        self._plugins = plugins
        token_prefix = self._token_prefix = daemon_id(config.data_dir)
        runtime = self.runtime
        assert runtime is not None  # noqa: S101 - made by _run
        runtime.ledger = runtime.pool.ledger = ledger
        runtime.pool.eviction = eviction
        await self._apply_budget(ledger)
        # One engine whose plugin is missing or raises is one failed engine, not a dead daemon.
        adapters: dict[str, EngineAdapter] = {}
        unstartable: dict[str, HostlerError] = {}
        for engine in config.engines:
            try:
                adapters[engine.key] = plugins.adapter(parse_key(engine.key).engine)  # type: ignore[union-attr]
            except HostlerError as exc:
                adapters[engine.key] = _StopOnlyAdapter()
                unstartable[engine.key] = type(exc)(f"{engine.key}: {exc.message}")
        await io.run_patiently(_record_gap, store)

        async def replay_and_reconcile() -> list[Outcome]:
            world = await io.run(replay, store)
            unreadable = sorted([*world.damaged, *((seq, _UNFOLDABLE) for seq in world.unknown)])
            implausible = [
                f"{key} records {why}"
                for key, engine in sorted(world.engines.items())
                if engine.pid is not None  # what it believes runs; a past run's record is moot
                and (why := implausible_identity(engine.pid, engine.identity)) is not None
            ]
            if unreadable or implausible:  # SF3: a history it cannot trust is a corrupt log
                note = await io.run(self._orphans_note)
                message = _damage_message(store.name, unreadable, implausible)
                raise StoreDamagedRowError(message + note)
            return await reconcile(
                store,
                world.engines,
                token_prefix=token_prefix,
                daemon_pid=os.getpid(),
                readiness_path=lambda key: str(_adapter_for(plugins, key).readiness_path),
                clock=time.time,
                offloop=io,
                held_by_other=ledger.held_by_other,
            )

        outcomes = await _patiently(replay_and_reconcile)
        self._adapters = adapters
        for engine in config.engines:
            runtime.pool.supervisor(engine.key)  # made, and watched by the pool
        unconfigured = await self._settle_outcomes(outcomes, store, ledger, plugins, token_prefix)
        started = DaemonStarted(
            time.time(),
            os.getpid(),
            __version__,
            [o.key for o in outcomes if o.result == "adopted"],
            [o.key for o in outcomes if o.result == "lost"],
            [o.pid or 0 for o in outcomes if o.result == "reaped"],
        )
        await io.run_patiently(
            lambda: store.append(DAEMON_STREAM, [started], expected_version=None)
        )
        self._started = True
        configured = sorted(e.key for e in config.engines)
        for supervisor in unconfigured:
            # OW5: every live engine has an owner that acts on it; one nobody configured stops.
            with anyio.CancelScope(shield=True):
                await self._stop_one(
                    supervisor,
                    StopReason.UNCONFIGURED,
                    {"rule": "OW5", "cause": "not in the config", "configured": configured},
                )
        tasks.start_soon(device.run)
        tasks.start_soon(self._tend, ledger, store, health)
        for engine in config.engines:
            supervisor = runtime.pool.supervisor(engine.key)
            if engine.key in unstartable:
                tasks.start_soon(supervisor.fail_unstartable, unstartable[engine.key])
            elif (engine.autostart or engine.pinned) and supervisor.state != "running":
                tasks.start_soon(self._autostart, engine.key)
        return ledger

    async def _apply_budget(self, ledger: HostLedger) -> None:
        """The config's ``[budget]``, applied to the ledger before any engine starts.

        Unset, the ledger keeps what it was told last (``hostler budget``, PUT /api/budget);
        ``"auto"`` puts it back to the automatic value.
        """
        budget, spillover = self.config.budget_bytes, self.config.spillover
        if budget is not None:
            await self.offloop.run_patiently(
                lambda: ledger.set_budget(None if budget == "auto" else budget)
            )
        if spillover is not None:
            await self.offloop.run_patiently(
                lambda: ledger.set_spillover(None if spillover == "auto" else spillover)
            )

    async def _tend(
        self, ledger: HostLedger, store: EventStore, health: LogHealth, every: float = 1.0
    ) -> None:
        """Each second settle owed ledger releases (OW7) and record ended log outages (SF1).

        Every fifth second, also check the ledger file (OW6).
        """
        ticks = 0
        complained = ""
        while True:
            await anyio.sleep(every)
            ticks += 1
            try:
                if ledger.owed:
                    await self.offloop.run(ledger.settle_owed)
                if ticks % 5 == 0:
                    await self.offloop.run(ledger.check_file)
                complained = ""
            except HostlerError as exc:
                if exc.message != complained:
                    log.error("hostler: the ledger: %s", exc.message)  # noqa: TRY400
                    complained = exc.message
            if not health.ok and not any(s.engine.pending for s in self.supervisors.values()):
                await self._probe_log(store, health)
            await self._record_outages(store, health)

    async def _probe_log(self, store: EventStore, health: LogHealth) -> None:
        """SF1: try a failing log with the outage's own record when nothing else waits.

        Without it, an outage during which nothing was left pending would never be seen to end.
        """
        now = time.time()
        since = health.failing_since or now
        event = DaemonLogRecovered(since, now, health.error, health.code, health.delayed)
        try:
            await self.offloop.run(
                lambda: store.append(DAEMON_STREAM, [event], expected_version=None)
            )
        except HostlerError:
            return
        health.wrote(now, recorded=True)

    async def _record_outages(self, store: EventStore, health: LogHealth) -> None:
        ended = health.take_ended()
        if not ended:
            return
        events = [DaemonLogRecovered(o.since, o.until, o.error, o.code, o.delayed) for o in ended]
        try:
            await self.offloop.run(
                lambda: store.append(DAEMON_STREAM, events, expected_version=None)
            )
        except HostlerError:
            health.requeue(ended)

    async def _shutdown(self, store: EventStore, cause: str) -> None:
        decision = {"cause": cause}
        async with anyio.create_task_group() as stopping:
            for supervisor in self.supervisors.values():
                stopping.start_soon(self._stop_one, supervisor, StopReason.SHUTDOWN, decision)
        # SF4: what the log refused is tried once more; what still is not in is reported now
        # and, at the next start, as a gap (daemon.gap).
        for supervisor in self.supervisors.values():
            if not await supervisor.flush(force=True):
                break  # the log still refuses: one more wait per engine would only delay exit
        unwritten = sum(len(s.engine.pending) for s in self.supervisors.values())
        health = self.health
        await self._record_outages(store, health)
        ledger = self.ledger
        if ledger is not None and ledger.owed:
            try:
                await self.offloop.run(ledger.settle_owed)
            except HostlerError as exc:
                log.error(  # noqa: TRY400 - one line is the point
                    "hostler: ledger releases of %s still owed at exit (%s); the ledger frees "
                    "them at its next decision, their engines being gone (OW2)",
                    ", ".join(sorted(ledger.owed)),
                    exc.message,
                )
        if not self._started:
            return  # no daemon.started of ours: a daemon.stopped would pair with another's
        if unwritten:
            log.error(
                "hostler: %d events could not be written before exit (%s); every engine was "
                "stopped all the same, and the next start records the gap",
                unwritten,
                health.error,
            )
            return  # no daemon.stopped: the next start must see that this end is unrecorded
        try:
            await self.offloop.run(
                lambda: store.append(
                    DAEMON_STREAM, [DaemonStopped(time.time(), os.getpid())], expected_version=None
                )
            )
        except HostlerError as exc:
            log.error("hostler: could not record the shutdown: %s", exc.message)  # noqa: TRY400

    async def _stop_one(
        self, supervisor: Supervisor, reason: StopReason, decision: dict[str, Any]
    ) -> None:
        """Stop one engine, recorded; if the log cannot take it, stop it all the same."""
        try:
            await supervisor.stop(reason, decision, unrecorded_ok=True)
        except HostlerError as exc:
            log.error(  # noqa: TRY400 - one line is the point
                "hostler: %s: could not record its stop (%s); stopping it anyway",
                supervisor.key,
                exc.message,
            )
            if not await supervisor.kill_unrecorded():
                log.error("hostler: %s: its group outlived KILL", supervisor.key)  # noqa: TRY400

    async def _settle_outcomes(
        self,
        outcomes: list[Outcome],
        store: EventStore,
        ledger: HostLedger,
        plugins: PluginHost,
        token_prefix: str,
    ) -> list[Supervisor]:
        """Adopted engines take their reservation over (OW3); lost ones release it.

        Returns supervisors for adopted engines that no configured key owns (to be stopped).
        """
        io = self.offloop
        unconfigured: list[Supervisor] = []
        for outcome in outcomes:
            identity = outcome.identity
            if outcome.result == "adopted" and identity is not None:
                assert self.runtime is not None  # noqa: S101 - made by _run
                self._adopted.add(outcome.key)  # one nobody configured gets a stop-only owner
                supervisor = self.runtime.pool.supervisor(outcome.key)
                if not any(e.key == outcome.key for e in self.config.engines):
                    unconfigured.append(supervisor)
                supervisor.adopt(identity, outcome.pidfd)  # SG4: it signals through it
                try:
                    measured = await io.run(
                        lambda i=identity: measure_process(i.pid, self.probe).total
                    )
                except (OSError, psutil.Error):
                    measured = 0
                # never denied: it is running, so it holds the memory whatever the ledger says
                await io.run(
                    lambda o=outcome, i=identity, m=measured: ledger.adopt(
                        o.key,
                        m,
                        token=i.launch_token,
                        pid=i.pid,
                        create_time=i.create_time,
                    )
                )
            elif outcome.result == "lost" and outcome.token and not outcome.foreign:
                await io.run(lambda o=outcome: ledger.release_token(o.token, cause="lost"))
        return unconfigured

    def _bare_supervisor(
        self,
        key: str,
        plugins: PluginHost,
        store: EventStore,
        ledger: HostLedger,
        token_prefix: str,
    ) -> Supervisor:
        """A supervisor for an adopted engine no config names: it can only stop it."""
        adapter = _adapter_for(plugins, key)

        def no_spec(_port: int) -> LaunchSpec:
            raise EngineStartError(f"{key}: not in the config; hostler only stops it")

        return Supervisor(
            key,
            adapter,
            no_spec,
            store,
            run_dir=self.config.data_dir / "run" / _safe(key),
            token_prefix=token_prefix,
            policy=SupervisorPolicy(
                log_max_bytes=self.config.engine_log_max_bytes,
                log_keep=self.config.engine_log_keep,
            ),
            ledger=ledger,
            probe=self.probe,
            offloop=self.offloop,
            health=self.health,
        )

    async def _autostart(self, key: str, retry_every: float = 1.0) -> None:
        """Start a configured engine through the pool (making room like any start).

        A start the log cannot record is not taken (SF2) and is tried again once a second.
        """
        assert self.runtime is not None  # noqa: S101 - made by _run
        pool = self.runtime.pool
        try:
            while True:
                try:
                    await pool.ensure(key, cause="config")
                except (StoreCorruptError, ConcurrencyError):
                    raise
                except StoreError:
                    await anyio.sleep(retry_every)
                else:
                    return
        except HostlerError as exc:
            # recorded as an event by the supervisor; the daemon stays up
            log.error("hostler: %s", exc.message)  # noqa: TRY400 - a one-line message is the point
        except Exception:
            # a bug, not a decision: keep serving the other engines, and say where it was
            log.exception("hostler: %s: unexpected error while starting", key)

    def _build_supervisor(self, key: str) -> Supervisor:
        """The pool's factory: a configured engine's supervisor, else a stop-only one (OW5)."""
        store, ledger, plugins = self._store, self.ledger, self._plugins
        if store is None or ledger is None or plugins is None:
            raise RuntimeClosedError(f"{key}: the daemon is not started yet")
        engine = self._engine_config(key)
        if engine is None:
            if key not in self._adopted:
                raise UnknownEngineError(f"{key[:140]}: no engine of that name is configured")
            return self._bare_supervisor(key, plugins, store, ledger, self._token_prefix)
        adapter = self._adapters.get(engine.key) or _adapter_for(plugins, key)
        return self._supervisor(engine, adapter, store, ledger, self._token_prefix)

    def _engine_config(self, key: str) -> EngineConfig | None:
        """The config of ``key``; another replica of a configured model shares its settings."""
        for engine in self.config.engines:
            if engine.key == key:
                return engine
        parsed = parse_key(key)
        for engine in self.config.engines:
            other = parse_key(engine.key)
            if parsed and other and (other.engine, other.model) == (parsed.engine, parsed.model):
                return dataclasses.replace(engine, key=key)
        return None

    def _supervisor(
        self,
        engine: EngineConfig,
        adapter: EngineAdapter,
        store: EventStore,
        ledger: HostLedger,
        token_prefix: str,
    ) -> Supervisor:
        run_dir = self.config.data_dir / "run" / _safe(engine.key)
        # one priced launch per start: preview, making room, the reservation and the spec
        launcher = LedgerLauncher(adapter, ledger, launch_request(engine, run_dir / "work"))
        return Supervisor(
            engine.key,
            adapter,
            None,
            store,
            run_dir=run_dir,
            token_prefix=token_prefix,
            policy=SupervisorPolicy(
                # RD7: the config's per-engine startup timeout, else (None) the adapter's
                startup_timeout=engine.startup_timeout,
                # PP17: a pinned engine is never idle-stopped; RD7: a model's idle_ttl, the
                # engine's configured idle, the adapter's default, then the daemon's
                idle_timeout=self.config.idle_timeout_of(engine, _idle_default(adapter, engine)),
                health_interval=self.config.health_interval,
                log_max_bytes=self.config.engine_log_max_bytes,
                log_keep=self.config.engine_log_keep,
            ),
            ledger=ledger,
            launcher=launcher,
            probe=self.probe,
            offloop=self.offloop,
            health=self.health,
            held_by_other=ledger.held_by_other,  # RD9, IN3: never sweep another daemon's
        )


def _idle_default(adapter: EngineAdapter, engine: EngineConfig) -> float | None:
    """RD7: the adapter's ``default_idle_timeout``, checked (a bad one is its plugin's bug)."""
    problem = timing_problem(adapter)
    if problem is not None:
        fault = plugin_fault(adapter.engine_type, type(adapter), f"has a bad timing: {problem}")
        raise PluginError(f"{engine.key}: {fault.message}")
    value = adapter.default_idle_timeout
    return None if value is None else float(value)


def launch_request(engine: EngineConfig, work_dir: Path | None = None) -> LaunchRequest:
    """What a configured engine asks of its launches: the one input of its price and spec."""
    return LaunchRequest(
        key=engine.key,
        model=engine.model,
        ctx=engine.ctx,
        slots=engine.slots,
        kv_type=engine.kv_type,
        extra_args=engine.extra_args,
        options=engine.options,
        binary=engine.binary,
        work_dir=work_dir,
    )


async def _never() -> AsyncIterator[int]:
    """A signal stream that never delivers (an embedding program owns the signals)."""
    await anyio.sleep_forever()
    yield 0  # pragma: no cover - never reached


def _adapter_for(plugins: PluginHost, key: str) -> EngineAdapter:
    """The adapter of a key's engine; a stop-only stand-in when its plugin is not loaded."""
    engine = parse_key(key)
    try:
        return plugins.adapter(engine.engine if engine else key)
    except HostlerError:
        return _StopOnlyAdapter()


class _StopOnlyAdapter(EngineAdapter):
    """Stands in for a plugin that is gone, so an adopted engine can still be stopped."""

    engine_type = "unavailable"

    def build_command(self, spec: LaunchSpec) -> LaunchCommand:
        """Never called: a stop-only supervisor starts nothing."""
        raise EngineStartError(f"{spec.key}: its engine plugin is not loaded")


async def _patiently(step: Callable[[], Awaitable[T]], patience: float = 30.0) -> T:
    """Run an idempotent async ``step`` again while the log is busy.

    For start-up's replay and reconcile; the caller can be cancelled between tries.
    """
    deadline = anyio.current_time() + patience
    while True:
        try:
            return await step()
        except StoreBusyError:
            if anyio.current_time() > deadline:
                raise
        await anyio.sleep(0.2)


def _record_gap(store: EventStore) -> None:
    """SF4: when the last daemon of this log left no ``daemon.stopped``, say so first.

    Once: a gap already recorded (by a start that itself failed) is not recorded again.
    """
    last = store.read_all(
        streams=[DAEMON_STREAM], types=["daemon.started", "daemon.stopped"], last=1
    )
    previous = next(iter(last), None)
    if previous is None or not isinstance(previous.event, DaemonStarted):
        return
    gap = DaemonGap(time.time(), previous.event.pid, previous.event.at, store.last_seq())
    store.append(DAEMON_STREAM, [gap], expected_version=None)


#: Why a row of a lifecycle stream that decoded was still not folded.
_UNFOLDABLE = (
    "not an event this hostler can fold: a payload that does not fit its type, an unknown "
    "type, or a newer schema"
)


def implausible_identity(pid: object, identity: dict[str, Any] | None) -> str | None:
    """Why a recorded engine identity cannot be a real process's, or None (SF3).

    A hand-edited or damaged ``engine.spawned`` naming pid 0, 1 or -1, or port 70000, would
    otherwise have a live engine declared lost and its process reaped as a stray.
    """
    if identity is None:
        return None
    port, created = identity.get("port"), identity.get("create_time")
    if type(pid) is not int or not 1 < pid < 2**22:
        return f"an impossible pid ({str(pid)[:20]})"
    if type(port) is not int or not 0 < port < 65536:
        return f"an impossible port ({str(port)[:20]})"
    if not isinstance(created, int | float) or not math.isfinite(created) or created < 0:
        return f"an impossible start time ({str(created)[:20]})"
    return None


def _damage_message(
    name: str, damaged: list[tuple[int, str]], implausible: list[str] | None = None
) -> str:
    parts = [f"seq {seq} ({why})" for seq, why in damaged] + (implausible or [])
    shown = "; ".join(parts[:5])
    more = f" and {len(parts) - 5} more" if len(parts) > 5 else ""
    return (
        f"{name}: rows of the engines' history cannot be read: {shown}{more}; hostler starts "
        "no work on a damaged log: restore it from a backup, or move it aside (it stays "
        "readable with `hostler events --db`)"
    )


def check_engine_options(
    engines: Iterable[EngineConfig],
    plugins: PluginHost,
    defaults: Mapping[str, tuple[str, Mapping[str, object]]] | None = None,
) -> None:
    """RD6: every configured ``options`` table against its engine adapter's schema; S8: slots.

    ``defaults`` are the ``[engine_defaults.<engine>.options]`` tables (engine → where, table),
    checked whether or not a model uses them. An engine whose plugin is not loaded is skipped
    (it fails on its own, naming that); defaults for an engine no plugin provides are said once
    in the log (a misspelled section, or a plugin that did not load).

    Raises:
        UsageError: One line naming the file, the table and the key.
    """
    for name, (where, options) in sorted((defaults or {}).items()):
        adapter = plugins.adapters.get(name)
        if adapter is None:
            log.warning("hostler: %s: no loaded plugin provides engine %r; unused", where, name)
            continue
        for key, value in options.items():
            validate_options(
                {key: value}, adapter.options_schema, where=where, engine=adapter.engine_type
            )
    for engine in engines:
        parsed = parse_key(engine.key)
        cls = plugins.adapters.get(parsed.engine) if parsed else None
        if cls is None:
            continue
        if cls.kv_types is not None and engine.kv_type and engine.kv_type not in cls.kv_types:
            raise UsageError(  # S9
                f"{engine.key}: kv_type = {engine.kv_type!r}, but engine {cls.engine_type!r} "
                f"supports {', '.join(cls.kv_types)} only; set one of them or leave it unset"
            )
        if cls.max_slots is not None and engine.slots > cls.max_slots:  # S8
            raise UsageError(
                f"{engine.key}: slots = {engine.slots}, but engine {cls.engine_type!r} serves at "
                f"most {cls.max_slots} at once; set slots to {cls.max_slots} or fewer"
            )
        for name, value in engine.options.items():
            where = engine.options_from.get(name, f"{engine.key}: options")
            validate_options({name: value}, cls.options_schema, where=where, engine=cls.engine_type)


def _eviction_of(name: str, plugins: PluginHost) -> EvictionPolicy:
    """PM17: the configured eviction policy among the built-ins and the plugins' ones.

    Raises:
        UsageError: No policy is called so; one line naming the known ones.
    """
    try:
        return eviction_policy(name, plugins.eviction_policies)
    except UsageError as exc:
        raise UsageError(f"[pool] eviction (or HOSTLER_EVICTION): {exc.message}") from None
