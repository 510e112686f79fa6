"""Device health policy (pure): may GPU work start now, given the cards' temperatures?

A hot card throttles, and a card past its hard limit can shut the machine down; the gate holds
new GPU work until the card is cool enough. Three modes: ``off`` admits everything, ``observe``
(the default) admits unless a card is past the hard 105 °C limit, ``guard`` waits for
consecutive healthy samples (three once a card was too hot, with a lower resume temperature).
The driver (:mod:`hostler.runtime.health`) reads the environment and the cards, and asks these
functions; nothing here reads a clock, a device or the environment.

Rules (docs/rules.md): DH1 policy resolution, DH3 evaluation, DH4 admission, DH5 status.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from hostler.errors import SettingError, UsageError

__all__ = [
    "DEFAULTS",
    "ENV",
    "HARD_TEMP_C",
    "POLICY_NAME",
    "POLICY_VERSION",
    "AdmissionState",
    "AdmissionStep",
    "Evaluation",
    "HealthPolicy",
    "Reading",
    "admission_step",
    "evaluate",
    "health_state",
    "readings_from_gpus",
    "resolve_health_policy",
]

POLICY_NAME = "device-health"
POLICY_VERSION = 1

#: DH3: above this a card is hot enough to harm itself; every mode but ``off`` holds work.
HARD_TEMP_C = 105.0
#: DH1: the environment variables, by setting (they override the config, which overrides these).
ENV = {
    "mode": "HOSTLER_DEVICE_SAFETY_MODE",
    "telemetry_failure": "HOSTLER_DEVICE_SAFETY_TELEMETRY_FAILURE",
    "max_start_temp_c": "HOSTLER_DEVICE_SAFETY_MAX_START_TEMP_C",
    "resume_temp_c": "HOSTLER_DEVICE_SAFETY_RESUME_TEMP_C",
    "min_thermal_margin_c": "HOSTLER_DEVICE_SAFETY_MIN_THERMAL_MARGIN_C",
    "poll_ms": "HOSTLER_DEVICE_SAFETY_POLL_MS",
    "max_wait_ms": "HOSTLER_DEVICE_SAFETY_MAX_WAIT_MS",
    "healthy_samples": "HOSTLER_DEVICE_SAFETY_HEALTHY_SAMPLES",
}
#: DH1: the defaults, in the units of the settings (°C, milliseconds, samples).
DEFAULTS: Mapping[str, str | float] = {
    "mode": "observe",
    "telemetry_failure": "allow",
    "max_start_temp_c": 80.0,
    "resume_temp_c": 75.0,
    "min_thermal_margin_c": 8.0,
    "poll_ms": 5_000.0,
    "max_wait_ms": 600_000.0,
    "healthy_samples": 3.0,
}
_MODES = ("off", "observe", "guard")
_FAILURES = ("allow", "block")
_TEMP_RANGE = (0.0, 125.0)
_MARGIN_RANGE = (0.0, 100.0)
_POLL_MS = (500.0, 60_000.0)
_MAX_WAIT_MS = (0.0, 3_600_000.0)
_SAMPLES = (1, 20)

Mode = Literal["off", "observe", "guard"]
FailurePolicy = Literal["allow", "block"]


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """DH1: how the gate judges the cards (temperatures in °C, times in seconds)."""

    mode: Mode = "observe"
    telemetry_failure: FailurePolicy = "allow"
    max_start_temp_c: float = 80.0
    resume_temp_c: float = 75.0
    min_thermal_margin_c: float = 8.0
    poll: float = 5.0
    max_wait: float = 600.0
    healthy_samples: int = 3

    def as_dict(self) -> dict[str, Any]:
        """Every setting, for a decision record."""
        return asdict(self)


def resolve_health_policy(
    env: Mapping[str, str], config: Mapping[str, Any] | None = None
) -> HealthPolicy:
    """DH1: each setting from ``env``, else ``config``, else :data:`DEFAULTS`; then clamped.

    ``env`` holds the variables of :data:`ENV`; ``config`` uses ENV's keys. Clamps: poll to
    [500 ms, 60 s], max wait to [0, 1 h], healthy samples truncated to a whole number in
    [1, 20], the resume temperature to at most the max start temperature. A blank environment
    value counts as unset.

    Raises:
        SettingError: An environment value is malformed (names the variable and what it takes).
        UsageError: A config value is malformed (names the key).
    """
    config = config or {}
    unknown = sorted(set(config) - set(ENV))
    if unknown:
        raise UsageError(f"device health: unknown setting(s) {unknown}; known: {sorted(ENV)}")
    values: dict[str, Any] = {}
    for key, variable in ENV.items():
        text = env.get(variable)
        if text is not None and text.strip():
            values[key] = _parse(
                key, text.strip(), SettingError, f"{variable}={text.strip()[:40]!r}"
            )
        elif config.get(key) is not None:
            values[key] = _parse(
                key, config[key], UsageError, f"device health {key}={config[key]!r}"
            )
        else:
            values[key] = DEFAULTS[key]
    max_start = float(values["max_start_temp_c"])
    return HealthPolicy(
        mode=values["mode"],
        telemetry_failure=values["telemetry_failure"],
        max_start_temp_c=max_start,
        resume_temp_c=min(float(values["resume_temp_c"]), max_start),
        min_thermal_margin_c=float(values["min_thermal_margin_c"]),
        poll=_clamp(float(values["poll_ms"]), _POLL_MS) / 1000.0,
        max_wait=_clamp(float(values["max_wait_ms"]), _MAX_WAIT_MS) / 1000.0,
        healthy_samples=int(_clamp(math.trunc(float(values["healthy_samples"])), _SAMPLES)),
    )


def _clamp(value: float, bounds: tuple[float, float]) -> float:
    return min(max(value, bounds[0]), bounds[1])


def _parse(key: str, raw: Any, error: type[UsageError], where: str) -> str | float:
    """One setting's value, or ``error`` naming ``where`` and what the setting takes."""
    if key in ("mode", "telemetry_failure"):
        choices = _MODES if key == "mode" else _FAILURES
        word = raw.strip().lower() if isinstance(raw, str) else None
        if word is None or word not in choices:
            raise error(f"{where}: use one of {', '.join(choices)}")
        return word
    number = _number(raw)
    if key.endswith("_c"):
        low, high = _TEMP_RANGE if key != "min_thermal_margin_c" else _MARGIN_RANGE
        if not low <= number <= high:  # NaN compares false
            raise error(f"{where}: expected degrees Celsius from {low:g} to {high:g}")
        return number
    if not math.isfinite(number):
        unit = "samples" if key == "healthy_samples" else "milliseconds"
        raise error(f"{where}: expected a finite number of {unit}")
    return number


def _number(raw: Any) -> float:
    """``raw`` as a float, NaN when it is not a number (a bool is not one)."""
    if isinstance(raw, bool):
        return math.nan
    if isinstance(raw, int | float):
        return float(raw)
    if isinstance(raw, str):
        try:
            return float(raw.strip())
        except ValueError:
            return math.nan
    return math.nan


@dataclass(frozen=True, slots=True)
class Reading:
    """One card at one moment (None where the telemetry does not say).

    Attributes:
        device: The card's identity (UUID or index).
        temperature_c: Core temperature.
        margin_c: Degrees left before the card's own slowdown limit.
        thermal_slowdown: The card is throttling for heat.
        power_brake: The card is held back by a power brake.
        total_mib: Memory, total (MiB).
        used_mib: Memory in use (MiB).
    """

    device: str
    temperature_c: float | None = None
    margin_c: float | None = None
    thermal_slowdown: bool | None = None
    power_brake: bool | None = None
    total_mib: float | None = None
    used_mib: float | None = None


def readings_from_gpus(gpus: Iterable[Mapping[str, Any]]) -> tuple[Reading, ...]:
    """Readings from :class:`~hostler.events.device.DeviceSampled` GPU dicts (bytes → MiB)."""
    mib = 1024.0**2
    out = []
    for index, gpu in enumerate(gpus):
        temperature = gpu.get("temperature_c")
        total, used = gpu.get("total"), gpu.get("used")
        out.append(
            Reading(
                device=str(gpu.get("uuid") or index),
                temperature_c=None if temperature is None else float(temperature),
                thermal_slowdown=gpu.get("thermal_slowdown"),
                power_brake=gpu.get("power_brake"),
                total_mib=None if total is None else int(total) / mib,
                used_mib=None if used is None else int(used) / mib,
            )
        )
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Evaluation:
    """DH3's verdict on one sample.

    Attributes:
        admissible: No reason to hold work.
        hard_blocked: A card is past :data:`HARD_TEMP_C`.
        reasons: One line per problem found, card named.
        decision: The policy, its inputs and the verdict, for the record.
    """

    admissible: bool
    hard_blocked: bool
    reasons: tuple[str, ...]
    decision: dict[str, Any]


def evaluate(policy: HealthPolicy, readings: Sequence[Reading], cooling: bool) -> Evaluation:
    """DH3: judge one sample; while ``cooling`` the limit is the resume temperature.

    ``off`` admits; no readings admit iff the telemetry failure policy is ``allow``; otherwise
    every card past the limit, past 105 °C (hard), short of thermal margin, slowing down for
    heat or braked for power adds a reason, and the sample is admissible iff none did.
    """
    reasons: list[str] = []
    hard = False
    limit = policy.resume_temp_c if cooling else policy.max_start_temp_c
    if policy.mode == "off":
        pass
    elif not readings:
        if policy.telemetry_failure == "block":
            reasons.append("no device telemetry, and the telemetry failure policy is block")
    else:
        for r in readings:
            name = f"GPU {r.device}"
            if r.temperature_c is not None:
                if r.temperature_c > limit:
                    what = "resume" if cooling else "start"
                    reasons.append(f"{name} at {r.temperature_c:g} °C > {what} limit {limit:g} °C")
                if r.temperature_c > HARD_TEMP_C:
                    hard = True
                    reasons.append(
                        f"{name} at {r.temperature_c:g} °C > hard limit {HARD_TEMP_C:g} °C"
                    )
            if r.margin_c is not None and r.margin_c < policy.min_thermal_margin_c:
                reasons.append(
                    f"{name} thermal margin {r.margin_c:g} °C < {policy.min_thermal_margin_c:g} °C"
                )
            if r.thermal_slowdown:
                reasons.append(f"{name} is slowing down for heat")
            if r.power_brake:
                reasons.append(f"{name} is held by a power brake")
    decision: dict[str, Any] = {
        "policy": POLICY_NAME,
        "version": POLICY_VERSION,
        "rule": "DH3",
        "settings": policy.as_dict(),
        "cooling": cooling,
        "limit_c": limit,
        "readings": [asdict(r) for r in readings],
        "hard_blocked": hard,
        "reasons": list(reasons),
    }
    return Evaluation(not reasons, hard, tuple(reasons), decision)


@dataclass(frozen=True, slots=True)
class AdmissionState:
    """Where one admission stands: consecutive healthy samples, and whether a card cools."""

    healthy: int = 0
    cooling: bool = False


@dataclass(frozen=True, slots=True)
class AdmissionStep:
    """DH4's answer after one sample.

    Attributes:
        action: ``admit`` (start the work), ``wait`` (sample again after ``sleep`` seconds) or
            ``blocked`` (the wait is over: refuse the work).
        state: The admission's state after this sample.
        evaluation: DH3's verdict on the sample.
        sleep: Seconds to wait before the next sample (0 unless ``wait``).
        decision: The inputs and the verdict, for the record.
    """

    action: Literal["admit", "wait", "blocked"]
    state: AdmissionState
    evaluation: Evaluation
    sleep: float
    decision: dict[str, Any]


def admission_step(
    state: AdmissionState, readings: Sequence[Reading], policy: HealthPolicy, elapsed: float
) -> AdmissionStep:
    """DH4: one sample of an admission that has waited ``elapsed`` seconds so far.

    - ``off``: admit.
    - ``observe``: admit unless a card is past 105 °C; such a card sets cooling, and the work
      waits until every card is back at or under 105 °C.
    - ``guard``: count consecutive admissible samples and admit at the required count (the
      policy's healthy samples while cooling, else 1); an inadmissible sample resets the count
      and sets cooling.

    An admission clears cooling. A sample that does not admit once ``elapsed`` ≥ the max wait
    blocks; otherwise the next sample comes after min(poll, time left).
    """
    evaluation = evaluate(policy, readings, state.cooling)
    required = 1
    if policy.mode == "off":
        ok, nxt = True, AdmissionState()
    elif policy.mode == "observe":
        ok = not evaluation.hard_blocked
        nxt = AdmissionState(0, state.cooling or evaluation.hard_blocked)
    else:
        required = policy.healthy_samples if state.cooling else 1
        if evaluation.admissible:
            nxt = AdmissionState(state.healthy + 1, state.cooling)
            ok = nxt.healthy >= required
        else:
            ok, nxt = False, AdmissionState(0, True)
    action: Literal["admit", "wait", "blocked"]
    sleep = 0.0
    if ok:
        action, nxt = "admit", AdmissionState()
    elif elapsed >= policy.max_wait:
        action = "blocked"
    else:
        action, sleep = "wait", min(policy.poll, policy.max_wait - elapsed)
    decision: dict[str, Any] = {
        "policy": POLICY_NAME,
        "version": POLICY_VERSION,
        "rule": "DH4",
        "mode": policy.mode,
        "elapsed": round(elapsed, 3),
        "max_wait": policy.max_wait,
        "healthy": nxt.healthy,
        "required": required,
        "cooling": nxt.cooling,
        "action": action,
        "reasons": list(evaluation.reasons),
    }
    return AdmissionStep(action, nxt, evaluation, sleep, decision)


State = Literal["off", "unavailable", "healthy", "blocked", "cooling", "warm"]


def health_state(
    policy: HealthPolicy, evaluation: Evaluation, *, cooling: bool, blocked: bool, telemetry: bool
) -> State:
    """DH5: one word for the device's health.

    ``off`` (mode off; telemetry is still read), ``unavailable`` (no telemetry), ``blocked``
    (past 105 °C, or the last admission timed out, until an admission succeeds), ``cooling``
    (a card was too hot and has not recovered), ``warm`` (a reason to hold work) or
    ``healthy``.
    """
    if policy.mode == "off":
        return "off"
    if not telemetry:
        return "unavailable"
    if evaluation.hard_blocked or blocked:
        return "blocked"
    if cooling:
        return "cooling"
    return "healthy" if evaluation.admissible else "warm"
