"""Each engine's request queue and physical gate, made on first use, as wide as its launch.

:class:`EngineLanes` keeps, per engine key, the logical
:class:`~hostler.runtime.queue.RequestQueue` in front of the engine and the physical
:class:`~hostler.runtime.gate.RequestGate` inside it (EG1), made together, and sets their
width from the slots the engine was launched with (PP14).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from hostler.clock import Clock
from hostler.errors import UsageError
from hostler.plugin import LaunchSpec
from hostler.policies.queue import engine_queue_caps
from hostler.runtime.gate import RequestGate
from hostler.runtime.queue import QueueSummary, RequestQueue
from hostler.runtime.writer import QueueEventWriter

__all__ = ["EngineLanes"]


@dataclass(frozen=True, slots=True)
class _Lane:
    queue: RequestQueue
    gate: RequestGate


class EngineLanes:
    """The queues and gates of the runtime's engines.

    Args:
        writer: Where each queue's events go (stream ``queue/<key>``).
        clock: The runtime's clock (a request's times line up with the engine's, PM).
    """

    def __init__(self, writer: QueueEventWriter, clock: Clock) -> None:
        self._writer = writer
        self._clock = clock
        self._lanes: dict[str, _Lane] = {}

    def queue(self, key: str) -> RequestQueue:
        """``key``'s request queue, made (one wide, with its gate) on first use."""
        return self._lane(key).queue

    def gate(self, key: str) -> RequestGate:
        """``key``'s physical gate, made (one wide, with its queue) on first use."""
        return self._lane(key).gate

    def engine_keys(self) -> list[str]:
        """The keys that have a queue and a gate, sorted."""
        return sorted(self._lanes)

    def busy(self, key: str) -> bool:
        """Whether ``key``'s queue holds or runs requests (the pool's busy hint, PP4)."""
        lane = self._lanes.get(key)
        return lane is not None and lane.queue.busy

    def fit(self, key: str, spec: LaunchSpec | None) -> None:
        """PP14: ``key``'s queue and gate as wide as the slots it was launched with."""
        lane = self._lane(key)
        width = spec.slots if spec is not None else 1
        if lane.gate.width != width:
            lane.gate.set_width(width)
            caps = engine_queue_caps(width)
            lane.queue.set_width(
                caps.width, interactive_cap=caps.interactive, background_cap=caps.background
            )

    def describe(self) -> dict[str, QueueSummary]:
        """Q9: every queue — what runs, what waits, positions, the live width — by key."""
        return {key: lane.queue.describe() for key, lane in sorted(self._lanes.items())}

    def cancel(self, key: str, request_id: int) -> bool:
        """Q7: cancel a queued request of ``key``'s queue; False when it is not queued."""
        lane = self._lanes.get(key)
        return lane is not None and lane.queue.cancel(request_id)

    def move(self, key: str, request_id: int, direction: str) -> bool:
        """Q8: move a queued request up or down its lane; False at an edge or unknown.

        Raises:
            UsageError: ``direction`` is neither ``up`` nor ``down``.
        """
        if direction not in ("up", "down"):
            raise UsageError(f"a queued request moves up or down, not {str(direction)[:20]!r}")
        lane = self._lanes.get(key)
        return lane is not None and lane.queue.move(request_id, direction)  # type: ignore[arg-type]

    def _lane(self, key: str) -> _Lane:
        lane = self._lanes.get(key)
        if lane is None:
            queue = RequestQueue.for_engine(
                key,
                1,
                record=functools.partial(self._writer.record_queue, key),
                clock=self._clock,
            )
            lane = self._lanes[key] = _Lane(queue, RequestGate(1))
        return lane
