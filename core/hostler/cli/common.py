"""Options and helpers shared by the CLI's commands."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from hostler.errors import OutputError, StoreDamagedRowError, StoreError, UsageError
from hostler.paths import default_log_path, user_path
from hostler.store.connect import sqlite_path_of
from hostler.store.log import EventStore

__all__ = [
    "DamageReport",
    "add_log_options",
    "add_log_source",
    "atomic_output",
    "data_directory",
    "log_argument",
    "log_target",
    "open_existing_log",
    "path_argument",
    "take_log_argument",
]

#: Damaged rows named one per line before the rest are counted.
_DAMAGED_SHOWN = 20

#: Longer than any path a kernel accepts (PATH_MAX is 4096 on Linux).
_MAX_PATH = 4096


def _given_path(text: str, *, resolve: bool = False) -> Path:
    """``text`` as :func:`hostler.paths.user_path` makes it, or argparse's one-line refusal."""
    if not text or len(text) > _MAX_PATH:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a usable path")
    try:
        return user_path(text, resolve=resolve)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text[:200]!r}: {exc}") from None


def path_argument(text: str) -> Path:
    """An argparse type: a file path as given, ``~`` and ``~user`` expanded.

    Refused in one line (usage error, exit 2) when it cannot be expanded or holds a NUL.
    """
    return _given_path(text)


def log_argument(text: str) -> str:
    """An argparse type for ``--db``: a URL as given, a file path expanded and resolved.

    A path that cannot be (a ``~user`` nobody knows, a symbolic link loop) is refused in one
    line; a URL is checked when the log is opened.
    """
    if not text or "://" in text:
        return text
    return str(_given_path(text, resolve=True))


def data_directory(text: str) -> Path:
    """An argparse type: a data directory, resolved (engines run in other working directories).

    Refused in one line when it cannot be expanded or resolved, or names something that is not
    a directory.
    """
    if not text or len(text) > _MAX_PATH or "\0" in text:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a usable directory path")
    path = _given_path(text, resolve=True)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{path}: exists and is not a directory")
    return path


def add_log_options(parser: argparse.ArgumentParser) -> None:
    """``--db`` and ``--data-dir``, shared by every command that reads a log."""
    parser.add_argument(
        "--db",
        type=log_argument,
        help="event log file or SQLAlchemy URL (default: DATA_DIR/events.db)",
    )
    parser.add_argument(
        "--data-dir",
        type=data_directory,
        help="data directory (default: $HOSTLER_HOME or ~/.local/share/hostler)",
    )


def add_log_source(parser: argparse.ArgumentParser) -> None:
    """An optional ``LOG`` argument beside ``--db`` and ``--data-dir`` (the post-mortem commands).

    :func:`take_log_argument` folds it into ``--db``; giving both is refused.
    """
    parser.add_argument(
        "log",
        nargs="?",
        type=log_argument,
        metavar="LOG",
        help="event log file or SQLAlchemy URL, as --db (default: DATA_DIR/events.db)",
    )
    add_log_options(parser)


def take_log_argument(args: argparse.Namespace, command: str) -> None:
    """Fold the ``LOG`` argument of :func:`add_log_source` into ``args.db``.

    Raises:
        UsageError: both ``LOG`` and ``--db`` were given.
    """
    if args.log:
        if args.db:
            raise UsageError(f"{command}: give the log once: as LOG or as --db")
        args.db = args.log


def log_target(args: argparse.Namespace) -> str:
    """The log a command uses: ``--db`` if given, else the data directory's events.db."""
    if args.db:
        return str(args.db)
    return str(default_log_path(args.data_dir))


def open_existing_log(args: argparse.Namespace) -> EventStore:
    """Open the log for reading; refuse to create one where none exists."""
    target = log_target(args)
    path = sqlite_path_of(target)
    if path is not None and not path.exists():
        raise StoreError(f"{path}: no event log here yet (`hostler demo` writes one)")
    return EventStore.open(target)


class DamageReport:
    """Warns about damaged log rows on stderr as they are met, by seq (the first 20 named)."""

    def __init__(self, log_name: str) -> None:
        self.log_name = log_name
        self.count = 0

    def note(self, seq: int, why: str) -> None:
        """Report one damaged row."""
        self.count += 1
        if self.count <= _DAMAGED_SHOWN:
            self._warn(f"seq {seq}: {why} (listed, not folded)")

    def status(self) -> int:
        """Say how many went unnamed; the exit status (1 when any row was damaged, else 0)."""
        if self.count > _DAMAGED_SHOWN:
            self._warn(f"{self.count - _DAMAGED_SHOWN} more damaged rows not named")
        return 1 if self.count else 0

    def _warn(self, text: str) -> None:
        print(
            f"hostler: warning [{StoreDamagedRowError.code}]: {self.log_name}: {text}",
            file=sys.stderr,
            flush=True,
        )


@contextlib.contextmanager
def atomic_output(path: Path) -> Iterator[IO[bytes]]:
    """A file written beside ``path`` (mode 0600) and renamed onto it once complete.

    On any failure the temporary file is removed and ``path`` is left as it was.
    """
    try:
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise UsageError(f"{path}: cannot write here ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "wb") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        Path(temp).replace(path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            Path(temp).unlink()
        if isinstance(exc, OSError) and not isinstance(exc, BrokenPipeError):
            raise OutputError(f"{path}: cannot write ({exc.strerror or exc})") from None
        raise
