"""The memory timeline of a log: reserved and measured bytes per engine, the budget, markers.

Pure: records in, a :class:`Timeline` out (no I/O, no clock). :mod:`hostler.postmortem.draw`
turns one into a picture; ``hostler timeline`` and the dashboard read the log and call both.

What each series is made of (PM30 in docs/rules.md):

- *reserved*, per engine key: the bytes its reservation was admitted with, and *measured* the
  footprint measured once the engine was ready: both as the host ledger's own state holds
  them (:class:`~hostler.capacity.ledger.LedgerState`, folded as the daemon folds it) after
  each ledger event; zero while the key holds nothing.
- *budget*: ``ledger.budget_set`` (an explicit figure), and the budget every
  ``ledger.reserved``, ``ledger.denied`` and ``ledger.adopted`` decision was taken against
  (so an automatic budget appears as it was used).

A daemon keeps its memory decisions (``ledger.*``) in the host's ledger, a log of its own
(``ledger`` in the daemon's config, else ``$HOSTLER_LEDGER`` or the per-user one): give its
records as ``ledger`` and they are merged with the daemon's log by time. A marker's ``seq`` is
of the log it came from.

Markers (PM31): an ``engine.stop_requested`` that made room for another engine
(:func:`hostler.machines.engine.made_room`, rule PP4: ``evicted``), any other stop recorded with
reason ``evicted`` — a lease's slot swap (GA1), a person's unload (PP6), a retire (PP9), a
reconcile (PP10) — (``unloaded``), a refusal (``refused``: the ledger's ``ledger.denied``, a
start refused because the engine it drained for room stayed busy — ``pool.drain_ended`` with
outcome ``busy`` — and a request that found no slot within its queue timeout —
``queue.cancelled`` with why ``timeout``), ``engine.crashed`` (``crashed``) and ``engine.lost``
(``lost``); a lease is a span from ``lease.granted`` to ``lease.released`` or ``lease.broken``
(still open at the end of the log: it runs to the end).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from hostler.capacity.ledger import LedgerState
from hostler.events.base import UnknownEvent
from hostler.events.ledger import (
    LEDGER_STREAM,
    LedgerAdopted,
    LedgerBudgetSet,
    LedgerDenied,
    LedgerReserved,
)
from hostler.events.pool import PoolDrainEnded, PoolDrainStarted
from hostler.events.queue import QueueCancelled
from hostler.machines.engine import (
    EngineCrashed,
    EngineLost,
    EngineStopRequested,
    StopReason,
)
from hostler.machines.lease import LeaseBroken, LeaseGranted, LeaseReleased, LeaseRequested
from hostler.store.log import RecordedEvent

__all__ = [
    "MARKER_KINDS",
    "MAX_ENGINES_DRAWN",
    "OTHERS",
    "Marker",
    "Span",
    "Step",
    "Timeline",
    "build_timeline",
    "peaks_in",
    "value_at",
    "values_at",
]

#: At most this many engine series are drawn; past it the engines that held least are summed
#: into one series, ``OTHERS`` (PM35).
MAX_ENGINES_DRAWN = 24
#: The key of that series (no engine key lacks a colon).
OTHERS = "others"

#: Every kind of marker, in the order a legend lists them.
MARKER_KINDS = ("evicted", "unloaded", "refused", "crashed", "lost")


@dataclass(frozen=True, slots=True)
class Step:
    """From ``at`` (seconds since the epoch, UTC) on, the series is ``value`` bytes."""

    at: float
    seq: int
    value: int


@dataclass(frozen=True, slots=True)
class Marker:
    """One decision worth a mark: its ``seq``, time, ``kind`` (see MARKER_KINDS), engine, label."""

    seq: int
    at: float
    kind: str
    engine: str | None
    label: str


@dataclass(frozen=True, slots=True)
class Span:
    """A lease held from ``start`` to ``end`` (the end of the timeline when still held)."""

    lease: str
    seq: int
    start: float
    end: float
    label: str
    open: bool


@dataclass(frozen=True, slots=True)
class Timeline:
    """What ``hostler timeline`` draws.

    Attributes:
        start: The first moment shown (seconds since the epoch); ``end`` the last.
        engines: Engine keys, in the order they first reserved (the stacking order).
        reserved: Engine key → its reserved-bytes steps (the first at or after ``start``).
        measured: Engine key → its measured-bytes steps.
        budget: The budget's steps (empty when the log never named one).
        markers: Evictions, refusals, crashes, losses, by seq.
        spans: Lease holds, by seq of their grant.
        damaged: ``(seq, why)`` of each row that could not be used.
        events: How many records were read.
    """

    start: float
    end: float
    engines: tuple[str, ...]
    reserved: dict[str, tuple[Step, ...]]
    measured: dict[str, tuple[Step, ...]]
    budget: tuple[Step, ...]
    markers: tuple[Marker, ...]
    spans: tuple[Span, ...]
    damaged: tuple[tuple[int, str], ...] = ()
    events: int = 0

    def peak(self) -> int:
        """The most the engines held together (each its larger figure), in bytes."""
        moments = self.moments()
        totals = [0] * len(moments)
        for key in self.engines:
            reserved = values_at(self.reserved[key], moments)
            measured = values_at(self.measured.get(key, ()), moments)
            totals = [t + max(r, m) for t, r, m in zip(totals, reserved, measured, strict=True)]
        return max(totals, default=0)

    def moments(self) -> list[float]:
        """Every moment a series steps, with ``start`` and ``end``, in order."""
        steps = (s.at for k in self.engines for s in (*self.reserved[k], *self.measured[k]))
        return sorted({self.start, self.end, *steps})


def value_at(steps: tuple[Step, ...], moment: float) -> int:
    """The value of a step series at ``moment`` (0 before its first step)."""
    return values_at(steps, [moment])[0]


def peaks_in(steps: tuple[Step, ...], edges: list[float]) -> list[int]:
    """The most the series held within each span ``[edges[i], edges[i + 1])`` (edges sorted).

    What a picture too narrow for every step shows: each column its peak, so that no spike
    is lost to the sampling (PM33). One value per span (``len(edges) - 1`` of them).
    """
    peaks: list[int] = []
    value, index = 0, 0
    while index < len(steps) and edges and steps[index].at <= edges[0]:
        value = steps[index].value
        index += 1
    for end in edges[1:]:
        most = value
        while index < len(steps) and steps[index].at < end:
            value = steps[index].value
            most = max(most, value)
            index += 1
        peaks.append(most)
    return peaks


def values_at(steps: tuple[Step, ...], moments: list[float]) -> list[int]:
    """The value of a step series at each of ``moments`` (sorted), in one sweep."""
    values, value, index = [], 0, 0
    for moment in moments:
        while index < len(steps) and steps[index].at <= moment:
            value = steps[index].value
            index += 1
        values.append(value)
    return values


@dataclass
class _Fold:
    """The mutable state of one pass over the records."""

    since: float | None
    until: float | None
    least: float = 0.0
    engines: list[str] = field(default_factory=list)
    reserved: dict[str, list[Step]] = field(default_factory=dict)
    measured: dict[str, list[Step]] = field(default_factory=dict)
    budget: list[Step] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    leases: dict[str, str] = field(default_factory=dict)
    granted: dict[str, tuple[int, float]] = field(default_factory=dict)
    draining: dict[str, str | None] = field(default_factory=dict)  # victim -> the start it is for
    spans: list[Span] = field(default_factory=list)
    damaged: list[tuple[int, str]] = field(default_factory=list)
    first: float | None = None
    last: float | None = None
    ledger: LedgerState = field(default_factory=LedgerState)

    def sample(self, key: str, at: float, seq: int) -> None:
        """Step ``key``'s series to what the ledger's state now holds for it."""
        if key not in self.engines:
            self.engines.append(key)
        held = self.ledger.by_key().get(key)
        reserved = 0 if held is None else held.reserved
        measured = 0 if held is None or held.measured is None else held.measured
        for series, value in ((self.reserved, reserved), (self.measured, measured)):
            steps = series.setdefault(key, [])
            if (steps[-1].value if steps else 0) != value:
                _put(steps, Step(at, seq, value))


def _put(steps: list[Step], step: Step) -> None:
    """Append ``step``; one at the same moment as the last replaces it; no repeat of a value."""
    if steps and steps[-1].at == step.at:
        steps.pop()
    if steps and steps[-1].value == step.value:
        return
    steps.append(step)


def _engine_of(stream: str) -> str:
    return stream.removeprefix("engine/")


def _eviction_label(decision: dict[str, Any] | None) -> str:
    wanted = decision.get("for") if isinstance(decision, dict) else None
    return f"evicted for {wanted}" if isinstance(wanted, str) else "evicted"


def _unload_label(decision: dict[str, Any] | None) -> str:
    if not isinstance(decision, dict) or not isinstance(decision.get("rule"), str):
        return "unloaded"
    rule, slot = decision["rule"], decision.get("slot")
    if rule == "GA1" and isinstance(slot, str):
        return f"unloaded (GA1): slot {slot} gave the card"
    return f"unloaded ({rule})"


def _refusal(fold: _Fold, event: object) -> tuple[str, str] | None:
    """The engine a refusal not the ledger's turned away, and its label (None: no refusal)."""
    if isinstance(event, QueueCancelled) and event.why == "timeout":
        return event.engine, f"refused request {event.id}: no slot within its queue timeout"
    if isinstance(event, PoolDrainEnded):
        wanted = fold.draining.pop(event.key, None)
        if event.outcome == "busy":  # PP5: it stays, and the start that needed its room fails
            start = "a start" if wanted is None else wanted
            return wanted or event.key, f"refused {start}: {event.key} still busy after its drain"
    return None


def _fold_one(fold: _Fold, record: RecordedEvent, at: float) -> None:  # noqa: PLR0912
    event, seq = record.event, record.seq
    if record.stream_id == LEDGER_STREAM and not isinstance(event, UnknownEvent):
        fold.ledger.apply(event)
        key = getattr(event, "key", None)
        if isinstance(key, str) and not isinstance(event, LedgerDenied):  # a denial holds nothing
            fold.sample(key, at, seq)
    if isinstance(event, LedgerReserved | LedgerAdopted):
        _put(fold.budget, Step(at, seq, event.budget))
    elif isinstance(event, LedgerBudgetSet):
        if event.budget is not None:
            _put(fold.budget, Step(at, seq, event.budget))
    elif isinstance(event, LedgerDenied):
        _put(fold.budget, Step(at, seq, event.budget))
        short = f"refused {event.key}: {event.shortfall / 2**20:.1f} MiB short"
        fold.markers.append(Marker(seq, at, "refused", event.key, short))
    elif isinstance(event, EngineStopRequested):
        engine = _engine_of(record.stream_id)
        if event.made_room:
            label = _eviction_label(event.decision)
            fold.markers.append(Marker(seq, at, "evicted", engine, label))
        elif event.reason == StopReason.EVICTED:
            label = _unload_label(event.decision)
            fold.markers.append(Marker(seq, at, "unloaded", engine, label))
    elif isinstance(event, EngineCrashed):
        how = f"signal {event.signal}" if event.signal is not None else f"exit {event.exit_code}"
        fold.markers.append(
            Marker(seq, at, "crashed", _engine_of(record.stream_id), f"crashed ({how})")
        )
    elif isinstance(event, EngineLost):
        fold.markers.append(
            Marker(seq, at, "lost", _engine_of(record.stream_id), f"lost ({event.cause})")
        )
    elif isinstance(event, PoolDrainStarted):
        fold.draining[event.key] = event.for_key
    elif (refused := _refusal(fold, event)) is not None:
        fold.markers.append(Marker(seq, at, "refused", *refused))
    elif isinstance(event, LeaseRequested):
        fold.leases[record.stream_id] = f"{event.slot}: {event.holder}"
    elif isinstance(event, LeaseGranted):
        fold.granted[record.stream_id] = (seq, at)
    elif isinstance(event, LeaseReleased | LeaseBroken):
        held = fold.granted.pop(record.stream_id, None)
        if held is not None:
            label = fold.leases.get(record.stream_id, "lease")
            fold.spans.append(Span(record.stream_id, held[0], held[1], at, label, open=False))


def build_timeline(
    records: Iterable[RecordedEvent],
    *,
    ledger: Iterable[RecordedEvent] = (),
    since: float | None = None,
    until: float | None = None,
    least: float = 0.0,
) -> Timeline:
    """Fold ``records`` (in seq order) into a :class:`Timeline`.

    ``ledger``: the records of the host ledger's own log, when it is not ``records``' log;
    merged in by the time each was recorded.

    ``since``/``until`` (seconds since the epoch) bound what is shown (from the later of
    ``since`` and the first event); what the series held at ``since`` is carried in as their
    first step there. ``least``: the narrowest window shown (seconds); a shorter one starts
    ``least`` before its end instead, before its first event (the live picture of a young
    daemon, PM37). A damaged row, or one whose time
    cannot be read, is listed in ``damaged`` and skipped; events of other types are ignored.
    """
    fold = _Fold(since, until, least)
    count = 0
    for record in heapq.merge(records, ledger, key=lambda r: r.recorded_at):
        count += 1
        if record.damage:
            fold.damaged.append((record.seq, record.damage))
            continue
        at = record.recorded_at.timestamp()
        if until is not None and at > until:
            continue  # not `break`: a clock stepped back may have written later rows earlier
        fold.first = at if fold.first is None else min(fold.first, at)  # a clock stepped back
        fold.last = at if fold.last is None else max(fold.last, at)
        try:
            _fold_one(fold, record, at)
        except (AttributeError, TypeError, ValueError) as exc:  # a payload of the wrong shape
            fold.damaged.append((record.seq, f"{record.type}: {exc}"[:200]))
    return _finish(fold, count)


def _finish(fold: _Fold, count: int) -> Timeline:
    # from the later of ``since`` and the first event: a window reaching back before the log
    # began would squeeze the whole log against its right edge
    start = fold.since if fold.since is not None else (fold.first or 0.0)
    if fold.first is not None and fold.first > start:
        start = fold.first
    end = fold.until if fold.until is not None else (fold.last or start)
    end = max(end, start)
    start = min(start, end - fold.least)  # PM37: never narrower than ``least``
    spans = [*fold.spans]
    for stream, (seq, at) in fold.granted.items():
        spans.append(Span(stream, seq, at, end, fold.leases.get(stream, "lease"), open=True))
    shown = [
        Span(s.lease, s.seq, max(s.start, start), min(s.end, end), s.label, s.open)
        for s in sorted(spans, key=lambda s: s.seq)
        if s.end >= start and s.start <= end
    ]
    reserved = {k: _clip(fold.reserved.get(k, []), start) for k in fold.engines}
    measured = {k: _clip(fold.measured.get(k, []), start) for k in fold.engines}
    engines = _fold_the_rest(list(fold.engines), reserved, measured)
    return Timeline(
        start=start,
        end=end,
        engines=engines,
        reserved=reserved,
        measured=measured,
        budget=_clip(fold.budget, start),
        markers=tuple(m for m in fold.markers if m.at >= start),
        spans=tuple(shown),
        damaged=tuple(fold.damaged),
        events=count,
    )


def _fold_the_rest(
    engines: list[str],
    reserved: dict[str, tuple[Step, ...]],
    measured: dict[str, tuple[Step, ...]],
) -> tuple[str, ...]:
    """PM35: past :data:`MAX_ENGINES_DRAWN`, the engines that held least become one series.

    The ``MAX_ENGINES_DRAWN - 1`` engines with the largest peak keep their own series (in
    their first-reserved order); the rest are summed into :data:`OTHERS` (``reserved`` and
    ``measured`` are changed in place). The picture's size then grows with time, not with
    the number of engines a log ever saw.
    """
    if len(engines) <= MAX_ENGINES_DRAWN:
        return tuple(engines)

    def peak(key: str) -> int:
        return max((s.value for s in (*reserved[key], *measured[key])), default=0)

    kept = set(sorted(engines, key=lambda k: (-peak(k), engines.index(k)))[: MAX_ENGINES_DRAWN - 1])
    rest = [k for k in engines if k not in kept]
    reserved[OTHERS] = _summed([reserved.pop(k) for k in rest])
    measured[OTHERS] = _summed([measured.pop(k) for k in rest])
    return (*(k for k in engines if k in kept), OTHERS)


def _summed(series: list[tuple[Step, ...]]) -> tuple[Step, ...]:
    """The sum of step series, as one step series (a sweep over their changes)."""
    changes: dict[float, list[int]] = {}
    for steps in series:
        previous = 0
        for step in steps:
            change = changes.setdefault(step.at, [0, step.seq])
            change[0] += step.value - previous
            change[1] = max(change[1], step.seq)
            previous = step.value
    total, out = 0, list[Step]()
    for at in sorted(changes):
        delta, seq = changes[at]
        total += delta
        if not out or out[-1].value != total:
            out.append(Step(at, seq, total))
    return tuple(out)


def _clip(steps: list[Step], start: float) -> tuple[Step, ...]:
    """The steps at or after ``start``, led by the value held at ``start`` (when not zero)."""
    before = [s for s in steps if s.at < start]
    after = [s for s in steps if s.at >= start]
    if before and before[-1].value and not (after and after[0].at == start):
        return (Step(start, before[-1].seq, before[-1].value), *after)
    return tuple(after)
