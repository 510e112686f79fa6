"""The device health gate's pure rules (DH1, DH3–DH5): defaults and edges pinned by value."""

from __future__ import annotations

import dataclasses

import pytest

from hostler.errors import SettingError, UsageError
from hostler.policies.health import (
    DEFAULTS,
    ENV,
    HARD_TEMP_C,
    POLICY_NAME,
    POLICY_VERSION,
    AdmissionState,
    Evaluation,
    HealthPolicy,
    Reading,
    admission_step,
    evaluate,
    health_state,
    readings_from_gpus,
    resolve_health_policy,
)

GUARD = HealthPolicy(mode="guard")
OBSERVE = HealthPolicy()
OFF = HealthPolicy(mode="off")


def hot(temp: float, **kw: object) -> tuple[Reading, ...]:
    return (Reading("0", temperature_c=temp, **kw),)  # type: ignore[arg-type]


# -- DH1 ------------------------------------------------------------------------------------


def test_defaults_by_value() -> None:
    assert HARD_TEMP_C == 105.0
    assert (POLICY_NAME, POLICY_VERSION) == ("device-health", 1)
    p = resolve_health_policy({})
    assert p == HealthPolicy()
    assert p.mode == "observe"
    assert p.telemetry_failure == "allow"
    assert (p.max_start_temp_c, p.resume_temp_c, p.min_thermal_margin_c) == (80.0, 75.0, 8.0)
    assert (p.poll, p.max_wait, p.healthy_samples) == (5.0, 600.0, 3)
    assert DEFAULTS["poll_ms"] == 5000.0 and DEFAULTS["max_wait_ms"] == 600_000.0
    assert ENV["mode"] == "HOSTLER_DEVICE_SAFETY_MODE"
    assert set(ENV.values()) == {
        "HOSTLER_DEVICE_SAFETY_MODE",
        "HOSTLER_DEVICE_SAFETY_TELEMETRY_FAILURE",
        "HOSTLER_DEVICE_SAFETY_MAX_START_TEMP_C",
        "HOSTLER_DEVICE_SAFETY_RESUME_TEMP_C",
        "HOSTLER_DEVICE_SAFETY_MIN_THERMAL_MARGIN_C",
        "HOSTLER_DEVICE_SAFETY_POLL_MS",
        "HOSTLER_DEVICE_SAFETY_MAX_WAIT_MS",
        "HOSTLER_DEVICE_SAFETY_HEALTHY_SAMPLES",
    }


def test_env_overrides_config_which_overrides_defaults() -> None:
    config = {"mode": "guard", "max_start_temp_c": 70, "poll_ms": 1000}
    p = resolve_health_policy({"HOSTLER_DEVICE_SAFETY_MAX_START_TEMP_C": " 90 "}, config)
    assert p.mode == "guard"
    assert p.max_start_temp_c == 90.0
    assert p.poll == 1.0
    assert p.resume_temp_c == 75.0
    # a blank variable is unset: the config value stands
    p = resolve_health_policy({"HOSTLER_DEVICE_SAFETY_MODE": "  "}, config)
    assert p.mode == "guard"
    p = resolve_health_policy({"HOSTLER_DEVICE_SAFETY_MODE": " OFF "}, config)
    assert p.mode == "off"
    assert resolve_health_policy({}, {"mode": None}).mode == "observe"


def test_every_setting_from_env() -> None:
    env = {
        "HOSTLER_DEVICE_SAFETY_MODE": "guard",
        "HOSTLER_DEVICE_SAFETY_TELEMETRY_FAILURE": "Block",
        "HOSTLER_DEVICE_SAFETY_MAX_START_TEMP_C": "85",
        "HOSTLER_DEVICE_SAFETY_RESUME_TEMP_C": "70",
        "HOSTLER_DEVICE_SAFETY_MIN_THERMAL_MARGIN_C": "4.5",
        "HOSTLER_DEVICE_SAFETY_POLL_MS": "2500",
        "HOSTLER_DEVICE_SAFETY_MAX_WAIT_MS": "30000",
        "HOSTLER_DEVICE_SAFETY_HEALTHY_SAMPLES": "5",
    }
    assert resolve_health_policy(env) == HealthPolicy(
        "guard", "block", 85.0, 70.0, 4.5, 2.5, 30.0, 5
    )


@pytest.mark.parametrize(
    ("poll_ms", "poll"),
    [("499", 0.5), ("500", 0.5), ("501", 0.501), ("60000", 60.0), ("60001", 60.0), ("-5", 0.5)],
)
def test_poll_is_clamped(poll_ms: str, poll: float) -> None:
    assert resolve_health_policy({"HOSTLER_DEVICE_SAFETY_POLL_MS": poll_ms}).poll == poll


@pytest.mark.parametrize(
    ("wait_ms", "wait"),
    [("-1", 0.0), ("0", 0.0), ("1", 0.001), ("3600000", 3600.0), ("3600001", 3600.0)],
)
def test_max_wait_is_clamped(wait_ms: str, wait: float) -> None:
    assert resolve_health_policy({"HOSTLER_DEVICE_SAFETY_MAX_WAIT_MS": wait_ms}).max_wait == wait


@pytest.mark.parametrize(
    ("text", "count"),
    [("0", 1), ("1", 1), ("2.9", 2), ("-3", 1), ("20", 20), ("20.9", 20), ("21", 20), ("19", 19)],
)
def test_healthy_samples_truncated_and_clamped(text: str, count: int) -> None:
    p = resolve_health_policy({"HOSTLER_DEVICE_SAFETY_HEALTHY_SAMPLES": text})
    assert p.healthy_samples == count
    assert type(p.healthy_samples) is int


def test_resume_is_at_most_max_start() -> None:
    p = resolve_health_policy({"HOSTLER_DEVICE_SAFETY_RESUME_TEMP_C": "90"})
    assert (p.max_start_temp_c, p.resume_temp_c) == (80.0, 80.0)
    p = resolve_health_policy({"HOSTLER_DEVICE_SAFETY_RESUME_TEMP_C": "79.5"})
    assert p.resume_temp_c == 79.5
    p = resolve_health_policy({"HOSTLER_DEVICE_SAFETY_MAX_START_TEMP_C": "60"})
    assert p.resume_temp_c == 60.0


@pytest.mark.parametrize(
    ("variable", "text", "words"),
    [
        ("HOSTLER_DEVICE_SAFETY_MODE", "strict", "off, observe, guard"),
        ("HOSTLER_DEVICE_SAFETY_TELEMETRY_FAILURE", "deny", "allow, block"),
        ("HOSTLER_DEVICE_SAFETY_MAX_START_TEMP_C", "hot", "degrees Celsius from 0 to 125"),
        ("HOSTLER_DEVICE_SAFETY_MAX_START_TEMP_C", "150", "degrees Celsius"),
        ("HOSTLER_DEVICE_SAFETY_MAX_START_TEMP_C", "125.1", "degrees Celsius"),
        ("HOSTLER_DEVICE_SAFETY_RESUME_TEMP_C", "-0.5", "degrees Celsius"),
        ("HOSTLER_DEVICE_SAFETY_RESUME_TEMP_C", "nan", "degrees Celsius"),
        ("HOSTLER_DEVICE_SAFETY_MIN_THERMAL_MARGIN_C", "100.5", "from 0 to 100"),
        ("HOSTLER_DEVICE_SAFETY_MIN_THERMAL_MARGIN_C", "-1", "from 0 to 100"),
        ("HOSTLER_DEVICE_SAFETY_POLL_MS", "5s", "milliseconds"),
        ("HOSTLER_DEVICE_SAFETY_POLL_MS", "inf", "milliseconds"),
        ("HOSTLER_DEVICE_SAFETY_MAX_WAIT_MS", "nan", "milliseconds"),
        ("HOSTLER_DEVICE_SAFETY_HEALTHY_SAMPLES", "three", "samples"),
    ],
)
def test_malformed_env_is_refused_naming_the_variable(variable: str, text: str, words: str) -> None:
    with pytest.raises(SettingError) as caught:
        resolve_health_policy({variable: text})
    assert caught.value.code == "usage.setting"
    assert f"{variable}={text!r}" in caught.value.message
    assert words in caught.value.message


@pytest.mark.parametrize("value", [0, 125, 0.0, 125.0])
def test_temperature_range_edges_accepted(value: float) -> None:
    p = resolve_health_policy({}, {"max_start_temp_c": value, "resume_temp_c": value})
    assert p.max_start_temp_c == value
    p = resolve_health_policy({}, {"min_thermal_margin_c": value * 100 / 125})
    assert p.min_thermal_margin_c == value * 100 / 125


@pytest.mark.parametrize(
    ("key", "value"),
    [("mode", 3), ("mode", "loud"), ("poll_ms", "fast"), ("poll_ms", True), ("poll_ms", [1])],
)
def test_malformed_config_is_a_usage_error_naming_the_key(key: str, value: object) -> None:
    with pytest.raises(UsageError) as caught:
        resolve_health_policy({}, {key: value})
    assert not isinstance(caught.value, SettingError)
    assert f"device health {key}=" in caught.value.message


def test_unknown_config_key_is_refused() -> None:
    with pytest.raises(UsageError, match="max_temp"):
        resolve_health_policy({}, {"max_temp": 3})


def test_policy_as_dict_carries_every_setting() -> None:
    assert GUARD.as_dict() == {
        "mode": "guard",
        "telemetry_failure": "allow",
        "max_start_temp_c": 80.0,
        "resume_temp_c": 75.0,
        "min_thermal_margin_c": 8.0,
        "poll": 5.0,
        "max_wait": 600.0,
        "healthy_samples": 3,
    }


# -- readings ------------------------------------------------------------------------------


def test_readings_from_device_sample_gpus() -> None:
    gpus: list[dict[str, object]] = [
        {"uuid": "GPU-a", "name": "x", "total": 2 * 1024**3, "used": 512 * 1024**2,
         "temperature_c": 70, "thermal_slowdown": False, "power_brake": True},
        {"uuid": "", "name": "y", "total": None, "used": None, "temperature_c": None},
    ]  # fmt: skip
    a, b = readings_from_gpus(gpus)
    assert a == Reading("GPU-a", 70.0, None, False, True, 2048.0, 512.0)
    assert b == Reading("1", None, None, None, None, None, None)
    assert readings_from_gpus([]) == ()


# -- DH3 ------------------------------------------------------------------------------------


def test_off_admits_anything() -> None:
    ev = evaluate(OFF, hot(200, thermal_slowdown=True), cooling=True)
    assert ev.admissible and not ev.hard_blocked and ev.reasons == ()
    assert evaluate(dataclasses.replace(OFF, telemetry_failure="block"), (), False).admissible


def test_no_readings_follow_the_failure_policy() -> None:
    assert evaluate(GUARD, (), cooling=False).admissible
    block = dataclasses.replace(GUARD, telemetry_failure="block")
    ev = evaluate(block, (), cooling=False)
    assert not ev.admissible and not ev.hard_blocked
    assert ev.reasons == ("no device telemetry, and the telemetry failure policy is block",)


def test_start_limit_is_strict() -> None:
    assert evaluate(GUARD, hot(80), cooling=False).admissible
    ev = evaluate(GUARD, hot(80.5), cooling=False)
    assert ev.reasons == ("GPU 0 at 80.5 °C > start limit 80 °C",)
    assert not ev.hard_blocked


def test_resume_limit_while_cooling() -> None:
    assert evaluate(GUARD, hot(75), cooling=True).admissible
    ev = evaluate(GUARD, hot(76), cooling=True)
    assert ev.reasons == ("GPU 0 at 76 °C > resume limit 75 °C",)
    assert ev.decision["limit_c"] == 75.0


def test_hard_limit_at_105_strict() -> None:
    ev = evaluate(GUARD, hot(105), cooling=False)
    assert not ev.hard_blocked
    ev = evaluate(GUARD, hot(105.5), cooling=False)
    assert ev.hard_blocked
    assert ev.reasons == (
        "GPU 0 at 105.5 °C > start limit 80 °C",
        "GPU 0 at 105.5 °C > hard limit 105 °C",
    )
    # the hard limit holds even with a max start set above it
    high = dataclasses.replace(GUARD, max_start_temp_c=125.0)
    ev = evaluate(high, hot(106), cooling=False)
    assert ev.hard_blocked and ev.reasons == ("GPU 0 at 106 °C > hard limit 105 °C",)


def test_margin_slowdown_and_brake_are_reasons() -> None:
    assert evaluate(GUARD, hot(50, margin_c=8.0), cooling=False).admissible
    ev = evaluate(GUARD, hot(50, margin_c=7.5), cooling=False)
    assert ev.reasons == ("GPU 0 thermal margin 7.5 °C < 8 °C",)
    ev = evaluate(GUARD, hot(50, thermal_slowdown=True), cooling=False)
    assert ev.reasons == ("GPU 0 is slowing down for heat",)
    ev = evaluate(GUARD, hot(50, power_brake=True), cooling=False)
    assert ev.reasons == ("GPU 0 is held by a power brake",)
    ev = evaluate(GUARD, hot(50, thermal_slowdown=False, power_brake=False), cooling=False)
    assert ev.admissible
    assert evaluate(GUARD, (Reading("0"),), cooling=False).admissible


def test_every_card_is_judged() -> None:
    readings = (Reading("a", 50.0), Reading("b", 90.0), Reading("c", 95.0))
    ev = evaluate(GUARD, readings, cooling=False)
    assert ev.reasons == (
        "GPU b at 90 °C > start limit 80 °C",
        "GPU c at 95 °C > start limit 80 °C",
    )


def test_evaluation_decision_carries_inputs() -> None:
    ev = evaluate(GUARD, hot(90), cooling=False)
    assert ev.decision["policy"] == "device-health"
    assert ev.decision["version"] == 1
    assert ev.decision["rule"] == "DH3"
    assert ev.decision["settings"] == GUARD.as_dict()
    assert ev.decision["cooling"] is False
    assert ev.decision["limit_c"] == 80.0
    assert ev.decision["readings"][0]["temperature_c"] == 90.0
    assert ev.decision["hard_blocked"] is False
    assert ev.decision["reasons"] == list(ev.reasons)


# -- DH4 ------------------------------------------------------------------------------------


def test_off_step_admits_without_looking() -> None:
    step = admission_step(AdmissionState(2, True), hot(200), OFF, elapsed=10_000.0)
    assert step.action == "admit" and step.state == AdmissionState() and step.sleep == 0.0


def test_observe_admits_warm_cards_but_not_past_105() -> None:
    step = admission_step(AdmissionState(), hot(104, thermal_slowdown=True), OBSERVE, 0.0)
    assert step.action == "admit"
    assert step.evaluation.reasons  # warm, still admitted
    step = admission_step(AdmissionState(), hot(106), OBSERVE, 0.0)
    assert step.action == "wait"
    assert step.state == AdmissionState(0, True)
    assert step.sleep == 5.0
    # once at or under 105 °C the cooling admission admits, and cooling ends
    step = admission_step(step.state, hot(105), OBSERVE, 5.0)
    assert step.action == "admit" and step.state == AdmissionState(0, False)


def test_observe_with_no_telemetry_admits_even_when_failure_blocks() -> None:
    observe_block = dataclasses.replace(OBSERVE, telemetry_failure="block")
    assert admission_step(AdmissionState(), (), observe_block, 0.0).action == "admit"


def test_guard_needs_one_healthy_sample_when_not_cooling() -> None:
    step = admission_step(AdmissionState(), hot(70), GUARD, 0.0)
    assert step.action == "admit" and step.decision["required"] == 1


def test_guard_needs_three_in_a_row_while_cooling() -> None:
    state = AdmissionState()
    step = admission_step(state, hot(90), GUARD, 0.0)
    assert step.action == "wait" and step.state == AdmissionState(0, True)
    actions = []
    for i, temp in enumerate([74, 74, 76, 74, 74, 74]):
        step = admission_step(step.state, hot(temp), GUARD, 5.0 * (i + 1))
        actions.append((step.action, step.state.healthy))
    assert actions == [
        ("wait", 1),
        ("wait", 2),
        ("wait", 0),  # 76 °C > resume 75 °C: count reset
        ("wait", 1),
        ("wait", 2),
        ("admit", 0),
    ]
    assert step.decision["required"] == 3
    assert step.state.cooling is False


def test_guard_healthy_samples_setting_is_the_cooling_requirement() -> None:
    one = dataclasses.replace(GUARD, healthy_samples=1)
    assert admission_step(AdmissionState(0, True), hot(70), one, 0.0).action == "admit"
    two = dataclasses.replace(GUARD, healthy_samples=2)
    step = admission_step(AdmissionState(0, True), hot(70), two, 0.0)
    assert step.action == "wait" and step.state == AdmissionState(1, True)
    assert admission_step(step.state, hot(70), two, 1.0).action == "admit"


def test_max_wait_blocks_at_equality() -> None:
    step = admission_step(AdmissionState(), hot(90), GUARD, 599.9)
    assert step.action == "wait"
    assert step.sleep == pytest.approx(0.1)
    step = admission_step(AdmissionState(), hot(90), GUARD, 600.0)
    assert step.action == "blocked" and step.sleep == 0.0
    assert step.state == AdmissionState(0, True)
    # a healthy sample still admits at the deadline
    assert admission_step(AdmissionState(), hot(70), GUARD, 600.0).action == "admit"


def test_zero_max_wait_blocks_on_first_bad_sample() -> None:
    now = dataclasses.replace(GUARD, max_wait=0.0)
    assert admission_step(AdmissionState(), hot(81), now, 0.0).action == "blocked"
    obs = dataclasses.replace(OBSERVE, max_wait=0.0)
    assert admission_step(AdmissionState(), hot(106), obs, 0.0).action == "blocked"


def test_sleep_is_poll_or_what_is_left() -> None:
    p = dataclasses.replace(GUARD, poll=2.0, max_wait=10.0)
    assert admission_step(AdmissionState(), hot(90), p, 0.0).sleep == 2.0
    assert admission_step(AdmissionState(), hot(90), p, 8.0).sleep == 2.0
    assert admission_step(AdmissionState(), hot(90), p, 8.5).sleep == 1.5


def test_step_decision_carries_inputs() -> None:
    step = admission_step(AdmissionState(1, True), hot(70), GUARD, 12.3456)
    assert step.decision == {
        "policy": "device-health",
        "version": 1,
        "rule": "DH4",
        "mode": "guard",
        "elapsed": 12.346,
        "max_wait": 600.0,
        "healthy": 2,
        "required": 3,
        "cooling": True,
        "action": "wait",
        "reasons": [],
    }


# -- DH5 ------------------------------------------------------------------------------------


def _state(policy: HealthPolicy, readings: tuple[Reading, ...], **kw: bool) -> str:
    cooling = kw.get("cooling", False)
    ev: Evaluation = evaluate(policy, readings, cooling)
    return health_state(
        policy,
        ev,
        cooling=cooling,
        blocked=kw.get("blocked", False),
        telemetry=bool(readings),
    )


def test_status_states() -> None:
    assert _state(OFF, hot(200)) == "off"
    assert _state(OFF, ()) == "off"
    assert _state(GUARD, ()) == "unavailable"
    assert _state(GUARD, hot(106)) == "blocked"
    assert _state(OBSERVE, hot(106)) == "blocked"
    assert _state(GUARD, hot(50), blocked=True) == "blocked"
    assert _state(GUARD, hot(50), cooling=True) == "cooling"
    assert _state(GUARD, hot(81)) == "warm"
    assert _state(OBSERVE, hot(81)) == "warm"
    assert _state(GUARD, hot(80)) == "healthy"


def test_a_long_env_value_is_shown_cut_to_40_characters() -> None:
    text = "9" * 39 + "xyz"
    with pytest.raises(SettingError) as caught:
        resolve_health_policy({"HOSTLER_DEVICE_SAFETY_POLL_MS": text})
    assert f"HOSTLER_DEVICE_SAFETY_POLL_MS={text[:40]!r}:" in caught.value.message


def test_observe_and_bad_guard_steps_record_the_requirement() -> None:
    step = admission_step(AdmissionState(), hot(106), OBSERVE, 0.0)
    assert step.decision["required"] == 1
    step = admission_step(AdmissionState(2, True), hot(90), GUARD, 0.0)
    assert step.decision["required"] == 3  # what this sample would have needed
    assert step.decision["healthy"] == 0
    step = admission_step(AdmissionState(), hot(90), GUARD, 0.0)
    assert step.decision["required"] == 1
