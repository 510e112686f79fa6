"""The engine lifecycle: one running (or not) inference engine process per engine key.

::

    stopped ──start──▶ starting ──ready──▶ running
       ▲                │  ▲ spawned          │
       │   exited       │  └─(internal)       │ stop(reason)
       └──── stopping ◀─┴─────────────────────┘
    starting/running ──crashed──▶ backoff ──start──▶ starting
    starting/running/backoff ──failed──▶ fatal ──reset──▶ stopped
    starting/running/stopping ──begin_adoption──▶ adopting ──adopted──▶ running
                                                          └──lost──▶ stopped
    stopping ──stop_failed──▶ stopping   (the group outlived KILL: still ours, still held)

``adopting`` is where replay leaves an engine the log believes alive after a daemon restart,
until reconcile decides ``adopted`` (same process, still healthy) or ``lost``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

from hostler.events.base import Event, event_type, upcaster
from hostler.machines.base import LifecycleModel, LifecycleSpec, Step, TransitionEvent

__all__ = [
    "MADE_ROOM_RULE",
    "Engine",
    "EngineAdopted",
    "EngineAdoptionStarted",
    "EngineCrashed",
    "EngineFailed",
    "EngineLost",
    "EngineReady",
    "EngineReset",
    "EngineSpawned",
    "EngineStartRequested",
    "EngineState",
    "EngineStopFailed",
    "EngineStopRequested",
    "EngineStopped",
    "StopReason",
    "made_room",
]


class EngineState(StrEnum):
    """Where an engine is in its life."""

    STOPPED = "stopped"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    BACKOFF = "backoff"
    FATAL = "fatal"
    ADOPTING = "adopting"


class StopReason(StrEnum):
    """Why an engine was (or is being) stopped."""

    IDLE = "idle"
    MEMORY_PRESSURE = "memory-pressure"
    EVICTED = "evicted"
    HEALTH_RESTART = "health-restart"
    USER = "user"
    SHUTDOWN = "shutdown"
    CRASHED = "crashed"
    LOST = "lost"
    UNCONFIGURED = "unconfigured"
    START_CANCELLED = "start-cancelled"
    START_FAILED = "start-failed"


#: How many start times an engine keeps (the restart budget's window is rebuilt from them).
START_HISTORY = 32
#: SP1: stops that end a residency by choice (their next start is no restart).
CHOSEN_STOPS = frozenset(
    {
        StopReason.IDLE,
        StopReason.MEMORY_PRESSURE,
        StopReason.EVICTED,
        StopReason.USER,
        StopReason.SHUTDOWN,
        StopReason.UNCONFIGURED,
        StopReason.START_CANCELLED,
    }
)


@event_type("engine.start_requested")
@dataclass(frozen=True, slots=True)
class EngineStartRequested(TransitionEvent):
    """Something asked for the engine: ``cause`` says what (request, config, restart...)."""

    cause: str


@event_type("engine.spawned", schema_version=3)
@dataclass(frozen=True, slots=True)
class EngineSpawned(TransitionEvent):
    """The process exists; its identity, recorded so a later daemon can adopt or reap it.

    ``since_boot`` (v2) is its start in the kernel's ticks since boot: a later daemon tells the
    process by it, since ``create_time`` moves when the system clock is set. None where the
    kernel does not say.

    ``launched`` (v3) is what it was launched with (:func:`hostler.engines.launched.spec_record`:
    the model, window, slots, KV type, work directory...), so that a daemon that adopts it
    knows its spec (CC13: its sessions' cache). None when not recorded.
    """

    pid: int
    create_time: float
    boot_id: str
    launch_token: str
    argv_fingerprint: str
    port: int
    since_boot: float | None = None
    launched: dict[str, Any] | None = None


@upcaster("engine.spawned", from_version=1)
def _spawned_v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    payload.setdefault("since_boot", None)
    return payload


@upcaster("engine.spawned", from_version=2)
def _spawned_v2_to_v3(payload: dict[str, Any]) -> dict[str, Any]:
    payload.setdefault("launched", None)
    return payload


@event_type("engine.ready")
@dataclass(frozen=True, slots=True)
class EngineReady(TransitionEvent):
    """The readiness probe passed."""


@event_type("engine.stop_requested", schema_version=2)
@dataclass(frozen=True, slots=True)
class EngineStopRequested(TransitionEvent):
    """A stop was decided, and why (a :class:`StopReason` value).

    ``decision`` (schema v2) holds the policy's name and version and every input it decided
    from (thresholds, last use, failure counts), so a post-mortem can re-derive the stop.
    """

    reason: str
    decision: dict[str, Any] | None = None

    @property
    def made_room(self) -> bool:
        """Whether this stop evicted the engine to make room for another (see :func:`made_room`)."""
        return made_room(self.reason, self.decision)


#: The rule whose evictions make room for another engine (docs/rules.md PP4).
MADE_ROOM_RULE = "PP4"


def made_room(reason: object, decision: object) -> bool:
    """Whether a stop, given its ``reason`` and ``decision``, was an eviction for room (PP4).

    The one answer to "is this stop an eviction to make room for another engine": reason
    ``evicted`` and a decision of rule PP4. Other stops recorded with reason ``evicted`` were
    asked for, not chosen to make room: a lease's slot swap (GA1), a person's unload (PP6),
    retiring the pool (PP9), reconciling replica counts (PP10). Takes the raw fields so that a
    typed :class:`EngineStopRequested` and a log row's payload are judged alike; a decision
    that is not a mapping (absent, damaged) is not one.
    """
    return (
        reason == StopReason.EVICTED
        and isinstance(decision, Mapping)
        and decision.get("rule") == MADE_ROOM_RULE
    )


@upcaster("engine.stop_requested", from_version=1)
def _stop_v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    payload.setdefault("decision", None)
    return payload


@event_type("engine.stop_failed")
@dataclass(frozen=True, slots=True)
class EngineStopFailed(TransitionEvent):
    """The process group was still alive after TERM, TERM and KILL: it stays ours and held."""

    pid: int
    detail: str


@event_type("engine.stopped", schema_version=2)
@dataclass(frozen=True, slots=True)
class EngineStopped(TransitionEvent):
    """The process group is gone after a requested stop.

    ``detail`` (schema v2) says why it counted as gone without being signalled: its pid had
    become another process's, so hostler let it be (SG4); empty after an ordinary stop.
    """

    exit_code: int | None
    signal: int | None
    detail: str = ""


@upcaster("engine.stopped", from_version=1)
def _stopped_v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    payload.setdefault("detail", "")
    return payload


@event_type("engine.crashed", schema_version=2)
@dataclass(frozen=True, slots=True)
class EngineCrashed(TransitionEvent):
    """The process died unasked; the engine waits in backoff until ``retry_at``.

    The crash snapshot: how it ended (exit code or signal), the classified fatal line if the
    output had one, how long it ran, whether it ever became ready, and the end of its output.
    Schema v2 added the snapshot fields (v1 events read with them empty).
    """

    exit_code: int | None
    signal: int | None
    reached_ready: bool
    retry_at: float
    panic_kind: str | None = None
    panic_line: str | None = None
    uptime: float | None = None
    output_tail: str = ""


@upcaster("engine.crashed", from_version=1)
def _crashed_v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    payload.setdefault("panic_kind", None)
    payload.setdefault("panic_line", None)
    payload.setdefault("uptime", None)
    payload.setdefault("output_tail", "")
    return payload


@event_type("engine.failed", schema_version=2)
@dataclass(frozen=True, slots=True)
class EngineFailed(TransitionEvent):
    """The engine cannot be run (restart budget spent, bad binary, bad model, plugin bug).

    ``decision`` (schema v2) holds the policy inputs when a policy decided it (the restart
    budget: its window, limit and the start times it counted).
    """

    error: str
    retry_at: float | None
    decision: dict[str, Any] | None = None


@upcaster("engine.failed", from_version=1)
def _failed_v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    payload.setdefault("decision", None)
    return payload


@event_type("engine.reset")
@dataclass(frozen=True, slots=True)
class EngineReset(TransitionEvent):
    """A fatal engine was cleared (lock-out expired, or a person asked)."""

    cause: str


@event_type("engine.adoption_started")
@dataclass(frozen=True, slots=True)
class EngineAdoptionStarted(TransitionEvent):
    """A new daemon found the engine alive in the log and will check the process."""

    daemon_pid: int


@event_type("engine.adopted")
@dataclass(frozen=True, slots=True)
class EngineAdopted(TransitionEvent):
    """The recorded process still matches and answers: it is ours again, cache warm."""

    pid: int


@event_type("engine.lost")
@dataclass(frozen=True, slots=True)
class EngineLost(TransitionEvent):
    """The recorded process is gone or is not ours any more."""

    cause: str


S = EngineState
SPEC = LifecycleSpec(
    "engine",
    EngineState,
    EngineState.STOPPED,
    [
        Step("start", (S.STOPPED, S.BACKOFF), S.STARTING, EngineStartRequested),
        Step("spawned", (S.STARTING,), None, EngineSpawned),
        Step("ready", (S.STARTING,), S.RUNNING, EngineReady),
        Step("stop", (S.STARTING, S.RUNNING), S.STOPPING, EngineStopRequested),
        Step("stop", (S.BACKOFF,), S.STOPPED, EngineStopRequested),
        Step("exited", (S.STOPPING,), S.STOPPED, EngineStopped),
        Step("stop_failed", (S.STOPPING,), None, EngineStopFailed),
        Step("crashed", (S.STARTING, S.RUNNING), S.BACKOFF, EngineCrashed),
        Step("failed", (S.STARTING, S.RUNNING, S.BACKOFF), S.FATAL, EngineFailed),
        Step("reset", (S.FATAL,), S.STOPPED, EngineReset),
        Step(
            "begin_adoption",
            (S.STARTING, S.RUNNING, S.STOPPING),
            S.ADOPTING,
            EngineAdoptionStarted,
        ),
        Step("adopted", (S.ADOPTING,), S.RUNNING, EngineAdopted),
        Step("lost", (S.ADOPTING,), S.STOPPED, EngineLost),
    ],
)


class Engine(LifecycleModel):
    """One engine key's lifecycle, with the facts its events established.

    Attributes:
        pid: The live (or last) process id; None before the first spawn.
        identity: The spawn record (create time, boot id, token, argv fingerprint, port).
        stop_reason: Why the last stop happened (a :class:`StopReason` value).
        starts: How many times the engine was asked to start.
        crashes: How many unasked exits it has had.
        retry_at: When a backoff or fatal engine may start again.
        last_error: The last fatal error text.
        ready_at: When it last became ready.
        start_times: When it was last asked to start (at most ``START_HISTORY``, oldest
            first): the restart budget counts them, so it survives a daemon restart.
    """

    SPEC = SPEC
    STREAM_PREFIX = "engine/"

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.pid: int | None = None
        self.identity: dict[str, Any] | None = None
        self.stop_reason: str | None = None
        self.starts = 0
        self.crashes = 0
        self.retry_at: float | None = None
        self.last_error: str | None = None
        self.ready_at: float | None = None
        self.exit_code: int | None = None
        self.signal: int | None = None
        self.start_times: list[float] = []

    def _on_start(self, e: EngineStartRequested) -> None:
        self.starts += 1
        self.start_times = [*self.start_times[-(START_HISTORY - 1) :], e.at]
        self.retry_at = None
        self.stop_reason = None

    def _on_spawned(self, e: EngineSpawned) -> None:
        self.pid = e.pid
        self.identity = {
            "create_time": e.create_time,
            "boot_id": e.boot_id,
            "launch_token": e.launch_token,
            "argv_fingerprint": e.argv_fingerprint,
            "port": e.port,
            "since_boot": e.since_boot,
            "launched": e.launched,
        }

    def _on_ready(self, e: EngineReady) -> None:
        self.ready_at = e.at

    def _on_stop(self, e: EngineStopRequested) -> None:
        self.stop_reason = e.reason
        if e.reason in CHOSEN_STOPS:
            # SP1: after a stop hostler or a person chose, the next start is a new residency,
            # not a restart: swapping models, idling out, a shutdown (a start it cancelled
            # included) must never lock one out (crashes and failures still count)
            self.start_times = []
        if e.to_state == S.STOPPED:
            self.retry_at = None

    def _on_stopped(self, e: EngineStopped) -> None:
        self.exit_code, self.signal = e.exit_code, e.signal
        self.pid = None

    def _on_crashed(self, e: EngineCrashed) -> None:
        self.crashes += 1
        self.exit_code, self.signal = e.exit_code, e.signal
        self.stop_reason = StopReason.CRASHED.value
        self.retry_at = e.retry_at
        self.pid = None

    def _on_failed(self, e: EngineFailed) -> None:
        self.last_error = e.error
        self.retry_at = e.retry_at
        self.pid = None

    def _on_reset(self, e: EngineReset) -> None:
        self.retry_at = None

    def _on_stop_failed(self, e: EngineStopFailed) -> None:
        self.last_error = e.detail

    def _on_adopted(self, e: EngineAdopted) -> None:
        self.pid = e.pid

    def _on_lost(self, e: EngineLost) -> None:
        self.stop_reason = StopReason.LOST.value
        self.pid = None

    _FOLDS: ClassVar[Mapping[type[Event], Callable[[Any, Any], None]]] = {
        EngineStartRequested: _on_start,
        EngineSpawned: _on_spawned,
        EngineReady: _on_ready,
        EngineStopRequested: _on_stop,
        EngineStopped: _on_stopped,
        EngineCrashed: _on_crashed,
        EngineFailed: _on_failed,
        EngineReset: _on_reset,
        EngineStopFailed: _on_stop_failed,
        EngineAdopted: _on_adopted,
        EngineLost: _on_lost,
    }
