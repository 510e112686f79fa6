"""``hostler daemon``: supervise the configured engines until SIGTERM."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import Path

import anyio

from hostler.config import DEFAULT_PORT, DaemonConfig, discovered_config, with_places
from hostler.daemon import Daemon, load_config
from hostler.daemon_parts.narrator import STORY_LOGGER
from hostler.errors import UsageError
from hostler.serve.access import check_exposure
from hostler.settings_env import apply_overrides, read_overrides

__all__ = ["DEFAULT_PORT", "TOLD", "run", "serve", "serve_config", "terminal_logs"]


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
    db: str | None = None,
    host_name: str | None = None,
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
    # where each source is, as its own program finds it
    settings = with_places(settings, variables, models_dir=env.models_dir)
    settings = dataclasses.replace(
        settings,
        host=settings.host if host is None else host,
        port=settings.port if port is None else port,
        log=settings.log if db is None else db,
        host_name=settings.host_name if host_name is None else host_name,
    )
    if not required:  # hostler serve: it listens (hostler daemon has no HTTP face)
        check_exposure(settings.host, settings.port, settings.auth)
    return settings


def run(args: argparse.Namespace) -> int:
    """Run the daemon in the foreground."""
    config = serve_config(
        args.config, args.data_dir, db=args.db, host_name=args.host_name, required=True
    )
    terminal_logs(args.verbosity)
    anyio.run(Daemon(config, narrate=True).run)
    return 0


def serve(args: argparse.Namespace) -> int:
    """Run the daemon and its HTTP face in the foreground."""
    config = serve_config(
        args.config,
        args.data_dir,
        host=args.host,
        port=args.port,
        db=args.db,
        host_name=args.host_name,
    )
    terminal_logs(args.verbosity)
    anyio.run(Daemon(config, listen=(config.host, config.port), narrate=True).run)
    return 0
