"""``hostler explain``'s core (pure): every recorded decision that touched a target, as findings.

A target is an engine key, a model (every replica of it), a session or one request (PM1). The
records are read by the caller; :func:`resolve_target` says what a target's text names in them
and :func:`explain` walks them oldest first and returns one :class:`Finding` per decision: the
admission and its plan, a refusal and its shortfall, the eviction choice with the demand figures
of every candidate, drains, stops with their thresholds, crashes with their panic, restarts,
adoptions, losses, GPU leases held while it ran, session bindings and queued requests (PM2).
Each finding cites the event's ``seq`` and recorded time and keeps the figures it quotes in
``cause``, so a tool reads the same facts the sentence states.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hostler.capacity.keys import parse_key
from hostler.errors import UsageError
from hostler.events.base import Event
from hostler.events.cache import CacheEvicted, CacheRestored, CacheSaved
from hostler.events.ledger import (
    LedgerAdopted,
    LedgerBudgetSet,
    LedgerCarried,
    LedgerDenied,
    LedgerMeasured,
    LedgerReleased,
    LedgerReserved,
    LedgerSpilloverSet,
)
from hostler.events.pool import PoolDrainEnded, PoolDrainStarted, PoolRoomPlanned
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
from hostler.postmortem.explain_caches import CacheSentences
from hostler.postmortem.explain_capacity import CapacitySentences
from hostler.postmortem.explain_engines import EngineSentences
from hostler.postmortem.explain_memory import LEASE_NEAR, WalkMemory
from hostler.postmortem.explain_traffic import TrafficSentences
from hostler.postmortem.findings import Finding, Target
from hostler.store.log import RecordedEvent

__all__ = [
    "LEASE_NEAR",
    "TARGET_KINDS",
    "Finding",
    "Target",
    "explain",
    "findings_json",
    "resolve_target",
]

#: What a target can name.
TARGET_KINDS = ("engine", "model", "session", "request")

_REQUEST = re.compile(r"^(?P<key>.+)#(?P<id>[0-9]{1,18})$")  # ASCII digits only
_EXPLICIT = re.compile(r"^(?P<kind>engine|model|session|request)=(?P<value>.+)$")
_LEDGER_KEYED = (
    LedgerReserved,
    LedgerDenied,
    LedgerReleased,
    LedgerMeasured,
    LedgerAdopted,
    LedgerCarried,
)
_QUEUE = (
    QueueEnqueued,
    QueueDispatched,
    QueueServed,
    QueueReleased,
    QueueCancelled,
    QueueMoved,
)


# -- resolving a target -------------------------------------------------------------------------


@dataclass
class _Index:
    """What a log names: engine keys, sessions (with their engines) and queued requests."""

    keys: set[str] = field(default_factory=set)
    sessions: dict[str, set[str]] = field(default_factory=dict)
    requests: set[tuple[str, int]] = field(default_factory=set)


def _index(records: Iterable[RecordedEvent]) -> _Index:
    found = _Index()
    for record in records:
        event = record.event
        stream = record.stream_id
        if stream.startswith(("engine/", "reservation/")):
            found.keys.add(stream.partition("/")[2])
        elif isinstance(event, PoolRoomPlanned):
            found.keys.update(
                [event.for_key, *event.evict, *([event.drain] if event.drain else [])]
            )
        elif isinstance(event, (PoolDrainStarted, PoolDrainEnded)):
            found.keys.add(event.key)
        elif isinstance(event, SessionBound):
            found.keys.add(event.key)
            found.sessions.setdefault(event.session, set()).add(event.key)
        elif isinstance(event, QueueEnqueued):
            found.keys.add(event.engine)
            found.requests.add((event.engine, event.id))
            if event.session_id is not None:
                found.sessions.setdefault(event.session_id, set()).add(event.engine)
        elif isinstance(event, _LEDGER_KEYED):
            found.keys.add(event.key)
    return found


def resolve_target(text: str, records: Iterable[RecordedEvent]) -> Target:
    """What ``text`` names in ``records`` (PM1).

    Forms: ``KEY#N`` is request ``N`` of engine ``KEY``'s queue; ``engine=``, ``model=``,
    ``session=`` and ``request=`` force a kind. Otherwise the first that matches wins: an engine
    key seen in the log, a model (``MODEL`` or ``ENGINE:MODEL``, every replica), a session id.

    Raises:
        UsageError: Nothing in the log matches; the message says what was searched.
    """
    wanted = text.strip()
    if not wanted or len(wanted) > 400:
        raise UsageError("explain: give an engine key, a model, a session id or KEY#N")
    found = _index(records)
    explicit = _EXPLICIT.match(wanted)
    kind = explicit.group("kind") if explicit else None
    value = explicit.group("value") if explicit else wanted
    request = _REQUEST.match(value)
    if request and kind in (None, "request"):
        key, number = request.group("key"), int(request.group("id"))
        if (key, number) in found.requests:
            return Target("request", wanted, frozenset({key}), request=number)
        if kind == "request":
            raise _unknown(wanted, found, "request")
    if kind in (None, "engine") and value in found.keys:
        return Target("engine", wanted, frozenset({value}))
    if kind in (None, "model"):
        replicas = frozenset(k for k in found.keys if _model_matches(k, value))
        if replicas:
            return Target("model", wanted, replicas)
    if kind in (None, "session") and value in found.sessions:
        return Target("session", wanted, frozenset(found.sessions[value]), session=value)
    raise _unknown(wanted, found, kind)


def _model_matches(key: str, model: str) -> bool:
    parsed = parse_key(key)
    if parsed is None:
        return False
    return model in (parsed.model, f"{parsed.engine}:{parsed.model}")


def _unknown(text: str, found: _Index, kind: str | None) -> UsageError:
    searched = (
        f"{len(found.keys)} engine keys (and their models), {len(found.sessions)} sessions and "
        f"{len(found.requests)} queued requests (KEY#N)"
    )
    what = f"no {kind}" if kind else "nothing"
    sample = ", ".join(sorted(found.keys)[:5])
    hint = f"; engines seen: {sample}" if sample else ""
    return UsageError(
        f"explain: {what} in this log matches {text[:80]!r}; searched {searched}{hint}"
    )


# -- explaining -----------------------------------------------------------------------------------


def explain(
    records: Iterable[RecordedEvent],
    target: Target,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[Finding]:
    """Every decision in ``records`` (seq order) that touched ``target``, oldest first (PM2).

    Records outside ``since``..``until`` still inform what comes after (who held a lease, when
    a start was asked) but yield no findings. Damaged rows and events of unknown types are
    skipped (the caller reports damaged rows).
    """
    walker = _Walker(target)
    for record in records:
        if record.damage or not isinstance(record.event, Event):
            continue
        produced = walker.step(record)
        if produced is None:
            continue
        if since is not None and record.recorded_at < since:
            continue
        if until is not None and record.recorded_at > until:
            continue
        walker.out.append(produced)
    return walker.out


class _Walker:
    """Walks the records once; the sentence writers share what it remembers."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.out: list[Finding] = []
        memory = WalkMemory()
        self.memory = memory
        self.engines = EngineSentences(memory)
        self.capacity = CapacitySentences(target)
        self.traffic = TrafficSentences(target, memory)
        self.caches = CacheSentences(target)

    # which records concern the target ----------------------------------------------------------

    def _engine_scope(self, key: str) -> bool:
        target = self.target
        if target.kind in ("engine", "model"):
            return key in target.keys
        if target.kind == "session":
            return key in self.memory.bound
        return any(k == key for k, _ in self.memory.open_requests)

    def step(self, record: RecordedEvent) -> Finding | None:  # noqa: PLR0911 - a dispatch
        """The finding ``record`` makes, or None (it may still be remembered)."""
        event = record.event
        assert isinstance(event, Event)  # noqa: S101 - explain() passes only known events
        stream = record.stream_id
        if stream.startswith("engine/"):
            key = stream.removeprefix("engine/")
            found = self.engines.on_engine(record, key, event) if self._engine_scope(key) else None
            self.memory.track_engine(key, event)
            return found
        if isinstance(event, _QUEUE):
            return self.traffic.on_queue(record, event)
        if isinstance(event, SessionBound):
            return self.traffic.on_bound(record, event)
        if isinstance(event, (CacheSaved, CacheRestored, CacheEvicted)):
            return self.caches.on_cache(record, event)
        if isinstance(event, (LeaseRequested, LeaseGranted, LeaseReleased, LeaseBroken)):
            return self.traffic.on_lease(record, stream.removeprefix("lease/"), event)
        if self.target.kind not in ("engine", "model"):
            return None
        capacity = self.capacity
        if isinstance(event, _LEDGER_KEYED):
            return capacity.on_ledger(record, event) if event.key in self.target.keys else None
        if isinstance(event, (LedgerBudgetSet, LedgerSpilloverSet)):
            return capacity.on_setting(record, event)
        if isinstance(event, PoolRoomPlanned):
            return capacity.on_room(record, event)
        if isinstance(event, (PoolDrainStarted, PoolDrainEnded)):
            return capacity.on_drain(record, event) if event.key in self.target.keys else None
        if stream.startswith("reservation/"):
            key = stream.removeprefix("reservation/")
            return capacity.on_reservation(record, key, event) if key in self.target.keys else None
        return None


def findings_json(findings: Sequence[Finding]) -> list[dict[str, Any]]:
    """The findings as JSON objects, in order."""
    return [f.as_json() for f in findings]
