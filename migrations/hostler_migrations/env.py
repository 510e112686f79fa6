"""alembic env: runs only on a connection that hostler hands in (no ini, no logging setup)."""

from __future__ import annotations

from alembic import context

from hostler.store.schema import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError(
        "hostler migrations run through hostler.store.migrate.upgrade_to_head(), "
        "which supplies the connection"
    )

context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
