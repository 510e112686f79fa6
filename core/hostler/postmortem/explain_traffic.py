"""``hostler explain``'s sentences for work: GPU leases, session bindings and queued requests."""

from __future__ import annotations

from hostler.events.base import Event
from hostler.events.queue import (
    QueueCancelled,
    QueueDispatched,
    QueueEnqueued,
    QueueMoved,
    QueueReleased,
    QueueServed,
)
from hostler.events.router import SessionBound
from hostler.machines.lease import LeaseBroken, LeaseGranted, LeaseReleased, LeaseRequested
from hostler.postmortem.explain_memory import WalkMemory
from hostler.postmortem.explain_wording import mapping_of, secs
from hostler.postmortem.findings import Finding, Target, cite
from hostler.store.log import RecordedEvent

__all__ = ["TrafficSentences"]

_UP_STATES = frozenset({"starting", "running", "stopping", "adopting"})


class TrafficSentences:
    """Leases held while the target ran, its sessions' bindings and its requests' queue steps.

    Args:
        target: What is explained.
        memory: The walk's memory (it records leases, open requests and bound engines here).
    """

    def __init__(self, target: Target, memory: WalkMemory) -> None:
        self._target = target
        self._memory = memory

    def on_lease(self, record: RecordedEvent, lease: str, event: Event) -> Finding | None:
        """A GPU lease granted, broken or released while an engine of the target was up."""
        if isinstance(event, LeaseRequested):
            self._memory.leases[lease] = (event.slot, event.holder)
        elif isinstance(event, LeaseGranted):
            self._memory.last_grant = (record, lease)
        if self._target.kind not in ("engine", "model") or isinstance(event, LeaseRequested):
            return None
        up = sorted(k for k in self._target.keys if self._memory.states.get(k) in _UP_STATES)
        if not up:
            return None
        slot, holder = self._memory.leases.get(lease, ("?", "?"))
        if isinstance(event, LeaseGranted):
            text = f"GPU lease {lease} granted to {holder} (slot {slot}) while it was up"
            what = "granted"
        elif isinstance(event, LeaseBroken):
            text = (
                f"GPU lease {lease} of {holder} (slot {slot}) broken: {event.reason}, stale for "
                f"{secs(event.stale_for)}"
            )
            what = "broken"
        else:
            assert isinstance(event, LeaseReleased)  # noqa: S101 - the caller checked
            text = f"GPU lease {lease} of {holder} (slot {slot}) released ({event.cause})"
            what = "released"
        return cite(
            record, ", ".join(up), "lease", text, lease=lease, slot=slot, holder=holder, what=what
        )

    def on_bound(self, record: RecordedEvent, event: SessionBound) -> Finding | None:
        """A session bound to an engine of the target (or the target session bound)."""
        target = self._target
        if target.kind == "session":
            if event.session != target.session:
                return None
            self._memory.bound.add(event.key)
        elif target.kind not in ("engine", "model") or event.key not in target.keys:
            return None
        return cite(
            record,
            event.key,
            "bound",
            f"session {event.session} bound to {event.key} ({event.how}; sessions per replica "
            f"{dict(sorted(event.sessions.items()))})",
            session=event.session,
            how=event.how,
            sessions=event.sessions,
        )

    def on_queue(self, record: RecordedEvent, event: Event) -> Finding | None:
        """A queued request of the target: queued, dispatched, served, done, cancelled, moved."""
        target = self._target
        engine: str = getattr(event, "engine", "")
        number: int = getattr(event, "id", -1)
        pair = (engine, number)
        if isinstance(event, QueueEnqueued):
            mine = (target.kind == "session" and event.session_id == target.session) or (
                target.kind == "request" and pair == (min(target.keys), target.request)
            )
            if not mine:
                self._memory.open_requests.discard(pair)
                return None
            self._memory.open_requests.add(pair)
            if target.kind == "session":
                self._memory.bound.add(engine)
            return cite(
                record,
                f"{engine}#{number}",
                "enqueued",
                f"request queued in lane {event.lane}"
                + (f" (session {event.session_id})" if event.session_id else ""),
                lane=event.lane,
                session=event.session_id,
            )
        if pair not in self._memory.open_requests:
            cancelled = isinstance(event, QueueCancelled)
            if cancelled and target.kind in ("engine", "model") and engine in target.keys:
                return self._queue_line(record, event, pair)
            return None
        if isinstance(event, (QueueReleased, QueueCancelled)):
            self._memory.open_requests.discard(pair)
        return self._queue_line(record, event, pair)

    def _queue_line(self, record: RecordedEvent, event: Event, pair: tuple[str, int]) -> Finding:
        subject = f"{pair[0]}#{pair[1]}"
        if isinstance(event, QueueDispatched):
            decision = mapping_of(event.decision)
            return cite(
                record,
                subject,
                "dispatched",
                f"got its slot after waiting {secs(event.waited)} (Q4 rule "
                f"{decision.get('rule')}, {decision.get('running')} running of width "
                f"{decision.get('width')}, {decision.get('pending')} pending)",
                waited=event.waited,
                rule=decision.get("rule"),
            )
        if isinstance(event, QueueServed):
            return cite(
                record,
                subject,
                "served",
                f"reached its engine after waiting {secs(event.waited)} in all (its place "
                "in the queue, its engine's start when it was not running, a free slot)",
                waited=event.waited,
            )
        if isinstance(event, QueueReleased):
            return cite(
                record,
                subject,
                "done",
                f"ran {secs(event.ran_for)} and gave its slot back",
                ran_for=event.ran_for,
            )
        if isinstance(event, QueueCancelled):
            return cite(
                record,
                subject,
                "cancelled",
                f"left the queue without running ({event.why}) after {secs(event.waited)}",
                why=event.why,
                waited=event.waited,
            )
        assert isinstance(event, QueueMoved)  # noqa: S101 - the caller checked
        return cite(
            record,
            subject,
            "moved",
            f"moved {event.direction}, swapping places with #{event.swapped_with}",
        )
