"""Writing the event log: appends with group commit, read-decide-append, and import.

Appends from many threads share commits: while one thread commits, the others queue, and the
next commit carries all of them (group commit), each append keeping its own
optimistic-concurrency check; a durable commit costs one fsync for the whole batch. One
dedicated write connection (:mod:`hostler.store.writers`) does the writing, made on first use
and dropped after a failure that may have left it unusable.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar

from hostler._version import __version__
from hostler.errors import (
    ConcurrencyError,
    ExportFormatError,
    StoreError,
    StoreNotEmptyError,
    UsageError,
)
from hostler.events.base import Event, encode
from hostler.store.connect import Engines
from hostler.store.records import RawRow, RecordedEvent, format_time, record_of
from hostler.store.writers import (
    CoreWriter,
    Row,
    SqliteWriter,
    UniqueViolation,
    Writer,
)

__all__ = ["AppendResult", "Clock", "LogAppender"]

Clock = Callable[[], datetime]
T = TypeVar("T")

_VERSION_CACHE_LIMIT = 100_000


class OwnerCheck(Protocol):
    """The owner lock as the writer sees it."""

    def confirm(self) -> None:
        """Raise :class:`~hostler.errors.StoreLockedError` unless the lock is (again) held."""


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


class LogAppender:
    """The writes of one event log: one writer at a time, appends sharing its commits.

    Args:
        engines: The log's engines (the writer engine writes; a SQLite file takes the
            driver-level write path).
        name: The log's name, for errors.
        clock: Source of ``recorded_at``.
        owner: The owner lock the store holds, confirmed before every write transaction (a
            database server drops it with a lost session).
        host: The fleet host whose log this is, kept in every row's metadata.
    """

    def __init__(
        self,
        engines: Engines,
        *,
        name: str,
        clock: Clock,
        owner: OwnerCheck | None = None,
        host: str | None = None,
    ) -> None:
        self._engines = engines
        self._owner = owner
        self._name = name
        self._clock = clock
        # SQLite takes the driver-level write path; tests may force the generic Core one.
        self._use_core_writer = False
        self._cond = threading.Condition()
        self._queue: list[_Request] = []
        self._writing = False
        self._writer: Writer | None = None
        self._closed = False
        self._commits = 0
        self._appends = 0
        # Last committed version of streams this store appended to. Trusted only when it
        # equals the caller's expectation: a writer elsewhere that moved the stream on makes
        # our insert hit UNIQUE(stream_id, version), which is reported as a conflict.
        self._versions: dict[str, int] = {}
        self._base_metadata = {"hostler_version": __version__}
        if host is not None:
            self._base_metadata["host"] = host  # every event names its host (docs/fleet.md)
        self._base_metadata_json = _dumps(self._base_metadata)

    def close(self) -> None:
        """Refuse every later write, wait for the one under way, release the connection."""
        self._closed = True
        with self._cond:
            while self._writing:
                self._cond.wait()
            self._drop_writer()

    def _refuse_closed(self) -> None:
        if self._closed:
            raise StoreError(f"{self._name}: the event log is closed")

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Hold the writer alone (no group commit) until the block ends."""
        with self._cond:
            while self._writing:
                self._cond.wait()
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()

    def append(
        self,
        stream_id: str,
        new_events: Sequence[Event],
        *,
        expected_version: int | None,
        metadata: Mapping[str, Any] | None = None,
    ) -> AppendResult:
        """Append events to one stream atomically; thread-safe.

        What it takes, returns and raises: :meth:`hostler.store.log.EventStore.append`.
        """
        self._refuse_closed()
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

        What it takes, returns and raises: :meth:`hostler.store.log.EventStore.transact`.
        """
        self._refuse_closed()
        with self._exclusive():
            return self._transact(stream_id, decide, after_version, metadata)

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
                fresh = [record_of(row) for row in writer.stream_rows(stream_id, after_version)]
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
                for request in batch:
                    try:
                        request.result = self._write_one(writer, request, recorded_at, written)
                    except ConcurrencyError as exc:
                        request.error = exc  # one append's conflict fails it alone
                writer.commit()
            except BaseException:
                writer.rollback()
                raise
            if len(self._versions) > _VERSION_CACHE_LIMIT:
                self._versions.clear()
            self._versions.update(written)
            self._commits += 1
            self._appends += len(batch)
        except BaseException as exc:  # noqa: BLE001 - every waiter must learn of it, or hang
            for request in batch:
                request.result, request.error = None, exc
            self._versions.clear()
            self._drop_writer()
        for request in batch:
            request.done = True

    def import_rows(self, rows: Iterable[RawRow]) -> int:
        """Fill an EMPTY log with rows kept exactly as given; the import-only write path.

        What it takes, returns and raises: :meth:`hostler.store.log.EventStore.import_rows`.
        """
        self._refuse_closed()
        with self._exclusive():
            try:
                return self._import(rows)
            finally:
                self._versions.clear()

    def _import(self, rows: Iterable[RawRow]) -> int:
        writer = self._writer_connection()
        written = 0
        writer.begin()
        try:
            _refuse_non_empty(self._name, writer.row_count())
            for row in rows:
                try:
                    writer.insert_exact(row)
                except UniqueViolation as exc:
                    raise ExportFormatError(
                        f"seq {row[0]}: stream {row[1]!r} has version {row[2]} twice; "
                        "nothing was imported"
                    ) from exc
                written += 1
            writer.after_import()
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
        # A savepoint per append: a conflict undoes this append alone, and leaves the
        # transaction usable (PostgreSQL aborts a whole transaction on a failed statement).
        writer.savepoint()
        try:
            seqs = writer.insert(rows)
        except UniqueViolation as exc:
            # Another writer moved the stream on since we last saw it.
            writer.rollback_to_savepoint()
            self._versions.pop(stream_id, None)
            raise ConcurrencyError(stream_id, current, writer.stream_version(stream_id)) from exc
        writer.release()
        written[stream_id] = current + len(rows)
        return AppendResult(stream_id, current + len(rows), seqs)

    def _writer_connection(self) -> Writer:
        if self._owner is not None:
            self._owner.confirm()  # every write transaction: never written without the lock
        if self._writer is None:
            if self._engines.sqlite_file is not None and not self._use_core_writer:
                self._writer = SqliteWriter(self._engines.writer, self._name)
            else:
                self._writer = CoreWriter(self._engines.writer, self._name)
        return self._writer

    def _drop_writer(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _refuse_non_empty(name: str, held: int) -> None:
    if held:
        raise StoreNotEmptyError(
            f"{name}: holds {held} events; import fills an empty log only "
            "(give a new file to --db); nothing was written"
        )


def _dumps(value: Any) -> str:
    return json.dumps(value, allow_nan=False, separators=(",", ":"))
