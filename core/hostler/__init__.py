"""hostler: keeps local inference engines resident within a machine's memory, and says why.

The public API is what this module exports (pinned by ``tests/test_public_api.py``):
the event log (:class:`EventStore`), the event base and registry, the lifecycle machines,
replay, and the error hierarchy rooted at :class:`HostlerError`.
"""

from __future__ import annotations

from hostler._version import __version__
from hostler.errors import (
    CapacityDeniedError,
    ConcurrencyError,
    EngineBinaryError,
    EngineStartError,
    HostlerError,
    IllegalTransitionError,
    ModelFileError,
    RestartBudgetError,
    StoreCorruptError,
    StoreError,
    StoreLockedError,
    StorePathError,
    StoreSchemaError,
    UnknownEngineError,
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
    "CapacityDeniedError",
    "ConcurrencyError",
    "Engine",
    "EngineBinaryError",
    "EngineStartError",
    "EngineState",
    "Event",
    "EventStore",
    "HostlerError",
    "IllegalTransitionError",
    "Lease",
    "LeaseSlot",
    "LeaseState",
    "LifecycleModel",
    "ModelFileError",
    "RecordedEvent",
    "Reservation",
    "ReservationState",
    "RestartBudgetError",
    "StopReason",
    "StoreCorruptError",
    "StoreError",
    "StoreLockedError",
    "StorePathError",
    "StoreSchemaError",
    "TransitionEvent",
    "UnknownEngineError",
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
