"""Hostile tests of ``hostler.Runtime``'s request path: queue, GPU arbiter, gate, cache."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import hostler
from hostler.errors import UnknownEngineError, UsageError
from hostler.policies.cache import CacheEntry

from _fake_engine import BallastEngine
from _pools import World, engine_processes, work, world_leaving_nothing

pytestmark = pytest.mark.anyio

KEY = "ballast:m:0"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with world_leaving_nothing(tmp_path) as made:
        yield made


def runtime(world: World, engine: BallastEngine | None = None, **options: Any) -> hostler.Runtime:
    return hostler.Runtime(
        world.store,
        world.supervisor_factory(engine or BallastEngine(world.tmp_path, 10)),
        ledger=world.ledger,
        drain_poll=0.02,
        **options,
    )


def held(world: World) -> list[str]:
    return sorted(h.key for h in world.ledger.refresh().reservations.values())


def idle(rt: hostler.Runtime) -> bool:
    return all(s.running == 0 and not s.pending for s in rt.queues().values())


def rejecting(world: World) -> Any:
    """A build that knows only ``ballast:`` keys, as the daemon's knows only its engines."""
    good = world.supervisor_factory(BallastEngine(world.tmp_path, 10))

    def build(key: str) -> Any:
        if not key.startswith("ballast:"):
            raise UnknownEngineError(f"no engine is configured for {key[:40]!r}")
        return good(key)

    return build


async def test_close_inside_the_runtime_block_does_not_leak_a_cancellation(world: World) -> None:
    # PP8/NR3: close() is the documented way to stop; the block around it must still end normally.
    async with runtime(world) as rt:
        await rt.one_shot("ballast", "m")
        await rt.close()
        await (
            anyio.lowlevel.checkpoint()
        )  # observed: CancelledError from the pool's own cancel scope
    assert engine_processes(world.token) == []


async def test_close_from_a_task_inside_the_block_ends_the_block_normally(world: World) -> None:
    ended = False
    async with runtime(world) as rt:
        await rt.one_shot("ballast", "m")
        async with anyio.create_task_group() as tg:
            tg.start_soon(rt.close)
            tg.start_soon(rt.close)  # two concurrent closes
    ended = True  # observed: a bare CancelledError escapes `async with rt` instead
    assert ended and engine_processes(world.token) == [] and held(world) == []


async def test_move_with_a_non_string_direction_is_a_usage_error(world: World) -> None:
    async with runtime(world) as rt:
        await rt.one_shot("ballast", "m")
        with pytest.raises(UsageError, match="up or down"):  # observed: TypeError (slicing None)
            rt.move(KEY, 1, None)  # type: ignore[arg-type]


@pytest.mark.parametrize("limit", [float("nan"), "3"])
async def test_a_malformed_queue_timeout_is_refused_as_a_usage_error(
    world: World, limit: Any
) -> None:
    async with runtime(world) as rt:
        await rt.one_shot("ballast", "m")
        async with anyio.create_task_group() as tg:

            async def hold() -> None:
                async with rt.request(KEY) as port:
                    await anyio.to_thread.run_sync(work, port, 1.0)

            tg.start_soon(hold)
            await anyio.sleep(0.2)
            # observed: ExceptionGroup([ValueError|TypeError]) from the queue's helper task,
            # while the same value on an idle engine is silently accepted
            with pytest.raises(UsageError):
                async with rt.request(KEY, queue_timeout=limit):
                    pass
        assert idle(rt)


async def test_an_on_wait_callback_that_raises_does_not_kill_the_request(world: World) -> None:
    # Like the pool's drain listeners: a caller's progress display never breaks the work.
    def show(_ahead: int) -> None:
        raise RuntimeError("the progress display broke")

    ran = []
    async with runtime(world) as rt:
        await rt.one_shot("ballast", "m")
        async with anyio.create_task_group() as tg:

            async def hold() -> None:
                async with rt.request(KEY) as port:
                    await anyio.to_thread.run_sync(work, port, 0.8)

            tg.start_soon(hold)
            await anyio.sleep(0.1)
            async with rt.request(KEY, on_wait=show):  # observed: ExceptionGroup(RuntimeError)
                ran.append(True)
        assert ran and idle(rt)


async def test_requests_for_unknown_keys_leave_no_queue_behind(world: World) -> None:
    rt = hostler.Runtime(
        world.store,
        rejecting(world),
        ledger=world.ledger,
    )
    async with rt:
        for i in range(100):
            with pytest.raises(UnknownEngineError):
                async with rt.request(f"nope:x:{i}"):
                    pass
        assert rt.pool.engine_keys() == []
        # observed: 100 phantom queues (and gates, and their event streams) kept forever
        assert rt.queues() == {} and len(rt._gates) == 0


async def test_a_running_engine_has_a_queue_summary_with_its_live_width(world: World) -> None:
    async with runtime(world) as rt:
        key = await rt.bind("ballast", "m", "s1")
        view = rt.engine_status(key)
        assert view is not None and view.state == "running"
        summary = rt.queues().get(key)  # PP14: each engine's summary; observed: {}
        assert summary is not None and summary.width == 2 and summary.running == 0


async def test_one_bad_stream_does_not_drop_other_engines_queue_events(world: World) -> None:
    long_key = "x" * 195  # `queue/<key>` is past the store's 200-character stream ids
    rt = hostler.Runtime(
        world.store,
        rejecting(world),
        ledger=world.ledger,
    )
    async with rt:
        await rt.one_shot("ballast", "m")
        for _ in range(3):
            with pytest.raises(UnknownEngineError):
                async with rt.request(long_key):
                    pass
            async with rt.request(KEY):
                pass
            await anyio.sleep(0.6)  # one writer batch per round
    kinds = [r.type for r in world.store.read_stream(f"queue/{KEY}")]
    # observed: the whole batch after the failing stream is dropped with one warning
    assert kinds.count("queue.enqueued") == 3 and kinds.count("queue.released") == 3


class _ReportingCache:
    """A cache adapter that reports one session cached by its own process."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.evicted: list[str] = []

    def request_extras(self, session_id: str) -> dict[str, Any]:
        return {"id_slot": 0}

    async def evict(self, ids: Any) -> None:
        self.evicted.extend(ids)

    async def report_usage(self) -> list[CacheEntry]:
        return [CacheEntry(f"s-{self.port}", 10, 10 * 102400, time.time(), "normal", None)]


class _CachingBallast(BallastEngine):
    def cache_adapter(self, spec: Any) -> _ReportingCache:
        return _ReportingCache(spec.port)


async def test_an_unloaded_engine_keeps_no_cache_entries(world: World) -> None:
    async with runtime(world, engine=_CachingBallast(world.tmp_path, 10)) as rt:
        await rt.one_shot("ballast", "m")
        async with rt.request(KEY):
            pass
        await rt.cache.reconcile_once()
        stats = rt.cache_stats(KEY)
        assert stats is not None and stats.entries == 1
        assert await rt.unload(KEY)  # the process, and its KV cache, are gone
        stats = rt.cache_stats(KEY)
        # observed: the dead process's adapter stays registered: 1 entry, 1000 KiB "cached"
        assert stats is None or stats.entries == 0
