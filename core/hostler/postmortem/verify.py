"""Re-derive every recorded decision with the current policy code (pure; ``replay --verify``).

Each decision kind has a *re-deriver*: it takes the recorded event, rebuilds the inputs the
runtime handed to a pure policy function (from the event and its ``decision`` dict), calls that
very function again, and returns both answers as a :class:`Rederived`. What counts as an input
and what as policy (docs/postmortem.md, rule PM11):

- **recorded inputs** (observations and the daemon's configuration: ``now``, bytes, budgets,
  the drain wait, the supervision thresholds, the eviction policy's *name*) are taken from the
  log, so a log re-derives the same whatever this process is configured with;
- **policy** (the code and its module constants: the demand window, the victim order, the cache
  watermarks, the admission arithmetic) is the current code, so a changed constant shows up as
  differences.

A decision whose inputs were not all recorded is *not re-derivable* (``missing`` says which),
never counted as agreeing (PM12). Rows that cannot be read, and events of unknown types, are
reported, never folded (PM13). Nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from hostler.capacity.keys import make_key, parse_key
from hostler.capacity.ledger import LedgerLimits, denial_reason, shortfall
from hostler.events.base import Event, UnknownEvent
from hostler.events.cache import CacheEvicted
from hostler.events.ledger import LedgerDenied, LedgerReserved
from hostler.events.pool import PoolDrainEnded, PoolRoomPlanned
from hostler.events.queue import (
    QueueCancelled,
    QueueDispatched,
    QueueEnqueued,
    QueueMoved,
    QueueReleased,
)
from hostler.events.router import SessionBound
from hostler.machines.engine import EngineFailed, EngineStopRequested
from hostler.machines.lease import LeaseBroken
from hostler.policies.cache import CacheEntry, plan_eviction
from hostler.policies.eviction import (
    BUILTIN_EVICTION_POLICIES,
    DEFAULT_EVICTION_POLICY,
    EvictionPolicy,
)
from hostler.policies.pool import PoolEntry, drain_verdict, pick_replica, plan_make_room
from hostler.policies.queue import (
    RECENT_CAP,
    LaneCaps,
    Pending,
    RecentRun,
    Running,
    pick_next,
    prune_recent,
)
from hostler.policies.supervision import (
    SupervisionPolicy,
    decide_health,
    decide_idle,
    decide_pressure,
    decide_start,
)

__all__ = [
    "OPERATOR_RULES",
    "REDERIVERS",
    "Context",
    "Finding",
    "QueueHistory",
    "Rederived",
    "Rederiver",
    "Status",
    "VerifyReport",
    "rederive",
    "verify_records",
]

#: Rules of stops a person, a lease (GA1) or a reconcile asked for: carried out, not chosen.
OPERATOR_RULES = frozenset({"PP6", "PP9", "PP10", "GA1"})

Status = Literal["agree", "differ", "not-rederivable", "unreadable"]


@dataclass(frozen=True, slots=True)
class Rederived:
    """One decision's recorded answer beside the answer the current code gives (PM10).

    Attributes:
        rule: The rule that decided (``PP4``, ``SP4``, ``CB7``...).
        recorded: What the log says was decided (the answer, and figures shown for context).
        rederived: What the current code decides from the same inputs; None when it cannot
            be re-derived.
        compared: The fields of the answer; only these make a difference (figures such as
            each candidate's demand are context).
        missing: When not re-derivable: the input that was not recorded.
        note: Anything a reader should know (a policy version that moved on).
    """

    rule: str
    recorded: dict[str, Any]
    rederived: dict[str, Any] | None
    compared: tuple[str, ...] = ()
    missing: str = ""
    note: str = ""

    def differs(self) -> tuple[str, ...]:
        """The compared fields whose two answers are not equal (empty when not re-derivable)."""
        if self.rederived is None:
            return ()
        return tuple(f for f in self.compared if self.recorded.get(f) != self.rederived.get(f))


class _Queue:
    """One engine's queue as its events rebuild it: what waits, what runs, what ended."""

    __slots__ = ("pending", "recent", "running")

    def __init__(self) -> None:
        self.pending: dict[int, Pending] = {}
        self.running: dict[int, Running] = {}
        self.recent: deque[RecentRun] = deque(maxlen=16 * RECENT_CAP)


class QueueHistory:
    """PM18: every engine's queue folded from its ``queue.*`` events, in log order.

    :func:`verify_records` shows each event to :meth:`observe` after re-deriving it, so a
    ``queue.dispatched`` re-derivation sees the queue as it stood just before that dispatch.
    """

    def __init__(self) -> None:
        self._queues: dict[str, _Queue] = {}

    def queue(self, stream: str) -> _Queue | None:
        """The queue of ``stream`` (``queue/KEY``) so far; None before its first event."""
        return self._queues.get(stream)

    def observe(self, event: Event, stream: str) -> None:
        """Fold one event (events of other kinds are ignored)."""
        if not stream.startswith("queue/"):
            return
        q = self._queues.setdefault(stream, _Queue())
        if isinstance(event, QueueEnqueued):
            q.pending[event.id] = Pending(
                event.id,
                "background" if event.lane == "background" else "interactive",
                event.at,
                event.id,  # a request's rank is its id until a move swaps it (Q8)
                ambient=event.ambient,
                session_id=event.session_id,
                group=event.group,
            )
        elif isinstance(event, QueueDispatched):
            p = q.pending.pop(event.id, None)
            if p is not None:
                q.running[p.id] = Running(p.id, p.lane, event.at, p.ambient, p.session_id, p.group)
        elif isinstance(event, QueueReleased):
            r = q.running.pop(event.id, None)
            if r is not None:
                q.recent.append(RecentRun(r.session_id, r.group, event.at))
        elif isinstance(event, QueueCancelled):
            q.pending.pop(event.id, None)
        elif isinstance(event, QueueMoved):
            a, b = q.pending.get(event.id), q.pending.get(event.swapped_with)
            if a is not None and b is not None:
                q.pending[a.id] = dataclasses.replace(a, order=b.order)
                q.pending[b.id] = dataclasses.replace(b, order=a.order)


@dataclass(frozen=True, slots=True)
class Context:
    """What re-derivation may use besides the event.

    Attributes:
        eviction_policies: Policies plugins registered, by name.
        queues: The queues folded so far (set by :func:`verify_records`; without it a
            dispatch is not re-derivable).
    """

    eviction_policies: Mapping[str, EvictionPolicy] = field(default_factory=dict)
    queues: QueueHistory | None = None

    def eviction(self, name: str) -> EvictionPolicy | None:
        """The eviction policy called ``name`` (built-in or a plugin's), or None."""
        return BUILTIN_EVICTION_POLICIES.get(name) or self.eviction_policies.get(name)


#: A re-deriver: ``(event, stream, context) -> Rederived``, or None when the event, though of a
#: decision kind, records no decision (a shutdown's stop, an operator's cache clear).
Rederiver = Callable[[Any, str, Context], Rederived | None]


def _not(rule: str, recorded: dict[str, Any], missing: str) -> Rederived:
    return Rederived(rule, recorded, None, tuple(recorded), missing=missing)


# -- pool (PP4, PP5, PP11) ----------------------------------------------------------------------


def _hits(candidate: Mapping[str, Any], now: float) -> tuple[float, ...]:
    """PM14: request times from the recorded ages; old records without ages: at ``now``."""
    ages = candidate.get("hit_ages")
    if isinstance(ages, list):
        return tuple(now - float(a) for a in ages)
    return (now,) * int(candidate.get("recent_hits", 0))


def _entries(decision: Mapping[str, Any], now: float) -> list[PoolEntry]:
    observed = decision.get("observed")
    exact: Mapping[str, Any] = observed if isinstance(observed, Mapping) else {}
    entries = []
    for c in decision["candidates"]:
        key = str(c["key"])
        size = c["bytes"]
        if type(size) is not int:
            raise TypeError(f"candidate {key!r}: bytes is not a whole number")
        seen = exact.get(key)
        if isinstance(seen, Mapping):  # exact figures (PM14), recorded since this check came
            last = float(seen["last_used_at"])
            hits = tuple(float(t) for t in seen["hits"])
        else:
            last = now - float(c["idle_for"])
            hits = _hits(c, now)
        entries.append(
            PoolEntry(key, size, last, hits, busy=bool(c["busy"]), draining=bool(c["draining"]))
        )
    return entries


def _room(
    decision: Mapping[str, Any], short: int, ctx: Context
) -> tuple[dict[str, Any] | None, str, str]:
    """Re-plan PP4: (answer and figures, or None; what is missing; a note)."""
    name = decision.get("eviction", DEFAULT_EVICTION_POLICY.name)
    policy = ctx.eviction(str(name))
    if policy is None:
        return None, f"the eviction policy {name!r} (its plugin is not installed here)", ""
    now = float(decision["now"])
    room = plan_make_room(_entries(decision, now), short, now, policy)
    version = decision.get("eviction_version", 1)
    note = (
        f"recorded by {name} v{version}; re-derived with v{policy.version}"
        if version != policy.version
        else ""
    )
    answer = {
        "evict": list(room.evict) if room.reachable else [],
        "drain": room.drain if room.reachable else None,
        "reachable": room.reachable,
        "demand": {c["key"]: c["recent_hits"] for c in room.decision["candidates"]},
    }
    return answer, "", note


def _pool_room_planned(event: PoolRoomPlanned, _stream: str, ctx: Context) -> Rederived:
    decision = event.decision
    recorded = {
        "evict": list(event.evict),
        "drain": event.drain,
        "reachable": event.reachable,
        "demand": {c["key"]: c.get("recent_hits") for c in decision["candidates"]},
    }
    compared = ("evict", "drain", "reachable")
    answer, missing, note = _room(decision, event.shortfall, ctx)
    return Rederived("PP4", recorded, answer, compared, missing=missing, note=note)


_DRAIN_ACTIONS = {"evicted": "evict", "gone": "evict", "busy": "busy"}


def _drain(decision: Mapping[str, Any]) -> str:
    """Re-decide PP5 from a recorded verdict: exact times when recorded, else the rounded wait."""
    if "started_at" in decision and "now" in decision:
        started, now = float(decision["started_at"]), float(decision["now"])
    else:
        started, now = 0.0, float(decision["waited"])
    bound = decision["drain_wait"]
    verdict = drain_verdict(
        busy=bool(decision["busy"]),
        started_at=started,
        now=now,
        wait=None if bound is None else float(bound),
    )
    return verdict.action


def _pool_drain_ended(event: PoolDrainEnded, _stream: str, _ctx: Context) -> Rederived:
    if event.outcome == "abandoned":
        return _not(
            "PP18",
            {"outcome": event.outcome},
            "whether anyone still waited for the engine (the driver's observation)",
        )
    action = _DRAIN_ACTIONS.get(event.outcome)
    recorded = {"action": action, "outcome": event.outcome}
    if action is None:
        return _not("PP5", recorded, f"a re-deriver for the outcome {event.outcome!r}")
    if not event.decision:
        return _not("PP5", recorded, "the drain verdict's inputs (an older hostler left them out)")
    return Rederived("PP5", recorded, {"action": _drain(event.decision)}, ("action",))


def _router_bound(event: SessionBound, _stream: str, _ctx: Context) -> Rederived:
    recorded = {"key": event.key, "how": event.how}
    if event.how not in ("balanced", "first"):
        return _not("ER2", recorded, "the session's prior binding (the caller's; not recorded)")
    parsed = parse_key(event.key)
    if parsed is None:
        raise ValueError(f"{event.key!r} is not an engine key")
    running = [] if event.how == "first" else sorted(event.sessions)
    # pick_replica reads only each replica's key and draining flag (none drains: peek said so)
    choice = pick_replica([PoolEntry(k, 0, 0.0) for k in running], event.sessions)
    key = choice if choice is not None else make_key(parsed.engine, parsed.model, 0)
    answer = {"key": key, "how": "balanced" if choice else "first"}
    return Rederived("PP11", recorded, answer, ("key", "how"))


# -- the capacity ledger (CB5, CB7, CB8) --------------------------------------------------------


def _limits(*, enforced: bool, budget: int, ceiling: int) -> LedgerLimits:
    # shortfall and denial_reason read only these three; the fast budget and the spillover
    # flag are not recorded, and not read
    return LedgerLimits(enforced, budget, ceiling, False, ceiling)


def _admission(limits: LedgerLimits, others: int, wanted: int) -> dict[str, Any]:
    short = shortfall(limits, others, wanted, 0)
    granted = short <= 0
    reason = "" if granted else denial_reason(limits, others + wanted)
    return {"granted": granted, "shortfall": max(0, short), "reason": reason}


def _ledger_reserved(event: LedgerReserved, _stream: str, _ctx: Context) -> Rederived:
    limits = _limits(enforced=event.enforced, budget=event.budget, ceiling=event.ceiling)
    recorded = {"granted": True, "shortfall": 0, "reason": ""}
    answer = _admission(limits, event.committed_other, event.bytes)
    return Rederived("CB7", recorded, answer, ("granted", "shortfall", "reason"))


def _ledger_denied(event: LedgerDenied, _stream: str, _ctx: Context) -> Rederived:
    # a denial implies enforcement: an unenforced ledger grants everything (CB1)
    limits = _limits(enforced=True, budget=event.budget, ceiling=event.ceiling)
    recorded = {"granted": False, "shortfall": event.shortfall, "reason": event.reason}
    answer = _admission(limits, event.committed_other, event.bytes)
    return Rederived("CB7", recorded, answer, ("granted", "shortfall", "reason"))


# -- supervision (SP1, SP3, SP4, SP5) and stops -------------------------------------------------


def _stop_sp(rule: str, d: Mapping[str, Any]) -> str | None:
    now = float(d["now"])
    if rule == "SP3":
        policy = SupervisionPolicy(health_failures=int(d["health_failures"]))
        verdict = decide_health(policy, int(d["consecutive_failures"]) - 1, False, now)
        return None if verdict.stop is None else verdict.stop.reason
    last = float(d["last_used"])
    if rule == "SP4":
        idle = decide_idle(
            SupervisionPolicy(idle_timeout=float(d["idle_timeout"])),
            now=now,
            last_used=last,
            busy=False,
        )
        return None if idle is None else idle.reason
    pressure = decide_pressure(  # SP5: a stop was only asked for idle, under pressure (PM15)
        SupervisionPolicy(pressure_idle=float(d["pressure_idle"])),
        now=now,
        last_used=last,
        busy=False,
        under_pressure=True,
        pressure_detail=d.get("pressure"),
    )
    return None if pressure is None else pressure.reason


def _evicted(key: str, d: Mapping[str, Any], ctx: Context) -> Rederived:
    """PP4 and PP5 behind an eviction's stop: was ``key`` chosen, and did its drain end idle?"""
    recorded: dict[str, Any] = {"chosen": True, "drain": "evict"}
    answer, missing, note = _room(d, int(d["shortfall"]), ctx)
    if answer is None:
        return _not("PP4", recorded, missing)
    # the stop's "drain" holds the PP5 verdict (the plan's own drain key is overwritten)
    chosen = key in answer["evict"] or key == answer["drain"]
    verdict = d.get("drain")
    if not (isinstance(verdict, Mapping) and verdict):
        return _not("PP4", recorded, "the drain verdict's inputs")
    rederived = {"chosen": chosen, "drain": _drain(verdict)}
    return Rederived("PP4", recorded, rederived, ("chosen", "drain"), note=note)


def _stop_requested(event: EngineStopRequested, stream: str, ctx: Context) -> Rederived | None:
    d = event.decision
    if not d:
        return None  # a shutdown, an operator's stop: no policy decided it
    rule = str(d.get("rule", ""))
    if rule in OPERATOR_RULES:
        return None
    if rule in ("SP3", "SP4", "SP5"):
        recorded = {"stop": event.reason}
        return Rederived(rule, recorded, {"stop": _stop_sp(rule, d)}, ("stop",))
    if rule == "PP4":
        return _evicted(stream.removeprefix("engine/"), d, ctx)
    return _not(rule or "?", {"stop": event.reason}, f"a re-deriver for rule {rule or '(none)'}")


def _engine_failed(event: EngineFailed, _stream: str, _ctx: Context) -> Rederived | None:
    d = event.decision
    if not d:
        return None  # a bad binary, a plugin's fault: no policy decided it
    recorded = {"allowed": False, "retry_at": event.retry_at, "error": event.error}
    rule = str(d.get("rule", ""))
    if rule != "SP1":
        return _not(rule or "?", recorded, f"a re-deriver for rule {rule or '(none)'}")
    policy = SupervisionPolicy(
        restart_budget=int(d["restart_budget"]),
        restart_window=float(d["restart_window"]),
        lockout=float(d["lockout"]),
    )
    starts = [float(t) for t in d["recent_starts"]]
    verdict = decide_start(policy, starts, float(d["now"]))
    answer = {"allowed": verdict.allowed, "retry_at": verdict.retry_at, "error": verdict.error}
    return Rederived("SP1", recorded, answer, ("allowed", "retry_at", "error"))


# -- caches, queues, leases ---------------------------------------------------------------------


def _cache_evicted(event: CacheEvicted, _stream: str, _ctx: Context) -> Rederived | None:
    if event.reason != "watermark":
        return None  # CC5/CC6: an invalidation or a clear someone asked for
    d = event.decision
    entries = []
    for sid, size, last, priority in d["entries"]:
        if priority not in ("low", "normal") or type(size) is not int:
            raise ValueError(f"cache entry {sid!r}: priority or bytes malformed")
        entries.append(CacheEntry(str(sid), 0, size, float(last), priority))
    plan = plan_eviction(entries, int(d["budget"]))
    return Rederived("CC9", {"evicted": list(event.ids)}, {"evicted": list(plan.ids)}, ("evicted",))


def _queue_dispatched(event: QueueDispatched, stream: str, ctx: Context) -> Rederived:
    d = event.decision
    recorded = {"id": event.id, "rule": d.get("rule")}
    inputs = d.get("inputs")
    if not isinstance(inputs, Mapping):
        return _not("Q4", recorded, "the queue's settings (recorded since PM18: max_wait, ...)")
    q = ctx.queues.queue(stream) if ctx.queues is not None else None
    if q is None or (len(q.pending), len(q.running)) != (d["pending"], d["running"]):
        return _not("Q4", recorded, "the queue's history (this log lacks some of its events)")
    opted_out = set(inputs["opted_out"])
    pending = [
        dataclasses.replace(p, affinity=p.id not in opted_out)
        for p in sorted(q.pending.values(), key=lambda p: p.id)
    ]
    now = float(inputs["now"])
    window = float(inputs["window"])
    pick = pick_next(
        pending,
        running=list(q.running.values()),
        recent=prune_recent(q.recent, now, window=window, cap=RECENT_CAP),
        caps=LaneCaps(int(d["width"]), int(d["interactive_cap"]), int(d["background_cap"])),
        now=now,
        ambient_open=bool(d["ambient_open"]),
        affinity=bool(inputs["affinity"]),
        max_wait=float(inputs["max_wait"]),
        window=window,
    )
    answer = {"id": pick.id, "rule": pick.decision["rule"]}
    return Rederived("Q4", recorded, answer, ("id", "rule"))


def _lease_broken(event: LeaseBroken, _stream: str, _ctx: Context) -> Rederived:
    return _not(
        "GA4",
        {"broken": True},
        "the lease verdict's inputs (how long it was held, the ceiling: only a sentence is kept)",
    )


#: One re-deriver per decision kind (event type).
REDERIVERS: Mapping[str, Rederiver] = {
    "pool.room_planned": _pool_room_planned,
    "pool.drain_ended": _pool_drain_ended,
    "router.bound": _router_bound,
    "ledger.reserved": _ledger_reserved,
    "ledger.denied": _ledger_denied,
    "engine.stop_requested": _stop_requested,
    "engine.failed": _engine_failed,
    "cache.evicted": _cache_evicted,
    "queue.dispatched": _queue_dispatched,
    "lease.broken": _lease_broken,
}


def rederive(event: Event, stream: str, ctx: Context | None = None) -> Rederived | None:
    """PM10: re-derive one event's decision; None when it records none.

    A decision whose figures do not have the shapes the runtime writes is reported as not
    re-derivable (``missing`` says what is malformed), never raised.
    """
    fn = REDERIVERS.get(type(event).TYPE)
    if fn is None:
        return None
    try:
        return fn(event, stream, ctx or Context())
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        what = f"{type(exc).__name__}: {exc}"[:200]
        return _not("?", {"type": type(event).TYPE}, f"well-formed inputs ({what})")


# -- a whole log --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Finding:
    """One decision (or row) the check has something to say about.

    Attributes:
        seq: The row's position in the log.
        type: The event type.
        stream: The stream it was recorded on.
        status: ``differ``, ``not-rederivable`` or ``unreadable`` (agreeing decisions are only
            counted).
        rule: The rule that decided.
        recorded: The recorded answer (and figures).
        rederived: The current code's answer (None when there is none).
        fields: The answer's fields that differ.
        why: What is missing or why the row cannot be read; a note otherwise.
    """

    seq: int
    type: str
    stream: str
    status: Status
    rule: str = ""
    recorded: dict[str, Any] = field(default_factory=dict)
    rederived: dict[str, Any] | None = None
    fields: tuple[str, ...] = ()
    why: str = ""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return {
            "seq": self.seq,
            "type": self.type,
            "stream": self.stream,
            "status": self.status,
            "rule": self.rule,
            "recorded": self.recorded,
            "rederived": self.rederived,
            "fields": list(self.fields),
            "why": self.why,
        }


@dataclass
class VerifyReport:
    """What a check of a whole log found.

    Attributes:
        rederived: Decisions re-derived (agreeing or not).
        by_kind: Re-derived decisions per ``type/rule``.
        differences: Decisions whose answers differ, in log order.
        not_rederivable: Decisions that could not be re-derived, and why.
        unreadable: Damaged rows and events of unknown types.
    """

    rederived: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    differences: list[Finding] = field(default_factory=list)
    not_rederivable: list[Finding] = field(default_factory=list)
    unreadable: list[Finding] = field(default_factory=list)

    @property
    def differ(self) -> int:
        """How many re-derived decisions differ."""
        return len(self.differences)

    def summary(self) -> str:
        """PM16: ``N decisions re-derived, D differ (by kind: ...)`` and what was left out."""
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.by_kind.items())) or "none"
        line = f"{self.rederived} decisions re-derived, {self.differ} differ (by kind: {kinds})"
        if self.not_rederivable:
            line += f"; {len(self.not_rederivable)} not re-derivable"
        if self.unreadable:
            line += f"; {len(self.unreadable)} rows unreadable"
        return line

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return {
            "rederived": self.rederived,
            "differ": self.differ,
            "by_kind": dict(sorted(self.by_kind.items())),
            "differences": [f.as_dict() for f in self.differences],
            "not_rederivable": [f.as_dict() for f in self.not_rederivable],
            "unreadable": [f.as_dict() for f in self.unreadable],
            "summary": self.summary(),
        }


def _check(report: VerifyReport, seq: int, type_name: str, stream: str, out: Rederived) -> None:
    if out.rederived is None:
        report.not_rederivable.append(
            Finding(
                seq, type_name, stream, "not-rederivable", out.rule, out.recorded, why=out.missing
            )
        )
        return
    report.rederived += 1
    report.by_kind[f"{type_name}/{out.rule}"] += 1
    fields = out.differs()
    if fields:
        report.differences.append(
            Finding(
                seq,
                type_name,
                stream,
                "differ",
                out.rule,
                out.recorded,
                out.rederived,
                fields,
                out.note,
            )
        )


def verify_records(records: Iterable[Any], ctx: Context | None = None) -> VerifyReport:
    """PM10: check every decision of ``records`` (``RecordedEvent``-shaped rows, in seq order).

    A row needs ``seq``, ``stream_id``, ``type``, ``event`` and (optionally) ``damage``.
    """
    report = VerifyReport()
    history = QueueHistory()
    context = dataclasses.replace(ctx or Context(), queues=history)
    for row in records:
        seq, stream, type_name = int(row.seq), str(row.stream_id), str(row.type)
        damage = getattr(row, "damage", "")
        event = row.event
        if damage or isinstance(event, UnknownEvent):
            why = damage or (event.reason if isinstance(event, UnknownEvent) else "")
            report.unreadable.append(Finding(seq, type_name, stream, "unreadable", why=why))
            continue
        out = rederive(event, stream, context)
        if out is not None:
            _check(report, seq, type_name, stream, out)
        history.observe(event, stream)
    return report
