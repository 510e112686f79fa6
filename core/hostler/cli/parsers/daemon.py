"""The parser of ``hostler daemon`` and ``hostler serve``."""

from __future__ import annotations

import argparse
from typing import Any

from hostler.address import DEFAULT_HOST, DEFAULT_PORT
from hostler.cli.options import (
    add_settings_options,
    host_argument,
    host_name_argument,
    log_argument,
    port_number,
)
from hostler.cli.parsers import later

__all__ = ["add_db_option", "add_parser", "add_serve_parser", "add_verbosity"]


def add_parser(sub: Any) -> None:
    """Register the subcommand."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "daemon", help="keep the configured engines under supervision (until SIGTERM)"
    )
    add_settings_options(parser, "TOML config (see docs/daemon.md; else $HOSTLER_CONFIG)")
    add_db_option(parser)
    add_verbosity(parser)
    parser.set_defaults(run=later("hostler.cli.daemon", "run"))


def add_serve_parser(sub: Any) -> None:
    """Register ``hostler serve``: the daemon with its HTTP face."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "serve",
        help="run the daemon with its OpenAI-compatible HTTP face (docs/serve.md)",
    )
    add_settings_options(
        parser,
        "TOML config (docs/daemon.md; else $HOSTLER_CONFIG); without one, the GGUF models "
        "in DATA_DIR/models ($HOSTLER_MODELS_DIR), the Hugging Face cache, Ollama and LM Studio",
    )
    parser.add_argument(
        "--host",
        type=host_argument,
        help=f"address to listen on (default $HOSTLER_HOST, [server] host, else {DEFAULT_HOST})",
    )
    parser.add_argument(
        "--port",
        type=port_number,
        help=f"port to listen on (default $HOSTLER_PORT, [server] port, else {DEFAULT_PORT}; "
        "0: any free port, said in the log)",
    )
    add_db_option(parser)
    add_verbosity(parser)
    parser.set_defaults(run=later("hostler.cli.daemon", "serve"))


def add_db_option(parser: argparse.ArgumentParser) -> None:
    """``--db`` and ``--host-name``: the log the daemon owns, and its host's name in a fleet."""
    parser.add_argument(
        "--db",
        type=log_argument,
        help="event log file or database URL, e.g. postgresql+psycopg://USER@HOST/DB "
        "(default $HOSTLER_DB, [daemon] log, else DATA_DIR/events.db; docs/fleet.md)",
    )
    parser.add_argument(
        "--host-name",
        type=host_name_argument,
        help="this host's name in a fleet sharing one database log (default "
        "$HOSTLER_HOST_NAME, [daemon] host_name, else none: the log is this daemon's alone)",
    )


def add_verbosity(parser: argparse.ArgumentParser) -> None:
    """``-q`` / ``-v``: how much of the daemon's story its terminal shows (docs/serve.md)."""
    level = parser.add_mutually_exclusive_group()
    level.add_argument(
        "-q",
        "--quiet",
        dest="verbosity",
        action="store_const",
        const=-1,
        default=0,
        help="only warnings and errors (a crash, a refusal)",
    )
    level.add_argument(
        "-v",
        "--verbose",
        dest="verbosity",
        action="store_const",
        const=1,
        help="every event and the debug detail too",
    )
