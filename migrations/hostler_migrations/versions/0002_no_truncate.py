"""TRUNCATE refused on PostgreSQL (a row trigger does not see it).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-05

SQLite has no TRUNCATE (its ``DELETE FROM events`` meets the row trigger): nothing to do there.
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events "
            "FOR EACH STATEMENT EXECUTE FUNCTION hostler_events_append_only()"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS events_no_truncate ON events")
