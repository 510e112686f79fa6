"""The pure supervision policy (SP1–SP5): decisions with their inputs, no sleeping, no clock."""

from __future__ import annotations

import math

import pytest

from hostler.machines.engine import Engine
from hostler.policies.supervision import (
    SupervisionPolicy,
    decide_health,
    decide_idle,
    decide_pressure,
    decide_start,
)

POLICY = SupervisionPolicy()


def test_defaults_are_the_reference_values() -> None:
    assert POLICY.restart_budget == 3
    assert POLICY.restart_window == 60.0
    assert POLICY.lockout == 60.0
    assert POLICY.health_failures == 3
    assert POLICY.idle_timeout == 300.0
    assert POLICY.pressure_idle == 60.0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("restart_budget", 0),
        ("restart_budget", -1),
        ("health_failures", 0),
        ("restart_window", -1.0),
        ("lockout", -0.5),
        ("idle_timeout", -5.0),
        ("pressure_idle", math.nan),
    ],
)
def test_nonsense_thresholds_are_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        SupervisionPolicy(**{field: value})  # type: ignore[arg-type]


def test_restart_budget_counts_starts_in_the_window_inclusive() -> None:
    now = 1000.0
    assert decide_start(POLICY, [], now).allowed
    assert decide_start(POLICY, [now - 1, now - 2], now).allowed
    refused = decide_start(POLICY, [now - 60.0, now - 30, now - 1], now)
    assert not refused.allowed  # exactly 60 s ago still counts
    assert refused.retry_at == now + 60.0
    assert refused.error == "started 3 times within 60 s"
    assert refused.decision == {
        "policy": "supervision",
        "version": 1,
        "rule": "SP1",
        "now": now,
        "restart_budget": 3,
        "restart_window": 60.0,
        "lockout": 60.0,
        "recent_starts": [now - 60.0, now - 30, now - 1],
    }
    # one just outside the window no longer counts
    assert decide_start(POLICY, [now - 60.001, now - 30, now - 1], now).allowed
    budget_one = SupervisionPolicy(restart_budget=1, lockout=5.0)
    assert decide_start(budget_one, [], now).allowed
    only = decide_start(budget_one, [now], now)
    assert not only.allowed and only.retry_at == now + 5.0


def test_restart_budget_is_rebuilt_from_the_log() -> None:
    """Break 7: the budget was an in-memory deque that a daemon restart reset."""
    engine = Engine("llamacpp:m:0")
    for at in (10.0, 20.0, 30.0):
        engine.fire("start", at=at, cause="request")
        engine.fire(
            "crashed", at=at + 1, exit_code=1, signal=None, reached_ready=False, retry_at=at + 1
        )
    rebuilt = Engine("llamacpp:m:0")
    for event in engine.pending:
        rebuilt.apply(event)
    assert rebuilt.start_times == [10.0, 20.0, 30.0]
    assert not decide_start(POLICY, rebuilt.start_times, 40.0).allowed
    assert decide_start(POLICY, rebuilt.start_times, 70.5).allowed  # 10 s start left the window


def test_start_history_is_bounded() -> None:
    engine = Engine("llamacpp:m:0")
    for i in range(40):
        engine.fire("start", at=float(i), cause="request")
        engine.fire(
            "crashed", at=i + 0.5, exit_code=1, signal=None, reached_ready=False, retry_at=0.0
        )
    assert len(engine.start_times) == 32
    assert engine.start_times[0] == 8.0 and engine.start_times[-1] == 39.0


def test_health_restarts_after_consecutive_failures_only() -> None:
    verdict = decide_health(POLICY, 0, False, 5.0)
    assert verdict.failures == 1 and verdict.stop is None
    verdict = decide_health(POLICY, 1, False, 6.0)
    assert verdict.failures == 2 and verdict.stop is None
    assert decide_health(POLICY, 2, True, 7.0).failures == 0  # one pass resets
    verdict = decide_health(POLICY, 2, False, 7.0)
    assert verdict.failures == 0
    assert verdict.stop is not None and verdict.stop.reason == "health-restart"
    assert verdict.stop.decision == {
        "policy": "supervision",
        "version": 1,
        "rule": "SP3",
        "now": 7.0,
        "consecutive_failures": 3,
        "health_failures": 3,
    }
    single = SupervisionPolicy(health_failures=1)
    assert decide_health(single, 0, False, 1.0).stop is not None


def test_idle_stop_at_the_boundary_never_while_busy_and_zero_disables() -> None:
    assert decide_idle(POLICY, now=399.9, last_used=100.0, busy=False) is None
    stop = decide_idle(POLICY, now=400.0, last_used=100.0, busy=False)
    assert stop is not None and stop.reason == "idle"
    assert stop.decision == {
        "policy": "supervision",
        "version": 1,
        "rule": "SP4",
        "now": 400.0,
        "last_used": 100.0,
        "unused_for": 300.0,
        "idle_timeout": 300.0,
    }
    assert decide_idle(POLICY, now=10_000.0, last_used=100.0, busy=True) is None
    never = SupervisionPolicy(idle_timeout=0)
    assert decide_idle(never, now=1e9, last_used=0.0, busy=False) is None
    # a clock that went backwards is not "idle"
    assert decide_idle(POLICY, now=50.0, last_used=100.0, busy=False) is None


def test_pressure_stops_only_an_idle_engine_under_pressure() -> None:
    assert (
        decide_pressure(POLICY, now=160.0, last_used=100.0, busy=False, under_pressure=False)
        is None
    )
    assert (
        decide_pressure(POLICY, now=160.0, last_used=100.0, busy=True, under_pressure=True) is None
    )
    assert (
        decide_pressure(POLICY, now=159.9, last_used=100.0, busy=False, under_pressure=True) is None
    )
    stop = decide_pressure(
        POLICY,
        now=160.0,
        last_used=100.0,
        busy=False,
        under_pressure=True,
        pressure_detail={"available": 5},
    )
    assert stop is not None and stop.reason == "memory-pressure"
    assert stop.decision["rule"] == "SP5"
    assert stop.decision["unused_for"] == 60.0
    assert stop.decision["pressure_idle"] == 60.0
    assert stop.decision["pressure"] == {"available": 5}


def test_a_chosen_stop_ends_a_residency_and_only_crashes_count_against_the_budget() -> None:
    """SP1. Found by a breaking helper: Ctrl-C during a crash's restart (``start-cancelled``),
    then a new daemon's first load and one crash locked the model out for 60 s — "started 3
    times within 60 s" after two crashes. A stop hostler or a person chose ends a residency:
    its next start is not a restart; crashes, lost engines, failed starts and health restarts
    still count."""
    from hostler.machines.engine import StopReason

    spawn = {
        "pid": 1, "create_time": 1.0, "boot_id": "b", "launch_token": "t",
        "argv_fingerprint": "f", "port": 1,
    }  # fmt: skip
    for reason in (
        StopReason.IDLE, StopReason.USER, StopReason.SHUTDOWN, StopReason.START_CANCELLED,
        StopReason.MEMORY_PRESSURE, StopReason.UNCONFIGURED, StopReason.EVICTED,
    ):  # fmt: skip
        engine = Engine("llamacpp:m:0")
        engine.fire("start", at=1.0, cause="request")
        engine.fire("crashed", at=2.0, exit_code=1, signal=None, reached_ready=False, retry_at=2.0)
        engine.fire("start", at=3.0, cause="request")
        engine.fire("spawned", at=3.1, **spawn)
        engine.fire("stop", at=4.0, reason=reason)
        assert engine.start_times == [], reason
    engine = Engine("llamacpp:m:0")
    engine.fire("start", at=1.0, cause="request")
    engine.fire("spawned", at=1.1, **spawn)
    engine.fire("ready", at=1.2)
    engine.fire("stop", at=4.0, reason=StopReason.HEALTH_RESTART)
    assert engine.start_times == [1.0]  # a restart for failing health still counts
