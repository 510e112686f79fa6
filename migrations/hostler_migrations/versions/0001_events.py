"""The append-only events table.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_SQLITE_TRIGGERS = (
    "CREATE TRIGGER events_no_update BEFORE UPDATE ON events "
    "BEGIN SELECT RAISE(ABORT, 'hostler events are append-only: UPDATE refused'); END",
    "CREATE TRIGGER events_no_delete BEFORE DELETE ON events "
    "BEGIN SELECT RAISE(ABORT, 'hostler events are append-only: DELETE refused'); END",
)

_POSTGRES_TRIGGERS = (
    "CREATE FUNCTION hostler_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ "
    "BEGIN RAISE EXCEPTION 'hostler events are append-only: % refused', TG_OP; END $$",
    "CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events "
    "FOR EACH ROW EXECUTE FUNCTION hostler_events_append_only()",
)


def upgrade() -> None:
    op.create_table(
        "events",
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
        sa.PrimaryKeyConstraint("seq", name="pk_events"),
        sa.UniqueConstraint("stream_id", "version", name="uq_events_stream_id_version"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_events_type_seq", "events", ["type", "seq"])
    op.create_index("ix_events_recorded_at", "events", ["recorded_at"])
    dialect = op.get_bind().dialect.name
    statements = {"sqlite": _SQLITE_TRIGGERS, "postgresql": _POSTGRES_TRIGGERS}.get(dialect, ())
    for statement in statements:
        op.execute(statement)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS events_append_only ON events")
        op.execute("DROP FUNCTION IF EXISTS hostler_events_append_only()")
    op.drop_index("ix_events_recorded_at", table_name="events")
    op.drop_index("ix_events_type_seq", table_name="events")
    op.drop_table("events")
