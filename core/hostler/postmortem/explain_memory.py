"""What ``hostler explain``'s walk remembers from earlier records for later sentences."""

from __future__ import annotations

from dataclasses import dataclass, field

from hostler.events.base import Event
from hostler.machines.engine import EngineStartRequested
from hostler.store.log import RecordedEvent

__all__ = ["LEASE_NEAR", "WalkMemory"]

#: A PP6 unload recorded this many seconds after a lease was granted is cited with that lease.
LEASE_NEAR = 5.0


@dataclass
class WalkMemory:
    """Engine states, start times, GPU leases, the target's open requests and bound engines.

    Attributes:
        states: Each engine's last state, by key.
        start_at: When each engine's last start was asked (its event time), by key.
        leases: Each GPU lease's (slot, holder), by lease id.
        last_grant: The last lease grant's record and lease id.
        open_requests: The target's queued requests not yet released or cancelled.
        bound: The engines a target session was bound to or queued on.
    """

    states: dict[str, str] = field(default_factory=dict)
    start_at: dict[str, float] = field(default_factory=dict)
    leases: dict[str, tuple[str, str]] = field(default_factory=dict)
    last_grant: tuple[RecordedEvent, str] | None = None
    open_requests: set[tuple[str, int]] = field(default_factory=set)
    bound: set[str] = field(default_factory=set)

    def track_engine(self, key: str, event: Event) -> None:
        """Remember engine ``key``'s state and when its start was asked."""
        to_state = getattr(event, "to_state", None)
        if isinstance(to_state, str):
            self.states[key] = to_state
        if isinstance(event, EngineStartRequested):
            self.start_at[key] = event.at

    def lease_near(self, record: RecordedEvent) -> tuple[RecordedEvent, str] | None:
        """The last GPU lease grant, when ``record`` came at most :data:`LEASE_NEAR` s after it."""
        if self.last_grant is None:
            return None
        grant, lease = self.last_grant
        gap = (record.recorded_at - grant.recorded_at).total_seconds()
        return (grant, lease) if 0 <= gap <= LEASE_NEAR else None
