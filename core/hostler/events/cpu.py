"""What an engine build cannot run on this CPU (stream ``cpu/host``), learned from a start.

Defined beside the event base so that a log's reader registers it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hostler.events.base import Event, event_type

__all__ = ["CPU_STREAM", "CpuUnsupported"]

CPU_STREAM = "cpu/host"


@event_type("cpu.unsupported")
@dataclass(frozen=True, slots=True)
class CpuUnsupported(Event):
    """L22: a start died of SIGILL before ready: this build cannot run ``what`` on this CPU.

    Attributes:
        at: When it was learned (epoch seconds).
        key: The engine whose start taught it.
        build: The engine build (its adapter's ``build_identity``).
        cpu: The CPU (:func:`hostler.probes.cpu.cpu_identity`).
        what: ``quantized-kv`` (a quantized KV cache: the next start of every model of this
            build runs f16 KV) or ``weights`` (the model's own weights: it cannot run here).
        kv_type: The KV cache type the start was launched with.
        model: The model's identity (its adapter's ``model_identity``).
        message: The start's failure, as it was told.
    """

    at: float
    key: str
    build: str
    cpu: str
    what: str
    kv_type: str
    model: str
    message: str
