"""Request queue policy (pure), first rules: lane caps, capacity, and the ambient gate.

Each engine's queue runs interactive work (a person waits) and background work (indexing,
summaries) within the engine's width; *ambient* background work (done while nobody is using the
machine) is held back by a gate so that a person's next request never finds the engine full.
The queue driver (to come) asks these functions; ``now`` and every count are observations.

Rules (docs/rules.md): Q1 widths and caps, Q5 the ambient gate, Q6 capacity.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AMBIENT_QUIET", "LaneCaps", "ambient_gate_open", "has_capacity", "lane_caps"]

#: Q5: how long nothing but ambient work must have run before ambient work may start (seconds).
AMBIENT_QUIET = 180.0


@dataclass(frozen=True, slots=True)
class LaneCaps:
    """Q1: the queue's width and each lane's cap."""

    width: int
    interactive: int
    background: int


def lane_caps(
    width: int, *, interactive: int | None = None, background: int | None = None
) -> LaneCaps:
    """Q1: each lane's cap defaults to the width and is clamped to [1, width].

    Raises:
        ValueError: ``width`` is below 1 (a queue that can run nothing).
    """
    if width < 1:
        raise ValueError(f"a queue's width must be at least 1, not {width}")

    def clamp(cap: int | None) -> int:
        return width if cap is None else min(max(cap, 1), width)

    return LaneCaps(width, clamp(interactive), clamp(background))


def has_capacity(
    running: int, lane_running: int, lane_cap: int, width: int, extra: int = 0
) -> bool:
    """Q6: room for ``extra`` more besides what runs: under the width and under the lane's cap."""
    return running + extra < width and lane_running + extra < lane_cap


def ambient_gate_open(
    *,
    caps: LaneCaps,
    running: int,
    non_ambient_running: int,
    non_ambient_pending: int,
    quiet_for: float,
    quiet_window: float = AMBIENT_QUIET,
) -> bool:
    """Q5: whether ambient work may start now.

    Open when the gate is off (``quiet_window`` 0 or less); or when, leaving one interactive
    slot free for a person's next request, there is still room (``running < interactive - 1``);
    or when nothing else runs or waits and it has been quiet for the whole window (equality
    counts as quiet).
    """
    if quiet_window <= 0:
        return True
    if running < caps.interactive - 1:  # with a cap of 1 there is no spare: never by this
        return True
    idle = non_ambient_running == 0 and non_ambient_pending == 0
    return idle and quiet_for >= quiet_window
