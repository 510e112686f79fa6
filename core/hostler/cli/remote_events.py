"""``hostler events --url``: the running daemon's events (``GET /api/events``), resumable.

Without ``-f`` it prints what the log holds after ``--after-seq`` up to the daemon's last seq
when asked, and ends; with ``-f`` it keeps printing each new event as it is written.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from hostler.cli.client import checks_answers, event_stream, fetch, token_of
from hostler.cli.render import TableWriter, remote_row
from hostler.errors import UsageError

__all__ = ["LOCAL_ONLY", "matches", "run"]

#: ``hostler events`` options that need the log file itself (they filter on its times).
LOCAL_ONLY = ("since", "until", "tail", "db")


def matches(event: Mapping[str, Any], args: argparse.Namespace) -> bool:
    """Whether ``event`` passes ``--type``, ``--stream`` and ``--stream-prefix``."""
    stream = str(event.get("stream", ""))
    return (
        (not args.types or event.get("type") in args.types)
        and (not args.stream or stream in args.stream)
        and (not args.stream_prefix or stream.startswith(args.stream_prefix))
    )


def _events(url: str, args: argparse.Namespace, token: str | None) -> Iterator[dict[str, Any]]:
    after = args.after_seq
    last = None
    if not args.follow:
        last = int(fetch(url, "/api/engines", token).get("last_seq") or 0)
        if last <= after:
            return
    for event in event_stream(url, after, token):
        yield event
        if last is not None and int(event.get("seq") or 0) >= last:
            return


@checks_answers
def run(args: argparse.Namespace, url: str) -> int:
    """Print the daemon's events (and keep following with ``-f``)."""
    used = [f"--{o}" for o in LOCAL_ONLY if getattr(args, o, None) is not None]
    if used:
        raise UsageError(f"{', '.join(used)}: only for the log file itself, not with --url")
    token = token_of(args)
    shown = 0
    writer = TableWriter(wide=args.wide)
    for event in _events(url, args, token):
        if not matches(event, args):
            continue
        if args.json:
            lines = [json.dumps(event, separators=(",", ":"))]
        else:
            lines = list(writer.lines([remote_row(event)]))
        for line in lines:
            print(line, flush=True)
        shown += 1
        if args.limit is not None and shown >= args.limit:
            break
    if shown == 0 and not args.json:
        print("(no events match)", file=sys.stderr)
    return 0
