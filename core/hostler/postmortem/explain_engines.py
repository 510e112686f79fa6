"""``hostler explain``'s sentences for an engine's own stream: starts, stops, crashes, adoption."""

from __future__ import annotations

from typing import Any

from hostler.events.base import Event
from hostler.machines.engine import (
    EngineAdopted,
    EngineAdoptionStarted,
    EngineCrashed,
    EngineFailed,
    EngineLost,
    EngineReady,
    EngineReset,
    EngineSpawned,
    EngineStartRequested,
    EngineStopFailed,
    EngineStopped,
    EngineStopRequested,
)
from hostler.postmortem.explain_memory import WalkMemory
from hostler.postmortem.explain_wording import (
    crash_how,
    exit_how,
    mapping_of,
    pick,
    secs,
    stop_why,
)
from hostler.postmortem.findings import Finding, cite
from hostler.store.log import RecordedEvent

__all__ = ["EngineSentences"]


class EngineSentences:
    """One sentence per engine event, with the rule and figures of each stop, crash or failure.

    Args:
        memory: The walk's memory (start times for readiness, lease grants near an unload).
    """

    def __init__(self, memory: WalkMemory) -> None:
        self._memory = memory

    def on_engine(  # noqa: PLR0911, PLR0912 - one sentence per engine event type
        self, record: RecordedEvent, key: str, event: Event
    ) -> Finding | None:
        """The finding an event of engine ``key``'s stream makes, or None."""
        f = cite
        if isinstance(event, EngineStartRequested):
            if event.from_state == "backoff":
                return f(
                    record, key, "restart", f"restart requested after its crash ({event.cause})"
                )
            return f(record, key, "start", f"start requested ({event.cause})", cause=event.cause)
        if isinstance(event, EngineSpawned):
            return f(
                record,
                key,
                "spawned",
                f"process started: pid {event.pid}, port {event.port}",
                pid=event.pid,
                port=event.port,
            )
        if isinstance(event, EngineReady):
            began = self._memory.start_at.get(key)
            took = None if began is None else round(event.at - began, 3)
            after = "" if took is None else f" {secs(took)} after its start was asked"
            return f(record, key, "ready", f"ready{after}", took=took)
        if isinstance(event, EngineStopRequested):
            return self._stop(record, key, event)
        if isinstance(event, EngineStopped):
            how = exit_how(event.exit_code, event.signal)
            extra = f" ({event.detail})" if event.detail else ""
            return f(
                record,
                key,
                "stopped",
                f"stopped: {how}{extra}",
                exit_code=event.exit_code,
                signal=event.signal,
            )
        if isinstance(event, EngineCrashed):
            return self._crash(record, key, event)
        if isinstance(event, EngineFailed):
            return self._failed(record, key, event)
        if isinstance(event, EngineStopFailed):
            return f(
                record,
                key,
                "stop-failed",
                f"still alive after TERM, TERM and KILL (pid {event.pid}): {event.detail}",
            )
        if isinstance(event, EngineReset):
            return f(record, key, "reset", f"fatal state cleared ({event.cause})")
        if isinstance(event, EngineAdoptionStarted):
            return f(
                record,
                key,
                "adopting",
                f"a new daemon (pid {event.daemon_pid}) found it alive in the log; checking it",
            )
        if isinstance(event, EngineAdopted):
            return f(record, key, "adopted", f"adopted: pid {event.pid} still ours and answering")
        if isinstance(event, EngineLost):
            return f(record, key, "lost", f"lost: {event.cause}", lost=event.cause)
        return None

    def _stop(self, record: RecordedEvent, key: str, event: EngineStopRequested) -> Finding:
        decision = mapping_of(event.decision)
        rule = decision.get("rule")
        reason = event.reason
        cause: dict[str, Any] = {"reason": reason, "rule": rule}
        text = f"stop requested: {stop_why(reason, decision)}"
        if rule == "SP4":
            cause.update(pick(decision, "unused_for", "idle_timeout"))
        elif rule == "SP5":
            cause.update(pick(decision, "unused_for", "pressure_idle", "pressure"))
        elif rule == "SP3":
            cause.update(pick(decision, "consecutive_failures", "health_failures"))
        elif rule == "PP4":
            drain = decision.get("drain")
            if isinstance(drain, dict) and "waited" in drain:
                text += f", after draining {secs(drain.get('waited'))}"
            cause["for"] = decision.get("for")
        elif rule in ("PP6", "GA1"):
            near = self._memory.lease_near(record)
            if near is not None:
                grant, lease = near
                slot, holder = self._memory.leases.get(lease, ("?", "?"))
                text += (
                    f", {secs((record.recorded_at - grant.recorded_at).total_seconds())} after "
                    f"GPU lease {lease} (slot {slot}, holder {holder}) was granted "
                    f"(seq {grant.seq})"
                )
                cause.update(lease=lease, lease_seq=grant.seq, slot=slot, holder=holder)
        elif rule == "PP10":
            cause["target"] = decision.get("target")
        return cite(record, key, "stop", text, **cause)

    def _crash(self, record: RecordedEvent, key: str, event: EngineCrashed) -> Finding:
        how = crash_how(
            event.exit_code,
            event.signal,
            event.panic_kind,
            event.panic_line,
            event.uptime,
            reached_ready=event.reached_ready,
        )
        text = f"crashed: {how}"
        return cite(
            record,
            key,
            "crashed",
            text,
            exit_code=event.exit_code,
            signal=event.signal,
            panic_kind=event.panic_kind,
            panic_line=event.panic_line,
            uptime=event.uptime,
            reached_ready=event.reached_ready,
            retry_at=event.retry_at,
        )

    def _failed(self, record: RecordedEvent, key: str, event: EngineFailed) -> Finding:
        decision = mapping_of(event.decision)
        text = f"failed: {event.error}"
        cause: dict[str, Any] = {"error": event.error, "retry_at": event.retry_at}
        if decision.get("rule") == "SP1":
            recent = decision.get("recent_starts")
            count = len(recent) if isinstance(recent, list) else recent
            text += (
                f" (SP1: {count} starts within {secs(decision.get('restart_window'))}, "
                f"restart budget {decision.get('restart_budget')}, locked out "
                f"{secs(decision.get('lockout'))})"
            )
            cause.update(pick(decision, "restart_budget", "restart_window", "lockout"))
            cause["recent_starts"] = count
        return cite(record, key, "failed", text, **cause)
