"""hostler: keeps local inference engines resident within a machine's memory, and says why.

The public API is what this module exports (pinned by ``tests/test_public_api.py``):
the event log (:class:`EventStore`), the event base and registry, the lifecycle machines,
replay, and the error hierarchy rooted at :class:`HostlerError`.

Importing ``hostler`` loads only its version and the error hierarchy: every other public name
loads its module on first use (``hostler.EventStore`` the event log and SQLAlchemy,
``hostler.Engine`` the lifecycle machines...), so ``hostler --help`` and the pure core start
without paying for what they do not use.
"""

from __future__ import annotations

import importlib
import sys
import types
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

if TYPE_CHECKING:
    from hostler.embed import open_daemon, run_daemon
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
    from hostler.runtime.facade import Runtime
    from hostler.store import AppendResult, EventStore, RecordedEvent

#: Public names that live in modules with a cost (msgspec, transitions, SQLAlchemy...),
#: imported on first use: ``import hostler`` (and so every ``hostler`` command, ``--help``
#: included) loads only the version and the error hierarchy.
_LAZY = {
    **dict.fromkeys(
        ("Event", "UnknownEvent", "event_type", "registered_types", "upcaster"), "hostler.events"
    ),
    **dict.fromkeys(
        (
            "Engine",
            "EngineState",
            "Lease",
            "LeaseSlot",
            "LeaseState",
            "LifecycleModel",
            "Reservation",
            "ReservationState",
            "StopReason",
            "TransitionEvent",
        ),
        "hostler.machines",
    ),
    **dict.fromkeys(("World", "commit", "load", "replay"), "hostler.replay"),
    **dict.fromkeys(("AppendResult", "EventStore", "RecordedEvent"), "hostler.store"),
    "Runtime": "hostler.runtime.facade",
    "open_daemon": "hostler.embed",
    "run_daemon": "hostler.embed",
}


def __getattr__(name: str) -> Any:
    """Import a public name's module only when the name is first used (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hostler' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """The ``hostler`` module, whose ``replay`` stays the function when its module is imported.

    Importing the submodule ``hostler.replay`` sets the package's attribute ``replay`` to that
    module; the public name is the function of the same name in it (as it was when the package
    imported it eagerly), so the module is swapped for its function.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "replay" and isinstance(value, types.ModuleType):
            value = value.replay
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

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
