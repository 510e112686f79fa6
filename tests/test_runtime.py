"""``hostler.Runtime`` and its router, with real processes and a real ledger and log."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

import hostler
from hostler.errors import QueueCancelledError, RuntimeClosedError, UsageError
from hostler.events.router import ROUTER_STREAM
from hostler.runtime.arbiter import GpuArbiter
from hostler.runtime.pool import DrainProgress

from _fake_engine import BallastEngine
from _pools import World, work, world_at

pytestmark = pytest.mark.anyio


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with world_at(tmp_path) as made:
        yield made


def runtime(world: World, mib: int = 10, **options: object) -> hostler.Runtime:
    engine = BallastEngine(world.tmp_path, mib)
    return hostler.Runtime(
        world.store,
        world.supervisor_factory(engine),
        ledger=world.ledger,
        drain_poll=0.02,
        **options,  # type: ignore[arg-type]
    )


def bindings(world: World) -> list[tuple[str, str, str]]:
    return [
        (getattr(r.event, "session"), getattr(r.event, "key"), getattr(r.event, "how"))  # noqa: B009
        for r in world.store.read_stream(ROUTER_STREAM)
    ]


async def test_new_sessions_balance_across_replicas_and_keep_their_engine(world: World) -> None:
    async with runtime(world) as rt:
        await rt.reconcile({"ballast:m": 2})
        keys = [await rt.bind("ballast", "m", f"s{i}") for i in range(3)]
        assert keys == ["ballast:m:0", "ballast:m:1", "ballast:m:0"]
        assert await rt.bind("ballast", "m", "s1") == "ballast:m:1"  # affinity
        assert rt.status().sessions == {"ballast:m:0": 2, "ballast:m:1": 1}
        assert [how for _, _, how in bindings(world)] == ["balanced"] * 3  # "kept" adds nothing


async def test_a_stopped_sessions_engine_is_respawned_at_the_same_replica(world: World) -> None:
    async with runtime(world) as rt:
        await rt.reconcile({"ballast:m": 2})
        assert await rt.bind("ballast", "m", "a") == "ballast:m:0"
        assert await rt.bind("ballast", "m", "b") == "ballast:m:1"
        assert await rt.unload("ballast:m:1")
        assert await rt.bind("ballast", "m", "b") == "ballast:m:1"
        assert rt.pool.resident("ballast:m:1")
        assert bindings(world)[-1] == ("b", "ballast:m:1", "respawned")
        # a prior key for another model is not affinity: the new model's replica 0
        assert await rt.bind("ballast", "n", "b", prior_key="ballast:m:1") == "ballast:n:0"


async def test_a_one_shot_reuses_a_running_replica(world: World) -> None:
    async with runtime(world) as rt:
        await rt.reconcile({"ballast:m": 2})
        assert await rt.unload("ballast:m:0")
        assert await rt.one_shot("ballast", "m") == "ballast:m:1"
        assert not rt.pool.resident("ballast:m:0")  # no second copy just for a one-shot
        assert await rt.one_shot("ballast", "z") == "ballast:z:0"


async def test_binding_reports_drain_progress(world: World) -> None:
    seen: list[DrainProgress] = []
    async with runtime(world, mib=400, drain_wait=5) as rt:
        a = await rt.bind("ballast", "a", "one")
        b = await rt.bind("ballast", "b", "two")
        async with anyio.create_task_group() as tg:

            async def hold(key: str, seconds: float) -> None:
                async with rt.request(key) as port:
                    await anyio.to_thread.run_sync(work, port, seconds)

            tg.start_soon(hold, a, 0.6)
            tg.start_soon(hold, b, 3.0)
            await anyio.sleep(0.2)
            key = await rt.bind("ballast", "c", "three", on_drain_wait=seen.append)
        assert key == "ballast:c:0"
        assert seen and {p.key for p in seen} == {a} and seen[0].for_key == key
        assert seen[0].limit == 5 and 0 <= seen[0].waited < seen[-1].waited < 5


async def test_status_is_a_peek_and_launches_are_summarised(world: World) -> None:
    async with runtime(world) as rt:
        status = rt.status()
        assert status.engines == () and not status.closed
        assert rt.engine_status("ballast:m:0") is None
        assert list(world.store.read_all()) == [
            r for r in world.store.read_all() if "ledger" in r.stream_id
        ]
        key = await rt.one_shot("ballast", "m")
        [summary] = rt.launch_summaries()
        assert (summary.key, summary.ctx_per_slot, summary.slots) == (key, 512, 1)
        assert summary.pid == rt.pool.supervisor(key).pid and summary.port
        view = rt.engine_status(key)
        assert view is not None and view.state == "running" and view.bytes > 0
    assert rt.status().closed
    with pytest.raises(RuntimeClosedError):
        async with rt.request(key):
            pass


async def test_the_budget_is_live_and_validated(world: World) -> None:
    async with runtime(world) as rt:
        with pytest.raises(UsageError, match="number of bytes"):
            await rt.set_budget(-1)
        await rt.set_budget(3 * 2**30)
        snapshot = await rt.budget()
        assert snapshot["budget"] == 3 * 2**30 and snapshot["overridden"] is True
        await rt.set_spillover(False)
        assert rt.status().ledger == {
            "committed": 0,
            "explicit_budget": 3 * 2**30,
            "spillover": False,
        }
        with pytest.raises(UsageError, match="no plan to show"):
            await rt.preview("ballast:m:0")


async def test_an_image_lease_holds_llm_requests_and_unloads_idle_engines(world: World) -> None:
    arbiter = GpuArbiter("swap", store=world.store)
    async with runtime(world, arbiter=arbiter) as rt:
        key = await rt.one_shot("ballast", "m")
        release = await rt.acquire_lease("image", "render-1")
        assert not rt.pool.resident(key)  # GA2/GA3: the other slot's engines were evicted
        assert [lease["holder"] for lease in rt.leases()] == ["render-1"]
        entered = anyio.Event()

        async def chat() -> None:
            async with rt.request(key):
                entered.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(chat)
            await anyio.sleep(0.3)
            assert not entered.is_set()  # waits while the image job holds the card
            await release()
            with anyio.fail_after(10):
                await entered.wait()
        types = [r.type for r in world.store.read_all() if r.stream_id.startswith("lease/")]
        assert types[:2] == ["lease.requested", "lease.granted"] and "lease.released" in types
        rt.set_gpu_policy("coexist")
        assert rt.arbiter.mode == "coexist"
        assert await rt.device_health() is None


async def test_requests_queue_with_positions_cancel_and_are_recorded(world: World) -> None:
    async with runtime(world) as rt:
        key = await rt.one_shot("ballast", "m")
        port_seen: list[int] = []
        outcomes: list[str] = []

        async def ask(name: str, seconds: float) -> None:
            try:
                async with rt.request(key, session=name, label=name) as port:
                    port_seen.append(port)
                    await anyio.to_thread.run_sync(work, port, seconds)
                    outcomes.append(f"{name} ran")
            except QueueCancelledError:
                outcomes.append(f"{name} cancelled")

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask, "first", 0.8)
            await anyio.sleep(0.2)
            tg.start_soon(ask, "second", 0.0)
            tg.start_soon(ask, "third", 0.0)
            await anyio.sleep(0.2)
            summary = rt.queues()[key]
            assert summary.width == 2  # one launched slot, plus the extra logical lane (Q12)
            assert [a.label for a in summary.active] == ["first"]
            waiting = sorted(summary.pending, key=lambda p: p.position)
            assert [p.label for p in waiting] == ["second", "third"]
            assert rt.cancel(key, waiting[1].id)
            assert not rt.cancel(key, 999) and not rt.cancel("ballast:none:0", 1)
        assert outcomes == ["third cancelled", "first ran", "second ran"]
        with pytest.raises(UsageError, match="up or down"):
            rt.move(key, 1, "sideways")
    kinds = [r.type for r in world.store.read_stream(f"queue/{key}")]
    assert kinds.count("queue.enqueued") == 3 and "queue.cancelled" in kinds
    assert kinds.count("queue.dispatched") == 2
