"""Whether the daemon's event log takes writes now, and since when it has not (driver state).

Every supervisor reports each append's outcome here. While writes fail (another writer holds
the lock, the disk is full, an I/O error) events stay pending in their machines and are
retried; the operator is told once when the trouble starts and once when it ends, and the
daemon records the episode (``daemon.log_recovered``) as soon as the log takes writes again.
A corrupt log is different: it stops new work until an operator acts (SF3, docs/daemon.md).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from hostler.errors import HostlerError, StoreCorruptError, StoreError

__all__ = ["LogHealth", "Outage"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Outage:
    """One stretch of time during which the log refused writes."""

    since: float
    until: float
    error: str
    code: str
    delayed: int


class LogHealth:
    """The log's write health, shared by the daemon and its supervisors (event loop only)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.failing_since: float | None = None
        self.error = ""
        self.code = ""
        self._kind: type[StoreError] = StoreError  # the last failure's, to tell it again as such
        self.delayed = 0
        self.corrupt: str | None = None
        self._ended: list[Outage] = []

    @property
    def ok(self) -> bool:
        """Writes are going through."""
        return self.failing_since is None

    def refusal(self, message: str) -> StoreError:
        """A refusal said in ``message``, of the kind of the log's last failure (its code).

        So that it is answered as that failure: a busy log's ``Retry-After`` is 1 s, a full
        disk's 10 s (a plain :class:`StoreError` when none fits).
        """
        return self._kind(message)

    def failed(self, exc: HostlerError, now: float, *, pending: int) -> None:
        """A write failed; ``pending`` events wait for the next try."""
        if isinstance(exc, StoreCorruptError) and self.corrupt is None:
            self.corrupt = exc.message
            log.error(
                "hostler: %s is corrupt (%s): no new work starts; running engines stay "
                "supervised until you stop the daemon (see docs/daemon.md, 'A corrupt log')",
                self.name,
                exc.message,
            )
        if self.failing_since is None:
            self.failing_since = now
            log.error(
                "hostler: the event log cannot be written (%s); events are kept and retried, "
                "and nothing new starts until they are written",
                exc.message,
            )
        self.error, self.code = exc.message, exc.code
        self._kind = type(exc) if isinstance(exc, StoreError) else StoreError
        self.delayed = max(self.delayed, pending)

    def wrote(self, now: float, *, delayed: int = 0, recorded: bool = False) -> None:
        """A write went through (``delayed`` of its events had waited for it).

        ``recorded``: that write was the outage's own record, so it is not queued again.
        """
        self.delayed = max(self.delayed, delayed)
        if self.failing_since is None:
            return
        outage = Outage(self.failing_since, now, self.error, self.code, self.delayed)
        if not recorded:
            self._ended.append(outage)
        log.warning(
            "hostler: the event log takes writes again after %.1f s; %d delayed events written",
            now - outage.since,
            outage.delayed,
        )
        self.failing_since, self.error, self.code, self.delayed = None, "", "", 0

    def take_ended(self) -> list[Outage]:
        """The outages that ended since the last call (for the daemon to record)."""
        ended, self._ended = self._ended, []
        return ended

    def requeue(self, outages: list[Outage]) -> None:
        """Put back outages whose record could not be written (tried again later)."""
        self._ended[:0] = outages

    def status(self) -> dict[str, object]:
        """A summary for status displays."""
        return {
            "log": self.name,
            "writable": self.ok,
            "failing_since": self.failing_since,
            "error": self.error,
            "code": self.code,
            "corrupt": self.corrupt,
        }
