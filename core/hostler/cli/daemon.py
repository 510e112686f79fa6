"""``hostler daemon``: supervise the configured engines until SIGTERM."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio

from hostler.cli.common import data_directory, path_argument
from hostler.config import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    DaemonConfig,
    discovered_config,
    source_places,
)
from hostler.daemon import Daemon, load_config
from hostler.errors import UsageError
from hostler.serve.access import check_exposure
from hostler.settings_env import apply_overrides, read_overrides

__all__ = ["DEFAULT_PORT", "add_parser", "add_serve_parser", "run", "serve", "serve_config"]


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
        help="TOML config (docs/daemon.md; else $HOSTLER_CONFIG); without one, every GGUF "
        "in DATA_DIR/models ($HOSTLER_MODELS_DIR), the Hugging Face cache, Ollama and LM Studio",
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
    parser.set_defaults(run=serve)


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


def _quiet_logs() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for chatty in ("transitions", "alembic", "httpx"):  # hostler says what matters, itself
        logging.getLogger(chatty).setLevel(logging.WARNING)


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

    No file (``config`` None and no ``HOSTLER_CONFIG``): the models discovery finds
    (docs/serve.md) for ``hostler serve``; ``required`` (``hostler daemon``, which has no HTTP
    face to check) refuses it instead. Discovery's places are read from ``environ`` here.
    Refused here, before anything is created: a malformed
    variable or file, and a listen address beyond loopback without a token.

    Raises:
        UsageError: One line: the variable, or the file and key, or the exposure.
    """
    variables: Mapping[str, str] = os.environ if environ is None else environ
    env = read_overrides(variables)
    path = config if config is not None else env.config
    if path is not None:
        settings = load_config(path, data_dir=data_dir)
    elif required:
        raise UsageError("no config: give --config FILE or set HOSTLER_CONFIG")
    else:
        settings = discovered_config(data_dir)
    settings = apply_overrides(settings, env)
    if settings.discovery is not None:  # where each source is, as its own program finds it
        places = source_places(
            settings.discovery, settings.data_dir, variables, models_dir=env.models_dir
        )
        settings = dataclasses.replace(
            settings, discovery=dataclasses.replace(settings.discovery, places=places)
        )
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
    _quiet_logs()
    anyio.run(Daemon(config).run)
    return 0


def serve(args: argparse.Namespace) -> int:
    """Run the daemon and its HTTP face in the foreground."""
    config = serve_config(args.config, args.data_dir, host=args.host, port=args.port)
    _quiet_logs()
    anyio.run(Daemon(config, listen=(config.host, config.port)).run)
    return 0
