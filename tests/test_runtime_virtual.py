"""The runtime (queue, pool, ledger, supervisors) on in-memory engines, in virtual time.

:class:`hostler.testing.Harness` with a :class:`~hostler.testing.fake_process.FakeRunner`, its
``FakeTransport`` and a :class:`~hostler.testing.clock.VirtualClock`: swaps, drains and queue
waits that take minutes of engine time run in milliseconds, over a real SQLite log and a real
host ledger (which asks the fake runner whether a reservation's process still runs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
from anyio.abc import TaskGroup

from hostler import Runtime
from hostler.store.log import EventStore
from hostler.testing.clock import VirtualClock
from hostler.testing.fake_engine import Behaviour, FakeEngineAdapter
from hostler.testing.fake_process import FakeRunner, FakeTransport
from hostler.testing.harness import FAST_POLICY, Harness

pytestmark = pytest.mark.anyio

A, B = "fake:a:0", "fake:b:0"
T0 = 1_800_000_000.0
MIB = 2**20


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EventStore]:
    with EventStore.open(tmp_path / "events.db", owner=True) as opened:
        yield opened


@pytest.fixture
async def clock() -> AsyncIterator[VirtualClock]:
    virtual = VirtualClock(T0)
    async with virtual.autojump():
        yield virtual


@pytest.fixture
def harness(tmp_path: Path, store: EventStore, clock: VirtualClock) -> Harness:
    """Engines of 600 MiB each (their ballast), 30 s to load, a 1 GiB budget: one fits."""
    runner = FakeRunner(clock, ready_after=30.0)
    return Harness(
        tmp_path / "data",
        store,
        {"fake": FakeEngineAdapter(Behaviour(ballast_mib=600))},
        clock=clock,
        policy=dataclasses.replace(FAST_POLICY, watch_interval=1.0, readiness_poll=0.5),
        budget=2**30,
        runner=runner,
        transport=FakeTransport(runner),
    )


def timeline(store: EventStore, *types: str) -> list[tuple[str, str, float]]:
    """(type, stream, seconds after T0) of the events of these types, in log order."""
    return [
        (r.type, r.stream_id, round(r.payload["at"] - T0, 3))
        for r in store.read_all()
        if r.type in types
    ]


async def hold(
    runtime: Runtime, key: str, let_go: anyio.Event, tasks: TaskGroup, clock: VirtualClock
) -> None:
    """A request on ``key`` that runs until ``let_go``; returns once its engine runs."""

    async def long_request() -> None:
        async with runtime.request(key):
            await let_go.wait()

    tasks.start_soon(long_request)
    while runtime.supervisor(key).state != "running":
        await clock.sleep(1.0)


async def test_a_request_for_another_model_swaps_in_virtual_time(
    harness: Harness, store: EventStore, clock: VirtualClock
) -> None:
    assert harness.price(A) > 600 * MIB  # so that two never fit the 1 GiB budget
    async with harness.runtime(drain_wait=30.0) as runtime:
        async with runtime.request(A):
            assert clock.monotonic() == 30.0  # the load, virtual
        async with runtime.request(B):
            assert clock.monotonic() == 60.0  # A evicted at once (idle), B loaded
        assert runtime.supervisor(A).state == "stopped"
        assert runtime.supervisor(B).state == "running"
    starts = timeline(store, "engine.start_requested", "engine.ready", "engine.stop_requested")
    assert starts[:5] == [
        ("engine.start_requested", f"engine/{A}", 0.0),
        ("engine.ready", f"engine/{A}", 30.0),
        ("engine.stop_requested", f"engine/{A}", 30.0),
        ("engine.start_requested", f"engine/{B}", 30.0),
        ("engine.ready", f"engine/{B}", 60.0),
    ]
    (planned,) = [r.payload for r in store.read_all() if r.type == "pool.room_planned"]
    assert (planned["for_key"], planned["evict"], planned["drain"]) == (B, [A], None)


async def test_a_busy_victim_is_drained_then_evicted_when_its_request_ends(
    harness: Harness, store: EventStore, clock: VirtualClock
) -> None:
    async with harness.runtime(drain_wait=120.0) as runtime:
        let_go = anyio.Event()
        async with anyio.create_task_group() as tasks:
            await hold(runtime, A, let_go, tasks, clock)

            released: list[float] = []

            async def end_it_later() -> None:
                await clock.sleep(45.0)
                released.append(clock.wall() - T0)
                let_go.set()

            tasks.start_soon(end_it_later)
            async with runtime.request(B):
                pass
    drains = timeline(store, "pool.drain_started", "pool.drain_ended")
    ready = timeline(store, "engine.ready")
    (started, ended), (end,) = drains, released
    assert [type_ for type_, _, _ in drains] == ["pool.drain_started", "pool.drain_ended"]
    assert started[2] < end <= ended[2] <= end + 0.02  # evicted at the first look after
    assert ready[-1] == ("engine.ready", f"engine/{B}", ended[2] + 30.0)
    outcome = [r.payload["outcome"] for r in store.read_all() if r.type == "pool.drain_ended"]
    assert outcome == ["evicted"]


async def test_a_start_waits_for_its_busy_victim_past_the_drain_bound(
    harness: Harness, store: EventStore, clock: VirtualClock
) -> None:
    """PP5 (issue 21): the start keeps its place while it is wanted; once it was refused at the
    bound (``engine-busy``) and its victim stayed."""
    async with harness.runtime(drain_wait=20.0) as runtime:
        let_go = anyio.Event()
        served: list[float] = []
        async with anyio.create_task_group() as tasks:
            await hold(runtime, A, let_go, tasks, clock)
            began = clock.monotonic()

            async def want_b() -> None:
                async with runtime.request(B):
                    served.append(clock.monotonic() - began)

            tasks.start_soon(want_b)
            await clock.sleep(60.0)
            assert served == []  # three times the bound, still waiting, nothing refused
            let_go.set()
        assert len(served) == 1 and served[0] >= 60.0
        assert runtime.supervisor(A).state != "running"  # evicted once idle
    ended = [r.payload for r in store.read_all() if r.type == "pool.drain_ended"]
    assert [e["outcome"] for e in ended] == ["evicted"]
    assert ended[0]["waited"] >= 60.0
