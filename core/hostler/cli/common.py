"""Helpers shared by the CLI's command bodies (their options: :mod:`hostler.cli.options`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from hostler.errors import (
    OutputError,
    StoreDamagedRowError,
    StoreError,
    UsageError,
)
from hostler.paths import default_log_path, env_log
from hostler.store.connect import sqlite_path_of
from hostler.store.log import EventStore

__all__ = [
    "Answer",
    "DamageReport",
    "answer_by_host",
    "atomic_output",
    "fleet_hosts_of",
    "log_target",
    "open_existing_log",
    "refuse_fleet_without_host",
    "take_log_argument",
]

#: Damaged rows named one per line before the rest are counted.
_DAMAGED_SHOWN = 20


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
    """The log a command uses: ``--db``, else ``$HOSTLER_DB``, else ``DATA_DIR/events.db``."""
    if args.db:
        return str(args.db)
    return env_log(os.environ.get("HOSTLER_DB", "")) or str(default_log_path(args.data_dir))


def open_existing_log(args: argparse.Namespace, *, host: str | None = None) -> EventStore:
    """Open the log for reading; refuse to create one where none exists.

    ``host`` (else ``--host-name``): a fleet host's part of a shared database log.
    """
    target = log_target(args)
    path = sqlite_path_of(target)
    host = host or getattr(args, "host_name", None)
    if path is not None and not path.exists():
        raise StoreError(f"{path}: no event log here yet (`hostler demo` writes one)")
    if path is not None and host is not None:
        raise UsageError(
            f"--host-name {host}: {path} is one host's log (a file); hosts share a database "
            "log (docs/fleet.md)"
        )
    store = EventStore.open(target, host=host)
    if path is None and host is None and store.last_seq() == 0:
        try:  # the database's own log is empty: its hosts hold the story
            refuse_fleet_without_host(store, None, "its events are its hosts'")
        except UsageError:
            store.close()
            raise
    return store


def refuse_fleet_without_host(store: EventStore, host: str | None, why: str) -> None:
    """A fleet's database is read or filled one host at a time: no host, its hosts named.

    Raises:
        UsageError: ``host`` is None and the database has hosts (docs/fleet.md).
    """
    hosts = [] if host is not None else store.fleet_hosts()
    if hosts:
        raise UsageError(
            f"{store.name}: a fleet's log: {why}; add --host-name (hosts: {', '.join(hosts[:20])})"
        )


#: One log's answer to a reading command: its exit status, its JSON document, its text.
Answer = tuple[int, dict[str, Any], str]


def answer_by_host(
    args: argparse.Namespace, answer: Callable[[str | None], Answer], *, sort_keys: bool
) -> int:
    """Print ``answer`` for the log, or for each host of a fleet's log, by host.

    A fleet prints ``HOST name`` blocks (JSON: ``{"hosts": {...}}``); one host's unreadable
    part is said in its block, and the rest are still told.
    """
    hosts = fleet_hosts_of(args)
    if not hosts:
        status, document, text = answer(None)
        print(json.dumps(document, indent=2, sort_keys=sort_keys) if args.json else text)
        return status
    statuses, documents, texts = [], {}, []
    for host in hosts:
        try:
            status, document, text = answer(host)
        except StoreError as exc:
            status, document = 1, {"error": {"code": exc.code, "message": exc.message}}
            text = f"error [{exc.code}]: {exc.message}"
            print(f"hostler: {text}", file=sys.stderr)
        statuses.append(status)
        documents[host] = document
        texts.append(f"HOST {host}\n{text}")
    if args.json:
        print(json.dumps({"hosts": documents}, indent=2, sort_keys=sort_keys))
    else:
        print("\n\n".join(texts))
    return max(statuses)


def fleet_hosts_of(args: argparse.Namespace) -> list[str]:
    """The hosts a command reads one by one: a database log's, when no ``--host-name`` is given.

    Empty for a file, for a given host, and for a database without hosts (one daemon's log).
    """
    if getattr(args, "host_name", None) is not None:
        return []
    target = log_target(args)
    if sqlite_path_of(target) is not None:
        return []
    with EventStore.open(target) as store:
        return store.fleet_hosts()


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
