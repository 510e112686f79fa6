"""Events: frozen dataclasses registered under stable string types, plus upcasters.

An event's identity in the log is its ``TYPE`` string and ``SCHEMA_VERSION``, never a Python
import path, so a log stays readable after modules move or plugins are uninstalled.

Importing this package registers the event types hostler writes outside the lifecycle machines
(ledger, calibration, plugin host, device samples, the daemon, the request queue, the
discovered models), so that a
post-mortem reader decodes them rather than seeing :class:`UnknownEvent`: their classes live in
its submodules for that reason.
"""

from __future__ import annotations

from hostler.events.base import (
    Event,
    UnknownEvent,
    decode,
    encode,
    event_type,
    registered_types,
    upcaster,
)

# Imported for their registrations (after base, which they need).
from hostler.events import cache, calibration, cpu, daemon, device  # noqa: F401  # isort: skip
from hostler.events import discovery, ledger, offload  # noqa: F401  # isort: skip
from hostler.events import plugin, pool, queue, router  # noqa: F401  # isort: skip

__all__ = [
    "Event",
    "UnknownEvent",
    "decode",
    "encode",
    "event_type",
    "registered_types",
    "upcaster",
]
