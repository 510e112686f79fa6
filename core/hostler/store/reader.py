"""Reading the event log: counts, a stream, the whole log filtered, raw pages for replay.

Every read is its own short transaction on the reader pool, and the long reads go in pages
(by ``seq``), so that tailing a large log never pins a snapshot (nor blocks the WAL
checkpoint) for long. Database errors name the log (:func:`translate_error`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from hostler.errors import StoreCorruptError, StoreError
from hostler.store.records import (
    REPLAY_COLUMNS,
    STORED_COLUMNS,
    RawRow,
    RecordedEvent,
    format_time,
    record_of,
)
from hostler.store.schema import events
from hostler.store.writers import translate

__all__ = ["LogReader", "translate_error"]

_PAGE = 5000
_REPLAY_PAGE = 20_000
_STREAM_VERSION = sa.select(sa.func.coalesce(sa.func.max(events.c.version), 0)).where(
    events.c.stream_id == sa.bindparam("stream_id")
)


def translate_error(exc: sa.exc.DBAPIError, name: str) -> StoreError:
    """The named, one-line error of a database failure met on the log ``name``."""
    detail = str(exc.orig).strip() or type(exc.orig).__name__
    return translate(detail, name, getattr(exc.orig, "sqlstate", None))


class LogReader:
    """The reads of one event log, on its reader engine; refused once :meth:`close` is called.

    Args:
        engine: The log's reader engine (its pool of read connections).
        name: The log's name, for errors.
    """

    def __init__(self, engine: sa.Engine, name: str) -> None:
        self._engine = engine
        self._name = name
        self._closed = False

    def close(self) -> None:
        """Refuse every later read (the engine itself is the store's to dispose of)."""
        self._closed = True

    def stream_version(self, stream_id: str) -> int:
        """The last version of a stream (0 when it has no events)."""
        with self._read() as conn:
            return int(conn.execute(_STREAM_VERSION, {"stream_id": stream_id}).scalar_one())

    def last_seq(self) -> int:
        """The highest seq in the log (0 when empty)."""
        with self._read() as conn:
            value = conn.execute(sa.select(sa.func.max(events.c.seq))).scalar_one()
        return int(value or 0)

    def count(self) -> int:
        """How many events the log holds."""
        with self._read() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(events)).scalar_one())

    def check_integrity(self) -> None:
        """SQLite's ``quick_check`` of every page (a no-op on other databases).

        Raises:
            StoreCorruptError: A page is damaged (the first problems named), though the rows
                read so far were whole.
        """
        with self._read() as conn:
            if conn.dialect.name != "sqlite":
                return
            problems = [str(row[0]) for row in conn.execute(sa.text("PRAGMA quick_check(3)"))]
        if problems != ["ok"]:
            found = "; ".join(" ".join(p.split()) for p in problems)[:300]
            raise StoreCorruptError(f"{self._name}: damaged pages ({found})")

    def read_stream(
        self,
        stream_id: str,
        *,
        after_version: int = 0,
        until_version: int | None = None,
        until_time: datetime | None = None,
    ) -> list[RecordedEvent]:
        """A stream's events in version order.

        What it takes, returns and raises: :meth:`hostler.store.log.EventStore.read_stream`.
        """
        stmt = sa.select(*STORED_COLUMNS).where(events.c.stream_id == stream_id)
        if after_version:
            stmt = stmt.where(events.c.version > after_version)
        if until_version is not None:
            stmt = stmt.where(events.c.version <= until_version)
        if until_time is not None:
            stmt = stmt.where(events.c.recorded_at <= format_time(until_time))
        with self._read() as conn:
            return [record_of(row) for row in conn.execute(stmt.order_by(events.c.version))]

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

        What it takes, returns and raises: :meth:`hostler.store.log.EventStore.read_all`.
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
            yield from (record_of(row) for row in page)

    def read_stored(
        self,
        *,
        after_seq: int = 0,
        until_seq: int | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> Iterator[tuple[RawRow, RecordedEvent]]:
        """Rows as stored, each beside its decoded record, in seq order; read in pages, lazily.

        What it takes, returns and raises: :meth:`hostler.store.log.EventStore.read_stored`.
        """
        base = self._filtered(until_seq=until_seq, since=since, until=until)
        assert base is not None  # noqa: S101 - no empty filter was given
        for page in self._paged(base, after_seq=after_seq, limit=None):
            for row in page:
                yield tuple(row), record_of(row)

    def read_rows(
        self, *, after_seq: int = 0, until_seq: int | None = None, until: datetime | None = None
    ) -> Iterator[Sequence[Sequence[Any]]]:
        """Raw row pages ``(seq, stream_id, version, type, schema_version, payload)``.

        What it takes, returns and raises: :meth:`hostler.store.log.EventStore.read_rows`.
        """
        base = self._filtered(until_seq=until_seq, until=until, columns=REPLAY_COLUMNS)
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
        columns: tuple[Any, ...] = STORED_COLUMNS,
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
        self, base: sa.Select[Any], *, after_seq: int, limit: int | None, page: int | None = None
    ) -> Iterator[Sequence[Sequence[Any]]]:
        page = _PAGE if page is None else page  # read here, so a test may make pages small
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
            raise StoreError(f"{self._name}: the event log is closed")
        return _ReadContext(self._engine, self._name)


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
            raise translate_error(exc, self._name) from exc
        return self._conn

    def __exit__(self, exc_type: object, exc: object, _tb: object) -> None:
        assert self._conn is not None  # noqa: S101 - set by __enter__
        self._conn.close()
        if isinstance(exc, sa.exc.DBAPIError):
            raise translate_error(exc, self._name) from exc
