"""The wait for a starting engine to become ready (RD1, RD7), sans I/O.

A start waits until the adapter's readiness probe passes, within the start's timeout, the
probe in flight included; it fails at once when the process exits or logs a panic that is
fatal at startup, and it gives way at once to a stop asked meanwhile. :class:`ReadinessWait`
holds that sequence; the supervisor reports what it sees and carries out each effect::

    Look ──→ Looked(abort)            → AbortStart
             Looked(exited | fatal)   → FailStart
             Looked(line not seen yet) ─┐
             Looked(no probe path)   → BecomeReady
             Looked                  → SendProbe(wait ≤ what is left)
    Answered(interrupted)            → Look            (the stop wins over the answer)
    Answered(ready)                  → BecomeReady
    Answered(not ready), past due    → FailStart(timed out)
    Answered(not ready)              → Pause(poll) ──→ Paused → Look
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "LAST_PROBE",
    "AbortStart",
    "Answered",
    "BecomeReady",
    "FailStart",
    "Look",
    "Looked",
    "Pause",
    "Paused",
    "ReadinessEffect",
    "ReadinessObservation",
    "ReadinessWait",
    "SendProbe",
]

#: The least a readiness probe is given, even at its start's deadline (seconds): the last
#: poll still gets an answer from an engine that is ready by then.
LAST_PROBE = 0.05

# -- observations ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Looked:
    """What the driver saw when it looked (after reading the engine's new lines).

    Args:
        abort: The reason of a stop asked meanwhile (None: none).
        exited: The process has exited.
        fatal: Its output named a panic that is fatal at startup.
        line_pending: The adapter's ready line has not been seen yet.
    """

    abort: str | None = None
    exited: bool = False
    fatal: bool = False
    line_pending: bool = False


@dataclass(frozen=True, slots=True)
class Answered:
    """The probe's verdict (status, body and the adapter's say); ``interrupted``: a stop came."""

    ready: bool
    interrupted: bool = False


@dataclass(frozen=True, slots=True)
class Paused:
    """The pause between two probes ended (or a stop cut it short)."""


ReadinessObservation = Looked | Answered | Paused

# -- effects -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Look:
    """Read the engine's new lines, then report :class:`Looked`."""


@dataclass(frozen=True, slots=True)
class SendProbe:
    """Send the readiness probe, waiting at most ``wait`` seconds; report :class:`Answered`."""

    wait: float


@dataclass(frozen=True, slots=True)
class Pause:
    """Wait ``seconds`` (a stop cuts it short); report :class:`Paused`."""

    seconds: float


@dataclass(frozen=True, slots=True)
class BecomeReady:
    """The engine is ready: record it."""


@dataclass(frozen=True, slots=True)
class FailStart:
    """The start failed: it exited or panicked before ready, or ``timed_out``."""

    exited: bool
    timed_out: bool = False


@dataclass(frozen=True, slots=True)
class AbortStart:
    """A stop asked meanwhile wins: stop the engine for ``reason`` and end the start."""

    reason: str


ReadinessEffect = Look | SendProbe | Pause | BecomeReady | FailStart | AbortStart


class ReadinessWait:
    """One start's wait for readiness (pure).

    Args:
        began: When the wait began (monotonic seconds).
        timeout: The start's timeout (RD7): the whole wait, a probe in flight included.
        poll: The pause between two probes.
        probe_wait: How long one probe may wait for its answer (the adapter's).
        has_probe: Whether there is an HTTP probe at all (without one, the ready line or the
            process staying up is enough).
    """

    def __init__(
        self, *, began: float, timeout: float, poll: float, probe_wait: float, has_probe: bool
    ) -> None:
        self.deadline = began + timeout
        self.poll = poll
        self.probe_wait = probe_wait
        self.has_probe = has_probe

    def start(self) -> list[ReadinessEffect]:
        """The first effect: look."""
        return [Look()]

    def handle(self, observation: ReadinessObservation, now: float) -> list[ReadinessEffect]:  # noqa: PLR0911
        """Take ``observation`` made at ``now`` (monotonic); what the driver does next."""
        match observation:
            case Looked(abort, exited, fatal, line_pending):
                if abort is not None:
                    return [AbortStart(abort)]
                if exited or fatal:
                    return [FailStart(exited=exited)]
                if line_pending:
                    return self._not_ready(now)
                if not self.has_probe:
                    return [BecomeReady()]
                return [SendProbe(min(self.probe_wait, max(self.deadline - now, LAST_PROBE)))]
            case Answered(ready, interrupted):
                if interrupted:
                    return [Look()]  # a stop came meanwhile: it wins over the answer
                return [BecomeReady()] if ready else self._not_ready(now)
            case Paused():
                return [Look()]

    def _not_ready(self, now: float) -> list[ReadinessEffect]:
        if now >= self.deadline:
            return [FailStart(exited=False, timed_out=True)]
        return [Pause(self.poll)]
