"""Tables for people: bold headers on a terminal, plain stable columns in a pipe, fitted to a width.

A table fits the terminal (or ``$COLUMNS``): the least useful columns go first, then the
values of the columns that may be shortened are cut with ``…``; every line fits. ``--wide``
(and a pipe without ``$COLUMNS``) shows every column whole, one row per line, so ``hostler ps |
grep running`` and ``awk`` see whole rows, no colour codes. Only the standard library: a
command that prints a table starts at once.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO

__all__ = [
    "GAP",
    "Table",
    "duration",
    "fit_widths",
    "print_table",
    "size",
    "table",
    "table_width",
]

#: The spaces between two columns.
GAP = 2
_BOLD, _PLAIN = "\x1b[1m", "\x1b[0m"


@dataclass
class Table:
    """Headers, rows, and how the table gives way to a narrow screen.

    Attributes:
        headers: The columns, in order.
        right: The right-aligned columns (numbers).
        drop: Columns that may go, the least useful first.
        cut: Columns whose values may be shortened (with ``…``), each to at least this width.
        rows: The rows added so far.
    """

    headers: tuple[str, ...]
    right: frozenset[str] = frozenset()
    drop: tuple[str, ...] = ()
    cut: Mapping[str, int] = field(default_factory=dict)
    rows: list[tuple[str, ...]] = field(default_factory=list)

    def add_row(self, *cells: str) -> None:
        """Add a row (one cell per header)."""
        if len(cells) != len(self.headers):
            raise ValueError(f"a row of {len(cells)} cells for {len(self.headers)} columns")
        self.rows.append(tuple(str(cell) for cell in cells))


def table(
    headers: Sequence[str],
    right: Sequence[str] = (),
    *,
    drop: Sequence[str] = (),
    cut: Mapping[str, int] | None = None,
) -> Table:
    """A borderless table with these headers (those in ``right`` right-aligned).

    ``drop`` names the columns a narrow screen may lose, least useful first; ``cut`` the ones
    whose values may be shortened, each with the narrowest it may become.
    """
    unknown = (set(right) | set(drop) | set(cut or {})) - set(headers)
    if unknown:
        raise ValueError(f"not columns of this table: {sorted(unknown)}")
    return Table(tuple(headers), frozenset(right), tuple(drop), dict(cut or {}))


def table_width(file: IO[str], *, wide: bool = False) -> int | None:
    """The width a table must fit: ``$COLUMNS``, else a terminal's; None (any) for ``wide``.

    A pipe without ``$COLUMNS`` takes any width: scripts read whole rows.
    """
    if wide:
        return None
    given = os.environ.get("COLUMNS", "").strip()
    if given.isdigit() and 0 < int(given) <= 100_000:
        return int(given)
    if file.isatty():
        try:
            return os.get_terminal_size(file.fileno()).columns
        except (OSError, ValueError):
            return None
    return None


def fit_widths(grid: Table, limit: int | None) -> list[tuple[int, int]]:
    """The columns shown and their widths, as ``(index, width)``, to fit ``limit`` characters.

    Columns are dropped in ``grid.drop``'s order until shortening the ``cut`` columns' values
    (the widest first) is enough; without ``limit``, every column whole.
    """
    natural = [
        max([len(header), *(len(row[i]) for row in grid.rows)])
        for i, header in enumerate(grid.headers)
    ]
    shown = list(range(len(grid.headers)))
    droppable = [grid.headers.index(name) for name in grid.drop]
    widths = dict(enumerate(natural))
    while limit is not None:
        excess = sum(widths[i] for i in shown) + GAP * (len(shown) - 1) - limit
        if excess <= 0:
            break
        least = {
            i: max(grid.cut[grid.headers[i]], len(grid.headers[i]))
            for i in shown
            if grid.headers[i] in grid.cut
        }
        slack = sum(max(widths[i] - low, 0) for i, low in least.items())
        if slack >= excess or not droppable:
            for _ in range(min(slack, excess)):  # one character at a time, the widest first
                widest = max((i for i in least if widths[i] > least[i]), key=widths.__getitem__)
                widths[widest] -= 1
            break
        shown.remove(droppable.pop(0))
    return [(i, widths[i]) for i in shown]


def _cell(text: str, width: int, right: bool) -> str:
    if len(text) > width:
        text = text[: width - 1] + "…"
    return text.rjust(width) if right else text.ljust(width)


def print_table(grid: Table, file: IO[str] | None = None, *, wide: bool = False) -> None:
    """Print ``grid`` fitted to :func:`table_width` (``wide``: every column whole)."""
    stream = file or sys.stdout
    limit = table_width(stream, wide=wide)
    columns = fit_widths(grid, limit)
    tty = stream.isatty()
    for n, row in enumerate([grid.headers, *grid.rows]):
        cells = (_cell(row[i], width, grid.headers[i] in grid.right) for i, width in columns)
        line = (" " * GAP).join(cells).rstrip()
        if limit is not None and len(line) > limit:  # wider than any fit: cut, as ps(1) does
            line = line[: limit - 1] + "…"
        stream.write(f"{_BOLD}{line}{_PLAIN}\n" if n == 0 and tty else line + "\n")
    stream.flush()


def size(value: float | None) -> str:
    """Bytes as people read them (``97.4 MiB``); ``-`` for None."""
    if value is None:
        return "-"
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


def duration(seconds: float | None) -> str:
    """A span as people read it: ``41s``, ``12m``, ``3.5h``, ``2.0d``; ``-`` for None."""
    if seconds is None:
        return "-"
    seconds = max(seconds, 0.0)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"
