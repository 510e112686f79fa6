"""The event log: the source of truth of every decision hostler takes."""

from __future__ import annotations

from hostler.store.log import AppendResult, EventStore, RecordedEvent

__all__ = ["AppendResult", "EventStore", "RecordedEvent"]
