"""The watch of one running engine, sans I/O: what to look at on each tick, and what follows.

The supervisor's watch loop used to hold this sequencing itself: when a health probe is due,
how many probes failed in a row, when the log is looked at, how long the engine has been
unused and when a busy engine's idle window is put off. :class:`EngineWatch` holds it now, as
a state machine fed observations with their time (:meth:`EngineWatch.handle`), returning the
effects the driver carries out; the driver feeds each effect's answer back the same way
(a probe's answer is :class:`HealthProbed`, the host's pressure is :class:`PressureRead`).

The decisions themselves are the pure rules of :mod:`hostler.policies.supervision`
(SP3 health strikes, SP4 idle, SP5 pressure); this module only sequences them. One tick::

    Ticked(RUNNING, alive) → ReadLines, [RotateLog], [ProbeHealth | idle effects]
    HealthProbed(ok)       → StopForHealth   (the strikes ran out: stop, then start again)
                           | idle effects    (otherwise the tick goes on to idleness)
    idle effects           = ReadPressure    (the host is asked before an idle engine stops)
                           | StopIdle        (SP4's timeout passed, nothing in flight)
                           | nothing         (a busy engine's window is put off: SP4)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hostler.policies.supervision import (
    StopDecision,
    SupervisionPolicy,
    decide_health,
    decide_idle,
    decide_pressure,
)

__all__ = [
    "BecameReady",
    "EngineWatch",
    "FinishStop",
    "HealthProbed",
    "Now",
    "PressureRead",
    "ProbeHealth",
    "ReadLines",
    "ReadPressure",
    "RecordCrash",
    "RequestBegan",
    "RequestEnded",
    "RotateLog",
    "StartAsked",
    "StopForHealth",
    "StopIdle",
    "Ticked",
    "WatchBegan",
    "WatchEffect",
    "WatchObservation",
]


@dataclass(frozen=True, slots=True)
class Now:
    """A moment on the driver's clock: wall time for decisions, monotonic time for intervals."""

    wall: float
    monotonic: float


# -- observations ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WatchBegan:
    """The watch loop started: the first health probe is one interval away."""


@dataclass(frozen=True, slots=True)
class Ticked:
    """A watch tick: the engine's state as the driver sees it.

    Args:
        state: The lifecycle state's value (``running``, ``stopping``, …).
        alive: Whether its process still runs.
    """

    state: str
    alive: bool


@dataclass(frozen=True, slots=True)
class HealthProbed:
    """The answer to :class:`ProbeHealth`: whether the engine answered healthy."""

    healthy: bool


@dataclass(frozen=True, slots=True)
class PressureRead:
    """The answer to :class:`ReadPressure`: whether the host is under memory pressure."""

    under: bool


@dataclass(frozen=True, slots=True)
class StartAsked:
    """A start (or a check that it runs) was asked for: it counts as use."""


@dataclass(frozen=True, slots=True)
class BecameReady:
    """The engine became ready: its health strikes start again from none."""


@dataclass(frozen=True, slots=True)
class RequestBegan:
    """A request began using the engine."""


@dataclass(frozen=True, slots=True)
class RequestEnded:
    """A request stopped using the engine."""


WatchObservation = (
    WatchBegan
    | Ticked
    | HealthProbed
    | PressureRead
    | StartAsked
    | BecameReady
    | RequestBegan
    | RequestEnded
)

# -- effects -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FinishStop:
    """An earlier stop left the group alive: stop it again (the escalation goes on)."""


@dataclass(frozen=True, slots=True)
class RecordCrash:
    """The running engine's process is gone unasked: read its last lines, record the crash."""


@dataclass(frozen=True, slots=True)
class ReadLines:
    """Read what the engine logged since the last tick (progress, panics, the ready line)."""


@dataclass(frozen=True, slots=True)
class RotateLog:
    """Look at the engine's log file and cap it."""


@dataclass(frozen=True, slots=True)
class ProbeHealth:
    """Probe the engine's readiness path; answer with :class:`HealthProbed`."""


@dataclass(frozen=True, slots=True)
class ReadPressure:
    """Ask whether the host is under memory pressure; answer with :class:`PressureRead`."""


@dataclass(frozen=True, slots=True)
class StopIdle:
    """Stop the engine for idleness or pressure, if it still runs unused when the stop begins."""

    reason: str
    decision: dict[str, Any] = field(hash=False)


@dataclass(frozen=True, slots=True)
class StopForHealth:
    """Stop the engine for failed health probes (SP3), then start it again."""

    reason: str
    decision: dict[str, Any] = field(hash=False)


WatchEffect = (
    FinishStop | RecordCrash | ReadLines | RotateLog | ProbeHealth | ReadPressure | StopIdle
) | StopForHealth


class EngineWatch:
    """The watch's state and sequencing for one engine (pure: no I/O, no clock of its own).

    Args:
        rules: The supervision thresholds (restart budget, strikes, idle and pressure).
        health_interval: Seconds between health probes.
        log_check_interval: Seconds between looks at the log file's size.
        pressure: Whether the host's pressure can be read (a pressure source was given).
        now: When the watch is made (the engine counts as used then).
    """

    def __init__(
        self,
        rules: SupervisionPolicy,
        *,
        health_interval: float,
        log_check_interval: float,
        pressure: bool,
        now: Now,
    ) -> None:
        self.rules = rules
        self.health_interval = health_interval
        self.log_check_interval = log_check_interval
        self.pressure = pressure
        #: When the engine was last used (wall time): a request's start or end, or a start.
        self.last_used = now.wall
        #: How many requests use it now.
        self.in_flight = 0
        #: Health probes failed in a row (SP3).
        self.health_failures = 0
        self._next_health = 0.0
        self._next_log_check = 0.0

    @property
    def busy(self) -> bool:
        """Whether a request uses the engine now."""
        return self.in_flight > 0

    def handle(self, observation: WatchObservation, now: Now) -> list[WatchEffect]:  # noqa: PLR0911
        """Take ``observation`` made at ``now``; the effects the driver carries out, in order."""
        match observation:
            case WatchBegan():
                self._next_health = now.monotonic + self.health_interval
                return []
            case Ticked(state, alive):
                return self._tick(state, alive, now)
            case HealthProbed(healthy):
                verdict = decide_health(self.rules, self.health_failures, healthy, now.wall)
                self.health_failures = verdict.failures
                if verdict.stop is not None:
                    return [StopForHealth(verdict.stop.reason, verdict.stop.decision)]
                return self._idle(now)
            case PressureRead(under):
                stop = decide_pressure(
                    self.rules,
                    now=now.wall,
                    last_used=self.last_used,
                    busy=self.busy,
                    under_pressure=under,
                )
                return [_stop_idle(stop)] if stop is not None else self._idle_timeout(now)
            case StartAsked():
                self.last_used = now.wall
                return []
            case BecameReady():
                self.health_failures = 0
                return []
            case RequestBegan():
                self.in_flight += 1
                self.last_used = now.wall
                return []
            case RequestEnded():
                self.in_flight = max(self.in_flight - 1, 0)
                self.last_used = now.wall
                return []

    def _tick(self, state: str, alive: bool, now: Now) -> list[WatchEffect]:
        if state == "stopping":
            return [FinishStop()]
        if state != "running":
            return []
        if not alive:
            return [RecordCrash()]
        effects: list[WatchEffect] = [ReadLines()]
        if now.monotonic >= self._next_log_check:
            self._next_log_check = now.monotonic + self.log_check_interval
            effects.append(RotateLog())
        if now.monotonic >= self._next_health:
            self._next_health = now.monotonic + self.health_interval
            return [*effects, ProbeHealth()]  # idleness is looked at once it answered
        return effects + self._idle(now)

    def _idle(self, now: Now) -> list[WatchEffect]:
        unused_for = now.wall - self.last_used
        if self.pressure and not self.busy and unused_for >= self.rules.pressure_idle:
            return [ReadPressure()]  # SP5: the host's pressure may stop it sooner
        return self._idle_timeout(now)

    def _idle_timeout(self, now: Now) -> list[WatchEffect]:
        stop = decide_idle(self.rules, now=now.wall, last_used=self.last_used, busy=self.busy)
        if stop is not None:
            return [_stop_idle(stop)]
        if self.busy and 0 < self.rules.idle_timeout <= now.wall - self.last_used:
            self.last_used = now.wall  # SP4: busy through the window: put off a whole window
        return []


def _stop_idle(stop: StopDecision) -> StopIdle:
    return StopIdle(stop.reason, stop.decision)
