"""The CLI's start: CPU (user + sys) of ``hostler --help``, every ``--help`` and ``hostler ps``.

Each command runs as a real process (``python -m hostler ...``), ``--rounds`` times; the median
of its children's CPU time (``os.wait4``) is reported. ``hostler ps`` asks a stand-in daemon in
this process (the answers of a daemon with two engines), so its figure is the whole command:
start, three requests, the table. ``tests/test_cli_start.py`` holds the result by what each
command imports.

Run: ``python3 dev.py run python bench/cli_start.py`` (``--rounds N``). Writes
``bench/out/cli_start.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from hostler.cli import COMMANDS as CLI_COMMANDS

OUT = Path(__file__).parent / "out"
#: Every subcommand the CLI registers (its own list), and a verb's parser.
COMMANDS = (*(name for _, _, names in CLI_COMMANDS for name in names), "engine build")

_ENGINE = {
    "state": "running", "bytes": 450 * 2**20, "last_used_at": 0.0, "recent_hits": 0,
    "busy": False, "draining": False, "pinned": False, "port": 40001, "pid": 4242,
    "progress": None, "state_since": 990.0, "idle_deadline": 1290.0,
    "last_reason": "started (one-shot)", "reserved_bytes": 450 * 2**20,
    "measured_bytes": 401 * 2**20, "lease": None, "slots": 1,
}  # fmt: skip
ANSWERS: dict[str, Any] = {
    "/api/engines": {
        "engines": [
            {**_ENGINE, "key": "llamacpp:alpha:0"},
            {
                **_ENGINE,
                "key": "llamacpp:beta:0",
                "state": "stopped",
                "pid": None,
                "port": None,
                "slots": None,
                "last_reason": "evicted for llamacpp:alpha:0",
            },
        ],
        "sessions": {},
        "ledger": {"committed": 401 * 2**20},
        "closed": False,
        "now": 1000.0,
        "last_seq": 42,
    },
    "/api/queues": {"llamacpp:alpha:0": {"running": 0, "width": 2, "pending": []}},
    "/api/cache": {"caches": []},
}


class _Daemon(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps(ANSWERS.get(self.path.split("?")[0], {})).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        del format, args  # quiet


def cpu_of(argv: list[str]) -> float:
    """User + sys CPU seconds of one run of ``argv`` (exit status 0 required)."""
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(argv[1:])}: exit {child.returncode}")
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    """Measure, print a table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Daemon)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    base = [sys.executable, "-m", "hostler"]
    runs = {
        "hostler --help": [*base, "--help"],
        **{f"hostler {c} --help": [*base, *c.split(), "--help"] for c in COMMANDS},
        "hostler ps": [*base, "ps", "--url", url],
    }
    cpu_of([sys.executable, "-c", "pass"])  # warm the page cache
    bare = statistics.median(cpu_of([sys.executable, "-c", "pass"]) for _ in range(args.rounds))
    figures = {"python -c pass": round(bare, 4)}
    for name, argv in runs.items():
        cpu_of(argv)  # a first run compiles and caches the bytecode
        figures[name] = round(statistics.median(cpu_of(argv) for _ in range(args.rounds)), 4)
        print(f"{name:<28} {figures[name] * 1000:7.0f} ms", flush=True)
    server.shutdown()
    print(f"{'python -c pass':<28} {bare * 1000:7.0f} ms")
    worst = max(v for k, v in figures.items() if k != "python -c pass")
    print(f"{'worst':<28} {worst * 1000:7.0f} ms (median of {args.rounds} each)")
    OUT.mkdir(exist_ok=True)
    (OUT / "cli_start.json").write_text(json.dumps({"rounds": args.rounds, **figures}, indent=2))


if __name__ == "__main__":
    main()
