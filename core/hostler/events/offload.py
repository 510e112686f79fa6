"""The OOM ladder's events (stream ``offload/<engine key>``): a start that died of GPU memory.

Defined beside the event base so that a log's reader registers them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hostler.events.base import Event, event_type

__all__ = ["OffloadDegraded", "offload_stream"]


def offload_stream(key: str) -> str:
    """The stream of one engine key's offload decisions."""
    return f"offload/{key}"


@event_type("offload.degraded")
@dataclass(frozen=True, slots=True)
class OffloadDegraded(Event):
    """L13: ``key``'s start died of GPU out-of-memory as ``previous``; it is retried as ``plan``.

    Attributes:
        at: When it was decided (epoch seconds).
        key: The engine key.
        panic_kind: The out-of-memory panic its log showed.
        previous: The plan it was launched with (``kind``, ``n_cpu_moe``, ``reason``).
        plan: The next plan down the ladder, kept for its later starts.
    """

    at: float
    key: str
    panic_kind: str
    previous: dict[str, Any]
    plan: dict[str, Any]
