"""``hostler events``: list, filter and tail the event log."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from hostler.cli import remote_events
from hostler.cli.client import URL_VARIABLE, daemon_url, url_argument
from hostler.cli.common import DamageReport, add_log_options, open_existing_log
from hostler.cli.numbers import count, seconds
from hostler.cli.render import TableWriter, record_json
from hostler.cli.timeparse import parse_moment
from hostler.errors import UsageError
from hostler.store.log import EventStore, RecordedEvent

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    """Register the subcommand."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "events",
        help="list, filter and tail the event log",
        description="List the event log, oldest first. Filters combine with AND; --type and "
        "--stream may repeat (any of them matches).",
    )
    add_log_options(parser)
    parser.add_argument("--stream", action="append", help="exact stream id (engine/KEY, ...)")
    parser.add_argument("--stream-prefix", help="stream ids starting with this (engine/)")
    parser.add_argument(
        "--type", action="append", dest="types", help="event type, e.g. engine.crashed"
    )
    parser.add_argument("--since", help="recorded at or after (ISO-8601 UTC, or 15m, 2h, 1d ago)")
    parser.add_argument("--until", help="recorded at or before (same forms as --since)")
    parser.add_argument("--after-seq", type=count(0), default=0, help="only events with seq > N")
    parser.add_argument("--limit", type=count(1), help="at most N events (the oldest N)")
    parser.add_argument(
        "--tail", type=count(1), metavar="N", help="only the newest N matching events"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing new events")
    parser.add_argument(
        "--interval",
        type=seconds(0.01, 3600),
        default=0.5,
        help="seconds between polls with --follow",
    )
    parser.add_argument(
        "--url",
        type=url_argument,
        help=f"tail the running hostler serve there instead of the file (also ${URL_VARIABLE})",
    )
    parser.add_argument("--token", help="the daemon's token when it listens publicly")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """List (and optionally follow) the log (the running daemon's with ``--url``)."""
    url = args.url or (None if args.db else daemon_url(args, default=None))
    if url is not None:
        return remote_events.run(args, url)
    now = datetime.now(UTC)
    since = parse_moment(args.since, now=now) if args.since else None
    until = parse_moment(args.until, now=now) if args.until else None
    for option in ("limit", "tail"):
        value = getattr(args, option)
        if value is not None and value < 1:
            raise UsageError(f"--{option} must be at least 1")
    if args.follow and until is not None:
        raise UsageError("--follow and --until contradict each other")
    with open_existing_log(args) as store:
        damage = DamageReport(store.name)
        records = _noting_damage(_records(store, args, since, until), damage)
        lines = (record_json(r) for r in records) if args.json else TableWriter().lines(records)
        shown = 0
        for line in lines:
            print(line, flush=args.follow)
            shown += 1
        if shown == 0 and not args.json:
            print("(no events match)", file=sys.stderr)
        return damage.status()


def _noting_damage(
    records: Iterator[RecordedEvent], damage: DamageReport
) -> Iterator[RecordedEvent]:
    for record in records:
        if record.damage:
            damage.note(record.seq, record.damage)
        yield record


def _records(
    store: EventStore, args: argparse.Namespace, since: datetime | None, until: datetime | None
) -> Iterator[RecordedEvent]:
    filters: dict[str, Any] = {
        "types": args.types,
        "streams": args.stream,
        "stream_prefix": args.stream_prefix,
        "since": since,
        "until": until,
    }
    after = args.after_seq
    for record in store.read_all(after_seq=after, limit=args.limit, last=args.tail, **filters):
        after = record.seq
        yield record
    while args.follow:
        time.sleep(args.interval)
        for record in store.read_all(after_seq=after, **filters):
            after = record.seq
            yield record
