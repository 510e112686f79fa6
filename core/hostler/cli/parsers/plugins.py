"""The parser of ``hostler plugins``."""

from __future__ import annotations

import argparse
from typing import Any

from hostler.cli.options import add_wide_option
from hostler.cli.parsers import later

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    """Register the subcommand."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "plugins", help="list engine plugins: name, version, engines, status"
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    add_wide_option(parser)
    parser.add_argument("--block", action="append", default=[], help="do not load this plugin")
    parser.set_defaults(run=later("hostler.cli.plugins", "run"))
