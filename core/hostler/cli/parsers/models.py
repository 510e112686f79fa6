"""The parser of ``hostler models``."""

from __future__ import annotations

import argparse
from typing import Any

from hostler.cli.options import add_client_options, add_wide_option
from hostler.cli.parsers import later

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    """Register ``models``."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "models", help="the models the running `hostler serve` offers, and which are loaded"
    )
    add_client_options(parser)
    add_wide_option(parser)
    parser.set_defaults(run=later("hostler.cli.models", "run"))
