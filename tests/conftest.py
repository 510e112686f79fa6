"""Shared fixtures: real SQLite files in a temporary directory, and a subprocess runner.

Also loads the session guard (``_session_guard.py``), which ends what a run leaves running.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

from hostler import EventStore

if TYPE_CHECKING:
    from _scenario import Scenario

#: The session guard: every process a test run starts is ended when the run ends, however it
#: ends (failed, Ctrl-C, SIGTERM, even pytest SIGKILLed). See docs/testing.md.
pytest_plugins = ["_session_guard"]

#: The tests of a real sd-server are collected only when ``$HOSTLER_SD_SERVER`` names one (the
#: opt-in ``tox -e sdcpp-real`` builds it); the default suite does not collect them at all.
collect_ignore = [] if os.environ.get("HOSTLER_SD_SERVER") else ["test_sdcpp_real.py"]
# `tox -e llamacpp-build` builds llama-server for any CPU first, and names it
if not os.environ.get("HOSTLER_BUILT_LLAMA_SERVER"):
    collect_ignore.append("test_llamacpp_built.py")


@pytest.fixture(autouse=True)
def _no_terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """A table printed in this process takes any width, as in a pipe: pytest-xdist's workers set
    ``COLUMNS``, which a table fits. A test that wants a width sets it."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


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
        opened._appender._use_core_writer = request.param == "core-writer"
        yield opened


@pytest.fixture
def anyio_backend() -> str:
    """Async tests run on asyncio (the daemon's loop)."""
    return "asyncio"


@pytest.fixture(scope="session")
def recorded_scenario(tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    """The post-mortem scenario (``_scenario.py``), recorded once per session with real engines.

    Session-scoped: the explain, verify, what-if and timeline tests that read it share one
    recording. Under pytest-xdist each worker process would record its own (in its own
    temporary folder): slower, still correct. Tests take :func:`scenario`, a copy.
    """
    from _scenario import record_scenario

    return anyio.run(record_scenario, tmp_path_factory.mktemp("scenario"))


@pytest.fixture
def scenario(recorded_scenario: Scenario, tmp_path: Path) -> Scenario:
    """The recorded scenario, its log copied into this test's folder (no test sees another's)."""
    folder = tmp_path / "scenario"
    folder.mkdir()
    for part in recorded_scenario.log.parent.glob(recorded_scenario.log.name + "*"):
        shutil.copy2(part, folder / part.name)  # the log, and its -wal / -shm if any are left
    return dataclasses.replace(
        recorded_scenario,
        log=folder / recorded_scenario.log.name,
        keys=list(recorded_scenario.keys),
        evicted=list(recorded_scenario.evicted),
        sessions=dict(recorded_scenario.sessions),
    )
