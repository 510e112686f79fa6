"""The event log's table, as SQLAlchemy Core metadata. alembic owns the DDL; this mirrors it."""

from __future__ import annotations

import sqlalchemy as sa

__all__ = ["ROW_COLUMNS", "TIME_FORMAT", "events", "metadata"]

#: How ``recorded_at`` is stored: fixed-width ISO-8601 UTC text, so that text order is time
#: order on every dialect and a person can read it in plain SQL.
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)

events = sa.Table(
    "events",
    metadata,
    # INTEGER PRIMARY KEY AUTOINCREMENT on SQLite: seq is never reused, even after deletes
    # (which the triggers refuse anyway) or rolled-back inserts.
    sa.Column(
        "seq",
        sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
        primary_key=True,
        autoincrement=True,
    ),
    sa.Column("stream_id", sa.String(200), nullable=False),
    sa.Column("version", sa.Integer(), nullable=False),
    sa.Column("type", sa.String(120), nullable=False),
    sa.Column("schema_version", sa.Integer(), nullable=False),
    sa.Column("payload", sa.JSON(), nullable=False),
    sa.Column("metadata", sa.JSON(), nullable=False),
    sa.Column("recorded_at", sa.String(32), nullable=False),
    sa.UniqueConstraint("stream_id", "version"),
    sa.Index(None, "type", "seq"),
    sa.Index(None, "recorded_at"),
    sqlite_autoincrement=True,
)

#: A whole row, in the order readers unpack it.
ROW_COLUMNS = (
    events.c.seq,
    events.c.stream_id,
    events.c.version,
    events.c.type,
    events.c.schema_version,
    events.c.payload,
    events.c["metadata"],
    events.c.recorded_at,
)
