"""The ``hostler`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from hostler._version import __version__
from hostler.cli import (
    capacity,
    daemon,
    demo,
    events,
    export,
    load,
    models,
    plugins,
    ps,
    state,
    tour,
)
from hostler.errors import HostlerError

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    """argparse, whose mistakes read like every other hostler error: one line, exit 2."""

    def error(self, message: str) -> NoReturn:
        """Print ``hostler: error [usage.invalid]: PROG: MESSAGE`` and exit 2."""
        self.exit(2, f"hostler: error [usage.invalid]: {self.prog}: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = _Parser(
        prog="hostler",
        description="Keeps local inference engines resident within memory, and says why.",
    )
    parser.add_argument("--version", action="version", version=f"hostler {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (events, state, demo, plugins, daemon, ps, models, load, tour, export):
        module.add_parser(sub)
    daemon.add_serve_parser(sub)
    capacity.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except HostlerError as exc:
        print(f"hostler: error [{exc.code}]: {exc.message}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `hostler events | head`: the reader left; that is not an error.
        sys.stderr.close()
        return 0
