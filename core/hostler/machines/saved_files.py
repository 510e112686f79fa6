"""CC14: the session files each engine has on disk, as its cache stream tells them (pure fold).

A session's prompt cache saved by its engine (``cache.saved`` without an error) is a file on
disk until it is dropped (``cache.evicted``: a watermark, an invalidation, a clear). A failed
save leaves the session's older file as it was. The daemon folds this at its start, so a
restart counts the files left by the engines it no longer runs against their budgets; the
operator's views ask the same fold.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Protocol

from hostler.events.base import Event, UnknownEvent
from hostler.events.cache import CacheEvicted, CacheSaved
from hostler.policies.cache import CacheEntry, bytes_per_token

__all__ = ["SavedFiles", "fold_saved_files"]


class _Moment(Protocol):
    def timestamp(self) -> float: ...


class _Record(Protocol):
    @property
    def stream_id(self) -> str: ...

    @property
    def recorded_at(self) -> _Moment: ...

    @property
    def event(self) -> Event | UnknownEvent: ...


@dataclass
class SavedFiles:
    """One engine's saved session files, and one token's cost as its last save measured it.

    Attributes:
        files: Per session, its file as an entry not held by any engine (``held`` False,
            ``bytes`` = ``file_bytes`` = the file's size as written).
        per_token: Bytes per token of the last save that told both (None before one).
    """

    files: dict[str, CacheEntry] = field(default_factory=dict)
    per_token: int | None = None

    def apply(self, event: Event | UnknownEvent, at: float) -> None:
        """Fold one event of the engine's cache stream, recorded at ``at`` (epoch seconds)."""
        if isinstance(event, CacheSaved):
            self._saved(event, at)
        elif isinstance(event, CacheEvicted):
            for session in event.ids:
                self.files.pop(session, None)

    def _saved(self, event: CacheSaved, at: float) -> None:
        if event.error or event.bytes <= 0:
            return  # nothing written: an older file, if any, stays as it was
        used = event.used_at if event.used_at > 0 else at
        known = self.files.get(event.session)
        entry = CacheEntry(
            event.session, event.tokens, event.bytes, used, file_bytes=event.bytes, held=False
        )
        if known is not None:
            entry = replace(entry, priority=known.priority, group=known.group)
        self.files[event.session] = entry
        measured = bytes_per_token(event.tokens, event.bytes)
        if measured is not None:
            self.per_token = measured


def fold_saved_files(records: Iterable[_Record]) -> dict[str, SavedFiles]:
    """Every engine's saved files from the log's ``cache/<key>`` records, in order."""
    by_key: dict[str, SavedFiles] = {}
    for record in records:
        event = record.event
        if isinstance(event, CacheSaved | CacheEvicted):
            files = by_key.setdefault(event.key, SavedFiles())
            files.apply(event, record.recorded_at.timestamp())
    return by_key
