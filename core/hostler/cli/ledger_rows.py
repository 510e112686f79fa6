"""The host ledger's rows that belong with a log, for ``whatif`` and ``timeline``.

The ledger the log's own daemon recorded in ``daemon.started`` is read, and of it only the
rows of that daemon (:func:`hostler.postmortem.ledger_use.own_rows`): a log made with a ledger
in its own file needs no ``--ledger``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from hostler.errors import HostlerError
from hostler.postmortem.ledger_use import own_rows, recorded_ledger
from hostler.store.log import EventStore, RecordedEvent

__all__ = ["recorded_ledger_rows"]


def recorded_ledger_rows(
    log: EventStore, rows: Sequence[RecordedEvent], *, until: datetime | None = None
) -> list[RecordedEvent] | None:
    """The ledger rows to merge with ``log``'s ``rows``; None when no other ledger is known.

    The recorded path is the log's word, not the user's: one that is gone, cannot be a path
    here (a NUL byte, too long) or does not open as a hostler log is said on stderr in one
    line (with the fix), and no rows are given: the log is read alone.
    """
    use = recorded_ledger(rows)
    if use is None:
        return None
    try:
        if _same_file(log.sqlite_file, use.path):
            return None
        here = use.path.exists()
    except (OSError, ValueError) as exc:
        _note(log, use.path, f"which cannot be read here ({type(exc).__name__})")
        return []
    if not here:
        _note(log, use.path, "which is not here")
        return []
    try:
        with EventStore.open(use.path) as ledger:
            return list(own_rows(use, ledger.read_all(until=until)))
    except HostlerError as exc:
        _note(log, use.path, f"which cannot be read ({exc.code})")
        return []


def _note(log: EventStore, path: Path, why: str) -> None:
    shown = str(path).encode("unicode_escape").decode("ascii")[:200]
    print(
        f"hostler: note: the daemon of {log.name} kept its memory decisions in {shown}, "
        f"{why}: the log is read alone; give the ledger with --ledger PATH",
        file=sys.stderr,
    )


def _same_file(one: Path | None, other: Path) -> bool:
    """Whether ``other`` is the file ``one`` (raises what the path's check raises)."""
    if one is None:
        return False
    try:
        return one.samefile(other)
    except FileNotFoundError:
        return one == other
