"""Where a picture writes the names beside its marks: lanes that never overlap (PM36).

Pure: each mark's position and name in, the labels out, in pixels along one axis. A name is
centred under its mark, in the first lane (nearest the mark first) where it clears the label
before it; a mark whose name fits no lane is counted instead: the last lane's label just
before it becomes ``+N more``, standing for itself and every mark that did not fit after it.
So no two labels of a lane intersect, each lies within ``low``..``high`` (when it is not wider
than that), and every mark is named or counted exactly once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Placed", "more", "place_labels"]


def more(count: int) -> str:
    """The text of a label that counts ``count`` marks instead of naming them."""
    return f"+{count} more"


@dataclass(frozen=True, slots=True)
class Placed:
    """One label: its text, left edge and width (pixels), lane, and the marks it stands for.

    ``marks`` are indexes into the marks given: one for a name, ``N`` for ``+N more``.
    """

    text: str
    left: float
    width: float
    lane: int
    marks: tuple[int, ...]

    @property
    def right(self) -> float:
        """The label's right edge."""
        return self.left + self.width


def place_labels(
    marks: Sequence[tuple[float, str]],
    width: Callable[[str], float],
    *,
    lanes: int,
    low: float,
    high: float,
    gap: float,
) -> list[Placed]:
    """Label ``marks`` (each its position and name) in at most ``lanes`` lanes.

    ``width`` measures a text; labels are kept ``gap`` apart and within ``low``..``high``.
    Returns the labels, lane by lane, left to right within each.
    """
    if lanes < 1:
        raise ValueError(f"at least one lane, not {lanes}")
    rows: list[list[Placed]] = [[] for _ in range(lanes)]
    for index in sorted(range(len(marks)), key=lambda i: marks[i][0]):
        at, name = marks[index]
        size = width(name)
        left = _within(at - size / 2, size, low, high)
        lane = next(
            (n for n, row in enumerate(rows) if not row or left >= row[-1].right + gap), None
        )
        if lane is not None:
            rows[lane].append(Placed(name, left, size, lane, (index,)))
            continue
        last = rows[-1]  # no lane has room: the last lane's last label counts this mark too
        counted = (*last.pop().marks, index)
        _settle(last, lanes - 1, counted, marks, width, low=low, high=high, gap=gap)
    return [label for row in rows for label in row]


def _within(left: float, size: float, low: float, high: float) -> float:
    """``left`` moved so that a label ``size`` wide lies within ``low``..``high``."""
    return max(low, min(left, high - size))


def _settle(
    row: list[Placed],
    lane: int,
    counted: tuple[int, ...],
    marks: Sequence[tuple[float, str]],
    width: Callable[[str], float],
    *,
    low: float,
    high: float,
    gap: float,
) -> None:
    """Append ``+N more`` for ``counted`` to ``row`` (of ``lane``), merging what it would hit.

    Centred under the first mark it counts; where it reaches the label before it, that label's
    marks are counted by it too (the row shrinks each time, so this ends).
    """
    while True:
        text = more(len(counted))
        size = width(text)
        left = _within(marks[counted[0]][0] - size / 2, size, low, high)
        if not row or left >= row[-1].right + gap:
            row.append(Placed(text, left, size, lane, counted))
            return
        counted = (*row.pop().marks, *counted)
