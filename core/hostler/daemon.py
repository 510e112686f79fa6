"""The daemon: keeps configured engines under supervision, and survives its own restarts.

On start it replays its event log, reconciles the live process table (adopting engines that
are still ours, reporting lost ones, reaping strays), re-derives the host ledger's
reservations from the survivors, then supervises every configured engine until SIGTERM or
SIGINT, when it stops them (reason ``shutdown``). Killed with SIGKILL, it leaves its engines
running; the next daemon on the same data directory adopts them without a reload.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import anyio

# the GGUF reader (and the gguf package it imports: ~0.2 s) loads with the daemon, not while
# the first cold request waits for its engine's price
import hostler.capacity.gguf_header  # noqa: F401
from hostler.clock import SYSTEM_CLOCK, Clock
from hostler.config import DaemonConfig, EngineConfig, load_config
from hostler.daemon_parts.catalog import Catalog
from hostler.daemon_parts.http_face import check_listen, http_face, http_token, serve_http
from hostler.daemon_parts.narrator import Narrator
from hostler.daemon_parts.options import check_engine_options
from hostler.daemon_parts.ownership import open_owned_log
from hostler.daemon_parts.shutdown import shut_down
from hostler.daemon_parts.signals import first_signal, signal_receiver
from hostler.daemon_parts.startup import Opened, StartUp
from hostler.drivers.host_ledger import (
    HostLedger,
    LedgerLocation,
    open_ledger_store,
)
from hostler.drivers.loghealth import LogHealth
from hostler.drivers.offloop import DAEMON_BUSY_TIMEOUT, OffLoop
from hostler.engines.supervisor import Supervisor
from hostler.errors import HostlerError
from hostler.events.daemon import DaemonStarted
from hostler.paths import private_dir
from hostler.postmortem.story import Story
from hostler.probes.nvml import NvmlProbe
from hostler.runtime.arbiter import GpuArbiter
from hostler.runtime.facade import Runtime
from hostler.runtime.health import DeviceHealthGate, HealthSample, nvml_sampler
from hostler.serve.access import check_exposure
from hostler.serve.server import HttpServer, bind_listener
from hostler.store.connect import display_name
from hostler.store.log import EventStore

__all__ = [
    "Daemon",
    "DaemonConfig",
    "DaemonStarted",
    "EngineConfig",
    "check_engine_options",
    "load_config",
]


class Daemon:
    """The long-running process behind ``hostler daemon``.

    Its jobs besides the runtime live in :mod:`hostler.daemon_parts`: start-up and the take-over
    of live engines, the upkeep, the HTTP face, the signals, the shutdown.
    """

    def __init__(
        self,
        config: DaemonConfig,
        *,
        listen: tuple[str, int] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        narrate: bool = False,
    ) -> None:
        self.config = config
        self.narrate = narrate
        self.listen = listen
        self.clock = clock
        self._listener: socket.socket | None = None
        self.http: HttpServer | None = None
        self.runtime: Runtime | None = None
        #: The models offered (configured and discovered), once start-up opened them.
        self.catalog: Catalog | None = None
        self.ready = anyio.Event()
        self.offloop = OffLoop(clock=clock)
        self.health = LogHealth(display_name(config.log_target))
        self._startup = StartUp(config, clock=clock, offloop=self.offloop, health=self.health)
        self._shut_down = False
        self._health_gate: DeviceHealthGate | None = None
        self._scope: anyio.CancelScope | None = None
        self._stop_cause: str | None = None
        self._narrator: Narrator | None = None
        self._told_from = 0  # the log's last seq before this daemon wrote anything

    @property
    def probe(self) -> NvmlProbe | None:
        """The GPU probe, once start-up opened it."""
        return self._startup.probe

    @property
    def ledger(self) -> HostLedger | None:
        """The host ledger, once start-up opened it."""
        return self._startup.ledger

    async def _start_http(self, tasks: anyio.abc.TaskGroup) -> None:
        """The HTTP face (docs/serve.md) on the runtime, listening once the engines are settled."""
        assert self.listen is not None  # noqa: S101 - callers check
        assert self.runtime is not None  # noqa: S101 - made by _run
        assert self.catalog is not None  # noqa: S101 - made by start-up before the runtime
        token = await http_token(self.config, self.offloop)
        face = http_face(self.runtime, self.catalog, self.config, self.listen[0], token)
        sock, self._listener = self._listener, None
        self.http = await serve_http(
            tasks, face, self.config, self.listen, sock, offloop=self.offloop
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
            check_listen(self.listen)
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
        with signal_receiver(handle_signals) as signals:
            store = await self.offloop.run(open_owned_log, config)
            with store:
                ledger_store = open_ledger_store(location, busy_timeout=DAEMON_BUSY_TIMEOUT)
                try:
                    await self._run(store, ledger_store, signals)
                finally:
                    ledger_store.close()

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
                tasks.start_soon(first_signal, signals, tasks.cancel_scope, received)
                if self.narrate:
                    self._told_from = await self.offloop.run(store.last_seq)
                try:
                    opened = await self._startup.open_parts(store, ledger_store)
                except HostlerError as exc:
                    failed.append(exc)  # said in one line; nothing was taken over yet
                    tasks.cancel_scope.cancel()
                else:
                    await self._serve(store, opened, tasks, received, failed)
        finally:
            with anyio.CancelScope(shield=True):
                if not self._shut_down:  # start-up ended before the runtime was made
                    await self._shutdown(store, self._cause(received))
                if self._narrator is not None:
                    await self._narrator.catch_up()  # the shutdown's own lines
            self._startup.close()
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
        opened: Opened,
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
        self.catalog = opened.catalog
        if self.narrate:
            self._narrator = await self._narrator_of(store, runtime)
            tasks.start_soon(self._narrator.run)
        # the runtime's pool outlives the daemon's other tasks: its engines are stopped first
        async with runtime:
            try:
                try:
                    await self._startup.take_over(store, opened, runtime, tasks)
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

    async def _narrator_of(self, store: EventStore, runtime: Runtime) -> Narrator:
        """The story of this daemon's log (and its ledger's), from where this run began."""
        logs, after = [store], [self._told_from]
        ledger_log = runtime.memory.ledger_log()
        if ledger_log is not None:  # another file: its events from now on
            logs.append(ledger_log)
            after.append(await self.offloop.run(ledger_log.last_seq))
        story = Story(owner=None if self.ledger is None else self.ledger.owner)
        return Narrator(logs, after, story, clock=self.clock, offloop=self.offloop)

    async def _shutdown(self, store: EventStore, cause: str) -> None:
        """Every engine stopped and recorded, once (:mod:`hostler.daemon_parts.shutdown`)."""
        self._shut_down = True
        await shut_down(
            store,
            cause,
            runtime=self.runtime,
            health=self.health,
            ledger=self._startup.ledger,
            recorded_start=self._startup.started,
            offloop=self.offloop,
            clock=self.clock,
        )
