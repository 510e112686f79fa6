"""Plain-text and JSON-lines rendering of log records for the CLI."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from typing import Any

from hostler.events.base import UnknownEvent
from hostler.store.log import RecordedEvent, format_time

__all__ = ["TableWriter", "record_json", "summarize_fields", "summarize_payload"]

_SKIP_IN_SUMMARY = frozenset({"from_state", "to_state", "at"})


def summarize_payload(record: RecordedEvent) -> str:
    """A compact ``from→to k=v ...`` line of a record's payload."""
    if record.damage:
        return f"[DAMAGED ROW: {record.damage}]"
    text = summarize_fields(record.payload)
    if isinstance(record.event, UnknownEvent):
        text = f"{text} [unknown: {record.event.reason}]".lstrip()
    return text


def summarize_fields(payload: dict[str, Any]) -> str:
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


def record_json(record: RecordedEvent) -> str:
    """One JSON line for a record (the stored payload, plus the upcast one if it differs)."""
    data: dict[str, Any] = {
        "seq": record.seq,
        "recorded_at": format_time(record.recorded_at),
        "stream_id": record.stream_id,
        "version": record.version,
        "type": record.type,
        "schema_version": record.schema_version,
        "payload": record.payload,
        "metadata": record.metadata,
    }
    if record.damage:
        data["damaged"] = record.damage
    elif isinstance(record.event, UnknownEvent):
        data["unknown"] = record.event.reason
    return json.dumps(data, separators=(",", ":"), sort_keys=False)


class TableWriter:
    """Writes records as aligned rows: seq, time, stream, version, type, summary."""

    def __init__(self, width: int | None = None) -> None:
        self.width = width or shutil.get_terminal_size((160, 24)).columns
        self.header_done = False

    def lines(self, records: Iterable[RecordedEvent]) -> Iterable[str]:
        """Format rows (the header before the first one)."""
        for record in records:
            if not self.header_done:
                self.header_done = True
                yield self._fit(
                    f"{'SEQ':>7}  {'RECORDED (UTC)':<23}  {'STREAM':<34} {'V':>3}  "
                    f"{'TYPE':<26} DETAILS"
                )
            stamp = format_time(record.recorded_at)[:23].replace("T", " ")
            yield self._fit(
                f"{record.seq:>7}  {stamp:<23}  {record.stream_id:<34} {record.version:>3}  "
                f"{record.type:<26} {summarize_payload(record)}"
            )

    def _fit(self, line: str) -> str:
        return line if len(line) <= self.width else line[: self.width - 1] + "…"
