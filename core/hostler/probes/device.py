"""The device inventory: one sample of RAM and GPUs, as an observation event."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from hostler.capacity.budget import (
    CapacityBudget,
    HostMemory,
    compute_budget,
    parse_budget_override,
)
from hostler.events.base import Event, event_type
from hostler.probes.memory import is_apple_silicon, reclaimable_free_ram, total_ram
from hostler.probes.nvml import NvmlProbe

__all__ = ["DEVICE_STREAM", "DeviceSampled", "budget_from", "host_memory", "sample_device"]

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


def sample_device(probe: NvmlProbe, *, at: float) -> DeviceSampled:
    """Take one sample (driver: reads /proc, psutil, NVML and the environment)."""
    total = total_ram()
    gpus = probe.sample()
    return DeviceSampled(
        at=at,
        system_ram=total,
        free_ram=reclaimable_free_ram(total),
        apple_silicon=is_apple_silicon(),
        gpus=[dataclasses.asdict(g) for g in gpus],
        gpu_note="" if probe.available else probe.unavailable_reason,
        budget_override_gib=parse_budget_override(os.environ.get("HOSTLER_CAPACITY_BUDGET_GB")),
    )


def host_memory(sample: DeviceSampled) -> HostMemory:
    """The budget's input from a sample (pure): the largest card counts as the VRAM."""
    largest = max((int(g["total"]) for g in sample.gpus), default=0)
    return HostMemory(
        system_ram=sample.system_ram,
        vram=largest or None,
        apple_silicon=sample.apple_silicon,
    )


def budget_from(sample: DeviceSampled) -> CapacityBudget:
    """The automatic budget a sample implies (pure)."""
    return compute_budget(host_memory(sample), override_gib=sample.budget_override_gib)
