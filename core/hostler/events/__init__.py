"""Events: frozen dataclasses registered under stable string types, plus upcasters.

An event's identity in the log is its ``TYPE`` string and ``SCHEMA_VERSION``, never a Python
import path, so a log stays readable after modules move or plugins are uninstalled.
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

__all__ = [
    "Event",
    "UnknownEvent",
    "decode",
    "encode",
    "event_type",
    "registered_types",
    "upcaster",
]
