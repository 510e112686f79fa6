"""Supervision policy (pure): when an engine may start, and when a running one must stop.

The supervisor (a driver) observes — a start is wanted, a health probe answered or not, time
passed, the host is under memory pressure — and asks these functions what to do. Each answer
carries the policy's name and version and every input it used, and that is what the
supervisor records in the event (``decision``), so a post-mortem can re-derive the decision
and a what-if can change the policy. Nothing here reads a clock: ``now`` is an observation.

Rules (docs/rules.md): SP1 restart budget, SP2 crash backoff, SP3 health restarts, SP4 idle
stop, SP5 memory-pressure stop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "POLICY_NAME",
    "POLICY_VERSION",
    "HealthVerdict",
    "StartVerdict",
    "StopDecision",
    "SupervisionPolicy",
    "decide_health",
    "decide_idle",
    "decide_pressure",
    "decide_start",
]

POLICY_NAME = "supervision"
POLICY_VERSION = 1


@dataclass(frozen=True, slots=True)
class SupervisionPolicy:
    """The thresholds (seconds and counts); defaults are the reference behaviour's.

    Attributes:
        restart_budget: Starts allowed within ``restart_window`` (SP1).
        restart_window: The window the budget counts over.
        lockout: How long an engine that spent its budget stays fatal.
        health_failures: Consecutive failed probes that make a health restart (SP3).
        idle_timeout: Unused this long, a running engine stops (SP4); 0 disables.
        pressure_idle: Unused this long, an engine stops early under memory pressure (SP5).
    """

    restart_budget: int = 3
    restart_window: float = 60.0
    lockout: float = 60.0
    health_failures: int = 3
    idle_timeout: float = 300.0
    pressure_idle: float = 60.0

    def __post_init__(self) -> None:
        if self.restart_budget < 1:
            raise ValueError(f"restart_budget must be at least 1, not {self.restart_budget}")
        if self.health_failures < 1:
            raise ValueError(f"health_failures must be at least 1, not {self.health_failures}")
        for name in ("restart_window", "lockout", "idle_timeout", "pressure_idle"):
            value = getattr(self, name)
            if not value >= 0:  # also refuses NaN
                raise ValueError(f"{name} must be zero or more seconds, not {value}")

    def header(self, rule: str) -> dict[str, Any]:
        """The part of every decision that names the policy and rule."""
        return {"policy": POLICY_NAME, "version": POLICY_VERSION, "rule": rule}


@dataclass(frozen=True, slots=True)
class StartVerdict:
    """May the engine start now? If not, until when it is locked out, and why."""

    allowed: bool
    retry_at: float | None
    error: str
    decision: dict[str, Any]


@dataclass(frozen=True, slots=True)
class StopDecision:
    """Stop the engine, for ``reason``; ``decision`` is what gets recorded with the stop."""

    reason: str
    decision: dict[str, Any]


@dataclass(frozen=True, slots=True)
class HealthVerdict:
    """After one probe: the consecutive-failure count to carry, and a stop if it is due."""

    failures: int
    stop: StopDecision | None


def decide_start(
    policy: SupervisionPolicy, start_times: Sequence[float], now: float
) -> StartVerdict:
    """SP1: a start is allowed while fewer than ``restart_budget`` starts fall in the window.

    ``start_times`` are the engine's recorded start requests (from the log, so the budget
    survives a daemon restart). A start exactly ``restart_window`` seconds ago still counts.
    """
    window = policy.restart_window
    recent = [t for t in start_times if now - t <= window]
    decision = {
        **policy.header("SP1"),
        "now": now,
        "restart_budget": policy.restart_budget,
        "restart_window": window,
        "lockout": policy.lockout,
        "recent_starts": recent,
    }
    if len(recent) < policy.restart_budget:
        return StartVerdict(True, None, "", decision)
    error = f"started {len(recent)} times within {window:.0f} s"
    return StartVerdict(False, now + policy.lockout, error, decision)


def decide_health(
    policy: SupervisionPolicy, failures: int, healthy: bool, now: float
) -> HealthVerdict:
    """SP3: ``health_failures`` consecutive failed probes restart the engine; one pass resets."""
    if healthy:
        return HealthVerdict(0, None)
    failures += 1
    if failures < policy.health_failures:
        return HealthVerdict(failures, None)
    decision = {
        **policy.header("SP3"),
        "now": now,
        "consecutive_failures": failures,
        "health_failures": policy.health_failures,
    }
    return HealthVerdict(0, StopDecision("health-restart", decision))


def decide_idle(
    policy: SupervisionPolicy, *, now: float, last_used: float, busy: bool
) -> StopDecision | None:
    """SP4: stop an engine unused for ``idle_timeout`` seconds (never while busy; 0 = never).

    A busy engine is not stopped; the driver then counts it as used now (a whole new window).
    """
    idle = policy.idle_timeout
    unused_for = now - last_used
    if idle <= 0 or busy or unused_for < idle:
        return None
    decision = {
        **policy.header("SP4"),
        "now": now,
        "last_used": last_used,
        "unused_for": unused_for,
        "idle_timeout": idle,
    }
    return StopDecision("idle", decision)


def decide_pressure(
    policy: SupervisionPolicy,
    *,
    now: float,
    last_used: float,
    busy: bool,
    under_pressure: bool,
    pressure_detail: dict[str, Any] | None = None,
) -> StopDecision | None:
    """SP5: under memory pressure, an idle engine unused for ``pressure_idle`` s stops early."""
    unused_for = now - last_used
    if busy or not under_pressure or unused_for < policy.pressure_idle:
        return None
    decision = {
        **policy.header("SP5"),
        "now": now,
        "last_used": last_used,
        "unused_for": unused_for,
        "pressure_idle": policy.pressure_idle,
        "pressure": pressure_detail or {},
    }
    return StopDecision("memory-pressure", decision)
