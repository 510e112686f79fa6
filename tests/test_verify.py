"""``hostler replay --verify``: every recorded decision re-derived with the current policy code.

The log tests record through the real pool (real supervisors, real processes of a known size,
the real ledger; :mod:`_pools`) with a 1 GiB budget that fits two engines, so starting a third
evicts. Unit tests hand-build each decision kind's event, edges included.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

import hostler.policies.pool as pool_policy
from _scenario import Scenario
from hostler.cli import main
from hostler.errors import CapacityDeniedError
from hostler.events.ledger import LedgerReserved
from hostler.machines.engine import EngineStopRequested
from hostler.postmortem.verify import (
    verify_records,
)
from hostler.store.log import EventStore

from _fake_engine import BallastEngine
from _pools import GIB, World, world_at

pytestmark = pytest.mark.anyio

A, B, C = "ballast:a:0", "ballast:b:0", "ballast:c:0"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with world_at(tmp_path) as made:
        yield made


def seqs(store: EventStore, type_name: str, stream: str | None = None) -> list[int]:
    return [
        r.seq
        for r in store.read_all()
        if r.type == type_name and (stream is None or r.stream_id == stream)
    ]


async def record_evictions(world: World) -> None:
    """A used twice, B once, then C: B goes (less demand); 100 s later B again: A goes."""
    async with world.pool(clock=world.clock) as pool:
        await pool.ensure(A)
        world.now += 1
        await pool.ensure(A)
        world.now += 1
        await pool.ensure(B)
        world.now += 1
        await pool.ensure(C)  # A: 2 requests in the last minute, B: 1 -> B is evicted
        assert pool.resident(A) and not pool.resident(B)
        world.now += 100
        await pool.ensure(B)  # nothing recent: the longest unused, A, goes
        assert pool.resident(B) and not pool.resident(A)
        huge = world.pool(price=2 * GIB, clock=world.clock)  # never fits: refused, no unload
        async with huge:
            with pytest.raises(CapacityDeniedError):
                await huge.ensure("ballast:huge:0")


async def test_a_real_log_with_evictions_verifies_with_no_difference(world: World) -> None:
    await record_evictions(world)
    report = verify_records(world.store.read_all())
    assert report.differences == [] and report.unreadable == []
    assert report.by_kind["pool.room_planned/PP4"] == 3
    assert report.by_kind["engine.stop_requested/PP4"] == 2  # B's and A's evictions
    assert report.by_kind["pool.drain_ended/PP5"] == 2
    assert report.by_kind["ledger.denied/CB7"] == 1
    assert report.by_kind["ledger.reserved/CB7"] >= 4
    assert report.rederived == sum(report.by_kind.values())
    assert report.summary().startswith(f"{report.rederived} decisions re-derived, 0 differ")


async def test_a_narrower_demand_window_changes_exactly_the_first_eviction(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    await record_evictions(world)
    planned = seqs(world.store, "pool.room_planned")
    b_stop = [  # B's eviction; its stop at the pool's close (shutdown) decides nothing
        r.seq
        for r in world.store.read_stream(f"engine/{B}")
        if isinstance(r.event, EngineStopRequested) and r.event.reason == "evicted"
    ]
    assert len(b_stop) == 1
    # half a second: every request is already out of the window, so A (used longer ago) goes
    monkeypatch.setattr(pool_policy, "DEMAND_WINDOW", 0.5)
    report = verify_records(world.store.read_all())
    assert [f.seq for f in report.differences] == sorted([planned[0], *b_stop])
    first = report.differences[0]
    assert first.type == "pool.room_planned" and first.fields == ("evict",)
    assert first.recorded["evict"] == [B] and first.rederived is not None
    assert first.rederived["evict"] == [A]
    assert first.recorded["demand"] == {A: 2, B: 1} and first.rederived["demand"] == {A: 0, B: 0}
    stop = report.differences[1]
    assert stop.fields == ("chosen",) and stop.recorded["chosen"] is True
    assert stop.rederived == {"chosen": False, "drain": "evict"}


async def test_the_cli_verifies_a_log_and_exits_1_on_a_difference(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    await record_evictions(world)
    path = str(world.tmp_path / "events.db")
    assert main(["replay", "--verify", path]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("decisions re-derived", len(out[-1].split()[0]) + 1)
    assert " 0 differ (by kind: " in out[-1] and "pool.room_planned/PP4 3" in out[-1]
    monkeypatch.setattr(pool_policy, "DEMAND_WINDOW", 0.5)
    assert main(["replay", "--verify", "--db", path, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["differ"] == 2 and report["log"].endswith("events.db")
    assert [d["type"] for d in report["differences"]] == [
        "pool.room_planned",
        "engine.stop_requested",
    ]
    assert main(["replay", "--verify", path]) == 1
    text = capsys.readouterr().out
    assert f"recorded:   evict={json.dumps([B])}" in text
    assert f"re-derived: evict={json.dumps([A])}" in text


async def test_sessions_bound_by_the_real_runtime_re_derive(world: World) -> None:
    import hostler

    engine = BallastEngine(world.tmp_path, 10)
    runtime = hostler.Runtime(
        world.store,
        world.supervisor_factory(engine),
        ledger=world.ledger,
        drain_poll=0.02,
    )
    async with runtime as rt:
        await rt.reconcile({"ballast:m": 2})
        for i in range(3):
            await rt.bind("ballast", "m", f"s{i}")
        await rt.bind("ballast", "n", "lonely")  # no replica of n runs: replica 0, "first"
    report = verify_records(world.store.read_all())
    assert report.differences == []
    assert report.by_kind["router.bound/PP11"] == 4


def test_the_cli_refuses_without_verify_and_with_two_logs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with EventStore.open(tmp_path / "e.db"):
        pass
    assert main(["replay", str(tmp_path / "e.db")]) == 2
    assert "--verify" in capsys.readouterr().err
    assert main(["replay", "--verify", str(tmp_path / "e.db"), "--db", "x.db"]) == 2
    assert "replay: give the log once: as LOG or as --db" in capsys.readouterr().err
    assert main(["replay", "--verify", str(tmp_path / "none.db")]) != 0
    err = capsys.readouterr().err
    assert err.startswith("hostler: error [") and "Traceback" not in err


def test_an_empty_log_has_nothing_to_differ(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with EventStore.open(tmp_path / "e.db"):
        pass
    assert main(["replay", "--verify", str(tmp_path / "e.db")]) == 0
    assert capsys.readouterr().out.strip() == "0 decisions re-derived, 0 differ (by kind: none)"


# -- unreadable rows ----------------------------------------------------------------------------


def _insert(path: Path, stream: str, type_name: str, payload: str, schema: int = 1) -> None:
    raw = sqlite3.connect(path)
    try:
        raw.execute(
            "INSERT INTO events (stream_id, version, type, schema_version, payload, metadata, "
            "recorded_at) VALUES (?, 1, ?, ?, ?, '{}', '2026-01-01T00:00:00.000000Z')",
            (stream, type_name, schema, payload),
        )
        raw.commit()
    finally:
        raw.close()


def test_unknown_damaged_and_misfit_rows_are_reported_not_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "e.db"
    with EventStore.open(path) as store:
        reserved = LedgerReserved("k", 1, "o", 0, 0, 100, 80, True)
        store.append("ledger/host", [reserved], expected_version=0)
    _insert(path, "x/1", "plugin.future_thing", "{}")
    _insert(path, "x/2", "pool.room_planned", "not json at all")
    _insert(path, "x/3", "ledger.denied", json.dumps({"key": "k"}))  # fields missing
    with EventStore.open(path) as store:
        report = verify_records(store.read_all())
    assert report.rederived == 1 and report.differences == []
    assert [(f.stream, f.status) for f in report.unreadable] == [
        ("x/1", "unreadable"),
        ("x/2", "unreadable"),
        ("x/3", "unreadable"),
    ]
    assert all(f.why for f in report.unreadable)
    assert main(["replay", "--verify", str(path)]) == 0  # nothing differs: reported, exit 0
    captured = capsys.readouterr()
    assert "3 rows unreadable" in captured.out
    assert captured.err.count("(not checked)") == 3


async def test_same_log_same_decisions_twice(world: World) -> None:
    await record_evictions(world)
    first = verify_records(world.store.read_all()).as_dict()
    assert verify_records(world.store.read_all()).as_dict() == first


async def test_a_real_queues_dispatches_re_derive_and_a_scoring_change_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from contextlib import AsyncExitStack

    import anyio

    import hostler.policies.queue as queue_policy
    from hostler.events.base import Event
    from hostler.runtime.queue import RequestQueue
    from hostler.testing.clock import VirtualClock
    from test_request_queue import Harness

    fake = VirtualClock(start=0.0)
    with EventStore.open(tmp_path / "q.db") as store:

        def record(event: Event) -> None:
            store.append("queue/llama:m:0", [event], expected_version=None)

        queue = RequestQueue("llama:m:0", 1, clock=fake, record=record, quiet_window=0)
        async with AsyncExitStack() as stack:
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(tg.cancel_scope.cancel)
            h = Harness(queue, tg)
            await h.submit("s1", session_id="s")
            await h.submit("other", session_id="x")
            await h.submit("bg", lane="background", group="g")
            await h.submit("s2", session_id="s")
            await h.submit("mine", session_id="s", affinity=False)
            await h.submit("gone", session_id="y")
            assert queue.move(5, "up") and queue.move(5, "up")  # mine: ahead of s2, then other
            assert queue.cancel(6)
            await fake.advance(1.0)
            await h.finish("s1")  # s2: same session (affinity)
            await fake.advance(61.0)
            await h.finish("s2")  # every one waited past a minute: starvation, in rank order
            for _ in range(3):
                await h.finish(h.started[-1])
            assert h.started == ["s1", "s2", "mine", "other", "bg"]
        report = verify_records(store.read_all())
        assert report.differences == [] and report.not_rederivable == []
        assert report.by_kind["queue.dispatched/Q4"] == 5
        rules = {
            r.seq: getattr(r.event, "decision")["rule"]  # noqa: B009
            for r in store.read_all()
            if r.type == "queue.dispatched"
        }
        assert sorted(set(rules.values())) == ["affinity", "oldest", "starvation"]
        # the pick no longer scores affinity: exactly the affinity-ruled dispatches change
        monkeypatch.setattr(queue_policy, "_score", lambda *_: 0)
        changed = verify_records(store.read_all())
        assert [f.seq for f in changed.differences] == [
            s for s, rule in rules.items() if rule == "affinity"
        ]
        assert changed.differences[0].recorded == {"id": 4, "rule": "affinity"}
        assert changed.differences[0].rederived == {"id": 5, "rule": "oldest"}  # first in rank


@pytest.mark.slow
def test_a_log_of_real_llama_servers_swapping_verifies(scenario: Scenario) -> None:
    """Real llama-server engines, tiny real models, a budget for two of three (the recorded
    scenario of conftest.py, shared with the other post-mortem tests): every swap's decisions
    (plans, evictions, drains, admissions) re-derive as recorded."""
    with EventStore.open(scenario.log) as store:
        report = verify_records(store.read_all())
    assert report.differences == [] and report.unreadable == []
    assert report.by_kind["pool.room_planned/PP4"] >= 3
    assert report.by_kind["engine.stop_requested/PP4"] >= 3
    assert report.by_kind["pool.drain_ended/PP5"] >= 3
