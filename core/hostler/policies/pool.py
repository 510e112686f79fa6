"""Pool policy (pure): which resident engines make room, how a drain ends, where a session goes.

The pool (a driver, to come) keeps one entry per resident engine: its bytes in the ledger, when
it served, the requests of the last minute, whether work runs or waits on it, whether it is
draining. When a new engine needs room it asks :func:`plan_make_room`; while a busy victim
drains it asks :func:`drain_step` (PP5's :func:`drain_verdict`, then PP18); to place a new
session it asks :func:`pick_replica`.
Every answer carries the policy's name and version and every input it used — the candidates
considered with their demand figures — so the log explains each eviction and a post-mortem
can re-derive it. Nothing here reads a clock: ``now`` is an observation.

Rules (docs/rules.md): PP3 demand, PP4 making room (victim order from
:func:`hostler.capacity.victims.choose_victims`), PP5 drain, PP11 replica choice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from hostler.capacity.victims import DEMAND_WINDOW, Resident, choose_victims
from hostler.policies.eviction import DEFAULT_EVICTION_POLICY, EvictionPolicy

__all__ = [
    "DRAIN_WAIT",
    "POLICY_NAME",
    "POLICY_VERSION",
    "DrainAction",
    "DrainStep",
    "DrainVerdict",
    "MakeRoom",
    "PoolEntry",
    "demand",
    "drain_step",
    "drain_verdict",
    "pick_replica",
    "plan_make_room",
    "touch",
]

POLICY_NAME = "pool"
POLICY_VERSION = 1

#: PP5: how long a busy victim may finish its work before the eviction gives up (seconds).
DRAIN_WAIT = 30.0


@dataclass(frozen=True, slots=True)
class PoolEntry:
    """One resident engine as the pool knows it.

    Attributes:
        key: Its engine key (``engine:model:replica``).
        bytes: What it holds in the ledger (measured when known, else the estimate).
        last_used_at: When it last served (epoch seconds).
        hits: When it was asked, the newest last, within the demand window (PP3).
        busy: Requests running or queued on it.
        draining: On its way out: it takes no new work (PP5).
    """

    key: str
    bytes: int
    last_used_at: float
    hits: tuple[float, ...] = ()
    busy: bool = False
    draining: bool = False


def touch(entry: PoolEntry, now: float) -> PoolEntry:
    """PP3: the entry asked for at ``now``: last used now, the hit kept, old hits dropped."""
    kept = tuple(t for t in entry.hits if now - t < DEMAND_WINDOW)
    return PoolEntry(
        entry.key, entry.bytes, now, (*kept, now), busy=entry.busy, draining=entry.draining
    )


def demand(entry: PoolEntry, now: float) -> int:
    """PP3: requests in the last :data:`DEMAND_WINDOW` seconds (one exactly that old is out)."""
    return sum(1 for t in entry.hits if 0 <= now - t < DEMAND_WINDOW)


@dataclass(frozen=True, slots=True)
class MakeRoom:
    """PP4's answer: evict these idle engines together, or drain one busy engine, or nothing.

    Attributes:
        evict: Idle engines to evict at once (the least wanted first).
        drain: A busy engine to drain and then evict, when the idle ones cannot cover it.
        covers: Whether ``evict`` alone frees the shortfall.
        reachable: Whether evicting every engine not already draining (idle and busy) could
            free the shortfall at all. When it could not, the caller evicts nothing: unloading
            models for a start that cannot fit anyway only costs their users a reload.
        decision: The policy, the shortfall and every candidate with its demand, age and bytes.
    """

    evict: tuple[str, ...]
    drain: str | None
    covers: bool
    reachable: bool
    decision: dict[str, Any]


def plan_make_room(
    entries: Sequence[PoolEntry],
    shortfall: int,
    now: float,
    policy: EvictionPolicy = DEFAULT_EVICTION_POLICY,
) -> MakeRoom:
    """PP4: what to evict so that ``shortfall`` more bytes fit (nothing when it is 0 or less).

    Idle engines go in ``policy``'s order (EV1). Draining entries are already leaving and
    count for nothing here. When the idle engines cannot cover the shortfall, the least
    recently used busy engine is named to drain (it is never killed mid-request: the drain
    either ends idle or the eviction fails, PP5). Each candidate's decision entry carries the
    ages of its recent requests (``hit_ages``), so a replay can recount its demand.
    """
    residents = [
        Resident(e.key, e.bytes, e.busy, e.draining, demand(e, now), e.last_used_at)
        for e in entries
    ]
    ages = {
        e.key: [round(now - t, 3) for t in e.hits if 0 <= now - t < DEMAND_WINDOW] for e in entries
    }
    plan = choose_victims(residents, shortfall, policy)
    drain = None if plan.covers else plan.busy_fallback
    reachable = sum(r.bytes for r in residents if not r.draining) >= shortfall
    decision: dict[str, Any] = {
        "policy": POLICY_NAME,
        "version": POLICY_VERSION,
        "rule": "PP4",
        "eviction": policy.name,
        "eviction_version": policy.version,
        "shortfall": max(shortfall, 0),
        "now": now,
        "candidates": [
            {
                "key": r.key,
                "bytes": r.bytes,
                "recent_hits": r.recent_hits,
                "hit_ages": ages.get(r.key, []),
                "idle_for": round(now - r.last_used_at, 3),
                "busy": r.busy,
                "draining": r.draining,
            }
            for r in sorted(residents, key=lambda r: r.key)
        ],
        "evict": list(plan.victims),
        "freed": plan.freed,
        "drain": drain,
        "reachable": reachable,
    }
    return MakeRoom(plan.victims, drain, plan.covers, reachable, decision)


@dataclass(frozen=True, slots=True)
class DrainVerdict:
    """PP5's answer while a victim drains: ``evict`` it now, ``wait`` more, or give up ``busy``."""

    action: Literal["evict", "wait", "busy"]
    decision: dict[str, Any]


def drain_bound(for_key: str | None, wait: float = DRAIN_WAIT) -> float | None:
    """PP5: how long a drain may wait for its victim's requests.

    A drain that makes room for a start (``for_key``) has no bound of its own: the requests
    that asked for that start keep their place until their own deadlines, and when the last
    of them leaves the drain ends (PP18), so a stream that outlasts ``wait`` is neither cut
    nor turned into a refusal of everyone behind it. An operator's drain (an unload, a
    reconcile: no ``for_key``) keeps ``wait``.
    """
    return None if for_key is not None else wait


def drain_verdict(
    *, busy: bool, started_at: float, now: float, wait: float | None = DRAIN_WAIT
) -> DrainVerdict:
    """PP5: a draining victim is evicted once idle; past ``wait`` seconds still busy, it stays.

    The deadline itself still waits (``now - started_at == wait`` is not yet past); a clock
    that went backwards counts as no time spent. A negative ``wait`` is taken as 0; None is
    no bound (:func:`drain_bound`).
    """
    waited = max(now - started_at, 0.0)
    limit = None if wait is None else max(wait, 0.0)
    if not busy:
        action: Literal["evict", "wait", "busy"] = "evict"
    elif limit is not None and waited > limit:
        action = "busy"
    else:
        action = "wait"
    decision = {
        "policy": POLICY_NAME,
        "version": POLICY_VERSION,
        "rule": "PP5",
        "busy": busy,
        "waited": round(waited, 3),
        "drain_wait": limit,
    }
    return DrainVerdict(action, decision)


#: What a drain does after one look: leave it (nobody wants the engine it made room for),
#: nothing (the victim is already gone), evict it, give up (still busy past the bound) or wait.
DrainAction = Literal["abandon", "gone", "evict", "busy", "wait"]
_DRAIN_OUTCOMES: dict[DrainAction, str] = {
    "abandon": "abandoned",
    "gone": "gone",
    "evict": "evicted",
    "busy": "busy",
    "wait": "wait",
}


@dataclass(frozen=True, slots=True)
class DrainStep:
    """One look at a draining victim: what to do, how long it has drained, and why (PM14)."""

    action: DrainAction
    waited: float
    decision: dict[str, Any]

    @property
    def outcome(self) -> str:
        """How the drain ended, as ``pool.drain_ended`` records it (``wait``: it goes on)."""
        return _DRAIN_OUTCOMES[self.action]


def drain_step(
    *,
    busy: bool,
    up: bool,
    wanted: bool,
    started_at: float,
    now: float,
    wait: float | None = DRAIN_WAIT,
) -> DrainStep:
    """PP5 and PP18, in the order a drain asks them, for one look at its victim.

    ``wanted``: someone still waits for the engine the drain makes room for (always true for
    an operator's unload, which makes room for nobody); ``up``: the victim still runs. Nobody
    waiting any more ends the drain first (PP18: the warm engine keeps serving, nothing is
    started for nobody); then PP5's verdict, an idle victim that already went being ``gone``.
    """
    verdict = drain_verdict(busy=busy, started_at=started_at, now=now, wait=wait)
    decision = {**verdict.decision, "started_at": started_at, "now": now}
    waited = float(verdict.decision["waited"])
    if not wanted:
        return DrainStep("abandon", waited, decision)
    if verdict.action == "evict" and not up:
        return DrainStep("gone", waited, decision)
    return DrainStep(verdict.action, waited, decision)


def pick_replica(replicas: Sequence[PoolEntry], sessions: Mapping[str, int]) -> str | None:
    """PP11: the non-draining replica with the fewest bound sessions (ties: the first given).

    None when every replica drains or there is none: the caller starts replica 0.
    """
    best: tuple[int, str] | None = None
    for entry in replicas:
        if entry.draining:
            continue
        count = max(sessions.get(entry.key) or 0, 0)
        if best is None or count < best[0]:
            best = (count, entry.key)
    return None if best is None else best[1]
