"""The device inventory event: one sample of RAM and GPUs (stream ``device/host``).

Defined here, beside the event base, so that a log's reader registers it without importing
the probes (:mod:`hostler.probes.device` takes the samples and re-exports it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hostler.events.base import Event, event_type

__all__ = ["DEVICE_STREAM", "DeviceSampled"]

DEVICE_STREAM = "device/host"


@event_type("device.sampled")
@dataclass(frozen=True, slots=True)
class DeviceSampled(Event):
    """What the machine looked like: the observation every capacity decision starts from.

    Attributes:
        at: Observation time (epoch seconds).
        system_ram: Total RAM in bytes.
        free_ram: Reclaimable free RAM in bytes (page cache counted).
        apple_silicon: macOS on arm64.
        gpus: One dict per card (uuid, name, total, used, temperature_c, thermal_slowdown,
            power_brake).
        gpu_note: Why there are no GPUs, when NVML is unavailable.
        budget_override_gib: ``HOSTLER_CAPACITY_BUDGET_GB`` as read, if set and valid.
    """

    at: float
    system_ram: int
    free_ram: int
    apple_silicon: bool
    gpus: list[dict[str, Any]]
    gpu_note: str
    budget_override_gib: float | None
