"""Shared fixtures: real SQLite files in a temporary directory, and a subprocess runner."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hostler import EventStore


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    """Where a test's event log lives (not created yet)."""
    return tmp_path / "data" / "events.db"


@pytest.fixture
def store(log_path: Path) -> Iterator[EventStore]:
    """An owner store on a fresh real SQLite file."""
    with EventStore.open(log_path, owner=True) as opened:
        yield opened
