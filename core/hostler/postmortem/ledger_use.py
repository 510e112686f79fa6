"""Which host ledger a log's daemon used, and that daemon's rows in it (pure).

A daemon whose ledger is another file than its log (the config's ``ledger``, or the per-user
ledger by default) records that file and its owner string in ``daemon.started`` (schema v2).
:func:`recorded_ledger` reads them back; :func:`own_rows` picks, of the ledger's rows, those
that belong to the log: the reservations, measurements and releases its daemons made, and the
budget and spillover changes made while it ran. ``whatif`` and ``timeline`` merge them into
the log's rows by time, so neither needs ``--ledger`` for such a log.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from hostler.postmortem.workload import LogRow

__all__ = ["LedgerUse", "own_rows", "recorded_ledger"]

#: Ledger events that belong to the whole host, not one owner: they shape every owner's room.
_HOST_WIDE = frozenset({"ledger.budget_set", "ledger.spillover_set"})

Row = TypeVar("Row", bound=LogRow)


@dataclass(frozen=True, slots=True)
class LedgerUse:
    """The ledger file a log's daemons used, their owner strings there, and when they began.

    Attributes:
        path: The ledger's log file.
        owners: Every owner string the log's daemons reserved under in that file.
        since: When the first of those daemons started (seconds since the epoch).
    """

    path: Path
    owners: frozenset[str]
    since: float


def recorded_ledger(rows: Iterable[LogRow]) -> LedgerUse | None:
    """The ledger the log's last daemon named in ``daemon.started``; None when none did.

    Earlier daemons that named the same file add their owners (one log, several restarts).
    """
    starts: list[tuple[str, str, float]] = []
    for row in rows:
        if row.damage or row.type != "daemon.started":
            continue
        path, owner = row.payload.get("ledger"), row.payload.get("ledger_owner")
        if isinstance(path, str) and path and isinstance(owner, str):
            starts.append((path, owner, row.recorded_at.timestamp()))
    if not starts:
        return None
    last = starts[-1][0]
    same = [(owner, at) for path, owner, at in starts if path == last]
    return LedgerUse(Path(last), frozenset(o for o, _ in same), min(at for _, at in same))


def own_rows(use: LedgerUse, rows: Iterable[Row]) -> Iterator[Row]:
    """Of a ledger's ``rows``, the log's: its owners' rows, and host-wide changes since then.

    A damaged row is kept (its reader reports it); another owner's row is dropped, as is a
    host-wide change made before the log's first daemon began.
    """
    for row in rows:
        if row.damage:
            yield row
        elif row.type in _HOST_WIDE:
            if row.recorded_at.timestamp() >= use.since:
                yield row
        elif row.payload.get("owner") in use.owners:
            yield row
