"""The device inventory: one sample of RAM and GPUs, as an observation event."""

from __future__ import annotations

import dataclasses
import os

from hostler.capacity.budget import (
    CapacityBudget,
    HostMemory,
    compute_budget,
    parse_budget_override,
)
from hostler.events.device import DEVICE_STREAM, DeviceSampled
from hostler.probes.memory import is_apple_silicon, reclaimable_free_ram, total_ram
from hostler.probes.nvml import NvmlProbe

__all__ = ["DEVICE_STREAM", "DeviceSampled", "budget_from", "host_memory", "sample_device"]


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
