"""The escalation of a stop (SG2, SG4), sans I/O: TERM, TERM, KILL, each after a re-check.

A stop TERMs the engine's process group and waits ``grace``; TERMs it again (llama-server
hangs on the first one while a request is in flight and ends at the second) and waits
``second_grace``; then KILLs it and waits ``kill_wait``. Immediately before every signal the
group is re-checked: a group that is not the engine's any more is never signalled and counts
as gone, with why (SG4). A group that outlives KILL is re-checked once more: still ours, it is
*not* gone, and its owner keeps what it holds for it (SG2). :class:`StopEscalation` holds that
sequence; the real runner (:func:`hostler.engines.process.terminate_group`) and the in-memory
fake (:class:`hostler.testing.FakeProcess`) both carry it out, so both stop the same way::

    SignalGroup(kill?) ─→ Signalled(not sent, why)        → StopEnded(gone, why)
                         Signalled(sent)                 → LookAtGroup
    LookAtGroup     ──→ GroupLooked(gone)               → StopEnded(gone)
                         GroupLooked(alive), before due  → PauseStop(1 ms doubling to 20 ms, ≤ due)
                         GroupLooked(alive), past due    → SignalGroup(next) | CheckGroup
    PauseStop       ──→ StopPaused                      → LookAtGroup
    CheckGroup      ──→ GroupChecked(not ours, why)     → StopEnded(gone, why)
                         GroupChecked(ours)              → StopEnded(not gone, "still alive")
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CheckGroup",
    "GroupChecked",
    "GroupLooked",
    "LookAtGroup",
    "PauseStop",
    "SignalGroup",
    "Signalled",
    "StopEffect",
    "StopEnded",
    "StopEscalation",
    "StopObservation",
    "StopPaused",
    "StopTimings",
]

#: The first pause between two looks (seconds): an engine that exits at once is seen at once.
FIRST_PAUSE = 0.001
#: The longest pause between two looks (seconds).
LONGEST_PAUSE = 0.02


@dataclass(frozen=True, slots=True)
class StopTimings:
    """How long each signal is given (seconds): TERM, the second TERM, KILL."""

    grace: float = 2.0
    second_grace: float = 1.0
    kill_wait: float = 5.0


# -- observations ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Signalled:
    """The answer to :class:`SignalGroup`: whether the signal was sent, and why not (SG4)."""

    sent: bool
    why: str = ""


@dataclass(frozen=True, slots=True)
class GroupLooked:
    """The answer to :class:`LookAtGroup`: whether the group is gone."""

    gone: bool


@dataclass(frozen=True, slots=True)
class StopPaused:
    """The answer to :class:`PauseStop`: the pause is over."""


@dataclass(frozen=True, slots=True)
class GroupChecked:
    """The answer to :class:`CheckGroup`: whether the group is still the engine's, and why not."""

    ours: bool
    why: str = ""


StopObservation = Signalled | GroupLooked | StopPaused | GroupChecked

# -- effects -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SignalGroup:
    """Re-check the group, then signal it only if it is still the engine's (SG4).

    ``kill``: SIGKILL; else SIGTERM (the driver maps them: the core names no OS signal).
    """

    kill: bool


@dataclass(frozen=True, slots=True)
class LookAtGroup:
    """Look whether the group is gone (reaping our own child first)."""


@dataclass(frozen=True, slots=True)
class PauseStop:
    """Wait ``seconds`` before the next look."""

    seconds: float


@dataclass(frozen=True, slots=True)
class CheckGroup:
    """Check whether the group that outlived KILL is still the engine's (SG4)."""


@dataclass(frozen=True, slots=True)
class StopEnded:
    """The stop is over: whether the group is gone, and what the caller should know."""

    gone: bool
    detail: str = ""


StopEffect = SignalGroup | LookAtGroup | PauseStop | CheckGroup | StopEnded


class StopEscalation:
    """One stop of one process group, from its first TERM to its end.

    Args:
        group: The process group id (named when it outlives KILL).
        timings: How long each signal is given.
    """

    def __init__(self, group: int, timings: StopTimings) -> None:
        self._group = group
        self._steps = (
            (False, timings.grace),
            (False, timings.second_grace),
            (True, timings.kill_wait),
        )
        self._step = 0
        self._due = 0.0
        self._pause = FIRST_PAUSE
        self._ended = False

    @property
    def ended(self) -> bool:
        """Whether the stop has given its :class:`StopEnded`."""
        return self._ended

    def start(self) -> list[StopEffect]:
        """The first effect: TERM the group."""
        return [SignalGroup(self._steps[0][0])]

    def handle(self, observation: StopObservation, now: float) -> list[StopEffect]:
        """What follows ``observation``, seen at monotonic time ``now``."""
        if self._ended:
            return []
        match observation:
            case Signalled(sent, why):
                return self._signalled(sent, why, now)
            case GroupLooked(gone):
                return self._end(gone=True) if gone else self._still_there(now)
            case StopPaused():
                return [LookAtGroup()]
            case GroupChecked(ours, why):
                if not ours:
                    return self._end(gone=True, detail=why)
                detail = f"process group {self._group} is still alive after KILL"
                return self._end(gone=False, detail=detail)

    def _signalled(self, sent: bool, why: str, now: float) -> list[StopEffect]:
        if not sent:  # not the engine's any more: never signalled, and gone for its owner
            return self._end(gone=True, detail=why)
        self._due = now + self._steps[self._step][1]
        self._pause = FIRST_PAUSE
        return [LookAtGroup()]

    def _still_there(self, now: float) -> list[StopEffect]:
        if now < self._due:
            pause, self._pause = self._pause, min(self._pause * 2, LONGEST_PAUSE)
            return [PauseStop(min(pause, self._due - now))]  # the next signal on time
        if self._step + 1 < len(self._steps):
            self._step += 1
            return [SignalGroup(self._steps[self._step][0])]
        return [CheckGroup()]

    def _end(self, *, gone: bool, detail: str = "") -> list[StopEffect]:
        self._ended = True
        return [StopEnded(gone, detail)]
