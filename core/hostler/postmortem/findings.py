"""What ``hostler explain`` answers with: the :class:`Target` asked about, and findings.

:func:`cite` makes a finding of a record (its ``seq`` and recorded time); the sentence writers of
:mod:`hostler.postmortem.explain` use it for every finding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hostler.store.log import RecordedEvent

__all__ = ["Finding", "Target", "cite"]


@dataclass(frozen=True, slots=True)
class Target:
    """What ``hostler explain`` was asked about, resolved against a log.

    Attributes:
        kind: One of :data:`TARGET_KINDS`.
        text: The target as given.
        keys: The engine keys it covers (one for an engine or a request; every replica of a
            model; every engine a session was bound to or queued on).
        session: The session id (``session`` targets only).
        request: The request id within ``keys``' one queue (``request`` targets only).
    """

    kind: str
    text: str
    keys: frozenset[str]
    session: str | None = None
    request: int | None = None


@dataclass(frozen=True, slots=True)
class Finding:
    """One decision that touched the target.

    Attributes:
        seq: The event's position in the log.
        at: When the log recorded it (UTC).
        subject: What it is about (an engine key, ``lease/ID``, ``session S``, ``KEY#N``).
        kind: A stable word for tools: ``admitted``, ``refused``, ``victim``, ``drained``,
            ``stop``, ``stopped``, ``crashed``, ``restart``, ``failed``, ``lease``...
        text: The sentence a person reads.
        cause: The figures the sentence cites (JSON values).
    """

    seq: int
    at: datetime
    subject: str
    kind: str
    text: str
    cause: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """The finding as a JSON object (``at`` in ISO-8601)."""
        return {
            "seq": self.seq,
            "at": self.at.isoformat(),
            "subject": self.subject,
            "kind": self.kind,
            "text": self.text,
            "cause": self.cause,
        }

    def line(self) -> str:
        """One readable line: time, seq, subject, sentence."""
        stamp = self.at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        return f"{stamp}  seq {self.seq:<7} {self.subject}: {self.text}"


def cite(record: RecordedEvent, subject: str, kind: str, text: str, **cause: Any) -> Finding:
    """The finding ``text`` states about ``subject``, citing ``record`` and the figures."""
    return Finding(record.seq, record.recorded_at, subject, kind, text, cause)
