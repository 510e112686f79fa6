"""``hostler export`` / ``hostler import`` on a log recorded by a real runtime, and on edges."""

from __future__ import annotations

import io
import json
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import hostler
from hostler.cli import main
from hostler.cli.export import _Lines
from hostler.errors import ExportFormatError
from hostler.machines.engine import EngineCrashed, EngineFailed
from hostler.postmortem.exchange import FORMAT_VERSION, MAX_LINE_BYTES
from hostler.replay import replay
from hostler.runtime.arbiter import GpuArbiter
from hostler.store.log import EventStore

from _fake_engine import BallastEngine
from _pools import BALLAST_MIB, World, work, world_at
from _support import notes_log as _log
from _support import run_cli

# -- a log recorded by a real runtime ------------------------------------------------------


async def _record(world: World) -> None:
    """Three models under a budget for two (an eviction), sessions, labels, a lease."""
    engine = BallastEngine(world.tmp_path, BALLAST_MIB)
    async with hostler.Runtime(
        world.store,
        world.supervisor_factory(engine),
        ledger=world.ledger,
        drain_poll=0.02,
        arbiter=GpuArbiter("swap", store=world.store),
    ) as rt:
        first = await rt.bind("ballast", "alpha", "session-of-alice")
        async with rt.request(first, session="session-of-alice", label="alice asks") as port:
            await anyio.to_thread.run_sync(work, port, 0.0)
        await rt.bind("ballast", "beta", "session-of-bob")
        third = await rt.bind("ballast", "gamma", "session-of-carol")  # evicts alpha
        async with rt.request(third, session="session-of-carol", label="carol asks") as port:
            await anyio.to_thread.run_sync(work, port, 0.0)
        release = await rt.arbiter.acquire_lease("image", "render-job-of-dave")
        await release()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real runtime's log, plus the path-carrying events a real crash and failure write."""
    folder = tmp_path_factory.mktemp("recorded")
    with world_at(folder) as world:
        anyio.run(_record, world, backend="asyncio")
        model = world.model
        failed = EngineFailed(
            "starting", "failed", world.now, f"{model}: cannot open {folder}/lib.so", None, None
        )
        crashed = EngineCrashed(
            "running",
            "backoff",
            world.now,
            1,
            None,
            True,
            world.now + 1,
            "assert",
            f"GGML_ASSERT failed at {folder}/ggml.c:123",
            2.0,
            f"loading {model}\nuser: alice asks about {folder}/notes.txt",
        )
        world.store.append("engine/ballast:side:0", [failed, crashed], expected_version=None)
    return folder / "events.db"


def _hostler(capsysbinary: pytest.CaptureFixture[bytes], *args: str) -> tuple[int, bytes, str]:
    status = main(list(args))
    out, err = capsysbinary.readouterr()
    return status, out, err.decode()


def _events_json(capsysbinary: pytest.CaptureFixture[bytes], db: Path) -> list[dict[str, Any]]:
    status, out, _ = _hostler(capsysbinary, "events", "--db", str(db), "--json")
    assert status == 0
    return [json.loads(line) for line in out.splitlines()]


def _table(db: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT * FROM events ORDER BY seq").fetchall()


def _snapshot(db: Path) -> dict[str, Any]:
    with EventStore.open(db) as store:
        return replay(store).snapshot()


def _differences(before: Any, after: Any, name: str = "") -> set[str]:
    """The names of the fields whose values differ (same shape required)."""
    if isinstance(before, dict):
        assert isinstance(after, dict) and before.keys() == after.keys()
        return {n for k in before for n in _differences(before[k], after[k], str(k))}
    return set() if before == after else {name}


def test_the_recorded_log_holds_what_redaction_must_find(recorded: Path) -> None:
    types = {row[3] for row in _table(recorded)}
    assert {"pool.room_planned", "queue.enqueued", "router.bound", "lease.requested"} <= types
    assert any(
        row[3] == "engine.stop_requested" and '"eviction"' in row[5] for row in _table(recorded)
    ) or any(row[3] == "pool.room_planned" and '"evict":["' in row[5] for row in _table(recorded))
    text = "\n".join(str(row) for row in _table(recorded))
    assert "session-of-alice" in text and "alice asks" in text and "render-job-of-dave" in text
    assert str(recorded.parent) in text


def test_export_then_import_gives_the_same_log(
    recorded: Path, tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    status, out, err = _hostler(capsysbinary, "export", str(recorded))
    assert status == 0 and err == ""
    lines = out.splitlines()
    head, end = json.loads(lines[0]), json.loads(lines[-1])
    rows = _table(recorded)
    assert head == {
        "format": "hostler-events",
        "format_version": 1,
        "hostler_version": hostler.__version__,
        "source": {"rows": len(rows), "first_seq": rows[0][0], "last_seq": rows[-1][0]},
        "selection": {"since": None, "until": None, "after_seq": 0},
        "redactions": [],
    }
    assert end == {"end": "hostler-events", "rows": len(rows), "damaged": 0}
    first = json.loads(lines[1])
    assert list(first) == [
        "seq",
        "stream_id",
        "version",
        "type",
        "schema_version",
        "payload",
        "metadata",
        "recorded_at",
    ]
    assert first["recorded_at"] == rows[0][7] and first["recorded_at"].endswith("Z")
    export = tmp_path / "events.jsonl"
    export.write_bytes(out)
    copy = tmp_path / "copy.db"
    status, _, err = _hostler(capsysbinary, "import", str(export), "--db", str(copy))
    assert status == 0, err
    assert f"imported {len(rows)} rows into {copy}" in err and "redactions: none" in err
    assert _table(copy) == rows  # byte for byte: seqs, times, payload and metadata text
    assert _snapshot(copy) == _snapshot(recorded)
    assert _events_json(capsysbinary, copy) == _events_json(capsysbinary, recorded)
    for command in ("state",):
        assert (
            _hostler(capsysbinary, command, "--db", str(copy))[1]
            == (_hostler(capsysbinary, command, "--db", str(recorded))[1])
        )
    with EventStore.open(copy) as store:  # appends after an import go on after its last seq
        result = store.append(
            "engine/x:y:0", [EngineFailed("a", "b", 0.0, "e", None, None)], expected_version=0
        )
        assert result.seqs == (rows[-1][0] + 1,)


def test_an_export_imported_into_postgresql_answers_as_the_sqlite_log(
    recorded: Path, pg_url: str, tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """`hostler import --db URL` fills an empty PostgreSQL log; every reading command then
    answers byte for byte as on the SQLite original, and appends continue after its seqs."""
    status, out, _ = _hostler(capsysbinary, "export", str(recorded))
    assert status == 0
    export = tmp_path / "events.jsonl"
    export.write_bytes(out)
    status, _, err = _hostler(capsysbinary, "import", str(export), "--db", pg_url)
    assert status == 0, err
    rows = _table(recorded)
    assert f"imported {len(rows)} rows into postgresql+psycopg://" in err
    for command in (
        ("events", "--json"),
        ("state",),
        ("state", "--json"),
        ("explain", "ballast:alpha:0"),
        ("replay", "--verify"),
    ):
        on_pg = _hostler(capsysbinary, *command, "--db", pg_url)
        on_sqlite = _hostler(capsysbinary, *command, "--db", str(recorded))
        assert on_pg[:2] == on_sqlite[:2], command
    again = _hostler(capsysbinary, "export", pg_url)
    assert again[0] == 0 and again[1] == out  # the export of the copy is the same file
    status, _, err = _hostler(capsysbinary, "import", str(export), "--db", pg_url)
    assert status != 0 and "import fills an empty log only" in err
    # a host's part of a fleet's database is filled the same way, beside the database's own
    status, _, err = _hostler(
        capsysbinary, "import", str(export), "--db", pg_url, "--host-name", "gpu7"
    )
    assert status == 0, err
    assert (
        _hostler(capsysbinary, "events", "--json", "--db", pg_url, "--host-name", "gpu7")[1]
        == (_hostler(capsysbinary, "events", "--json", "--db", str(recorded))[1])
    )
    with EventStore.open(pg_url) as store:  # appends after an import go on after its last seq
        result = store.append(
            "engine/x:y:0", [EngineFailed("a", "b", 0.0, "e", None, None)], expected_version=0
        )
        assert result.seqs == (rows[-1][0] + 1,)


def test_redacted_export_keeps_everything_but_paths_and_prompts(
    recorded: Path, tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    status, out, _ = _hostler(capsysbinary, "export", "--db", str(recorded), "--redact", "all")
    assert status == 0
    text = out.decode()
    for secret in (
        str(recorded.parent),
        "session-of-alice",
        "session-of-carol",
        "alice asks",
        "carol asks",
        "render-job-of-dave",
        "notes.txt",
    ):
        assert secret not in text, secret
    assert json.loads(text.splitlines()[0])["redactions"] == ["paths", "prompts"]
    export = tmp_path / "redacted.jsonl"
    export.write_bytes(out)
    copy = tmp_path / "redacted.db"
    status, _, err = _hostler(capsysbinary, "import", str(export), "--db", str(copy))
    assert status == 0 and "redactions: paths, prompts" in err
    original, redacted = _table(recorded), _table(copy)
    assert [r[:5] + r[6:] for r in redacted] == [r[:5] + r[6:] for r in original]
    changed = [
        (o[3], key)
        for o, r in zip(original, redacted, strict=True)
        for key, value in json.loads(o[5]).items()
        if json.loads(r[5])[key] != value
    ]
    allowed = {
        ("queue.enqueued", "session_id"),
        ("queue.enqueued", "label"),
        ("router.bound", "session"),
        ("lease.requested", "holder"),
        ("engine.failed", "error"),
        ("engine.crashed", "panic_line"),
        ("engine.crashed", "output_tail"),
        ("calibration.measured", "model"),  # the model's file name
        ("calibration.measured", "build"),  # the engine binary's path
        ("engine.spawned", "launched"),  # the launch's model, work dir and binary paths
    }
    assert set(changed) <= allowed
    assert {("queue.enqueued", "label"), ("router.bound", "session")} <= set(changed)
    differ = _differences(_snapshot(recorded), _snapshot(copy))
    # the lifecycles fold the same otherwise; the launch record's paths (engine.spawned v3)
    assert differ == {"last_error", "holder", "model", "work_dir"}
    rows = [json.loads(line) for line in text.splitlines()[1:-1]]
    crashed = next(r for r in rows if r["type"] == "engine.crashed")["payload"]
    assert crashed["output_tail"] == "<redacted>"
    assert re.fullmatch(r"GGML_ASSERT failed at <path:\d+>\.c:123", crashed["panic_line"])
    failed = next(r for r in rows if r["type"] == "engine.failed")["payload"]
    found = re.fullmatch(r"<path:(\d+)>\.bin: cannot open <path:(\d+)>\.so", failed["error"])
    assert found is not None and found.group(1) != found.group(2)
    builds = {r["payload"]["build"] for r in rows if r["type"] == "calibration.measured"}
    assert len(builds) == 1 and re.fullmatch(r"<path:\d+>", builds.pop())  # one binary, one name
    bound = [r["payload"]["session"] for r in rows if r["type"] == "router.bound"]
    assert bound == ["<session:1>", "<session:2>", "<session:3>"]
    asked = [r["payload"] for r in rows if r["type"] == "queue.enqueued"]
    assert [a["session_id"] for a in asked] == ["<session:1>", "<session:3>"]
    assert {a["label"] for a in asked} == {"<redacted>"}


def test_paths_only_keeps_sessions_and_labels(
    recorded: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    status, out, _ = _hostler(capsysbinary, "export", str(recorded), "--redact", "paths")
    text = out.decode()
    assert status == 0 and str(recorded.parent) not in text
    assert "session-of-alice" in text and "alice asks" in text
    assert "user: alice asks about <path:" in text  # an output tail keeps its words


def test_export_pages_through_the_log(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "paged.db"
    with EventStore.open(source) as store:
        for n in range(7):
            store.append(
                f"engine/e:m:{n}",
                [EngineFailed("a", "b", 1.0, "e", None, None)],
                expected_version=0,
            )
    monkeypatch.setattr("hostler.store.reader._PAGE", 3)  # seven rows: pages of 3, 3 and 1
    status, out, _ = _hostler(capsysbinary, "export", str(source))
    lines = [json.loads(line) for line in out.splitlines()]
    assert status == 0 and [line["seq"] for line in lines[1:-1]] == list(range(1, 8))
    assert lines[-1]["rows"] == 7


def test_selection_and_header(recorded: Path, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    rows = _table(recorded)
    middle = rows[len(rows) // 2]
    status, out, _ = _hostler(capsysbinary, "export", str(recorded), "--after-seq", str(middle[0]))
    lines = [json.loads(line) for line in out.splitlines()]
    assert status == 0
    assert [line["seq"] for line in lines[1:-1]] == [r[0] for r in rows if r[0] > middle[0]]
    assert lines[0]["selection"]["after_seq"] == middle[0]
    assert lines[0]["source"]["rows"] == len(rows)  # the source, not the selection
    assert lines[-1]["rows"] == len(lines) - 2
    status, out, _ = _hostler(
        capsysbinary, "export", str(recorded), "--since", middle[7], "--until", middle[7]
    )
    picked = [json.loads(line)["seq"] for line in out.splitlines()[1:-1]]
    assert picked == [r[0] for r in rows if r[7] == middle[7]] and middle[0] in picked
    status, _, err = _hostler(capsysbinary, "export", str(recorded), "--db", str(recorded))
    assert status == 2 and "give the log once" in err


# -- damaged rows, unknown types -------------------------------------------------------------


def _damaged_log(path: Path) -> list[tuple[Any, ...]]:
    with EventStore.open(path) as store:
        store.append(
            "engine/ballast:m:0",
            [EngineFailed("a", "b", 1.0, "/home/me/model.gguf: gone", None, None)],
            expected_version=0,
        )
    with sqlite3.connect(path) as conn:
        insert = (
            "INSERT INTO events (stream_id, version, type, schema_version, payload, metadata, "
            "recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
        )
        conn.execute(
            insert,
            (
                "engine/ballast:m:0",
                2,
                "engine.failed",
                1,
                "{not json /home/me/x",
                '{"actor":"t"}',
                "2026-01-01T00:00:00.000000Z",
            ),
        )
        conn.execute(
            insert, ("engine/ballast:m:0", 3, "engine.ready", 1, '{"at":1.0}', "[1]", "yesterday")
        )
        conn.execute(
            insert,
            (
                "plugin/x",
                1,
                "plugin.secret",
                3,
                '{"note":"/home/me/p.txt"}',
                "{}",
                "2026-01-01T00:00:01.000000Z",
            ),
        )
        conn.execute(
            insert,
            (
                "engine/ballast:m:0",
                "four",
                "engine.ready",
                1,
                '{"at":2.0}',
                "{}",
                "2026-01-01T00:00:02.000000Z",
            ),
        )
    return _table(path)


def test_damaged_and_unknown_rows_are_exported_as_they_are(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    source = tmp_path / "damaged.db"
    rows = _damaged_log(source)
    status, out, err = _hostler(capsysbinary, "export", str(source))
    assert status == 1  # as `hostler events`: damaged rows are named, and the status says so
    assert err.count("[store.damaged-row]") == 3
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[-1] == {"end": "hostler-events", "rows": 5, "damaged": 3}
    bad = lines[2]
    assert bad["raw"] is True and bad["payload"] == "{not json /home/me/x"
    assert bad["damaged"] == "payload is not JSON"
    assert lines[3]["metadata"] == "[1]" and lines[3]["recorded_at"] == "yesterday"
    assert lines[4]["payload"] == {"note": "/home/me/p.txt"} and "raw" not in lines[4]
    assert lines[5]["version"] == "four"
    export = tmp_path / "damaged.jsonl"
    export.write_bytes(out)
    copy = tmp_path / "copy.db"
    assert _hostler(capsysbinary, "import", str(export), "--db", str(copy))[0] == 0
    assert _table(copy) == rows
    status, before, _ = _hostler(capsysbinary, "events", "--db", str(source), "--json")
    assert status == 1
    assert _hostler(capsysbinary, "events", "--db", str(copy), "--json")[1] == before


def test_a_real_process_exports_to_stdout_and_imports_the_file(tmp_path: Path) -> None:
    source = tmp_path / "damaged.db"
    rows = _damaged_log(source)
    result = run_cli("export", str(source), "--redact", "none")
    assert result.returncode == 1  # damaged rows, named; never a traceback
    assert "Traceback" not in result.stderr
    assert result.stderr.count("hostler: warning [store.damaged-row]:") == 3
    lines = result.stdout.splitlines()
    assert len(lines) == 7 and json.loads(lines[-1])["damaged"] == 3
    export = tmp_path / "e.jsonl"
    export.write_text(result.stdout)
    copy = tmp_path / "copy.db"
    result = run_cli("import", str(export), "--db", str(copy))
    assert result.returncode == 0, result.stderr
    assert _table(copy) == rows


def test_redaction_of_damaged_and_unknown_rows(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    source = tmp_path / "damaged.db"
    _damaged_log(source)
    _, out, _ = _hostler(capsysbinary, "export", str(source), "--redact", "prompts,paths")
    assert b"/home/me" not in out
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[1]["payload"]["error"] == "<path:1>.gguf: gone"
    assert lines[2]["payload"] == "<redacted>"  # unreadable text cannot be classified
    assert lines[4]["payload"] == {"note": "<redacted>"}  # an unknown type's text goes
    export = tmp_path / "r.jsonl"
    export.write_bytes(out)
    copy = tmp_path / "r.db"
    assert _hostler(capsysbinary, "import", str(export), "--db", str(copy))[0] == 0
    with EventStore.open(copy) as store:
        damaged = [r.seq for r in store.read_all() if r.damage]
    assert damaged == [2, 3, 5]  # still damaged after the import, never silently "fixed"


# -- import refusals ---------------------------------------------------------------------------


@pytest.fixture
def good_lines(tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]) -> list[bytes]:
    source = tmp_path / "small.db"
    with EventStore.open(source) as store:
        for n in range(3):
            store.append(
                f"engine/ballast:m:{n}",
                [EngineFailed("a", "b", float(n), "e", None, None)],
                expected_version=0,
            )
    status, out, _ = _hostler(capsysbinary, "export", str(source))
    assert status == 0
    return out.splitlines(keepends=True)


def _import(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes], lines: list[bytes]
) -> tuple[int, str, Path]:
    export = tmp_path / "in.jsonl"
    export.write_bytes(b"".join(lines))
    target = tmp_path / "target.db"
    status, _, err = _hostler(capsysbinary, "import", str(export), "--db", str(target))
    return status, err, target


def _edit(line: bytes, **changes: Any) -> bytes:
    value = json.loads(line)
    value.update(changes)
    return json.dumps(value).encode() + b"\n"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda ls: ls[1:], "line 1: no hostler-events header"),
        (lambda ls: [_edit(ls[0], format_version=2), *ls[1:]], "line 1: format version 2"),
        (lambda ls: [_edit(ls[0], format_version=True), *ls[1:]], "line 1: format version True"),
        (lambda ls: [ls[0], ls[1], b"{oops\n", *ls[2:]], "line 3: not JSON"),
        (lambda ls: [ls[0], ls[1], b"[1]\n", *ls[2:]], "line 3: not a JSON object"),
        (lambda ls: [ls[0], b"\n", *ls[1:]], "line 2: empty"),
        (lambda ls: [ls[0], ls[2], ls[1], *ls[3:]], "line 3: seq 1 does not follow seq 2"),
        (lambda ls: [ls[0], _edit(ls[1], seq=0), *ls[2:]], "line 2: seq 0 is not a whole"),
        (lambda ls: [ls[0], _edit(ls[1], version="1"), *ls[2:]], "line 2: version '1'"),
        (lambda ls: [ls[0], _edit(ls[1], payload=[]), *ls[2:]], "line 2: payload and metadata"),
        (lambda ls: [ls[0], _edit(ls[1], recorded_at="soon"), *ls[2:]], "line 2: recorded_at"),
        (lambda ls: [ls[0], _edit(ls[1], extra=1), *ls[2:]], "line 2: unknown field 'extra'"),
        (lambda ls: [ls[0], _edit(ls[1], damaged="x"), *ls[2:]], "line 2: damaged without raw"),
        (lambda ls: [ls[0], _edit(ls[1], stream_id=""), *ls[2:]], "line 2: stream_id is not"),
        (lambda ls: ls[:-1], "ends after line 4 without its end line"),
        (lambda ls: [*ls[:-2], ls[-1]], "line 4: the end line counts 3 rows, the file holds 2"),
        (lambda ls: [*ls, ls[1]], "line 6: a line after the end line"),
        (
            lambda ls: [
                ls[0],
                ls[1],
                _edit(ls[2], stream_id=json.loads(ls[1])["stream_id"]),
                *ls[3:],
            ],
            "seq 2: stream 'engine/ballast:m:0' has version 1 twice",
        ),
    ],
)
def test_a_bad_file_is_refused_in_one_line_and_nothing_is_imported(
    tmp_path: Path,
    capsysbinary: pytest.CaptureFixture[bytes],
    good_lines: list[bytes],
    mutate: Any,
    message: str,
) -> None:
    status, err, target = _import(tmp_path, capsysbinary, mutate(good_lines))
    assert status == 1
    assert err.startswith("hostler: error [export.format]: ") and message in err, err
    assert err.count("\n") == 1 and "nothing was imported" in err
    assert not target.exists()  # the log this import created is removed again
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "small.db"]


def test_the_good_file_imports(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes], good_lines: list[bytes]
) -> None:
    status, err, target = _import(tmp_path, capsysbinary, good_lines)
    assert status == 0, err
    assert [row[0] for row in _table(target)] == [1, 2, 3]


def test_import_refuses_a_log_that_holds_events_and_fills_an_empty_one(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes], good_lines: list[bytes]
) -> None:
    target = tmp_path / "target.db"
    with EventStore.open(target):
        pass  # exists, migrated, empty: fine
    status, err, _ = _import(tmp_path, capsysbinary, good_lines)
    assert status == 0, err
    before = _table(target)
    status, err, _ = _import(tmp_path, capsysbinary, good_lines)
    assert status == 1
    assert err == (
        f"hostler: error [store.not-empty]: {target}: holds 3 events; import fills an empty "
        "log only (give a new file to --db); nothing was written\n"
    )
    assert _table(target) == before and target.exists()


def test_an_over_long_line_is_refused_without_reading_it_whole(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes], good_lines: list[bytes]
) -> None:
    assert MAX_LINE_BYTES == 16 * 2**20
    assert FORMAT_VERSION == 1
    huge = b'{"seq":' + b" " * MAX_LINE_BYTES + b"4}\n"
    status, err, target = _import(tmp_path, capsysbinary, [good_lines[0], huge, *good_lines[1:]])
    assert status == 1 and "line 2: longer than 16 MiB" in err and not target.exists()

    class Counting:
        def __init__(self, data: bytes) -> None:
            self.data, self.read = data, 0

        def readline(self, size: int) -> bytes:
            piece = self.data[self.read : self.read + size]
            cut = piece.find(b"\n")
            piece = piece if cut < 0 else piece[: cut + 1]
            self.read += len(piece)
            return piece

    stream = Counting(good_lines[0] + huge * 3)
    lines = _Lines(stream)  # type: ignore[arg-type]
    lines.header()
    with pytest.raises(ExportFormatError, match="line 2: longer than"):
        list(lines.rows())
    assert stream.read == len(good_lines[0]) + MAX_LINE_BYTES + 1
    exactly = b'{"x":"' + b"a" * (MAX_LINE_BYTES - 8) + b'"}\n'
    assert len(exactly) == MAX_LINE_BYTES + 1  # the limit counts the line, not its newline
    assert _Lines(Counting(exactly)).next() == exactly  # type: ignore[arg-type]


def test_import_reads_stdin_and_refuses_an_unreadable_file(
    tmp_path: Path,
    good_lines: list[bytes],
    capsysbinary: pytest.CaptureFixture[bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Stdin:
        buffer = io.BytesIO(b"".join(good_lines))

    monkeypatch.setattr("sys.stdin", Stdin())
    target = tmp_path / "piped.db"
    status, _, err = _hostler(capsysbinary, "import", "-", "--db", str(target))
    assert status == 0, err
    assert len(_table(target)) == 3
    status, _, err = _hostler(
        capsysbinary, "import", str(tmp_path / "nope.jsonl"), "--db", str(tmp_path / "n.db")
    )
    assert status == 2 and err.startswith("hostler: error [usage.invalid]: ")
    assert "nope.jsonl: cannot read (No such file or directory)" in err
    assert not (tmp_path / "n.db").exists()
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    status, _, err = _hostler(capsysbinary, "import", str(empty), "--db", str(tmp_path / "e.db"))
    assert status == 1 and "[export.format]: the file is empty" in err
    assert not (tmp_path / "e.db").exists()


# -- -o FILE ---------------------------------------------------------------------------------


def test_output_file_is_written_atomically(
    recorded: Path, tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    target = tmp_path / "out.jsonl"
    target.write_text("the previous export\n")
    status, out, err = _hostler(capsysbinary, "export", str(recorded), "-o", str(target))
    assert status == 0 and out == b""
    rows = len(_table(recorded))
    assert err == f"hostler: exported {rows} rows to {target}\n"
    assert len(target.read_bytes().splitlines()) == rows + 2
    assert (target.stat().st_mode & 0o777) == 0o600  # an export may hold what users wrote
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]  # no temp file left
    status, _, err = _hostler(
        capsysbinary, "export", str(recorded), "-o", str(tmp_path / "no" / "such.jsonl")
    )
    assert status == 2 and err.startswith("hostler: error [usage.invalid]: ")
    assert "cannot write here (No such file or directory)" in err


def test_a_failed_export_leaves_the_previous_file(
    recorded: Path,
    tmp_path: Path,
    capsysbinary: pytest.CaptureFixture[bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    target = tmp_path / "out.jsonl"
    target.write_text("the previous export\n")

    def broken(*_args: Any, **_kwargs: Any) -> Iterator[Any]:
        yield from ()
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(EventStore, "read_stored", broken)
    status, _, err = _hostler(capsysbinary, "export", str(recorded), "-o", str(target))
    assert status == 1 and "cannot write (No space left on device)" in err
    assert err.startswith("hostler: error [output.failed]: ")
    assert target.read_text() == "the previous export\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]


def test_export_of_a_missing_log_is_one_line(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    status, out, err = _hostler(capsysbinary, "export", str(tmp_path / "none.db"))
    assert status == 1 and out == b""
    assert err.startswith("hostler: error [store.error]: ") and "no event log here" in err
    assert not (tmp_path / "none.db").exists()
    assert list(tmp_path.iterdir()) == []


def test_an_import_removes_a_snapshot_cache_left_at_its_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: a redacted import at a path whose old log had a cache was answered from that cache."""
    path = _log(tmp_path / "events.db")
    assert main(["export", str(path), "-o", str(tmp_path / "e.jsonl")]) == 0
    target = tmp_path / "new.db"
    stale = tmp_path / "new.db.snapshots"
    stale.write_bytes(b"a cache of another log")
    assert main(["import", str(tmp_path / "e.jsonl"), "--db", str(target)]) == 0
    assert not stale.exists()
    capsys.readouterr()


def _small_files(limit: int = 33_000) -> None:
    """In the child: files may grow to ``limit`` bytes (EFBIG past it, as on a full disk).

    The log's shared-memory file (32 KiB) still fits; the export and the picture do not.
    """
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_a_full_disk_is_one_line_and_leaves_no_half_file(tmp_path: Path) -> None:
    """Was: an OSError traceback (stdout), usage.invalid (export -o), a half PNG (timeline)."""
    import subprocess
    import sys

    path = _log(tmp_path / "events.db", notes=600)
    base = [sys.executable, "-c", "import sys; from hostler.cli import main; sys.exit(main())"]
    with Path("/dev/full").open("wb") as full:
        to_full = subprocess.run(
            [*base, "export", str(path)],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
    assert to_full.returncode == 1
    assert to_full.stderr.endswith(
        "hostler: error [output.failed]: standard output: cannot write (No space left on device)\n"
    )
    for argv, made in (
        (["export", str(path), "-o", str(tmp_path / "e.jsonl")], tmp_path / "e.jsonl"),
        (
            ["timeline", str(path), "-o", str(tmp_path / "t.png"), "--width", "2400"],
            tmp_path / "t.png",
        ),
    ):
        done = subprocess.run(
            [*base, *argv],
            preexec_fn=_small_files,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 1, done.stderr
        last = done.stderr.splitlines()[-1]
        assert last.startswith("hostler: error [output.failed]: ") and "File too large" in last
        assert "Traceback" not in done.stderr
        assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp file
        assert not made.exists()
