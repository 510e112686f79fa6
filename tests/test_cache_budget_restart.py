"""CC2/CC3 across a restart: the operator's cache budget is the one the log recorded.

A new runtime starts with a new controller; the budget an operator set (``cache.budget_set``)
must hold for the engine it registers, not fall back to the default.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hostler
from hostler.events.cache import CacheBudgetSet, cache_stream
from hostler.policies.cache import DEFAULT_BUDGET

from _fake_engine import BallastEngine
from _pools import World, world_leaving_nothing

pytestmark = pytest.mark.anyio

KEY = "ballast:m:0"
UNIT = 102_400


class _Cache:
    """A cache adapter that holds nothing (the budget is what is checked)."""

    def request_extras(self, session_id: str) -> dict[str, Any]:
        return {}

    async def evict(self, ids: Any) -> None:
        pass

    async def report_usage(self) -> None:
        return None


class _CachingBallast(BallastEngine):
    def cache_adapter(self, spec: Any) -> _Cache:
        return _Cache()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with world_leaving_nothing(tmp_path) as made:
        yield made


def runtime(world: World) -> hostler.Runtime:
    return hostler.Runtime(
        world.store,
        world.supervisor_factory(_CachingBallast(world.tmp_path, 10)),
        ledger=world.ledger,
        drain_poll=0.02,
    )


async def test_an_operator_cache_budget_holds_after_a_restart(world: World) -> None:
    async with runtime(world) as first:
        await first.caches.set_budget(KEY, 5 * UNIT)
        await first.caches.set_budget(KEY, 7 * UNIT)  # the last one recorded is the one kept
        await first.caches.set_budget("ballast:other:0", 3 * UNIT)
    recorded = [r.event for r in world.store.read_stream(cache_stream(KEY))]
    assert recorded == [
        CacheBudgetSet(key=KEY, bytes=5 * UNIT, previous=DEFAULT_BUDGET, applied=False),
        CacheBudgetSet(key=KEY, bytes=7 * UNIT, previous=5 * UNIT, applied=False),
    ]
    async with runtime(world) as again:
        assert again.cache.budget(KEY) == 7 * UNIT
        assert again.cache.budget("ballast:other:0") == 3 * UNIT
        assert again.cache.budget("ballast:never:0") == DEFAULT_BUDGET
        await again.one_shot("ballast", "m")  # the launch registers the engine's cache (CC2)
        async with again.request(KEY):
            pass
        stats = await again.caches.stats(KEY)
        assert stats is not None and stats.budget == 7 * UNIT
    # restoring records nothing: the log still holds the two decisions, no third
    assert len(world.store.read_stream(cache_stream(KEY))) == 2
