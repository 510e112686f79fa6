"""The event table for people, the same from a log file and from a running daemon.

``hostler events`` (a log file) and ``hostler events --url`` (``GET /api/events``) both turn
each event into an :class:`EventRow` and print it with one :class:`TableWriter`. Only the
standard library: the rows come from whoever read them.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import IO, Any

from hostler.cli.tables import GAP, table_width

__all__ = ["EventRow", "TableWriter", "remote_row", "summarize_fields"]

_SKIP_IN_SUMMARY = frozenset({"from_state", "to_state", "at"})

#: At least this wide, a table shows the full layout (the date and the schema version too);
#: at least :data:`TIME_WIDTH`, the time of day; narrower, the seq, stream, type and details.
FULL_WIDTH = 120
TIME_WIDTH = 100


@dataclass(frozen=True, slots=True)
class EventRow:
    """One event as the table shows it.

    Attributes:
        seq: Its place in the log.
        recorded_at: When it was recorded (ISO-8601 UTC, as the log stores it), or ``""``.
        stream: Its stream id (``engine/KEY``...).
        version: Its version within that stream.
        type: Its type string (``engine.ready``...).
        details: Its payload as ``from→to k=v ...`` (see :func:`summarize_fields`).
    """

    seq: int
    recorded_at: str
    stream: str
    version: int
    type: str
    details: str


def summarize_fields(payload: Mapping[str, Any]) -> str:
    """A compact ``from→to k=v ...`` line of an event's payload."""
    parts: list[str] = []
    if "from_state" in payload and "to_state" in payload:
        source, dest = payload["from_state"] or "∅", payload["to_state"]
        parts.append(source if source == dest else f"{source}→{dest}")
    parts.extend(
        f"{key}={_short(value)}" for key, value in payload.items() if key not in _SKIP_IN_SUMMARY
    )
    return " ".join(parts)


def _short(value: Any) -> str:
    if isinstance(value, float):
        # epoch seconds keep their milliseconds; small figures stay short
        return f"{value:.3f}" if abs(value) >= 1e6 else f"{value:.6g}"
    if isinstance(value, str):
        return value if value and " " not in value else json.dumps(value)
    return json.dumps(value, separators=(",", ":"))


def remote_row(event: Mapping[str, Any]) -> EventRow:
    """A row of an event of ``GET /api/events`` (``seq``, ``recorded_at``, ``stream``...)."""
    payload = event.get("payload")
    return EventRow(
        seq=int(event.get("seq") or 0),
        recorded_at=str(event.get("recorded_at") or ""),
        stream=str(event.get("stream") or ""),
        version=int(event.get("version") or 0),
        type=str(event.get("type") or ""),
        details=summarize_fields(payload) if isinstance(payload, Mapping) else "",
    )


@dataclass(frozen=True, slots=True)
class _Column:
    header: str
    width: int
    right: bool = False
    whole: bool = False  # never cut (a seq): a longer value shifts its row instead


#: Every column, at the width that fits nearly every value (longer ones are cut with ``…``).
_FULL = (
    _Column("SEQ", 7, right=True, whole=True),
    _Column("RECORDED (UTC)", 23),
    _Column("STREAM", 34),
    _Column("V", 3, right=True),
    _Column("TYPE", 26),
)
#: A narrower terminal's: the time of day only, no schema version, shorter stream and type
#: (``engine/llamacpp:alpha:0``, ``engine.start_requested`` fit).
_TIMED = (
    _Column("SEQ", 5, right=True, whole=True),
    _Column("TIME", 8),
    _Column("STREAM", 23),
    _Column("TYPE", 22),
)
#: Under 100 columns: no time, so that the details keep a third of an 80-column line.
_NARROW = (
    _Column("SEQ", 5, right=True, whole=True),
    _Column("STREAM", 23),
    _Column("TYPE", 22),
)


def _layout(width: int | None) -> tuple[_Column, ...]:
    if width is None or width >= FULL_WIDTH:
        return _FULL
    return _TIMED if width >= TIME_WIDTH else _NARROW


class TableWriter:
    """Writes event rows as aligned lines: the columns, then the details, fitted to a width.

    Args:
        width: The width every line fits (None: the terminal's or ``$COLUMNS``, else any).
        wide: Every column whole, whatever the width.
        file: Where the width is read from (standard output).
    """

    def __init__(
        self, width: int | None = None, *, wide: bool = False, file: IO[str] | None = None
    ) -> None:
        self.width = None if wide else width or table_width(file or sys.stdout)
        self.columns = _layout(self.width)
        self.header_done = False

    def lines(self, rows: Iterable[EventRow]) -> Iterable[str]:
        """Format rows (the header before the first one)."""
        for row in rows:
            if not self.header_done:
                self.header_done = True
                yield self._fit([c.header for c in self.columns], "DETAILS")
            yield self._fit(self._cells(row), row.details)

    def _cells(self, row: EventRow) -> list[str]:
        stamp = row.recorded_at[:23].replace("T", " ")
        if self.columns is _NARROW:
            return [str(row.seq), row.stream, row.type]
        if self.columns is _TIMED:
            return [str(row.seq), stamp[11:19], row.stream, row.type]
        return [str(row.seq), stamp, row.stream, str(row.version), row.type]

    def _fit(self, cells: list[str], details: str) -> str:
        parts = []
        for column, cell in zip(self.columns, cells, strict=True):
            # no width to fit (--wide, or a pipe): every value whole, its row shifted instead
            fits = len(cell) <= column.width or column.whole or self.width is None
            text = cell if fits else cell[: column.width - 1] + "…"
            parts.append(text.rjust(column.width) if column.right else text.ljust(column.width))
        line = (" " * GAP).join(parts) + " " * GAP + details
        line = line.rstrip()
        if self.width is None or len(line) <= self.width:
            return line
        return line[: self.width - 1] + "…"
