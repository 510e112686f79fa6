"""``hostler daemon``: supervise the configured engines until SIGTERM."""

from __future__ import annotations

import argparse
import logging
from typing import Any

import anyio

from hostler.cli.common import data_directory, path_argument
from hostler.config import discovered_config
from hostler.daemon import Daemon, load_config

__all__ = ["add_parser", "add_serve_parser", "run", "serve"]

#: ``hostler serve``'s default port (Ollama's is 11434; llama-server's 8080).
DEFAULT_PORT = 11435


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


def add_serve_parser(sub: Any) -> None:
    """Register ``hostler serve``: the daemon with its HTTP face."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "serve",
        help="run the daemon with its OpenAI-compatible HTTP face (docs/serve.md)",
    )
    parser.add_argument(
        "--config",
        type=path_argument,
        help="TOML config (docs/daemon.md); without one, every *.gguf in DATA_DIR/models",
    )
    parser.add_argument(
        "--data-dir", type=data_directory, help="data directory (overrides the config)"
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)"
    )
    parser.add_argument(
        "--port",
        type=port_number,
        default=DEFAULT_PORT,
        help=f"port to listen on (default {DEFAULT_PORT}; 0: any free port, said in the log)",
    )
    parser.set_defaults(run=serve)


def port_number(text: str) -> int:
    """A TCP port from 0 to 65535."""
    if not text.isdigit() or len(text) > 5 or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"a port from 0 to 65535, not {text[:20]!r}")
    return int(text)


def _quiet_logs() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for chatty in ("transitions", "alembic", "httpx"):  # hostler says what matters, itself
        logging.getLogger(chatty).setLevel(logging.WARNING)


def run(args: argparse.Namespace) -> int:
    """Run the daemon in the foreground."""
    _quiet_logs()
    config = load_config(args.config, data_dir=args.data_dir)
    anyio.run(Daemon(config).run)
    return 0


def serve(args: argparse.Namespace) -> int:
    """Run the daemon and its HTTP face in the foreground."""
    _quiet_logs()
    if args.config is None:
        config = discovered_config(args.data_dir)
    else:
        config = load_config(args.config, data_dir=args.data_dir)
    anyio.run(Daemon(config, listen=(args.host, args.port)).run)
    return 0
