"""The parser of ``hostler tour``."""

from __future__ import annotations

import argparse
from typing import Any

from hostler.cli.options import data_directory
from hostler.cli.parsers import later

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    """Register the subcommand."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "tour",
        help="start hostler serve with two real models under a budget for one; make it swap",
        description="Writes DATA_DIR/tour anew, starts the real `hostler serve` there, sends "
        "OpenAI requests that make it swap models, and shows `hostler ps` and the events.",
    )
    parser.add_argument("--data-dir", type=data_directory, help="where DATA_DIR/tour goes")
    parser.add_argument(
        "--keep", action="store_true", help="leave the daemon running at the end (for a try)"
    )
    parser.set_defaults(run=later("hostler.cli.tour", "run"))
