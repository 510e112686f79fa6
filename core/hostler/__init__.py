"""hostler: keeps local inference engines resident within a machine's memory, and says why.

The public API is what this module exports (pinned by ``tests/test_public_api.py``):
the event log (:class:`EventStore`), the event base and registry, the lifecycle machines,
replay, and the error hierarchy rooted at :class:`HostlerError`.

Importing ``hostler`` (or any pure module under it) loads no I/O library: the event log
(SQLAlchemy, sqlite3) loads on first use of its names (``hostler.EventStore``...), so the pure
core can be imported, tested and reused on its own.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hostler._version import __version__
from hostler.errors import (
    CapacityDeniedError,
    ConcurrencyError,
    EngineBinaryError,
    EngineBusyError,
    EngineStartError,
    HostlerError,
    IllegalTransitionError,
    ModelFileError,
    RestartBudgetError,
    RuntimeClosedError,
    StoreBusyError,
    StoreCorruptError,
    StoreDamagedRowError,
    StoreDriverError,
    StoreError,
    StoreForeignError,
    StoreFullError,
    StoreLockedError,
    StorePathError,
    StoreSchemaError,
    StoreUrlError,
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

if TYPE_CHECKING:
    from hostler.embed import open_daemon, run_daemon
    from hostler.runtime.facade import Runtime
    from hostler.store import AppendResult, EventStore, RecordedEvent

#: Public names that live in driver modules, imported on first use.
_LAZY = {
    "AppendResult": "hostler.store",
    "EventStore": "hostler.store",
    "RecordedEvent": "hostler.store",
    "Runtime": "hostler.runtime.facade",
    "open_daemon": "hostler.embed",
    "run_daemon": "hostler.embed",
}


def __getattr__(name: str) -> Any:
    """Import the event log and replay only when one of their names is used."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hostler' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "AppendResult",
    "CapacityDeniedError",
    "ConcurrencyError",
    "Engine",
    "EngineBinaryError",
    "EngineBusyError",
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
    "Runtime",
    "RuntimeClosedError",
    "StopReason",
    "StoreBusyError",
    "StoreCorruptError",
    "StoreDamagedRowError",
    "StoreDriverError",
    "StoreError",
    "StoreForeignError",
    "StoreFullError",
    "StoreLockedError",
    "StorePathError",
    "StoreSchemaError",
    "StoreUrlError",
    "TransitionEvent",
    "UnknownEngineError",
    "UnknownEvent",
    "UsageError",
    "World",
    "__version__",
    "commit",
    "event_type",
    "load",
    "open_daemon",
    "registered_types",
    "replay",
    "run_daemon",
    "upcaster",
]
