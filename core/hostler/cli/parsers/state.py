"""The parser of ``hostler state``."""

from __future__ import annotations

import argparse
from typing import Any

from hostler.cli.numbers import count
from hostler.cli.options import add_log_options
from hostler.cli.parsers import later

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    """Register the subcommand."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "state",
        help="the whole runtime rebuilt from the log (now, or as of a seq or time)",
        description=(
            "Resident engines, reservations, the budget, leases, queues and sessions, and "
            "every lifecycle machine, as the log describes them after one row. Snapshots "
            "kept beside the log (LOG.snapshots, a cache rebuilt whenever stale) make a "
            "moment deep in a large log quick to reach."
        ),
    )
    add_log_options(parser)
    parser.add_argument(
        "--at",
        help="a seq (a whole number) or a time (ISO-8601, or relative: 15m, 2h): the state "
        "after the last row recorded then",
    )
    parser.add_argument("--until-seq", type=count(0), help="the same as --at SEQ")
    parser.add_argument("--until", help="the same as --at TIME")
    parser.add_argument(
        "--no-snapshots",
        action="store_true",
        help="fold the whole log from its start, neither reading nor saving snapshots",
    )
    parser.add_argument("--json", action="store_true", help="print the state as JSON")
    parser.set_defaults(run=later("hostler.cli.state", "run"))
