"""The parser of ``hostler replay``."""

from __future__ import annotations

import argparse
from typing import Any

from hostler.cli.options import add_log_source
from hostler.cli.parsers import later

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    """Register the subcommand."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "replay",
        help="re-derive every recorded decision with the current policy code (--verify)",
        description="Re-derive every recorded decision from the inputs the log recorded, with "
        "this hostler's policy code, and report each one that comes out differently (both "
        "answers side by side). Exit 0 when all agree, 1 when any differs.",
    )
    add_log_source(parser)
    parser.add_argument(
        "--verify", action="store_true", help="re-derive and compare every decision"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(run=later("hostler.cli.replay", "run"))
