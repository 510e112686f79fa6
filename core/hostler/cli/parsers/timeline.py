"""The parser of ``hostler timeline``."""

from __future__ import annotations

import argparse
from typing import Any

from hostler.cli.numbers import count
from hostler.cli.options import add_log_source, path_argument
from hostler.cli.parsers import later

#: The picture's sides in pixels: at least this, at most that.
MIN_SIDE, MAX_SIDE = 300, 10_000

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    """Register the subcommand."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "timeline",
        help="draw reserved and measured memory per engine over time (SVG or PNG)",
        description="Reserved (light) and measured (solid) memory per engine as stacked "
        "areas under the budget line, with markers for evictions, unloads, refusals and crashes, "
        "and GPU lease holds shaded.",
    )
    add_log_source(parser)
    parser.add_argument(
        "-o", "--output", type=path_argument, required=True, help="picture to write: .svg or .png"
    )
    parser.add_argument(
        "--ledger",
        type=path_argument,
        help="the host ledger's log, when the daemon kept its memory decisions there (default: "
        "the one the log's daemon recorded using, read for that daemon's rows)",
    )
    parser.add_argument("--since", help="from this time (ISO-8601 UTC, or 15m, 2h ago)")
    parser.add_argument("--until", help="up to this time")
    parser.add_argument(
        "--width", type=count(MIN_SIDE, MAX_SIDE), default=1400, help="pixels (1400)"
    )
    parser.add_argument(
        "--height", type=count(MIN_SIDE, MAX_SIDE), default=700, help="pixels (700)"
    )
    parser.set_defaults(run=later("hostler.cli.timeline", "run"))
