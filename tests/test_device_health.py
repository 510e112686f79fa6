"""The device health gate driver (DH4, DH5): admission, single flight, max wait, status."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import Any, cast

import anyio
import pytest

from hostler.clock import Clock
from hostler.errors import DeviceUnhealthyError, SettingError
from hostler.policies.health import HealthPolicy, Reading
from hostler.probes.nvml import GpuSample, NvmlProbe
from hostler.runtime.health import DeviceHealthGate, HealthSample, nvml_sampler

pytestmark = pytest.mark.anyio

GUARD = HealthPolicy(mode="guard")
OBSERVE = HealthPolicy()


class FakeTime(Clock):
    """A clock that only moves when the gate sleeps (or a test says so): each sleep passes at once."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def wall(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await anyio.lowlevel.checkpoint()

    def move_on_after(self, seconds: float) -> AbstractContextManager[anyio.CancelScope, bool]:
        return anyio.move_on_after(seconds)


class Temps:
    """A sampler replaying temperatures (the last one repeats); counts its calls."""

    def __init__(self, temps: Iterable[float | None]) -> None:
        self.temps = list(temps)
        self.calls = 0

    async def __call__(self) -> HealthSample:
        temp = self.temps[min(self.calls, len(self.temps) - 1)]
        self.calls += 1
        await anyio.lowlevel.checkpoint()
        if temp is None:
            return HealthSample((), "nvidia driver not loaded")
        return HealthSample((Reading("0", temperature_c=temp, total_mib=1000.0, used_mib=10.0),))


def gate(
    policy: HealthPolicy, temps: Iterable[float | None]
) -> tuple[DeviceHealthGate, Temps, FakeTime]:
    fake, sampler = FakeTime(), Temps(temps)
    return DeviceHealthGate(policy, sampler, clock=fake), sampler, fake


async def test_guard_holds_work_until_three_healthy_samples_after_a_hot_one() -> None:
    g, sampler, fake = gate(GUARD, [90, 74, 76, 74, 74, 74, 50])
    step = await g.admit("image workload")
    assert step is not None and step.action == "admit"
    assert sampler.calls == 6  # 90 hot, 74, 76 (over resume: reset), then three at 74
    assert fake.sleeps == [5.0] * 5
    assert (await g.status()).state == "healthy"


async def test_guard_admits_a_cool_card_at_once() -> None:
    g, sampler, fake = gate(GUARD, [79])
    await g.admit("llm workload")
    assert (sampler.calls, fake.sleeps) == (1, [])


async def test_observe_admits_unless_past_105() -> None:
    g, sampler, fake = gate(OBSERVE, [104.5])
    await g.admit("llm workload")
    assert (sampler.calls, fake.sleeps) == (1, [])
    assert (await g.status()).state == "warm"
    g, sampler, fake = gate(OBSERVE, [106, 105.5, 105])
    await g.admit("llm workload")
    assert sampler.calls == 3 and fake.sleeps == [5.0, 5.0]


async def test_max_wait_raises_device_unhealthy_naming_context_wait_reasons_and_mode() -> None:
    policy = dataclasses.replace(GUARD, max_wait=12.0)
    g, sampler, fake = gate(policy, [90])
    with pytest.raises(DeviceUnhealthyError) as caught:
        await g.admit("video workload")
    err = caught.value
    assert fake.sleeps == [5.0, 5.0, 2.0]
    assert sampler.calls == 4
    assert err.code == "device.unhealthy"
    assert (err.context, err.waited, err.mode) == ("video workload", 12.0, "guard")
    assert err.reasons == ["GPU 0 at 90 °C > resume limit 75 °C"]
    assert err.message.startswith("video workload blocked after 12.0 s")
    assert "GPU 0 at 90 °C > resume limit 75 °C" in err.message
    assert "HOSTLER_DEVICE_SAFETY_MODE=observe" in err.message
    assert "HOSTLER_DEVICE_SAFETY_MAX_WAIT_MS" in err.message
    assert (await g.status()).state == "blocked"
    # the next admission that succeeds clears the blocked state
    sampler.temps = [60.0] * 3
    sampler.calls = 0
    await g.admit("video workload")
    assert (await g.status(max_age=0.0)).state == "healthy"


async def test_observe_hard_block_past_max_wait_raises() -> None:
    g, _, _ = gate(dataclasses.replace(OBSERVE, max_wait=0.0), [110])
    with pytest.raises(DeviceUnhealthyError, match="hard limit 105"):
        await g.admit("llm workload")


async def test_concurrent_admissions_share_one() -> None:
    g, sampler, _ = gate(GUARD, [90, 74, 74, 74])
    results: dict[str, Any] = {}

    async def admit(name: str) -> None:
        results[name] = await g.admit(f"{name} workload")

    async with anyio.create_task_group() as tg:
        for name in ("llm", "image", "video"):
            tg.start_soon(admit, name)
    assert sampler.calls == 4  # one admission, not three
    steps = list(results.values())
    assert len(steps) == 3 and steps[0] is steps[1] is steps[2]


async def test_concurrent_callers_each_get_the_error_with_their_own_context() -> None:
    g, sampler, _ = gate(dataclasses.replace(GUARD, max_wait=5.0), [90])
    errors: list[DeviceUnhealthyError] = []

    async def admit(name: str) -> None:
        try:
            await g.admit(f"{name} workload")
        except DeviceUnhealthyError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(admit, "llm")
        tg.start_soon(admit, "image")
    assert sampler.calls == 2
    assert sorted(e.context for e in errors) == ["image workload", "llm workload"]
    assert all(e.waited == 5.0 for e in errors)


async def test_a_cancelled_runner_hands_the_admission_to_a_waiter() -> None:
    stuck = anyio.Event()  # never set: the first sample hangs until its caller is cancelled
    calls: list[str] = []

    async def sampler() -> HealthSample:
        calls.append("sample")
        if len(calls) == 1:
            await stuck.wait()
        return HealthSample((Reading("0", temperature_c=70.0),))

    fake = FakeTime()
    g = DeviceHealthGate(GUARD, sampler, clock=fake)
    outcome: list[str] = []
    runner_scope = anyio.CancelScope()

    async def runner() -> None:
        with runner_scope:
            await g.admit("llm workload")
            outcome.append("llm admitted")  # pragma: no cover - must not happen
        outcome.append("llm cancelled")

    async def waiter() -> None:
        await g.admit("image workload")
        outcome.append("image admitted")

    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner)
            await settle()
            assert calls == ["sample"]  # the runner's sample hangs
            tg.start_soon(waiter)
            await settle()
            assert outcome == [] and calls == ["sample"]  # the waiter joined, sampled nothing
            runner_scope.cancel()
    assert outcome == ["llm cancelled", "image admitted"]
    assert calls == ["sample", "sample"]  # the waiter ran a fresh admission


async def settle(rounds: int = 10) -> None:
    for _ in range(rounds):
        await anyio.lowlevel.checkpoint()


async def test_off_admits_without_sampling_and_status_still_reads() -> None:
    g, sampler, _ = gate(HealthPolicy(mode="off"), [200])
    assert await g.admit("llm workload") is None
    assert sampler.calls == 0
    status = await g.status()
    assert status.state == "off"
    assert status.readings[0].temperature_c == 200
    assert sampler.calls == 1


async def test_status_is_cached_for_its_max_age() -> None:
    g, sampler, fake = gate(GUARD, [50, 90])
    assert g.status_max_age == 5.0
    first = await g.status()
    fake.now += 4.9
    assert await g.status() is first
    assert sampler.calls == 1
    fake.now += 0.1
    second = await g.status()
    assert sampler.calls == 2 and second.state == "warm"
    assert second.reasons == ("GPU 0 at 90 °C > start limit 80 °C",)
    assert await g.status(max_age=0.0) is not second


async def test_no_telemetry_is_unavailable_admitted_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    g, sampler, _ = gate(GUARD, [None])
    with caplog.at_level(logging.INFO, logger="hostler.runtime.health"):
        await g.admit("llm workload")
        await g.admit("llm workload")
        status = await g.status()
    assert sampler.calls == 2  # the status reuses the admission's fresh sample
    assert status.state == "unavailable" and status.error == "nvidia driver not loaded"
    lines = [r.getMessage() for r in caplog.records if "telemetry unavailable" in r.getMessage()]
    assert lines == ["hostler: device telemetry unavailable: nvidia driver not loaded"]


async def test_no_telemetry_with_failure_block_holds_guard_work() -> None:
    policy = dataclasses.replace(GUARD, telemetry_failure="block", max_wait=0.0)
    g, _, _ = gate(policy, [None])
    with pytest.raises(DeviceUnhealthyError, match="no device telemetry"):
        await g.admit("llm workload")


async def test_a_raising_sampler_is_an_empty_sample_with_its_error() -> None:
    calls = 0

    async def broken() -> HealthSample:
        nonlocal calls
        calls += 1
        raise OSError("smi exploded")

    fake = FakeTime()
    g = DeviceHealthGate(GUARD, broken, clock=fake)
    await g.admit("llm workload")  # failure policy allow
    status = await g.status()
    assert status.state == "unavailable"
    assert "smi exploded" in status.error
    assert calls == 1  # the status reuses the admission's fresh sample


async def test_from_environment() -> None:
    fake = FakeTime()
    g = DeviceHealthGate.from_environment(
        {"max_start_temp_c": 70},
        {"HOSTLER_DEVICE_SAFETY_MODE": "guard"},
        sampler=Temps([50]),
        clock=fake,
    )
    assert g.policy == dataclasses.replace(GUARD, max_start_temp_c=70.0, resume_temp_c=70.0)
    with pytest.raises(SettingError, match="HOSTLER_DEVICE_SAFETY_POLL_MS"):
        DeviceHealthGate.from_environment(environ={"HOSTLER_DEVICE_SAFETY_POLL_MS": "often"})


class _Probe:
    def __init__(self, gpus: list[GpuSample], reason: str = "") -> None:
        self.gpus, self.unavailable_reason = gpus, reason

    def sample(self) -> list[GpuSample]:
        return self.gpus


async def test_nvml_sampler_reads_the_probe_off_the_loop() -> None:
    card = GpuSample("GPU-1", "H", 4 * 1024**3, 1024**3, 66, False, True)
    sample = await nvml_sampler(cast(NvmlProbe, _Probe([card])))()
    assert sample == HealthSample((Reading("GPU-1", 66.0, None, False, True, 4096.0, 1024.0),), "")
    sample = await nvml_sampler(cast(NvmlProbe, _Probe([], "libnvidia-ml missing")))()
    assert sample == HealthSample((), "libnvidia-ml missing")
    sample = await nvml_sampler(cast(NvmlProbe, _Probe([])))()
    assert sample.error == "NVML reports no GPU"
