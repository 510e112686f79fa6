"""The parser of ``hostler load`` and ``hostler unload``."""

from __future__ import annotations

import argparse
from typing import Any

from hostler.cli.options import add_client_options
from hostler.cli.parsers import later

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    """Register ``load`` and ``unload``."""
    load: argparse.ArgumentParser = sub.add_parser(
        "load", help="load a model in the running `hostler serve` now, showing each step"
    )
    load.add_argument("model", help="a model id (as `hostler models` lists it)")
    add_client_options(load)
    load.set_defaults(run=later("hostler.cli.load", "run_load"))
    unload: argparse.ArgumentParser = sub.add_parser(
        "unload",
        help="unload a model's idle engines (or one engine) of the running `hostler serve`",
    )
    unload.add_argument(
        "key",
        metavar="MODEL_OR_KEY",
        help="a model id (as `hostler models` lists it: every engine of it) or an engine key "
        "(as `hostler ps` lists it)",
    )
    add_client_options(unload)
    unload.set_defaults(run=later("hostler.cli.load", "run_unload"))
