"""The figures a what-if compares: evictions, refusals, cold starts, queue waits (PM23).

:class:`Tally` counts them per engine key as a run goes (the simulator's, or a log's);
:func:`recorded_figures` reads them straight from a log's rows, so that what happened is
shown as the log says it, beside what the simulator makes of it. Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hostler.machines.engine import made_room
from hostler.postmortem.workload import LogRow, median, number

__all__ = ["Figures", "KeyFigures", "Tally", "Waits", "percentile", "recorded_figures", "waits_of"]


@dataclass(frozen=True, slots=True)
class Waits:
    """Waits (seconds) of the requests that got what they waited for: count, median, p95, max."""

    count: int
    median: float
    p95: float
    max: float


def percentile(ordered: list[float], fraction: float) -> float:
    """The nearest-rank percentile of sorted values (``fraction`` in 0..1); 0 when empty."""
    if not ordered:
        return 0.0
    rank = max(math.ceil(fraction * len(ordered)), 1)
    return float(ordered[rank - 1])


def waits_of(values: Iterable[float]) -> Waits:
    """PM23: count, median, p95 (nearest rank) and max of some waits."""
    ordered = sorted(values)
    if not ordered:
        return Waits(0, 0.0, 0.0, 0.0)
    return Waits(len(ordered), median(ordered), percentile(ordered, 0.95), float(ordered[-1]))


@dataclass(frozen=True, slots=True)
class KeyFigures:
    """One engine key's figures (or the total's).

    Attributes:
        requests: Requests that asked for it.
        evictions: Times it was evicted to make room for another.
        refusals: Starts of it refused (no room could be made, or a drain did not end).
        cold_starts: Starts of it that reached ready.
        waits: Its requests' queue waits: from joining its queue to getting a queue slot.
        served: Its clients' whole waits: from arriving to reaching the engine (the queue,
            the engine's start when it was down, a slot of the engine's gate, a restore).
        restores: Session turns whose prompt cache was restored from its file (CC13).
    """

    requests: int
    evictions: int
    refusals: int
    cold_starts: int
    waits: Waits
    served: Waits = Waits(0, 0.0, 0.0, 0.0)
    restores: int = 0

    def counts(self) -> tuple[int, int, int, int]:
        """(requests, evictions, refusals, cold starts)."""
        return (self.requests, self.evictions, self.refusals, self.cold_starts)


@dataclass(frozen=True, slots=True)
class Figures:
    """Figures per engine key and in total."""

    by_key: Mapping[str, KeyFigures]
    total: KeyFigures

    def as_dict(self) -> dict[str, Any]:
        """Plain data for ``--json``."""

        def waits(w: Waits) -> dict[str, Any]:
            return {"count": w.count, "median": w.median, "p95": w.p95, "max": w.max}

        def one(f: KeyFigures) -> dict[str, Any]:
            return {
                "requests": f.requests,
                "evictions": f.evictions,
                "refusals": f.refusals,
                "cold_starts": f.cold_starts,
                "waits": waits(f.waits),
                "served": waits(f.served),
                "restores": f.restores,
            }

        return {
            "total": one(self.total),
            "by_key": {key: one(f) for key, f in sorted(self.by_key.items())},
        }


@dataclass
class _Counts:
    requests: int = 0
    evictions: int = 0
    refusals: int = 0
    cold_starts: int = 0
    waits: list[float] = field(default_factory=list)
    served: list[float] = field(default_factory=list)
    restores: int = 0


class Tally:
    """Counts figures per engine key as a run goes."""

    def __init__(self, keys: Iterable[str] = ()) -> None:
        self._by: dict[str, _Counts] = {key: _Counts() for key in keys}

    def _of(self, key: str) -> _Counts:
        found = self._by.get(key)
        if found is None:
            found = self._by[key] = _Counts()
        return found

    def request(self, key: str) -> None:
        """A request asked for ``key``."""
        self._of(key).requests += 1

    def eviction(self, key: str) -> None:
        """``key`` was evicted."""
        self._of(key).evictions += 1

    def refusal(self, key: str) -> None:
        """A start of ``key`` was refused."""
        self._of(key).refusals += 1

    def cold_start(self, key: str) -> None:
        """``key`` became ready after a start."""
        self._of(key).cold_starts += 1

    def restore(self, key: str) -> None:
        """A session's turn on ``key`` was restored from its file."""
        self._of(key).restores += 1

    def wait(self, key: str, seconds: float) -> None:
        """A request for ``key`` got its slot after ``seconds`` queued."""
        self._of(key).waits.append(seconds)

    def served(self, key: str, seconds: float) -> None:
        """A request for ``key`` reached its engine ``seconds`` after it arrived."""
        self._of(key).served.append(seconds)

    def figures(self) -> Figures:
        """The figures so far."""
        by_key = {
            key: KeyFigures(
                c.requests,
                c.evictions,
                c.refusals,
                c.cold_starts,
                waits_of(c.waits),
                waits_of(c.served),
                c.restores,
            )
            for key, c in sorted(self._by.items())
        }
        counts = self._by.values()
        total = KeyFigures(
            sum(c.requests for c in counts),
            sum(c.evictions for c in counts),
            sum(c.refusals for c in counts),
            sum(c.cold_starts for c in counts),
            waits_of(w for c in counts for w in c.waits),
            waits_of(w for c in counts for w in c.served),
            sum(c.restores for c in counts),
        )
        return Figures(by_key, total)


def recorded_figures(rows: Iterable[LogRow]) -> Figures:
    """PM23: what happened, read straight from the log (no simulation).

    Requests: ``queue.enqueued``; evictions: ``engine.stop_requested`` that made room for
    another engine (:func:`hostler.machines.engine.made_room`: not a lease's or a person's
    unload, nor the stop of a victim that had crashed since the plan: its crash freed it);
    refusals: ``ledger.denied``, and drains that ended ``busy`` (counted for the
    engine the room was for); cold starts: ``engine.ready``; waits: ``queue.dispatched``;
    the clients' whole waits: ``queue.served``; restores: ``cache.restored`` without an error.
    Damaged rows and rows lacking a field are left out.
    """
    tally = Tally()
    drains: dict[str, str] = {}
    for row in rows:
        if not row.damage:
            _count_row(tally, drains, row)
    return tally.figures()


def _count_queue_row(tally: Tally, kind: str, engine: str, p: Mapping[str, Any]) -> None:
    waited = number(p, "waited")
    if kind == "queue.enqueued" and p.get("lane") in ("interactive", "background"):
        tally.request(engine)
    elif kind == "queue.dispatched" and waited is not None:
        tally.wait(engine, max(waited, 0.0))
    elif kind == "queue.served" and waited is not None:
        tally.served(engine, max(waited, 0.0))


def _count_row(tally: Tally, drains: dict[str, str], row: LogRow) -> None:
    p, kind = row.payload, row.type
    engine = p.get("engine")
    if kind.startswith("queue.") and isinstance(engine, str):
        _count_queue_row(tally, kind, engine, p)
    elif kind == "cache.restored" and isinstance(p.get("key"), str) and not p.get("error"):
        tally.restore(p["key"])
    elif kind == "ledger.denied" and isinstance(p.get("key"), str):
        tally.refusal(p["key"])
    elif kind == "pool.drain_started":
        if isinstance(p.get("key"), str) and isinstance(p.get("for_key"), str):
            drains[p["key"]] = p["for_key"]
    elif kind == "pool.drain_ended":
        for_key = drains.pop(str(p.get("key")), None)
        if for_key is not None and p.get("outcome") == "busy":
            tally.refusal(for_key)
    elif row.stream_id.startswith("engine/"):
        key = row.stream_id.removeprefix("engine/")
        if kind == "engine.ready":
            tally.cold_start(key)
        elif (
            kind == "engine.stop_requested"
            and made_room(p.get("reason"), p.get("decision"))
            and p.get("from_state") != "backoff"  # it had crashed: its stop freed nothing
        ):
            tally.eviction(key)
