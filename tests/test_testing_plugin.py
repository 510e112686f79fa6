"""hostler's pytest plugin is opt-in: absent unless asked for, complete once it is.

Each case is a pytest run in a subprocess (pytester), as a plugin author's project would run.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow  # each case is a fresh pytest process

#: Uses every fixture the plugin provides, as a plugin author's test would.
USES_THE_FIXTURES = """
import anyio

from hostler import EventStore
from hostler.testing.fake_engine import Behaviour, FakeEngineAdapter
from hostler.testing.harness import FakeClock, Harness


def test_fixtures(hostler_data_dir, hostler_store, fake_clock, fake_behaviour, fake_engine,
                  hostler_adapters, hostler_harness, hostler_runtime, hostler_clock):
    assert hostler_store.sqlite_file == hostler_data_dir / "events.db"
    assert all(p.name.startswith("events.db") for p in hostler_data_dir.iterdir())
    assert isinstance(hostler_store, EventStore)
    assert isinstance(fake_clock, FakeClock)
    assert fake_behaviour == Behaviour()
    assert isinstance(fake_engine, FakeEngineAdapter)
    assert hostler_adapters == {"fake": fake_engine}
    assert isinstance(hostler_harness, Harness)
    assert hostler_harness.store is hostler_store

    async def serve():
        async with hostler_runtime as rt, rt.request("fake:m:0") as port:
            return port

    assert anyio.run(serve) > 0
"""


def test_the_plugin_is_not_loaded_unless_asked_for(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_it=USES_THE_FIXTURES)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'hostler_data_dir' not found*"])


def test_dash_p_turns_it_on(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_it=USES_THE_FIXTURES)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "hostler.testing.pytest_plugin"
    )
    result.assert_outcomes(passed=1)


def test_pytest_plugins_in_the_root_conftest_turns_it_on(pytester: pytest.Pytester) -> None:
    pytester.makeconftest('pytest_plugins = ["hostler.testing.pytest_plugin"]')
    pytester.makepyfile(test_it=USES_THE_FIXTURES)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_a_behaviour_fixture_that_is_not_a_behaviour_is_one_clear_error(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_it="""
import pytest

pytest_plugins = ["hostler.testing.pytest_plugin"]


@pytest.mark.parametrize("fake_behaviour", [{"load_seconds": 1}], indirect=True)
def test_it(fake_engine):
    pass
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*parametrize it with Behaviour(...), not {'load_seconds': 1}*"])
