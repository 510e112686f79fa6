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

__all__ = ["Engines", "make_engines", "parse_url", "sqlite_path_of"]

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
        shown = text.rsplit("@", maxsplit=1)[-1][:200]
        raise StoreUrlError(
            f"{shown}: not a database URL ({exc}); give a file path or "
            "sqlite:///PATH, postgresql://USER@HOST/DB ..."
        ) from None


def sqlite_path_of(target: str | os.PathLike[str]) -> Path | None:
    """The database file a target names, or None when it is a non-SQLite URL."""
    text = os.fspath(target)
    if "://" not in text:
        return Path(text).expanduser()
    url = parse_url(text)
    if url.get_backend_name() != "sqlite":
        return None
    if not url.database or url.database == ":memory:":
        raise StorePathError(f"{text}: hostler needs a file for its event log, not memory")
    return Path(url.database).expanduser()


def make_engines(
    target: str | os.PathLike[str],
    *,
    synchronous: str = "FULL",
    shared: bool = False,
    busy_timeout: float = BUSY_TIMEOUT_MS / 1000,
) -> Engines:
    """Build the writer and reader engines for a path or SQLAlchemy URL.

    For SQLite the file is checked and created first (mode 0600, or 0660 when ``shared``
    with the directory's group), so that a bad path fails with a message naming it instead of
    SQLite's bare ``unable to open database file``.
    """
    path = sqlite_path_of(target)
    if path is None:
        url = parse_url(os.fspath(target))
        writer = _server_engine(url)
        reader = _server_engine(url)
        return Engines(writer, reader, None)
    path = path.resolve()
    _prepare_sqlite_file(path, shared=shared)
    url = sa.URL.create("sqlite", database=str(path))
    connect_args: dict[str, Any] = {
        "timeout": busy_timeout,
        "check_same_thread": False,
    }
    writer = sa.create_engine(url, connect_args=connect_args, pool_size=2, max_overflow=4)
    reader = sa.create_engine(url, connect_args=connect_args, pool_size=4, max_overflow=8)
    wait_ms = round(busy_timeout * 1000)
    _install_sqlite_hooks(writer, begin="BEGIN IMMEDIATE", synchronous=synchronous, wait_ms=wait_ms)
    _install_sqlite_hooks(reader, begin="BEGIN", synchronous=synchronous, wait_ms=wait_ms)
    return Engines(writer, reader, path)


def _server_engine(url: sa.URL) -> sa.Engine:
    """An engine for a database server's URL; a missing dialect or driver said in one line."""
    shown = url.render_as_string(hide_password=True)
    try:
        return sa.create_engine(url, pool_pre_ping=True)
    except sa.exc.NoSuchModuleError:
        raise StoreUrlError(
            f"{shown}: SQLAlchemy knows no database kind {url.drivername!r}; use a file "
            "path, sqlite:///PATH or a server URL such as postgresql://USER@HOST/DB"
        ) from None
    except ImportError as exc:
        missing = exc.name or url.drivername
        package = missing
        if "+" not in url.drivername:  # the kind's default driver: name its usual package
            package = _DRIVER_PACKAGES.get(url.get_backend_name(), missing)
        raise StoreDriverError(
            f"{shown}: the database driver {missing!r} is not installed; install it next to "
            f"hostler (pip install '{package}') or name another driver in the URL"
        ) from None


def _prepare_sqlite_file(path: Path, *, shared: bool = False) -> None:
    if path.is_dir():
        raise StorePathError(f"{path}: is a directory, not an event log file")
    _refuse_foreign(path)
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


def _refuse_foreign(path: Path) -> None:
    """Refuse, before anything writes to it, a SQLite file holding another application's data.

    Opened read-only: no journal mode, no chmod, no table is touched. A file that is not SQLite
    at all is left to the open that follows (it reports it as corrupt).
    """
    try:
        if not path.is_file() or path.stat().st_size == 0:
            return
    except OSError:
        return
    uri = f"{path.resolve().as_uri()}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
        try:
            rows = conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            ).fetchall()
        finally:
            conn.close()
    except sqlite3.DatabaseError:
        return
    tables = sorted(str(row[0]) for row in rows)
    if not tables or "alembic_version" in tables:
        return
    shown = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")
    raise StoreForeignError(
        f"{path}: another application's database (tables: {shown}); hostler writes only into "
        "an empty database or its own log: choose another file"
    )


def _install_sqlite_hooks(engine: sa.Engine, *, begin: str, synchronous: str, wait_ms: int) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: object) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
        cursor = dbapi_conn.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout={int(wait_ms)}")
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA synchronous={synchronous}")
            cursor.execute("PRAGMA foreign_keys=ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql(begin)
