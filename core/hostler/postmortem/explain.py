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
import signal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hostler.capacity.keys import parse_key
from hostler.capacity.victims import DEMAND_WINDOW
from hostler.errors import UsageError
from hostler.events.base import Event
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
from hostler.machines.lease import LeaseBroken, LeaseGranted, LeaseReleased, LeaseRequested
from hostler.machines.reservation import (
    ReservationDenied,
    ReservationGranted,
    ReservationReleased,
    ReservationRequested,
)
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

#: A PP6 unload recorded this many seconds after a lease was granted is cited with that lease.
LEASE_NEAR = 5.0

_REQUEST = re.compile(r"^(?P<key>.+)#(?P<id>[0-9]{1,18})$")  # ASCII digits only
_EXPLICIT = re.compile(r"^(?P<kind>engine|model|session|request)=(?P<value>.+)$")
_UP_STATES = frozenset({"starting", "running", "stopping", "adopting"})
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


@dataclass(frozen=True, slots=True)
class Target:
    """What ``hostler explain`` was asked about, resolved against a log.

    Attributes:
        kind: One of :data:`TARGET_KINDS`.
        text: The target as given.
        keys: The engine keys it covers (one for an engine or a request; every replica of a
            model; every engine a session was bound to or queued on).
        session: The session id (``session`` targets only).
        request: The request id within ``keys``' one queue (``request`` targets only).
    """

    kind: str
    text: str
    keys: frozenset[str]
    session: str | None = None
    request: int | None = None


@dataclass(frozen=True, slots=True)
class Finding:
    """One decision that touched the target.

    Attributes:
        seq: The event's position in the log.
        at: When the log recorded it (UTC).
        subject: What it is about (an engine key, ``lease/ID``, ``session S``, ``KEY#N``).
        kind: A stable word for tools: ``admitted``, ``refused``, ``victim``, ``drained``,
            ``stop``, ``stopped``, ``crashed``, ``restart``, ``failed``, ``lease``...
        text: The sentence a person reads.
        cause: The figures the sentence cites (JSON values).
    """

    seq: int
    at: datetime
    subject: str
    kind: str
    text: str
    cause: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """The finding as a JSON object (``at`` in ISO-8601)."""
        return {
            "seq": self.seq,
            "at": self.at.isoformat(),
            "subject": self.subject,
            "kind": self.kind,
            "text": self.text,
            "cause": self.cause,
        }

    def line(self) -> str:
        """One readable line: time, seq, subject, sentence."""
        stamp = self.at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        return f"{stamp}  seq {self.seq:<7} {self.subject}: {self.text}"


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
    """Walks the records once, remembering what later sentences need."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.out: list[Finding] = []
        self.states: dict[str, str] = {}
        self.start_at: dict[str, float] = {}
        self.leases: dict[str, tuple[str, str]] = {}  # id -> (slot, holder)
        self.last_grant: tuple[RecordedEvent, str] | None = None
        self.open_requests: set[tuple[str, int]] = set()
        self.bound: set[str] = set()

    # which records concern the target ----------------------------------------------------------

    def _engine_scope(self, key: str) -> bool:
        target = self.target
        if target.kind in ("engine", "model"):
            return key in target.keys
        if target.kind == "session":
            return key in self.bound
        return any(k == key for k, _ in self.open_requests)

    def step(self, record: RecordedEvent) -> Finding | None:  # noqa: PLR0911 - a dispatch
        """The finding ``record`` makes, or None (it may still be remembered)."""
        event = record.event
        assert isinstance(event, Event)  # noqa: S101 - explain() passes only known events
        stream = record.stream_id
        if stream.startswith("engine/"):
            key = stream.removeprefix("engine/")
            found = self._engine(record, key, event) if self._engine_scope(key) else None
            self._track_engine(key, event)
            return found
        if isinstance(event, _QUEUE):
            return self._queue(record, event)
        if isinstance(event, SessionBound):
            return self._bound(record, event)
        if isinstance(event, (LeaseRequested, LeaseGranted, LeaseReleased, LeaseBroken)):
            return self._lease(record, stream.removeprefix("lease/"), event)
        if self.target.kind not in ("engine", "model"):
            return None
        if isinstance(event, _LEDGER_KEYED):
            return self._ledger(record, event) if event.key in self.target.keys else None
        if isinstance(event, (LedgerBudgetSet, LedgerSpilloverSet)):
            return self._setting(record, event)
        if isinstance(event, PoolRoomPlanned):
            return self._room(record, event)
        if isinstance(event, (PoolDrainStarted, PoolDrainEnded)):
            return self._drain(record, event) if event.key in self.target.keys else None
        if stream.startswith("reservation/"):
            key = stream.removeprefix("reservation/")
            return self._reservation(record, key, event) if key in self.target.keys else None
        return None

    def _track_engine(self, key: str, event: Event) -> None:
        to_state = getattr(event, "to_state", None)
        if isinstance(to_state, str):
            self.states[key] = to_state
        if isinstance(event, EngineStartRequested):
            self.start_at[key] = event.at

    def _finding(
        self, record: RecordedEvent, subject: str, kind: str, text: str, **cause: Any
    ) -> Finding:
        return Finding(record.seq, record.recorded_at, subject, kind, text, cause)

    # engines --------------------------------------------------------------------------------

    def _engine(  # noqa: PLR0911, PLR0912 - one sentence per engine event type
        self, record: RecordedEvent, key: str, event: Event
    ) -> Finding | None:
        f = self._finding
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
            began = self.start_at.get(key)
            took = None if began is None else round(event.at - began, 3)
            after = "" if took is None else f" {_secs(took)} after its start was asked"
            return f(record, key, "ready", f"ready{after}", took=took)
        if isinstance(event, EngineStopRequested):
            return self._stop(record, key, event)
        if isinstance(event, EngineStopped):
            how = _exit(event.exit_code, event.signal)
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
        decision = _mapping(event.decision)
        rule = decision.get("rule")
        reason = event.reason
        cause: dict[str, Any] = {"reason": reason, "rule": rule}
        if rule == "SP4":
            text = (
                f"stop requested: idle (SP4): unused for {_secs(decision.get('unused_for'))}, "
                f"idle timeout {_secs(decision.get('idle_timeout'))}"
            )
            cause.update(_pick(decision, "unused_for", "idle_timeout"))
        elif rule == "SP5":
            text = (
                "stop requested: memory pressure (SP5): unused for "
                f"{_secs(decision.get('unused_for'))}, early-stop threshold "
                f"{_secs(decision.get('pressure_idle'))} under pressure"
            )
            cause.update(_pick(decision, "unused_for", "pressure_idle", "pressure"))
        elif rule == "SP3":
            text = (
                f"stop requested: health restart (SP3): {decision.get('consecutive_failures')} "
                f"failed probes in a row, limit {decision.get('health_failures')}"
            )
            cause.update(_pick(decision, "consecutive_failures", "health_failures"))
        elif rule == "PP4":
            text = f"stop requested: evicted (PP4) to make room for {decision.get('for')}"
            drain = decision.get("drain")
            if isinstance(drain, dict) and "waited" in drain:
                text += f", after draining {_secs(drain.get('waited'))}"
            cause["for"] = decision.get("for")
        elif rule in ("PP6", "GA1"):
            text = (
                "stop requested: evicted (PP6): unloaded while idle"
                if rule == "PP6"
                else f"stop requested: unloaded (GA1): its GPU slot ({decision.get('slot')}) "
                "gave the card to another slot"
            )
            near = self._lease_near(record)
            if near is not None:
                grant, lease = near
                slot, holder = self.leases.get(lease, ("?", "?"))
                text += (
                    f", {_secs((record.recorded_at - grant.recorded_at).total_seconds())} after "
                    f"GPU lease {lease} (slot {slot}, holder {holder}) was granted "
                    f"(seq {grant.seq})"
                )
                cause.update(lease=lease, lease_seq=grant.seq, slot=slot, holder=holder)
        elif rule == "PP9":
            text = "stop requested: evicted (PP9): the pool is retiring, work done"
        elif rule == "PP10":
            text = (
                f"stop requested: evicted (PP10): above the replica target {decision.get('target')}"
            )
            cause["target"] = decision.get("target")
        else:
            text = f"stop requested: {reason}"
            if rule:
                text += f" ({rule})"
        return self._finding(record, key, "stop", text, **cause)

    def _lease_near(self, record: RecordedEvent) -> tuple[RecordedEvent, str] | None:
        if self.last_grant is None:
            return None
        grant, lease = self.last_grant
        gap = (record.recorded_at - grant.recorded_at).total_seconds()
        return (grant, lease) if 0 <= gap <= LEASE_NEAR else None

    def _crash(self, record: RecordedEvent, key: str, event: EngineCrashed) -> Finding:
        how = _exit(event.exit_code, event.signal)
        if event.panic_kind:
            panic = f"panic kind {event.panic_kind}"
            if event.panic_line:
                panic += f": {event.panic_line[:200]!r}"
        else:
            panic = "no panic line recognised in its output"
        ran = "" if event.uptime is None else f"after {_secs(event.uptime)}"
        ready = "had become ready" if event.reached_ready else "never became ready"
        text = f"crashed: {how}; {panic}; {ran}{', ' if ran else ''}{ready}"
        return self._finding(
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
        decision = _mapping(event.decision)
        text = f"failed: {event.error}"
        cause: dict[str, Any] = {"error": event.error, "retry_at": event.retry_at}
        if decision.get("rule") == "SP1":
            recent = decision.get("recent_starts")
            count = len(recent) if isinstance(recent, list) else recent
            text += (
                f" (SP1: {count} starts within {_secs(decision.get('restart_window'))}, "
                f"restart budget {decision.get('restart_budget')}, locked out "
                f"{_secs(decision.get('lockout'))})"
            )
            cause.update(_pick(decision, "restart_budget", "restart_window", "lockout"))
            cause["recent_starts"] = count
        return self._finding(record, key, "failed", text, **cause)

    # ledger, reservations and the pool ------------------------------------------------------

    def _ledger(  # noqa: PLR0911 - one sentence per ledger event type
        self, record: RecordedEvent, event: Event
    ) -> Finding | None:
        f = self._finding
        if isinstance(event, LedgerReserved):
            left = event.budget - event.committed_other - event.bytes
            text = (
                f"admitted: reserved {_size(event.bytes)} (held {_size(event.prior)} before); "
                f"others held {_size(event.committed_other)} of the {_size(event.budget)} "
                f"budget, leaving {_size(left)}"
            )
            if not event.enforced:
                text += " (budget not enforced: an explicit budget under 1 GiB)"
            return f(
                record,
                event.key,
                "admitted",
                text,
                bytes=event.bytes,
                prior=event.prior,
                committed_other=event.committed_other,
                budget=event.budget,
                ceiling=event.ceiling,
                enforced=event.enforced,
            )
        if isinstance(event, LedgerDenied):
            return f(
                record,
                event.key,
                "refused",
                f"refused: needed {_size(event.bytes)}, {_size(event.shortfall)} short "
                f"({event.reason}); others held {_size(event.committed_other)} of the "
                f"{_size(event.budget)} budget",
                bytes=event.bytes,
                shortfall=event.shortfall,
                reason=event.reason,
                committed_other=event.committed_other,
                budget=event.budget,
                ceiling=event.ceiling,
            )
        if isinstance(event, LedgerReleased):
            return f(
                record,
                event.key,
                "released",
                f"its {_size(event.bytes)} reservation went back ({event.cause})",
                bytes=event.bytes,
                cause=event.cause,
            )
        if isinstance(event, LedgerMeasured):
            return f(
                record,
                event.key,
                "measured",
                f"measured {_size(event.bytes)} (admitted on an estimate of "
                f"{_size(event.estimated)})",
                bytes=event.bytes,
                estimated=event.estimated,
            )
        if isinstance(event, LedgerAdopted):
            over = f", {_size(event.over_budget)} over budget" if event.over_budget else ""
            return f(
                record,
                event.key,
                "adopted-memory",
                f"its running process's {_size(event.bytes)} taken over by a new owner{over}",
                bytes=event.bytes,
                over_budget=event.over_budget,
            )
        if isinstance(event, LedgerCarried):
            return f(
                record,
                event.key,
                "carried",
                f"its {_size(event.bytes)} reservation was carried into a replaced ledger",
                bytes=event.bytes,
            )
        return None

    def _setting(self, record: RecordedEvent, event: Event) -> Finding:
        if isinstance(event, LedgerBudgetSet):
            value = "automatic" if event.budget is None else _size(event.budget)
            return self._finding(
                record, "host", "budget", f"memory budget set to {value}", budget=event.budget
            )
        assert isinstance(event, LedgerSpilloverSet)  # noqa: S101 - the caller checked
        value = {None: "automatic", True: "allowed", False: "forbidden"}[event.allowed]
        return self._finding(
            record, "host", "spillover", f"RAM spillover {value}", allowed=event.allowed
        )

    def _reservation(self, record: RecordedEvent, key: str, event: Event) -> Finding | None:
        f = self._finding
        if isinstance(event, ReservationRequested):
            return f(record, key, "reserve", f"asked to reserve {_size(event.bytes)}")
        if isinstance(event, ReservationGranted):
            return f(
                record,
                key,
                "admitted",
                f"admitted: {_size(event.bytes)} granted; others held "
                f"{_size(event.committed_other)} of the {_size(event.budget)} budget",
                bytes=event.bytes,
                committed_other=event.committed_other,
                budget=event.budget,
            )
        if isinstance(event, ReservationDenied):
            return f(
                record,
                key,
                "refused",
                f"refused: {_size(event.shortfall)} short ({event.reason}); others held "
                f"{_size(event.committed_other)} of the {_size(event.budget)} budget",
                shortfall=event.shortfall,
                reason=event.reason,
                committed_other=event.committed_other,
                budget=event.budget,
            )
        if isinstance(event, ReservationReleased):
            return f(record, key, "released", f"reservation released ({event.cause})")
        return None

    def _room(self, record: RecordedEvent, event: PoolRoomPlanned) -> Finding | None:
        keys = self.target.keys
        decision = _mapping(event.decision)
        candidates = _candidates(decision)
        policy = f"{decision.get('eviction', '?')} v{decision.get('eviction_version', '?')}"
        if event.for_key in keys:
            if not event.reachable:
                total = sum(c["bytes"] for c in candidates.values() if not c["draining"])
                return self._finding(
                    record,
                    event.for_key,
                    "refused",
                    f"refused: needed {_size(event.wanted)}, {_size(event.shortfall)} short, "
                    f"and evicting every evictable engine would free only {_size(total)}",
                    wanted=event.wanted,
                    shortfall=event.shortfall,
                    evictable=total,
                    reachable=False,
                )
            gone = [*event.evict, *([event.drain] if event.drain else [])]
            return self._finding(
                record,
                event.for_key,
                "room",
                f"needed {_size(event.wanted)}, {_size(event.shortfall)} short: making room by "
                f"evicting {', '.join(event.evict) or 'nothing'}"
                + (f" and draining {event.drain}" if event.drain else "")
                + f" (PP4, policy {policy})",
                wanted=event.wanted,
                shortfall=event.shortfall,
                victims=gone,
                policy=decision.get("eviction"),
            )
        chosen = [k for k in keys if k in event.evict or k == event.drain]
        if not chosen:
            return None
        key = chosen[0]
        mine = candidates.get(key)
        others = [c for k, c in sorted(candidates.items()) if k != key]
        with_them = [k for k in event.evict if k != key]
        how = "to drain (every idle engine together was not enough)" if key == event.drain else ""
        text = (
            f"chosen as a victim {how + ' ' if how else ''}to make room for {event.for_key} "
            f"({_size(event.shortfall)} short) by policy {policy}: "
            f"{_figures(mine) if mine else 'no figures recorded'}"
        )
        if others:
            text += " vs " + "; ".join(f"{c['key']}: {_figures(c)}" for c in others)
        if with_them:
            text += f"; evicted with {', '.join(with_them)}"
        return self._finding(
            record,
            key,
            "victim",
            text,
            rule="PP4",
            policy=decision.get("eviction"),
            policy_version=decision.get("eviction_version"),
            demand_window=DEMAND_WINDOW,
            shortfall=event.shortfall,
            for_key=event.for_key,
            victim=mine,
            others=others,
            evicted_with=with_them,
        )

    def _drain(self, record: RecordedEvent, event: Event) -> Finding | None:
        if isinstance(event, PoolDrainStarted):
            why = f" for {event.for_key}" if event.for_key else ""
            return self._finding(
                record,
                event.key,
                "drain",
                f"draining{why}: takes no new work, waits up to {_secs(event.wait)} for its "
                "requests to end",
                wait=event.wait,
                for_key=event.for_key,
            )
        assert isinstance(event, PoolDrainEnded)  # noqa: S101 - the caller checked
        return self._finding(
            record,
            event.key,
            "drained",
            f"drain ended after {_secs(event.waited)}: {event.outcome}",
            waited=event.waited,
            outcome=event.outcome,
        )

    # leases, sessions, requests -----------------------------------------------------------------

    def _lease(self, record: RecordedEvent, lease: str, event: Event) -> Finding | None:
        if isinstance(event, LeaseRequested):
            self.leases[lease] = (event.slot, event.holder)
        elif isinstance(event, LeaseGranted):
            self.last_grant = (record, lease)
        if self.target.kind not in ("engine", "model") or isinstance(event, LeaseRequested):
            return None
        up = sorted(k for k in self.target.keys if self.states.get(k) in _UP_STATES)
        if not up:
            return None
        slot, holder = self.leases.get(lease, ("?", "?"))
        if isinstance(event, LeaseGranted):
            text = f"GPU lease {lease} granted to {holder} (slot {slot}) while it was up"
            what = "granted"
        elif isinstance(event, LeaseBroken):
            text = (
                f"GPU lease {lease} of {holder} (slot {slot}) broken: {event.reason}, stale for "
                f"{_secs(event.stale_for)}"
            )
            what = "broken"
        else:
            assert isinstance(event, LeaseReleased)  # noqa: S101 - the caller checked
            text = f"GPU lease {lease} of {holder} (slot {slot}) released ({event.cause})"
            what = "released"
        return self._finding(
            record, ", ".join(up), "lease", text, lease=lease, slot=slot, holder=holder, what=what
        )

    def _bound(self, record: RecordedEvent, event: SessionBound) -> Finding | None:
        target = self.target
        if target.kind == "session":
            if event.session != target.session:
                return None
            self.bound.add(event.key)
        elif target.kind not in ("engine", "model") or event.key not in target.keys:
            return None
        return self._finding(
            record,
            event.key,
            "bound",
            f"session {event.session} bound to {event.key} ({event.how}; sessions per replica "
            f"{dict(sorted(event.sessions.items()))})",
            session=event.session,
            how=event.how,
            sessions=event.sessions,
        )

    def _queue(self, record: RecordedEvent, event: Event) -> Finding | None:
        target = self.target
        engine: str = getattr(event, "engine", "")
        number: int = getattr(event, "id", -1)
        pair = (engine, number)
        if isinstance(event, QueueEnqueued):
            mine = (target.kind == "session" and event.session_id == target.session) or (
                target.kind == "request" and pair == (min(target.keys), target.request)
            )
            if not mine:
                self.open_requests.discard(pair)
                return None
            self.open_requests.add(pair)
            if target.kind == "session":
                self.bound.add(engine)
            return self._finding(
                record,
                f"{engine}#{number}",
                "enqueued",
                f"request queued in lane {event.lane}"
                + (f" (session {event.session_id})" if event.session_id else ""),
                lane=event.lane,
                session=event.session_id,
            )
        if pair not in self.open_requests:
            cancelled = isinstance(event, QueueCancelled)
            if cancelled and target.kind in ("engine", "model") and engine in target.keys:
                return self._queue_line(record, event, pair)
            return None
        if isinstance(event, (QueueReleased, QueueCancelled)):
            self.open_requests.discard(pair)
        return self._queue_line(record, event, pair)

    def _queue_line(self, record: RecordedEvent, event: Event, pair: tuple[str, int]) -> Finding:
        subject = f"{pair[0]}#{pair[1]}"
        if isinstance(event, QueueDispatched):
            decision = _mapping(event.decision)
            return self._finding(
                record,
                subject,
                "dispatched",
                f"got its slot after waiting {_secs(event.waited)} (Q4 rule "
                f"{decision.get('rule')}, {decision.get('running')} running of width "
                f"{decision.get('width')}, {decision.get('pending')} pending)",
                waited=event.waited,
                rule=decision.get("rule"),
            )
        if isinstance(event, QueueServed):
            return self._finding(
                record,
                subject,
                "served",
                f"reached its engine after waiting {_secs(event.waited)} in all (its place "
                "in the queue, its engine's start when it was not running, a free slot)",
                waited=event.waited,
            )
        if isinstance(event, QueueReleased):
            return self._finding(
                record,
                subject,
                "done",
                f"ran {_secs(event.ran_for)} and gave its slot back",
                ran_for=event.ran_for,
            )
        if isinstance(event, QueueCancelled):
            return self._finding(
                record,
                subject,
                "cancelled",
                f"left the queue without running ({event.why}) after {_secs(event.waited)}",
                why=event.why,
                waited=event.waited,
            )
        assert isinstance(event, QueueMoved)  # noqa: S101 - the caller checked
        return self._finding(
            record,
            subject,
            "moved",
            f"moved {event.direction}, swapping places with #{event.swapped_with}",
        )


# -- wording --------------------------------------------------------------------------------------


def _candidates(decision: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """PP4's candidates by key, each with the figures explain cites (bad entries skipped)."""
    found: dict[str, dict[str, Any]] = {}
    raw = decision.get("candidates")
    for entry in raw if isinstance(raw, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("key"), str):
            continue
        found[entry["key"]] = {
            "key": entry["key"],
            "bytes": _int(entry.get("bytes")),
            "recent_hits": _int(entry.get("recent_hits")),
            "idle_for": _float(entry.get("idle_for")),
            "busy": bool(entry.get("busy")),
            "draining": bool(entry.get("draining")),
        }
    return found


def _figures(c: Mapping[str, Any]) -> str:
    hits = c["recent_hits"]
    busy = ", busy" if c["busy"] else ""
    return (
        f"{hits} request{'' if hits == 1 else 's'} in the last {DEMAND_WINDOW:.0f} s, idle "
        f"{_secs(c['idle_for'])}, {_size(c['bytes'])}{busy}"
    )


def _mapping(value: object) -> dict[str, Any]:
    """A recorded decision, or {} when the row holds something else there."""
    return value if isinstance(value, dict) else {}


def _pick(decision: Mapping[str, Any], *names: str) -> dict[str, Any]:
    return {name: decision.get(name) for name in names}


def _int(value: Any) -> int:
    return value if type(value) is int else 0


def _float(value: Any) -> float:
    return float(value) if type(value) in (int, float) else 0.0


def _secs(value: Any) -> str:
    if type(value) not in (int, float):
        return "? s"
    if value >= 120:
        return f"{value / 60:.1f} min"
    if 0 < value < 1:
        return f"{value * 1000:.3g} ms"
    return f"{value:.3g} s"


def _size(value: Any) -> str:
    if type(value) is not int:
        return "?"
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale:
            return f"{sign}{value / scale:.1f} {unit}"
    return f"{sign}{value} B"


def _exit(code: int | None, number: int | None) -> str:
    if number is not None:
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = "an unknown signal"
        return f"killed by signal {number} ({name})"
    if code is None:
        return "exit status unknown"
    return f"exit code {code}"


def findings_json(findings: Sequence[Finding]) -> list[dict[str, Any]]:
    """The findings as JSON objects, in order."""
    return [f.as_json() for f in findings]
