"""alembic environment and revisions of hostler's event log (shipped inside the wheel)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["REVISIONS", "SCRIPT_LOCATION"]

#: The folder alembic reads its ``env.py`` and ``versions/`` from.
SCRIPT_LOCATION = Path(__file__).parent

#: Every revision in ``versions/``, oldest first: the last is head. Read by hostler at every log
#: open, so that a log already at head is recognised without importing alembic;
#: tests/test_migrations_list.py pins it to what alembic finds in ``versions/``.
REVISIONS: tuple[str, ...] = ("0001", "0002")
