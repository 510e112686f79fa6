"""The request queue's pure rules (Q1, Q4–Q6, Q8, Q10–Q12): edges pinned by value."""

from __future__ import annotations

import pytest

from hostler.policies.queue import (
    AFFINITY_WINDOW,
    AMBIENT_QUIET,
    AMBIENT_RECHECK_MARGIN,
    MAX_WAIT,
    POLICY_NAME,
    POLICY_VERSION,
    RECENT_CAP,
    WAIT_NOTICE,
    LaneCaps,
    Pending,
    RecentRun,
    Running,
    ahead_of,
    ambient_gate_open,
    ambient_recheck_in,
    background_lane_cap,
    engine_queue_caps,
    has_capacity,
    lane_caps,
    move_pending,
    pick_next,
    prune_recent,
)


def test_constants_by_value() -> None:
    assert AMBIENT_QUIET == 180.0
    assert AMBIENT_RECHECK_MARGIN == 0.025
    assert AFFINITY_WINDOW == 30.0
    assert MAX_WAIT == 60.0
    assert RECENT_CAP == 64
    assert WAIT_NOTICE == 0.2
    assert (POLICY_NAME, POLICY_VERSION) == ("request-queue", 1)


def test_caps_default_to_the_width_and_are_clamped() -> None:
    assert lane_caps(4) == LaneCaps(4, 4, 4)
    assert lane_caps(4, interactive=2, background=3) == LaneCaps(4, 2, 3)
    assert lane_caps(4, interactive=0, background=9) == LaneCaps(4, 1, 4)
    assert lane_caps(4, interactive=-3, background=4) == LaneCaps(4, 1, 4)
    assert lane_caps(1, interactive=1, background=1) == LaneCaps(1, 1, 1)


@pytest.mark.parametrize("width", [0, -1])
def test_a_queue_that_can_run_nothing_is_refused(width: int) -> None:
    with pytest.raises(ValueError, match=f"a queue's width must be at least 1, not {width}"):
        lane_caps(width)


def test_capacity_is_under_both_the_width_and_the_lane_cap() -> None:
    assert has_capacity(running=1, lane_running=1, lane_cap=2, width=4) is True
    assert has_capacity(running=3, lane_running=0, lane_cap=4, width=4) is True
    assert has_capacity(running=4, lane_running=0, lane_cap=4, width=4) is False  # width full
    assert has_capacity(running=2, lane_running=2, lane_cap=2, width=4) is False  # lane full
    assert has_capacity(running=2, lane_running=1, lane_cap=2, width=4, extra=1) is False
    assert has_capacity(running=2, lane_running=0, lane_cap=4, width=4, extra=1) is True
    assert has_capacity(running=3, lane_running=0, lane_cap=4, width=4, extra=1) is False


CAPS = LaneCaps(4, 4, 3)


def gate(**kw: float) -> bool:
    values = {
        "running": 0,
        "non_ambient_running": 0,
        "non_ambient_pending": 0,
        "quiet_for": 0.0,
        **kw,
    }
    return ambient_gate_open(caps=CAPS, **values)  # type: ignore[arg-type]


def test_spare_capacity_keeps_one_interactive_slot_free() -> None:
    # interactive cap 4: ambient may run while fewer than 3 run, whatever else happens
    assert gate(running=2, non_ambient_running=2, non_ambient_pending=5) is True
    assert gate(running=3, non_ambient_running=3) is False


def test_a_one_wide_engine_gives_ambient_work_only_quiet_time() -> None:
    one = LaneCaps(1, 1, 1)
    assert (
        ambient_gate_open(
            caps=one, running=0, non_ambient_running=0, non_ambient_pending=0, quiet_for=179.999
        )
        is False
    )
    assert (
        ambient_gate_open(
            caps=one, running=0, non_ambient_running=0, non_ambient_pending=0, quiet_for=180.0
        )
        is True
    )
    two = LaneCaps(2, 2, 2)  # spare of 1: open only while nothing runs
    assert (
        ambient_gate_open(
            caps=two, running=0, non_ambient_running=0, non_ambient_pending=1, quiet_for=0
        )
        is True
    )
    assert (
        ambient_gate_open(
            caps=two, running=1, non_ambient_running=0, non_ambient_pending=0, quiet_for=0
        )
        is False
    )


def test_quiet_means_nothing_else_running_or_waiting_for_the_whole_window() -> None:
    busy = {"running": 3, "quiet_for": 500.0}
    assert gate(**busy) is True
    assert gate(**busy, non_ambient_running=1) is False
    assert gate(**busy, non_ambient_pending=1) is False
    assert gate(running=3, quiet_for=179.999) is False


def test_the_gate_can_be_switched_off() -> None:
    assert gate(running=3, non_ambient_running=3, quiet_window=0) is True
    assert gate(running=3, non_ambient_running=3, quiet_window=-1) is True
    assert gate(running=3, quiet_for=10, quiet_window=10) is True
    assert gate(running=3, quiet_for=10, quiet_window=10.001) is False
    assert gate(running=3, quiet_for=0.2, quiet_window=0.5) is False  # a short window is a window


# -- Q4: the pick -------------------------------------------------------------------------

WIDE = LaneCaps(4, 4, 4)


def item(
    id: int,
    lane: str = "interactive",
    at: float = 0.0,
    **kw: object,
) -> Pending:
    return Pending(id=id, lane=lane, enqueued_at=at, order=id, **kw)  # type: ignore[arg-type]


def run(id: int, lane: str = "interactive", **kw: object) -> Running:
    return Running(id=id, lane=lane, started_at=0.0, **kw)  # type: ignore[arg-type]


def pick(
    pending: list[Pending],
    *,
    running: tuple[Running, ...] = (),
    recent: tuple[RecentRun, ...] = (),
    caps: LaneCaps = WIDE,
    now: float = 10.0,
    ambient_open: bool = True,
    **kw: object,
) -> tuple[int | None, dict[str, object]]:
    chosen = pick_next(
        pending,
        running=running,
        recent=recent,
        caps=caps,
        now=now,
        ambient_open=ambient_open,
        **kw,  # type: ignore[arg-type]
    )
    return chosen.id, chosen.decision


def test_nothing_starts_when_the_width_is_full_or_nothing_is_eligible() -> None:
    assert pick([item(1)], running=(run(9),) * 4) == (
        None,
        {
            "policy": "request-queue",
            "version": 1,
            "running": 4,
            "running_interactive": 4,
            "running_background": 0,
            "width": 4,
            "interactive_cap": 4,
            "background_cap": 4,
            "ambient_open": True,
            "pending": 1,
            "rule": "full",
        },
    )
    chosen, decision = pick([])
    assert chosen is None
    assert decision["rule"] == "none"
    # three of four run: there is room, and it is taken
    assert pick([item(1)], running=(run(9),) * 3)[0] == 1


def test_interactive_always_wins_when_it_has_candidates() -> None:
    chosen, decision = pick([item(1, "background", at=0.0), item(2, "interactive", at=9.0)])
    assert chosen == 2
    assert decision["rule"] == "oldest"
    assert decision["lane"] == "interactive"
    assert decision["waited"] == 1.0


def test_a_lane_at_its_cap_yields_to_the_other() -> None:
    caps = LaneCaps(4, 2, 1)
    two_chats = (run(8), run(9))
    assert pick([item(1), item(2, "background")], running=two_chats, caps=caps)[0] == 2
    one_chat = (run(8),)
    assert pick([item(1), item(2, "background")], running=one_chat, caps=caps)[0] == 1
    both_full = (run(8), run(9), run(7, "background"))
    assert pick([item(1), item(2, "background")], running=both_full, caps=caps)[0] is None
    assert pick([item(2, "background")], running=(run(7, "background"),), caps=caps)[0] is None


def test_oldest_in_queue_order_without_affinity() -> None:
    pending = [item(3, at=1.0), item(1, at=2.0), item(2, at=0.5)]
    # order, not arrival time, ranks (a move swaps orders, Q8)
    assert pick(pending, affinity=False) == (
        1,
        {
            "policy": "request-queue",
            "version": 1,
            "running": 0,
            "running_interactive": 0,
            "running_background": 0,
            "width": 4,
            "interactive_cap": 4,
            "background_cap": 4,
            "ambient_open": True,
            "pending": 3,
            "rule": "oldest",
            "id": 1,
            "lane": "interactive",
            "waited": 8.0,
            "affinity": False,
        },
    )
    # affinity off ignores a matching session
    same = [item(1), item(2, session_id="s")]
    assert pick(same, running=(run(9, session_id="s"),), affinity=False)[0] == 1


def test_affinity_scores_session_then_group() -> None:
    running = (run(9, session_id="s", group="g"),)
    pending = [item(1), item(2, group="g"), item(3, session_id="s"), item(4, session_id="x")]
    chosen, decision = pick(pending, running=running)
    assert chosen == 3
    assert decision["rule"] == "affinity"
    assert decision["score"] == 2
    assert decision["scores"] == {"1": 0, "2": 1, "3": 2, "4": 0}
    assert decision["window"] == 30.0
    chosen, decision = pick(pending[:2], running=running)
    assert (chosen, decision["score"]) == (2, 1)
    # nothing shared: the oldest, and the rule says so
    chosen, decision = pick([item(1), item(4, session_id="x")], running=running)
    assert (chosen, decision["rule"], decision["score"]) == (1, "oldest", 0)


def test_affinity_ties_go_to_the_first_in_order() -> None:
    running = (run(9, session_id="s"),)
    assert pick([item(2, session_id="s"), item(1, session_id="s")], running=running)[0] == 1


def test_none_keys_never_match_and_opting_out_scores_zero() -> None:
    running = (run(9),)  # no session, no group
    assert pick([item(1), item(2)], running=running)[1]["scores"] == {"1": 0, "2": 0}
    running = (run(9, session_id="s", group="g"),)
    opted_out = [item(1), item(2, session_id="s", group="g", affinity=False)]
    assert pick(opted_out, running=running)[0] == 1
    group_only = [item(1), item(2, session_id="other", group="g")]
    assert pick(group_only, running=running)[0] == 2


def test_recent_runs_count_within_the_window_inclusive() -> None:
    pending = [item(1), item(2, session_id="s")]
    at_edge = (RecentRun("s", None, ended_at=10.0 - 30.0),)
    assert pick(pending, recent=at_edge)[0] == 2
    past = (RecentRun("s", None, ended_at=10.0 - 30.001),)
    assert pick(pending, recent=past)[0] == 1
    short = (RecentRun("s", None, ended_at=5.0),)
    assert pick(pending, recent=short, window=4.0)[0] == 1
    assert pick(pending, recent=short, window=5.0)[0] == 2
    group = (RecentRun(None, "g", ended_at=9.0),)
    assert pick([item(1), item(2, group="g")], recent=group)[0] == 2


def test_starvation_goes_first_at_the_bound() -> None:
    running = (run(9, session_id="s"),)
    old = item(1, "background", at=0.0)
    fresh = item(2, session_id="s", at=59.0)
    chosen, decision = pick([old, fresh], running=running, now=60.0)
    assert chosen == 1
    assert decision["rule"] == "starvation"
    assert decision["max_wait"] == 60.0
    assert decision["starving"] == 1
    assert decision["waited"] == 60.0
    # a moment before the bound, interactive (and affinity) wins
    assert pick([old, fresh], running=running, now=59.999)[0] == 2
    assert pick([old, fresh], running=running, now=30.0, max_wait=30.0)[0] == 1


def test_starving_interactive_beats_starving_background_then_order() -> None:
    pending = [item(1, "background", at=0.0), item(3, at=5.0), item(2, at=1.0)]
    chosen, decision = pick(pending, now=100.0)
    assert (chosen, decision["starving"]) == (2, 3)
    # starving but its lane is full: not eligible, the other starving one goes
    caps = LaneCaps(4, 1, 4)
    assert pick(pending, running=(run(9),), caps=caps, now=100.0)[0] == 1


def test_gated_ambient_work_is_invisible_even_when_starving() -> None:
    ambient = item(1, "background", at=0.0, ambient=True)
    chosen, decision = pick([ambient], now=1000.0, ambient_open=False)
    assert chosen is None
    assert decision["ambient_open"] is False
    assert pick([ambient, item(2, "background", at=999.0)], now=1000.0, ambient_open=False)[0] == 2
    assert pick([ambient], now=1000.0, ambient_open=True)[0] == 1
    # the gate only holds ambient work
    assert pick([item(3, "background")], ambient_open=False)[0] == 3


def test_prune_recent_keeps_the_window_and_the_newest_cap() -> None:
    runs = [RecentRun("s", None, float(t)) for t in (5, 1, 40, 10)]
    assert prune_recent(runs, 40.0) == (
        RecentRun("s", None, 10.0),
        RecentRun("s", None, 40.0),
    )
    assert prune_recent(runs, 40.0, window=35.0) == (
        RecentRun("s", None, 5.0),
        RecentRun("s", None, 10.0),
        RecentRun("s", None, 40.0),
    )
    assert prune_recent(runs, 40.0, window=100.0, cap=2) == (
        RecentRun("s", None, 10.0),
        RecentRun("s", None, 40.0),
    )
    assert prune_recent(runs, 40.0, window=100.0, cap=0) == ()
    many = [RecentRun(None, None, float(t)) for t in range(100)]
    kept = prune_recent(many, 99.0, window=1000.0)
    assert len(kept) == 64
    assert kept[0].ended_at == 36.0


# -- Q8: moving ---------------------------------------------------------------------------


def test_move_swaps_with_the_neighbour_of_its_own_lane() -> None:
    pending = [item(1), item(2, "background"), item(3), item(4)]
    assert move_pending(pending, 3, "up") == {3: 1, 1: 3}
    assert move_pending(pending, 3, "down") == {3: 4, 4: 3}
    assert move_pending(pending, 1, "up") is None  # first of its lane
    assert move_pending(pending, 4, "down") is None  # last of its lane
    assert move_pending(pending, 2, "up") is None  # alone in its lane: never crosses
    assert move_pending(pending, 2, "down") is None
    assert move_pending(pending, 99, "up") is None
    # ranks, not list positions
    shuffled = [item(4), item(1), item(3)]
    assert move_pending(shuffled, 4, "up") == {4: 3, 3: 4}


# -- Q5 timer, Q10, Q11, Q12 --------------------------------------------------------------


def test_ambient_recheck_only_when_held_by_the_quiet_window_alone() -> None:
    one = LaneCaps(1, 1, 1)
    quiet = {"running": 0, "non_ambient_running": 0, "non_ambient_pending": 0}
    assert ambient_recheck_in(caps=one, quiet_for=100.0, **quiet) == pytest.approx(80.025)
    assert ambient_recheck_in(caps=one, quiet_for=0.0, quiet_window=10.0, **quiet) == (
        pytest.approx(10.025)
    )
    assert ambient_recheck_in(caps=one, quiet_for=180.0, **quiet) is None  # open
    busy = {**quiet, "non_ambient_running": 1}
    assert ambient_recheck_in(caps=one, quiet_for=100.0, **busy) is None
    waiting = {**quiet, "non_ambient_pending": 1}
    assert ambient_recheck_in(caps=one, quiet_for=100.0, **waiting) is None
    # ambient work itself fills the spare: still only the clock holds the next one
    caps = LaneCaps(3, 3, 3)
    held = {"running": 2, "non_ambient_running": 0, "non_ambient_pending": 0}
    assert ambient_recheck_in(caps=caps, quiet_for=179.0, **held) == pytest.approx(1.025)
    # a clock that went back does not ask for more than the window
    assert ambient_recheck_in(caps=one, quiet_for=-50.0, quiet_window=10.0, **quiet) == (
        pytest.approx(60.025)
    )


def test_ahead_of_counts_what_runs_and_what_goes_first() -> None:
    assert ahead_of("interactive", running=2, queued_interactive=3, queued_background=5) == 4
    assert ahead_of("background", running=2, queued_interactive=3, queued_background=5) == 9
    assert ahead_of("interactive", running=0, queued_interactive=1, queued_background=5) == 0
    assert ahead_of("background", running=0, queued_interactive=0, queued_background=1) == 0
    assert ahead_of("interactive", running=0, queued_interactive=0, queued_background=0) == 0
    assert ahead_of("background", running=0, queued_interactive=0, queued_background=0) == 0


def test_background_lane_cap() -> None:
    assert [background_lane_cap(w) for w in (-1, 0, 1, 2, 3, 8)] == [1, 1, 1, 1, 2, 7]


def test_engine_queue_shape() -> None:
    assert engine_queue_caps(1) == LaneCaps(2, 1, 1)
    assert engine_queue_caps(4) == LaneCaps(5, 4, 3)
    assert engine_queue_caps(4, configured=8) == LaneCaps(8, 4, 3)
    assert engine_queue_caps(4, configured=5) == LaneCaps(5, 4, 3)
    assert engine_queue_caps(4, single_lane=True) == LaneCaps(1, 1, 1)
    with pytest.raises(ValueError, match="an engine's width must be at least 1, not 0"):
        engine_queue_caps(0)


def test_pick_edges_pinned_by_the_mutation_run() -> None:
    # a group match alone (score 1) is still an affinity pick
    chosen, decision = pick([item(1), item(2, group="g")], running=(run(9, group="g"),))
    assert (chosen, decision["rule"], decision["score"]) == (2, "affinity", 1)
    # opting out scores exactly 0
    opted = [item(1, session_id="s", affinity=False)]
    assert pick(opted, running=(run(9, session_id="s"),))[1]["scores"] == {"1": 0}
    # waited is rounded to the millisecond
    assert pick([item(1, at=0.0)], now=1.23456)[1]["waited"] == 1.235
    # a background lane with room beside one running background request
    caps = LaneCaps(4, 4, 2)
    assert pick([item(1, "background")], running=(run(9, "background"),), caps=caps)[0] == 1
    assert pick([], caps=caps)[1]["eligible"] == 0
    # the newest single run is kept with a cap of 1
    runs = [RecentRun("s", None, 1.0), RecentRun("s", None, 2.0)]
    assert prune_recent(runs, 2.0, cap=1) == (RecentRun("s", None, 2.0),)
