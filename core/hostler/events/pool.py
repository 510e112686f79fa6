"""Events of the engine pool (stream ``pool/host``): making room, draining, keeping pins up.

Each carries the pure policy's decision with every input it used (the candidates considered,
their bytes, demand and age), so ``hostler explain`` can say why an engine was chosen to go and
a post-mortem can re-derive the choice. The stop of each victim is recorded on its own engine
stream too (``engine.stop_requested`` with reason ``evicted`` and the same decision).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hostler.events.base import Event, event_type, upcaster

__all__ = ["POOL_STREAM", "PoolDrainEnded", "PoolDrainStarted", "PoolRoomPlanned"]

#: The stream of the pool's decisions about this daemon's resident engines.
POOL_STREAM = "pool/host"


@event_type("pool.room_planned")
@dataclass(frozen=True, slots=True)
class PoolRoomPlanned(Event):
    """PP4: ``for_key`` needs ``wanted`` bytes; what the pool decided to free for it.

    Attributes:
        at: When it was decided (epoch seconds).
        for_key: The engine that needs the room.
        wanted: Its footprint (bytes).
        shortfall: The bytes the ledger lacked at that moment (CB5).
        evict: Idle engines evicted together, least wanted first.
        drain: A busy engine drained first (PP5), or None.
        reachable: Whether evicting everything evictable could free the shortfall at all; when
            not, nothing is evicted and the start is refused.
        decision: The policy, its version and every candidate with its figures.
    """

    at: float
    for_key: str
    wanted: int
    shortfall: int
    evict: list[str]
    drain: str | None
    reachable: bool
    decision: dict[str, Any]


@event_type("pool.drain_started", schema_version=2)
@dataclass(frozen=True, slots=True)
class PoolDrainStarted(Event):
    """PP5: ``key`` takes no new work from now; it is evicted once idle, or stays after ``wait``.

    ``wait`` None (version 2): no bound but the wish of those who asked for ``for_key``.
    """

    at: float
    key: str
    for_key: str | None
    wait: float | None


@upcaster("pool.drain_started", from_version=1)
def _drain_started_v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    return payload  # every version 1 drain had its bound: the payload reads the same


@event_type("pool.drain_ended")
@dataclass(frozen=True, slots=True)
class PoolDrainEnded(Event):
    """PP5: how a drain ended: ``evicted``, ``busy`` (it stays), ``gone``, or ``abandoned``.

    ``abandoned`` (PP18): nobody waits any more for the engine it made room for; it stays.
    """

    at: float
    key: str
    outcome: str
    waited: float
    decision: dict[str, Any]
