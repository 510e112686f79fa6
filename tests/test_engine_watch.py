"""The engine watch's sequencing (sans I/O): ticks, health strikes, idleness and its deferral."""

from __future__ import annotations

from hostler.machines.watch import (
    BecameReady,
    EngineWatch,
    FinishStop,
    HealthProbed,
    Now,
    PressureRead,
    ProbeHealth,
    ReadLines,
    ReadPressure,
    RecordCrash,
    RequestBegan,
    RequestEnded,
    RotateLog,
    StartAsked,
    StopForHealth,
    StopIdle,
    Ticked,
    WatchBegan,
)
from hostler.policies.supervision import SupervisionPolicy

RULES = SupervisionPolicy(health_failures=3, idle_timeout=300.0, pressure_idle=60.0)
T0 = 1_800_000_000.0


def at(seconds: float) -> Now:
    """``seconds`` after the watch was made, on both clocks."""
    return Now(T0 + seconds, 1000.0 + seconds)


def watch(*, pressure: bool = False, rules: SupervisionPolicy = RULES) -> EngineWatch:
    made = EngineWatch(
        rules, health_interval=15.0, log_check_interval=1.0, pressure=pressure, now=at(0)
    )
    assert made.handle(WatchBegan(), at(0)) == []
    return made


def running(w: EngineWatch, seconds: float) -> list[object]:
    return list(w.handle(Ticked("running", alive=True), at(seconds)))


def settled(w: EngineWatch, seconds: float) -> list[object]:
    """A tick's effects with a due probe answered healthy: what the tick leads to."""
    effects = running(w, seconds)
    if effects[-1] == ProbeHealth():
        return [*effects[:-1], *w.handle(HealthProbed(True), at(seconds))]
    return effects


def stops(effects: list[object]) -> list[StopIdle]:
    return [e for e in effects if isinstance(e, StopIdle)]


def test_a_tick_reads_lines_looks_at_the_log_each_second_and_probes_every_interval() -> None:
    w = watch()
    assert running(w, 0.1) == [ReadLines(), RotateLog()]  # the first look at the log at once
    assert running(w, 0.2) == [ReadLines()]
    assert running(w, 1.1) == [ReadLines(), RotateLog()]
    assert running(w, 14.9) == [ReadLines(), RotateLog()]
    assert running(w, 15.0) == [ReadLines(), ProbeHealth()]  # the log is not due again yet
    assert running(w, 15.1) == [ReadLines()]
    assert running(w, 15.9) == [ReadLines(), RotateLog()]
    assert running(w, 29.9) == [ReadLines(), RotateLog()]
    assert running(w, 30.0) == [ReadLines(), ProbeHealth()]


def test_states_other_than_running_have_their_own_effect_or_none() -> None:
    w = watch()
    assert w.handle(Ticked("stopping", alive=True), at(1)) == [FinishStop()]
    assert w.handle(Ticked("stopping", alive=False), at(1)) == [FinishStop()]
    assert w.handle(Ticked("running", alive=False), at(1)) == [RecordCrash()]
    for state in ("starting", "stopped", "backoff", "fatal", "adopting"):
        assert w.handle(Ticked(state, alive=True), at(1)) == []


def test_three_failed_probes_in_a_row_stop_and_restart_and_a_good_one_forgives() -> None:
    w = watch()
    assert w.handle(HealthProbed(False), at(15)) == []
    assert w.handle(HealthProbed(False), at(30)) == []
    assert w.health_failures == 2
    assert w.handle(HealthProbed(True), at(45)) == []  # SP3: in a row, or not at all
    assert w.health_failures == 0
    w.handle(HealthProbed(False), at(60))
    w.handle(HealthProbed(False), at(75))
    (stop,) = w.handle(HealthProbed(False), at(90))
    assert isinstance(stop, StopForHealth)
    assert stop.reason == "health-restart"
    assert (stop.decision["consecutive_failures"], stop.decision["rule"]) == (3, "SP3")
    assert w.handle(BecameReady(), at(95)) == []
    assert w.health_failures == 0  # the new process starts with no strikes


def test_idle_stops_at_the_timeout_exactly_and_a_probe_defers_the_look_to_its_answer() -> None:
    w = watch()
    running(w, 0.1)
    assert running(w, 299.9) == [ReadLines(), RotateLog(), ProbeHealth()]
    assert w.handle(HealthProbed(True), at(299.9)) == []  # healthy, and not idle yet
    (stop,) = running(w, 300.0)[1:]  # the lines are read, then the idle stop
    assert isinstance(stop, StopIdle) and stop.reason == "idle"
    assert (stop.decision["unused_for"], stop.decision["idle_timeout"]) == (300.0, 300.0)
    w2 = watch()
    running(w2, 0.1)
    assert running(w2, 300.0) == [ReadLines(), RotateLog(), ProbeHealth()]
    (after,) = w2.handle(HealthProbed(True), at(300.0))  # the answer leads on to idleness
    assert isinstance(after, StopIdle)
    w3 = watch()
    running(w3, 0.1)
    running(w3, 300.0)
    (after_failure,) = w3.handle(HealthProbed(False), at(300.0))
    assert isinstance(after_failure, StopIdle)  # one failed probe is no stop; idleness is


def test_use_restarts_the_idle_window_and_a_busy_engine_puts_it_off_a_whole_window() -> None:
    w = watch()
    w.handle(StartAsked(), at(100))
    assert stops(settled(w, 399.9)) == []
    assert len(stops(settled(w, 400.0))) == 1
    w = watch()
    w.handle(RequestBegan(), at(10))
    assert (w.busy, w.in_flight) == (True, 1)
    assert stops(settled(w, 309.9)) == [] and w.last_used == T0 + 10.0
    assert stops(settled(w, 310.0)) == []  # busy: never idle-stopped
    assert w.last_used == T0 + 310.0  # SP4: busy through the window, put off a whole window
    w.handle(RequestEnded(), at(320))
    assert (w.busy, w.last_used) == (False, T0 + 320.0)
    assert stops(settled(w, 619.9)) == []
    assert len(stops(settled(w, 620.0))) == 1


def test_an_unmatched_end_never_makes_the_count_negative() -> None:
    w = watch()
    w.handle(RequestEnded(), at(1))
    assert w.in_flight == 0 and not w.busy


def test_pressure_is_asked_after_its_own_idle_time_and_its_answer_decides() -> None:
    w = watch(pressure=True)
    assert ReadPressure() not in settled(w, 59.9)
    assert settled(w, 60.0)[-1] == ReadPressure()
    (stop,) = w.handle(PressureRead(True), at(60.0))
    assert isinstance(stop, StopIdle) and stop.reason == "memory-pressure"
    assert w.handle(PressureRead(False), at(60.0)) == []  # no pressure: the idle timeout rules
    assert isinstance(w.handle(PressureRead(False), at(300.0))[0], StopIdle)
    busy = watch(pressure=True)
    busy.handle(RequestBegan(), at(0))
    assert ReadPressure() not in settled(busy, 120.0)  # busy: the host is not even asked


def test_no_idle_timeout_means_never_idle() -> None:
    w = watch(rules=SupervisionPolicy(idle_timeout=0))
    assert stops(settled(w, 1e7)) == []
