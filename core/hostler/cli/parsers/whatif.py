"""The parser of ``hostler whatif``."""

from __future__ import annotations

import argparse
from typing import Any

from hostler.capacity.bounds import MAX_SLOTS
from hostler.cli.numbers import count
from hostler.cli.options import add_log_source, budget_argument, switch_argument
from hostler.cli.parsers import later

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    """Register the subcommand."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "whatif",
        help="replay a log's requests under another budget, eviction policy, spillover or width",
    )
    add_log_source(parser)
    parser.add_argument(
        "--budget", type=budget_argument, metavar="BYTES", help="the budget (24GiB, 512MiB...)"
    )
    parser.add_argument(
        "--policy",
        type=later("hostler.cli.whatif", "policy_argument"),
        metavar="NAME",
        help="eviction policy (demand-lru, lru...)",
    )
    parser.add_argument(
        "--spillover",
        type=switch_argument,
        metavar="on|off",
        help="RAM spillover of co-resident models",
    )
    parser.add_argument(
        "--slots", type=count(1, MAX_SLOTS), metavar="N", help="slots per engine, every engine"
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(run=later("hostler.cli.whatif", "run"))
