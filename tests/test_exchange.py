"""The export file's lines (PM40, PM44): built, and checked at the edge.

Most cases need no log; the last ones import a small exported log through ``hostler import``
(a line nested too deep, a time written another way, a seq past 2**53).
"""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from hostler import EventStore
from hostler.cli import main
from hostler.errors import ExportFormatError
from hostler.events.base import UnknownEvent
from hostler.postmortem.exchange import (
    FORMAT,
    FORMAT_VERSION,
    decode_line,
    end_line,
    header,
    is_end,
    parse_end,
    parse_header,
    parse_row,
    row_line,
    stored_json,
)
from hostler.postmortem.redact import Redaction, Redactor
from hostler.store.log import RecordedEvent

from _support import DEEP
from _support import notes_log as _log

AT = "2026-12-01T02:23:11.653128Z"


def _line(**changes: Any) -> dict[str, Any]:
    line: dict[str, Any] = {
        "seq": 5,
        "stream_id": "engine/e:m:0",
        "version": 2,
        "type": "engine.ready",
        "schema_version": 1,
        "payload": {"at": 1.5, "name": "é"},
        "metadata": {"actor": "t"},
        "recorded_at": AT,
    }
    line.update(changes)
    return line


def _record(damage: str = "", **payload: Any) -> RecordedEvent:
    return RecordedEvent(
        7,
        "engine/e:m:0",
        1,
        "engine.failed",
        1,
        payload,
        {"session": "s"},
        datetime(2026, 1, 1, tzinfo=UTC),
        UnknownEvent("engine.failed", 1, payload, "x"),
        damage,
    )


def test_constants_and_the_header() -> None:
    assert (FORMAT, FORMAT_VERSION) == ("hostler-events", 1)
    made = header(
        hostler_version="9.9",
        rows=3,
        first_seq=2,
        last_seq=9,
        selection={"after_seq": 1},
        redaction=Redaction(paths=True),
    )
    assert made == {
        "format": "hostler-events",
        "format_version": 1,
        "hostler_version": "9.9",
        "source": {"rows": 3, "first_seq": 2, "last_seq": 9},
        "selection": {"after_seq": 1},
        "redactions": ["paths"],
    }
    assert parse_header(made) == made
    assert end_line(4, 1) == {"end": "hostler-events", "rows": 4, "damaged": 1}
    assert is_end(end_line(0, 0)) and not is_end(made)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"format": "other"}, "line 1: no hostler-events header"),
        ({"format_version": 2}, "format version 2; this hostler reads version 1"),
        ({"format_version": 0}, "format version 0"),
        ({"format_version": True}, "format version True"),
        ({"format_version": "1"}, "format version '1'"),
        ({"redactions": "paths"}, "redactions is not a list"),
        ({"redactions": [1]}, "redactions is not a list"),
    ],
)
def test_header_refusals(changes: dict[str, Any], message: str) -> None:
    made = {
        **header(
            hostler_version="1",
            rows=0,
            first_seq=0,
            last_seq=0,
            selection={},
            redaction=Redaction(),
        ),
        **changes,
    }
    with pytest.raises(ExportFormatError, match=message):
        parse_header(made)


def test_a_sound_row_is_stored_as_hostler_stores_it() -> None:
    row = parse_row(_line(), 3, 4)
    assert row == (
        5,
        "engine/e:m:0",
        2,
        "engine.ready",
        1,
        '{"at":1.5,"name":"\\u00e9"}',
        '{"actor":"t"}',
        AT,
    )
    assert stored_json({"a": [1, None]}) == '{"a":[1,null]}'
    with pytest.raises(ValueError, match="Out of range float values"):
        stored_json({"a": float("nan")})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"seq": 4}, "line 3: seq 4 does not follow seq 4"),
        ({"seq": 0}, "seq 0 is not a whole number from 1"),
        ({"seq": True}, "seq True is not"),
        ({"seq": 2**53 + 1}, "seq 9007199254740993 is not"),
        ({"seq": 5.0}, "seq 5.0 is not"),
        ({"version": 0}, "version 0 is not"),
        ({"version": True}, "version True is not"),
        ({"schema_version": 0}, "schema_version 0 is not"),
        ({"stream_id": ""}, "stream_id is not text of 1 to 200"),
        ({"stream_id": "s" * 201}, "stream_id is not text"),
        ({"stream_id": 3}, "stream_id is not text"),
        ({"type": "t" * 121}, "type is not text of 1 to 120"),
        ({"payload": "{}"}, "payload and metadata must be JSON objects"),
        ({"metadata": []}, "payload and metadata must be JSON objects"),
        ({"recorded_at": "x" * 41}, "recorded_at is not text of 1 to 40"),
        ({"recorded_at": "2026-13-01T00:00:00Z"}, "is not an ISO-8601 time"),
        ({"recorded_at": 5}, "recorded_at is not text"),
        ({"raw": False}, "damaged without raw"),
        ({"damaged": "x"}, "damaged without raw"),
        ({"raw": True}, "raw: true without the damaged reason"),
        ({"raw": True, "damaged": 3}, "without the damaged reason"),
        ({"raw": True, "damaged": "x", "payload": None}, "must be text or numbers"),
        ({"raw": True, "damaged": "x", "version": False}, "must be text or numbers"),
        ({"raw": True, "damaged": "x", "payload": {}}, "must be text or numbers"),
        ({"more": 1, "another": 2}, "unknown field 'another', 'more'"),
    ],
)
def test_row_refusals_name_the_line(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ExportFormatError, match=message) as caught:
        parse_row(_line(**changes), 3, 4)
    assert str(caught.value).startswith("line 3: ")
    assert str(caught.value).endswith("; nothing was imported")


def test_missing_columns_are_named() -> None:
    line = _line()
    del line["payload"], line["recorded_at"]
    with pytest.raises(ExportFormatError, match="line 2: no payload, recorded_at;"):
        parse_row(line, 2, 0)


def test_the_edges_that_are_accepted() -> None:
    top = parse_row(_line(seq=2**53, stream_id="s" * 200, type="t" * 120), 1, 0)
    assert top[0] == 2**53 and len(top[1]) == 200 and len(top[3]) == 120
    assert parse_row(_line(seq=1, version=1), 1, 0)[:3] == (1, "engine/e:m:0", 1)
    assert parse_row(_line(recorded_at="2026-12-01T04:23:11.653128+02:00"), 1, 0)[7] == (
        "2026-12-01T02:23:11.653128Z"
    )  # a time is stored as the log stores every time: UTC, fixed width
    raw = parse_row(
        _line(
            raw=True, damaged="why", payload="{bad", metadata="[1]", version="x", recorded_at=1.5
        ),
        1,
        0,
    )
    assert raw == (5, "engine/e:m:0", "x", "engine.ready", 1, "{bad", "[1]", 1.5)


def test_the_end_line() -> None:
    parse_end(end_line(3, 0), 9, 3)
    with pytest.raises(
        ExportFormatError, match="line 9: the end line counts 2 rows, the file holds 3"
    ):
        parse_end(end_line(2, 0), 9, 3)
    with pytest.raises(ExportFormatError, match="does not name hostler-events"):
        parse_end({"end": True, "rows": 3}, 9, 3)
    with pytest.raises(ExportFormatError, match="counts True rows"):
        parse_end({"end": FORMAT, "rows": True}, 9, 1)


def test_decode_line() -> None:
    assert decode_line(b'{"a":1}\r\n', 4) == {"a": 1}
    with pytest.raises(ExportFormatError, match="line 4: not JSON"):
        decode_line(b"{", 4)
    with pytest.raises(ExportFormatError, match="line 4: not JSON"):
        decode_line(b'{"a":NaN}', 4)
    with pytest.raises(ExportFormatError, match="line 4: not a JSON object"):
        decode_line(b"[]", 4)


def test_row_lines_of_sound_and_damaged_rows() -> None:
    stored = (7, "engine/e:m:0", 1, "engine.failed", 1, "{}", "{}", AT)
    sound = row_line(stored, _record(error="/a/b.gguf"), Redactor(Redaction(paths=True)))
    assert sound == {
        "seq": 7,
        "stream_id": "engine/e:m:0",
        "version": 1,
        "type": "engine.failed",
        "schema_version": 1,
        "payload": {"error": "<path:1>.gguf"},
        "metadata": {"session": "s"},
        "recorded_at": AT,  # the stored text, not the decoded time
    }
    damaged_row = (7, b"engine/\xff", "v", "engine.failed", 1, '{"error":"/a/b"}', "[1]", "late")
    plain = row_line(damaged_row, _record("why"), Redactor(Redaction()))
    assert plain == {
        "seq": 7,
        "stream_id": "engine/\ufffd",
        "version": "v",
        "type": "engine.failed",
        "schema_version": 1,
        "payload": '{"error":"/a/b"}',
        "metadata": "[1]",
        "recorded_at": "late",
        "damaged": "why",
        "raw": True,
    }
    redacted = row_line(damaged_row, _record("why"), Redactor(Redaction(True, True)))
    assert redacted["payload"] == '{"error":"<path:1>"}'  # readable JSON is redacted as JSON
    assert redacted["metadata"] == "<redacted>"  # JSON, but no object: cannot be classified
    garbled = (7, "s/x", 1, "t", 1, "{oops /a/b", 5, "/tmp/x")
    out = row_line(garbled, _record("why"), Redactor(Redaction(paths=True)))
    assert out["payload"] == "<redacted>" and out["metadata"] == 5
    assert out["recorded_at"] == "<path:1>" and out["stream_id"] == "s/x"
    meta = (7, "s", 1, "t", 1, "{}", '{"session":"alice"}', AT)
    assert row_line(meta, _record("why"), Redactor(Redaction(prompts=True)))["metadata"] == (
        '{"session":"<session:1>"}'
    )
    assert json.loads(stored_json(plain))["raw"] is True


def test_an_import_line_nested_too_deep_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _log(tmp_path / "events.db")
    assert main(["export", str(path), "-o", str(tmp_path / "e.jsonl")]) == 0
    lines = (tmp_path / "e.jsonl").read_text().splitlines()
    row = json.loads(lines[3])
    lines[3] = json.dumps(row)[:-1] + ', "deep": ' + DEEP + "}"
    (tmp_path / "deep.jsonl").write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    target = tmp_path / "new.db"
    assert main(["import", str(tmp_path / "deep.jsonl"), "--db", str(target)]) == 1
    assert capsys.readouterr().err == (
        "hostler: error [export.format]: line 4: nests too deep to read; nothing was imported\n"
    )
    assert not target.exists()


def _exported(tmp_path: Path) -> list[dict[str, object]]:
    path = _log(tmp_path / "events.db")
    assert main(["export", str(path), "-o", str(tmp_path / "e.jsonl")]) == 0
    return [json.loads(line) for line in (tmp_path / "e.jsonl").read_text().splitlines()]


def _import(tmp_path: Path, lines: list[dict[str, object]], name: str) -> int:
    source = tmp_path / f"{name}.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return main(["import", str(source), "--db", str(tmp_path / f"{name}.db")])


def test_an_imported_time_is_stored_as_the_log_stores_every_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: `T` written as a space (or an offset) was stored as given; --since then missed it."""
    lines = _exported(tmp_path)
    original = str(lines[3]["recorded_at"])
    lines[3]["recorded_at"] = original.replace("T", " ")
    lines[4]["recorded_at"] = "2030-01-01T05:00:00+05:00"
    assert _import(tmp_path, lines, "times") == 0
    with EventStore.open(tmp_path / "times.db") as store:
        stored = {r.seq: r for r in store.read_all()}
        assert [r.seq for r in store.read_all(since=stored[3].recorded_at)] == [3, 4, 5, 6]
    with sqlite3.connect(tmp_path / "times.db") as db:
        texts = dict(db.execute("SELECT seq, recorded_at FROM events WHERE seq IN (3, 4)"))
    assert texts == {3: original, 4: "2030-01-01T00:00:00.000000Z"}
    capsys.readouterr()


def test_an_import_refuses_a_seq_past_2_to_the_53(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: a last seq of 2**63 - 1 imported, and the log refused every append after it."""
    lines = _exported(tmp_path)
    lines[-2]["seq"] = 2**53
    assert _import(tmp_path, lines, "edge") == 0  # the bound itself is taken
    lines[-2]["seq"] = 2**53 + 1
    capsys.readouterr()
    assert _import(tmp_path, lines, "past") == 1
    err = capsys.readouterr().err
    assert "seq 9007199254740993 is not a whole number from 1 to 9007199254740992" in err
    assert not (tmp_path / "past.db").exists()
