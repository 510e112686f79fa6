"""``hostler ps``: what the running ``hostler serve`` holds, like ``ollama ps`` and a bit more."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any
from urllib.parse import quote

import httpx

from hostler.cli.common import data_directory
from hostler.errors import DaemonUnreachableError
from hostler.paths import default_data_dir

__all__ = ["DEFAULT_URL", "add_parser", "fetch", "post", "run"]

DEFAULT_URL = "http://127.0.0.1:11435"


def _client_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", default=DEFAULT_URL, help=f"where hostler serve listens (default {DEFAULT_URL})"
    )
    parser.add_argument(
        "--token", help="the daemon's token (default: read from --data-dir's 'token' file)"
    )
    parser.add_argument("--data-dir", type=data_directory, help="the daemon's data directory")


def _token(args: argparse.Namespace) -> str | None:
    if args.token:
        return str(args.token)
    folder = args.data_dir or default_data_dir()
    path = folder / "token"
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def add_parser(sub: Any) -> None:
    """Register ``ps``, ``load`` and ``unload``."""
    load = sub.add_parser("load", help="load a model in the running `hostler serve` now")
    load.add_argument("model", help="a model id (as /v1/models lists it)")
    _client_options(load)
    load.set_defaults(run=run_load)
    unload = sub.add_parser("unload", help="unload an idle engine of the running `hostler serve`")
    unload.add_argument("key", help="an engine key (as `hostler ps` lists it)")
    _client_options(unload)
    unload.set_defaults(run=run_unload)
    parser: argparse.ArgumentParser = sub.add_parser(
        "ps", help="the engines the running `hostler serve` holds, their memory and queues"
    )
    _client_options(parser)
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(run=run)


def fetch(url: str, path: str, token: str | None = None) -> Any:
    """GET ``path`` from the daemon as JSON.

    Raises:
        DaemonUnreachableError: Nothing answers there, or it answered with an error.
    """
    return _call("GET", url, path, token, timeout=10)


def post(url: str, path: str, token: str | None) -> Any:
    """POST ``path`` to the daemon (a load may take minutes); its JSON answer.

    Raises:
        DaemonUnreachableError: Nothing answers there, or it answered with an error.
    """
    return _call("POST", url, path, token, timeout=600)


def _call(method: str, url: str, path: str, token: str | None, *, timeout: float) -> Any:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.request(method, url.rstrip("/") + path, headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        raise DaemonUnreachableError(
            f"no hostler serve answers at {url[:200]} ({type(exc).__name__}); start it with "
            "`hostler serve`, or give --url"
        ) from None
    if response.status_code != 200:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:200]
        raise DaemonUnreachableError(f"{url[:200]}{path}: {response.status_code}: {message}")
    return response.json()


def run_load(args: argparse.Namespace) -> int:
    """Load a model now (making room as a request would)."""
    answer = post(args.url, f"/api/models/{quote(args.model, safe='')}/load", _token(args))
    print(f"{answer['model']}: loaded as {answer['key']}")
    return 0


def run_unload(args: argparse.Namespace) -> int:
    """Unload an idle engine now."""
    answer = post(args.url, f"/api/engines/{quote(args.key, safe=':')}/unload", _token(args))
    print(f"{answer['key']}: {'unloaded' if answer['unloaded'] else 'was not loaded'}")
    return 0


def _size(value: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


def _ago(moment: float, now: float) -> str:
    seconds = max(now - moment, 0.0)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def run(args: argparse.Namespace) -> int:
    """Print the engines, their memory, their slots and their queues."""
    engines = fetch(args.url, "/api/engines", _token(args))
    queues = fetch(args.url, "/api/queues", _token(args))
    if args.json:
        summary = {
            "engines": engines["engines"],
            "queues": queues,
            "sessions": engines.get("sessions"),
            "ledger": engines.get("ledger"),
        }
        print(json.dumps(summary, indent=2))
        return 0
    now = time.time()
    header = (
        f"{'ENGINE':<32} {'STATE':<9} {'PID':>7} {'MEMORY':>10} {'SLOTS':>7} "
        f"{'QUEUED':>6} {'HITS/1m':>7} {'IDLE':>6} FLAGS"
    )
    print(header)
    for engine in engines["engines"]:
        queue = queues.get(engine["key"]) or {}
        running = queue.get("running", 0)
        width = queue.get("width")
        slots = f"{running}/{width}" if width else "-"
        flags = [name for name in ("pinned", "draining", "busy") if engine.get(name)]
        print(
            f"{engine['key'][:32]:<32} {engine['state']:<9} {engine.get('pid') or '-':>7} "
            f"{_size(engine['bytes']):>10} {slots:>7} {len(queue.get('pending', [])):>6} "
            f"{engine['recent_hits']:>7} {_ago(engine['last_used_at'], now):>6} "
            f"{','.join(flags) or '-'}"
        )
    ledger = engines.get("ledger") or {}
    if ledger:
        print(f"\ncommitted {_size(ledger.get('committed') or 0)} in the host ledger")
    return 0
