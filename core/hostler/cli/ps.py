"""``hostler ps``: what the running ``hostler serve`` holds, like ``ollama ps`` and a bit more."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from hostler.cli.client import (
    DEFAULT_URL,
    checks_answers,
    daemon_url,
    fetch,
    post,
    token_of,
)
from hostler.cli.load import model_of
from hostler.cli.tables import duration, print_table, size, table

__all__ = [
    "CACHE_HEADERS",
    "DEFAULT_URL",
    "PS_HEADERS",
    "cache_rows",
    "fetch",
    "post",
    "ps_rows",
    "run",
]

#: The table's columns, in order (pinned by the tests: scripts may rely on them).
PS_HEADERS = (
    "KEY",
    "MODEL",
    "STATE",
    "FOR",
    "PID",
    "PORT",
    "RESERVED",
    "MEASURED",
    "SLOTS",
    "QUEUED",
    "IDLE STOP",
    "LEASE",
    "REASON",
)
_RIGHT = ("FOR", "PID", "PORT", "RESERVED", "MEASURED", "SLOTS", "QUEUED", "IDLE STOP")
#: What a narrow terminal loses first (``--wide`` shows all): the port and pid are for
#: debugging, the measured bytes and the lease are in ``--json``, the model is in the key.
_DROP = ("PORT", "MEASURED", "LEASE", "PID", "MODEL", "QUEUED", "FOR")
#: Then the reason, and at last the key, are cut (with ``…``) to no less than this.
_CUT = {"REASON": 20, "KEY": 20}


def _lease(value: Any) -> str:
    if not isinstance(value, Mapping):
        return "-"
    holder = str(value.get("holder"))
    return holder if value.get("slot") == "llm" else f"{value.get('slot')}:{holder}"


def _idle_stop(engine: Mapping[str, Any], now: float) -> str:
    deadline = engine.get("idle_deadline")
    if deadline is None:
        return "-"
    if engine.get("busy"):
        return "busy"
    left = deadline - now
    return f"in {duration(left)}" if left > 0 else "due"


def _state(engine: Mapping[str, Any]) -> str:
    """The engine's state, with its current job's progress while it has one (PG1)."""
    state = str(engine["state"])
    step = engine.get("progress")
    if not isinstance(step, Mapping):
        return state
    return f"{state} {step.get('done')}/{step.get('total')} {str(step.get('unit'))[:20]}"


def ps_rows(engines: Mapping[str, Any], queues: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """One row of :data:`PS_HEADERS` per engine (``engines``: ``GET /api/engines``)."""
    now = float(engines.get("now") or 0.0)
    rows: list[tuple[str, ...]] = []
    for engine in engines["engines"]:
        queue = queues.get(engine["key"]) or {}
        slots = engine.get("slots")  # as launched (--parallel), not the queue's width
        since = engine.get("state_since")
        reserved = engine.get("reserved_bytes")
        rows.append(
            (
                str(engine["key"]),
                model_of(str(engine["key"])),
                _state(engine),
                "-" if since is None or not now else duration(now - since),
                str(engine.get("pid") or "-"),
                str(engine.get("port") or "-"),  # the engine's own loopback port
                size(reserved if reserved is not None else engine.get("bytes") or None),
                size(engine.get("measured_bytes")),
                f"{queue.get('running', 0)}/{slots}" if slots else "-",
                str(len(queue.get("pending", []))),
                _idle_stop(engine, now),
                _lease(engine.get("lease")),
                str(engine.get("last_reason") or "-"),
            )
        )
    return rows


@checks_answers
def run(args: argparse.Namespace) -> int:
    """Print the engines, their memory, their slots and their queues."""
    url, token = daemon_url(args), token_of(args)
    assert url is not None  # noqa: S101 - a default is given
    engines = fetch(url, "/api/engines", token)
    queues = fetch(url, "/api/queues", token)
    told = fetch(url, "/api/cache", token)
    caches = told.get("caches") if isinstance(told, Mapping) else None
    caches = caches if isinstance(caches, list) else []
    if args.json:
        summary = {
            "engines": engines["engines"],
            "queues": queues,
            "sessions": engines.get("sessions"),
            "ledger": engines.get("ledger"),
            "caches": caches,
        }
        print(json.dumps(summary, indent=2))
        return 0
    grid = table(PS_HEADERS, _RIGHT, drop=_DROP, cut=_CUT)
    for row in ps_rows(engines, queues):
        grid.add_row(*row)
    print_table(grid, wide=args.wide)
    ledger = engines.get("ledger") or {}
    if ledger:
        print(f"\ncommitted {size(ledger.get('committed') or 0)} in the host ledger")
    if not engines["engines"]:
        print("(no engines: the daemon serves no model yet)")
    if caches:
        print("\nprompt caches (sessions held or saved to disk, against each engine's budget):")
        grid = table(CACHE_HEADERS, CACHE_HEADERS[1:], drop=_CACHE_DROP, cut={"KEY": 20})
        for row in cache_rows(caches):
            grid.add_row(*row)
        print_table(grid, wide=args.wide)
    return 0


#: The prompt-cache table's columns (CC10, CC14).
CACHE_HEADERS = ("KEY", "SESSIONS", "FILES", "ON DISK", "COUNTED", "BUDGET", "HITS", "MISSES")
_CACHE_DROP = ("FILES", "MISSES", "HITS", "ON DISK")


def cache_rows(caches: list[Any]) -> list[tuple[str, ...]]:
    """One row of :data:`CACHE_HEADERS` per engine (``caches``: ``GET /api/cache``)."""
    rows: list[tuple[str, ...]] = []
    for stats in caches:
        if not isinstance(stats, Mapping):
            continue
        rows.append(
            (
                str(stats.get("key")),
                str(stats.get("entries", 0)),
                str(stats.get("files", 0)),
                size(int(stats.get("file_bytes") or 0)),
                size(int(stats.get("total_bytes") or 0)),
                size(int(stats.get("budget") or 0)),
                str(stats.get("hits", 0)),
                str(stats.get("misses", 0)),
            )
        )
    return rows
