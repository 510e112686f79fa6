"""Tables for people (rich): bold headers on a terminal, plain stable columns in a pipe.

Columns never wrap nor shrink: a terminal cuts each line at its edge; a pipe gets whole lines, so
``hostler ps | grep running`` and ``awk`` see one row per line, no colour codes.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import IO

from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["console", "duration", "print_table", "size", "table"]

#: The width of a table written to a pipe or a file: wide enough that no row wraps.
PIPE_WIDTH = 1000


def console(file: IO[str] | None = None) -> Console:
    """A console on ``file`` (stdout): colour and terminal width only on a terminal."""
    stream = file or sys.stdout
    tty = stream.isatty()
    return Console(
        file=stream,
        no_color=not tty,
        highlight=False,
        emoji=False,
        markup=False,
        width=None if tty else PIPE_WIDTH,
        force_terminal=tty,
    )


def table(headers: Sequence[str], right: Sequence[str] = ()) -> Table:
    """A borderless table with these headers (those in ``right`` right-aligned)."""
    grid = Table(box=None, pad_edge=False, show_edge=False, header_style="bold", padding=(0, 1))
    for header in headers:
        grid.add_column(
            header,
            justify="right" if header in right else "left",
            no_wrap=True,
        )
    return grid


def print_table(grid: Table, file: IO[str] | None = None) -> None:
    """Print ``grid`` (trailing spaces trimmed in a pipe)."""
    out = console(file)
    if out.is_terminal:  # whole cells, each line cut at the terminal's edge (as ps(1) does)
        wide = out.options.update_width(PIPE_WIDTH)
        for line in out.render_lines(grid, wide, pad=False):
            text = Text.assemble(*((seg.text, seg.style or "") for seg in line))
            text.rstrip()
            out.print(text, no_wrap=True, overflow="crop", crop=True)
        return
    with out.capture() as captured:
        out.print(grid)
    stream = file or sys.stdout
    for row in captured.get().splitlines():
        stream.write(row.rstrip() + "\n")
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
