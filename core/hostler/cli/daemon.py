"""``hostler daemon``: supervise the configured engines until SIGTERM."""

from __future__ import annotations

import argparse
import logging
from typing import Any

import anyio

from hostler.cli.common import data_directory, path_argument
from hostler.daemon import Daemon, load_config

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    """Register the subcommand."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "daemon", help="keep the configured engines under supervision (until SIGTERM)"
    )
    parser.add_argument(
        "--config", required=True, type=path_argument, help="TOML config (see docs/daemon.md)"
    )
    parser.add_argument(
        "--data-dir", type=data_directory, help="data directory (overrides the config)"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the daemon in the foreground."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for chatty in ("transitions", "alembic"):  # hostler says what matters, in its own words
        logging.getLogger(chatty).setLevel(logging.WARNING)
    config = load_config(args.config, data_dir=args.data_dir)
    anyio.run(Daemon(config).run)
    return 0
