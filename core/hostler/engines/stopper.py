"""The stop of an engine (anyio driver): its process group ended, and the stop recorded (SG2, SG7).

A stop is a decision, recorded before it is taken; the group is ended by the escalation every
stop shares (:class:`~hostler.machines.stop.StopEscalation`, carried out by the process
runner), re-checked before each signal (SG4). A reservation goes back only once the group is
verifiably gone; a group that outlives KILL is recorded (``engine.stop_failed``) and keeps it
(SG2). An engine that died on its own before a stop is recorded as crashed first (SG7).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import anyio

from hostler.engines.child import EngineChild
from hostler.engines.hold import EngineParts
from hostler.engines.process import Termination
from hostler.engines.sessions import save_sessions
from hostler.errors import EngineStartError, HostlerError, PluginError
from hostler.machines.engine import EngineState, StopReason

__all__ = ["EngineStopper", "StopPacing"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StopPacing:
    """How long a stop gives its engine (seconds): TERM's grace and KILL's wait."""

    stop_grace: float = 2.0
    kill_wait: float = 5.0


class EngineStopper:
    """Ends one engine key's process and records how (under the hold's lock, by its callers).

    Args:
        parts: What the engine's drivers share.
        pacing: The stop's timings.
    """

    def __init__(self, parts: EngineParts, pacing: StopPacing) -> None:
        self._key = parts.key
        self._parts = parts
        self._hold = parts.hold
        self._journal = parts.journal
        self._account = parts.account
        self._guard = parts.guard
        self._clock = parts.clock
        self._pacing = pacing

    async def terminate(
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
            kill_wait=self._pacing.kill_wait,
            clock=self._clock,
        )
        if ended.detail and ended.gone:
            log.warning("hostler: %s: not signalled: %s", self._key, ended.detail)
        return ended

    async def kill_child(self, grace: float = 0.5) -> Termination | None:
        """End the process held now, if any, without a record of its own."""
        child = self._hold.child
        if child is None:
            return None
        ended = await self.terminate(child, grace=grace)
        if ended.gone:
            self._hold.drop(child)
        return ended

    async def kill_unrecorded(self) -> bool:
        """Stop the process group without recording it: for a shutdown whose log is broken.

        Returns whether the group is gone.
        """
        ended = await self.kill_child(grace=self._pacing.stop_grace)
        return ended is None or ended.gone

    async def record_crash(self, child: EngineChild) -> None:
        """The leader died unasked: make sure its group is gone too, record, then release."""
        ended = await self.terminate(child, grace=0.2, second_grace=0.2)
        status = child.proc.exit_status()
        code, sig = (status.code, status.signal) if status is not None else (None, None)
        self._hold.drop(child)
        with anyio.CancelScope(shield=True):  # gone: its record and its bytes, whatever comes
            if self._parts.state in (EngineState.STARTING, EngineState.RUNNING):
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

    async def stop_locked(
        self, reason: str, decision: dict[str, Any] | None = None, *, unrecorded_ok: bool = False
    ) -> None:
        """Stop the engine, the lock held: record the decision, end the group, then release.

        ``unrecorded_ok``: a shutdown, which stops the engine even when the log cannot record
        it (its events kept pending, SF2).
        """
        record = self._journal.observe if unrecorded_ok else self._journal.decide
        await self.crashed_before_stop()
        state = self._parts.state
        if state == EngineState.BACKOFF:
            await record("stop", reason=reason, decision=decision)
            return
        if state in (EngineState.STARTING, EngineState.RUNNING):
            await record("stop", reason=reason, decision=decision)
        elif state != EngineState.STOPPING:
            return
        child = self._hold.child
        code = sig = None
        detail = ""
        if child is not None and state == EngineState.RUNNING:
            await save_sessions(self._parts, child, reason)  # CC13: while it still answers
        if child is not None:
            ended = await self.terminate(child, grace=self._pacing.stop_grace)
            if not ended.gone:
                await self._journal.observe(
                    "stop_failed", pid=child.identity.pid, detail=ended.detail
                )
                return  # still ours, still held: memory in use is never freed on paper
            code, sig, detail = ended.exit_code, ended.signal, ended.detail
            self._hold.drop(child)
        with anyio.CancelScope(shield=True):  # the process is gone: record it and free its bytes
            await self._journal.observe("exited", exit_code=code, signal=sig, detail=detail)
            await self._account.release()

    async def crashed_before_stop(self) -> None:
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
        child = self._hold.child
        alive = (EngineState.STARTING, EngineState.RUNNING)
        if child is None or not child.proc.own or child.expected_stop:
            return
        if self._parts.state not in alive or child.proc.exit_status() is None:
            return
        with contextlib.suppress(PluginError):  # a broken classify_line costs the panic only
            child.read_lines(self._guard, final=True)
        await self.record_crash(child)

    async def finish_failed_stop(self) -> None:
        """A group that outlived an earlier stop: try again; refuse to start a second one."""
        if self._parts.state != EngineState.STOPPING or self._hold.child is None:
            return
        await self.stop_locked(StopReason.USER)
        child = self._hold.child
        if child is not None:
            raise EngineStartError(
                f"{self._key}: pid {child.identity.pid} from the last run still does not "
                "exit after KILL; hostler will not start a second copy while it holds memory"
            )

    async def fail(self, exc: HostlerError) -> None:
        """Fail the engine (starting or running): its process killed, then ``engine.failed``.

        The reservation goes back only once no process holds it (SG2).
        """
        ended = await self.kill_child()
        await self._journal.observe("failed", error=exc.message, retry_at=None)
        if ended is None or ended.gone:
            await self._account.release()
