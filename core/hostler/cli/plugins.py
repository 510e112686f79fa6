"""``hostler plugins``: which engine plugins loaded, their versions, engines and status."""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import asdict
from typing import Any

from hostler.pluginhost import PluginHost

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    """Register the subcommand."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "plugins", help="list engine plugins: name, version, engines, status"
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--block", action="append", default=[], help="do not load this plugin")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Load the plugins and show what happened to each."""
    logging.getLogger("hostler.pluginhost").setLevel(logging.ERROR)  # shown below instead
    host = PluginHost(blocked=args.block).load()
    records = sorted(host.plugins.values(), key=lambda r: r.name)
    if args.json:
        print(json.dumps([asdict(r) for r in records], indent=2))
        return 0
    print(f"{'PLUGIN':<20} {'VERSION':<12} {'STATUS':<8} ENGINES / ERROR")
    for record in records:
        detail = ", ".join(record.engines) or "-"
        if record.error:
            detail = record.error
        print(f"{record.name:<20} {record.version:<12} {record.status:<8} {detail}")
    return 0
