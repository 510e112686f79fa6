"""Shared fixtures: real SQLite files in a temporary directory, and a subprocess runner."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from hostler import EventStore

#: The tests of a real sd-server are collected only when ``$HOSTLER_SD_SERVER`` names one (the
#: opt-in ``tox -e sdcpp-real`` builds it); the default suite does not collect them at all.
collect_ignore = [] if os.environ.get("HOSTLER_SD_SERVER") else ["test_sdcpp_real.py"]


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    """Where a test's event log lives (not created yet)."""
    return tmp_path / "data" / "events.db"


@pytest.fixture(params=["sqlite-writer", "core-writer"])
def store(log_path: Path, request: pytest.FixtureRequest) -> Iterator[EventStore]:
    """An owner store on a fresh real SQLite file, once per write path.

    SQLite normally writes through the driver-level writer; the generic SQLAlchemy Core
    writer (the one other databases use) is run on the same file to keep both honest.
    """
    with EventStore.open(log_path, owner=True) as opened:
        opened._use_core_writer = request.param == "core-writer"
        yield opened


@pytest.fixture
def anyio_backend() -> str:
    """Async tests run on asyncio (the daemon's loop)."""
    return "asyncio"
