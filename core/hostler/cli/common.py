"""Options and helpers shared by the CLI's commands."""

from __future__ import annotations

import argparse
from pathlib import Path

from hostler.errors import StoreError
from hostler.paths import default_log_path
from hostler.store.connect import sqlite_path_of
from hostler.store.log import EventStore

__all__ = ["add_log_options", "log_target", "open_existing_log"]


def add_log_options(parser: argparse.ArgumentParser) -> None:
    """``--db`` and ``--data-dir``, shared by every command that reads a log."""
    parser.add_argument(
        "--db", help="event log file or SQLAlchemy URL (default: DATA_DIR/events.db)"
    )
    parser.add_argument(
        "--data-dir", help="data directory (default: $HOSTLER_HOME or ~/.local/share/hostler)"
    )


def log_target(args: argparse.Namespace) -> str:
    """The log a command uses: ``--db`` if given, else the data directory's events.db."""
    if args.db:
        return str(args.db)
    data_dir = Path(args.data_dir).expanduser() if args.data_dir else None
    return str(default_log_path(data_dir))


def open_existing_log(args: argparse.Namespace) -> EventStore:
    """Open the log for reading; refuse to create one where none exists."""
    target = log_target(args)
    path = sqlite_path_of(target)
    if path is not None and not path.exists():
        raise StoreError(f"{path}: no event log here yet (`hostler demo` writes one)")
    return EventStore.open(target)
