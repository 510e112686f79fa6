"""``hostler.Runtime`` and its router, with real processes and a real ledger and log."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import hostler
from hostler.errors import QueueCancelledError, RuntimeClosedError, UnknownEngineError, UsageError
from hostler.events.router import ROUTER_STREAM
from hostler.policies.cache import CacheEntry
from hostler.runtime.arbiter import GpuArbiter
from hostler.runtime.pool import DrainProgress

from _fake_engine import BallastEngine
from _pools import World, engine_processes, held, work, world_leaving_nothing

pytestmark = pytest.mark.anyio

A, B = "ballast:a:0", "ballast:b:0"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with world_leaving_nothing(tmp_path) as made:
        yield made


def runtime(
    world: World, mib: int = 10, engine: BallastEngine | None = None, **options: object
) -> hostler.Runtime:
    """A runtime over ``engine`` (by default a ballast engine of ``mib`` MiB)."""
    engine = engine or BallastEngine(world.tmp_path, mib)
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
        # PP5: a drain for a start is bounded by who waits for it, not by drain_wait
        assert seen[0].limit is None and 0 <= seen[0].waited < seen[-1].waited


async def test_status_is_a_peek_and_launches_are_summarised(world: World) -> None:
    async with runtime(world) as rt:
        status = rt.status()
        assert status.engines == () and not status.closed
        assert rt.report.engine_status("ballast:m:0") is None
        assert list(world.store.read_all()) == [
            r for r in world.store.read_all() if "ledger" in r.stream_id
        ]
        key = await rt.one_shot("ballast", "m")
        [summary] = rt.report.launch_summaries()
        assert (summary.key, summary.ctx_per_slot, summary.slots) == (key, 512, 1)
        assert summary.pid == rt.pool.supervisor(key).pid and summary.port
        view = rt.report.engine_status(key)
        assert view is not None and view.state == "running" and view.bytes > 0
    assert rt.status().closed
    with pytest.raises(RuntimeClosedError):
        async with rt.request(key):
            pass


async def test_the_budget_is_live_and_validated(world: World) -> None:
    async with runtime(world) as rt:
        with pytest.raises(UsageError, match="number of bytes"):
            await rt.memory.set_budget(-1)
        before = await rt.memory.budget()
        with pytest.raises(UsageError, match=r"^1073741823 bytes is under 1 GiB .* \(CB1: "):
            await rt.memory.set_budget(2**30 - 1)  # recorded but not enforced: refused instead
        assert await rt.memory.budget() == before  # nothing was recorded
        await rt.memory.set_budget(3 * 2**30)
        snapshot = await rt.memory.budget()
        assert snapshot["budget"] == 3 * 2**30 and snapshot["overridden"] is True
        await rt.memory.set_spillover(False)
        assert rt.status().ledger == {
            "committed": 0,
            "explicit_budget": 3 * 2**30,
            "spillover": False,
        }
        with pytest.raises(UsageError, match="no plan to show"):
            await rt.memory.preview("ballast:m:0")


async def test_an_image_lease_holds_llm_requests_and_unloads_idle_engines(world: World) -> None:
    arbiter = GpuArbiter("swap", store=world.store)
    async with runtime(world, arbiter=arbiter) as rt:
        key = await rt.one_shot("ballast", "m")
        release = await rt.arbiter.acquire_lease("image", "render-1")
        assert not rt.pool.resident(key)  # GA2/GA3: the other slot's engines were evicted
        assert [lease["holder"] for lease in rt.arbiter.leases()] == ["render-1"]
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
        rt.arbiter.set_policy("coexist")
        assert rt.arbiter.mode == "coexist"
        assert await rt.report.device_health() is None


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


async def test_use_after_close_starts_nothing(world: World) -> None:
    async with hostler.Runtime(
        world.store,
        world.supervisor_factory(BallastEngine(world.tmp_path, 10)),
        ledger=world.ledger,
    ) as rt:
        await rt.one_shot("ballast", "m")
        await rt.close()
        await rt.close()
        for call in (
            lambda: rt.bind("ballast", "m", "s"),
            lambda: rt.one_shot("ballast", "m"),
            lambda: rt.reconcile({"ballast:m": 1}),
        ):
            with pytest.raises(RuntimeClosedError):
                await call()
        with pytest.raises(RuntimeClosedError):
            async with rt.request("ballast:m:0"):
                pass
        assert await rt.unload("ballast:m:0") is False
        assert await rt.release_idle() == []
        assert engine_processes(world.token) == []
    assert engine_processes(world.token) == []
    assert held(world) == []


async def test_runtime_close_during_a_build_and_a_stream(world: World) -> None:
    (world.tmp_path / "slow").mkdir()
    slow = BallastEngine(world.tmp_path / "slow", 10, load_seconds=30)
    fast = BallastEngine(world.tmp_path, 10)
    build_fast, build_slow = world.supervisor_factory(fast), world.supervisor_factory(slow)
    rt = hostler.Runtime(
        world.store,
        lambda key: build_slow(key) if key == B else build_fast(key),
        ledger=world.ledger,
    )
    async with rt:
        key = await rt.bind("ballast", "a", "s1")
        async with anyio.create_task_group() as tg:

            async def streaming() -> None:
                with contextlib.suppress(BaseException):
                    async with rt.request(key) as port:
                        await anyio.to_thread.run_sync(work, port, 30.0, abandon_on_cancel=True)

            async def building() -> None:
                with pytest.raises(RuntimeClosedError):
                    await rt.bind("ballast", "b", "s2")

            tg.start_soon(streaming)
            tg.start_soon(building)
            with anyio.fail_after(10):
                while rt.pool.supervisor(B).pid is None:
                    await anyio.sleep(0.05)
            await rt.close()
            assert engine_processes(world.token) == []
            tg.cancel_scope.cancel()
    assert engine_processes(world.token) == []
    assert held(world) == []
    assert [r for r, _ in world.stops(A)] == ["shutdown"]
    assert [r for r, _ in world.stops(B)] == ["start-cancelled"]


async def test_router_weird_session_ids(world: World) -> None:
    async with hostler.Runtime(
        world.store,
        world.supervisor_factory(BallastEngine(world.tmp_path, 10)),
        ledger=world.ledger,
    ) as rt:
        await rt.reconcile({"ballast:m": 2})
        weird = ["", "\x00", "x" * 100_000, "ballast:m:1", "😀\n'; drop table events;--"]
        keys = [await rt.bind("ballast", "m", s) for s in weird]
        assert sorted(set(keys)) == ["ballast:m:0", "ballast:m:1"]
        for s, k in zip(weird, keys, strict=True):
            assert await rt.bind("ballast", "m", s) == k
        # a persisted prior key beyond the replicas reconcile keeps
        assert await rt.bind("ballast", "m", "z", prior_key="ballast:m:0") == "ballast:m:0"
    assert engine_processes(world.token) == []
    assert held(world) == []


async def test_cancelling_an_unload_as_the_engine_exits_still_frees_its_reservation(
    world: World,
) -> None:
    """The ledger never holds memory for an engine that is gone: a caller of ``unload`` that is
    cancelled (a client hanging up) once the engine's exit is recorded must not leave the
    reservation held with no process (the pool neither retries nor owes the release)."""
    async with hostler.Runtime(
        world.store,
        world.supervisor_factory(BallastEngine(world.tmp_path, 10)),
        ledger=world.ledger,
    ) as rt:
        await rt.pool.ensure(A)
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:

                async def cancel_once_exited() -> None:
                    while rt.pool.supervisor(A).state != "stopped":  # exit recorded
                        await anyio.lowlevel.checkpoint()
                    scope.cancel()

                tg.start_soon(cancel_once_exited)
                await rt.unload(A)
        await anyio.sleep(1.5)  # the watchers' ticks: anything owed would be settled
        assert rt.pool.supervisor(A).pid is None and engine_processes(world.token) == []
        during = held(world)
    assert engine_processes(world.token) == []
    assert (during, held(world)) == ([], []), "the ledger holds memory for an engine that exited"


KEY = "ballast:m:0"


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
        assert rt.queues() == {} and rt._lanes.engine_keys() == []


async def test_a_running_engine_has_a_queue_summary_with_its_live_width(world: World) -> None:
    async with runtime(world) as rt:
        key = await rt.bind("ballast", "m", "s1")
        view = rt.report.engine_status(key)
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
        stats = await rt.caches.stats(KEY)
        assert stats is not None and stats.entries == 1
        assert await rt.unload(KEY)  # the process, and its KV cache, are gone
        stats = await rt.caches.stats(KEY)
        # observed: the dead process's adapter stays registered: 1 entry, 1000 KiB "cached"
        assert stats is None or stats.entries == 0
