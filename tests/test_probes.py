"""Device inventory: RAM parsing, reclaimable free RAM, and NVML (absent here; faked for logic)."""

from __future__ import annotations

import logging
import types
import warnings
from typing import Any

import psutil
import pytest

from hostler.capacity.budget import BudgetKind
from hostler.capacity.units import GIB
from hostler.probes.device import DeviceSampled, budget_from, host_memory, sample_device
from hostler.probes.memory import parse_meminfo_available, parse_vm_stat, reclaimable_free_ram
from hostler.probes.nvml import open_nvml

MEMINFO = """MemTotal:       24576000 kB
MemFree:         1000000 kB
MemAvailable:   20000000 kB
Buffers:          100000 kB
"""

VM_STAT = """Mach Virtual Memory Statistics: (page size of 16384 bytes)
Pages free:                               10000.
Pages active:                            500000.
Pages inactive:                           20000.
Pages speculative:                         3000.
Pages throttled:                              0.
Pages wired down:                        100000.
Pages purgeable:                           1000.
File-backed pages:                        60000.
"""


def test_meminfo_parser() -> None:
    assert parse_meminfo_available(MEMINFO) == 20000000 * 1024
    assert parse_meminfo_available("MemTotal: 5 kB\n") is None
    assert parse_meminfo_available("MemAvailable: lots kB") is None


def test_vm_stat_parser() -> None:
    assert parse_vm_stat(VM_STAT) == (10000 + 20000 + 3000 + 1000 + 60000) * 16384
    assert parse_vm_stat("not vm_stat") is None
    empty = VM_STAT.split("\n", maxsplit=1)[0] + "\nPages free: 0.\n"
    assert parse_vm_stat(empty) is None


def test_reclaimable_free_ram_on_this_host_counts_page_cache() -> None:
    total = psutil.virtual_memory().total
    value = reclaimable_free_ram()
    assert (
        psutil.virtual_memory().free * 0.5
        <= value
        <= max(0.9 * total, psutil.virtual_memory().free)
    )


def test_nvml_absent_means_no_gpu_without_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        probe = open_nvml()
        for _ in range(50):
            assert probe.sample() == []
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    if not probe.available:
        assert "NVML" in probe.unavailable_reason or "nvidia-ml-py" in probe.unavailable_reason


class FakeNvmlError(Exception):
    pass


def fake_nvml(
    cards: list[dict[str, Any]], *, fail_init: bool = False, fail_temp: bool = False
) -> types.ModuleType:
    """A stand-in NVML module (this machine has no NVIDIA driver), shaped like nvidia-ml-py."""
    module = types.ModuleType("fake_pynvml")
    module.__dict__["NVMLError"] = FakeNvmlError

    def init() -> None:
        if fail_init:
            raise FakeNvmlError("Driver Not Loaded")

    def temperature(handle: int, sensor: int) -> int:
        if fail_temp:
            raise FakeNvmlError("Not Supported")
        return int(cards[handle]["temp"])

    module.__dict__.update(
        {
            "nvmlInit": init,
            "nvmlShutdown": lambda: None,
            "nvmlDeviceGetCount": lambda: len(cards),
            "nvmlDeviceGetHandleByIndex": lambda i: i,
            "nvmlDeviceGetMemoryInfo": lambda h: types.SimpleNamespace(
                total=cards[h]["total"], used=cards[h]["used"]
            ),
            "nvmlDeviceGetUUID": lambda h: f"GPU-{h}".encode(),
            "nvmlDeviceGetName": lambda h: cards[h]["name"],
            "nvmlDeviceGetTemperature": temperature,
            "nvmlDeviceGetCurrentClocksEventReasons": lambda h: cards[h].get("reasons", 0),
        }
    )
    return module


def test_nvml_sampling_logic_with_a_stand_in_module() -> None:
    cards = [
        {"name": "NVIDIA H200", "total": 141 * GIB, "used": 1 * GIB, "temp": 41},
        {"name": "NVIDIA L4", "total": 24 * GIB, "used": 0, "temp": 88, "reasons": 0x40},
    ]
    probe = open_nvml(fake_nvml(cards))
    samples = probe.sample()
    assert [s.uuid for s in samples] == ["GPU-0", "GPU-1"]
    assert samples[0].total == 141 * GIB and samples[0].thermal_slowdown is False
    assert samples[1].thermal_slowdown is True and samples[1].temperature_c == 88
    without_temp = open_nvml(fake_nvml(cards, fail_temp=True)).sample()
    assert without_temp[0].temperature_c is None  # unsupported fields degrade one by one
    broken = open_nvml(fake_nvml(cards, fail_init=True))
    assert not broken.available and broken.sample() == []
    assert "Driver Not Loaded" in broken.unavailable_reason


def test_device_sample_and_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOSTLER_CAPACITY_BUDGET_GB", raising=False)
    sample = sample_device(open_nvml(), at=1.0)
    assert sample.system_ram == psutil.virtual_memory().total
    assert 0 < sample.free_ram <= sample.system_ram
    card = DeviceSampled(
        1.0, 64 * GIB, 30 * GIB, False, [{"total": 24 * GIB}, {"total": 12 * GIB}], "", None
    )
    assert host_memory(card).vram == 24 * GIB  # the largest card
    assert budget_from(card).kind is BudgetKind.DISCRETE
    monkeypatch.setenv("HOSTLER_CAPACITY_BUDGET_GB", "12")
    overridden = sample_device(open_nvml(), at=2.0)
    assert overridden.budget_override_gib == 12
    assert budget_from(overridden).budget == 12 * GIB
