"""Test-only event types and helpers."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hostler import Event, EventStore, event_type, upcaster

REPO = Path(__file__).resolve().parent.parent

#: The capacity modules of the pure core (the rest of capacity/ reads files it is handed).
PURE_CAPACITY_NAMES = (
    "bounds",
    "budget",
    "context",
    "estimate",
    "geometry",
    "keys",
    "kv",
    "kvtrade",
    "learning",
    "ledger",
    "offload",
    "origin",
    "overrides",
    "plan",
    "pricing",
    "slots",
    "swa",
    "units",
    "victims",
)


@event_type("test.note")
@dataclass(frozen=True, slots=True)
class Note(Event):
    """A free-form test event."""

    text: str
    n: int = 0


@event_type("test.resized", schema_version=3)
@dataclass(frozen=True, slots=True)
class Resized(Event):
    """v3 payload: ``bytes`` and ``unit``; v1 had ``mib``; v2 had ``bytes`` only."""

    bytes: int
    unit: str


@upcaster("test.resized", from_version=1)
def _resized_v1_v2(payload: dict[str, object]) -> dict[str, object]:
    mib = payload.pop("mib")
    assert isinstance(mib, int)
    payload["bytes"] = mib * 1024 * 1024
    return payload


@upcaster("test.resized", from_version=2)
def _resized_v2_v3(payload: dict[str, object]) -> dict[str, object]:
    payload["unit"] = "B"
    return payload


# Root ignores file modes; without these capabilities it obeys them like any user.
_DROP_ROOT_POWERS = [
    "setpriv",
    "--bounding-set=-dac_override,-dac_read_search,-fowner",
    "--inh-caps=-dac_override,-dac_read_search,-fowner",
]


def run_python(
    code: str,
    *args: str,
    timeout: float = 60,
    cwd: Path | None = None,
    obey_file_modes: bool = False,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter of this environment (a new process).

    ``env`` is laid over this process's environment, less ``COLUMNS`` and ``LINES``: the size of
    whatever terminal ran the tests (pytest-xdist's workers set 80 columns) must not change a
    table the test reads; a test that wants a width sets it in ``env``.

    ``obey_file_modes`` makes a root caller's child obey permission bits, as a normal user's
    would, so tests of unwritable paths mean the same as root and as a user.
    """
    prefix = _DROP_ROOT_POWERS if obey_file_modes and os.geteuid() == 0 else []
    return subprocess.run(
        [*prefix, sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd or REPO / "tests",
        env={**untermed(os.environ), "PYTHONDONTWRITEBYTECODE": "1", **(env or {})},
    )


def untermed(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` less ``COLUMNS`` and ``LINES`` (a table at its no-terminal width)."""
    return {name: value for name, value in environ.items() if name not in ("COLUMNS", "LINES")}


def run_cli(
    *args: str,
    timeout: float = 60,
    obey_file_modes: bool = False,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the ``hostler`` CLI as a user would (a real process)."""
    return run_python(
        "import sys; from hostler.cli import main; sys.exit(main())",
        *args,
        timeout=timeout,
        obey_file_modes=obey_file_modes,
        env=env,
        cwd=cwd,
    )


def cli_env(tmp_path: Path) -> dict[str, str]:
    """A private HOME and data directory for one CLI run (never the user's)."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {
        "HOME": str(home),
        "HOSTLER_HOME": str(home / "data"),
        "XDG_DATA_HOME": str(home / "xdg"),
        "HOSTLER_LEDGER": str(home / "ledger.db"),
    }


def assert_one_line_error(done: subprocess.CompletedProcess[str]) -> None:
    """Promise 9: a refused input is ONE line `hostler: error [...]`, never a traceback."""
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.returncode not in (0, None), done.stdout[-500:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("hostler: error"), done.stderr[-2000:]


def notes_log(path: Path, notes: int = 6) -> Path:
    """``notes`` rows, the third on an engine's stream (a stream ``state`` folds)."""
    with EventStore.open(path) as store:
        for n in range(notes):
            stream = "engine/llamacpp:m:0" if n == 2 else f"test/{n}"
            store.append(stream, [Note(f"n{n}")], expected_version=0)
    return path


#: A JSON object nested deeper than the log's reader follows.
DEEP = '{"d":' + "[" * 1000 + "]" * 1000 + "}"


def step_the_clock(monkeypatch: Any, seconds: float) -> None:
    """What setting the system clock does to the start times psutil reports (Linux).

    psutil derives a process's wall-clock start from the boot time in ``/proc/stat``; the
    kernel moves that boot time whenever the system clock is set (NTP stepping a clock that
    was wrong, an operator's ``date -s``, a VM restored from a snapshot). The kernel's own
    count of ticks since boot does not move.
    """
    from psutil import _pslinux

    stepped = _pslinux.boot_time() + seconds
    monkeypatch.setattr(_pslinux, "boot_time", lambda: stepped)


_RAW_INSERT = (
    "INSERT INTO events (stream_id, version, type, schema_version, payload, metadata, "
    "recorded_at) VALUES (:stream, :version, :type, :schema, :payload, '{}', "
    "'2026-01-01T00:00:00.000000Z')"
)


def insert_raw(
    target: str | Path,
    stream: str,
    version: int,
    type_name: str,
    payload: str,
    *,
    schema_version: int = 1,
) -> None:
    """Insert one row behind hostler's back, as another program would (SQLite or PostgreSQL)."""
    import sqlalchemy as sa

    text = str(target)
    url = text if "://" in text else f"sqlite:///{text}"
    statement = _RAW_INSERT.replace(":payload", "CAST(:payload AS json)", 1)
    if not url.startswith("postgresql"):
        statement = _RAW_INSERT
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text(statement),
                {
                    "stream": stream,
                    "version": version,
                    "type": type_name,
                    "schema": schema_version,
                    "payload": payload,
                },
            )
    finally:
        engine.dispose()
