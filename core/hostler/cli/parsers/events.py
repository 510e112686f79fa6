"""The parser of ``hostler events``."""

from __future__ import annotations

import argparse
from typing import Any

from hostler.cli.numbers import count, seconds
from hostler.cli.options import URL_VARIABLE, add_log_options, add_wide_option, url_argument
from hostler.cli.parsers import later

__all__ = ["add_parser"]


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
    add_wide_option(parser)
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
    parser.set_defaults(run=later("hostler.cli.events", "run"))
