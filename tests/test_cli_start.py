"""The CLI starts at once: ``--help`` of every command and ``hostler ps`` import nothing heavy.

Held by what a command imports, not by a timer: each probe runs the real CLI in a fresh
interpreter and reads ``sys.modules`` afterwards (``bench/cli_start.py`` measures the CPU).
"""

from __future__ import annotations

import json

from hostler.cli import COMMANDS

from _support import run_python

#: Libraries no ``--help`` may import (each costs tens to hundreds of milliseconds).
HEAVY = (
    "alembic",
    "anyio",
    "gguf",
    "httpx",
    "matplotlib",
    "msgspec",
    "numpy",
    "pluggy",
    "prometheus_client",
    "psutil",
    "pydantic",
    "rich",
    "sqlalchemy",
    "starlette",
    "transitions",
    "uvicorn",
)

#: Every ``--help`` in one interpreter: each one's newly imported heavy modules, and its text.
_HELP_PROBE = """
import contextlib, io, json, sys
from hostler.cli import main
heavy = json.loads(sys.argv[1])
found = {}
for command in json.loads(sys.argv[2]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main([*command.split(), "--help"])
        except SystemExit as exc:
            assert exc.code == 0, (command, exc.code)
    found[command] = {
        "heavy": sorted(m for m in sys.modules if m.split(".")[0] in heavy),
        "help": out.getvalue(),
    }
print(json.dumps(found))
"""


def _every_command() -> list[str]:
    return [name for _, _, names in COMMANDS for name in names]


def test_every_help_imports_no_heavy_library() -> None:
    # "": ``hostler --help``; ``engine build``: a verb's own parser
    commands = ["", *_every_command(), "engine build"]
    assert len(commands) == 23
    done = run_python(_HELP_PROBE, json.dumps(HEAVY), json.dumps(commands))
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert {c: v["heavy"] for c, v in found.items() if v["heavy"]} == {}
    assert "COMMAND" in found[""]["help"] and "budget" in found[""]["help"]
    for command in [*_every_command(), "engine build"]:
        assert found[command]["help"].startswith(f"usage: hostler {command}"), command


def test_the_probe_sees_what_a_command_body_imports() -> None:
    """The check above could pass by seeing nothing: a command that runs loads its libraries."""
    probe = (
        "import contextlib, io, sys; from hostler.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['events', '--db', sys.argv[1]])\n"
        "print(sorted(m for m in ('sqlalchemy', 'msgspec') if m in sys.modules))"
    )
    done = run_python(probe, "sqlite:///:memory:")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['msgspec', 'sqlalchemy']"


#: What ``hostler ps`` may import of hostler: its parser, its body, and what talking HTTP needs.
PS_MODULES = {
    "hostler",
    "hostler._version",
    "hostler.address",
    "hostler.bearer",
    "hostler.cli",
    "hostler.cli.client",
    "hostler.cli.load",
    "hostler.cli.numbers",
    "hostler.cli.options",
    "hostler.cli.parsers",
    "hostler.cli.parsers.ps",
    "hostler.cli.ps",
    "hostler.cli.tables",
    "hostler.errors",
    "hostler.fleet",  # the host-name check of the log options (the standard library only)
    "hostler.paths",
}


def test_ps_imports_only_what_talking_http_to_the_daemon_needs() -> None:
    probe = (
        "import json, sys; from hostler.cli import main\n"
        "status = main(['ps', '--url', sys.argv[1]])\n"
        "print(json.dumps([status, sorted(m for m in sys.modules if m.startswith('hostler')),"
        " sorted(m for m in sys.modules if m.split('.')[0] in json.loads(sys.argv[2]))]))"
    )
    # nothing listens on port 9 (discard): the command runs all the way to its first request
    done = run_python(probe, "http://127.0.0.1:9", json.dumps(HEAVY))
    assert done.returncode == 0, done.stderr
    status, hostler_modules, heavy = json.loads(done.stdout)
    assert status == 1 and "daemon.unreachable" in done.stderr
    assert heavy == []
    assert set(hostler_modules) <= PS_MODULES, set(hostler_modules) - PS_MODULES
    assert {"hostler.cli.ps", "hostler.cli.client"} <= set(hostler_modules)
