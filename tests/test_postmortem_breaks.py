"""What a hostile tester broke in the post-mortem commands, each pinned before its fix.

Each test names the break: what the command did, and what it does now.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from hostler import EventStore
from hostler.cli import main

from _support import Note, run_cli

DEEP = '{"d":' + "[" * 1000 + "]" * 1000 + "}"


def _log(path: Path, notes: int = 6) -> Path:
    """``notes`` rows, the third on an engine's stream (a stream ``state`` folds)."""
    with EventStore.open(path) as store:
        for n in range(notes):
            stream = "engine/llamacpp:m:0" if n == 2 else f"test/{n}"
            store.append(stream, [Note(f"n{n}")], expected_version=0)
    return path


def _tamper(path: Path, sql: str, *args: object) -> None:
    with sqlite3.connect(path) as db:
        db.execute("DROP TRIGGER IF EXISTS events_no_update")
        db.execute(sql, args)


def test_a_row_nested_past_the_decoders_depth_is_a_damaged_row_not_a_traceback(
    tmp_path: Path,
) -> None:
    """Was: RecursionError tracebacks in events, explain, replay, whatif, timeline, export."""
    path = _log(tmp_path / "events.db")
    _tamper(path, "UPDATE events SET payload = ? WHERE seq = 3", DEEP)
    with EventStore.open(path) as store:
        rows = list(store.read_all())
    assert [r.damage for r in rows] == ["", "", "payload nests too deep to read", "", "", ""]
    for argv in (
        ["events", "--db", str(path)],
        ["state", "--db", str(path)],
        ["replay", "--verify", str(path)],
        ["whatif", str(path)],
        ["timeline", str(path), "-o", str(tmp_path / "t.svg")],
        ["export", str(path), "-o", str(tmp_path / "e.jsonl")],
    ):
        done = run_cli(*argv)
        assert "Traceback" not in done.stderr, argv
        assert f"{path}: seq 3: payload nests too deep to read" in done.stderr, argv


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


def test_an_interrupt_while_a_command_loads_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: a KeyboardInterrupt traceback when Ctrl-C came while the command's module loaded."""
    import importlib

    def interrupted(name: str) -> object:
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib, "import_module", interrupted)
    assert main(["state"]) == 130
    assert capsys.readouterr().err == "hostler: interrupted\n"


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


def test_numbers_in_other_scripts_digits_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: `--slots ٣` (Arabic-Indic three) and `KEY#٣` were read as 3."""
    path = _log(tmp_path / "events.db")
    with pytest.raises(SystemExit) as exited:
        main(["whatif", str(path), "--slots", "٣"])
    assert exited.value.code == 2
    assert "'٣' is not a whole number" in capsys.readouterr().err
    assert main(["explain", "llamacpp:m:0#٣", "--db", str(path)]) == 2
    assert "nothing in this log matches 'llamacpp:m:0#٣'" in capsys.readouterr().err
