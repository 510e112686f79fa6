"""Events of the daemon itself (stream ``daemon/host``): start-up, shutdown, reaped strays.

Defined beside the event base so that a log's reader registers them without importing the
daemon (and its async runtime); :mod:`hostler.daemon` and :mod:`hostler.engines.reconcile`
re-export them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hostler.events.base import Event, event_type, upcaster

__all__ = [
    "DAEMON_STREAM",
    "DaemonGap",
    "DaemonLogRecovered",
    "DaemonStarted",
    "DaemonStopped",
    "EngineReaped",
]

#: The stream of the daemon's own decisions about a data directory.
DAEMON_STREAM = "daemon/host"


@event_type("daemon.started", schema_version=2)
@dataclass(frozen=True, slots=True)
class DaemonStarted(Event):
    """A daemon took over a data directory; what reconcile found, and the ledger it uses.

    ``ledger`` is the host ledger's log file when it is another file than this log (schema
    v2; None: this log holds the ledger's decisions, or a v1 event that did not say), and
    ``ledger_owner`` the owner this daemon's reservations carry there: a reader of this log
    (``whatif``, ``timeline``) finds this daemon's memory decisions with the two.
    """

    at: float
    pid: int
    version: str
    adopted: list[str]
    lost: list[str]
    reaped: list[int]
    ledger: str | None = None
    ledger_owner: str | None = None


@upcaster("daemon.started", from_version=1)
def _started_v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    payload.setdefault("ledger", None)
    payload.setdefault("ledger_owner", None)
    return payload


@event_type("daemon.stopped")
@dataclass(frozen=True, slots=True)
class DaemonStopped(Event):
    """A daemon shut down cleanly."""

    at: float
    pid: int


@event_type("daemon.reaped")
@dataclass(frozen=True, slots=True)
class EngineReaped(Event):
    """A process carrying this data directory's launch token that no live log entry owned."""

    at: float
    pid: int
    launch_token: str
    command: str


@event_type("daemon.gap")
@dataclass(frozen=True, slots=True)
class DaemonGap(Event):
    """The previous daemon of this data directory left no record of its end (SF4).

    It was killed, or its last events could not be written (a full disk, a locked log):
    events after ``last_seq`` may be missing. What survived is in the next ``daemon.started``
    (adopted, lost).
    """

    at: float
    previous_pid: int
    previous_started_at: float
    last_seq: int


@event_type("daemon.log_recovered")
@dataclass(frozen=True, slots=True)
class DaemonLogRecovered(Event):
    """The log refused writes from ``since`` until ``until`` (SF1).

    The events kept meanwhile (``delayed``) were written late: their ``recorded_at`` is the
    moment they got in, their observation time ``at`` when they happened.
    """

    since: float
    until: float
    error: str
    code: str
    delayed: int
