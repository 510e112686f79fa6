"""Logs to draw: events appended to a real ``EventStore`` at moments a fake clock names.

``test_timeline.py`` and ``test_dashboard_routes.py`` build their logs with these: the same
helpers, and one busy log with every kind of mark (many evictions within a few seconds).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from hostler import EventStore
from hostler.events.base import Event
from hostler.events.daemon import DaemonStarted
from hostler.events.ledger import (
    LedgerBudgetSet,
    LedgerDenied,
    LedgerMeasured,
    LedgerReleased,
    LedgerReserved,
)
from hostler.events.pool import POOL_STREAM, PoolDrainEnded, PoolDrainStarted
from hostler.events.queue import QueueCancelled
from hostler.machines.engine import EngineCrashed, EngineStopRequested
from hostler.machines.lease import LeaseGranted, LeaseReleased, LeaseRequested

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
MIB = 2**20
GIB = 2**30


class Clock:
    """``recorded_at`` of the next append: T0 + ``now`` seconds."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> datetime:
        return T0 + timedelta(seconds=self.now)


def at(seconds: float) -> float:
    """T0 + ``seconds``, as seconds since the epoch."""
    return (T0 + timedelta(seconds=seconds)).timestamp()


def put(store: EventStore, clock: Clock, when: float, stream: str, event: Event) -> int:
    """Append ``event`` to ``stream`` at T0 + ``when``; its seq."""
    clock.now = when
    return store.append(stream, [event], expected_version=None).seqs[-1]


def reserved(key: str, size: int, budget: int = 100 * MIB) -> LedgerReserved:
    return LedgerReserved(key, size, "me", 0, 0, budget, budget, True)


def stop(reason: str, wanted: str | None = None) -> EngineStopRequested:
    decision = {"rule": "PP4", "for": wanted} if wanted else None
    return EngineStopRequested("running", "stopping", 0.0, reason, decision)


def crashed() -> EngineCrashed:
    return EngineCrashed("running", "backoff", 0.0, None, 9, True, 0.0)


def queue_timeout(engine: str, request: int, waited: float, now: float) -> QueueCancelled:
    """A request that found no slot within its queue timeout (a refusal)."""
    return QueueCancelled(engine, request, "interactive", "timeout", waited, now)


def started(now: float) -> DaemonStarted:
    """A daemon's start, this log holding its ledger's decisions."""
    return DaemonStarted(now, 4242, "t", [], [], [])


#: The engines of the busy log, and the bytes each holds.
BUSY_ENGINES = {
    "llamacpp:qwen2.5-coder-7b:0": 6 * GIB,
    "llamacpp:llama3.1-8b:0": 7 * GIB,
    "llamacpp:gemma2-9b:0": 8 * GIB,
    "llamacpp:mistral-nemo-12b:0": 9 * GIB,
    "llamacpp:phi3.5-mini:0": 3 * GIB,
    "llamacpp:deepseek-r1-14b:0": 10 * GIB,
}
#: The busy stretch: this many evictions, one every ``BUSY_EVERY`` seconds from ``BUSY_FROM``.
BUSY_EVICTIONS, BUSY_FROM, BUSY_EVERY = 14, 300.0, 0.3


@dataclass
class BusyLog:
    """What :func:`busy_log` wrote: seqs of each kind of mark, and each victim of an eviction."""

    seqs: dict[str, list[int]] = field(default_factory=dict)
    victims: list[str] = field(default_factory=list)
    end: float = 600.0

    def note(self, kind: str, seq: int) -> None:
        self.seqs.setdefault(kind, []).append(seq)


def busy_log(store: EventStore, clock: Clock) -> BusyLog:
    """Ten minutes of a daemon under a 24 GiB budget, with a busy stretch at 300 s.

    Six engines come and go; 14 evictions fall within 4 s (each a stop for room, the victim's
    release and the newcomer's reservation); a GPU lease unloads two engines; one crashes; a
    refusal of each kind (the ledger's, a busy victim's, a queue timeout).
    """
    log = BusyLog()
    budget = 24 * GIB
    held: dict[str, int] = {}
    names = list(BUSY_ENGINES)

    def load(when: float, key: str) -> None:
        held[key] = BUSY_ENGINES[key]
        put(store, clock, when, "ledger/host", reserved(key, held[key], budget))
        measured = LedgerMeasured(key, held[key] * 9 // 10, "me", held[key])
        put(store, clock, when + 0.05, "ledger/host", measured)

    def release(when: float, key: str) -> None:
        bytes_ = held.pop(key)
        put(store, clock, when, "ledger/host", LedgerReleased(key, bytes_, "me", "released"))

    put(store, clock, 0, "ledger/host", LedgerBudgetSet(budget))
    for i, key in enumerate(names[:3]):
        load(10 + 20 * i, key)
    log.note("crashed", put(store, clock, 120, f"engine/{names[1]}", crashed()))
    release(120.5, names[1])
    load(130, names[1])
    for i in range(BUSY_EVICTIONS):  # the busy stretch: each start evicts the oldest resident
        when = BUSY_FROM + BUSY_EVERY * i
        wanted = next(k for k in names[i % len(names) :] + names if k not in held)
        victim = next(iter(held))
        log.note("evicted", put(store, clock, when, f"engine/{victim}", stop("evicted", wanted)))
        log.victims.append(victim)
        release(when + 0.1, victim)
        load(when + 0.2, wanted)
    put(store, clock, 399, "lease/l1", LeaseRequested("new", "waiting", 0, "image", "comfy"))
    for i, key in enumerate(list(held)[:2]):
        swap = {"rule": "GA1", "cause": "gpu-slot-swap", "slot": "llm"}
        unload = EngineStopRequested("running", "stopping", 0.0, "evicted", swap)
        log.note("unloaded", put(store, clock, 400 + i * 0.2, f"engine/{key}", unload))
        release(400.5 + i * 0.2, key)
    log.note("granted", put(store, clock, 401, "lease/l1", LeaseGranted("waiting", "held", 0, 99)))
    put(store, clock, 460, "lease/l1", LeaseReleased("held", "released", 0, "released"))
    big = "llamacpp:llama3.1-70b:0"
    denied = LedgerDenied(big, 40 * GIB, "me", 30 * GIB, "budget exhausted", 0, budget, budget)
    log.note("refused", put(store, clock, 500, "ledger/host", denied))
    timeout = queue_timeout(names[0], 17, 30.0, at(520))
    log.note("refused", put(store, clock, 520, f"queue/{names[0]}", timeout))
    busy = next(iter(held))
    drain = PoolDrainStarted(at(540), busy, big, 5.0)
    put(store, clock, 540, POOL_STREAM, drain)
    ended = PoolDrainEnded(at(545), busy, "busy", 5.0, {"rule": "PP5", "waited": 5.0})
    log.note("refused", put(store, clock, 545, POOL_STREAM, ended))
    load(590, names[4])
    release(log.end, names[4])
    return log
