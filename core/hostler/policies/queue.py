"""Request queue policy (pure): lane caps, the ambient gate, and which request runs next.

Each engine's queue runs interactive work (a person waits) and background work (indexing,
summaries) within the engine's width; *ambient* background work (done while nobody is using the
machine) is held back by a gate so that a person's next request never finds the engine full.
The queue driver (:mod:`hostler.runtime.queue`) asks these functions; ``now`` and every count
are observations, and every pick carries a ``decision`` with the inputs it used.

Rules (docs/rules.md): Q1 widths and caps, Q4 the pick order, Q5 the ambient gate, Q6 capacity,
Q8 moving a request, Q10 how many are ahead, Q11 the background cap, Q12 an engine's queue shape.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "AFFINITY_WINDOW",
    "AMBIENT_QUIET",
    "AMBIENT_RECHECK_MARGIN",
    "MAX_WAIT",
    "POLICY_NAME",
    "POLICY_VERSION",
    "RECENT_CAP",
    "WAIT_NOTICE",
    "Lane",
    "LaneCaps",
    "Pending",
    "Pick",
    "RecentRun",
    "Running",
    "ahead_of",
    "ambient_gate_open",
    "ambient_recheck_in",
    "background_lane_cap",
    "engine_queue_caps",
    "has_capacity",
    "lane_caps",
    "move_pending",
    "pick_next",
    "prune_recent",
]

POLICY_NAME = "request-queue"
POLICY_VERSION = 1

#: Q5: how long nothing but ambient work must have run before ambient work may start (seconds).
AMBIENT_QUIET = 180.0
#: Q5: a re-check scheduled for the end of the quiet window lands this much after it (seconds).
AMBIENT_RECHECK_MARGIN = 0.025
#: Q4: runs that ended at most this long ago still count for affinity (seconds).
AFFINITY_WINDOW = 30.0
#: Q4: the starvation bound: a request waiting this long goes before any that waited less.
MAX_WAIT = 60.0
#: Q3: how many ended runs the queue remembers for affinity.
RECENT_CAP = 64
#: Q10: a waiter still queued after this long is told how many are ahead of it (seconds).
WAIT_NOTICE = 0.2

Lane = Literal["interactive", "background"]


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


def ambient_recheck_in(
    *,
    caps: LaneCaps,
    running: int,
    non_ambient_running: int,
    non_ambient_pending: int,
    quiet_for: float,
    quiet_window: float = AMBIENT_QUIET,
) -> float | None:
    """Q5: seconds until ambient work held only by the quiet window should be looked at again.

    None when the gate is open, or when other (non-ambient) work runs or waits: then a release
    or a dispatch re-drains the queue, and no timer is needed. Otherwise the rest of the window
    plus :data:`AMBIENT_RECHECK_MARGIN`.
    """
    gate = ambient_gate_open(
        caps=caps,
        running=running,
        non_ambient_running=non_ambient_running,
        non_ambient_pending=non_ambient_pending,
        quiet_for=quiet_for,
        quiet_window=quiet_window,
    )
    if gate or non_ambient_running > 0 or non_ambient_pending > 0:
        return None
    return max(quiet_window - quiet_for, 0.0) + AMBIENT_RECHECK_MARGIN


def background_lane_cap(engine_width: int) -> int:
    """Q11: the background lane of an engine ``engine_width`` wide: one less, at least 1."""
    return max(1, engine_width - 1)


def engine_queue_caps(
    engine_width: int, *, configured: int = 1, single_lane: bool = False
) -> LaneCaps:
    """Q12: the queue in front of a local engine with ``engine_width`` slots.

    Interactive work may fill every slot; the queue is one wider (or ``configured``, if more)
    so a background one-shot that a running interactive turn awaits can still dispatch instead
    of deadlocking; background work gets :func:`background_lane_cap`. An engine that cannot take
    the extra lane (``single_lane``) gets width 1 and caps of 1.

    Raises:
        ValueError: ``engine_width`` is below 1.
    """
    if engine_width < 1:
        raise ValueError(f"an engine's width must be at least 1, not {engine_width}")
    if single_lane:
        return LaneCaps(1, 1, 1)
    width = max(configured, engine_width + 1)
    return LaneCaps(width, engine_width, background_lane_cap(engine_width))


def ahead_of(lane: Lane, *, running: int, queued_interactive: int, queued_background: int) -> int:
    """Q10: how many requests are ahead of a queued one (the waiter itself is among the queued).

    Interactive work counts what runs and the queued interactive requests; background work also
    counts the queued background ones (interactive work always goes first). Never negative.
    """
    queued = queued_interactive if lane == "interactive" else queued_interactive + queued_background
    return max(0, running + queued - 1)


@dataclass(frozen=True, slots=True)
class Pending:
    """A queued request as the pick sees it.

    ``order`` ranks requests of a lane (lower goes first; the driver gives arrival order and
    swaps it on a move, Q8); ``enqueued_at`` is when it arrived, which alone says how long it
    has waited. ``group`` is the wider affinity key (an agent, a project); ``affinity`` False
    scores it 0 whatever it shares.
    """

    id: int
    lane: Lane
    enqueued_at: float
    order: int
    ambient: bool = False
    session_id: str | None = None
    group: str | None = None
    affinity: bool = True


@dataclass(frozen=True, slots=True)
class Running:
    """A request that holds a slot now."""

    id: int
    lane: Lane
    started_at: float
    ambient: bool = False
    session_id: str | None = None
    group: str | None = None


@dataclass(frozen=True, slots=True)
class RecentRun:
    """A run that ended: its affinity keys and when it ended."""

    session_id: str | None
    group: str | None
    ended_at: float


def prune_recent(
    recent: Iterable[RecentRun],
    now: float,
    *,
    window: float = AFFINITY_WINDOW,
    cap: int = RECENT_CAP,
) -> tuple[RecentRun, ...]:
    """Q3: the ended runs still worth remembering: ended within ``window``, the newest ``cap``."""
    kept = [run for run in recent if now - run.ended_at <= window]
    kept.sort(key=lambda run: run.ended_at)
    return tuple(kept[len(kept) - cap :]) if cap > 0 else ()


@dataclass(frozen=True, slots=True)
class Pick:
    """Q4's answer: the request to dispatch (None: nothing may start) and why."""

    id: int | None
    decision: dict[str, Any]


def _score(item: Pending, contexts: Sequence[tuple[str | None, str | None]]) -> int:
    if not item.affinity:
        return 0
    if item.session_id is not None and any(s == item.session_id for s, _ in contexts):
        return 2
    if item.group is not None and any(g == item.group for _, g in contexts):
        return 1
    return 0


def pick_next(
    pending: Sequence[Pending],
    *,
    running: Sequence[Running],
    recent: Sequence[RecentRun],
    caps: LaneCaps,
    now: float,
    ambient_open: bool,
    affinity: bool = True,
    max_wait: float = MAX_WAIT,
    window: float = AFFINITY_WINDOW,
) -> Pick:
    """Q4: which queued request runs next, if any.

    Nothing starts when the width is full. A request is *eligible* when its lane is under its
    cap and it is not ambient work held by the closed gate (``ambient_open`` False; such work
    is invisible to the starvation bound too). Then, in order:

    1. starvation: among eligible requests that waited ``max_wait`` or more, interactive ones
       first, then the first in queue order;
    2. the lane: interactive when it has an eligible request, else background;
    3. with ``affinity`` off, the first in queue order of that lane;
    4. with it on, the highest score against what runs and what ended within ``window``
       (2: same session, 1: same group, 0: neither, or the request opted out), ties by order.
    """
    lanes_running = {
        "interactive": sum(1 for r in running if r.lane == "interactive"),
        "background": sum(1 for r in running if r.lane == "background"),
    }
    cap = {"interactive": caps.interactive, "background": caps.background}
    decision: dict[str, Any] = {
        "policy": POLICY_NAME,
        "version": POLICY_VERSION,
        "running": len(running),
        "running_interactive": lanes_running["interactive"],
        "running_background": lanes_running["background"],
        "width": caps.width,
        "interactive_cap": caps.interactive,
        "background_cap": caps.background,
        "ambient_open": ambient_open,
        "pending": len(pending),
    }
    if len(running) >= caps.width:
        return Pick(None, {**decision, "rule": "full"})
    eligible = [
        p
        for p in pending
        if lanes_running[p.lane] < cap[p.lane] and (ambient_open or not p.ambient)
    ]

    def chosen(item: Pending, rule: str, **extra: Any) -> Pick:
        waited = round(max(now - item.enqueued_at, 0.0), 3)
        return Pick(
            item.id,
            {**decision, "rule": rule, "id": item.id, "lane": item.lane, "waited": waited, **extra},
        )

    starving = [p for p in eligible if now - p.enqueued_at >= max_wait]
    if starving:
        first = min(starving, key=lambda p: (p.lane != "interactive", p.order))
        return chosen(first, "starvation", max_wait=max_wait, starving=len(starving))
    interactive = [p for p in eligible if p.lane == "interactive"]
    candidates = interactive or [p for p in eligible if p.lane == "background"]
    if not candidates:
        return Pick(None, {**decision, "rule": "none", "eligible": 0})
    if not affinity:
        return chosen(min(candidates, key=lambda p: p.order), "oldest", affinity=False)
    contexts = [(r.session_id, r.group) for r in running]
    contexts += [(r.session_id, r.group) for r in recent if now - r.ended_at <= window]
    scores = {p.id: _score(p, contexts) for p in candidates}
    best = min(candidates, key=lambda p: (-scores[p.id], p.order))
    return chosen(
        best,
        "affinity" if scores[best.id] > 0 else "oldest",
        score=scores[best.id],
        scores={str(i): s for i, s in scores.items()},
        window=window,
    )


def move_pending(
    pending: Sequence[Pending], item_id: int, direction: Literal["up", "down"]
) -> dict[int, int] | None:
    """Q8: swap a queued request with its neighbour in its own lane's order.

    Returns the new ``order`` of the two requests, or None when the id is not queued or the
    request is already first (``up``) or last (``down``) of its lane. Only ranks change: how
    long each has waited (``enqueued_at``) stays true, so a move never shifts the starvation
    bound.
    """
    item = next((p for p in pending if p.id == item_id), None)
    if item is None:
        return None
    lane = sorted((p for p in pending if p.lane == item.lane), key=lambda p: p.order)
    at = lane.index(item)
    to = at - 1 if direction == "up" else at + 1
    if not 0 <= to < len(lane):
        return None
    other = lane[to]
    return {item.id: other.order, other.id: item.order}
