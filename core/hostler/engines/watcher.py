"""The watch of a running engine (anyio driver): the pure watch's effects carried out.

:class:`~hostler.machines.watch.EngineWatch` decides, per tick, what to look at — the engine's
new log lines, its log's size, its health (SP3's strikes), idleness (SP4, deferred while busy)
and memory pressure (SP5) — and when to stop it; this driver carries each effect out. It never
restarts a crashed engine by itself: the next request does, within the restart budget (SP1).
A step that cannot be recorded (the log's disk is full, say) is not acted on and is tried
again at the next tick; it never ends the watch, so the engine keeps an owner.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from hostler.engines.child import EngineChild
from hostler.engines.hold import EngineParts
from hostler.engines.http import EngineTransport, Probe
from hostler.engines.rundir import RunDir
from hostler.engines.starter import EngineStarter
from hostler.engines.stopper import EngineStopper
from hostler.errors import HostlerError, PluginError
from hostler.machines.engine import EngineState, StopReason
from hostler.machines.watch import (
    FinishStop,
    HealthProbed,
    PressureRead,
    ProbeHealth,
    ReadLines,
    ReadPressure,
    RecordCrash,
    RotateLog,
    StopForHealth,
    StopIdle,
    Ticked,
    WatchBegan,
    WatchEffect,
)

__all__ = ["HEALTH_WAIT", "EngineWatcher"]

log = logging.getLogger(__name__)

#: Seconds a health probe (``GET readiness_path``) may take; a later answer is a failed probe.
HEALTH_WAIT = 2.0


class EngineWatcher:
    """Watches one engine key's running process, tick by tick.

    Args:
        parts: What the engine's drivers share.
        starter: Restarts an engine its health stopped.
        stopper: Stops it (idle, health, a stop left unfinished) and records its crash.
        run_dir: Its log file, rotated when over its cap.
        transport: Sends the health probe.
        interval: Seconds between two ticks.
        pressure: Whether the host is under memory pressure now (None: not watched).
    """

    def __init__(
        self,
        parts: EngineParts,
        *,
        starter: EngineStarter,
        stopper: EngineStopper,
        run_dir: RunDir,
        transport: EngineTransport,
        interval: float,
        pressure: Callable[[], bool] | None,
    ) -> None:
        self._key = parts.key
        self._parts = parts
        self._hold = parts.hold
        self._guard = parts.guard
        self._journal = parts.journal
        self._clock = parts.clock
        self._io = parts.io
        self._starter = starter
        self._stopper = stopper
        self._run_dir = run_dir
        self._transport = transport
        self._interval = interval
        self._pressure = pressure

    async def watch(self) -> None:
        """Run forever: notice crashes, probe health, stop idle engines. Cancel to end."""
        self._parts.observe(WatchBegan())
        complained: str | None = None
        while True:
            await self._clock.sleep(self._interval)
            try:
                await self._journal.flush()  # SF1: what the log refused is retried, oldest first
                await self.watch_once()
                complained = None
            except HostlerError as exc:
                if exc.message != complained:  # once per distinct trouble, not every tick
                    log.error("hostler: %s: %s", self._key, exc.message)  # noqa: TRY400
                    complained = exc.message

    async def notice_exit(self) -> None:
        """One tick now, for an exit found between ticks.

        A stop or a crash record under way ends first: the tick then finds the engine no
        longer running.
        """
        async with self._hold.lock:
            pass
        await self.watch_once()

    async def watch_once(self) -> None:
        """One tick: the watch core told what is seen, and its effects carried out."""
        child = self._hold.child
        if child is None or self._hold.lock.locked():
            return
        effects = self._parts.observe(Ticked(self._parts.state, child.proc.alive()))
        try:
            while effects:
                effect, *rest = effects
                effects = [*await self.carry_out(effect, child), *rest]
        except PluginError as exc:
            async with self._hold.lock:
                if self._hold.child is child:
                    await self._stopper.fail(exc)

    async def carry_out(self, effect: WatchEffect, child: EngineChild) -> list[WatchEffect]:
        """Do one of the watch's effects; the effects its answer leads to."""
        match effect:
            case FinishStop():
                async with self._hold.lock:
                    if self._hold.child is child:
                        await self._stopper.stop_locked(StopReason.USER)
            case RecordCrash():
                async with self._hold.lock:
                    if self._hold.child is child and not child.expected_stop:
                        with contextlib.suppress(PluginError):  # costs the panic, not the crash
                            child.read_lines(self._guard, final=True)
                        await self._stopper.record_crash(child)
            case ReadLines():
                child.read_lines(self._guard)
            case RotateLog():
                if await self._run_dir.rotate():
                    child.read_lines(self._guard)  # what it wrote meanwhile, from the rotated copy
            case ProbeHealth():
                return self._parts.observe(HealthProbed(await self._probe_health(child)))
            case ReadPressure():
                pressure = self._pressure
                under = pressure is not None and await self._io.run(pressure)
                return self._parts.observe(PressureRead(under))
            case StopIdle(reason, decision):
                async with self._hold.lock:
                    if self._parts.state == EngineState.RUNNING and not self._parts.watch.busy:
                        await self._stopper.stop_locked(reason, decision)
            case StopForHealth(reason, decision):
                async with self._hold.lock:
                    await self._stopper.stop_locked(reason, decision)
                with contextlib.suppress(HostlerError):
                    await self._starter.start_when_recordable(cause="health-restart")
        return []

    async def _probe_health(self, child: EngineChild) -> bool:
        """Whether the engine answers its readiness path as ready now."""
        adapter = self._parts.adapter
        try:
            answer = await self._transport.probe(
                Probe(child.identity.port, adapter.readiness_path),
                wait=HEALTH_WAIT,
                clock=self._clock,
                with_body=False,
            )
        except ValueError as exc:  # a readiness_path set on the instance, past the class check
            raise self._guard.fault(f"has a readiness_path that cannot be sent: {exc}") from exc
        return answer is not None and self._guard.ask(
            "is_ready", adapter.is_ready, answer[0], returns=bool
        )
