"""``hostler plugins``: which engine plugins loaded, their versions, engines and status."""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import asdict

from hostler.cli.tables import print_table, table
from hostler.pluginhost import PluginHost

__all__ = ["PLUGINS_HEADERS", "run"]

#: The table's columns, in order (pinned by the tests).
PLUGINS_HEADERS = ("PLUGIN", "VERSION", "STATUS", "ENGINES / ERROR")


def run(args: argparse.Namespace) -> int:
    """Load the plugins and show what happened to each."""
    logging.getLogger("hostler.pluginhost").setLevel(logging.ERROR)  # shown below instead
    host = PluginHost(blocked=args.block).load()
    records = sorted(host.plugins.values(), key=lambda r: r.name)
    if args.json:
        print(json.dumps([asdict(r) for r in records], indent=2))
        return 0
    grid = table(PLUGINS_HEADERS, cut={"ENGINES / ERROR": 20})
    for record in records:
        detail = ", ".join(record.engines) or "-"
        if record.error:
            detail = record.error
        grid.add_row(record.name, record.version, record.status, detail)
    print_table(grid, wide=args.wide)
    return 0
