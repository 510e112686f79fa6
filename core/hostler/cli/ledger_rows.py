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

from hostler.postmortem.ledger_use import own_rows, recorded_ledger
from hostler.store.log import EventStore, RecordedEvent

__all__ = ["recorded_ledger_rows"]


def recorded_ledger_rows(
    log: EventStore, rows: Sequence[RecordedEvent], *, until: datetime | None = None
) -> list[RecordedEvent] | None:
    """The ledger rows to merge with ``log``'s ``rows``; None when no other ledger is known.

    A recorded ledger file that is gone is said on stderr in one line (with the fix), and
    the log is read alone.
    """
    use = recorded_ledger(rows)
    if use is None or _same_file(log.sqlite_file, use.path):
        return None
    if not use.path.exists():
        print(
            f"hostler: note: the daemon of {log.name} kept its memory decisions in "
            f"{use.path}, which is not here: give it with --ledger PATH",
            file=sys.stderr,
        )
        return None
    with EventStore.open(use.path) as ledger:
        return list(own_rows(use, ledger.read_all(until=until)))


def _same_file(one: Path | None, other: Path) -> bool:
    if one is None:
        return False
    try:
        return one.samefile(other)
    except OSError:
        return one == other
