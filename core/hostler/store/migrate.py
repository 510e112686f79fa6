"""Bring a log's schema to head at open, inside one transaction, without an ini file."""

from __future__ import annotations

from typing import TYPE_CHECKING

import sqlalchemy as sa

from hostler.errors import StoreForeignError, StoreSchemaError
from hostler_migrations import REVISIONS, SCRIPT_LOCATION

if TYPE_CHECKING:
    from alembic.config import Config

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
    from alembic.config import Config  # noqa: PLC0415 - alembic is imported only to migrate

    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPT_LOCATION))
    return cfg


def head_revision() -> str:
    """The newest schema revision this hostler knows."""
    return REVISIONS[-1]


def shipped_revisions() -> frozenset[str]:
    """Every schema revision this hostler ships (a log at any other is not this version's)."""
    return frozenset(REVISIONS)


def schema_too_new(where: str, current: str) -> StoreSchemaError:
    """The refusal of a log at a revision this hostler does not ship (a newer one wrote it)."""
    return StoreSchemaError(
        f"{where}: schema revision {current!r} is newer than this hostler knows "
        f"(newest here: {head_revision()!r}); upgrade hostler to open it"
    )


def current_revision(conn: sa.Connection, where: str = "") -> str | None:
    """The revision a database is at, or None for an empty one.

    Read from alembic's ``alembic_version`` table directly (alembic itself is imported only when
    a migration runs); a table holding more than one revision is refused as not hostler's.
    """
    if not sa.inspect(conn).has_table("alembic_version"):
        return None
    rows = conn.execute(sa.text("SELECT version_num FROM alembic_version")).fetchall()
    if len(rows) > 1:
        raise StoreForeignError(
            f"{where or 'the log'}: more than one schema "
            "revision in alembic_version; hostler's log has one"
        )
    return str(rows[0][0]) if rows else None


def upgrade_to_head(engine: sa.Engine, *, where: str, reader: sa.Engine | None = None) -> str:
    """Migrate ``engine``'s database to head in one transaction; return the revision.

    Idempotent. A database at a revision this hostler does not know was written by a newer
    version: it is refused with :class:`StoreSchemaError` and left untouched; one that holds
    tables but no hostler schema belongs to another application: refused with
    :class:`StoreForeignError`, nothing written.

    A log already at head is recognised through ``reader`` (a read transaction), so opening
    it never waits for another process's write lock.
    """
    head = head_revision()
    if reader is not None:
        with reader.connect() as conn:
            if current_revision(conn, where) == head:
                return str(head)
    with engine.begin() as conn:
        current = current_revision(conn, where)
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
            columns = (
                {c["name"] for c in sa.inspect(conn).get_columns("events")}
                if sa.inspect(conn).has_table("events")
                else set()
            )
            if not columns >= EVENTS_COLUMNS:  # another alembic project's database
                raise StoreForeignError(
                    f"{where}: another application's database (schema revision {current!r}, "
                    "no hostler events table); hostler writes only into an empty database or "
                    "its own log: choose another"
                )
            raise schema_too_new(where, current)
        from alembic import command  # noqa: PLC0415 - alembic is imported only to migrate

        cfg = _config()
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
    return str(head)
