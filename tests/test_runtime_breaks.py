"""Hostile tests of the engine pool, router and ``hostler.Runtime`` (real processes, real ledger)."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

import hostler
from hostler.errors import HostlerError, RuntimeClosedError, UsageError

from _fake_engine import BallastEngine
from _pools import World, engine_processes, work, world_leaving_nothing

pytestmark = pytest.mark.anyio

A, B, C = "ballast:a:0", "ballast:b:0", "ballast:c:0"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with world_leaving_nothing(tmp_path) as made:
        yield made


def held(world: World) -> list[str]:
    return sorted(h.key for h in world.ledger.refresh().reservations.values())


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
