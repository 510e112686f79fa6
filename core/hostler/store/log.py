"""The append-only event log: optimistic-concurrency appends with group commit, and reads."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self, TypeVar

import msgspec
import sqlalchemy as sa

from hostler._version import __version__
from hostler.errors import (
    ConcurrencyError,
    ExportFormatError,
    StoreError,
    StoreNotEmptyError,
    UsageError,
)
from hostler.events.base import Event, UnknownEvent, decode, encode, payload_of
from hostler.store.connect import Engines, make_engines
from hostler.store.lock import OwnerLock
from hostler.store.migrate import upgrade_to_head
from hostler.store.schema import ROW_COLUMNS, events
from hostler.store.writers import (
    CoreWriter,
    Row,
    SqliteWriter,
    UniqueViolation,
    Writer,
    translate,
)

__all__ = [
    "AppendResult",
    "EventStore",
    "RawRow",
    "RecordedEvent",
    "format_time",
    "parse_time",
    "payload_of",
]

Clock = Callable[[], datetime]

#: A row as stored, for export and import: ``(seq, stream_id, version, type, schema_version,
#: payload, metadata, recorded_at)``, payload and metadata as their stored JSON text (a damaged
#: row's columns hold whatever the file held).
RawRow = tuple[Any, Any, Any, Any, Any, Any, Any, Any]
T = TypeVar("T")

_PAGE = 5000
_REPLAY_PAGE = 20_000
_VERSION_CACHE_LIMIT = 100_000
# Payload and metadata as stored text, decoded per row by _record: one damaged row must not
# fail the page it is in (SQLAlchemy's JSON result processor would raise for the whole page).
_COLUMNS = (
    *ROW_COLUMNS[:5],
    sa.type_coerce(events.c.payload, sa.Text()).label("payload"),
    sa.type_coerce(events.c["metadata"], sa.Text()).label("metadata"),
    ROW_COLUMNS[7],
)
#: ``recorded_at`` of a row whose stored time cannot be read (see ``RecordedEvent.damage``).
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Replay needs neither metadata nor time, and decodes the payload itself: the driver's text
# goes straight to json.loads, without a result processor per row.
_REPLAY_COLUMNS = (
    events.c.seq,
    events.c.stream_id,
    events.c.version,
    events.c.type,
    events.c.schema_version,
    sa.type_coerce(events.c.payload, sa.Text()).label("payload"),
)


def format_time(moment: datetime) -> str:
    """The stored text of a moment (UTC, fixed width). Naive datetimes are taken as UTC."""
    if moment.tzinfo is UTC:
        moment = moment.replace(tzinfo=None)
    elif moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    # isoformat is several times faster than strftime(TIME_FORMAT) and gives the same text
    return moment.isoformat(timespec="microseconds") + "Z"


def parse_time(text: str) -> datetime:
    """The aware UTC datetime of a stored ``recorded_at``."""
    return datetime.fromisoformat(text)


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    """One row of the log, with its event decoded (and upcast) for this hostler.

    Attributes:
        seq: Global position in the log; increasing, never reused, may have gaps.
        stream_id: The stream (one machine instance, e.g. ``engine/llamacpp:qwen:0``).
        version: Position within the stream, from 1, without gaps.
        type: The stable event type string.
        schema_version: The payload's schema version as stored.
        payload: The payload as stored (before upcasting).
        metadata: Correlation/causation ids, actor, hostler and policy versions.
        recorded_at: When the log accepted the event (UTC); the epoch when damaged.
        event: The decoded event, or an :class:`UnknownEvent` keeping the raw record.
        damage: Empty for a sound row; else why it could not be read (payload not JSON, time
            not a time...). A damaged row is listed, never folded, and never stops a read.
    """

    seq: int
    stream_id: str
    version: int
    type: str
    schema_version: int
    payload: dict[str, Any]
    metadata: dict[str, Any]
    recorded_at: datetime
    event: Event | UnknownEvent
    damage: str = ""


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where an append landed: the stream's new version and the rows' global seqs."""

    stream_id: str
    version: int
    seqs: tuple[int, ...]


@dataclass(eq=False)
class _Request:
    stream_id: str
    expected: int | None
    encoded: list[tuple[str, int, dict[str, Any], str]]
    metadata: dict[str, Any]
    metadata_json: str
    done: bool = False
    result: AppendResult | None = None
    error: BaseException | None = None


class EventStore:
    """An append-only event log on SQLAlchemy Core (SQLite file by default).

    Open it with :meth:`open`. Appends from many threads share commits: while one thread
    commits, the others queue, and the next commit carries all of them (group commit), each
    append keeping its own optimistic-concurrency check.
    """

    def __init__(
        self, engines: Engines, *, name: str, lock: OwnerLock | None, clock: Clock
    ) -> None:
        self._engines = engines
        self.name = name
        self._lock = lock
        self._clock = clock
        self._cond = threading.Condition()
        self._queue: list[_Request] = []
        self._writing = False
        self._writer: Writer | None = None
        # SQLite takes the driver-level write path; tests may force the generic Core one.
        self._use_core_writer = False
        self._closed = False
        self._commits = 0
        self._appends = 0
        # Last committed version of streams this store appended to. Trusted only when it
        # equals the caller's expectation: a writer elsewhere that moved the stream on makes
        # our insert hit UNIQUE(stream_id, version), which is reported as a conflict.
        self._versions: dict[str, int] = {}
        self._base_metadata = {"hostler_version": __version__}
        self._base_metadata_json = _dumps(self._base_metadata)
        self._version_stmt = sa.select(sa.func.coalesce(sa.func.max(events.c.version), 0)).where(
            events.c.stream_id == sa.bindparam("stream_id")
        )

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
    ) -> Self:
        """Open (creating and migrating as needed) the log at a path or SQLAlchemy URL.

        Args:
            target: A file path (SQLite, the embedded default) or a SQLAlchemy URL.
            owner: Take the exclusive owner lock (``<file>.lock``): a daemon that acts on the
                log's decisions must; readers (CLI, post-mortem) must not.
            clock: Source of ``recorded_at`` (injected in tests).
            synchronous: SQLite ``synchronous`` pragma; ``FULL`` makes each commit durable.
            shared: The file is shared with the directory's group (created 0660, its
                directory must exist); otherwise it is kept to its owner (0600).
            busy_timeout: Seconds a write waits for another process's write lock before
                failing with :class:`~hostler.errors.StoreBusyError` (default 30). The daemon
                waits briefly and retries on its own, so a signal is never kept waiting.
            max_bytes: SQLite only: the largest the file may grow; writes past it fail with
                :class:`~hostler.errors.StoreFullError`, as on a full disk.

        Raises:
            StorePathError: The path is a directory or cannot be written.
            StoreLockedError: ``owner`` and another daemon holds the lock.
            StoreCorruptError: The file is not a hostler event log.
            StoreSchemaError: The log was written by a newer hostler.
        """
        if synchronous.upper() not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
            raise UsageError(f"synchronous={synchronous!r}: use OFF, NORMAL, FULL or EXTRA")
        wait = {} if busy_timeout is None else {"busy_timeout": busy_timeout}
        engines = make_engines(
            target, synchronous=synchronous.upper(), shared=shared, max_bytes=max_bytes, **wait
        )
        name = str(engines.sqlite_file) if engines.sqlite_file else _safe_url(target)
        lock: OwnerLock | None = None
        try:
            if owner and engines.sqlite_file is not None:
                lock = OwnerLock(Path(f"{engines.sqlite_file}.lock"), guard=engines.sqlite_file)
            try:
                upgrade_to_head(engines.writer, where=name, reader=engines.reader)
            except sa.exc.DBAPIError as exc:
                raise _translate(exc, name) from exc
        except BaseException:
            if lock is not None:
                lock.release()
            engines.dispose()
            raise
        return cls(engines, name=name, lock=lock, clock=clock or _utcnow)

    @property
    def sqlite_file(self) -> Path | None:
        """The SQLite file behind this log (None on another database)."""
        return self._engines.sqlite_file

    def close(self) -> None:
        """Release the writer connection, the pools and the owner lock (idempotent)."""
        if self._closed:
            return
        self._closed = True
        with self._cond:
            while self._writing:
                self._cond.wait()
            self._drop_writer()
        self._engines.dispose()
        if self._lock is not None:
            self._lock.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- writing -------------------------------------------------------------------------

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
        if self._closed:
            raise StoreError(f"{self.name}: the event log is closed")
        if not new_events:
            raise UsageError("append needs at least one event")
        if not stream_id or len(stream_id) > 200:
            raise UsageError(f"stream id {stream_id!r} must be 1..200 characters")
        if metadata:
            meta = {**self._base_metadata, **metadata}
            meta_json = None
        else:
            meta, meta_json = self._base_metadata, self._base_metadata_json
        # Encoding happens here, in the caller's thread: a payload that is not JSON fails its
        # own append at once and never reaches a shared commit.
        pieces = [encode(e) for e in new_events]
        try:
            encoded = [
                (kind, version, payload, _dumps(payload)) for kind, version, payload in pieces
            ]
            request = _Request(
                stream_id, expected_version, encoded, meta, meta_json or _dumps(meta)
            )
        except (TypeError, ValueError) as exc:
            raise UsageError(
                f"stream {stream_id!r}: an event payload or the metadata cannot be stored as "
                f"JSON ({exc}); nothing of this append was written"
            ) from exc
        self._submit(request)
        if request.error is not None:
            raise request.error
        assert request.result is not None  # noqa: S101 - set together with done
        return request.result

    def _submit(self, request: _Request) -> None:
        with self._cond:
            self._queue.append(request)
            while self._writing and not request.done:
                self._cond.wait()
            if request.done:
                return
            self._writing = True
            batch, self._queue = self._queue, []
        try:
            self._write_batch(batch)
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()

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
        if self._closed:
            raise StoreError(f"{self.name}: the event log is closed")
        with self._cond:
            while self._writing:
                self._cond.wait()
            self._writing = True
        try:
            return self._transact(stream_id, decide, after_version, metadata)
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()

    def _transact(
        self,
        stream_id: str,
        decide: Callable[[list[RecordedEvent]], tuple[Sequence[Event], T]],
        after_version: int,
        metadata: Mapping[str, Any] | None,
    ) -> tuple[T, list[RecordedEvent], AppendResult | None]:
        writer = self._writer_connection()
        try:
            writer.begin()
            try:
                fresh = [_record(row) for row in writer.stream_rows(stream_id, after_version)]
                current = fresh[-1].version if fresh else after_version
                new_events, answer = decide(fresh)
                result = None
                if new_events:
                    meta = {**self._base_metadata, **(metadata or {})}
                    request = _Request(
                        stream_id,
                        current,
                        [(k, v, p, _dumps(p)) for k, v, p in map(encode, new_events)],
                        meta,
                        _dumps(meta),
                    )
                    result = self._write_one(writer, request, format_time(self._clock()), {})
                writer.commit()
            except BaseException:
                writer.rollback()
                raise
        except (ConcurrencyError, StoreError, UsageError):
            self._versions.pop(stream_id, None)
            raise
        except BaseException:
            self._versions.clear()
            self._drop_writer()
            raise
        if result is not None:
            self._versions[stream_id] = result.version
            self._commits += 1
            self._appends += 1
        return answer, fresh, result

    def _write_batch(self, batch: list[_Request]) -> None:
        recorded_at = format_time(self._clock())
        written: dict[str, int] = {}
        try:
            writer = self._writer_connection()
            writer.begin()
            try:
                if len(batch) == 1:
                    batch[0].result = self._write_one(writer, batch[0], recorded_at, written)
                else:
                    for request in batch:
                        writer.savepoint()
                        try:
                            request.result = self._write_one(writer, request, recorded_at, written)
                        except ConcurrencyError as exc:
                            # one append's conflict fails it alone, not the shared commit
                            writer.rollback_to_savepoint()
                            request.error = exc
                        else:
                            writer.release()
                writer.commit()
            except BaseException:
                writer.rollback()
                raise
            if len(self._versions) > _VERSION_CACHE_LIMIT:
                self._versions.clear()
            self._versions.update(written)
            self._commits += 1
            self._appends += len(batch)
        except ConcurrencyError as exc:
            batch[0].error = exc  # a batch of one: rolled back whole
        except BaseException as exc:  # noqa: BLE001 - every waiter must learn of it, or hang
            for request in batch:
                request.result, request.error = None, exc
            self._versions.clear()
            self._drop_writer()
        for request in batch:
            request.done = True

    def import_rows(self, rows: Iterable[RawRow]) -> int:
        """Fill an EMPTY log with rows kept exactly as given; the import-only write path.

        Unlike :meth:`append`, each row keeps its own ``seq``, ``recorded_at`` and stored
        payload/metadata text (``hostler import`` restores an export with them, so that state,
        events and replay answer as on the original). All rows go in one transaction, which
        first checks that the log is empty: an exception raised while ``rows`` is iterated
        (a malformed line) rolls everything back. SQLite only: on another database the
        identity sequence would have to be moved past the imported seqs by hand. Returns how
        many rows were written.

        Raises:
            StoreNotEmptyError: The log already holds events; nothing was written.
            ExportFormatError: Two rows give the same stream the same version.
            UsageError: The log is not a SQLite file.
        """
        if self._closed:
            raise StoreError(f"{self.name}: the event log is closed")
        if self._engines.sqlite_file is None:
            raise UsageError(f"{self.name}: import fills SQLite logs only; import into a file")
        with self._cond:
            while self._writing:
                self._cond.wait()
            self._writing = True
        try:
            return self._import(rows)
        finally:
            self._versions.clear()
            with self._cond:
                self._writing = False
                self._cond.notify_all()

    def _import(self, rows: Iterable[RawRow]) -> int:
        writer = self._writer_connection()
        if not isinstance(writer, SqliteWriter):
            raise UsageError(f"{self.name}: import needs the SQLite write path")
        written = 0
        writer.begin()
        try:
            _refuse_non_empty(self.name, writer.row_count())
            for row in rows:
                try:
                    writer.insert_exact(row)
                except UniqueViolation as exc:
                    raise ExportFormatError(
                        f"seq {row[0]}: stream {row[1]!r} has version {row[2]} twice; "
                        "nothing was imported"
                    ) from exc
                written += 1
            writer.commit()
        except BaseException:
            writer.rollback()
            raise
        return written

    @property
    def commit_stats(self) -> tuple[int, int]:
        """``(commits, appends)`` since open: fewer commits than appends means group commit."""
        return self._commits, self._appends

    def _write_one(
        self, writer: Writer, request: _Request, recorded_at: str, written: dict[str, int]
    ) -> AppendResult:
        stream_id = request.stream_id
        expected = request.expected
        known = written.get(stream_id)
        if known is None:
            known = self._versions.get(stream_id)
        if expected is not None and known == expected:
            current = expected
        else:
            current = writer.stream_version(stream_id)
            if expected is not None and current != expected:
                self._versions.pop(stream_id, None)
                raise ConcurrencyError(stream_id, expected, current)
        meta, meta_json = request.metadata, request.metadata_json
        rows: list[Row] = [
            (
                stream_id,
                current + n,
                type_name,
                version,
                payload,
                text,
                meta,
                meta_json,
                recorded_at,
            )
            for n, (type_name, version, payload, text) in enumerate(request.encoded, 1)
        ]
        try:
            seqs = writer.insert(rows)
        except UniqueViolation as exc:
            # Another writer moved the stream on since we last saw it.
            self._versions.pop(stream_id, None)
            raise ConcurrencyError(stream_id, current, writer.stream_version(stream_id)) from exc
        written[stream_id] = current + len(rows)
        return AppendResult(stream_id, current + len(rows), seqs)

    def _writer_connection(self) -> Writer:
        if self._writer is None:
            if self._engines.sqlite_file is not None and not self._use_core_writer:
                self._writer = SqliteWriter(self._engines.writer, self.name)
            else:
                self._writer = CoreWriter(self._engines.writer, self.name)
        return self._writer

    def _drop_writer(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    # -- reading -------------------------------------------------------------------------

    def stream_version(self, stream_id: str) -> int:
        """The last version of a stream (0 when it has no events)."""
        with self._read() as conn:
            return int(conn.execute(self._version_stmt, {"stream_id": stream_id}).scalar_one())

    def last_seq(self) -> int:
        """The highest seq in the log (0 when empty)."""
        with self._read() as conn:
            value = conn.execute(sa.select(sa.func.max(events.c.seq))).scalar_one()
        return int(value or 0)

    def count(self) -> int:
        """How many events the log holds."""
        with self._read() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(events)).scalar_one())

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
        stmt = sa.select(*_COLUMNS).where(events.c.stream_id == stream_id)
        if after_version:
            stmt = stmt.where(events.c.version > after_version)
        if until_version is not None:
            stmt = stmt.where(events.c.version <= until_version)
        if until_time is not None:
            stmt = stmt.where(events.c.recorded_at <= format_time(until_time))
        with self._read() as conn:
            return [_record(row) for row in conn.execute(stmt.order_by(events.c.version))]

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
        base = self._filtered(
            until_seq=until_seq,
            types=types,
            streams=streams,
            stream_prefix=stream_prefix,
            since=since,
            until=until,
        )
        if base is None:
            return
        if last is not None:
            newest = base.where(events.c.seq > after_seq).order_by(events.c.seq.desc()).limit(last)
            with self._read() as conn:
                rows = conn.execute(newest).all()
            if not rows:
                return
            after_seq = rows[-1][0] - 1
        for page in self._paged(base, after_seq=after_seq, limit=limit):
            yield from (_record(row) for row in page)

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
        base = self._filtered(until_seq=until_seq, since=since, until=until)
        assert base is not None  # noqa: S101 - no empty filter was given
        for page in self._paged(base, after_seq=after_seq, limit=None):
            for row in page:
                yield tuple(row), _record(row)

    def read_rows(
        self, *, after_seq: int = 0, until_seq: int | None = None, until: datetime | None = None
    ) -> Iterator[Sequence[Sequence[Any]]]:
        """Raw row pages ``(seq, stream_id, version, type, schema_version, payload)``.

        The fast path for replay: no :class:`RecordedEvent` is built per row, and
        ``payload`` is what the driver returns (JSON text on SQLite; some PostgreSQL drivers
        decode it already): pass it through :func:`payload_of`.
        """
        base = self._filtered(until_seq=until_seq, until=until, columns=_REPLAY_COLUMNS)
        assert base is not None  # noqa: S101 - no empty filter was given
        return self._paged(base, after_seq=after_seq, limit=None, page=_REPLAY_PAGE)

    @staticmethod
    def _filtered(
        *,
        until_seq: int | None = None,
        types: Iterable[str] | None = None,
        streams: Iterable[str] | None = None,
        stream_prefix: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        columns: tuple[Any, ...] = _COLUMNS,
    ) -> sa.Select[Any] | None:
        """The filtered select, or None when a filter can match nothing (empty list)."""
        base = sa.select(*columns)
        if until_seq is not None:
            base = base.where(events.c.seq <= until_seq)
        if types is not None:
            wanted = sorted(set(types))
            if not wanted:
                return None
            base = base.where(events.c.type.in_(wanted))
        if streams is not None:
            ids = sorted(set(streams))
            if not ids:
                return None
            base = base.where(events.c.stream_id.in_(ids))
        if stream_prefix is not None:
            base = base.where(events.c.stream_id.startswith(stream_prefix, autoescape=True))
        if since is not None:
            base = base.where(events.c.recorded_at >= format_time(since))
        if until is not None:
            base = base.where(events.c.recorded_at <= format_time(until))
        return base

    def _paged(
        self, base: sa.Select[Any], *, after_seq: int, limit: int | None, page: int = _PAGE
    ) -> Iterator[Sequence[Sequence[Any]]]:
        remaining = limit
        last = after_seq
        while remaining is None or remaining > 0:
            size = page if remaining is None else min(page, remaining)
            stmt = base.where(events.c.seq > last).order_by(events.c.seq).limit(size)
            with self._read() as conn:
                rows = conn.execute(stmt).all()
            if not rows:
                return
            yield rows
            last = rows[-1][0]
            if remaining is not None:
                remaining -= len(rows)
            if len(rows) < size:
                return

    def _read(self) -> _ReadContext:
        if self._closed:
            raise StoreError(f"{self.name}: the event log is closed")
        return _ReadContext(self._engines.reader, self.name)


class _ReadContext:
    """A short read transaction whose database errors name the log."""

    def __init__(self, engine: sa.Engine, name: str) -> None:
        self._engine = engine
        self._name = name
        self._conn: sa.Connection | None = None

    def __enter__(self) -> sa.Connection:
        try:
            self._conn = self._engine.connect()
        except sa.exc.DBAPIError as exc:
            raise _translate(exc, self._name) from exc
        return self._conn

    def __exit__(self, exc_type: object, exc: object, _tb: object) -> None:
        assert self._conn is not None  # noqa: S101 - set by __enter__
        self._conn.close()
        if isinstance(exc, sa.exc.DBAPIError):
            raise _translate(exc, self._name) from exc


def _record(row: Sequence[Any]) -> RecordedEvent:
    seq, stream_id, version, type_name, schema_version, payload, metadata, recorded_at = row
    damage: list[str] = []
    if not isinstance(stream_id, str) or not isinstance(type_name, str):
        damage.append("stream or type is not text")
        stream_id, type_name = str(stream_id), str(type_name)
    if type(version) is not int or type(schema_version) is not int:
        damage.append("version or schema version is not a whole number")
        version = version if type(version) is int else 0
        schema_version = schema_version if type(schema_version) is int else 0
    payload_dict = _json_object(payload, "payload", damage)
    metadata_dict = _json_object(metadata, "metadata", damage)
    try:
        moment = parse_time(recorded_at)
    except (TypeError, ValueError):
        damage.append(f"recorded_at {str(recorded_at)[:40]!r} is not a time")
        moment = EPOCH
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    if damage:
        why = "; ".join(damage)
        event: Event | UnknownEvent = UnknownEvent(
            type_name, schema_version, payload_dict, f"damaged row: {why}"
        )
    else:
        why = ""
        event = decode(type_name, schema_version, payload_dict)
    return RecordedEvent(
        seq,
        stream_id,
        version,
        type_name,
        schema_version,
        payload_dict,
        metadata_dict,
        moment,
        event,
        why,
    )


def _refuse_non_empty(name: str, held: int) -> None:
    if held:
        raise StoreNotEmptyError(
            f"{name}: holds {held} events; import fills an empty log only "
            "(give a new file to --db); nothing was written"
        )


def _json_object(value: Any, column: str, damage: list[str]) -> dict[str, Any]:
    """A stored JSON object column, or {} with the reason added to ``damage``."""
    if isinstance(value, dict):  # drivers that decode JSON themselves
        return value
    try:
        decoded = msgspec.json.decode(value) if value is not None else None
    except (msgspec.DecodeError, TypeError):
        damage.append(f"{column} is not JSON")
        return {}
    except RecursionError:  # a row nested past the decoder's depth: damaged, never fatal
        damage.append(f"{column} nests too deep to read")
        return {}
    if not isinstance(decoded, dict):
        damage.append(f"{column} is not a JSON object")
        return {}
    return decoded


def _translate(exc: sa.exc.DBAPIError, name: str) -> StoreError:
    return translate(str(exc.orig).strip() or type(exc.orig).__name__, name)


def _dumps(value: Any) -> str:
    return json.dumps(value, allow_nan=False, separators=(",", ":"))


def _safe_url(target: str | os.PathLike[str]) -> str:
    return sa.make_url(os.fspath(target)).render_as_string(hide_password=True)
