"""The calibration event: one ready engine's measured footprint (stream ``calibration/host``).

Defined here, beside the event base, so that a log's reader registers it without importing
the capacity package (:mod:`hostler.capacity.learning` folds it and re-exports it).
"""

from __future__ import annotations

from dataclasses import dataclass

from hostler.events.base import Event, event_type

__all__ = ["CALIBRATION_STREAM", "FootprintMeasured"]

CALIBRATION_STREAM = "calibration/host"


@event_type("calibration.measured")
@dataclass(frozen=True, slots=True)
class FootprintMeasured(Event):
    """One ready engine's measured footprint beside what hostler had estimated.

    Attributes:
        engine_key: The engine measured.
        model: The model's identity (its file's name and size, or a digest).
        build: The engine build (``llama-server`` build info).
        kv_type: The KV cache type it ran with.
        ctx_total: ``--ctx-size``.
        slots: ``--parallel``.
        estimated: What hostler reserved before launch (bytes): the estimate, corrected by
            what earlier measurements had taught.
        measured: The footprint (bytes): RSS plus per-process GPU memory.
        rss: Resident set size.
        gpu: GPU memory attributed to the process (NVML), 0 without.
        buffers: The engine's own buffer-size lines, summed (0 when not logged).
    """

    engine_key: str
    model: str
    build: str
    kv_type: str
    ctx_total: int
    slots: int
    estimated: int
    measured: int
    rss: int
    gpu: int
    buffers: int
