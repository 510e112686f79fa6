"""A start's wait for readiness (anyio driver): the pure wait's effects carried out (RD1, RD7).

:class:`~hostler.machines.readiness.ReadinessWait` decides when to look, probe, pause, time out
or give way to a stop; this driver looks at the child (its new lines read), sends the adapter's
probe through the engine transport, pauses on the clock, and ends the start. A stop asked while
the start waits cancels the probe or pause in flight at once (:meth:`ReadinessDriver.interrupt`):
a hanging probe never delays a stop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass
from typing import NoReturn, TypeVar

import anyio

from hostler.engines.child import EngineChild
from hostler.engines.hold import EngineParts
from hostler.engines.http import EngineTransport, Probe
from hostler.engines.stopper import EngineStopper
from hostler.errors import EngineStartError
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
from hostler.machines.start import StartEnded, StartTries
from hostler.machines.watch import BecameReady
from hostler.plugin import ReadinessProbe, json_fields_match

__all__ = ["ReadinessDriver", "ReadinessPacing"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ReadinessPacing:
    """The wait's pacing (seconds): between two probes, and for a panicking engine's own exit."""

    poll: float = 0.01
    panic_exit_wait: float = 2.0


class ReadinessDriver:
    """Carries out one engine key's readiness waits, one start at a time.

    Args:
        parts: What the engine's drivers share.
        transport: Sends the readiness probe.
        stopper: Stops an engine whose start was aborted, and records a failed start.
        tries: The start's tries, told how a failed start ended (its panic, a timeout).
        pacing: The wait's pacing.
    """

    def __init__(
        self,
        parts: EngineParts,
        transport: EngineTransport,
        stopper: EngineStopper,
        tries: StartTries,
        pacing: ReadinessPacing,
    ) -> None:
        self._key = parts.key
        self._parts = parts
        self._adapter = parts.adapter
        self._guard = parts.guard
        self._journal = parts.journal
        self._clock = parts.clock
        self._transport = transport
        self._stopper = stopper
        self._tries = tries
        self._pacing = pacing
        self._abort_reason: str | None = None
        #: the probe or pause in flight, which a stop cancels at once (RD1)
        self._waiting: anyio.CancelScope | None = None

    def interrupt(self, reason: str) -> None:
        """A stop asks the start in progress to abort: the probe or pause in flight ends now."""
        self._abort_reason = reason
        if self._waiting is not None:
            self._waiting.cancel()

    def clear(self) -> None:
        """Forget an abort no wait read (its start failed before waiting): not the next one's."""
        self._abort_reason = None

    async def await_ready(self, child: EngineChild, probe: ReadinessProbe) -> None:
        """Carry out the readiness wait (:mod:`hostler.machines.readiness`) to its end.

        ``startup_timeout`` bounds the whole wait, a probe in flight included; a stop asked
        meanwhile cancels the probe or pause in flight at once and the engine is stopped here,
        under the lock the start holds.

        Raises:
            EngineStartError: It exited, panicked, timed out, or its start was aborted.
        """
        wait = ReadinessWait(
            began=self._clock.monotonic(),
            timeout=child.startup_timeout,
            poll=self._pacing.poll,
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
                    seen = Answered(bool(ready), interrupted=self._abort_reason is not None)
                case Pause(seconds):
                    await self._interruptible(self._clock.sleep(seconds))
                    seen = Paused()
                case AbortStart(reason):
                    self._abort_reason = None
                    await self._stopper.stop_locked(reason)
                    raise EngineStartError(f"{self._key}: start aborted: stop requested ({reason})")
                case FailStart(exited, timed_out):
                    await self._startup_failed(child, exited=exited, timed_out=timed_out)
                case BecomeReady():
                    child.reached_ready = True
                    self._parts.observe(BecameReady())
                    await self._journal.observe("ready")
                    return
            effects = wait.handle(seen, self._clock.monotonic())

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
            "is_ready_response", self._adapter.is_ready_response, status, body, returns=bool
        )

    def _look(self, child: EngineChild) -> Looked:
        """What a look at the starting engine sees (its new lines read first)."""
        if self._abort_reason is not None:
            return Looked(abort=self._abort_reason)
        child.read_lines(self._guard)
        return Looked(
            exited=child.proc.exit_status() is not None,
            fatal=child.panic is not None and child.panic.fatal_at_startup,
            line_pending=child.ready_line is not None and not child.saw_ready_line,
        )

    async def _interruptible(self, step: Awaitable[T]) -> T | None:
        """``await step`` in a scope that :meth:`interrupt` cancels; None when it was cancelled."""
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
            await self._await_own_exit(child, self._pacing.panic_exit_wait)
        child.read_lines(self._guard, final=True)
        panic = child.panic.kind if child.panic is not None else None
        status = child.proc.exit_status()
        signal = status.signal if status is not None else None
        self._tries.handle(StartEnded(panic, timed_out=timed_out, signal=signal))
        reason = child.failure_reason(timed_out=timed_out)
        await self._stopper.record_crash(child)
        raise EngineStartError(f"{self._key}: {reason}")

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
