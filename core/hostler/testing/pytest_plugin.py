"""hostler's pytest plugin: fixtures for testing plugins and applications (opt-in).

It is never loaded by itself. Turn it on in a test module or in your root ``conftest.py``::

    pytest_plugins = ["hostler.testing.pytest_plugin"]

or on the command line with ``-p hostler.testing.pytest_plugin``.

Fixtures:

- ``hostler_data_dir``: an empty data directory (under ``tmp_path``).
- ``hostler_store``: an owner :class:`~hostler.EventStore` on a fresh SQLite file in it.
- ``fake_clock``: a :class:`~hostler.testing.clock.FakeClock` (wall time moves when advanced).
- ``virtual_clock``: a :class:`~hostler.testing.clock.VirtualClock` (all time, timers too).
- ``fake_behaviour``: the :class:`~hostler.testing.fake_engine.Behaviour` of ``fake_engine``
  (override it, or parametrize it indirectly, to script the engine).
- ``fake_engine``: a :class:`~hostler.testing.fake_engine.FakeEngineAdapter` with it.
- ``hostler_adapters``: the adapters by engine name (default: ``{"fake": fake_engine}``);
  override it to run your own.
- ``hostler_policy``: the supervisors' timings (default: ``FAST_POLICY``).
- ``hostler_clock``: the wall clock of the harness (default: ``time.time``; return
  ``fake_clock`` from an override to drive idle and health timers by hand).
- ``hostler_harness``: a :class:`~hostler.testing.harness.Harness` over the store and adapters
  (supervisors, ledger, prices).
- ``hostler_runtime``: a :class:`hostler.Runtime` over the harness, not yet entered: use it
  as ``async with hostler_runtime as rt``.

The adapter conformance suite is a separate import: :mod:`hostler.testing.conformance`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import hostler
from hostler.engines.supervisor import SupervisorPolicy
from hostler.errors import UsageError
from hostler.plugin import EngineAdapter
from hostler.store.log import EventStore
from hostler.testing.clock import VirtualClock
from hostler.testing.fake_engine import Behaviour, FakeEngineAdapter
from hostler.testing.harness import FAST_POLICY, FakeClock, Harness

__all__ = [
    "fake_behaviour",
    "fake_clock",
    "fake_engine",
    "hostler_adapters",
    "hostler_clock",
    "hostler_data_dir",
    "hostler_harness",
    "hostler_policy",
    "hostler_runtime",
    "hostler_store",
]


@pytest.fixture
def hostler_data_dir(tmp_path: Path) -> Path:
    """An empty hostler data directory, private to the test."""
    path = tmp_path / "hostler-data"
    path.mkdir(mode=0o700)
    return path


@pytest.fixture
def hostler_store(hostler_data_dir: Path) -> Iterator[EventStore]:
    """An owner event log on a fresh SQLite file in ``hostler_data_dir`` (closed after)."""
    with EventStore.open(hostler_data_dir / "events.db", owner=True) as store:
        yield store


@pytest.fixture
def fake_clock() -> FakeClock:
    """A clock that moves only when the test calls ``advance``."""
    return FakeClock()


@pytest.fixture
def virtual_clock() -> VirtualClock:
    """A clock whose wall, monotonic time, sleeps and timeouts move only when advanced."""
    return VirtualClock()


@pytest.fixture
def fake_behaviour(request: pytest.FixtureRequest) -> Behaviour:
    """How ``fake_engine`` behaves (default: well-behaved and instant).

    Parametrize it indirectly to script one test:
    ``@pytest.mark.parametrize("fake_behaviour", [Behaviour(...)], indirect=True)``.
    """
    param = getattr(request, "param", None)
    if param is None:
        return Behaviour()
    if not isinstance(param, Behaviour):
        raise UsageError(f"fake_behaviour: parametrize it with Behaviour(...), not {param!r}")
    return param


@pytest.fixture
def fake_engine(fake_behaviour: Behaviour) -> FakeEngineAdapter:
    """The fake engine's adapter (engine name ``fake``), scripted by ``fake_behaviour``."""
    return FakeEngineAdapter(fake_behaviour)


@pytest.fixture
def hostler_adapters(fake_engine: FakeEngineAdapter) -> dict[str, EngineAdapter]:
    """The adapters the harness runs, by engine name (override to add yours)."""
    return {fake_engine.engine_type: fake_engine}


@pytest.fixture
def hostler_policy() -> SupervisorPolicy:
    """The supervisors' timings (default: a fast watch, no idle stop, 1 s stop grace)."""
    return FAST_POLICY


@pytest.fixture
def hostler_clock() -> Callable[[], float]:
    """The harness's wall clock (default: the real one)."""
    return time.time


@pytest.fixture
def hostler_harness(
    hostler_data_dir: Path,
    hostler_store: EventStore,
    hostler_adapters: dict[str, EngineAdapter],
    hostler_policy: SupervisorPolicy,
    hostler_clock: Callable[[], float],
) -> Harness:
    """Supervisors, a ledger and prices for engine keys over ``hostler_store``."""
    return Harness(
        hostler_data_dir,
        hostler_store,
        hostler_adapters,
        policy=hostler_policy,
        clock=hostler_clock,
    )


@pytest.fixture
def hostler_runtime(hostler_harness: Harness) -> hostler.Runtime:
    """A runtime over ``hostler_harness`` (enter it: ``async with hostler_runtime as rt``)."""
    return hostler_harness.runtime()
