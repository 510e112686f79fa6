"""``hostler plugins``: which engine plugins loaded, their versions, engines and status."""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import asdict
from typing import Any

from hostler.cli.tables import print_table, table
from hostler.pluginhost import PluginHost

__all__ = ["PLUGINS_HEADERS", "add_parser", "run"]

#: The table's columns, in order (pinned by the tests).
PLUGINS_HEADERS = ("PLUGIN", "VERSION", "STATUS", "ENGINES / ERROR")


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
    grid = table(PLUGINS_HEADERS)
    for record in records:
        detail = ", ".join(record.engines) or "-"
        if record.error:
            detail = record.error
        grid.add_row(record.name, record.version, record.status, detail)
    print_table(grid)
    return 0
