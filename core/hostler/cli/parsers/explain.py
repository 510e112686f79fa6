"""The parser of ``hostler explain``."""

from __future__ import annotations

import argparse
from typing import Any

from hostler.cli.options import add_log_options
from hostler.cli.parsers import later

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    """Register the subcommand."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "explain",
        help="say why: every decision that touched an engine, model, session or request",
        description=(
            "TARGET is an engine key (llamacpp:qwen:0), a model (qwen or llamacpp:qwen: every "
            "replica), a session id, or a request as ENGINE_KEY#N (N: the id its queue gave "
            "it). engine=, model=, session= or request= before it forces the kind."
        ),
    )
    parser.add_argument("target", help="engine key, model, session id, or ENGINE_KEY#N")
    add_log_options(parser)
    parser.add_argument("--since", help="only decisions recorded from this time on")
    parser.add_argument("--until", help="only decisions recorded up to this time")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.set_defaults(run=later("hostler.cli.explain", "run"))
