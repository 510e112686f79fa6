"""The append-only event log: :class:`EventStore`, the one entry point to it.

It opens the log (creating and migrating it, taking the owner lock) and hands each call to the
part that does that job: :class:`~hostler.store.appender.LogAppender` writes (appends with group
commit, read-decide-append, import), :class:`~hostler.store.reader.LogReader` reads (counts,
streams, the filtered log in pages), and :mod:`hostler.store.records` decodes each row read.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self, TypeVar

import sqlalchemy as sa

from hostler.errors import StoreError, UsageError
from hostler.events.base import Event, payload_of
from hostler.fleet import host_name_problem
from hostler.store.appender import AppendResult, Clock, LogAppender
from hostler.store.connect import Engines, display_name, make_engines, sqlite_path_of
from hostler.store.lock import OwnerLock
from hostler.store.migrate import upgrade_to_head
from hostler.store.postgres import (
    PgOwnerLock,
    create_host_schema,
    fleet_hosts,
    host_schema,
)
from hostler.store.reader import LogReader, translate_error
from hostler.store.records import EPOCH, RawRow, RecordedEvent, format_time, parse_time

__all__ = [
    "EPOCH",
    "AppendResult",
    "EventStore",
    "RawRow",
    "RecordedEvent",
    "format_time",
    "parse_time",
    "payload_of",
]

T = TypeVar("T")


def _utcnow() -> datetime:
    return datetime.now(UTC)


class EventStore:
    """An append-only event log on SQLAlchemy Core (SQLite file by default).

    Open it with :meth:`open`. Appends from many threads share commits: while one thread
    commits, the others queue, and the next commit carries all of them (group commit), each
    append keeping its own optimistic-concurrency check.

    Args:
        engines: The log's engines (writer and reader), already migrated.
        name: The log's name in errors (its file, or its URL without the password).
        lock: The owner lock it holds (released on :meth:`close`), if any.
        clock: Source of ``recorded_at``.
        host: The fleet host it is the log of (kept in each appended event's metadata).
    """

    def __init__(
        self,
        engines: Engines,
        *,
        name: str,
        lock: OwnerLock | PgOwnerLock | None,
        clock: Clock,
        host: str | None = None,
    ) -> None:
        self._engines = engines
        self.name = name
        #: The fleet host this log is (None: a log of one host, unnamed).
        self.host = host
        self._lock = lock
        self._closed = False
        self._appender = LogAppender(engines, name=name, clock=clock, owner=lock, host=host)
        self._reader = LogReader(engines.reader, name)

    # -- opening and closing -------------------------------------------------------------

    @classmethod
    def open(
        cls,
        target: str | os.PathLike[str],
        *,
        owner: bool = False,
        clock: Clock | None = None,
        synchronous: str = "FULL",
        shared: bool = False,
        busy_timeout: float | None = None,
        max_bytes: int | None = None,
        host: str | None = None,
    ) -> Self:
        """Open (creating and migrating as needed) the log at a path or SQLAlchemy URL.

        Args:
            target: A file path (SQLite, the embedded default) or a SQLAlchemy URL.
            owner: Take the exclusive owner lock (``<file>.lock``; on PostgreSQL an advisory
                lock): a daemon that acts on the log's decisions must; readers (CLI,
                post-mortem) must not.
            clock: Source of ``recorded_at`` (injected in tests).
            synchronous: SQLite ``synchronous`` pragma; ``FULL`` makes each commit durable.
            shared: The file is shared with the directory's group (created 0660, its
                directory must exist); otherwise it is kept to its owner (0600).
            busy_timeout: Seconds a write waits for another process's write lock before
                failing with :class:`~hostler.errors.StoreBusyError` (default 30). The daemon
                waits briefly and retries on its own, so a signal is never kept waiting.
            max_bytes: SQLite only: the largest the file may grow; writes past it fail with
                :class:`~hostler.errors.StoreFullError`, as on a full disk.
            host: A fleet host's name (docs/fleet.md): kept in every appended event's
                metadata; on a database server the log is that host's part of the shared
                database (made by its owner; a reader is refused one that is not there), and
                the owner lock is that host's.

        Raises:
            StorePathError: The path is a directory or cannot be written.
            StoreLockedError: ``owner`` and another daemon holds the lock.
            StoreCorruptError: The file is not a hostler event log.
            StoreSchemaError: The log was written by a newer hostler.
            StoreError: ``host`` names no part of the shared log (a reader).
        """
        if synchronous.upper() not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
            raise UsageError(f"synchronous={synchronous!r}: use OFF, NORMAL, FULL or EXTRA")
        wait = {} if busy_timeout is None else {"busy_timeout": busy_timeout}
        if host is not None and (problem := host_name_problem(host)):
            raise UsageError(f"host {host[:60]!r}: {problem}")
        server = sqlite_path_of(target) is None
        schema = host_schema(host) if server and host is not None else None
        engines = make_engines(
            target,
            synchronous=synchronous.upper(),
            shared=shared,
            max_bytes=max_bytes,
            schema=schema,
            **wait,
        )
        name = str(engines.sqlite_file) if engines.sqlite_file else display_name(target)
        if schema is not None:
            name = f"{name} (host {host})"
        lock: OwnerLock | PgOwnerLock | None = None
        try:
            if owner and engines.sqlite_file is not None:
                lock = OwnerLock(Path(f"{engines.sqlite_file}.lock"), guard=engines.sqlite_file)
            try:
                if schema is not None and owner:
                    create_host_schema(engines.writer, schema)
                elif schema is not None and host not in (hosts := fleet_hosts(engines.reader)):
                    shown = ", ".join(hosts[:20]) or "none"
                    raise StoreError(
                        f"{display_name(target)}: no host {host!r} in this log (hosts: {shown})"
                    )
                if owner and engines.sqlite_file is None:
                    lock = PgOwnerLock(engines.writer, scope=schema or "", where=name)
                upgrade_to_head(engines.writer, where=name, reader=engines.reader)
            except sa.exc.DBAPIError as exc:
                raise translate_error(exc, name) from exc
        except BaseException:
            if lock is not None:
                lock.release()
            engines.dispose()
            raise
        return cls(engines, name=name, lock=lock, clock=clock or _utcnow, host=host)

    def fleet_hosts(self) -> list[str]:
        """The fleet hosts with a part of this database (none on SQLite), by name."""
        if self._engines.sqlite_file is not None:
            return []
        try:
            return fleet_hosts(self._engines.reader)
        except sa.exc.DBAPIError as exc:
            raise translate_error(exc, self.name) from exc

    @property
    def sqlite_file(self) -> Path | None:
        """The SQLite file behind this log (None on another database)."""
        return self._engines.sqlite_file

    def close(self) -> None:
        """Release the writer connection, the pools and the owner lock (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._appender.close()
        self._reader.close()
        self._engines.dispose()
        if self._lock is not None:
            self._lock.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- writing (hostler.store.appender) ------------------------------------------------

    def append(
        self,
        stream_id: str,
        new_events: Sequence[Event],
        *,
        expected_version: int | None,
        metadata: Mapping[str, Any] | None = None,
    ) -> AppendResult:
        """Append events to one stream atomically; thread-safe.

        Args:
            stream_id: The stream to extend.
            new_events: Registered events, in order. All are written, or none.
            expected_version: The stream's last version as the caller knows it (0 for a new
                stream); ``None`` appends at the end whatever it is.
            metadata: Correlation/causation ids, actor, policy version; stored on each row.

        Raises:
            ConcurrencyError: The stream is not at ``expected_version``; nothing was written.
            StoreError: The database refused the write.
        """
        return self._appender.append(
            stream_id, new_events, expected_version=expected_version, metadata=metadata
        )

    def transact(
        self,
        stream_id: str,
        decide: Callable[[list[RecordedEvent]], tuple[Sequence[Event], T]],
        *,
        after_version: int,
        metadata: Mapping[str, Any] | None = None,
    ) -> tuple[T, list[RecordedEvent], AppendResult | None]:
        """Read, decide and append on one stream while holding the database's write lock.

        Inside one write transaction (``BEGIN IMMEDIATE`` on SQLite, so other processes wait):
        the stream's events after ``after_version`` are read, ``decide(new_records)`` returns
        the events to append and an answer, and those events are appended at the stream's end.
        A check-and-reserve shared by several processes is therefore serializable without
        retries. Returns ``(answer, new_records, append_result_or_None)``.

        Raises:
            ConcurrencyError: Only on databases without a whole-database write lock, when
                another writer appended in between; decide again.
        """
        return self._appender.transact(
            stream_id, decide, after_version=after_version, metadata=metadata
        )

    def import_rows(self, rows: Iterable[RawRow]) -> int:
        """Fill an EMPTY log with rows kept exactly as given; the import-only write path.

        Unlike :meth:`append`, each row keeps its own ``seq``, ``recorded_at`` and stored
        payload/metadata text (``hostler import`` restores an export with them, so that state,
        events and replay answer as on the original). All rows go in one transaction, which
        first checks that the log is empty: an exception raised while ``rows`` is iterated
        (a malformed line) rolls everything back. On PostgreSQL the seq counter is then moved
        past the imported seqs. Returns how many rows were written.

        Raises:
            StoreNotEmptyError: The log already holds events; nothing was written.
            ExportFormatError: Two rows give the same stream the same version, or (not on
                SQLite) a damaged row's text is not JSON.
        """
        return self._appender.import_rows(rows)

    @property
    def commit_stats(self) -> tuple[int, int]:
        """``(commits, appends)`` since open: fewer commits than appends means group commit."""
        return self._appender.commit_stats

    # -- reading (hostler.store.reader) --------------------------------------------------

    def stream_version(self, stream_id: str) -> int:
        """The last version of a stream (0 when it has no events)."""
        return self._reader.stream_version(stream_id)

    def last_seq(self) -> int:
        """The highest seq in the log (0 when empty)."""
        return self._reader.last_seq()

    def count(self) -> int:
        """How many events the log holds."""
        return self._reader.count()

    def check_integrity(self) -> None:
        """Every page of the log read and checked (SQLite's ``quick_check``; seconds per GiB).

        Raises:
            StoreCorruptError: A page is damaged.
        """
        self._reader.check_integrity()

    def read_stream(
        self,
        stream_id: str,
        *,
        after_version: int = 0,
        until_version: int | None = None,
        until_time: datetime | None = None,
    ) -> list[RecordedEvent]:
        """A stream's events in version order.

        ``after_version`` skips what a caller has already folded (catching up);
        ``until_version`` / ``until_time`` give the stream as of a version or a time.
        """
        return self._reader.read_stream(
            stream_id,
            after_version=after_version,
            until_version=until_version,
            until_time=until_time,
        )

    def read_all(
        self,
        *,
        after_seq: int = 0,
        until_seq: int | None = None,
        types: Iterable[str] | None = None,
        streams: Iterable[str] | None = None,
        stream_prefix: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int | None = None,
        last: int | None = None,
    ) -> Iterator[RecordedEvent]:
        """Events in seq order after ``after_seq``, filtered; read in pages, lazily.

        Filters combine with AND; ``types`` and ``streams`` match any of their values.
        ``last=N`` keeps only the last N matching events. Each page is its own short read, so
        tailing a large log never pins a snapshot (nor blocks the WAL checkpoint) for long.
        """
        return self._reader.read_all(
            after_seq=after_seq,
            until_seq=until_seq,
            types=types,
            streams=streams,
            stream_prefix=stream_prefix,
            since=since,
            until=until,
            limit=limit,
            last=last,
        )

    def read_stored(
        self,
        *,
        after_seq: int = 0,
        until_seq: int | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> Iterator[tuple[RawRow, RecordedEvent]]:
        """Rows as stored, each beside its decoded record, in seq order; read in pages, lazily.

        For export: the :data:`RawRow` keeps a damaged row's columns as the file holds
        them, so it can be handed on as it is; the record says whether (and why) it is damaged.
        """
        return self._reader.read_stored(
            after_seq=after_seq, until_seq=until_seq, since=since, until=until
        )

    def read_rows(
        self, *, after_seq: int = 0, until_seq: int | None = None, until: datetime | None = None
    ) -> Iterator[Sequence[Sequence[Any]]]:
        """Raw row pages ``(seq, stream_id, version, type, schema_version, payload)``.

        The fast path for replay: no :class:`RecordedEvent` is built per row, and
        ``payload`` is what the driver returns (JSON text on SQLite; some PostgreSQL drivers
        decode it already): pass it through :func:`payload_of`.
        """
        return self._reader.read_rows(after_seq=after_seq, until_seq=until_seq, until=until)
