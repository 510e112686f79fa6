"""Everything PostgreSQL-specific about the event log, in dialect hooks.

(SQLite's live in :mod:`hostler.store.connect`.) Three guarantees the rest of the store relies
on, each one statement here:

* **Commit order is seq order.** Every write transaction on the writer engine takes one
  transaction-level advisory lock (:data:`WRITE_LOCK`) before it draws a seq, and holds it until
  its commit is visible: writers anywhere (threads, processes, hosts) commit one at a time, as on
  SQLite's ``BEGIN IMMEDIATE``. A reader that has seen seq *n* has therefore seen every committed
  row below *n*; a tail reading ``after_seq`` misses nothing. (A rolled-back append burns its
  seqs: gaps are possible, reordering is not.) Group commit still shares one commit among the
  appends of one process.
* **One owner**: a session-level advisory lock (:func:`owner_lock_key`) held on a connection of
  its own for as long as the owner's store is open; the server drops it when that session ends
  (a killed daemon included).
* **Waits are bounded**: a writer waits ``lock_timeout`` for the write lock (then
  :class:`~hostler.errors.StoreBusyError`), and a transaction left idle (a writer stopped
  mid-commit by SIGSTOP) is cut after :data:`IDLE_IN_TRANSACTION_MS` so that it cannot hold
  every other host's writes for longer.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from hostler.errors import StoreLockedError
from hostler.store.writers import translate

__all__ = [
    "HOST_SCHEMA_PREFIX",
    "IDLE_IN_TRANSACTION_MS",
    "WRITE_LOCK",
    "PgOwnerLock",
    "create_host_schema",
    "fleet_hosts",
    "host_schema",
    "install_postgres_hooks",
    "owner_lock_key",
    "write_lock_key",
]


def _key(text: str) -> int:
    """A signed 64-bit advisory-lock key for a name (stable across versions and hosts)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big", signed=True)


#: The advisory lock every write transaction of a log holds: commits happen in seq order.
WRITE_LOCK = _key("hostler.events.write")

#: Where a fleet host's events live: a schema of its own in the shared database.
HOST_SCHEMA_PREFIX = "hostler_host_"


def host_schema(host: str) -> str:
    """The schema of ``host``'s part of a shared log (its name checked by the caller)."""
    return f"{HOST_SCHEMA_PREFIX}{host}"


def write_lock_key(schema: str | None) -> int:
    """The write lock of one log: the database's own (None) or a host's schema."""
    return WRITE_LOCK if schema is None else _key(f"hostler.events.write:{schema}")


#: A write transaction left idle this long (a stopped writer) is cut by the server.
IDLE_IN_TRANSACTION_MS = 60_000


def owner_lock_key(scope: str) -> int:
    """The advisory lock of the log's owner for ``scope`` ('' = the whole log; a host's name)."""
    return _key(f"hostler.events.owner:{scope}")


def install_postgres_hooks(
    engine: sa.Engine, *, writer: bool, wait_ms: int, schema: str | None = None
) -> None:
    """Session settings on connect; on the writer engine, the write lock at every BEGIN.

    ``schema``: a fleet host's part of the log; every statement of these engines then finds
    ``events`` there (``search_path``), so the store's SQL is the same for every host.
    """
    lock = write_lock_key(schema)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: object) -> None:
        with dbapi_conn.cursor() as cursor:
            cursor.execute("SET application_name = 'hostler'")
            cursor.execute(f"SET lock_timeout = {int(wait_ms)}")
            cursor.execute(f"SET idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_MS}")
            if schema is not None:
                cursor.execute(f'SET search_path TO "{schema}"')
        dbapi_conn.commit()

    if writer:

        @event.listens_for(engine, "begin")
        def _on_begin(conn: sa.Connection) -> None:
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({lock})")


def create_host_schema(engine: sa.Engine, schema: str) -> None:
    """Make a host's schema if it is not there yet (its tables come from the migrations)."""
    with engine.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')


def fleet_hosts(engine: sa.Engine) -> list[str]:
    """The hosts that have a part of the log in this database, by name."""
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT table_schema FROM information_schema.tables WHERE table_name = 'events' "
            "AND starts_with(table_schema, %(p)s) ORDER BY table_schema",
            {"p": HOST_SCHEMA_PREFIX},
        ).all()
    return [str(row[0])[len(HOST_SCHEMA_PREFIX) :] for row in rows]


class PgOwnerLock:
    """The owner's advisory lock on a PostgreSQL log, held on a connection of its own."""

    def __init__(self, engine: sa.Engine, *, scope: str, where: str) -> None:
        """``scope``: '' for the whole log, else a host's schema."""
        self._engine = engine
        self._scope = scope
        self._where = where
        self._key = owner_lock_key(scope)
        self._conn: sa.Connection | None = None
        self._take()

    def _take(self) -> None:
        try:
            self._conn = self._engine.connect()
            held = self._conn.exec_driver_sql(f"SELECT pg_try_advisory_lock({self._key})").scalar()
            self._conn.commit()
        except sa.exc.DBAPIError as exc:
            self.release()
            orig = exc.orig
            raise translate(str(orig), self._where, getattr(orig, "sqlstate", None)) from exc
        except BaseException:
            self.release()
            raise
        if not held:
            self.release()
            whose = ""
            if self._scope.startswith(HOST_SCHEMA_PREFIX):
                whose = f" for host {self._scope[len(HOST_SCHEMA_PREFIX) :]!r}"
            raise StoreLockedError(
                f"{self._where}: the event log is owned by another hostler daemon{whose}; "
                "stop it, or give this one a host name of its own ([daemon] host_name, "
                "--host-name; docs/fleet.md)"
            )

    def confirm(self) -> None:
        """Make sure the lock is still held; taken again when its session was lost.

        A server restart (or a cut connection) ends the session that held the lock, and the
        server drops it. The store calls this before writing on a new connection (after any
        failure): the lock is taken again, or :class:`~hostler.errors.StoreLockedError` says
        that another daemon took it meanwhile and this one must not write.
        """
        if self._conn is not None:
            try:
                self._conn.exec_driver_sql("SELECT 1").scalar()
                self._conn.commit()
            except sa.exc.DBAPIError:
                self.release()
            else:
                return
        self._take()

    def release(self) -> None:
        """Drop the lock now (idempotent): the next owner is admitted at once."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        with contextlib.suppress(sa.exc.SQLAlchemyError):
            conn.exec_driver_sql(f"SELECT pg_advisory_unlock({self._key})")
            conn.commit()
        # never back into the pool: closing the session drops the lock whatever happened above
        with contextlib.suppress(sa.exc.SQLAlchemyError):
            conn.invalidate()
            conn.close()
