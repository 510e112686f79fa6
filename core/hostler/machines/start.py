"""What follows a start that failed, sans I/O: the OOM ladder (L13) and one sweep (RD9).

An engine's start can fail in ways that are worth one more try: it died of GPU out-of-memory
(a smaller offload plan may fit: L13's ladder), or it exited before ready because a stale
engine of this data directory still holds its port, lock or GPU (a sweep of strays may free
it: RD9). The supervisor used to hold that sequencing itself (``_attempt`` returning None to
mean "try again", with the sweep and ladder state in its own attributes). :class:`StartTries`
holds it now: the driver reports what each start launched and how it ended, and on a failure
asks :meth:`StartTries.handle` what to do; each answer it feeds back the same way::

    StartFailed ── L13 has a next plan ──→ RecordDegrade ─ Recorded(ok) ─→ Retry("oom-retry")
        │                                                 Recorded(not) ─→ GiveUp
        └─ RD9 may apply ──→ AskSweep ─ SweepAnswered(yes) ─→ Sweep ─ Swept(n>0) → Retry
                                       SweepAnswered(no)  ─→ GiveUp  Swept(0)   → GiveUp
        otherwise ─→ GiveUp

One sweep per ``ensure_running`` (:class:`EnsureBegan`); what a start launched and how it
ended count for its own failure only (:class:`AttemptBegan`); the ladder's plan outlives them
all (:attr:`StartTries.offload`: kept for every later start of the engine).
"""

from __future__ import annotations

from dataclasses import dataclass

from hostler.capacity.offload import OffloadPlan, next_oom_plan

__all__ = [
    "AskSweep",
    "AttemptBegan",
    "EnsureBegan",
    "GiveUp",
    "Launched",
    "RecordDegrade",
    "Recorded",
    "Retry",
    "StartEffect",
    "StartEnded",
    "StartFailed",
    "StartObservation",
    "StartTries",
    "Sweep",
    "SweepAnswered",
    "Swept",
]

# -- observations ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EnsureBegan:
    """An ``ensure_running`` began: its one sweep is still to be had.

    ``can_sweep``: whether the engines this daemon owns are known now (without that, no stray
    is ever swept).
    """

    can_sweep: bool


@dataclass(frozen=True, slots=True)
class AttemptBegan:
    """A start began: what earlier starts launched and how they ended no longer counts."""


@dataclass(frozen=True, slots=True)
class Launched:
    """A start launched its command with this offload plan (None: the spec's own had none)."""

    offload: OffloadPlan | None
    argv: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class StartEnded:
    """A start ended before ready: the panic its output named, and whether it just timed out."""

    panic: str | None
    timed_out: bool


@dataclass(frozen=True, slots=True)
class StartFailed:
    """A start failed: whether with the engine's own start error, and its message."""

    start_error: bool
    message: str


@dataclass(frozen=True, slots=True)
class Recorded:
    """The answer to :class:`RecordDegrade`: whether the log took it."""

    ok: bool


@dataclass(frozen=True, slots=True)
class SweepAnswered:
    """The answer to :class:`AskSweep`: whether the adapter says a stale engine may be why."""

    wanted: bool


@dataclass(frozen=True, slots=True)
class Swept:
    """The answer to :class:`Sweep`: how many strays it stopped."""

    stopped: int


StartObservation = (
    EnsureBegan | AttemptBegan | Launched | StartEnded | StartFailed | Recorded | SweepAnswered
) | Swept

# -- effects -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecordDegrade:
    """Record ``offload.degraded`` (L13) before the next plan is tried: unrecorded, not taken."""

    panic: str
    launched: OffloadPlan
    plan: OffloadPlan


@dataclass(frozen=True, slots=True)
class AskSweep:
    """Ask the adapter whether this failure may be a stale engine's (``on_exited_before_ready``)."""

    message: str


@dataclass(frozen=True, slots=True)
class Sweep:
    """Stop this data directory's unowned strays named by these anchors (binary, model)."""

    argv: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Retry:
    """Start again at once, for this cause (``oom-retry``, ``resweep-retry``)."""

    cause: str


@dataclass(frozen=True, slots=True)
class GiveUp:
    """No further try: the failure stands."""


StartEffect = RecordDegrade | AskSweep | Sweep | Retry | GiveUp


class StartTries:
    """The tries of an engine's starts (pure).

    Args:
        offload: A plan every start uses instead of its spec's own (None: the spec's).
        pinned: The operator pinned every offload setting: no ladder.
    """

    def __init__(self, *, offload: OffloadPlan | None, pinned: bool) -> None:
        #: The plan the ladder chose, kept for every later start (None: the spec's own).
        self.offload = offload
        self.pinned = pinned
        self._can_sweep = False
        self._swept = False
        self._launched: Launched | None = None
        self._ended: StartEnded | None = None
        self._pending: RecordDegrade | None = None

    def handle(self, observation: StartObservation) -> list[StartEffect]:  # noqa: PLR0911
        """Take ``observation``; what the driver does next (nothing, for reports of a start)."""
        match observation:
            case EnsureBegan(can_sweep):
                self._swept, self._can_sweep = False, can_sweep
                return []
            case AttemptBegan():
                self._launched = self._ended = None
                return []
            case Launched():
                self._launched, self._ended = observation, None
                return []
            case StartEnded():
                self._ended = observation
                return []
            case StartFailed(start_error, message):
                if not start_error:
                    return [GiveUp()]
                degrade = self._next_plan()
                if degrade is not None:
                    self._pending = degrade
                    return [degrade]
                return self._sweep_or_give_up(message)
            case Recorded(ok):
                pending, self._pending = self._pending, None
                if not ok or pending is None:
                    return [GiveUp()]
                self.offload = pending.plan
                return [Retry("oom-retry")]
            case SweepAnswered(wanted):
                if not wanted or self._launched is None:
                    return [GiveUp()]
                self._swept = True
                return [Sweep(self._launched.argv)]
            case Swept(stopped):
                return [Retry("resweep-retry")] if stopped > 0 else [GiveUp()]

    def _next_plan(self) -> RecordDegrade | None:
        launched, ended = self._launched, self._ended
        if launched is None or launched.offload is None or ended is None or ended.panic is None:
            return None
        plan = next_oom_plan(launched.offload, ended.panic, pinned=self.pinned)
        return None if plan is None else RecordDegrade(ended.panic, launched.offload, plan)

    def _sweep_or_give_up(self, message: str) -> list[StartEffect]:
        launched, ended = self._launched, self._ended
        if self._swept or not self._can_sweep or launched is None or not launched.argv:
            return [GiveUp()]
        if ended is None or ended.timed_out:
            return [GiveUp()]  # RD9: only a start that exited or panicked before ready
        return [AskSweep(message)]
