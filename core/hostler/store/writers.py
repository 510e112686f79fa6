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
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import sqlalchemy as sa

from hostler.errors import (
    ExportFormatError,
    StoreBusyError,
    StoreCorruptError,
    StoreError,
    StoreFullError,
    StoreUnavailableError,
)
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

    def row_count(self) -> int:
        """How many rows the log holds, inside this transaction (import only)."""

    def insert_exact(self, row: Sequence[Any]) -> None:
        """Insert one row with its own seq and stored values, as given (import only).

        ``row`` is ``(seq, stream_id, version, type, schema_version, payload text, metadata
        text, recorded_at)``.
        """

    def after_import(self) -> None:
        """Move the seq counter past the imported rows, so that appends continue after them."""

    def close(self) -> None:
        """Give the connection back; never raises."""


#: SQLSTATE classes and codes (a database server's own words for a failure) -> the error.
_BY_SQLSTATE: tuple[tuple[str, type[StoreError], str], ...] = (
    ("08", StoreUnavailableError, "the database server cannot be reached"),
    ("57P", StoreUnavailableError, "the database server is stopping or starting"),
    ("55P03", StoreBusyError, "a lock on the log stayed held by another session"),
    ("40P01", StoreBusyError, "a deadlock with another writer"),
    ("53100", StoreFullError, "the database server's disk is full"),
)


#: Words of a failure's text (SQLite's, or a server's without a SQLSTATE) -> the error.
_BY_TEXT: tuple[tuple[tuple[str, ...], type[StoreError], str], ...] = (
    (
        ("not a database", "malformed", "encrypted"),
        StoreCorruptError,
        "not a readable hostler event log",
    ),
    (("locked", "busy"), StoreBusyError, "the database stayed locked by another writer"),
    (("full", "no space"), StoreFullError, "the disk is full"),
    (("readonly", "read-only"), StoreError, "the database cannot be written"),
)  # fmt: skip


def translate(detail: str, name: str, sqlstate: str | None = None) -> StoreError:
    """A named, one-line error for a database failure's text (and SQLSTATE, where known)."""
    detail = " ".join(detail.split())  # a server's message may span lines
    for prefix, kind, what in _BY_SQLSTATE:
        if sqlstate and sqlstate.startswith(prefix):
            return kind(f"{name}: {what} ({detail})")
    lowered = detail.lower()
    for words, kind, what in _BY_TEXT:
        if any(word in lowered for word in words):
            fix = "; free space where the log lives" if kind is StoreFullError else ""
            return kind(f"{name}: {what} ({detail}){fix}")
    if sqlstate is None and ("connection" in lowered or "server closed" in lowered):
        return StoreUnavailableError(f"{name}: the database server cannot be reached ({detail})")
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
            raise translate(str(exc.orig), name, getattr(exc.orig, "sqlstate", None)) from exc
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
        """See :class:`Writer`."""
        return int(self._run("SELECT count(*) FROM events").fetchone()[0])

    def insert_exact(self, row: Sequence[Any]) -> None:
        """See :class:`Writer`."""
        self._run(_SQLITE_INSERT_EXACT, tuple(row))

    def after_import(self) -> None:
        """See :class:`Writer` (AUTOINCREMENT already continues after the largest seq)."""

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
    """The write path through SQLAlchemy Core, for every other database.

    A connection is taken from the pool for each transaction and given back at its end: the
    pool checks it first (``pool_pre_ping``), so a server restarted since the last write costs
    no failed append, and a lost connection is never kept.
    """

    def __init__(self, engine: sa.Engine, name: str) -> None:
        self._name = name
        self._engine = engine
        self._conn: sa.Connection | None = None
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
        return translate(str(orig), self._name, getattr(orig, "sqlstate", None))

    @contextlib.contextmanager
    def _guarded(self) -> Iterator[None]:
        """A database failure inside, named (:func:`translate`) or a :class:`UniqueViolation`."""
        try:
            yield
        except sa.exc.DBAPIError as exc:
            raise self._guard(exc) from exc

    def _connection(self) -> sa.Connection:
        assert self._conn is not None  # noqa: S101 - begin() came first
        return self._conn

    def begin(self) -> None:
        """See :class:`Writer`."""
        try:
            self._conn = self._engine.connect()
            self._tx = self._conn.begin()
        except sa.exc.DBAPIError as exc:
            self._give_back()
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
            self._give_back()

    def rollback(self) -> None:
        """See :class:`Writer`."""
        if self._tx is not None:
            with contextlib.suppress(sa.exc.SQLAlchemyError):
                self._tx.rollback()
            self._tx = None
        self._give_back()

    def _give_back(self) -> None:
        conn, self._conn, self._savepoint = self._conn, None, None
        if conn is not None:
            with contextlib.suppress(sa.exc.SQLAlchemyError):
                conn.close()

    def savepoint(self) -> None:
        """See :class:`Writer`."""
        with self._guarded():
            self._savepoint = self._connection().begin_nested()

    def release(self) -> None:
        """See :class:`Writer`."""
        assert self._savepoint is not None  # noqa: S101 - savepoint() came first
        try:
            self._savepoint.commit()
        except sa.exc.DBAPIError as exc:
            raise self._guard(exc) from exc
        finally:
            self._savepoint = None

    def rollback_to_savepoint(self) -> None:
        """See :class:`Writer`."""
        assert self._savepoint is not None  # noqa: S101 - savepoint() came first
        try:
            self._savepoint.rollback()
        except sa.exc.DBAPIError as exc:
            raise self._guard(exc) from exc
        finally:
            self._savepoint = None

    def stream_version(self, stream_id: str) -> int:
        """See :class:`Writer`."""
        conn = self._connection()
        with self._guarded():
            return int(conn.execute(self._version, {"stream_id": stream_id}).scalar_one())

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
        with self._guarded():
            return tuple(self._connection().execute(self._insert, values).scalars().all())

    def stream_rows(self, stream_id: str, after_version: int) -> list[StoredRow]:
        """See :class:`Writer`."""
        stmt = (
            sa.select(*ROW_COLUMNS)
            .where(events.c.stream_id == stream_id, events.c.version > after_version)
            .order_by(events.c.version)
        )
        with self._guarded():
            return [tuple(row) for row in self._connection().execute(stmt)]

    def row_count(self) -> int:
        """See :class:`Writer`."""
        with self._guarded():
            return int(self._connection().execute(_COUNT).scalar_one())

    def insert_exact(self, row: Sequence[Any]) -> None:
        """See :class:`Writer`: payload and metadata go in as the text they were stored as."""
        conn = self._connection()
        json_cast = conn.dialect.name == "postgresql"
        statement = _EXACT_PG if json_cast else _EXACT
        try:
            conn.execute(statement, dict(zip(_EXACT_NAMES, row, strict=True)))
        except sa.exc.DataError as exc:  # SQLSTATE class 22: a damaged row's text is not JSON
            detail = " ".join(str(exc.orig).split())
            raise ExportFormatError(
                f"seq {row[0]}: cannot be stored on {self._name} ({detail}); a damaged row "
                "can be imported into a SQLite file only; nothing was imported"
            ) from exc
        except sa.exc.DBAPIError as exc:
            raise self._guard(exc) from exc

    def after_import(self) -> None:
        """See :class:`Writer`."""
        conn = self._connection()
        if conn.dialect.name != "postgresql":
            return
        with self._guarded():
            conn.exec_driver_sql(
                "SELECT setval(pg_get_serial_sequence('events', 'seq'), "
                "(SELECT coalesce(max(seq), 0) + 1 FROM events), false)"
            )

    def close(self) -> None:
        """See :class:`Writer`."""
        self.rollback()


_COUNT = sa.select(sa.func.count()).select_from(events)
_EXACT_NAMES = (
    "seq", "stream_id", "version", "type", "schema_version", "payload", "metadata", "recorded_at"
)  # fmt: skip
_EXACT = sa.text(
    "INSERT INTO events (seq, stream_id, version, type, schema_version, payload, metadata, "
    "recorded_at) VALUES (:seq, :stream_id, :version, :type, :schema_version, :payload, "
    ":metadata, :recorded_at)"
)
# PostgreSQL's json keeps the text as given (spaces, key order): state and replay read the same
_EXACT_PG = sa.text(
    "INSERT INTO events (seq, stream_id, version, type, schema_version, payload, metadata, "
    "recorded_at) VALUES (:seq, :stream_id, :version, :type, :schema_version, "
    "CAST(:payload AS json), CAST(:metadata AS json), :recorded_at)"
)
