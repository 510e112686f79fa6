"""Bring a log's schema to head at open, inside one transaction, without an ini file."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from hostler.errors import StoreForeignError, StoreSchemaError
from hostler_migrations import SCRIPT_LOCATION

__all__ = ["current_revision", "head_revision", "upgrade_to_head"]


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
        if current is not None and current not in {s.revision for s in scripts.walk_revisions()}:
            raise StoreSchemaError(
                f"{where}: schema revision {current!r} is newer than this hostler knows "
                f"(newest here: {head!r}); upgrade hostler to open it"
            )
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
    return str(head)
