"""The daemon's start-up: what the engines are built of, then the take-over of the live ones.

:meth:`StartUp.open_parts` loads the plugins, opens the GPU probe and the host ledger, applies
the config's budget, replays the log and reconciles the live process table (adopting engines
that are still ours, reporting lost ones, reaping strays), so that the engine factory is made
once knowing which keys were adopted. :meth:`StartUp.take_over` then hands the adopted engines
their reservations (OW3), records ``daemon.started``, stops adopted engines nobody configured
(OW5) and starts the configured ones.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import psutil

from hostler._version import __version__
from hostler.capacity.keys import parse_key
from hostler.capacity.origin import config_source
from hostler.clock import Clock
from hostler.config import DaemonConfig
from hostler.daemon_parts.catalog import Catalog
from hostler.daemon_parts.device_watch import DeviceWatch
from hostler.daemon_parts.options import check_engine_options
from hostler.daemon_parts.ownership import daemon_id, orphans_note
from hostler.daemon_parts.shutdown import stop_one
from hostler.daemon_parts.upkeep import Upkeep
from hostler.drivers.host_ledger import HostLedger, OwnerIdentity, open_ledger_store, owner_alive
from hostler.drivers.loghealth import LogHealth
from hostler.drivers.offloop import DAEMON_BUSY_TIMEOUT, OffLoop
from hostler.engines.factory import ConfiguredEngines, adapter_for, stop_only_adapter
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
from hostler.events.daemon import DaemonGap, DaemonStarted
from hostler.machines.engine import StopReason
from hostler.plugin import EngineAdapter
from hostler.pluginhost import PluginHost
from hostler.policies.eviction import EvictionPolicy, eviction_policy
from hostler.probes.host import boot_id
from hostler.probes.nvml import NvmlProbe, open_nvml
from hostler.probes.process import measure_process
from hostler.replay import replay
from hostler.runtime.facade import Runtime
from hostler.store.log import EventStore

__all__ = ["PLUGIN_STREAM", "Opened", "StartUp", "implausible_identity"]

log = logging.getLogger("hostler.daemon")  # the daemon's records keep its logger's name
T = TypeVar("T")
PLUGIN_STREAM = "plugins/host"


@dataclasses.dataclass(frozen=True, slots=True)
class Opened:
    """What start-up opened before the runtime is made: the engines' factory and the facts."""

    engines: ConfiguredEngines
    catalog: Catalog
    roster: EngineRoster
    eviction: EvictionPolicy
    device: DeviceWatch
    outcomes: list[Outcome]
    unstartable: dict[str, HostlerError]


class StartUp:
    """Start-up's steps, and what they opened that the daemon closes: the probe and the ledger.

    Args:
        config: The daemon's config.
        clock: The daemon's clock.
        offloop: Runs the blocking log, ledger and process work.
        health: The log's health (the engines' writers report to it).

    Attributes:
        probe: The GPU probe, once opened (the daemon closes it).
        ledger: The host ledger, once opened (the daemon closes its store).
        started: ``daemon.started`` was recorded (a ``daemon.stopped`` then pairs with it).
    """

    def __init__(
        self, config: DaemonConfig, *, clock: Clock, offloop: OffLoop, health: LogHealth
    ) -> None:
        self._config = config
        self._clock = clock
        self._io = offloop
        self._health = health
        self.probe: NvmlProbe | None = None
        self.ledger: HostLedger | None = None
        self.started = False

    async def open_parts(self, store: EventStore, ledger_store: EventStore) -> Opened:
        """Plugins, the probe, the ledger and the log's history: all the engines are built of.

        Replays the log and reconciles the live process table too, so that the engine factory
        is made once knowing which keys were adopted.
        """
        config = self._config
        io = self._io
        health = self._health

        def record(event: Event) -> None:
            store.append(PLUGIN_STREAM, [event], expected_version=None)

        # SF4 first: "events after seq N may be missing" names the dead daemon's last event,
        # not this daemon's own plugin and device records
        await io.run_patiently(_record_gap, store, self._clock.wall())
        plugins = await io.run_patiently(lambda: PluginHost(record=record).load())
        eviction = _eviction_of(config.eviction, plugins)  # PM17: an unknown name stops here
        # RD6: an unknown option stops here, in a model's table or an engine's defaults
        check_engine_options(config.engines, plugins, config.default_options)
        probe = await io.run(open_nvml)
        self.probe = probe
        device = DeviceWatch(store, probe, self._clock)
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
                note = await io.run(orphans_note, config.data_dir)
                message = _damage_message(store.name, unreadable, implausible)
                raise StoreDamagedRowError(message + note)
            return await reconcile(
                store,
                world.engines,
                token_prefix=token_prefix,
                daemon_pid=os.getpid(),
                readiness_path=lambda key: str(adapter_for(plugins, key).readiness_path),
                clock=self._clock,
                offloop=io,
                held_by_other=ledger.held_by_other,
                copied_from=await io.run(lambda: live_previous_daemon(store)),
            )

        outcomes = await _patiently(replay_and_reconcile, self._clock)
        # the models offered: the config's, and the first walk of discovery's places (its
        # recorded offer replayed first: every file keeps its id)
        catalog = Catalog(config, store, clock=self._clock, offloop=io)
        await catalog.open()
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
            clock=self._clock,
            offered=catalog,
        )
        return Opened(engines, catalog, roster, eviction, device, outcomes, unstartable)

    async def take_over(
        self,
        store: EventStore,
        opened: Opened,
        runtime: Runtime,
        tasks: anyio.abc.TaskGroup,
    ) -> None:
        """Take the adopted engines over, record the start, then start the configured ones."""
        config = self._config
        io = self._io
        ledger = opened.engines.ledger
        outcomes = opened.outcomes
        for engine in config.engines:
            runtime.supervisor(engine.key)  # made, and watched by the pool
        unconfigured = await self._settle_outcomes(outcomes, runtime, ledger, opened.catalog)
        ledger_file = await io.run(lambda: _ledger_file(store, ledger))  # a stat: off the loop
        started = DaemonStarted(
            self._clock.wall(),
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
        self.started = True
        configured = sorted(e.key for e in config.engines)
        for supervisor in unconfigured:
            # OW5: every live engine has an owner that acts on it; one nobody configured stops.
            with anyio.CancelScope(shield=True):
                await stop_one(
                    supervisor,
                    StopReason.UNCONFIGURED,
                    {"rule": "OW5", "cause": "not in the config", "configured": configured},
                )
        tasks.start_soon(opened.device.run)
        tasks.start_soon(opened.catalog.run)  # discovery's rescans
        upkeep = Upkeep(ledger, store, self._health, runtime, clock=self._clock, offloop=io)
        tasks.start_soon(upkeep.run)
        for engine in config.engines:
            supervisor = runtime.supervisor(engine.key)
            if engine.key in opened.unstartable:
                tasks.start_soon(supervisor.fail_unstartable, opened.unstartable[engine.key])
            elif (engine.autostart or engine.pinned) and supervisor.state != "running":
                tasks.start_soon(self._autostart, runtime, engine.key)

    async def _apply_budget(self, ledger: HostLedger) -> None:
        """The config's ``[budget]``, applied to the ledger before any engine starts.

        Unset, the ledger keeps what it was told last (``hostler budget``, PUT /api/budget);
        ``"auto"`` puts it back to the automatic value. The budget is recorded with where it
        was set (the file, or ``HOSTLER_BUDGET_BYTES``), so a refusal names it.
        """
        config = self._config
        budget, spillover = config.budget_bytes, config.spillover
        source = config.budget_from or config_source("")
        if budget is not None:
            await self._io.run_patiently(
                lambda: ledger.set_budget(None if budget == "auto" else budget, source=source)
            )
        if spillover is not None:
            await self._io.run_patiently(
                lambda: ledger.set_spillover(None if spillover == "auto" else spillover)
            )

    async def _settle_outcomes(
        self,
        outcomes: list[Outcome],
        runtime: Runtime,
        ledger: HostLedger,
        catalog: Catalog,
    ) -> list[Supervisor]:
        """Adopted engines take their reservation over (OW3); lost ones release it.

        Returns supervisors for adopted engines that nothing configured or offered owns (to be
        stopped).
        """
        io = self._io
        unconfigured: list[Supervisor] = []
        for outcome in outcomes:
            identity = outcome.identity
            if outcome.result == "adopted" and identity is not None:
                supervisor = runtime.supervisor(outcome.key)  # stop-only when not configured
                configured = any(e.key == outcome.key for e in self._config.engines)
                if not configured and catalog.engine_config(outcome.key) is None:
                    unconfigured.append(supervisor)
                supervisor.adopt(identity, outcome.pidfd, outcome.spec)  # SG4: its pidfd
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
                    await self._clock.sleep(retry_every)
                else:
                    return
        except HostlerError as exc:
            # recorded as an event by the supervisor; the daemon stays up
            log.error("hostler: %s", exc.message)  # noqa: TRY400 - a one-line message is the point
        except Exception:
            # a bug, not a decision: keep serving the other engines, and say where it was
            log.exception("hostler: %s: unexpected error while starting", key)

    def close(self) -> None:
        """Close the ledger's store (reopened if its file was replaced), then the probe."""
        if self.ledger is not None:
            self.ledger.store.close()
        if self.probe is not None:
            self.probe.close()


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


def _last_start(store: EventStore) -> DaemonStarted | None:
    """The last daemon's start, when no ``daemon.stopped`` followed it."""
    last = store.read_all(
        streams=[DAEMON_STREAM], types=["daemon.started", "daemon.stopped"], last=1
    )
    previous = next(iter(last), None)
    return (
        previous.event
        if previous is not None and isinstance(previous.event, DaemonStarted)
        else None
    )


def _record_gap(store: EventStore, now: float) -> None:
    """SF4: when the last daemon of this log left no ``daemon.stopped``, say so first.

    Once: a gap already recorded (by a start that itself failed) is not recorded again.
    """
    previous = _last_start(store)
    if previous is None:
        return
    gap = DaemonGap(now, previous.pid, previous.at, store.last_seq())
    store.append(DAEMON_STREAM, [gap], expected_version=None)


def live_previous_daemon(store: EventStore) -> str | None:
    """OW5: the daemon this log's last start names, when it still runs and is not this one.

    A daemon holds its data directory's lock while it runs, so a live one named here means
    this directory is a copy of its (or its lock was taken from it): its engines are its own.
    Told by the owner identity the start recorded (pid, start ticks, boot), never by a pid
    alone; a start that recorded none (before schema v2) names no one.
    """
    previous = _last_start(store)
    if previous is None or previous.ledger_owner is None or previous.pid == os.getpid():
        return None
    if owner_alive(previous.ledger_owner, this_boot=boot_id(), unknown_alive=False):
        return previous.ledger_owner
    return None


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
    ticks = identity.get("since_boot")
    if ticks is not None and (
        type(ticks) not in (int, float) or not math.isfinite(ticks) or ticks < 0
    ):
        return f"an impossible start since boot ({str(ticks)[:20]})"
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
