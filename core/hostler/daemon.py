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
import logging
import math
import os
import secrets
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import anyio
import psutil

# the GGUF reader (and the gguf package it imports: ~0.2 s) loads with the daemon, not while
# the first cold request waits for its engine's price
import hostler.capacity.gguf_header  # noqa: F401
from hostler._version import __version__
from hostler.capacity.budget import CapacityBudget
from hostler.capacity.keys import parse_key
from hostler.clock import SYSTEM_CLOCK, Clock
from hostler.config import DaemonConfig, EngineConfig, load_config
from hostler.drivers.host_ledger import (
    HostLedger,
    LedgerLocation,
    OwnerIdentity,
    open_ledger_store,
)
from hostler.drivers.loghealth import LogHealth
from hostler.drivers.offloop import DAEMON_BUSY_TIMEOUT, OffLoop
from hostler.engines.factory import ConfiguredEngines, adapter_for, stop_only_adapter
from hostler.engines.process import token_holders
from hostler.engines.reconcile import DAEMON_STREAM, Outcome, reconcile
from hostler.engines.roster import EngineRoster
from hostler.engines.supervisor import Supervisor
from hostler.errors import (
    ConcurrencyError,
    HostlerError,
    StoreBusyError,
    StoreCorruptError,
    StoreDamagedRowError,
    StoreError,
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
    validate_options,
)
from hostler.pluginhost import PluginHost
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


class DeviceWatch:
    """Samples the device now and then; records a sample when the budget's inputs change."""

    def __init__(
        self, store: EventStore, probe: NvmlProbe, clock: Clock, interval: float = 30.0
    ) -> None:
        self.store = store
        self.probe = probe
        self.clock = clock
        self.interval = interval
        self.budget: CapacityBudget
        self._last: tuple[object, ...] | None = None

    def sample(self) -> None:
        """Take a sample; record it if RAM, cards or the override changed."""
        sample = sample_device(self.probe, at=self.clock.wall())
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
            await self.clock.sleep(self.interval)
            try:
                await anyio.to_thread.run_sync(self.sample)
                complained = ""
            except HostlerError as exc:  # the log or the probe: the old budget stands
                if exc.message != complained:
                    log.error("hostler: device sample not recorded: %s", exc.message)  # noqa: TRY400
                    complained = exc.message


class Daemon:
    """The long-running process behind ``hostler daemon``."""

    def __init__(
        self,
        config: DaemonConfig,
        *,
        listen: tuple[str, int] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.config = config
        self.listen = listen
        self.clock = clock
        self._listener: socket.socket | None = None
        self.http: HttpServer | None = None
        self.runtime: Runtime | None = None
        self.ready = anyio.Event()
        self.offloop = OffLoop(clock=clock)
        self.probe: NvmlProbe | None = None
        self.health = LogHealth(str(config.data_dir / "events.db"))
        self.ledger: HostLedger | None = None
        self._started = False
        self._shut_down = False
        self._health_gate: DeviceHealthGate | None = None
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
        return {} if self.runtime is None else self.runtime.supervisors()

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
        try:
            async with anyio.create_task_group() as tasks:
                self._scope = tasks.cancel_scope
                if self._stop_cause is not None:
                    tasks.cancel_scope.cancel()
                tasks.start_soon(self._listen, signals, tasks.cancel_scope, received)
                try:
                    opened = await self._open_parts(store, ledger_store)
                except HostlerError as exc:
                    failed.append(exc)  # said in one line; nothing was taken over yet
                    tasks.cancel_scope.cancel()
                else:
                    await self._serve(store, opened, tasks, received, failed)
        finally:
            with anyio.CancelScope(shield=True):
                if not self._shut_down:  # start-up ended before the runtime was made
                    await self._shutdown(store, self._cause(received))
                if self.ledger is not None:
                    self.ledger.store.close()  # the one it reopened, if the file was replaced
            if self.probe is not None:
                self.probe.close()
        if failed:
            raise failed[0]

    def _cause(self, received: list[str]) -> str:
        return received[0] if received else (self._stop_cause or "error")

    def stop(self, cause: str = "closed") -> None:
        """Shut down as on SIGTERM: every engine stopped and recorded, then :meth:`run` returns."""
        self._stop_cause = cause
        if self._scope is not None:
            self._scope.cancel()

    async def _serve(
        self,
        store: EventStore,
        opened: _Opened,
        tasks: anyio.abc.TaskGroup,
        received: list[str],
        failed: list[HostlerError],
    ) -> None:
        """The runtime, made whole from what start-up opened, served until the daemon stops."""
        runtime = Runtime(
            store,
            opened.engines,
            ledger=opened.engines.ledger,
            clock=self.clock,
            offloop=self.offloop,
            pinned=[e.key for e in self.config.engines if e.pinned],
            # GA7: "auto" (the default [arbiter] policy) shares the card (a ledger admits
            # co-residents); the health gate runs
            # before GPU work (DH4, mode observe unless HOSTLER_DEVICE_SAFETY_MODE says)
            arbiter=GpuArbiter(
                self.config.arbiter, health_gate=self._health_gate, store=store, clock=self.clock
            ),
            eviction=opened.eviction,
            roster=opened.roster,
        )
        self.runtime = runtime
        # the runtime's pool outlives the daemon's other tasks: its engines are stopped first
        async with runtime:
            try:
                try:
                    await self._start_up(store, opened, runtime, tasks)
                except HostlerError as exc:
                    failed.append(exc)  # said in one line once what it took over is stopped
                    tasks.cancel_scope.cancel()
                else:
                    if self.listen is not None:
                        await self._start_http(tasks)
                    self.ready.set()
                    await anyio.sleep_forever()
            finally:
                # Whatever ended the daemon (a signal, or a bug in a task), it stops what it owns.
                with anyio.CancelScope(shield=True):
                    await self._shutdown(store, self._cause(received))

    @staticmethod
    async def _listen(
        signals: AsyncIterator[int], scope: anyio.CancelScope, received: list[str]
    ) -> None:
        async for signum in signals:
            received.append(signal.Signals(signum).name)
            scope.cancel()
            return

    async def _open_parts(self, store: EventStore, ledger_store: EventStore) -> _Opened:
        """Plugins, the probe, the ledger and the log's history: all the engines are built of.

        Replays the log and reconciles the live process table too, so that the engine factory
        is made once knowing which keys were adopted.
        """
        config = self.config
        io = self.offloop
        health = self.health

        def record(event: Event) -> None:
            store.append(PLUGIN_STREAM, [event], expected_version=None)

        plugins = await io.run_patiently(lambda: PluginHost(record=record).load())
        eviction = _eviction_of(config.eviction, plugins)  # PM17: an unknown name stops here
        # RD6: an unknown option stops here, in a model's table or an engine's defaults
        check_engine_options(config.engines, plugins, config.default_options)
        probe = await io.run(open_nvml)
        self.probe = probe
        device = DeviceWatch(store, probe, self.clock)
        await io.run_patiently(device.sample)
        location = config.ledger_location()
        ledger = HostLedger(
            ledger_store,
            OwnerIdentity.current("hostler-daemon"),
            lambda: device.budget,
            reopen=lambda: open_ledger_store(location, busy_timeout=DAEMON_BUSY_TIMEOUT),
        )
        self.ledger = ledger
        token_prefix = daemon_id(config.data_dir)
        await self._apply_budget(ledger)
        # One engine whose plugin is missing or raises is one failed engine, not a dead daemon.
        adapters: dict[str, EngineAdapter] = {}
        unstartable: dict[str, HostlerError] = {}
        for engine in config.engines:
            try:
                adapters[engine.key] = plugins.adapter(parse_key(engine.key).engine)  # type: ignore[union-attr]
            except HostlerError as exc:
                adapters[engine.key] = stop_only_adapter()
                unstartable[engine.key] = type(exc)(f"{engine.key}: {exc.message}")
        await io.run_patiently(_record_gap, store, self.clock.wall())

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
                readiness_path=lambda key: str(adapter_for(plugins, key).readiness_path),
                clock=self.clock,
                offloop=io,
                held_by_other=ledger.held_by_other,
            )

        outcomes = await _patiently(replay_and_reconcile, self.clock)
        roster = EngineRoster()  # RD9: made first, for the supervisors' owned and the pool's
        engines = ConfiguredEngines(
            config,
            plugins,
            adapters,
            store,
            ledger,
            token_prefix,
            adopted=frozenset(
                o.key for o in outcomes if o.result == "adopted" and o.identity is not None
            ),
            probe=probe,
            offloop=io,
            health=health,
            roster=roster,
            clock=self.clock,
        )
        return _Opened(engines, roster, eviction, device, outcomes, unstartable)

    async def _start_up(
        self,
        store: EventStore,
        opened: _Opened,
        runtime: Runtime,
        tasks: anyio.abc.TaskGroup,
    ) -> None:
        """Take the adopted engines over, record the start, then start the configured ones."""
        config = self.config
        io = self.offloop
        ledger = opened.engines.ledger
        outcomes = opened.outcomes
        for engine in config.engines:
            runtime.supervisor(engine.key)  # made, and watched by the pool
        unconfigured = await self._settle_outcomes(outcomes, runtime, ledger)
        ledger_file = await io.run(lambda: _ledger_file(store, ledger))  # a stat: off the loop
        started = DaemonStarted(
            self.clock.wall(),
            os.getpid(),
            __version__,
            [o.key for o in outcomes if o.result == "adopted"],
            [o.key for o in outcomes if o.result == "lost"],
            [o.pid or 0 for o in outcomes if o.result == "reaped"],
            ledger=ledger_file,
            ledger_owner=ledger.owner,
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
        tasks.start_soon(opened.device.run)
        tasks.start_soon(self._tend, ledger, store, self.health)
        for engine in config.engines:
            supervisor = runtime.supervisor(engine.key)
            if engine.key in opened.unstartable:
                tasks.start_soon(supervisor.fail_unstartable, opened.unstartable[engine.key])
            elif (engine.autostart or engine.pinned) and supervisor.state != "running":
                tasks.start_soon(self._autostart, runtime, engine.key)

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
            await self.clock.sleep(every)
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
        now = self.clock.wall()
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
        self._shut_down = True
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
                    DAEMON_STREAM,
                    [DaemonStopped(self.clock.wall(), os.getpid())],
                    expected_version=None,
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
        runtime: Runtime,
        ledger: HostLedger,
    ) -> list[Supervisor]:
        """Adopted engines take their reservation over (OW3); lost ones release it.

        Returns supervisors for adopted engines that no configured key owns (to be stopped).
        """
        io = self.offloop
        unconfigured: list[Supervisor] = []
        for outcome in outcomes:
            identity = outcome.identity
            if outcome.result == "adopted" and identity is not None:
                supervisor = runtime.supervisor(outcome.key)  # stop-only when not configured
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

    async def _autostart(self, runtime: Runtime, key: str, retry_every: float = 1.0) -> None:
        """Start a configured engine through the pool (making room like any start).

        A start the log cannot record is not taken (SF2) and is tried again once a second.
        """
        try:
            while True:
                try:
                    await runtime.start(key, cause="config")
                except (StoreCorruptError, ConcurrencyError):
                    raise
                except StoreError:
                    await self.clock.sleep(retry_every)
                else:
                    return
        except HostlerError as exc:
            # recorded as an event by the supervisor; the daemon stays up
            log.error("hostler: %s", exc.message)  # noqa: TRY400 - a one-line message is the point
        except Exception:
            # a bug, not a decision: keep serving the other engines, and say where it was
            log.exception("hostler: %s: unexpected error while starting", key)


@dataclasses.dataclass(frozen=True, slots=True)
class _Opened:
    """What start-up opened before the runtime is made: the engines' factory and the facts."""

    engines: ConfiguredEngines
    roster: EngineRoster
    eviction: EvictionPolicy
    device: DeviceWatch
    outcomes: list[Outcome]
    unstartable: dict[str, HostlerError]


async def _never() -> AsyncIterator[int]:
    """A signal stream that never delivers (an embedding program owns the signals)."""
    await anyio.sleep_forever()
    yield 0  # pragma: no cover - never reached


async def _patiently(step: Callable[[], Awaitable[T]], clock: Clock, patience: float = 30.0) -> T:
    """Run an idempotent async ``step`` again while the log is busy.

    For start-up's replay and reconcile; the caller can be cancelled between tries.
    """
    deadline = clock.monotonic() + patience
    while True:
        try:
            return await step()
        except StoreBusyError:
            if clock.monotonic() > deadline:
                raise
        await clock.sleep(0.2)


def _record_gap(store: EventStore, now: float) -> None:
    """SF4: when the last daemon of this log left no ``daemon.stopped``, say so first.

    Once: a gap already recorded (by a start that itself failed) is not recorded again.
    """
    last = store.read_all(
        streams=[DAEMON_STREAM], types=["daemon.started", "daemon.stopped"], last=1
    )
    previous = next(iter(last), None)
    if previous is None or not isinstance(previous.event, DaemonStarted):
        return
    gap = DaemonGap(now, previous.event.pid, previous.event.at, store.last_seq())
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


def _ledger_file(log: EventStore, ledger: HostLedger) -> str | None:
    """The ledger's log file when it is not ``log`` (recorded in ``daemon.started``)."""
    file = ledger.store.sqlite_file
    if file is None:
        return None
    own = log.sqlite_file
    if own is not None and (own == file or (own.exists() and own.samefile(file))):
        return None
    return str(file.resolve())


def _eviction_of(name: str, plugins: PluginHost) -> EvictionPolicy:
    """PM17: the configured eviction policy among the built-ins and the plugins' ones.

    Raises:
        UsageError: No policy is called so; one line naming the known ones.
    """
    try:
        return eviction_policy(name, plugins.eviction_policies)
    except UsageError as exc:
        raise UsageError(f"[pool] eviction (or HOSTLER_EVICTION): {exc.message}") from None
