"""The parser of ``hostler demo``."""

from __future__ import annotations

import argparse
from typing import Any

from hostler.cli.options import add_log_options, path_argument
from hostler.cli.parsers import later

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    """Register the subcommand."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "demo",
        help="run a real engine through its lifecycle into a fresh demo log, and show it",
        description="Writes DATA_DIR/demo/events.db anew (replacing an earlier demo log): a "
        "tiny model is made, a real llama-server started, asked, crashed, restarted and "
        "idle-stopped; then the events and the state replayed from them are printed.",
    )
    add_log_options(parser)
    parser.add_argument(
        "--model", type=path_argument, help="a GGUF model to use instead of a generated tiny one"
    )
    parser.add_argument(
        "--scripted",
        action="store_true",
        help="no engine: drive the machines with scripted observations",
    )
    parser.set_defaults(run=later("hostler.cli.demo", "run"))
