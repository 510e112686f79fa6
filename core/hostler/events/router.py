"""Events of the engine router (stream ``router/host``): which engine a session was bound to.

Defined beside the event base so that a log's reader registers them; the router
(:mod:`hostler.runtime.router`) re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass

from hostler.events.base import Event, event_type

__all__ = ["ROUTER_STREAM", "SessionBound"]

#: The stream of the router's bindings.
ROUTER_STREAM = "router/host"


@event_type("router.bound")
@dataclass(frozen=True, slots=True)
class SessionBound(Event):
    """A session was bound to an engine key, and why.

    Attributes:
        at: When (epoch seconds).
        session: The session id.
        key: The engine key it is bound to.
        how: ``kept`` (its engine was running), ``respawned`` (started again at the same
            replica), ``balanced`` (PP11: the replica with the fewest sessions), or ``first``
            (no replica was running: replica 0).
        sessions: The session count per replica the choice was made from.
    """

    at: float
    session: str
    key: str
    how: str
    sessions: dict[str, int]
