"""Which idle engines to evict to make room (pure): rule PP4's victim batching.

Idle engines go first, the least wanted first: fewest requests in the last minute, then the
longest unused. The batch is the shortest prefix of that order whose bytes cover the ledger's
one combined shortfall (budget and co-residency at once, IN18). Busy engines are never chosen
here; when idle ones cannot cover the shortfall the caller drains a busy one or denies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hostler.policies.eviction import DEFAULT_EVICTION_POLICY, EvictionPolicy

__all__ = ["DEMAND_WINDOW", "Resident", "VictimPlan", "choose_victims"]

#: Requests older than this no longer count as demand (seconds).
DEMAND_WINDOW = 60.0


@dataclass(frozen=True, slots=True)
class Resident:
    """One resident engine as the eviction policy sees it.

    Attributes:
        key: Its engine key.
        bytes: What it holds in the ledger.
        busy: Requests running or queued.
        draining: Already on its way out.
        recent_hits: Requests in the last :data:`DEMAND_WINDOW` seconds.
        last_used_at: When it last served (epoch seconds).
    """

    key: str
    bytes: int
    busy: bool
    draining: bool
    recent_hits: int
    last_used_at: float


@dataclass(frozen=True, slots=True)
class VictimPlan:
    """The engines to evict, whether they cover the shortfall, and the busy fallback."""

    victims: tuple[str, ...]
    freed: int
    covers: bool
    busy_fallback: str | None


def choose_victims(
    residents: Sequence[Resident], shortfall: int, policy: EvictionPolicy | None = None
) -> VictimPlan:
    """Pick the idle batch that frees ``shortfall`` bytes (nothing when it is 0).

    Idle engines are taken in ``policy``'s order (default: demand-weighted LRU, EV1).
    """
    if shortfall <= 0:
        return VictimPlan((), 0, True, None)
    order = (policy or DEFAULT_EVICTION_POLICY).rank
    idle = sorted((r for r in residents if not r.busy and not r.draining), key=order)
    chosen: list[str] = []
    freed = 0
    for resident in idle:
        if freed >= shortfall:
            break
        chosen.append(resident.key)
        freed += resident.bytes
    covers = freed >= shortfall
    fallback = None
    if not covers:
        busy = [r for r in residents if r.busy and not r.draining]
        if busy:
            fallback = min(busy, key=lambda r: (r.last_used_at, r.key)).key
    return VictimPlan(tuple(chosen), freed, covers, fallback)
