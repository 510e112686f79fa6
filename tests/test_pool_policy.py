"""The pool policy (pure, PP3–PP5, PP11): edges pinned by value, no clock, no processes."""

from __future__ import annotations

import pytest

from hostler.capacity.budget import HostMemory, compute_budget
from hostler.capacity.ledger import LedgerLimits, limits_of
from hostler.capacity.ledger import state_from as ledger_state_from
from hostler.events.ledger import LedgerBudgetSet
from hostler.policies.pool import (
    DRAIN_WAIT,
    POLICY_NAME,
    POLICY_VERSION,
    PoolEntry,
    demand,
    drain_step,
    drain_verdict,
    pick_replica,
    plan_make_room,
    touch,
)
from hostler.policies.room import RoomSearch, Standing, room_step, start_share

NOW = 10_000.0
MIB = 1024 * 1024
GIB = 1024 * MIB
#: A 16 GiB host without a card: automatic budget 9.6 GiB.
HOST = compute_budget(HostMemory(16 * GIB))
#: The ledger's limits with the config's 1 GiB budget in force.
LIMITS: LedgerLimits = limits_of(
    ledger_state_from([LedgerBudgetSet(GIB, "config:/etc/hostler/hostler.toml")]), HOST
)


def entry(
    key: str, mib: int = 100, *, used: float = NOW, hits: tuple[float, ...] = (), **kw: bool
) -> PoolEntry:
    return PoolEntry(key, mib * MIB, used, hits, **kw)


def test_constants_by_value() -> None:
    assert DRAIN_WAIT == 30.0
    assert (POLICY_NAME, POLICY_VERSION) == ("pool", 1)


# -- PP3: demand ------------------------------------------------------------------------------


def test_touch_keeps_the_last_minute_and_drops_a_hit_exactly_60_s_old() -> None:
    old = entry("a", hits=(NOW - 60.0, NOW - 59.999, NOW - 1), busy=True, draining=True)
    touched = touch(old, NOW)
    assert touched.hits == (NOW - 59.999, NOW - 1, NOW)
    assert touched.last_used_at == NOW
    assert touched.busy and touched.draining and touched.bytes == 100 * MIB


def test_demand_counts_the_window_only() -> None:
    hits = (NOW - 61, NOW - 60.0, NOW - 59.999, NOW - 0.0, NOW + 0.5, NOW + 5)
    assert demand(entry("a", hits=hits), NOW) == 2  # 59.999 s ago and now; not 60 s, not future
    assert demand(entry("a"), NOW) == 0


# -- PP4: making room -------------------------------------------------------------------------


def test_nothing_to_do_without_a_shortfall() -> None:
    for shortfall in (0, -5):
        room = plan_make_room([entry("a")], shortfall, NOW)
        assert room.evict == () and room.drain is None and room.covers
        assert room.decision["shortfall"] == 0


def test_victims_by_demand_then_age_the_shortest_covering_prefix() -> None:
    entries = [
        entry("hot", 100, used=NOW - 500, hits=(NOW - 1, NOW - 2)),
        entry("cold-new", 100, used=NOW - 10),
        entry("cold-old", 100, used=NOW - 400),
        entry("warm", 100, used=NOW - 900, hits=(NOW - 30,)),
    ]
    assert plan_make_room(entries, 1, NOW).evict == ("cold-old",)
    assert plan_make_room(entries, 100 * MIB, NOW).evict == ("cold-old",)  # equal covers
    assert plan_make_room(entries, 100 * MIB + 1, NOW).evict == ("cold-old", "cold-new")
    room = plan_make_room(entries, 300 * MIB, NOW)
    assert room.evict == ("cold-old", "cold-new", "warm")
    assert room.covers and room.drain is None


def test_hits_older_than_the_window_are_not_demand() -> None:
    stale = entry("stale", used=NOW - 100, hits=(NOW - 60.0, NOW - 90))
    fresh = entry("fresh", used=NOW - 5, hits=(NOW - 59,))
    assert plan_make_room([fresh, stale], 1, NOW).evict == ("stale",)


def test_busy_and_draining_are_never_evicted_and_a_busy_one_is_named_to_drain() -> None:
    entries = [
        entry("idle", 50),
        entry("busy-recent", 500, used=NOW - 1, busy=True),
        entry("busy-lru", 500, used=NOW - 100, busy=True),
        entry("leaving", 500, used=NOW - 1000, draining=True),
    ]
    room = plan_make_room(entries, 51 * MIB, NOW)
    assert room.evict == ("idle",)
    assert not room.covers
    assert room.drain == "busy-lru"
    assert plan_make_room(entries, 50 * MIB, NOW).drain is None  # idle ones cover it


def test_nothing_evictable_means_no_plan() -> None:
    room = plan_make_room([entry("leaving", draining=True)], 1, NOW)
    assert room.evict == () and room.drain is None and not room.covers


def test_the_decision_names_every_candidate_with_its_figures() -> None:
    entries = [entry("b", 10, used=NOW - 2.5, hits=(NOW - 1,)), entry("a", 20, used=NOW - 7)]
    room = plan_make_room(entries, 5 * MIB, NOW)
    assert room.decision == {
        "policy": "pool",
        "version": 1,
        "rule": "PP4",
        "eviction": "demand-lru",
        "eviction_version": 1,
        "shortfall": 5 * MIB,
        "now": NOW,
        "candidates": [
            {
                "key": "a",
                "bytes": 20 * MIB,
                "recent_hits": 0,
                "hit_ages": [],
                "idle_for": 7.0,
                "busy": False,
                "draining": False,
            },
            {
                "key": "b",
                "bytes": 10 * MIB,
                "recent_hits": 1,
                "hit_ages": [1.0],
                "idle_for": 2.5,
                "busy": False,
                "draining": False,
            },
        ],
        "evict": ["a"],
        "freed": 20 * MIB,
        "drain": None,
        "reachable": True,
    }


def test_reachable_counts_idle_and_busy_but_not_draining_with_equality_reachable() -> None:
    entries = [
        entry("idle", 50),
        entry("busy", 30, busy=True),
        entry("leaving", 500, draining=True),
    ]
    assert plan_make_room(entries, 80 * MIB, NOW).reachable  # 50 + 30 exactly
    room = plan_make_room(entries, 80 * MIB + 1, NOW)
    assert not room.reachable and room.decision["reachable"] is False
    assert plan_make_room([], 0, NOW).reachable  # nothing needed is always reachable
    assert not plan_make_room([], 1, NOW).reachable


# -- PP5: draining ----------------------------------------------------------------------------


def test_an_idle_victim_is_evicted_at_once() -> None:
    verdict = drain_verdict(busy=False, started_at=NOW, now=NOW)
    assert verdict.action == "evict"


@pytest.mark.parametrize(
    ("waited", "action"),
    [(0.0, "wait"), (29.999, "wait"), (30.0, "wait"), (30.001, "busy"), (-5.0, "wait")],
)
def test_a_busy_victim_waits_the_drain_bound_then_stays(waited: float, action: str) -> None:
    verdict = drain_verdict(busy=True, started_at=NOW, now=NOW + waited)
    assert verdict.action == action
    assert verdict.decision == {
        "policy": "pool",
        "version": 1,
        "rule": "PP5",
        "busy": True,
        "waited": max(waited, 0.0),
        "drain_wait": 30.0,
    }


def test_a_custom_or_negative_drain_wait() -> None:
    assert drain_verdict(busy=True, started_at=0, now=5, wait=5).action == "wait"
    assert drain_verdict(busy=True, started_at=0, now=5.5, wait=5).action == "busy"
    assert drain_verdict(busy=True, started_at=0, now=0, wait=-1).action == "wait"
    assert drain_verdict(busy=True, started_at=0, now=0.001, wait=-1).action == "busy"


# -- PP11: replicas ---------------------------------------------------------------------------


def test_a_new_session_goes_to_the_least_bound_replica_first_seen_on_ties() -> None:
    replicas = [entry("m:0"), entry("m:1"), entry("m:2")]
    assert pick_replica(replicas, {"m:0": 2, "m:1": 1, "m:2": 1}) == "m:1"
    assert pick_replica(replicas, {}) == "m:0"
    assert pick_replica(replicas, {"m:0": 1, "m:1": 0, "m:2": 0}) == "m:1"
    assert pick_replica(replicas, {"m:0": 0, "m:1": -3}) == "m:0"  # nonsense counts are 0
    assert pick_replica(replicas[:2], {"m:1": 0}) == "m:0"  # none bound yet is 0


def test_draining_replicas_take_no_session() -> None:
    replicas = [entry("m:0", draining=True), entry("m:1")]
    assert pick_replica(replicas, {"m:1": 9}) == "m:1"
    assert pick_replica([entry("m:0", draining=True)], {}) is None
    assert pick_replica([], {}) is None


def test_figures_are_rounded_to_the_millisecond() -> None:
    room = plan_make_room([entry("a", used=NOW - 2.4567)], 1, NOW)
    assert room.decision["candidates"][0]["idle_for"] == 2.457
    verdict = drain_verdict(busy=True, started_at=NOW, now=NOW + 12.3456)
    assert verdict.decision["waited"] == 12.346


def test_plain_lru_ignores_demand_where_demand_lru_keeps_the_wanted_one() -> None:
    """EV1: the two shipped policies differ exactly where demand and age disagree."""
    from hostler.policies.eviction import LRU, eviction_policy

    wanted_but_old = entry("old", 10, used=NOW - 50, hits=(NOW - 50, NOW - 55))
    unwanted_but_new = entry("new", 10, used=NOW - 5)
    entries = [wanted_but_old, unwanted_but_new]
    assert plan_make_room(entries, 10 * MIB, NOW).evict == ("new",)
    lru = plan_make_room(entries, 10 * MIB, NOW, LRU)
    assert lru.evict == ("old",)
    assert (lru.decision["eviction"], lru.decision["eviction_version"]) == ("lru", 1)
    assert eviction_policy("lru") is LRU
    assert eviction_policy("demand-lru").name == "demand-lru"


def test_an_unknown_eviction_policy_is_refused_naming_the_known_ones() -> None:
    from hostler.errors import UsageError
    from hostler.policies.eviction import eviction_policy, valid_policy_name

    with pytest.raises(
        UsageError, match=r"no eviction policy is named 'mru'; known: demand-lru, lru"
    ):
        eviction_policy("mru")
    assert valid_policy_name("a") and valid_policy_name("a" * 40)
    assert not valid_policy_name("a" * 41) and not valid_policy_name("-a")
    assert not valid_policy_name("A") and not valid_policy_name("") and not valid_policy_name(3)


# -- PP4: the make-room step (one loop, asked by the pool and the what-if) ---------------------


def _search(tried: frozenset[str] = frozenset(), until: float = NOW + 30) -> RoomSearch:
    return RoomSearch("new", 300 * MIB, until, tried)


def test_start_share_is_the_price_or_the_whole_budget_when_priced_at_nothing() -> None:
    assert start_share(1, 1000) == 1
    assert start_share(0, 1000) == 1000
    assert start_share(-5, 1000) == 1000


def test_no_shortfall_fits_and_exactly_zero_is_no_shortfall() -> None:
    step = room_step(_search(), 0, [Standing(entry("a"))], NOW, limits=LIMITS)
    assert (step.action, step.evict, step.drain, step.plan) == ("fit", (), None, None)
    assert not step.recorded
    assert room_step(_search(), 1, [Standing(entry("a"))], NOW, limits=LIMITS).action == "unload"


def test_unload_names_the_idle_victims_and_remembers_them_as_tried() -> None:
    standing = [Standing(entry("a", used=NOW - 50)), Standing(entry("b", used=NOW - 10))]
    step = room_step(_search(), 100 * MIB, standing, NOW, limits=LIMITS)
    assert (step.action, step.evict, step.drain) == ("unload", ("a",), None)
    assert step.search.tried == frozenset({"a"}) and step.recorded
    again = room_step(step.search, 100 * MIB, standing, NOW, limits=LIMITS)
    assert again.evict == ("b",)  # "a" was tried: never planned twice


def test_a_busy_victim_is_drained_and_counted_as_tried() -> None:
    step = room_step(_search(), 50 * MIB, [Standing(entry("a", busy=True))], NOW, limits=LIMITS)
    assert (step.action, step.evict, step.drain) == ("unload", (), "a")
    assert step.search.tried == frozenset({"a"})


def test_spoken_for_and_kept_engines_are_never_victims_and_the_start_itself_is_skipped() -> None:
    standing = [
        Standing(entry("new")),
        Standing(entry("built"), spoken=True),
        Standing(entry("pinned"), kept=True),
        Standing(entry("idle", 100)),
    ]
    step = room_step(_search(), 100 * MIB, standing, NOW, limits=LIMITS)
    assert [c.key for c in step.candidates] == ["idle"]
    assert step.evict == ("idle",)


def test_only_spoken_for_room_waits_until_the_patience_deadline_then_refuses() -> None:
    standing = [Standing(entry("built", 500), spoken=True)]
    waiting = room_step(_search(until=NOW + 30), 100 * MIB, standing, NOW + 29.999, limits=LIMITS)
    assert waiting.action == "wait" and not waiting.recorded
    refused = room_step(_search(until=NOW + 30), 100 * MIB, standing, NOW + 30, limits=LIMITS)
    assert refused.action == "refuse" and refused.recorded
    assert refused.refusal == (
        "new: needs 0.29 GiB, 0.10 GiB more than the budget has free, and the engines hostler "
        "may unload hold only 0.00 GiB; nothing was unloaded. The budget, 1.0 GiB, is set in "
        "/etc/hostler/hostler.toml ([budget] bytes): raise it there and restart hostler, or "
        "raise it live until the next start with `hostler budget --set SIZE` (PUT /api/budget); "
        "or stop what else holds memory (hostler state shows it)"
    )
    monotonic = room_step(
        _search(until=5.0), 100 * MIB, standing, NOW, limits=LIMITS, patience_now=4.0
    )
    assert monotonic.action == "wait"  # patience on its own clock


def test_a_start_that_cannot_fit_even_with_everything_gone_unloads_nothing() -> None:
    standing = [Standing(entry("a", 100)), Standing(entry("b", 100, draining=True))]
    step = room_step(_search(), 101 * MIB, standing, NOW, limits=LIMITS)
    assert (step.action, step.evict, step.drain) == ("refuse", (), None)
    assert step.plan is not None and not step.plan.reachable
    assert "hostler may unload hold only 0.10 GiB" in step.refusal


def test_a_drain_step_asks_pp18_first_then_pp5_and_a_gone_victim_is_no_eviction() -> None:
    look = {"started_at": 100.0, "wait": 30.0}
    step = drain_step(busy=True, up=True, wanted=False, now=101.0, **look)
    assert (step.action, step.outcome, step.waited) == ("abandon", "abandoned", 1.0)
    assert drain_step(busy=False, up=False, wanted=True, now=101.0, **look).outcome == "gone"
    evict = drain_step(busy=False, up=True, wanted=True, now=102.5, **look)
    assert (evict.action, evict.outcome) == ("evict", "evicted")
    assert evict.decision == {
        "policy": "pool",
        "version": 1,
        "rule": "PP5",
        "busy": False,
        "waited": 2.5,
        "drain_wait": 30.0,
        "started_at": 100.0,
        "now": 102.5,
    }
    assert drain_step(busy=True, up=True, wanted=True, now=130.0, **look).action == "wait"
    busy = drain_step(busy=True, up=True, wanted=True, now=130.001, **look)
    assert (busy.action, busy.outcome) == ("busy", "busy")
    # a busy victim that went meanwhile still waits for PP5: only an idle one is "gone"
    assert drain_step(busy=True, up=False, wanted=True, now=101.0, **look).action == "wait"
