"""The ``hostler`` command line."""

from __future__ import annotations

import argparse
import errno
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from hostler._version import __version__
from hostler.errors import HostlerError, OutputError

__all__ = ["build_parser", "main"]

#: Every subcommand as (module in ``hostler.cli.parsers``, the function that registers it, the
#: names it registers), in the order ``hostler --help`` lists them. A parser's module is imported
#: only when its command is named (or when every command is listed), and imports nothing heavy;
#: the command's body (its module in ``hostler.cli``) only when it runs: ``hostler --help``
#: and every ``--help`` start at once, ``hostler state`` does not pay for the HTTP face.
COMMANDS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("events", "add_parser", ("events",)),
    ("state", "add_parser", ("state",)),
    ("demo", "add_parser", ("demo",)),
    ("plugins", "add_parser", ("plugins",)),
    ("daemon", "add_parser", ("daemon",)),
    ("ps", "add_parser", ("ps",)),
    ("models", "add_parser", ("models",)),
    ("load", "add_parser", ("load", "unload")),
    ("tour", "add_parser", ("tour",)),
    ("explain", "add_parser", ("explain",)),
    ("replay", "add_parser", ("replay",)),
    ("whatif", "add_parser", ("whatif",)),
    ("timeline", "add_parser", ("timeline",)),
    ("export", "add_parser", ("export", "import")),
    ("daemon", "add_serve_parser", ("serve",)),
    ("capacity", "add_parsers", ("budget", "preview")),
    ("engine", "add_parser", ("engine",)),
    ("doctor", "add_parser", ("doctor",)),
)


class _Parser(argparse.ArgumentParser):
    """argparse, whose mistakes read like every other hostler error: one line, exit 2."""

    def error(self, message: str) -> NoReturn:
        """Print ``hostler: error [usage.invalid]: PROG: MESSAGE`` and exit 2."""
        self.exit(2, f"hostler: error [usage.invalid]: {self.prog}: {message}\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser: of ``command`` alone when it names one, else of every subcommand."""
    parser = _Parser(
        prog="hostler",
        description="Keeps local inference engines resident within memory, and says why.",
    )
    parser.add_argument("--version", action="version", version=f"hostler {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = [entry for entry in COMMANDS if command in entry[2]] or COMMANDS
    for module_name, register, _ in chosen:
        module = importlib.import_module(f"hostler.cli.parsers.{module_name}")
        getattr(module, register)(sub)
    return parser


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names (its first word not an option), if any."""
    return next((word for word in argv if not word.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the process exit status."""
    try:
        return _run(sys.argv[1:] if argv is None else list(argv))
    except KeyboardInterrupt:  # at any moment, an import of a command's module included
        print("hostler: interrupted", file=sys.stderr)
        return 130


#: What a write that fails for want of room or a working device raises: told as output.failed.
_OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS})


def _run(words: list[str]) -> int:
    if words[:1] == ["--version"]:
        print(f"hostler {__version__}")
        return 0
    args = build_parser(_command_of(words)).parse_args(words)
    try:
        return int(args.run(args))
    except HostlerError as exc:
        print(f"hostler: error [{exc.code}]: {exc.message}", file=sys.stderr)
        return exc.exit_status
    except BrokenPipeError:
        # `hostler events | head`: the reader left; that is not an error.
        sys.stderr.close()
        return 0
    except OSError as exc:
        if exc.errno not in _OUTPUT_ERRNOS:
            raise
        where = f"{exc.filename}: " if exc.filename else "standard output: "
        failed = OutputError(f"{where}cannot write ({exc.strerror or exc})")
        print(f"hostler: error [{failed.code}]: {failed.message}", file=sys.stderr)
        return failed.exit_status
