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
    "FALLBACK_KV",
    "SIGILL",
    "AskSweep",
    "AttemptBegan",
    "EnsureBegan",
    "GiveUp",
    "Launched",
    "RecordCpuLimit",
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
    """A start launched its command with this offload plan (None: the spec's own had none).

    ``kv_type`` is the KV cache type it was launched with (None: the engine's default).
    """

    offload: OffloadPlan | None
    argv: tuple[str, ...]
    kv_type: str | None = None


@dataclass(frozen=True, slots=True)
class StartEnded:
    """A start ended before ready: the panic its output named, and whether it just timed out.

    ``signal`` is the signal that ended its process, when one did (4: SIGILL).
    """

    panic: str | None
    timed_out: bool
    signal: int | None = None


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
class RecordCpuLimit:
    """L22: record ``cpu.unsupported`` (what this build cannot run on this CPU) first.

    ``what`` is ``quantized-kv`` (then the start is tried again at f16 KV, once) or
    ``weights`` (then it is not: the model cannot run on this build here).
    """

    what: str
    kv_type: str


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


StartEffect = RecordDegrade | RecordCpuLimit | AskSweep | Sweep | Retry | GiveUp

#: The signal of an instruction the CPU does not have.
SIGILL = 4
#: L22: the KV type a build that cannot run a quantized cache here is tried again with.
FALLBACK_KV = "f16"


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
        self._pending: RecordDegrade | RecordCpuLimit | None = None
        #: L22: the KV type every later start uses instead of its price's (None: the price's).
        self.kv_type: str | None = None

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
                limit = self._cpu_limit()
                if limit is not None:
                    self._pending = limit
                    return [limit]
                degrade = self._next_plan()
                if degrade is not None:
                    self._pending = degrade
                    return [degrade]
                return self._sweep_or_give_up(message)
            case Recorded(ok):
                return self._recorded(ok)
            case SweepAnswered(wanted):
                if not wanted or self._launched is None:
                    return [GiveUp()]
                self._swept = True
                return [Sweep(self._launched.argv)]
            case Swept(stopped):
                return [Retry("resweep-retry")] if stopped > 0 else [GiveUp()]

    def _recorded(self, ok: bool) -> list[StartEffect]:
        """The pending record was taken (or not): its retry, or none (unrecorded, not taken)."""
        pending, self._pending = self._pending, None
        if not ok or pending is None:
            return [GiveUp()]
        if isinstance(pending, RecordCpuLimit):
            if pending.what != "quantized-kv":
                return [GiveUp()]
            self.kv_type = FALLBACK_KV
            return [Retry("cpu-retry")]
        self.offload = pending.plan
        return [Retry("oom-retry")]

    def _cpu_limit(self) -> RecordCpuLimit | None:
        """L22: a start SIGILL ended before ready: what this build cannot run here."""
        launched, ended = self._launched, self._ended
        if launched is None or ended is None or ended.signal != SIGILL:
            return None
        kv_type = launched.kv_type or FALLBACK_KV
        quantized = kv_type.lower() not in ("f16", "f32", "bf16")
        if quantized and self.kv_type is None:
            return RecordCpuLimit("quantized-kv", kv_type)
        return RecordCpuLimit("weights", kv_type)

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
