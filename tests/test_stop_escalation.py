"""The stop's escalation as a pure core (SG2, SG4): TERM, TERM, KILL, each after a re-check."""

from __future__ import annotations

from hostler.machines.stop import (
    FIRST_PAUSE,
    LONGEST_PAUSE,
    CheckGroup,
    GroupChecked,
    GroupLooked,
    LookAtGroup,
    PauseStop,
    SignalGroup,
    Signalled,
    StopEffect,
    StopEnded,
    StopEscalation,
    StopPaused,
    StopTimings,
)

TERM, KILL = False, True  # SignalGroup.kill
TIMINGS = StopTimings(grace=2.0, second_grace=1.0, kill_wait=5.0)


def _run(
    escalation: StopEscalation, *, ends_at: float | None, ours: bool = True
) -> tuple[StopEnded, list[tuple[float, bool]]]:
    """Carry the escalation out on a group that ends at ``ends_at`` (None: never)."""
    now = 0.0
    signals: list[tuple[float, bool]] = []
    effects: list[StopEffect] = escalation.start()
    for _ in range(10_000):
        match effects:
            case [StopEnded() as ended]:
                return ended, signals
            case [SignalGroup(kill)]:
                signals.append((round(now, 3), kill))
                effects = escalation.handle(Signalled(sent=True), now)
            case [LookAtGroup()]:
                gone = ends_at is not None and now >= ends_at
                effects = escalation.handle(GroupLooked(gone), now)
            case [PauseStop(seconds)]:
                assert 0 < seconds <= LONGEST_PAUSE
                now += seconds
                effects = escalation.handle(StopPaused(), now)
            case [CheckGroup()]:
                effects = escalation.handle(GroupChecked(ours, "" if ours else "pid reused"), now)
            case _:
                raise AssertionError(effects)
    raise AssertionError("the escalation never ended")


def test_an_engine_that_ends_at_the_first_term_gets_one_signal() -> None:
    ended, signals = _run(StopEscalation(42, TIMINGS), ends_at=0.0)
    assert ended == StopEnded(gone=True, detail="")
    assert signals == [(0.0, TERM)]


def test_an_engine_that_hangs_on_the_first_term_gets_the_second_after_the_grace() -> None:
    ended, signals = _run(StopEscalation(42, TIMINGS), ends_at=2.5)
    assert ended.gone
    assert [kill for _, kill in signals] == [TERM, TERM]
    assert signals[1][0] == 2.0


def test_a_group_that_ignores_term_is_killed_after_both_graces() -> None:
    ended, signals = _run(StopEscalation(42, TIMINGS), ends_at=3.2)
    assert ended.gone
    assert [kill for _, kill in signals] == [TERM, TERM, KILL]
    assert signals[2][0] == 3.0


def test_a_group_that_outlives_kill_is_not_gone_and_says_so() -> None:
    ended, signals = _run(StopEscalation(42, TIMINGS), ends_at=None)
    assert ended == StopEnded(gone=False, detail="process group 42 is still alive after KILL")
    assert len(signals) == 3


def test_a_group_that_outlives_kill_but_is_not_ours_any_more_counts_as_gone() -> None:
    ended, _ = _run(StopEscalation(42, TIMINGS), ends_at=None, ours=False)
    assert ended == StopEnded(gone=True, detail="pid reused")


def test_a_group_that_is_not_the_engines_is_never_signalled() -> None:
    escalation = StopEscalation(42, TIMINGS)
    assert escalation.start() == [SignalGroup(TERM)]
    effects = escalation.handle(Signalled(sent=False, why="pid 42 is now bash"), 0.0)
    assert effects == [StopEnded(gone=True, detail="pid 42 is now bash")]
    assert escalation.ended
    assert escalation.handle(GroupLooked(gone=False), 1.0) == []


def test_the_looks_start_at_a_millisecond_and_double_to_twenty() -> None:
    escalation = StopEscalation(42, TIMINGS)
    escalation.start()
    assert escalation.handle(Signalled(sent=True), 0.0) == [LookAtGroup()]
    pauses = []
    now = 0.0
    for _ in range(7):
        (effect,) = escalation.handle(GroupLooked(gone=False), now)
        assert isinstance(effect, PauseStop)
        pauses.append(effect.seconds)
        now += effect.seconds
        assert escalation.handle(StopPaused(), now) == [LookAtGroup()]
    assert pauses == [FIRST_PAUSE, 0.002, 0.004, 0.008, 0.016, 0.02, 0.02]


def test_zero_graces_go_straight_to_kill_and_then_to_the_check() -> None:
    escalation = StopEscalation(7, StopTimings(0.0, 0.0, 0.0))
    effects = escalation.start()
    seen = []
    for _ in range(20):
        match effects:
            case [SignalGroup(kill)]:
                seen.append(kill)
                effects = escalation.handle(Signalled(sent=True), 0.0)
            case [LookAtGroup()]:
                effects = escalation.handle(GroupLooked(gone=False), 0.0)
            case [CheckGroup()]:
                effects = escalation.handle(GroupChecked(ours=True), 0.0)
            case [StopEnded(gone=gone)]:
                assert not gone
                break
    assert seen == [TERM, TERM, KILL]
