"""Engines for the event log: SQLite pragmas and path checks, or any SQLAlchemy URL.

Everything SQLite-specific lives here, in the dialect hooks; the rest of the store speaks
dialect-neutral SQLAlchemy Core.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from hostler.errors import StoreDriverError, StoreForeignError, StorePathError, StoreUrlError
from hostler.paths import masked, user_path
from hostler.store.migrate import (
    EVENTS_COLUMNS,
    SQLITE_OBJECTS,
    schema_too_new,
    shipped_revisions,
)
from hostler.store.postgres import install_postgres_hooks
from hostler.store.writers import translate

__all__ = [
    "Engines",
    "check_server_url",
    "display_name",
    "make_engines",
    "parse_url",
    "shown_url",
    "sqlite_path_of",
]

#: How long a writer waits for another process's write transaction before giving up (the
#: daemon waits less, see ``busy_timeout``, and retries itself so a signal is never kept waiting).
BUSY_TIMEOUT_MS = 30_000


@dataclass(frozen=True)
class Engines:
    """The writer and reader engines of one log, and its file when it is SQLite."""

    writer: sa.Engine
    reader: sa.Engine
    sqlite_file: Path | None

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.writer.dispose()
        self.reader.dispose()


#: The package to install for a database kind whose default driver is missing.
_DRIVER_PACKAGES = {
    "postgresql": "psycopg[binary]",
    "mysql": "mysqlclient",
    "mariadb": "mariadb",
    "oracle": "oracledb",
    "mssql": "pyodbc",
}


def parse_url(text: str) -> sa.URL:
    """A database URL, or :class:`StoreUrlError` in one line (the password never shown)."""
    try:
        return sa.make_url(text)
    except (sa.exc.ArgumentError, ValueError) as exc:
        shown = text.rsplit("@", maxsplit=1)[-1].split("?", 1)[0][:200]
        raise StoreUrlError(
            f"{shown}: not a database URL ({exc}); give a file path or "
            "sqlite:///PATH, postgresql://USER@HOST/DB ..."
        ) from None


def display_name(target: str | os.PathLike[str]) -> str:
    """How a log is named in messages: its path, or its URL without a password anywhere."""
    text = os.fspath(target)
    if "://" not in text:
        return text
    return shown_url(parse_url(text))


def shown_url(url: sa.URL) -> str:
    """A URL as messages show it, its passwords hidden by :func:`hostler.paths.masked`."""
    return masked(url.render_as_string(hide_password=False))


def check_server_url(text: str) -> sa.URL:
    """A database URL whose kind SQLAlchemy knows; :class:`StoreUrlError` in one line if not.

    The driver is checked when the log is opened (:class:`StoreDriverError` names its package).
    """
    url = parse_url(text)
    try:
        url.get_dialect()
    except sa.exc.NoSuchModuleError:
        raise _unknown_kind(url) from None
    except ImportError:
        pass  # the kind is known, its driver missing: said at open, naming the package
    return url


def _unknown_kind(url: sa.URL) -> StoreUrlError:
    """The refusal of a URL whose database kind SQLAlchemy does not know."""
    return StoreUrlError(
        f"{shown_url(url)}: SQLAlchemy knows no database kind {url.drivername!r}; use a file "
        "path, sqlite:///PATH or a server URL such as postgresql://USER@HOST/DB"
    )


def sqlite_path_of(target: str | os.PathLike[str]) -> Path | None:
    """The database file a target names, or None when it is a non-SQLite URL."""
    text = os.fspath(target)
    if "://" not in text:
        return _usable(text, text)
    url = parse_url(text)
    if url.get_backend_name() != "sqlite":
        return None
    if not url.database or url.database == ":memory:":
        raise StorePathError(f"{text}: hostler needs a file for its event log, not memory")
    return _usable(url.database, text)


def _usable(path: str | Path, given: str, *, resolve: bool = False) -> Path:
    """A log's path, ``~`` expanded (and resolved); one line naming what was given if not."""
    try:
        return user_path(path, resolve=resolve)
    except ValueError as exc:
        raise StorePathError(f"{given[:200]}: {exc}") from None


def make_engines(
    target: str | os.PathLike[str],
    *,
    synchronous: str = "FULL",
    shared: bool = False,
    busy_timeout: float = BUSY_TIMEOUT_MS / 1000,
    max_bytes: int | None = None,
    schema: str | None = None,
) -> Engines:
    """Build the writer and reader engines for a path or SQLAlchemy URL.

    For SQLite the file is checked and created first (mode 0600, or 0660 when ``shared``
    with the directory's group), so that a bad path fails with a message naming it instead of
    SQLite's bare ``unable to open database file``. ``schema``: on PostgreSQL, a fleet host's
    part of the database (:mod:`hostler.store.postgres`).
    """
    path = sqlite_path_of(target)
    wait_ms = round(busy_timeout * 1000)
    if path is None:
        url = parse_url(os.fspath(target))
        writer = _server_engine(url)
        reader = _server_engine(url)
        if url.get_backend_name() == "postgresql":
            install_postgres_hooks(writer, writer=True, wait_ms=wait_ms, schema=schema)
            install_postgres_hooks(reader, writer=False, wait_ms=wait_ms, schema=schema)
        return Engines(writer, reader, None)
    path = _usable(path, str(path), resolve=True)
    _prepare_sqlite_file(path, shared=shared, busy_timeout=busy_timeout)
    url = sa.URL.create("sqlite", database=str(path))
    connect_args: dict[str, Any] = {
        "timeout": busy_timeout,
        "check_same_thread": False,
    }
    writer = sa.create_engine(url, connect_args=connect_args, pool_size=2, max_overflow=4)
    reader = sa.create_engine(url, connect_args=connect_args, pool_size=4, max_overflow=8)
    _install_sqlite_hooks(
        writer,
        begin="BEGIN IMMEDIATE",
        synchronous=synchronous,
        wait_ms=wait_ms,
        max_bytes=max_bytes,
    )
    _install_sqlite_hooks(reader, begin="BEGIN", synchronous=synchronous, wait_ms=wait_ms)
    return Engines(writer, reader, path)


def _server_engine(url: sa.URL) -> sa.Engine:
    """An engine for a database server's URL; a missing dialect or driver said in one line."""
    shown = shown_url(url)
    try:
        return sa.create_engine(url, pool_pre_ping=True)
    except sa.exc.NoSuchModuleError:
        raise _unknown_kind(url) from None
    except ImportError as exc:
        missing = exc.name or url.drivername
        package = missing
        if "+" not in url.drivername:  # the kind's default driver: name its usual package
            package = _DRIVER_PACKAGES.get(url.get_backend_name(), missing)
        raise StoreDriverError(
            f"{shown}: the database driver {missing!r} is not installed; install it next to "
            f"hostler (pip install '{package}') or name another driver in the URL"
        ) from None


def _prepare_sqlite_file(path: Path, *, shared: bool, busy_timeout: float) -> None:
    if path.is_dir():
        raise StorePathError(f"{path}: is a directory, not an event log file")
    _refuse_foreign(path, busy_timeout)
    parent = path.parent
    try:
        if not shared:
            parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise StorePathError(f"{parent}: cannot create directory ({exc.strerror})") from exc
    if not parent.is_dir():
        raise StorePathError(f"{parent}: is not a directory")
    file_mode = 0o660 if shared else 0o600
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, file_mode)
    except OSError as exc:
        raise StorePathError(f"{path}: cannot open for writing ({exc.strerror})") from exc
    os.close(fd)
    # SQLite also creates the -wal and -shm files beside it; it needs the directory writable.
    probe = parent / f".{path.name}.probe-{os.getpid()}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, file_mode))
        probe.unlink()
    except FileExistsError:
        probe.unlink(missing_ok=True)
    except OSError as exc:
        raise StorePathError(
            f"{parent}: cannot write in the directory of the event log ({exc.strerror})"
        ) from exc
    info = path.stat()
    mode = stat.S_IMODE(info.st_mode)
    if mode != file_mode and (mode & ~file_mode or shared) and info.st_uid == os.geteuid():
        # A log carries prompts' metadata and pids: keep it to its owner (or, shared, to its
        # group, which must also be able to write it whatever this process's umask said).
        path.chmod(file_mode)


def _refuse_foreign(path: Path, busy_timeout: float) -> None:
    """Refuse, before anything writes to it, a SQLite file that is neither empty nor hostler's.

    hostler's own log holds only the schema objects its migrations make (tables, views,
    indexes, triggers; SQLite's ``sqlite_*`` aside), an ``events`` table with hostler's
    columns, and an ``alembic_version`` at a revision this hostler ships. A file holding
    anything else is another application's (:class:`StoreForeignError`, naming some of what
    is not hostler's); a log of a newer hostler, at a revision not shipped here, is refused as
    too new (:class:`StoreSchemaError`).

    Opened read-only: no journal mode, no chmod, no table is touched. A file that is not SQLite
    at all is left to the open that follows (it reports it as corrupt).
    """
    try:
        if not path.is_file() or path.stat().st_size == 0:
            return
    except OSError:
        return
    schema = _schema_at(path, busy_timeout)
    if schema is None:
        return  # empty (it becomes a log), or not SQLite (the open reports it as corrupt)
    objects, revisions, columns = schema
    revision = revisions[0] if revisions is not None and len(revisions) == 1 else None
    ours = ("table", "events") in objects and columns >= EVENTS_COLUMNS
    if revision is not None and revision not in shipped_revisions() and ours:
        raise schema_too_new(str(path), revision)  # what else it holds, that hostler made
    unknown = objects - SQLITE_OBJECTS
    if unknown:
        why = _listing(unknown)
    elif revisions is None:
        why = "an alembic_version table that is not hostler's"
    elif revision is None:
        why = "no schema revision" if not revisions else "more than one schema revision"
    elif revision not in shipped_revisions():
        why = f"schema revision {revision!r}, not one of hostler's"
    elif not ours:
        why = "a table events that is not hostler's" if columns else "no events table"
    else:
        return
    raise StoreForeignError(
        f"{path}: another application's database ({why}); hostler writes only into an empty "
        "database or its own log: choose another file"
    )


_Schema = tuple[set[tuple[str, str]], list[str] | None, set[str]]


def _schema_at(path: Path, busy_timeout: float) -> _Schema | None:
    """:func:`_schema_of` a file opened read-only; None when it is not SQLite at all.

    It waits for a held lock as long as the caller would (the daemon's wait is short): a lock
    held past it is :class:`~hostler.errors.StoreBusyError`, never a silent wait.
    """
    try:
        conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=busy_timeout)
        try:
            return _schema_of(conn)
        finally:
            conn.close()
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            raise translate(str(exc), str(path)) from None
        return None
    except sqlite3.DatabaseError:
        return None


def _schema_of(conn: sqlite3.Connection) -> _Schema | None:
    """(objects, alembic revisions, columns of ``events``) of a file; None when it is empty.

    The revisions are None when ``alembic_version`` cannot be read as alembic writes it.
    """
    objects = {
        (str(kind), str(name))
        for kind, name in conn.execute("SELECT type, name FROM sqlite_master")
        if not str(name).lower().startswith("sqlite_")  # SQLite's own: no one else can make one
    }
    if not objects:
        return None
    revisions: list[str] | None = []
    if ("table", "alembic_version") in objects:
        try:
            rows = conn.execute("SELECT version_num FROM alembic_version LIMIT 4").fetchall()
            revisions = [str(row[0]) for row in rows]
        except sqlite3.OperationalError:  # no such column: an alembic_version of another kind
            revisions = None
    columns: set[str] = set()
    if ("table", "events") in objects:
        columns = {str(row[1]) for row in conn.execute("PRAGMA table_info(events)")}
    return objects, revisions, columns


_KINDS = {"table": "tables", "view": "views", "index": "indexes", "trigger": "triggers"}


def _listing(objects: set[tuple[str, str]], shown: int = 5) -> str:
    """``tables: a, b; views: c`` for the first ``shown`` objects, by kind then name."""
    order = list(_KINDS)
    ranked = sorted(objects, key=lambda o: (order.index(o[0]) if o[0] in order else 9, o))
    groups: dict[str, list[str]] = {}
    for kind, name in ranked[:shown]:
        groups.setdefault(_KINDS.get(kind, f"{kind}s"), []).append(name)
    text = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in groups.items())
    return text + (", ..." if len(ranked) > shown else "")


def _install_sqlite_hooks(
    engine: sa.Engine, *, begin: str, synchronous: str, wait_ms: int, max_bytes: int | None = None
) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: object) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
        cursor = dbapi_conn.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout={int(wait_ms)}")
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA synchronous={synchronous}")
            cursor.execute("PRAGMA foreign_keys=ON")
            if max_bytes is not None:
                # a cap on the file: past it, writes fail as on a full disk (store.full)
                page = int(cursor.execute("PRAGMA page_size").fetchone()[0])
                cursor.execute(f"PRAGMA max_page_count={max(1, max_bytes // page)}")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql(begin)
