"""The log's rows as readers get them: the record of a row, its stored time, its columns.

A stored row is decoded here, one at a time: a row whose payload is not JSON or whose time is
not a time becomes a damaged record (``damage`` says why) instead of failing the page it came
in, so that a read never stops at one bad row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec
import sqlalchemy as sa

# Registered before a row is decoded: a post-mortem reader may have imported nothing else
# (``import hostler`` loads only the errors), and a type not registered reads as unknown.
import hostler.events  # the types beside the event base
import hostler.machines  # noqa: F401 - the lifecycle's, beside its machines
from hostler.events.base import Event, UnknownEvent, decode
from hostler.store.schema import ROW_COLUMNS, events

__all__ = [
    "EPOCH",
    "REPLAY_COLUMNS",
    "STORED_COLUMNS",
    "RawRow",
    "RecordedEvent",
    "format_time",
    "parse_time",
    "record_of",
]

#: A row as stored, for export and import: ``(seq, stream_id, version, type, schema_version,
#: payload, metadata, recorded_at)``, payload and metadata as their stored JSON text (a damaged
#: row's columns hold whatever the file held).
RawRow = tuple[Any, Any, Any, Any, Any, Any, Any, Any]

#: A whole row with payload and metadata as stored text, decoded per row by :func:`record_of`:
#: one damaged row must not fail the page it is in (SQLAlchemy's JSON result processor would
#: raise for the whole page).
STORED_COLUMNS = (
    *ROW_COLUMNS[:5],
    sa.type_coerce(events.c.payload, sa.Text()).label("payload"),
    sa.type_coerce(events.c["metadata"], sa.Text()).label("metadata"),
    ROW_COLUMNS[7],
)
#: Replay needs neither metadata nor time, and decodes the payload itself: the driver's text
#: goes straight to json.loads, without a result processor per row.
REPLAY_COLUMNS = (
    events.c.seq,
    events.c.stream_id,
    events.c.version,
    events.c.type,
    events.c.schema_version,
    sa.type_coerce(events.c.payload, sa.Text()).label("payload"),
)
#: ``recorded_at`` of a row whose stored time cannot be read (see ``RecordedEvent.damage``).
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def format_time(moment: datetime) -> str:
    """The stored text of a moment (UTC, fixed width). Naive datetimes are taken as UTC."""
    if moment.tzinfo is UTC:
        moment = moment.replace(tzinfo=None)
    elif moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    # isoformat is several times faster than strftime(TIME_FORMAT) and gives the same text
    return moment.isoformat(timespec="microseconds") + "Z"


def parse_time(text: str) -> datetime:
    """The aware UTC datetime of a stored ``recorded_at``."""
    return datetime.fromisoformat(text)


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    """One row of the log, with its event decoded (and upcast) for this hostler.

    Attributes:
        seq: Global position in the log; increasing, never reused, may have gaps.
        stream_id: The stream (one machine instance, e.g. ``engine/llamacpp:qwen:0``).
        version: Position within the stream, from 1, without gaps.
        type: The stable event type string.
        schema_version: The payload's schema version as stored.
        payload: The payload as stored (before upcasting).
        metadata: Correlation/causation ids, actor, hostler and policy versions.
        recorded_at: When the log accepted the event (UTC); the epoch when damaged.
        event: The decoded event, or an :class:`UnknownEvent` keeping the raw record.
        damage: Empty for a sound row; else why it could not be read (payload not JSON, time
            not a time...). A damaged row is listed, never folded, and never stops a read.
    """

    seq: int
    stream_id: str
    version: int
    type: str
    schema_version: int
    payload: dict[str, Any]
    metadata: dict[str, Any]
    recorded_at: datetime
    event: Event | UnknownEvent
    damage: str = ""


def record_of(row: Sequence[Any]) -> RecordedEvent:
    """The record of one stored row, its event decoded; a damaged row says why, never raises."""
    seq, stream_id, version, type_name, schema_version, payload, metadata, recorded_at = row
    damage: list[str] = []
    if not isinstance(stream_id, str) or not isinstance(type_name, str):
        damage.append("stream or type is not text")
        stream_id, type_name = str(stream_id), str(type_name)
    if type(version) is not int or type(schema_version) is not int:
        damage.append("version or schema version is not a whole number")
        version = version if type(version) is int else 0
        schema_version = schema_version if type(schema_version) is int else 0
    payload_dict = _json_object(payload, "payload", damage)
    metadata_dict = _json_object(metadata, "metadata", damage)
    try:
        moment = parse_time(recorded_at)
    except (TypeError, ValueError):
        damage.append(f"recorded_at {str(recorded_at)[:40]!r} is not a time")
        moment = EPOCH
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    if damage:
        why = "; ".join(damage)
        event: Event | UnknownEvent = UnknownEvent(
            type_name, schema_version, payload_dict, f"damaged row: {why}"
        )
    else:
        why = ""
        event = decode(type_name, schema_version, payload_dict)
    return RecordedEvent(
        seq,
        stream_id,
        version,
        type_name,
        schema_version,
        payload_dict,
        metadata_dict,
        moment,
        event,
        why,
    )


def _json_object(value: Any, column: str, damage: list[str]) -> dict[str, Any]:
    """A stored JSON object column, or {} with the reason added to ``damage``."""
    if isinstance(value, dict):  # drivers that decode JSON themselves
        return value
    try:
        decoded = msgspec.json.decode(value) if value is not None else None
    except (msgspec.DecodeError, TypeError):
        damage.append(f"{column} is not JSON")
        return {}
    except RecursionError:  # a row nested past the decoder's depth: damaged, never fatal
        damage.append(f"{column} nests too deep to read")
        return {}
    if not isinstance(decoded, dict):
        damage.append(f"{column} is not a JSON object")
        return {}
    return decoded
