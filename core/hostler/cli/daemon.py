"""``hostler daemon``: supervise the configured engines until SIGTERM."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

import anyio

from hostler.cli.common import data_directory, path_argument
from hostler.config import DEFAULT_HOST, DEFAULT_PORT, DaemonConfig, discovered_config
from hostler.daemon import Daemon, load_config
from hostler.daemon_parts.narrator import STORY_LOGGER
from hostler.errors import UsageError
from hostler.serve.access import check_exposure
from hostler.settings_env import apply_overrides, read_overrides

__all__ = [
    "DEFAULT_PORT",
    "add_parser",
    "add_serve_parser",
    "add_verbosity",
    "run",
    "serve",
    "serve_config",
    "terminal_logs",
]


def add_parser(sub: Any) -> None:
    """Register the subcommand."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "daemon", help="keep the configured engines under supervision (until SIGTERM)"
    )
    parser.add_argument(
        "--config",
        type=path_argument,
        help="TOML config (see docs/daemon.md; else $HOSTLER_CONFIG)",
    )
    parser.add_argument(
        "--data-dir", type=data_directory, help="data directory (overrides the config)"
    )
    add_verbosity(parser)
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
        help="TOML config (docs/daemon.md; else $HOSTLER_CONFIG); without one, every *.gguf "
        "in DATA_DIR/models ($HOSTLER_MODELS_DIR)",
    )
    parser.add_argument(
        "--data-dir", type=data_directory, help="data directory (overrides the config)"
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
    add_verbosity(parser)
    parser.set_defaults(run=serve)


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


def port_number(text: str) -> int:
    """A TCP port from 0 to 65535."""
    if not text.isdigit() or len(text) > 5 or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"a port from 0 to 65535, not {text[:20]!r}")
    return int(text)


def host_argument(text: str) -> str:
    """An address or host name to listen on: printable ASCII, no space, no path."""
    if not 0 < len(text) <= 253 or not text.isascii() or not text.isprintable() or " " in text:
        raise argparse.ArgumentTypeError(f"an address to listen on, not {text[:60]!r}")
    if "/" in text:
        raise argparse.ArgumentTypeError(f"an address (no scheme, no path), not {text[:60]!r}")
    return text


#: The loggers the default level shows at INFO: the story, and where the daemon listens.
TOLD = (STORY_LOGGER, "hostler.daemon")


def terminal_logs(verbosity: int) -> None:
    """What the terminal shows: -1 warnings only, 0 the story (default), 1 every detail.

    The story is the daemon's recorded decisions (:mod:`hostler.daemon_parts.narrator`);
    other modules' INFO lines (a poll that failed, a file not deleted) are detail.
    """
    level = {-1: logging.WARNING, 0: logging.WARNING, 1: logging.DEBUG}[verbosity]
    logging.basicConfig(level=level, format="%(asctime)s %(message)s")
    if verbosity == 0:
        for told in TOLD:
            logging.getLogger(told).setLevel(logging.INFO)
    for chatty in ("transitions", "alembic", "httpx", "httpcore", "asyncio"):
        logging.getLogger(chatty).setLevel(logging.WARNING)  # hostler says what matters


def serve_config(
    config: Path | None,
    data_dir: Path | None,
    *,
    host: str | None = None,
    port: int | None = None,
    environ: dict[str, str] | None = None,
    required: bool = False,
) -> DaemonConfig:
    """The settings a run uses: flags, then ``HOSTLER_*``, then the file, then the defaults.

    No file (``config`` None and no ``HOSTLER_CONFIG``): every model file of the models
    directory for ``hostler serve``; ``required`` (``hostler daemon``, which has no HTTP
    face to check) refuses it instead. Refused here, before anything is created: a malformed
    variable or file, and a listen address beyond loopback without a token.

    Raises:
        UsageError: One line: the variable, or the file and key, or the exposure.
    """
    env = read_overrides(os.environ if environ is None else environ)
    path = config if config is not None else env.config
    if path is not None:
        settings = load_config(path, data_dir=data_dir)
    elif required:
        raise UsageError("no config: give --config FILE or set HOSTLER_CONFIG")
    else:
        settings = discovered_config(data_dir, models_dir=env.models_dir)
    settings = apply_overrides(settings, env)
    settings = dataclasses.replace(
        settings,
        host=settings.host if host is None else host,
        port=settings.port if port is None else port,
    )
    if not required:  # hostler serve: it listens (hostler daemon has no HTTP face)
        check_exposure(settings.host, settings.port, settings.auth)
    return settings


def run(args: argparse.Namespace) -> int:
    """Run the daemon in the foreground."""
    config = serve_config(args.config, args.data_dir, required=True)
    terminal_logs(args.verbosity)
    anyio.run(Daemon(config, narrate=True).run)
    return 0


def serve(args: argparse.Namespace) -> int:
    """Run the daemon and its HTTP face in the foreground."""
    config = serve_config(args.config, args.data_dir, host=args.host, port=args.port)
    terminal_logs(args.verbosity)
    anyio.run(Daemon(config, listen=(config.host, config.port), narrate=True).run)
    return 0
