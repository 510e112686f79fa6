"""Plugin host events: a plugin loaded, or was disabled (stream ``plugins/host``).

Defined here, beside the event base, so that a log's reader registers them without
importing pluggy or the plugin host (:mod:`hostler.pluginhost` re-exports them).
"""

from __future__ import annotations

from dataclasses import dataclass

from hostler.events.base import Event, event_type

__all__ = ["PluginFailed", "PluginLoaded"]


@event_type("plugin.loaded")
@dataclass(frozen=True, slots=True)
class PluginLoaded(Event):
    """A plugin loaded and registered these engines."""

    name: str
    version: str
    engines: list[str]


@event_type("plugin.failed")
@dataclass(frozen=True, slots=True)
class PluginFailed(Event):
    """A plugin was disabled: at which stage, and why."""

    name: str
    version: str
    stage: str
    error: str
