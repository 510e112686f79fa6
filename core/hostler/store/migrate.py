"""Bring a log's schema to head at open, inside one transaction, without an ini file."""

from __future__ import annotations

import functools

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from hostler.errors import StoreForeignError, StoreSchemaError
from hostler_migrations import SCRIPT_LOCATION

__all__ = [
    "EVENTS_COLUMNS",
    "SQLITE_OBJECTS",
    "current_revision",
    "head_revision",
    "schema_too_new",
    "shipped_revisions",
    "upgrade_to_head",
]

#: Every schema object hostler's migrations make in a SQLite log, as (type, name), SQLite's own
#: ``sqlite_*`` objects aside: a file holding anything else is another application's
#: (``hostler.store.connect``). tests/test_store.py pins it to what a fresh log holds; a
#: migration that makes a new object adds it here.
SQLITE_OBJECTS: frozenset[tuple[str, str]] = frozenset(
    {
        ("table", "alembic_version"),
        ("table", "events"),
        ("index", "ix_events_type_seq"),
        ("index", "ix_events_recorded_at"),
        ("trigger", "events_no_update"),
        ("trigger", "events_no_delete"),
    }
)

#: The columns of hostler's ``events`` table (revision 0001): how its log is told from another
#: application's table of the same name. A later revision may add columns, never remove these.
EVENTS_COLUMNS = frozenset(
    {
        "seq",
        "stream_id",
        "version",
        "type",
        "schema_version",
        "payload",
        "metadata",
        "recorded_at",
    }
)


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPT_LOCATION))
    return cfg


def head_revision() -> str:
    """The newest schema revision this hostler knows."""
    head = ScriptDirectory.from_config(_config()).get_current_head()
    if head is None:  # pragma: no cover - the package always ships revisions
        raise RuntimeError("hostler ships no migrations")
    return head


@functools.cache
def shipped_revisions() -> frozenset[str]:
    """Every schema revision this hostler ships (a log at any other is not this version's)."""
    return frozenset(s.revision for s in ScriptDirectory.from_config(_config()).walk_revisions())


def schema_too_new(where: str, current: str) -> StoreSchemaError:
    """The refusal of a log at a revision this hostler does not ship (a newer one wrote it)."""
    return StoreSchemaError(
        f"{where}: schema revision {current!r} is newer than this hostler knows "
        f"(newest here: {head_revision()!r}); upgrade hostler to open it"
    )


def current_revision(conn: sa.Connection) -> str | None:
    """The revision a database is at, or None for an empty one."""
    return MigrationContext.configure(conn).get_current_revision()


def upgrade_to_head(engine: sa.Engine, *, where: str, reader: sa.Engine | None = None) -> str:
    """Migrate ``engine``'s database to head in one transaction; return the revision.

    Idempotent. A database at a revision this hostler does not know was written by a newer
    version: it is refused with :class:`StoreSchemaError` and left untouched; one that holds
    tables but no hostler schema belongs to another application: refused with
    :class:`StoreForeignError`, nothing written.

    A log already at head is recognised through ``reader`` (a read transaction), so opening
    it never waits for another process's write lock.
    """
    cfg = _config()
    scripts = ScriptDirectory.from_config(cfg)
    head = scripts.get_current_head()
    if reader is not None:
        with reader.connect() as conn:
            if current_revision(conn) == head:
                return str(head)
    with engine.begin() as conn:
        current = current_revision(conn)
        if current == head:
            return str(head)
        if current is None:
            foreign = sorted(sa.inspect(conn).get_table_names())
            if foreign:
                shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
                raise StoreForeignError(
                    f"{where}: another application's database (tables: {shown}); hostler "
                    "writes only into an empty database or its own log: choose another file"
                )
        if current is not None and current not in shipped_revisions():
            raise schema_too_new(where, current)
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
    return str(head)
