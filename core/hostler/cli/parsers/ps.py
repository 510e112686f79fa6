"""The parser of ``hostler ps``."""

from __future__ import annotations

import argparse
from typing import Any

from hostler.cli.options import add_client_options, add_wide_option
from hostler.cli.parsers import later

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    """Register ``ps``."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "ps", help="the engines the running `hostler serve` holds, their memory and queues"
    )
    add_client_options(parser)
    add_wide_option(parser)
    parser.set_defaults(run=later("hostler.cli.ps", "run"))
