"""The GPU arbiter driver (GA1–GA7): waits, evictions, recorded leases, leak breaks, flips."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio
import pytest

from hostler import EventStore, Lease, load
from hostler.errors import DeviceUnhealthyError, UsageError
from hostler.policies.arbiter import Pressure
from hostler.policies.health import HealthPolicy, Reading
from hostler.runtime.arbiter import DEFAULT_OWNER, GpuArbiter
from hostler.runtime.health import DeviceHealthGate, HealthSample
from test_device_health import FakeTime

pytestmark = pytest.mark.anyio

GIB = 1024**3


class Clock:
    """Wall seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


async def settle(rounds: int = 20) -> None:
    """Let every ready task run (no real time passes)."""
    for _ in range(rounds):
        await anyio.lowlevel.checkpoint()


def swap(**kw: object) -> tuple[GpuArbiter, Clock]:
    clock = Clock()
    return GpuArbiter("swap", clock=clock, **kw), clock  # type: ignore[arg-type]


def types(arbiter: GpuArbiter) -> list[str]:
    return [type(e).__name__ for _, e in arbiter.history]


async def test_an_image_lease_blocks_an_llm_acquire_until_released() -> None:
    arbiter, _ = swap()
    evicted: list[str] = []

    async def evict_image() -> None:
        evicted.append("image")

    arbiter.register_evictor("image", evict_image)
    release = await arbiter.acquire_lease("image", "job-7")
    done = anyio.Event()

    async def llm() -> None:
        await arbiter.acquire("llm")
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(llm)
        await settle()
        assert not done.is_set()
        assert evicted == []
        await release()
        await done.wait()
    assert evicted == ["image"]  # the llm acquire evicted the image slot once through
    assert types(arbiter) == ["LeaseRequested", "LeaseGranted", "LeaseReleased"]
    await release()  # idempotent: nothing more is recorded
    assert len(arbiter.history) == 3


async def test_a_same_slot_lease_does_not_block_a_plain_acquire() -> None:
    arbiter, _ = swap()
    async with arbiter.lease("llm", "batch"):
        with anyio.fail_after(1):
            await arbiter.acquire("llm")


async def test_any_held_lease_blocks_a_lease_even_of_the_same_slot() -> None:
    arbiter, _ = swap()
    order: list[str] = []

    async def second() -> None:
        async with arbiter.lease("image", "b"):
            order.append("b")

    async with anyio.create_task_group() as tg, arbiter.lease("image", "a"):
        tg.start_soon(second)
        await settle()
        assert [row["state"] for row in arbiter.leases()] == ["held", "waiting"]
        assert [row["holder"] for row in arbiter.leases()] == ["a", "b"]
        order.append("a")
    assert order == ["a", "b"]
    assert arbiter.leases() == []


async def test_lease_events_are_recorded_in_their_own_stream(store: EventStore) -> None:
    arbiter, clock = swap(store=store)
    release = await arbiter.acquire_lease("video", "render")
    clock.now += 30.0
    await release()
    (stream,) = {sid for sid, _ in arbiter.history}
    assert stream.startswith("lease/")
    lease = load(store, Lease, stream.removeprefix("lease/"))
    assert (lease.state, lease.slot, lease.holder) == ("released", "video", "render")
    assert lease.granted_at == 1_700_000_000.0
    assert lease.expires_at == 1_700_000_000.0 + 5400.0
    assert lease.end_cause == "released"
    assert [r.type for r in store.read_stream(stream)] == [
        "lease.requested",
        "lease.granted",
        "lease.released",
    ]
    assert all(r.metadata["actor"] == "gpu-arbiter" for r in store.read_stream(stream))


async def test_a_leaked_lease_is_broken_after_the_ceiling_and_waiters_proceed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    arbiter, clock = swap()
    leaked = await arbiter.acquire_lease("image", "crashed-job")  # never released
    got: list[str] = []

    async def waiter(slot: str) -> None:
        if slot == "video":
            async with arbiter.lease(slot, "next"):
                got.append(slot)
        else:
            await arbiter.acquire(slot)
            got.append(slot)

    with caplog.at_level(logging.ERROR, logger="hostler.runtime.arbiter"):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter, "video")
            tg.start_soon(waiter, "llm")
            await settle()
            clock.now += 5400.0  # at the ceiling: not yet a leak
            arbiter.recheck()
            await settle()
            assert got == []
            clock.now += 1.5
            arbiter.recheck()
    assert sorted(got) == ["llm", "video"]
    broken = [e for _, e in arbiter.history if type(e).__name__ == "LeaseBroken"]
    assert len(broken) == 1
    assert broken[0].stale_for == 1.5  # type: ignore[attr-defined]
    assert "5402 s, past the 5400 s ceiling" in broken[0].reason  # type: ignore[attr-defined]
    assert any("a leak" in r.getMessage() for r in caplog.records)
    before = len(arbiter.history)
    await leaked()  # the leaker's late release touches nothing
    assert len(arbiter.history) == before


async def test_the_recheck_timer_breaks_a_leak_without_being_woken() -> None:
    arbiter, clock = swap(recheck_every=0.01)
    await arbiter.acquire_lease("image", "leaker")
    clock.now += 5401.0
    with anyio.fail_after(2):
        async with arbiter.lease("llm", "next"):
            assert [row["holder"] for row in arbiter.leases()] == ["next"]


async def test_default_recheck_is_min_of_60_s_and_the_ceiling() -> None:
    assert GpuArbiter("swap").recheck_every == 60.0
    assert GpuArbiter("swap", ceiling=20.0).recheck_every == 20.0
    assert GpuArbiter("swap").ceiling == 5400.0


async def test_a_flip_to_coexist_wakes_waiters_with_a_noop_release() -> None:
    arbiter, _ = swap()
    await arbiter.acquire_lease("image", "holder")
    results: list[str] = []

    async def waiter() -> None:
        release = await arbiter.acquire_lease("llm", "waiter")
        await release()
        results.append("lease")

    async def plain() -> None:
        await arbiter.acquire("video")
        results.append("acquire")

    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            tg.start_soon(plain)
            await settle()
            assert results == []
            arbiter.set_policy("coexist")
    assert sorted(results) == ["acquire", "lease"]
    assert arbiter.mode == "coexist"
    causes = [getattr(e, "cause", None) for _, e in arbiter.history]
    assert "policy switched to coexist" in causes
    # the holder's lease is untouched by the flip
    assert [row["holder"] for row in arbiter.leases()] == ["holder"]


async def test_set_policy_is_live_and_validated() -> None:
    arbiter = GpuArbiter()
    assert arbiter.mode == "coexist"  # GA7: auto means coexist
    arbiter.set_policy("coexist")  # unchanged: no-op
    arbiter.set_policy("SWAP")
    assert str(arbiter.mode) == "swap"
    with pytest.raises(UsageError, match="not a GPU policy"):
        arbiter.set_policy("exclusive")
    with pytest.raises(UsageError):
        GpuArbiter("greedy")


async def test_coexist_never_waits_nor_evicts_nor_records() -> None:
    arbiter = GpuArbiter("coexist")
    evicted: list[str] = []

    async def evict() -> None:
        evicted.append("x")

    arbiter.register_evictor("image", evict)
    release = await arbiter.acquire_lease("llm")
    release_2 = await arbiter.acquire_lease("llm")
    await arbiter.acquire("video")
    await release()
    await release_2()
    assert evicted == [] and arbiter.leases() == [] and list(arbiter.history) == []


async def test_evictor_errors_are_swallowed_and_every_other_slot_is_evicted_in_turn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    arbiter, _ = swap()
    calls: list[str] = []

    def evictor(name: str, fail: bool = False) -> Callable[[], Awaitable[None]]:
        async def evict() -> None:
            calls.append(name)
            if fail:
                raise RuntimeError(f"{name} would not stop")

        return evict

    arbiter.register_evictor("image", evictor("image-default", fail=True))
    arbiter.register_evictor("image", evictor("image-replica", fail=True), owner="replica")
    arbiter.register_evictor("video", evictor("video"))
    arbiter.register_evictor("llm", evictor("llm-self"))
    with caplog.at_level(logging.ERROR, logger="hostler.runtime.arbiter"):
        await arbiter.acquire("llm")
    assert calls == ["image-default", "image-replica", "video"]
    failures = [r for r in caplog.records if "failed; going on" in r.getMessage()]
    assert len(failures) == 2


async def test_evictor_registration_replace_and_unregister() -> None:
    arbiter, _ = swap()
    calls: list[str] = []

    async def first() -> None:
        calls.append("first")

    async def second() -> None:
        calls.append("second")

    assert DEFAULT_OWNER == "default"
    arbiter.register_evictor("image", first)
    arbiter.register_evictor("image", second)  # same (slot, owner): replaces
    arbiter.register_evictor("image", first, owner="engine-2")
    assert arbiter.evictors() == {"image": ["default", "engine-2"]}
    await arbiter.acquire("llm")
    assert sorted(calls) == ["first", "second"]
    arbiter.unregister_evictor("image", owner="engine-2")
    assert arbiter.evictors() == {"image": ["default"]}
    arbiter.unregister_evictor("image")
    assert arbiter.evictors() == {}
    arbiter.unregister_evictor("image")  # unknown: no-op
    arbiter.unregister_evictor("video", owner="nobody")
    with pytest.raises(UsageError, match="'gpu'"):
        arbiter.register_evictor("gpu", first)


async def test_unknown_slot_is_refused() -> None:
    arbiter, _ = swap()
    with pytest.raises(UsageError, match="llm, image, video"):
        await arbiter.acquire("audio")
    with pytest.raises(UsageError):
        await arbiter.acquire_lease("audio")
    assert list(arbiter.history) == []


class Temps:
    def __init__(self, temps: list[float]) -> None:
        self.temps, self.calls = temps, 0

    async def __call__(self) -> HealthSample:
        temp = self.temps[min(self.calls, len(self.temps) - 1)]
        self.calls += 1
        return HealthSample((Reading("0", temp, total_mib=10_000.0, used_mib=9_500.0),))


def health(policy: HealthPolicy, temps: list[float]) -> tuple[DeviceHealthGate, Temps]:
    sampler = Temps(temps)
    return DeviceHealthGate(policy, sampler, clock=FakeTime()), sampler


async def test_the_health_gate_runs_last_with_the_slot_as_context() -> None:
    gate, sampler = health(HealthPolicy(mode="guard"), [90, 70, 70, 70])
    arbiter, _ = swap(health_gate=gate)
    await arbiter.acquire("image")
    assert sampler.calls == 4  # held until three healthy samples
    gate, _ = health(HealthPolicy(mode="guard", max_wait=0.0), [90])
    for mode in ("swap", "coexist"):
        arbiter = GpuArbiter(mode, health_gate=gate)
        with pytest.raises(DeviceUnhealthyError, match=r"^image workload blocked"):
            await arbiter.acquire("image")
        with pytest.raises(DeviceUnhealthyError, match=r"^video workload blocked"):
            await arbiter.acquire_lease("video")


async def test_a_gate_refusal_releases_the_lease_and_wakes_waiters() -> None:
    gate, _ = health(HealthPolicy(mode="guard", max_wait=0.0), [90])
    arbiter, _ = swap(health_gate=gate)
    with pytest.raises(DeviceUnhealthyError):
        await arbiter.acquire_lease("video", "render")
    assert arbiter.leases() == []
    assert types(arbiter) == ["LeaseRequested", "LeaseGranted", "LeaseReleased"]
    cause = getattr(arbiter.history[-1][1], "cause", "")
    assert cause.startswith("failed: DeviceUnhealthyError(")


async def test_a_cancelled_waiter_gives_up_its_request() -> None:
    arbiter, _ = swap()
    await arbiter.acquire_lease("image", "holder")
    async with anyio.create_task_group() as tg:
        tg.start_soon(arbiter.acquire_lease, "llm", "impatient")
        await settle()
        assert len(arbiter.leases()) == 2
        tg.cancel_scope.cancel()
    assert [row["holder"] for row in arbiter.leases()] == ["holder"]
    assert getattr(arbiter.history[-1][1], "cause", "") == "gave up waiting"


async def test_leases_listing() -> None:
    arbiter, clock = swap()
    await arbiter.acquire_lease("image", "job")
    clock.now += 12.5
    (row,) = arbiter.leases()
    assert row["slot"] == "image" and row["state"] == "held"
    assert row["since"] == 1_700_000_000.0 and row["held_for"] == 12.5
    assert row["expires_at"] == 1_700_000_000.0 + 5400.0
    assert len(row["id"]) == 16


async def test_pressure_from_the_gate_readings() -> None:
    gate, _ = health(HealthPolicy(), [50])
    arbiter = GpuArbiter("swap", health_gate=gate)
    pressure = await arbiter.pressure()
    assert pressure.total == 10_000 * 1024**2 and pressure.used == 9_500 * 1024**2
    assert pressure.pressured  # 500 MiB free < 1 GiB
    assert await GpuArbiter().pressure() == Pressure(0, 0, 0, False)
