"""The engine pool with real supervisors, real processes of a known size, and a real ledger.

Each engine is :class:`_fake_engine.BallastEngine`: a process that holds a set amount of
touched memory (so the ledger's measured bytes are real), answers /health, and serves /busy/N
requests that keep it busy for N seconds. The budget (1 GiB, enforced) fits two of them.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.lowlevel
import psutil
import pytest

import hostler
from hostler.engines.launcher import FixedLauncher, Launch
from hostler.errors import (
    CapacityDeniedError,
    EngineBusyError,
    HostlerError,
    PluginError,
    RuntimeClosedError,
    UsageError,
)
from hostler.plugin import LaunchSpec
from hostler.runtime.pool import DRAIN_POLL

from _fake_engine import BallastEngine
from _pools import GIB, PRICE, World, engine_processes, held, work, world_leaving_nothing

pytestmark = pytest.mark.anyio

A, B, C = "ballast:a:0", "ballast:b:0", "ballast:c:0"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with world_leaving_nothing(tmp_path) as made:
        yield made


def test_constants_by_value() -> None:
    assert DRAIN_POLL == 0.5


async def test_concurrent_ensures_join_one_build(world: World) -> None:
    async with world.pool() as pool:
        ports: list[int] = []

        async def one() -> None:
            ports.append(await pool.ensure(A))

        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(one)
        assert len(set(ports)) == 1 and len(ports) == 6
        assert world.types(f"engine/{A}").count("engine.start_requested") == 1
        assert pool.resident(A)


async def test_victims_by_demand_then_age_and_the_log_explains(world: World) -> None:
    async with world.pool(clock=world.clock) as pool:
        await pool.ensure(A)
        world.now += 1
        await pool.ensure(B)
        world.now += 1
        await pool.ensure(B)  # B: two requests in the last minute, A one
        world.now += 1
        await pool.ensure(C)  # needs room: A goes (fewer hits), B stays
        assert pool.resident(B) and pool.resident(C) and not pool.resident(A)
        [(reason, decision)] = world.stops(A)
        assert reason == "evicted"
        assert decision is not None and decision["for"] == C and decision["evict"] == [A]
        figures = {c["key"]: c["recent_hits"] for c in decision["candidates"]}
        assert figures == {A: 1, B: 2}
        [planned] = world.pool_events("pool.room_planned")
        assert planned["for_key"] == C and planned["evict"] == [A] and planned["reachable"]
        assert planned["shortfall"] > 0 and planned["wanted"] == PRICE
        # equal demand: the longer unused goes. B (now 2 hits, used at t+2) vs C (1 hit, t+3)
        world.now += 61  # the last minute's hits are out of the window for both
        await pool.ensure(C)  # C used last
        world.now += 1
        await pool.ensure(A)
        assert pool.resident(A) and pool.resident(C) and not pool.resident(B)


async def test_eviction_releases_only_after_the_engine_exited(world: World) -> None:
    async with world.pool() as pool:
        await pool.ensure(A)
        await pool.ensure(B)
        pid_a = pool.supervisor(A).pid
        await pool.ensure(C)
        assert pid_a is not None and not psutil.pid_exists(pid_a)
        rows = list(world.store.read_all())
        exited = next(
            r.seq for r in rows if r.stream_id == f"engine/{A}" and r.type == "engine.stopped"
        )
        released = next(
            r.seq
            for r in rows
            if r.type == "ledger.released" and getattr(r.event, "key") == A  # noqa: B009
        )
        assert exited < released


async def test_a_busy_victim_drains_past_the_bound_while_the_start_is_wanted(world: World) -> None:
    """PP5 (issue 21): a drain that makes room for a start waits for its victim's requests as
    long as the start is wanted (its requesters' own deadlines end it, PP18) — once it gave up
    at ``drain_wait`` and refused everyone behind it ``engine-busy``."""
    async with world.pool(drain_wait=0.4) as pool:
        port_a = await pool.ensure(A)
        await pool.ensure(B)

        async def long_request(key: str, port: int, seconds: float) -> None:
            async with pool.use(key):
                await anyio.to_thread.run_sync(work, port, seconds)

        async with anyio.create_task_group() as tg:
            tg.start_soon(long_request, A, port_a, 1.5)
            tg.start_soon(long_request, B, pool.supervisor(B).port or 0, 3.0)
            await anyio.sleep(0.2)
            await pool.ensure(C)  # the least recently used victim, A, once its request ends
            assert pool.resident(C) and pool.resident(B) and not pool.resident(A)
        ended = world.pool_events("pool.drain_ended")
        assert [(e["key"], e["outcome"]) for e in ended] == [(A, "evicted")]
        assert ended[0]["waited"] > 0.4  # past the old bound, recorded
        started = world.pool_events("pool.drain_started")
        assert [(e["key"], e["wait"]) for e in started] == [(A, None)]


async def test_an_operator_drain_keeps_its_bound(world: World) -> None:
    """PP5: a drain for nobody's start (a reconcile) still gives up after ``drain_wait``."""
    async with world.pool(drain_wait=0.4) as pool:
        port_a = await pool.ensure(A)

        async def long_request() -> None:
            async with pool.use(A):
                await anyio.to_thread.run_sync(work, port_a, 2.0)

        async with anyio.create_task_group() as tg:
            tg.start_soon(long_request)
            await anyio.sleep(0.2)
            started = time.monotonic()
            report = await pool.reconcile({"ballast:a": 0})
            assert time.monotonic() - started < 1.5
            assert report.evicted == ()
            assert "did not drain within 0.4 s" in report.failed[A]
            assert pool.resident(A)
        ended = world.pool_events("pool.drain_ended")
        # past the bound (decided on the exact figure; recorded to the millisecond, 0.4003 → 0.4)
        assert [e["outcome"] for e in ended] == ["busy"] and ended[0]["waited"] >= 0.4
        assert world.stops(A) == []  # it stays, reservation and all


async def test_a_draining_victim_takes_no_new_work(world: World) -> None:
    order: list[str] = []
    async with world.pool(drain_wait=10) as pool:
        port_a = await pool.ensure(A)
        port_b = await pool.ensure(B)
        c_started = anyio.Event()

        async def hold(key: str, port: int, seconds: float) -> None:
            async with pool.use(key):
                await anyio.to_thread.run_sync(work, port, seconds)
                order.append(f"{key} request done")

        async def want_c() -> None:
            await pool.ensure(C)
            order.append("C started")
            c_started.set()

        async def late_for_a() -> None:
            async with pool.use(A):
                order.append("late A request ran")

        async with anyio.create_task_group() as tg:
            tg.start_soon(hold, A, port_a, 1.0)
            tg.start_soon(hold, B, port_b, 3.0)
            await anyio.sleep(0.3)
            tg.start_soon(want_c)  # both busy: the least recently used one, A, drains
            await anyio.sleep(0.2)
            assert [v.key for v in pool.snapshot() if v.draining] == [A]
            tg.start_soon(late_for_a)
            await c_started.wait()
        assert order.index(f"{A} request done") < order.index("C started")
        assert order.index("C started") < order.index("late A request ran")
        # the late request never reached the draining engine: A was evicted, then built again
        assert world.stops(A)[0][0] == "evicted"
        assert world.types(f"engine/{A}").count("engine.start_requested") == 2


async def test_a_flooded_victim_still_gives_way_within_the_drain_bound(world: World) -> None:
    """The starvation Ollama and llama-swap users report: new work keeps the victim busy."""
    flood_served = 0
    async with world.pool(drain_wait=5) as pool:
        port_a = await pool.ensure(A)
        port_b = await pool.ensure(B)
        stop_flood = anyio.Event()

        async def flood(key: str, port: int) -> None:
            nonlocal flood_served
            while not stop_flood.is_set():
                try:
                    async with pool.use(key) as live:
                        await anyio.to_thread.run_sync(work, live, 0.05)
                        flood_served += 1
                except RuntimeClosedError:
                    return
                except HostlerError:  # its own swap back may find every other engine busy
                    await anyio.sleep(0.05)

        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(flood, A, port_a)
                tg.start_soon(flood, B, port_b)
            await anyio.sleep(0.5)
            started = time.monotonic()
            await pool.ensure(C)  # must not wait forever behind the flood
            took = time.monotonic() - started
            stop_flood.set()
        assert took < 5.0, took
        assert flood_served > 10
        assert any(e["outcome"] == "evicted" for e in world.pool_events("pool.drain_ended"))


async def test_an_unreachable_start_unloads_nothing(world: World) -> None:
    async with world.pool() as pool:
        await pool.ensure(A)
        huge = world.pool(price=2 * GIB)  # same ledger: 2 GiB never fits in 1 GiB
        async with huge:
            with pytest.raises(CapacityDeniedError, match="nothing was unloaded") as denied:
                await huge.ensure(C)
        assert "the ledger: " in str(denied.value)  # and the ledger recorded its refusal
        assert "ledger.denied" in world.types("ledger/host")
        [planned] = world.pool_events("pool.room_planned")
        assert planned["reachable"] is False and planned["evict"] == []
        assert pool.resident(A)


async def test_evictions_do_not_spend_the_restart_budget(world: World) -> None:
    async with world.pool() as pool:
        for _ in range(3):  # each round evicts one of the three: 5+ starts each in seconds
            for key in (A, B, C):
                await pool.ensure(key)
        assert world.types(f"engine/{A}").count("engine.start_requested") >= 3


async def test_unload_idle_and_release_idle(world: World) -> None:
    async with world.pool() as pool:
        assert await pool.unload_idle(A) is False  # not resident
        port_a = await pool.ensure(A)
        await pool.ensure(B)
        async with anyio.create_task_group() as tg:

            async def busy_a() -> None:
                async with pool.use(A):
                    await anyio.to_thread.run_sync(work, port_a, 0.6)

            tg.start_soon(busy_a)
            await anyio.sleep(0.2)
            with pytest.raises(EngineBusyError, match="busy; not unloading"):
                await pool.unload_idle(A)
            assert await pool.release_idle() == [A]
            assert not pool.resident(B)
        assert await pool.unload_idle(A) is True
        assert not pool.resident(A)
        assert [reason for reason, _ in world.stops(A)] == ["evicted"]


async def test_reconcile_to_replica_counts(world: World) -> None:
    small = BallastEngine(world.tmp_path, 10)
    async with world.pool(small) as pool:
        report = await pool.reconcile({"ballast:a": 2})
        assert report.started == ("ballast:a:0", "ballast:a:1") and not report.failed
        report = await pool.reconcile({"ballast:a": 1, "ballast:b": 1})
        assert report.evicted == ("ballast:a:1",)
        assert report.started == ("ballast:b:0",)
        assert pool.resident("ballast:a:0") and not pool.resident("ballast:a:1")


async def test_a_pinned_engine_comes_back_after_a_crash_and_is_never_a_victim(
    world: World,
) -> None:
    async with world.pool(pinned=[A], pin_interval=0.05) as pool:
        # resident counts a start in progress (no pid yet): wait for it to run
        with anyio.fail_after(10):
            while pool.supervisor(A).state != "running":
                await anyio.sleep(0.05)
        pid = pool.supervisor(A).pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        with anyio.fail_after(10):
            while pool.supervisor(A).pid in (None, pid) or pool.supervisor(A).state != "running":
                await anyio.sleep(0.05)
        assert "engine.crashed" in world.types(f"engine/{A}")
        await pool.ensure(B)
        await pool.ensure(C)  # room comes from B, never from the pinned A
        assert pool.resident(A) and pool.resident(C) and not pool.resident(B)


async def test_close_during_a_build_and_a_request_leaves_no_process(world: World) -> None:
    (world.tmp_path / "slow").mkdir()
    slow = BallastEngine(world.tmp_path / "slow", 10, load_seconds=30)
    pool_fast = world.pool(BallastEngine(world.tmp_path, 10))
    pool_slow = world.pool(slow)
    cut: list[str] = []
    async with pool_fast, pool_slow:
        port = await pool_fast.ensure(A)

        async def streaming() -> None:
            async with pool_fast.use(A):
                try:
                    await anyio.to_thread.run_sync(work, port, 30.0, abandon_on_cancel=True)
                except (OSError, http.client.HTTPException):
                    cut.append("the shutdown ended the request")  # its engine was stopped

        async def building() -> None:
            with pytest.raises(RuntimeClosedError):
                await pool_slow.ensure(B)

        async with anyio.create_task_group() as tg:
            tg.start_soon(streaming)
            tg.start_soon(building)
            with anyio.fail_after(10):
                while pool_slow.supervisor(B).pid is None:
                    await anyio.sleep(0.05)
            await anyio.sleep(0.3)
            await pool_slow.close()
            await pool_fast.close()
            tg.cancel_scope.cancel()
    assert engine_processes(world.token) == []
    assert cut == ["the shutdown ended the request"]
    assert [reason for reason, _ in world.stops(A)] == ["shutdown"]
    assert [reason for reason, _ in world.stops(B)] == ["start-cancelled"]
    with pytest.raises(RuntimeClosedError):
        await pool_fast.ensure(A)


class _Launcher:
    """A launcher whose first price raises or answers ``first``, then ``PRICE`` bytes."""

    def __init__(self, key: str, run: Path, world: World, first: object) -> None:
        self.spec = lambda port: LaunchSpec(key, world.model, port, ctx_per_slot=512, work_dir=run)
        self.answers: list[object] = [PRICE, first]  # popped from the end

    def price(self) -> Launch:
        answer = self.answers.pop() if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, BaseException):
            raise answer
        return FixedLauncher(self.spec, lambda: answer).price()


async def test_a_price_that_raises_anything_is_left_to_the_start_to_record(world: World) -> None:
    """A plugin's SystemExit while the pool prices an engine must not end the daemon."""
    launchers = functools.partial(_Launcher, world=world, first=SystemExit(3))
    async with world.pool(launcher=launchers) as pool:
        assert await pool.ensure(A) > 0  # its supervisor priced it itself, and started it
        assert world.pool_events("pool.room_planned") == []


async def test_a_negative_or_bogus_price_evicts_nothing(world: World) -> None:
    """A broken plugin's price (-5, NaN) is not a reason to unload anyone."""
    bogus = {A: -5, B: float("nan"), C: -5}

    def launchers(key: str, run: Path) -> _Launcher:
        return _Launcher(key, run, world, bogus[key])

    async with world.pool(launcher=launchers) as pool:
        for key in (A, B):  # each one's first price is the bogus one: refused, then 430 MiB
            with pytest.raises(PluginError, match="estimate_footprint"):
                await pool.ensure(key)
            await pool.ensure(key)
        with pytest.raises(PluginError, match="estimate_footprint"):
            await pool.ensure(C)  # 1 GiB holds two; evicting for a bogus price is wrong
        assert pool.resident(A) and pool.resident(B)
    assert world.pool_events("pool.room_planned") == []


async def test_stop_listeners_hear_the_port_before_the_engine_stops(world: World) -> None:
    heard: list[tuple[int, bool]] = []
    async with world.pool() as pool:

        async def listener(port: int) -> None:
            sup = pool.supervisor(A)
            heard.append((port, sup.pid is not None and psutil.pid_exists(sup.pid)))

        async def broken(_port: int) -> None:
            raise RuntimeError("a listener's own trouble")

        pool.on_stopping(broken)  # never keeps an engine from stopping
        pool.on_stopping(listener)
        await pool.ensure(A)
        await pool.ensure(B)
        port_a = pool.supervisor(A).port
        await pool.ensure(C)  # evicts A
        assert heard == [(port_a, True)]  # told while A still ran, with A's port
        assert pool.supervisor(A).pid is None
    ports = {port for port, _alive in heard}
    assert port_a in ports and len(heard) == 3  # closing the pool tells for B and C too


async def test_reconcile_past_the_budget_never_evicts_its_own_replicas(
    world: World,
) -> None:
    """PP10: a target that cannot fit must not churn: two 430 MiB replicas fit 1 GiB, three not."""
    async with world.pool() as pool:
        report = await pool.reconcile({"ballast:a": 3})
        resident = [k for k in pool.engine_keys() if pool.resident(k)]
        # every replica reported started must be resident, or the shortfall must be reported
        assert set(report.started) <= set(resident), (report, resident)


async def test_reconcile_to_zero_keeps_a_pinned_engine(world: World) -> None:
    """PP17: a pinned engine is never a victim and stays resident."""
    async with world.pool(pinned=[A], pin_interval=0.05) as pool:
        with anyio.fail_after(10):
            while not pool.resident(A):
                await anyio.sleep(0.05)
        await pool.reconcile({"ballast:a": 0})
        assert [reason for reason, _ in world.stops(A)] == []


async def test_release_idle_keeps_a_pinned_engine(world: World) -> None:
    """PP17 vs PP7: a live reset must not unload (and so reload) a pinned engine."""
    async with world.pool(pinned=[A], pin_interval=0.05) as pool:
        with anyio.fail_after(10):
            while pool.supervisor(A).state != "running" or pool.busy(A):
                await anyio.sleep(0.05)
        await pool.release_idle()
        assert [reason for reason, _ in world.stops(A)] == []


async def test_a_pinned_engine_that_can_never_start_does_not_spam_the_log(world: World) -> None:
    """PP17: a pinned engine whose model file is gone is retried within its restart budget."""
    world.model.unlink()
    async with world.pool(pinned=[A], pin_interval=0.05) as pool:
        await anyio.sleep(3)
        assert not pool.resident(A)
    starts = world.types(f"engine/{A}").count("engine.start_requested")
    assert starts <= 10, f"{starts} start attempts in 3 s"


async def test_a_pinned_key_the_factory_cannot_build_does_not_kill_the_pool(
    world: World,
) -> None:
    """PP17: trouble with one pinned engine is logged; the pool and its other engines go on."""
    good = world.supervisor_factory(BallastEngine(world.tmp_path, 10))

    def build(key: str):  # type: ignore[no-untyped-def]
        if key == "bogus:x:0":
            raise ValueError("no such engine configured")
        return good(key)

    async with hostler.Runtime(
        world.store,
        build,
        ledger=world.ledger,
        pinned=["bogus:x:0"],
        pin_interval=0.05,
    ) as rt:
        port = await rt.pool.ensure(A)
        await anyio.sleep(0.5)
        async with rt.request(A) as again:
            assert again == port
    assert engine_processes(world.token) == []


async def test_cancelling_one_caller_mid_build_leaves_the_build_for_the_others(
    world: World,
) -> None:
    (world.tmp_path / "slow").mkdir()
    slow = BallastEngine(world.tmp_path / "slow", 10, load_seconds=1.0)
    ports: list[int] = []
    async with world.pool(slow) as pool:
        async with anyio.create_task_group() as tg:

            async def impatient() -> None:
                with anyio.move_on_after(0.3):
                    await pool.ensure(A)

            async def patient() -> None:
                ports.append(await pool.ensure(A))

            tg.start_soon(impatient)
            tg.start_soon(patient)
        assert ports and pool.resident(A)
    assert engine_processes(world.token) == []
    assert held(world) == []


async def test_close_during_a_drain_leaves_nothing(world: World) -> None:
    async with world.pool(drain_wait=10) as pool:
        port_a = await pool.ensure(A)
        port_b = await pool.ensure(B)
        async with anyio.create_task_group() as tg:

            async def hold(key: str, port: int) -> None:
                with pytest.raises(BaseException):  # noqa: B017, PT011
                    async with pool.use(key):
                        await anyio.to_thread.run_sync(work, port, 5.0, abandon_on_cancel=True)

            async def want_c() -> None:
                with pytest.raises(RuntimeClosedError):
                    await pool.ensure(C)

            tg.start_soon(hold, A, port_a)
            tg.start_soon(hold, B, port_b)
            await anyio.sleep(0.3)
            tg.start_soon(want_c)
            await anyio.sleep(0.5)
            assert any(v.draining for v in pool.snapshot())
            await pool.close()
            await pool.close()  # twice
            tg.cancel_scope.cancel()
    assert engine_processes(world.token) == []
    assert held(world) == []
    assert [r for r, _ in world.stops(A)] == ["shutdown"]


async def test_kill_nine_during_a_drain(world: World) -> None:
    async with world.pool(drain_wait=10) as pool:
        port_a = await pool.ensure(A)
        port_b = await pool.ensure(B)
        async with anyio.create_task_group() as tg:

            async def hold(key: str, port: int, seconds: float) -> None:
                try:
                    async with pool.use(key):
                        await anyio.to_thread.run_sync(work, port, seconds)
                except Exception:  # noqa: S110 - the engine was killed under it
                    pass

            tg.start_soon(hold, A, port_a, 3.0)
            tg.start_soon(hold, B, port_b, 3.0)
            await anyio.sleep(0.3)
            tg.start_soon(pool.ensure, C)
            await anyio.sleep(0.3)
            pid = pool.supervisor(A).pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
        assert pool.resident(C)
    assert engine_processes(world.token) == []
    assert held(world) == []


async def test_an_engine_priced_at_zero_runs_alone_at_its_real_size(world: World) -> None:
    """No engine runs outside the ledger's accounting: a price of 0 must not admit 1.6 GiB of
    engines into a 1 GiB budget with the ledger holding 0 bytes for them."""
    async with world.pool(price=0) as pool:
        for key in (A, B, C, "ballast:d:0"):
            with contextlib.suppress(HostlerError):
                await pool.ensure(key)
        resident = [k for k in pool.engine_keys() if pool.resident(k)]
        committed = world.ledger.refresh().committed
        # four 400 MiB processes: either refused, or the ledger knows what they hold
        assert len(resident) <= 2 or committed >= len(resident) * 400 * 2**20, (
            resident,
            committed,
        )


async def test_ensure_never_hands_out_an_engine_that_is_draining(world: World) -> None:
    """PP1: a draining engine is never handed out. A build chosen as the drain fallback while
    its callers wait must not return its port to them as it is being evicted."""
    (world.tmp_path / "slow").mkdir()
    slow = BallastEngine(world.tmp_path / "slow", 400, load_seconds=1.5)
    fast = BallastEngine(world.tmp_path, 400)
    build_fast, build_slow = world.supervisor_factory(fast), world.supervisor_factory(slow)
    from hostler.runtime.pool import Pool

    pool = Pool(
        world.store,
        lambda key: build_slow(key) if key == B else build_fast(key),
        ledger=world.ledger,
        drain_poll=0.02,
        drain_wait=10,
    )
    seen: list[bool] = []
    async with pool:
        port_a = await pool.ensure(A)
        async with anyio.create_task_group() as tg:

            async def want_b() -> None:
                await pool.ensure(B)
                [view] = [v for v in pool.snapshot() if v.key == B]
                seen.append(view.draining)

            async def hold_a() -> None:
                async with pool.use(A):
                    await anyio.to_thread.run_sync(work, port_a, 3.0)

            tg.start_soon(want_b)
            await anyio.sleep(0.3)
            tg.start_soon(hold_a)  # A is now busy and more recently used than B
            await anyio.sleep(0.2)
            with contextlib.suppress(HostlerError):
                await pool.ensure(C)  # fallback: the least recently used busy one, B
    assert seen == [False], "ensure(B) returned while B was draining for C"


async def test_reconcile_with_a_malformed_model_name_starts_an_engine_it_cannot_find(
    world: World,
) -> None:
    """PP10 takes ``engine:model`` names; a full key (or garbage) must be refused, not started
    under a key that reconcile itself can never count or evict again."""
    small = BallastEngine(world.tmp_path, 10)
    async with world.pool(small) as pool:
        with contextlib.suppress(HostlerError, ValueError):
            await pool.reconcile({"ballast:a:0": 1})
        with contextlib.suppress(HostlerError, ValueError):
            await pool.reconcile({"ballast:a:0": 0})
        assert [k for k in pool.engine_keys() if pool.resident(k)] == []


async def test_a_deleted_model_file_fails_cleanly(world: World) -> None:
    async with world.pool() as pool:
        await pool.ensure(A)
        world.model.unlink()
        with pytest.raises(HostlerError, match="does not exist"):
            await pool.ensure(B)
        assert pool.resident(A)
        assert held(world) == [A]
    assert held(world) == []


async def test_two_pools_on_one_ledger_race_for_the_last_room(world: World) -> None:
    big = 600 * 2**20
    one = world.pool(BallastEngine(world.tmp_path, 10), price=big)
    two = world.pool(BallastEngine(world.tmp_path, 10), price=big)
    results: list[str] = []
    async with one, two:

        async def go(pool, key: str) -> None:  # type: ignore[no-untyped-def]
            try:
                await pool.ensure(key)
                results.append("ok")
            except HostlerError as exc:
                results.append(type(exc).__name__)

        async with anyio.create_task_group() as tg:
            tg.start_soon(go, one, A)
            tg.start_soon(go, two, B)
        assert sorted(results) == ["CapacityDeniedError", "ok"]
        assert world.ledger.refresh().committed <= 2**30
    assert engine_processes(world.token) == []
    assert held(world) == []


async def test_close_while_reconcile_runs(world: World) -> None:
    (world.tmp_path / "slow").mkdir()
    slow = BallastEngine(world.tmp_path / "slow", 10, load_seconds=0.5)
    async with world.pool(slow) as pool, anyio.create_task_group() as tg:
        tg.start_soon(pool.reconcile, {"ballast:a": 2, "ballast:b": 2})
        await anyio.sleep(0.8)
        await pool.close()
    assert engine_processes(world.token) == []
    assert held(world) == []


async def test_a_pinned_engine_too_big_for_the_budget_does_not_spam_the_log(
    world: World,
) -> None:
    """PP17: a pinned engine that can never fit is retried without writing the same refusal
    to the log at every check (capacity refusals do not spend the restart budget)."""
    async with world.pool(pinned=[A], pin_interval=0.05, price=2 * 2**30) as pool:
        await anyio.sleep(2)
        assert not pool.resident(A)
    planned = len(world.pool_events("pool.room_planned"))
    denied = world.types("ledger/host").count("ledger.denied")
    assert planned + denied <= 10, f"{planned} room plans and {denied} denials in 2 s"


async def test_kill_nine_the_new_engine_while_it_loads_after_make_room(world: World) -> None:
    (world.tmp_path / "slow").mkdir()
    slow = BallastEngine(world.tmp_path / "slow", 400, load_seconds=2.0)
    fast = BallastEngine(world.tmp_path, 400)
    build_fast, build_slow = world.supervisor_factory(fast), world.supervisor_factory(slow)
    from hostler.runtime.pool import Pool

    pool = Pool(
        world.store,
        lambda key: build_slow(key) if key == C else build_fast(key),
        ledger=world.ledger,
        drain_poll=0.02,
    )
    async with pool:
        await pool.ensure(A)
        await pool.ensure(B)
        async with anyio.create_task_group() as tg:

            async def want_c() -> None:
                with pytest.raises(HostlerError):
                    await pool.ensure(C)

            tg.start_soon(want_c)
            with anyio.fail_after(10):
                while pool.supervisor(C).pid is None:
                    await anyio.sleep(0.02)
            await anyio.sleep(0.3)
            os.kill(pool.supervisor(C).pid or 0, signal.SIGKILL)
        assert not pool.resident(C)
        assert held(world) == [B]
    assert engine_processes(world.token) == []
    assert held(world) == []


async def test_reconcile_refuses_malformed_targets_in_one_line(world: World) -> None:
    async with world.pool() as pool:
        for bad in (
            {"ballast:a": -1},
            {"ballast:a": 65},
            {"ballast:a": True},
            {"nocolon": 1},
            {"ballast:a:0": 1},
            {"ballast:a": 1.5},
        ):
            with pytest.raises(UsageError, match="reconcile"):
                await pool.reconcile(bad)  # type: ignore[arg-type]
        assert pool.engine_keys() == []  # nothing was started for a refused target
