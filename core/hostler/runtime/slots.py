"""GPU slots of engines: the slot an engine's work uses, and its evictor with the arbiter (GA1).

Every engine the pool makes has an evictor registered with the GPU arbiter under its own slot
(GA8): when another slot takes the card in ``swap`` mode, the arbiter calls it, and it unloads
the engine if it is idle. :class:`SlotEvictors` is built once by the pool, given the arbiter
and the pool's unload; the pool registers each supervisor it makes with it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hostler.engines.supervisor import Supervisor
from hostler.errors import HostlerError
from hostler.policies.arbiter import SLOTS
from hostler.runtime.arbiter import GpuArbiter

__all__ = ["SLOT_SWAP", "SlotEvictors", "gpu_slot"]

log = logging.getLogger(__name__)

#: The stop decision of an engine unloaded because another GPU slot takes the card (GA1); its
#: ``slot`` is the engine's own (GA8).
SLOT_SWAP: Mapping[str, Any] = {"rule": "GA1", "cause": "gpu-slot-swap", "slot": "llm"}

#: Unload one idle engine with a stop decision; False when it was not resident (PP6).
Unload = Callable[[str, dict[str, Any]], Awaitable[bool]]


def gpu_slot(supervisor: Supervisor) -> str:
    """GA8: the GPU slot an engine's requests use (its adapter's ``gpu_slot``; ``llm``)."""
    slot = getattr(supervisor.adapter, "gpu_slot", "llm")
    return slot if slot in SLOTS else "llm"


@dataclass(frozen=True, slots=True)
class _SlotEvictor:
    """One engine's GA1 evictor: unload it when idle, for another slot's work."""

    key: str
    slot: str
    unload: Unload

    async def __call__(self) -> None:
        try:
            await self.unload(self.key, {**SLOT_SWAP, "slot": self.slot})
        except HostlerError as exc:
            log.warning("hostler: %s: not unloaded for another GPU slot: %s", self.key, exc.message)


class SlotEvictors:
    """Registers each engine's evictor with the GPU arbiter, under the engine's own slot.

    Args:
        arbiter: The GPU arbiter (None: no arbiter, nothing is registered).
        unload: The pool's unload of one idle engine.
    """

    def __init__(self, arbiter: GpuArbiter | None, unload: Unload) -> None:
        self._arbiter = arbiter
        self._unload = unload

    def register(self, supervisor: Supervisor) -> None:
        """GA1, GA8: ``supervisor``'s engine unloads when idle if another slot takes the card."""
        if self._arbiter is None:
            return
        key, slot = supervisor.key, gpu_slot(supervisor)
        self._arbiter.register_evictor(slot, _SlotEvictor(key, slot, self._unload), owner=key)
