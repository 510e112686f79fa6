"""The prompt-cache controller (driver) with a fake adapter and a fake clock: CC2–CC10."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import anyio
import pytest

from hostler.events.base import Event, decode, encode
from hostler.events.cache import CacheBudgetSet, CacheEvicted, cache_stream
from hostler.plugin import CacheAdapter, CacheEntry
from hostler.runtime import cache as runtime_cache
from hostler.runtime.cache import CacheController
from hostler.testing.clock import VirtualClock

pytestmark = pytest.mark.anyio
UNIT = 102_400  # one token


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float = 1.0) -> None:
        self.now += seconds


class FakeAdapter:
    def __init__(self) -> None:
        self.evicted: list[list[str]] = []
        self.report: list[CacheEntry] | None = None
        self.fail: BaseException | None = None
        self.hang = False
        self.reports = 0

    def request_extras(self, session_id: str) -> dict[str, Any]:
        if self.fail is not None:
            raise self.fail
        return {"session": session_id}

    async def evict(self, ids: Sequence[str]) -> None:
        self.evicted.append(list(ids))
        if self.hang:
            await anyio.sleep_forever()
        if self.fail is not None:
            raise self.fail

    async def report_usage(self) -> list[CacheEntry] | None:
        self.reports += 1
        if self.hang:
            await anyio.sleep_forever()
        if self.fail is not None:
            raise self.fail
        return self.report


def make(**kw: Any) -> tuple[CacheController, Clock, list[Event]]:
    clock = Clock()
    events: list[Event] = []
    return CacheController(clock=clock, record=events.append, **kw), clock, events


def test_constants_and_the_fake_is_a_cache_adapter() -> None:
    assert runtime_cache.ADAPTER_TIMEOUT == 10.0
    assert isinstance(FakeAdapter(), CacheAdapter)
    assert cache_stream("llamacpp:m:0") == "cache/llamacpp:m:0"


async def test_record_turn_prices_touches_and_counts() -> None:
    ctl, clock, _ = make()
    adapter = FakeAdapter()
    ctl.register("e", adapter)
    await ctl.record_turn("e", "s1", 10, hit_source="fresh", group="g")
    clock.tick(5)
    await ctl.record_turn("e", "s1", 12, hit_source="memory")
    await ctl.record_turn("e", "s2", 3, was_hit=True)
    assert ctl.entries("e") == [
        CacheEntry("s1", 12, 12 * UNIT, 1005.0, "normal", "g"),
        CacheEntry("s2", 3, 3 * UNIT, 1005.0, "normal", None),
    ]
    stats = ctl.stats("e")
    assert stats is not None
    assert stats.total_bytes == 15 * UNIT
    assert stats.budget == 4 * 1024**3
    assert (stats.entries, stats.hits, stats.misses) == (2, 2, 1)
    assert stats.hit_rate == pytest.approx(2 / 3)
    assert stats.sources == {"memory": 1, "disk": 0, "prefix": 0, "fresh": 1}
    assert stats.groups == {"g": (0, 1)}
    assert stats.sessions == ["s1", "s2"]
    assert adapter.evicted == []


async def test_stats_sessions_are_most_recent_first_and_none_for_unknown() -> None:
    ctl, clock, _ = make()
    ctl.register("e", FakeAdapter())
    await ctl.record_turn("e", "old", 1)
    clock.tick()
    await ctl.record_turn("e", "new", 1)
    stats = ctl.stats("e")
    assert stats is not None and stats.sessions == ["new", "old"]
    assert stats.hit_rate == 0.0 and stats.misses == 2
    assert ctl.stats("nope") is None
    assert ctl.entries("nope") == []


async def test_a_turn_on_an_unregistered_engine_records_nothing() -> None:
    ctl, _, events = make()
    await ctl.record_turn("e", "s", 10)
    assert ctl.entries("e") == [] and events == []


async def test_a_bad_source_is_refused_before_anything_changes() -> None:
    ctl, _, _ = make()
    ctl.register("e", FakeAdapter())
    with pytest.raises(ValueError, match="not a cache source"):
        await ctl.record_turn("e", "s", 10, hit_source="warm")
    assert ctl.entries("e") == []


async def test_eviction_brings_the_total_under_80_percent_oldest_first() -> None:
    ctl, clock, events = make(default_budget=10 * UNIT)
    adapter = FakeAdapter()
    ctl.register("e", adapter)
    for sid in ("a", "b", "c", "d"):
        await ctl.record_turn("e", sid, 2)
        clock.tick()
    assert adapter.evicted == []  # 8 < 10
    await ctl.record_turn("e", "e1", 2)  # 10 >= 10: evict a (8, not < 8), b -> 6
    assert adapter.evicted == [["a", "b"]]
    assert [e.session_id for e in ctl.entries("e")] == ["c", "d", "e1"]
    (event,) = events
    assert isinstance(event, CacheEvicted)
    assert (event.key, event.ids, event.reason) == ("e", ["a", "b"], "watermark")
    assert event.decision["rule"] == "CC9"
    assert event.decision["total"] == 10 * UNIT
    assert event.decision["total_after"] == 6 * UNIT
    assert decode(*encode(event)) == event


async def test_pinned_low_sessions_go_last() -> None:
    ctl, clock, _ = make(default_budget=10 * UNIT)
    adapter = FakeAdapter()
    ctl.register("e", adapter)
    await ctl.record_turn("e", "keep", 3)  # the oldest
    clock.tick()
    await ctl.record_turn("e", "other", 3)
    ctl.pin("keep", "low")
    ctl.pin("absent", "low")  # nothing to pin: no error
    clock.tick()
    await ctl.record_turn("e", "third", 4)  # 10: other goes (normal), 7 < 8
    assert adapter.evicted == [["other"]]
    await ctl.record_turn("e", "keep", 3)  # a turn keeps the pin
    assert [(e.session_id, e.priority) for e in ctl.entries("e")] == [
        ("keep", "low"),
        ("third", "normal"),
    ]
    ctl.pin("keep", "normal")
    assert ctl.entries("e")[0].priority == "normal"
    with pytest.raises(ValueError, match="'high' is not a cache priority"):
        ctl.pin("keep", "high")  # type: ignore[arg-type]


async def test_pin_applies_on_every_engine_holding_the_session() -> None:
    ctl, _, _ = make()
    ctl.register("e1", FakeAdapter())
    ctl.register("e2", FakeAdapter())
    ctl.register("e3", FakeAdapter())
    await ctl.record_turn("e1", "s", 1)
    await ctl.record_turn("e2", "s", 1)
    ctl.pin("s", "low")
    assert [e.priority for e in ctl.entries("e1") + ctl.entries("e2")] == ["low", "low"]
    assert ctl.entries("e3") == []


async def test_a_budget_set_before_registration_applies_at_registration() -> None:
    ctl, _, events = make()
    await ctl.set_budget("e", 5 * UNIT)
    assert events == [CacheBudgetSet(key="e", bytes=5 * UNIT, previous=4 * 1024**3, applied=False)]
    adapter = FakeAdapter()
    ctl.register("e", adapter)
    assert ctl.budget("e") == 5 * UNIT
    await ctl.record_turn("e", "s", 5)
    assert adapter.evicted == [["s"]]


async def test_set_budget_on_a_registered_engine_enforces_at_once() -> None:
    ctl, clock, events = make()
    adapter = FakeAdapter()
    ctl.register("e", adapter)
    await ctl.record_turn("e", "a", 4)
    clock.tick()
    await ctl.record_turn("e", "b", 4)
    await ctl.set_budget("e", 8 * UNIT)  # 8 >= 8: a goes, 4 < 6.4
    assert adapter.evicted == [["a"]]
    assert isinstance(events[0], CacheBudgetSet) and events[0].applied is True
    assert events[0].previous == 4 * 1024**3
    assert isinstance(events[1], CacheEvicted)
    await ctl.set_budget("e", 9 * UNIT)
    assert events[2] == CacheBudgetSet(key="e", bytes=9 * UNIT, previous=8 * UNIT, applied=True)
    assert adapter.evicted == [["a"]]


async def test_register_replaces_the_adapter_and_clears_state_but_keeps_the_budget() -> None:
    ctl, _, _ = make()
    first, second = FakeAdapter(), FakeAdapter()
    ctl.register("e", first)
    await ctl.set_budget("e", 100 * UNIT)
    await ctl.record_turn("e", "s", 5, hit_source="memory")
    ctl.register("e", second)
    assert ctl.adapter("e") is second
    assert ctl.entries("e") == []
    stats = ctl.stats("e")
    assert stats is not None and (stats.hits, stats.budget) == (0, 100 * UNIT)
    assert first.evicted == [] and second.evicted == []
    ctl.unregister("e")
    assert ctl.adapter("e") is None and ctl.stats("e") is None
    ctl.unregister("e")  # twice is fine
    assert ctl.budget("e") == 100 * UNIT


async def test_a_budget_set_before_an_unregistration_applies_from_the_re_registration() -> None:
    ctl, _, events = make()
    ctl.register("e", FakeAdapter())
    await ctl.set_budget("e", 5 * UNIT)
    ctl.unregister("e")
    ctl.register("e", FakeAdapter())  # CC2: clean entries, the budget kept
    again = FakeAdapter()
    ctl.register("e", again)  # re-registering a registered key keeps it too
    stats = ctl.stats("e")
    assert stats is not None and (stats.budget, stats.entries, stats.hits) == (5 * UNIT, 0, 0)
    await ctl.record_turn("e", "s", 5)  # 5 >= 5: evicted at once, under the kept budget
    assert again.evicted == [["s"]]
    assert [e for e in events if isinstance(e, CacheBudgetSet)] == [
        CacheBudgetSet(key="e", bytes=5 * UNIT, previous=4 * 1024**3, applied=True)
    ]


async def test_restored_budgets_are_the_last_recorded_and_record_nothing() -> None:
    ctl, _, events = make()
    await ctl.set_budget("mine", 2 * UNIT)  # set in this process: the log does not override it
    events.clear()
    recorded: list[object] = [
        CacheBudgetSet(key="e", bytes=5 * UNIT, previous=4 * 1024**3, applied=True),
        CacheEvicted(key="e", ids=["s"], reason="clear", decision={}),
        CacheBudgetSet(key="e", bytes=7 * UNIT, previous=5 * UNIT, applied=False),
        CacheBudgetSet(key="mine", bytes=9 * UNIT, previous=4 * 1024**3, applied=False),
        CacheBudgetSet(key="zero", bytes=0, previous=4 * 1024**3, applied=False),
    ]
    assert ctl.restore_budgets(recorded) == {"e": 7 * UNIT, "zero": 0}
    assert (ctl.budget("e"), ctl.budget("mine"), ctl.budget("zero")) == (7 * UNIT, 2 * UNIT, 0)
    assert ctl.budget("other") == 4 * 1024**3
    assert events == []
    adapter = FakeAdapter()
    ctl.register("zero", adapter)
    await ctl.record_turn("zero", "s", 1)  # CC9: a budget of zero holds nothing
    assert adapter.evicted == [["s"]]


async def test_invalidate_removes_the_session_everywhere_and_asks_each_adapter() -> None:
    ctl, _, events = make()
    a1, a2, a3 = FakeAdapter(), FakeAdapter(), FakeAdapter()
    ctl.register("e1", a1)
    ctl.register("e2", a2)
    ctl.register("e3", a3)
    await ctl.record_turn("e1", "s", 1)
    await ctl.record_turn("e2", "s", 1)
    await ctl.record_turn("e2", "t", 1)
    await ctl.invalidate("s")
    assert (a1.evicted, a2.evicted, a3.evicted) == ([["s"]], [["s"]], [])
    assert ctl.entries("e1") == [] and [e.session_id for e in ctl.entries("e2")] == ["t"]
    assert [(e.key, e.ids, e.reason) for e in events if isinstance(e, CacheEvicted)] == [
        ("e1", ["s"], "invalidate"),
        ("e2", ["s"], "invalidate"),
    ]
    await ctl.invalidate("absent")  # no adapter call when nobody holds it
    assert (a1.evicted, a2.evicted) == ([["s"]], [["s"]])


async def test_invalidate_engine_clears_entries_and_counters_and_evicts_all() -> None:
    ctl, _, events = make()
    adapter, other = FakeAdapter(), FakeAdapter()
    ctl.register("e", adapter)
    ctl.register("o", other)
    await ctl.record_turn("e", "b", 1, hit_source="disk", group="g")
    await ctl.record_turn("e", "a", 1)
    await ctl.record_turn("o", "a", 1)
    await ctl.invalidate_engine("e")
    assert adapter.evicted == [["a", "b"]] and other.evicted == []
    stats = ctl.stats("e")
    assert stats is not None
    assert (stats.entries, stats.hits, stats.misses, stats.hit_rate) == (0, 0, 0, 0.0)
    assert stats.sources == {"memory": 0, "disk": 0, "prefix": 0, "fresh": 0}
    assert stats.groups == {}
    assert len(ctl.entries("o")) == 1
    evicted = [e for e in events if isinstance(e, CacheEvicted)]
    assert [(e.ids, e.reason, e.decision["rule"]) for e in evicted] == [
        (["a", "b"], "clear", "CC6")
    ]
    await ctl.invalidate_engine("e")  # empty: no adapter call
    await ctl.invalidate_engine("unknown")
    assert adapter.evicted == [["a", "b"]]


async def test_reconcile_replaces_with_engine_truth_keeping_priorities_then_enforces() -> None:
    ctl, clock, events = make(default_budget=10 * UNIT)
    adapter = FakeAdapter()
    ctl.register("e", adapter)
    await ctl.record_turn("e", "pinned", 2)
    await ctl.record_turn("e", "dropped", 2)
    ctl.pin("pinned", "low")
    clock.tick(10)
    adapter.report = [
        CacheEntry("pinned", 6, 6 * UNIT, 500.0),
        CacheEntry("engine-only", 4, 4 * UNIT, 600.0),
    ]
    await ctl.reconcile_once()  # 10 >= 10: the normal one goes first although newer
    assert adapter.evicted == [["engine-only"]]
    assert ctl.entries("e") == [CacheEntry("pinned", 6, 6 * UNIT, 500.0, "low")]
    assert isinstance(events[-1], CacheEvicted) and events[-1].reason == "watermark"


async def test_reconcile_skips_an_engine_that_cannot_tell_fails_or_hangs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ctl, _, _ = make(adapter_timeout=0.05)
    silent, failing, hung = FakeAdapter(), FakeAdapter(), FakeAdapter()
    failing.fail = RuntimeError("boom")
    hung.hang = True
    for key, adapter in (("silent", silent), ("failing", failing), ("hung", hung)):
        ctl.register(key, adapter)
        await ctl.record_turn(key, "s", 1)
    with caplog.at_level(logging.WARNING, logger="hostler.runtime.cache"):
        with anyio.fail_after(5):
            await ctl.reconcile_once()
    assert (silent.reports, failing.reports, hung.reports) == (1, 1, 1)
    for key in ("silent", "failing", "hung"):
        assert [e.session_id for e in ctl.entries(key)] == ["s"]
    assert "failing: report usage failed" in caplog.text
    assert "hung: report usage timed out after 0.05s" in caplog.text


async def test_a_raising_or_hanging_adapter_never_breaks_the_controller(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ctl, _, events = make(default_budget=2 * UNIT, adapter_timeout=0.05)
    adapter = FakeAdapter()
    adapter.fail = RuntimeError("engine gone")
    ctl.register("e", adapter)
    with caplog.at_level(logging.WARNING, logger="hostler.runtime.cache"):
        await ctl.record_turn("e", "a", 3)  # evicts; the adapter raises
        assert ctl.request_extras("e", "a") == {}
        adapter.fail = None
        adapter.hang = True
        with anyio.fail_after(5):
            await ctl.record_turn("e", "b", 3)
            await ctl.invalidate_engine("e")
    assert adapter.evicted == [["a"], ["b"]]
    assert ctl.entries("e") == []
    assert len([e for e in events if isinstance(e, CacheEvicted)]) == 2
    assert "e: evict failed" in caplog.text
    assert "e: evict timed out" in caplog.text
    assert "failed to build request extras" in caplog.text


async def test_request_extras_come_from_the_adapter() -> None:
    ctl, _, _ = make()
    ctl.register("e", FakeAdapter())
    assert ctl.request_extras("e", "s") == {"session": "s"}
    assert ctl.request_extras("unknown", "s") == {}


async def test_a_report_that_lands_after_re_registration_is_dropped() -> None:
    ctl, _, _ = make()
    old = FakeAdapter()
    old.report = [CacheEntry("stale", 1, UNIT, 1.0)]
    ctl.register("e", old)
    new = FakeAdapter()

    async def report() -> list[CacheEntry] | None:
        ctl.register("e", new)
        return old.report

    old.report_usage = report  # type: ignore[method-assign]
    await ctl.reconcile_once()
    assert ctl.adapter("e") is new and ctl.entries("e") == []


async def test_a_turn_recorded_while_the_report_is_in_flight_survives_it() -> None:
    ctl, clock, _ = make()
    adapter = FakeAdapter()
    ctl.register("e", adapter)

    async def report() -> list[CacheEntry] | None:
        clock.tick()
        await ctl.record_turn("e", "racing", 2)
        return []

    adapter.report_usage = report  # type: ignore[method-assign]
    await ctl.reconcile_once()
    assert [e.session_id for e in ctl.entries("e")] == ["racing"]


async def test_run_reconciles_every_interval_and_survives_a_failing_round(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = VirtualClock()
    ctl = CacheController(clock=clock)
    adapter = FakeAdapter()
    ctl.register("e", adapter)
    calls = 0
    original = ctl.reconcile_once

    async def flaky() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("bad round")
        await original()

    ctl.reconcile_once = flaky  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="hostler.runtime.cache"):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ctl.run)
            await clock.advance(4.999)
            assert calls == 0  # the first round waits its interval
            await clock.advance(0.001)
            assert calls == 1
            await clock.advance(10.0)
            # the next sleep waits the interval again, the failing round notwithstanding
            assert (calls, clock.next_deadline(), clock.pending) == (3, 20.0, 1)
            tg.cancel_scope.cancel()
    assert calls == 3
    assert adapter.reports == 2
    assert "cache reconcile failed" in caplog.text


async def test_without_a_sink_nothing_is_recorded_and_nothing_breaks() -> None:
    ctl = CacheController(clock=Clock(), default_budget=UNIT)
    adapter = FakeAdapter()
    ctl.register("e", adapter)
    await ctl.set_budget("e", UNIT)
    await ctl.record_turn("e", "s", 1)
    assert adapter.evicted == [["s"]]
