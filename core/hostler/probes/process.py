"""What a running process occupies: RSS, and GPU memory NVML attributes to it."""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from hostler.probes.nvml import NvmlProbe

__all__ = ["ProcessFootprint", "measure_process"]


@dataclass(frozen=True, slots=True)
class ProcessFootprint:
    """Bytes a process holds: in RAM (resident set) and on GPUs (0 when unknown)."""

    rss: int
    gpu: int

    @property
    def total(self) -> int:
        """RAM plus GPU."""
        return self.rss + self.gpu


def measure_process(pid: int, probe: NvmlProbe | None = None) -> ProcessFootprint:
    """Measure a live process; raises ``psutil.NoSuchProcess`` if it is gone."""
    rss = int(psutil.Process(pid).memory_info().rss)
    gpu = probe.process_memory(pid) if probe is not None else 0
    return ProcessFootprint(rss, gpu)
