"""The export file: JSON lines of log rows between a header and an end line (pure).

An export (format ``hostler-events``, :data:`FORMAT_VERSION`) is UTF-8 JSON, one object per
line (PM40):

1. a header: ``format``, ``format_version``, the exporting ``hostler_version``, the source
   log's ``rows`` and seq range (``first_seq``, ``last_seq``), the ``selection`` made
   (``since``, ``until``, ``after_seq``) and the ``redactions`` applied;
2. one line per row in seq order: ``seq``, ``stream_id``, ``version``, ``type``,
   ``schema_version``, ``payload``, ``metadata``, ``recorded_at`` (the stored ISO-8601 UTC
   text). A damaged row adds ``damaged`` (why) and ``raw: true``: its columns are then the
   stored values as they are, payload and metadata as their stored text;
3. an end line: ``end`` (the format name), the ``rows`` and ``damaged`` rows written. A file
   without it was cut short, and is refused whole on import.

This module builds and checks those objects; the CLI (:mod:`hostler.cli.export`) does the
reading and writing. Every check names the line it refused (PM44).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import msgspec

from hostler.errors import ExportFormatError
from hostler.postmortem.redact import Redaction, Redactor
from hostler.store.log import RawRow, RecordedEvent, format_time, parse_time
from hostler.untrusted import parse_json

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "MAX_LINE_BYTES",
    "decode_line",
    "end_line",
    "header",
    "is_end",
    "parse_end",
    "parse_header",
    "parse_row",
    "row_line",
    "stored_json",
]

#: The format's name, in the header's ``format`` and the end line's ``end``.
FORMAT = "hostler-events"
#: The format version this hostler writes and reads.
FORMAT_VERSION = 1
#: The longest line an import reads (16 MiB): a longer one is refused without being read whole.
MAX_LINE_BYTES = 16 * 2**20

_ROW_KEYS = (
    "seq",
    "stream_id",
    "version",
    "type",
    "schema_version",
    "payload",
    "metadata",
    "recorded_at",
)
#: The largest seq, version or schema version an import takes (as `--until-seq`): room is
#: left above it for the log to go on (a last seq of 2**63 - 1 would refuse every append).
_MAX_SEQ = 2**53
_SCALAR = str | int | float


_STORED = json.JSONEncoder(allow_nan=False, separators=(",", ":"))


def stored_json(value: Any) -> str:
    """A payload or metadata as the log stores it (the text :meth:`EventStore.append` writes)."""
    return _STORED.encode(value)


def header(
    *,
    hostler_version: str,
    rows: int,
    first_seq: int,
    last_seq: int,
    selection: Mapping[str, Any],
    redaction: Redaction,
) -> dict[str, Any]:
    """The header line's object (see the module docstring)."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "hostler_version": hostler_version,
        "source": {"rows": rows, "first_seq": first_seq, "last_seq": last_seq},
        "selection": dict(selection),
        "redactions": redaction.names,
    }


def row_line(row: RawRow, record: RecordedEvent, redactor: Redactor) -> dict[str, Any]:
    """One row's line: the record as decoded, or a damaged row's stored values, redacted."""
    if not record.damage:
        return {
            "seq": record.seq,
            "stream_id": record.stream_id,
            "version": record.version,
            "type": record.type,
            "schema_version": record.schema_version,
            "payload": redactor.payload(record.type, record.payload),
            "metadata": redactor.metadata(record.metadata),
            "recorded_at": row[7],
        }
    seq, stream_id, version, type_name, schema_version, payload, metadata, recorded_at = row
    return {
        "seq": seq,
        "stream_id": redactor.text(_scalar(stream_id)),
        "version": _scalar(version),
        "type": redactor.text(_scalar(type_name)),
        "schema_version": _scalar(schema_version),
        "payload": _raw_json(payload, redactor, record.type, payload=True),
        "metadata": _raw_json(metadata, redactor, record.type, payload=False),
        "recorded_at": redactor.text(_scalar(recorded_at)),
        "damaged": record.damage,
        "raw": True,
    }


def end_line(rows: int, damaged: int) -> dict[str, Any]:
    """The end line's object: how many rows (and damaged rows) the file holds."""
    return {"end": FORMAT, "rows": rows, "damaged": damaged}


def _scalar(value: Any) -> Any:
    """A stored column value JSON can carry (bytes become text, replacing what is not UTF-8)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    return value


def _raw_json(value: Any, redactor: Redactor, type_name: str, *, payload: bool) -> Any:
    """A damaged row's payload/metadata text: redacted as JSON when it reads as an object."""
    value = _scalar(value)
    if not redactor.redaction.any or not isinstance(value, str):
        return value
    try:
        decoded = parse_json(value)
    except ValueError:  # not JSON, or nested past the decoder's depth
        return redactor.raw(value)
    if not isinstance(decoded, dict):
        return redactor.raw(value)
    redacted = redactor.payload(type_name, decoded) if payload else redactor.metadata(decoded)
    return stored_json(redacted)


# -- reading -------------------------------------------------------------------------------


def _fail(line: int, why: str) -> ExportFormatError:
    return ExportFormatError(f"line {line}: {why}; nothing was imported")


def decode_line(data: bytes, line: int) -> dict[str, Any]:
    """One line's JSON object, or the refusal naming the line."""
    try:
        value = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise _fail(line, f"not JSON ({exc})") from None
    except RecursionError:
        raise _fail(line, "nests too deep to read") from None
    if not isinstance(value, dict):
        raise _fail(line, "not a JSON object")
    return value


def parse_header(value: Mapping[str, Any]) -> dict[str, Any]:
    """Check line 1: a ``hostler-events`` header of :data:`FORMAT_VERSION`."""
    if value.get("format") != FORMAT:
        raise _fail(1, f"no {FORMAT} header (is this a `hostler export` file?)")
    version = value.get("format_version")
    if version != FORMAT_VERSION or isinstance(version, bool):
        raise _fail(
            1,
            f"format version {version!r}; this hostler reads version {FORMAT_VERSION} "
            "(export again with this hostler)",
        )
    redactions = value.get("redactions")
    if not isinstance(redactions, list) or not all(isinstance(r, str) for r in redactions):
        raise _fail(1, "the header's redactions is not a list of names")
    return dict(value)


def is_end(value: Mapping[str, Any]) -> bool:
    """Whether a line is the end line."""
    return "end" in value


def parse_end(value: Mapping[str, Any], line: int, rows: int) -> None:
    """Check the end line against the rows read (a file cut short or spliced is refused)."""
    if value.get("end") != FORMAT:
        raise _fail(line, f"the end line does not name {FORMAT}")
    if value.get("rows") != rows or isinstance(value.get("rows"), bool):
        raise _fail(line, f"the end line counts {value.get('rows')!r} rows, the file holds {rows}")


def _int(value: Any, name: str, line: int, low: int, high: int = _MAX_SEQ) -> int:
    if type(value) is not int or not low <= value <= high:
        raise _fail(line, f"{name} {value!r} is not a whole number from {low} to {high}")
    return value


def _text(value: Any, name: str, line: int, longest: int) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= longest:
        raise _fail(line, f"{name} is not text of 1 to {longest} characters")
    return value


def parse_row(value: Mapping[str, Any], line: int, previous_seq: int) -> RawRow:
    """A row line as the row to store, checked (seqs must increase from ``previous_seq``)."""
    missing = [key for key in _ROW_KEYS if key not in value]
    if missing:
        raise _fail(line, f"no {', '.join(missing)}")
    extra = sorted(set(value) - {*_ROW_KEYS, "damaged", "raw"})
    if extra:
        raise _fail(line, f"unknown field {', '.join(map(repr, extra))}")
    seq = _int(value["seq"], "seq", line, 1)
    if seq <= previous_seq:
        raise _fail(line, f"seq {seq} does not follow seq {previous_seq} (seqs must increase)")
    if value.get("raw") is True:
        return _raw_row(value, line, seq)
    if "raw" in value or "damaged" in value:
        raise _fail(line, "damaged without raw: true (or raw not true)")
    stream_id = _text(value["stream_id"], "stream_id", line, 200)
    version = _int(value["version"], "version", line, 1)
    type_name = _text(value["type"], "type", line, 120)
    schema_version = _int(value["schema_version"], "schema_version", line, 1)
    payload, metadata = value["payload"], value["metadata"]
    if not isinstance(payload, dict) or not isinstance(metadata, dict):
        raise _fail(line, "payload and metadata must be JSON objects")
    text = _text(value["recorded_at"], "recorded_at", line, 40)
    try:
        moment = parse_time(text)
    except ValueError:
        raise _fail(line, f"recorded_at {text!r} is not an ISO-8601 time") from None
    # stored as the log stores every time (UTC, fixed width): time queries compare the text
    recorded_at = format_time(moment)
    return (
        seq,
        stream_id,
        version,
        type_name,
        schema_version,
        stored_json(payload),
        stored_json(metadata),
        recorded_at,
    )


def _raw_row(value: Mapping[str, Any], line: int, seq: int) -> RawRow:
    """A damaged row's stored values, handed back as they were (never null: NOT NULL)."""
    if not isinstance(value.get("damaged"), str):
        raise _fail(line, "raw: true without the damaged reason")
    columns = [value[key] for key in _ROW_KEYS[1:]]
    if not all(isinstance(c, _SCALAR) and not isinstance(c, bool) for c in columns):
        raise _fail(line, "a damaged row's columns must be text or numbers, as stored")
    stream_id, version, type_name, schema_version, payload, metadata, recorded_at = columns
    return (seq, stream_id, version, type_name, schema_version, payload, metadata, recorded_at)
