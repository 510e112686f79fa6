"""hostler: keeps local inference engines resident within a machine's memory, and says why.

The public API is what this module exports (pinned by ``tests/test_public_api.py``):
the event log (:class:`EventStore`), the event base and registry, the lifecycle machines,
replay, and the error hierarchy rooted at :class:`HostlerError`.
"""

from __future__ import annotations

from hostler._version import __version__
from hostler.errors import (
    ConcurrencyError,
    HostlerError,
    IllegalTransitionError,
    StoreCorruptError,
    StoreError,
    StoreLockedError,
    StorePathError,
    StoreSchemaError,
    UsageError,
)
from hostler.events import Event, UnknownEvent, event_type, registered_types, upcaster
from hostler.machines import (
    Engine,
    EngineState,
    Lease,
    LeaseSlot,
    LeaseState,
    LifecycleModel,
    Reservation,
    ReservationState,
    StopReason,
    TransitionEvent,
)
from hostler.replay import World, commit, load, replay
from hostler.store import AppendResult, EventStore, RecordedEvent

__all__ = [
    "AppendResult",
    "ConcurrencyError",
    "Engine",
    "EngineState",
    "Event",
    "EventStore",
    "HostlerError",
    "IllegalTransitionError",
    "Lease",
    "LeaseSlot",
    "LeaseState",
    "LifecycleModel",
    "RecordedEvent",
    "Reservation",
    "ReservationState",
    "StopReason",
    "StoreCorruptError",
    "StoreError",
    "StoreLockedError",
    "StorePathError",
    "StoreSchemaError",
    "TransitionEvent",
    "UnknownEvent",
    "UsageError",
    "World",
    "__version__",
    "commit",
    "event_type",
    "load",
    "registered_types",
    "replay",
    "upcaster",
]
