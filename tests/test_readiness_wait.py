"""The readiness wait (RD1, RD7; sans I/O): probes, pauses, the timeout, exits and stops."""

from __future__ import annotations

from hostler.machines.readiness import (
    LAST_PROBE,
    AbortStart,
    Answered,
    BecomeReady,
    FailStart,
    Look,
    Looked,
    Pause,
    Paused,
    ReadinessWait,
    SendProbe,
)


def wait(*, timeout: float = 10.0, has_probe: bool = True) -> ReadinessWait:
    return ReadinessWait(
        began=100.0, timeout=timeout, poll=0.5, probe_wait=2.0, has_probe=has_probe
    )


def test_it_looks_probes_pauses_and_looks_again_until_ready() -> None:
    w = wait()
    assert w.start() == [Look()]
    assert w.handle(Looked(), 100.0) == [SendProbe(2.0)]
    assert w.handle(Answered(False), 100.1) == [Pause(0.5)]
    assert w.handle(Paused(), 100.6) == [Look()]
    assert w.handle(Looked(), 100.6) == [SendProbe(2.0)]
    assert w.handle(Answered(True), 100.7) == [BecomeReady()]


def test_a_probe_never_waits_past_the_deadline_but_gets_its_last_moment() -> None:
    w = wait()
    assert w.handle(Looked(), 109.0) == [SendProbe(1.0)]
    assert w.handle(Looked(), 109.99) == [SendProbe(LAST_PROBE)]
    assert w.handle(Looked(), 111.0) == [SendProbe(LAST_PROBE)]  # past due: one last answer
    assert LAST_PROBE == 0.05


def test_not_ready_at_the_deadline_is_a_timeout_and_just_before_it_a_pause() -> None:
    w = wait()
    assert w.handle(Answered(False), 109.999) == [Pause(0.5)]
    assert w.handle(Answered(False), 110.0) == [FailStart(exited=False, timed_out=True)]


def test_an_exit_or_a_fatal_panic_fails_at_once() -> None:
    w = wait()
    assert w.handle(Looked(exited=True), 100.0) == [FailStart(exited=True)]
    assert w.handle(Looked(fatal=True), 100.0) == [FailStart(exited=False)]
    assert w.handle(Looked(exited=True, fatal=True), 100.0) == [FailStart(exited=True)]


def test_a_stop_wins_over_everything_and_over_the_answer_in_flight() -> None:
    w = wait()
    assert w.handle(Looked(abort="evicted", exited=True), 100.0) == [AbortStart("evicted")]
    assert w.handle(Answered(True, interrupted=True), 100.0) == [Look()]  # then the abort
    assert w.handle(Answered(False, interrupted=True), 200.0) == [Look()]  # not a timeout


def test_a_pending_ready_line_sends_no_probe_and_no_path_needs_none() -> None:
    w = wait()
    assert w.handle(Looked(line_pending=True), 100.0) == [Pause(0.5)]
    assert w.handle(Looked(line_pending=True), 110.0) == [FailStart(exited=False, timed_out=True)]
    bare = wait(has_probe=False)
    assert bare.handle(Looked(), 100.0) == [BecomeReady()]
    assert bare.handle(Looked(line_pending=True), 100.0) == [Pause(0.5)]
