"""One engine's queue, sans I/O (Q2–Q10): arrivals, dispatches, releases, leaving, the gate."""

from __future__ import annotations

import pytest

from hostler.events.queue import (
    QueueCancelled,
    QueueDispatched,
    QueueEnqueued,
    QueueMoved,
    QueueReleased,
)
from hostler.machines.queue import (
    Arrival,
    Dismiss,
    Grant,
    Left,
    Moved,
    QueueDispatch,
    QueueEffect,
    RecheckDue,
    Record,
    Released,
    Resized,
    WakeAmbient,
)
from hostler.policies.queue import AMBIENT_RECHECK_MARGIN, LaneCaps


def queue(width: int = 1, **kw: object) -> QueueDispatch:
    return QueueDispatch("llama:m", width, now=0.0, **kw)  # type: ignore[arg-type]


def granted(effects: list[QueueEffect]) -> list[int]:
    return [e.id for e in effects if isinstance(e, Grant)]


def dispatched(effects: list[QueueEffect]) -> list[QueueDispatched]:
    return [
        e.event for e in effects if isinstance(e, Record) and isinstance(e.event, QueueDispatched)
    ]


def test_an_arrival_is_recorded_then_dispatched_when_a_slot_is_free() -> None:
    q = queue()
    first, effects = q.arrive(Arrival("interactive", label="a"), 1.0)
    assert first == 1
    enqueued = QueueEnqueued("llama:m", 1, "interactive", False, None, None, "a", 1.0)
    assert effects[0] == Record(enqueued)
    assert effects[2:] == [Grant(1, 1.0), WakeAmbient()]
    [event] = dispatched(effects)
    assert (event.id, event.waited, event.at, event.decision["rule"]) == (1, 0.0, 1.0, "oldest")
    assert event.decision["inputs"] == {
        "now": 1.0,
        "max_wait": 60.0,
        "window": 30.0,
        "affinity": True,
        "opted_out": [],
    }
    second, effects = q.arrive(Arrival("interactive"), 2.0)
    assert second == 2
    assert [type(e) for e in effects] == [Record, WakeAmbient]  # the width is full: it waits
    assert (q.position(2), q.ahead_of(2), q.busy) == (1, 1, True)


def test_a_release_records_how_long_it_ran_and_dispatches_the_next() -> None:
    q = queue()
    q.arrive(Arrival("interactive"), 0.0)
    q.arrive(Arrival("interactive"), 0.5)
    effects = q.handle(Released(1), 3.0)
    assert effects[0] == Record(QueueReleased("llama:m", 1, "interactive", 3.0, 3.0))
    assert granted(effects) == [2]
    assert dispatched(effects)[0].waited == 2.5
    assert q.handle(Released(1), 4.0) == []  # again: nothing
    assert q.handle(Released(99), 4.0) == []
    assert q.handle(Released(2), 5.0)[-1] == WakeAmbient()
    assert q.busy is False


def test_affinity_prefers_the_session_that_ran_and_the_bound_ends_it() -> None:
    q = queue()
    q.arrive(Arrival("interactive", session_id="s"), 0.0)
    q.arrive(Arrival("interactive", session_id="x"), 0.0)
    q.arrive(Arrival("interactive", session_id="s"), 0.0)
    effects = q.handle(Released(1), 1.0)
    assert granted(effects) == [3]
    assert dispatched(effects)[0].decision["rule"] == "affinity"
    q.arrive(Arrival("interactive", session_id="s"), 1.0)
    effects = q.handle(Released(3), 60.0)  # x waited 60 s: the starvation bound
    assert granted(effects) == [2]
    assert dispatched(effects)[0].decision["rule"] == "starvation"


def test_a_request_that_opts_out_is_named_in_the_inputs() -> None:
    q = queue()
    q.arrive(Arrival("interactive"), 0.0)
    q.arrive(Arrival("interactive", affinity=False), 0.0)
    [event] = dispatched(q.handle(Released(1), 1.0))
    assert event.decision["inputs"]["opted_out"] == [2]


def test_leaving_dismisses_the_waiter_with_its_wait_and_who_was_ahead() -> None:
    q = queue()
    for at in (0.0, 1.0, 2.0):
        q.arrive(Arrival("interactive"), at)
    effects = q.handle(Left(3, "timeout"), 7.0)
    assert effects == [
        Record(QueueCancelled("llama:m", 3, "interactive", "timeout", 5.0, 7.0)),
        Dismiss(3, "timeout", 5.0, 2),
        WakeAmbient(),
    ]
    effects = q.handle(Left(2, "aborted"), 8.0)
    assert effects[1] == Dismiss(2, "cancelled", 7.0, 1)  # an abort is told as a cancel
    assert q.handle(Left(2, "cancelled"), 9.0) == []  # gone
    assert q.handle(Left(1, "cancelled"), 9.0) == []  # running
    assert q.describe(9.0).queued_interactive == 0


def test_a_move_swaps_ranks_within_a_lane_only() -> None:
    q = queue(affinity=False)
    for lane in ("interactive", "interactive", "interactive", "background"):
        q.arrive(Arrival(lane), 0.0)
    assert q.positions() == {2: 1, 3: 2, 4: 1}
    effects = q.handle(Moved(3, "up"), 1.0)
    assert effects[0] == Record(QueueMoved("llama:m", 3, "up", 2, 1.0))
    assert (q.positions(), q.rank(3), q.rank(2)) == ({2: 2, 3: 1, 4: 1}, 2, 3)
    assert q.handle(Moved(3, "up"), 1.0) == []  # first
    assert q.handle(Moved(4, "down"), 1.0) == []  # alone in its lane
    assert q.handle(Moved(1, "up"), 1.0) == []  # running
    assert granted(q.handle(Released(1), 2.0)) == [3]
    with pytest.raises(ValueError, match="a move is up or down, not 'left'"):
        q.handle(Moved(2, "left"), 2.0)  # type: ignore[arg-type]


def test_resizing_dispatches_at_once_or_lets_running_requests_finish() -> None:
    q = queue(interactive_cap=1)
    for _ in range(3):
        q.arrive(Arrival("interactive"), 0.0)
    assert granted(q.handle(Resized(3), 1.0)) == []  # the interactive cap asked stays 1
    assert granted(q.handle(Resized(3, interactive_cap=3), 1.0)) == [2, 3]
    assert q.caps == LaneCaps(3, 3, 3)
    assert q.handle(Resized(1), 2.0) == [WakeAmbient()]
    assert q.caps == LaneCaps(1, 1, 1)
    with pytest.raises(ValueError, match="at least 1, not 0"):
        q.handle(Resized(0), 2.0)
    with pytest.raises(ValueError, match="interactive or background, not 'bulk'"):
        q.arrive(Arrival("bulk"), 2.0)  # type: ignore[arg-type]


def test_ambient_work_waits_for_the_quiet_window_and_one_timer_watches_it() -> None:
    q = queue()
    q.arrive(Arrival("interactive"), 0.0)
    q.handle(Released(1), 10.0)  # activity at t=10
    ambient = Arrival("background", ambient=True)
    first, effects = q.arrive(ambient, 10.0)
    second, _ = q.arrive(ambient, 10.0)
    assert granted(effects) == []
    assert q.describe(10.0).ambient_held == 2
    assert q.recheck_in(first, 10.0) == 180.0 + AMBIENT_RECHECK_MARGIN
    assert q.recheck_in(second, 10.0) is None  # the first one's timer is enough
    assert granted(q.handle(RecheckDue(), 189.0)) == []
    effects = q.handle(RecheckDue(), 190.0)
    assert granted(effects) == [first]
    assert dispatched(effects)[0].decision["ambient_open"] is True
    assert q.recheck_in(second, 190.0) is None  # now the width is full: a release drains


def test_a_person_keeps_ambient_work_held_and_needs_no_timer() -> None:
    q = queue()
    held, _ = q.arrive(Arrival("background", ambient=True), 0.0)
    q.arrive(Arrival("interactive"), 100.0)
    assert q.recheck_in(held, 100.0) is None  # a person's work runs: its release drains
    q.handle(Released(2), 105.0)
    assert q.recheck_in(held, 105.0) == 180.0 + AMBIENT_RECHECK_MARGIN
    assert granted(q.handle(RecheckDue(), 285.0)) == [held]


def test_ambient_work_alone_from_the_clock_s_zero_is_looked_at_once_and_runs() -> None:
    # the queue made at 0.0 starts its quiet clock then: the one re-check it names opens the
    # gate (a re-check that could never change the gate's answer would be asked forever)
    q = queue()
    held, effects = q.arrive(Arrival("background", ambient=True), 0.0)
    assert granted(effects) == []
    assert q.recheck_in(held, 0.0) == 180.0 + AMBIENT_RECHECK_MARGIN
    assert granted(q.handle(RecheckDue(), 180.0 + AMBIENT_RECHECK_MARGIN)) == [held]


def test_spare_capacity_lets_ambient_work_run_beside_a_person() -> None:
    q = queue(3)
    q.arrive(Arrival("interactive"), 0.0)
    _, effects = q.arrive(Arrival("background", ambient=True), 0.0)
    assert granted(effects) == [2]  # 1 running < interactive cap 3 - 1
    _, effects = q.arrive(Arrival("background", ambient=True), 0.0)
    assert granted(effects) == []  # one slot stays free for the next person
    assert q.describe(0.0).ambient_held == 1


def test_describe_summarises_what_runs_and_what_waits() -> None:
    q = queue(2, interactive_cap=2, background_cap=1)
    q.arrive(Arrival("interactive", session_id="s", group="g", label="chat"), 0.0)
    q.arrive(Arrival("background", label="index"), 0.0)
    q.arrive(Arrival("interactive", label="chat2"), 0.0)
    q.arrive(Arrival("background", label="index2"), 0.0)
    summary = q.describe(1.5)
    assert (summary.width, summary.interactive_cap, summary.background_cap) == (2, 2, 1)
    assert (summary.running, summary.running_interactive, summary.running_background) == (2, 1, 1)
    assert (summary.queued_interactive, summary.queued_background) == (1, 1)
    assert [(a.label, a.running_for, a.session_id, a.group) for a in summary.active] == [
        ("chat", 1.5, "s", "g"),
        ("index", 1.5, None, None),
    ]
    assert [(p.label, p.position, p.waited) for p in summary.pending] == [
        ("chat2", 1, 1.5),
        ("index2", 1, 1.5),
    ]
    assert (q.ahead_of(3), q.ahead_of(4), q.ahead_of(1), q.position(1)) == (2, 3, None, None)
