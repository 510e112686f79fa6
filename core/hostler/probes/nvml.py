"""NVIDIA GPUs through NVML (``nvidia-ml-py``), degrading to "no GPU" on any NVML error.

The binding is untyped and optional at run time: this module is the only one that touches it,
and it turns everything into frozen dataclasses.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

__all__ = ["GpuSample", "NvmlProbe", "open_nvml"]

log = logging.getLogger(__name__)
T = TypeVar("T")

# clocks-event (throttle) reason bits that mean "too hot" or "power brake"
_HW_SLOWDOWN = 0x8
_SW_THERMAL = 0x20
_HW_THERMAL = 0x40
_HW_POWER_BRAKE = 0x80


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One card at one moment (None where the driver does not say)."""

    uuid: str
    name: str
    total: int
    used: int
    temperature_c: int | None = None
    thermal_slowdown: bool | None = None
    power_brake: bool | None = None


class NvmlProbe:
    """Samples every NVIDIA card; an empty list when NVML is absent or failing."""

    def __init__(self, module: ModuleType | None, reason: str = "") -> None:
        self._nvml = module
        self.unavailable_reason = reason

    @property
    def available(self) -> bool:
        """Whether NVML answered at start."""
        return self._nvml is not None

    def sample(self) -> list[GpuSample]:
        """Every card, keyed by UUID; never raises (a failing call degrades to no GPU)."""
        nvml = self._nvml
        if nvml is None:
            return []
        try:
            count = int(nvml.nvmlDeviceGetCount())
            return [self._device(nvml, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
        except nvml.NVMLError as exc:
            self._disable(f"NVML failed while sampling: {exc}")
            return []

    def _device(self, nvml: Any, handle: Any) -> GpuSample:
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        name = _text(nvml.nvmlDeviceGetName(handle))
        temperature = _optional(nvml, lambda: int(nvml.nvmlDeviceGetTemperature(handle, 0)))
        reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        reasons = _optional(nvml, lambda: int(reasons_fn(handle))) if reasons_fn else None
        return GpuSample(
            uuid=uuid,
            name=name,
            total=int(memory.total),
            used=int(memory.used),
            temperature_c=temperature,
            thermal_slowdown=None
            if reasons is None
            else bool(reasons & (_HW_SLOWDOWN | _SW_THERMAL | _HW_THERMAL)),
            power_brake=None if reasons is None else bool(reasons & _HW_POWER_BRAKE),
        )

    def process_memory(self, pid: int) -> int:
        """GPU bytes NVML attributes to ``pid`` on every card (best effort, 0 when unknown).

        Inside containers the driver may report pids of another namespace; then this is 0.
        """
        nvml = self._nvml
        if nvml is None:
            return 0
        total = 0
        try:
            for index in range(int(nvml.nvmlDeviceGetCount())):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    if int(process.pid) == pid and process.usedGpuMemory is not None:
                        total += int(process.usedGpuMemory)
        except nvml.NVMLError:
            return 0
        return total

    def _disable(self, reason: str) -> None:
        # One line, once: a host without a working GPU is normal, not a warning storm.
        log.info("hostler: GPUs unavailable: %s", reason)
        self._nvml = None
        self.unavailable_reason = reason

    def close(self) -> None:
        """Shut NVML down (idempotent)."""
        nvml, self._nvml = self._nvml, None
        if nvml is not None:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional(nvml: Any, read: Callable[[], T]) -> T | None:
    try:
        return read()
    except nvml.NVMLError:
        return None


def open_nvml(module: ModuleType | None = None) -> NvmlProbe:
    """Initialise NVML once; without a library, driver or permission: a probe of no GPUs."""
    if module is None:
        try:
            import pynvml  # noqa: PLC0415 - optional at run time; absence is normal
        except ImportError as exc:
            return NvmlProbe(None, f"nvidia-ml-py not importable ({exc})")
        module = pynvml
    try:
        module.nvmlInit()
    except module.NVMLError as exc:
        return NvmlProbe(None, f"NVML not available ({exc})")
    return NvmlProbe(module)
