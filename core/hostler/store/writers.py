"""The write path under the event log: one transaction of appends, on a dedicated connection.

Two implementations of one small interface:

* :class:`SqliteWriter`, the SQLite dialect hook: the driver connection directly, with
  ``BEGIN IMMEDIATE`` and statements prepared once. Durable appends are fsync-bound, and this
  keeps hostler's own cost per append near raw sqlite3's.
* :class:`CoreWriter`: SQLAlchemy Core on any other database (PostgreSQL).

Both raise :class:`UniqueViolation` when ``(stream_id, version)`` is taken and
:class:`~hostler.errors.StoreError` (named, translated) for every other database failure.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Sequence
from typing import Any, Protocol

import sqlalchemy as sa

from hostler.errors import StoreBusyError, StoreCorruptError, StoreError, StoreFullError
from hostler.store.schema import ROW_COLUMNS, events

__all__ = [
    "CoreWriter",
    "Row",
    "SqliteWriter",
    "StoredRow",
    "UniqueViolation",
    "Writer",
    "translate",
]

#: One row to insert: stream_id, version, type, schema_version, payload, payload JSON text,
#: metadata, metadata JSON text, recorded_at. Each writer takes the form it needs.
Row = tuple[str, int, str, int, dict[str, Any], str, dict[str, Any], str, str]


#: A stored row read back: seq, stream_id, version, type, schema_version, payload, metadata,
#: recorded_at.
StoredRow = tuple[int, str, int, str, int, dict[str, Any], dict[str, Any], str]


class UniqueViolation(Exception):
    """``(stream_id, version)`` already exists: another writer appended first."""


class Writer(Protocol):
    """One dedicated write connection; not thread-safe (the store serializes its use)."""

    def begin(self) -> None:
        """Start a write transaction that holds the database's write lock."""

    def commit(self) -> None:
        """Commit the transaction (durably, as the connection's settings say)."""

    def rollback(self) -> None:
        """Roll back the transaction if one is open; never raises."""

    def savepoint(self) -> None:
        """Mark a point inside the transaction to roll back to."""

    def release(self) -> None:
        """Keep what was done since the savepoint."""

    def rollback_to_savepoint(self) -> None:
        """Undo what was done since the savepoint, and drop it."""

    def stream_version(self, stream_id: str) -> int:
        """The stream's last version inside this transaction (0 when empty)."""

    def insert(self, rows: Sequence[Row]) -> tuple[int, ...]:
        """Insert rows in order; return their seqs."""

    def stream_rows(self, stream_id: str, after_version: int) -> list[StoredRow]:
        """A stream's rows after a version, inside this transaction (payloads decoded)."""

    def close(self) -> None:
        """Give the connection back; never raises."""


def translate(detail: str, name: str) -> StoreError:
    """A named, one-line error for a database failure's text."""
    lowered = detail.lower()
    if "not a database" in lowered or "malformed" in lowered or "encrypted" in lowered:
        return StoreCorruptError(f"{name}: not a readable hostler event log ({detail})")
    if "locked" in lowered or "busy" in lowered:
        return StoreBusyError(f"{name}: the database stayed locked by another writer ({detail})")
    if "full" in lowered or "no space" in lowered:
        return StoreFullError(
            f"{name}: the disk is full ({detail}); free space where the log lives"
        )
    if "readonly" in lowered or "read-only" in lowered:
        return StoreError(f"{name}: the database cannot be written ({detail})")
    return StoreError(f"{name}: database error ({detail})")


_SQLITE_VERSION = "SELECT coalesce(max(version), 0) FROM events WHERE stream_id = ?"
_SQLITE_ROWS = (
    "SELECT seq, stream_id, version, type, schema_version, payload, metadata, recorded_at "
    "FROM events WHERE stream_id = ? AND version > ? ORDER BY version"
)
_SQLITE_INSERT = (
    "INSERT INTO events (stream_id, version, type, schema_version, payload, metadata, "
    "recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
)

_SQLITE_INSERT_EXACT = (
    "INSERT INTO events (seq, stream_id, version, type, schema_version, payload, metadata, "
    "recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)


class SqliteWriter:
    """The SQLite write path on the pooled connection's driver connection."""

    def __init__(self, engine: sa.Engine, name: str) -> None:
        self._name = name
        try:
            self._pooled = engine.raw_connection()  # the connect hook has set the pragmas
        except sa.exc.DBAPIError as exc:
            raise translate(str(exc.orig), name) from exc
        driver = self._pooled.driver_connection
        if not isinstance(driver, sqlite3.Connection):  # pragma: no cover - guarded by caller
            raise TypeError("SqliteWriter needs a sqlite3 connection")
        self._db = driver

    def _run(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        try:
            return self._db.execute(sql, params)
        except sqlite3.IntegrityError as exc:
            if getattr(exc, "sqlite_errorname", "") == "SQLITE_CONSTRAINT_UNIQUE":
                raise UniqueViolation(str(exc)) from exc
            raise translate(str(exc), self._name) from exc
        except sqlite3.Error as exc:
            raise translate(str(exc), self._name) from exc

    def begin(self) -> None:
        """See :class:`Writer`."""
        self._run("BEGIN IMMEDIATE")

    def commit(self) -> None:
        """See :class:`Writer`."""
        self._run("COMMIT")

    def rollback(self) -> None:
        """See :class:`Writer`."""
        if self._db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")

    def savepoint(self) -> None:
        """See :class:`Writer`."""
        self._run("SAVEPOINT append")

    def release(self) -> None:
        """See :class:`Writer`."""
        self._run("RELEASE append")

    def rollback_to_savepoint(self) -> None:
        """See :class:`Writer`."""
        self._run("ROLLBACK TO append")
        self._run("RELEASE append")

    def stream_version(self, stream_id: str) -> int:
        """See :class:`Writer`."""
        return int(self._run(_SQLITE_VERSION, (stream_id,)).fetchone()[0])

    def insert(self, rows: Sequence[Row]) -> tuple[int, ...]:
        """See :class:`Writer`."""
        seqs = []
        for stream_id, version, type_name, schema_version, _, payload, _, meta, at in rows:
            cursor = self._run(
                _SQLITE_INSERT, (stream_id, version, type_name, schema_version, payload, meta, at)
            )
            seqs.append(int(cursor.lastrowid or 0))
        return tuple(seqs)

    def row_count(self) -> int:
        """How many rows the log holds, inside this transaction (import only)."""
        return int(self._run("SELECT count(*) FROM events").fetchone()[0])

    def insert_exact(self, row: Sequence[Any]) -> None:
        """Insert one row with its own seq and stored values, as given (import only).

        ``row`` is ``(seq, stream_id, version, type, schema_version, payload text, metadata
        text, recorded_at)``.
        """
        self._run(_SQLITE_INSERT_EXACT, tuple(row))

    def stream_rows(self, stream_id: str, after_version: int) -> list[StoredRow]:
        """See :class:`Writer`."""
        cursor = self._run(_SQLITE_ROWS, (stream_id, after_version))
        return [
            (seq, sid, version, kind, schema, json.loads(payload), json.loads(meta), at)
            for seq, sid, version, kind, schema, payload, meta, at in cursor.fetchall()
        ]

    def close(self) -> None:
        """See :class:`Writer`."""
        self.rollback()
        with contextlib.suppress(sqlite3.Error):
            self._pooled.close()


class CoreWriter:
    """The write path through SQLAlchemy Core, for every other database."""

    def __init__(self, engine: sa.Engine, name: str) -> None:
        self._name = name
        self._conn = engine.connect()
        self._tx: sa.RootTransaction | None = None
        self._savepoint: sa.NestedTransaction | None = None
        self._version = sa.select(sa.func.coalesce(sa.func.max(events.c.version), 0)).where(
            events.c.stream_id == sa.bindparam("stream_id")
        )
        self._insert = events.insert().returning(events.c.seq, sort_by_parameter_order=True)

    def _guard(self, exc: sa.exc.DBAPIError) -> Exception:
        orig = exc.orig
        if isinstance(exc, sa.exc.IntegrityError) and "unique" in str(orig).lower():
            return UniqueViolation(str(orig))
        return translate(str(orig), self._name)

    def begin(self) -> None:
        """See :class:`Writer`."""
        try:
            self._tx = self._conn.begin()
        except sa.exc.DBAPIError as exc:
            raise self._guard(exc) from exc

    def commit(self) -> None:
        """See :class:`Writer`."""
        assert self._tx is not None  # noqa: S101 - begin() came first
        try:
            self._tx.commit()
        except sa.exc.DBAPIError as exc:
            raise self._guard(exc) from exc
        finally:
            self._tx = None

    def rollback(self) -> None:
        """See :class:`Writer`."""
        if self._tx is not None:
            with contextlib.suppress(sa.exc.SQLAlchemyError):
                self._tx.rollback()
            self._tx = None

    def savepoint(self) -> None:
        """See :class:`Writer`."""
        self._savepoint = self._conn.begin_nested()

    def release(self) -> None:
        """See :class:`Writer`."""
        assert self._savepoint is not None  # noqa: S101 - savepoint() came first
        self._savepoint.commit()
        self._savepoint = None

    def rollback_to_savepoint(self) -> None:
        """See :class:`Writer`."""
        assert self._savepoint is not None  # noqa: S101 - savepoint() came first
        self._savepoint.rollback()
        self._savepoint = None

    def stream_version(self, stream_id: str) -> int:
        """See :class:`Writer`."""
        try:
            return int(self._conn.execute(self._version, {"stream_id": stream_id}).scalar_one())
        except sa.exc.DBAPIError as exc:
            raise self._guard(exc) from exc

    def insert(self, rows: Sequence[Row]) -> tuple[int, ...]:
        """See :class:`Writer`."""
        values = [
            {
                "stream_id": stream_id,
                "version": version,
                "type": type_name,
                "schema_version": schema_version,
                "payload": payload,
                "metadata": meta,
                "recorded_at": at,
            }
            for stream_id, version, type_name, schema_version, payload, _, meta, _, at in rows
        ]
        try:
            return tuple(self._conn.execute(self._insert, values).scalars().all())
        except sa.exc.DBAPIError as exc:
            raise self._guard(exc) from exc

    def stream_rows(self, stream_id: str, after_version: int) -> list[StoredRow]:
        """See :class:`Writer`."""
        stmt = (
            sa.select(*ROW_COLUMNS)
            .where(events.c.stream_id == stream_id, events.c.version > after_version)
            .order_by(events.c.version)
        )
        try:
            return [tuple(row) for row in self._conn.execute(stmt)]
        except sa.exc.DBAPIError as exc:
            raise self._guard(exc) from exc

    def close(self) -> None:
        """See :class:`Writer`."""
        self.rollback()
        with contextlib.suppress(sa.exc.SQLAlchemyError):
            self._conn.close()
