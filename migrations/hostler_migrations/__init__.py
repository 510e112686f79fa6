"""alembic environment and revisions of hostler's event log (shipped inside the wheel)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["SCRIPT_LOCATION"]

#: The folder alembic reads its ``env.py`` and ``versions/`` from.
SCRIPT_LOCATION = Path(__file__).parent
