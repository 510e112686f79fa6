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

    from _postgres import Cluster

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


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[Cluster]:
    """A real PostgreSQL server for this test process (tests/_postgres.py), stopped at the end."""
    from _postgres import throwaway_cluster  # imported (psycopg too) only where a test needs it

    with throwaway_cluster() as cluster:
        yield cluster


@pytest.fixture
def pg_url(postgres_cluster: Cluster) -> str:
    """The URL of a fresh, empty database on the test PostgreSQL server."""
    return postgres_cluster.new_database()


#: The kinds of log a store test runs on: SQLite through its driver-level writer, SQLite through
#: the generic SQLAlchemy Core writer (the one other databases use), and a real PostgreSQL.
LOG_KINDS = ["sqlite-writer", "core-writer", "postgresql"]


@pytest.fixture(params=LOG_KINDS)
def log_target(request: pytest.FixtureRequest, log_path: Path) -> str:
    """Where a store test's log lives: a SQLite file, or a fresh PostgreSQL database's URL."""
    if request.param == "postgresql":
        return str(request.getfixturevalue("pg_url"))
    return str(log_path)


@pytest.fixture
def store(log_target: str, request: pytest.FixtureRequest) -> Iterator[EventStore]:
    """An owner store on a fresh real log, once per kind of :data:`LOG_KINDS`."""
    with EventStore.open(log_target, owner=True) as opened:
        kind = request.node.callspec.params.get("log_target")
        opened._appender._use_core_writer = kind == "core-writer"
        yield opened


@pytest.fixture
def sqlite_store(log_path: Path) -> Iterator[EventStore]:
    """An owner store on a fresh real SQLite file (for what only SQLite has: its file)."""
    with EventStore.open(log_path, owner=True) as opened:
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
