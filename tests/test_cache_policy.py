"""The prompt-cache policy (pure): CC4 pricing and outcomes, CC8 reconcile, CC9 eviction,
CC10 tallies, CC11 the default budget; constants pinned by value."""

from __future__ import annotations

import pytest

from hostler.policies import cache
from hostler.policies.cache import (
    CacheEntry,
    Tally,
    default_budget,
    entry_bytes,
    is_hit,
    plan_eviction,
    reconcile,
    record_outcome,
)

MIB = 1024**2
GIB = 1024**3
KIB100 = 102_400


def entry(
    sid: str, tokens: int, at: float, priority: cache.Priority = "normal", group: str | None = None
) -> CacheEntry:
    return CacheEntry(sid, tokens, tokens * KIB100, at, priority, group)


def test_constants_are_pinned() -> None:
    assert cache.ENTRY_BYTES_PER_TOKEN == 102_400
    assert cache.HIGH_WATERMARK == 1.0
    assert cache.LOW_WATERMARK == 0.8
    assert cache.RECONCILE_INTERVAL == 5.0
    assert cache.HIT_WINDOW == 50
    assert cache.DEFAULT_BUDGET == 4 * GIB
    assert cache.SOURCES == ("memory", "disk", "prefix", "fresh")
    assert (cache.POLICY_NAME, cache.POLICY_VERSION) == ("prompt-cache", 1)


def test_an_entry_defaults_to_normal_priority_and_no_group() -> None:
    e = CacheEntry("s", 1, 2, 3.0)
    assert (e.priority, e.group) == ("normal", None)


@pytest.mark.parametrize(("tokens", "expected"), [(0, 0), (1, 102_400), (3, 307_200), (-5, 0)])
def test_entry_bytes_is_100_kib_per_token(tokens: int, expected: int) -> None:
    assert entry_bytes(tokens) == expected


# -- CC9 -----------------------------------------------------------------------------------


def test_under_the_budget_nothing_is_evicted_and_the_decision_says_why() -> None:
    entries = [entry("b", 4, 2.0), entry("a", 5, 1.0)]
    plan = plan_eviction(entries, 10 * KIB100)  # 9 < 10
    assert plan.ids == ()
    d = plan.decision
    assert d["policy"] == "prompt-cache"
    assert d["version"] == 1
    assert d["rule"] == "CC9"
    assert d["budget"] == 10 * KIB100
    assert d["total"] == 9 * KIB100
    assert d["high"] == 10 * KIB100
    assert d["low"] == pytest.approx(8 * KIB100)
    assert d["triggered"] is False
    assert d["entries"] == [["a", 5 * KIB100, 1.0, "normal"], ["b", 4 * KIB100, 2.0, "normal"]]
    assert d["evicted"] == []
    assert d["total_after"] == 9 * KIB100


def test_at_the_budget_exactly_eviction_starts() -> None:
    entries = [entry("a", 5, 1.0), entry("b", 5, 2.0)]
    plan = plan_eviction(entries, 10 * KIB100)
    assert plan.decision["triggered"] is True
    assert plan.ids == ("a",)  # 5 < 8 after one
    assert plan.decision["total_after"] == 5 * KIB100


def test_evicts_oldest_first_until_strictly_under_80_percent() -> None:
    # budget 10 units, total 12: 12 -> 10 (not < 8) -> 8 (not < 8: equality keeps going) -> 6
    entries = [entry("c", 2, 3.0), entry("a", 2, 1.0), entry("b", 2, 2.0), entry("d", 6, 4.0)]
    plan = plan_eviction(entries, 10 * KIB100)
    assert plan.ids == ("a", "b", "c")
    assert plan.decision["total_after"] == 6 * KIB100


def test_stops_as_soon_as_the_total_is_under_the_low_watermark() -> None:
    entries = [entry("a", 3, 1.0), entry("b", 7, 2.0), entry("c", 1, 3.0)]
    plan = plan_eviction(entries, 10 * KIB100)  # 11 -> 8 -> 1
    assert plan.ids == ("a", "b")
    entries = [entry("a", 4, 1.0), entry("b", 7, 2.0)]
    assert plan_eviction(entries, 10 * KIB100).ids == ("a",)  # 11 -> 7 < 8


def test_normal_priority_goes_before_low_whatever_its_age() -> None:
    entries = [entry("old-low", 5, 1.0, "low"), entry("new", 5, 9.0), entry("mid", 5, 5.0)]
    plan = plan_eviction(entries, 12 * KIB100)  # 15 -> 10 -> 5 (< 9.6)
    assert plan.ids == ("mid", "new")
    everything = plan_eviction([*entries, entry("young-low", 5, 0.5, "low")], 1)
    assert everything.ids == ("mid", "new", "young-low", "old-low")


def test_equal_times_are_ordered_by_session_id() -> None:
    entries = [entry("b", 5, 1.0), entry("a", 5, 1.0)]
    assert plan_eviction(entries, 10 * KIB100).ids == ("a",)


@pytest.mark.parametrize("budget", [0, -1, -10 * KIB100])
def test_a_zero_or_negative_budget_holds_nothing(budget: int) -> None:
    entries = [entry("a", 1, 1.0), entry("z", 0, 2.0)]
    plan = plan_eviction(entries, budget)
    assert plan.ids == ("a", "z")
    assert plan.decision["total_after"] == 0


def test_no_entries_nothing_to_evict_even_at_zero_budget() -> None:
    plan = plan_eviction([], 0)
    assert plan.ids == ()
    assert plan.decision["total"] == 0


def test_zero_token_entries_cost_nothing_and_stay_under_a_positive_budget() -> None:
    assert plan_eviction([entry("a", 0, 1.0)], 1).ids == ()


def test_one_byte_over_and_one_under() -> None:
    big = CacheEntry("a", 0, 1000, 1.0)
    assert plan_eviction([big], 1000).ids == ("a",)
    assert plan_eviction([big], 1001).ids == ()
    assert plan_eviction([big, CacheEntry("b", 0, 1, 2.0)], 1001).ids == ("a",)


# -- CC8 -----------------------------------------------------------------------------------


def test_reconcile_replaces_the_map_with_the_engines_report() -> None:
    known = {"a": entry("a", 5, 1.0, "low", "g1"), "gone": entry("gone", 3, 2.0)}
    reported = [entry("a", 9, 7.0), entry("new", 2, 8.0, "low", "g2")]
    result = reconcile(known, reported)
    assert set(result) == {"a", "new"}
    assert result["a"] == CacheEntry("a", 9, 9 * KIB100, 7.0, "low", "g1")
    assert result["new"] == entry("new", 2, 8.0, "low", "g2")


def test_reconcile_prefers_the_reported_group() -> None:
    known = {"a": entry("a", 5, 1.0, "normal", "old")}
    assert reconcile(known, [entry("a", 5, 1.0, "low", "new")])["a"].group == "new"
    assert reconcile(known, [entry("a", 5, 1.0, "low", "new")])["a"].priority == "normal"


def test_reconcile_keeps_entries_touched_after_the_report_was_asked_for() -> None:
    known = {"late": entry("late", 4, 10.0), "at": entry("at", 4, 5.0), "x": entry("x", 1, 6.0)}
    result = reconcile(known, [entry("x", 2, 3.0)], fresh_after=5.0)
    assert set(result) == {"late", "x"}  # equality is not newer than the report
    assert result["x"].tokens == 1  # the map's newer figure wins
    assert set(reconcile(known, [], fresh_after=None)) == set()


# -- CC11 ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ram", "budget"),
    [
        (0, 2048 * MIB),
        (16 * GIB - 1, 2048 * MIB),
        (16 * GIB, 4096 * MIB),
        (32 * GIB - 1, 4096 * MIB),
        (32 * GIB, 8192 * MIB),
        (64 * GIB - 1, 8192 * MIB),
        (64 * GIB, 16384 * MIB),
        (512 * GIB, 16384 * MIB),
    ],
)
def test_default_budget_tiers_put_thresholds_in_the_higher_tier(ram: int, budget: int) -> None:
    assert default_budget(ram) == budget


# -- CC4 / CC10 ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "was_hit", "hit"),
    [
        ("memory", False, True),
        ("disk", False, True),
        ("prefix", False, True),
        ("fresh", True, False),
        (None, True, True),
        (None, False, False),
    ],
)
def test_a_named_source_decides_the_hit_else_was_hit(
    source: str | None, was_hit: bool, hit: bool
) -> None:
    assert is_hit(source, was_hit) is hit


def test_is_hit_defaults_to_a_miss_and_refuses_an_unknown_source() -> None:
    assert is_hit(None) is False
    with pytest.raises(ValueError, match="'warm' is not a cache source"):
        is_hit("warm")


def test_an_empty_tally_has_a_zero_hit_rate_and_every_source_at_zero() -> None:
    tally = Tally()
    assert tally.hit_rate == 0.0
    assert dict(tally.sources) == {"memory": 0, "disk": 0, "prefix": 0, "fresh": 0}
    assert (tally.hits, tally.misses, dict(tally.groups), tally.recent) == (0, 0, {}, ())


def test_record_outcome_counts_hits_misses_sources_and_groups() -> None:
    tally = record_outcome(Tally(), "disk", group="g")
    tally = record_outcome(tally, "fresh", group="g")
    tally = record_outcome(tally, None, True)
    tally = record_outcome(tally, None, group="h")
    assert (tally.hits, tally.misses) == (2, 2)
    assert dict(tally.sources) == {"memory": 0, "disk": 1, "prefix": 0, "fresh": 1}
    assert dict(tally.groups) == {"g": (1, 1), "h": (0, 1)}
    assert tally.recent == (True, False, True, False)
    assert tally.hit_rate == 0.5
    assert record_outcome(Tally(), "memory").hit_rate == 1.0


def test_record_outcome_does_not_change_the_tally_it_is_given() -> None:
    before = Tally()
    record_outcome(before, "memory", group="g")
    assert before == Tally()


def test_the_hit_rate_is_over_the_last_50_turns() -> None:
    tally = Tally()
    for _ in range(50):
        tally = record_outcome(tally, "fresh")
    assert len(tally.recent) == 50
    assert tally.hit_rate == 0.0
    tally = record_outcome(tally, "memory")
    assert len(tally.recent) == 50
    assert tally.recent[-1] is True
    assert tally.hit_rate == pytest.approx(1 / 50)
    assert (tally.hits, tally.misses) == (1, 50)  # the counters are not windowed
    for _ in range(49):
        tally = record_outcome(tally, "memory")
    assert tally.hit_rate == 1.0
