"""The device sampled now and then: a sample recorded when the budget's inputs change."""

from __future__ import annotations

import logging

import anyio

from hostler.capacity.budget import CapacityBudget
from hostler.clock import Clock
from hostler.errors import HostlerError
from hostler.probes.device import DEVICE_STREAM, budget_from, sample_device
from hostler.probes.nvml import NvmlProbe
from hostler.store.log import EventStore

__all__ = ["DeviceWatch"]

log = logging.getLogger("hostler.daemon")  # the daemon's records keep its logger's name


class DeviceWatch:
    """Samples the device now and then; records a sample when the budget's inputs change."""

    def __init__(
        self, store: EventStore, probe: NvmlProbe, clock: Clock, interval: float = 30.0
    ) -> None:
        self.store = store
        self.probe = probe
        self.clock = clock
        self.interval = interval
        self.budget: CapacityBudget
        self._last: tuple[object, ...] | None = None

    def sample(self) -> None:
        """Take a sample; record it if RAM, cards or the override changed."""
        sample = sample_device(self.probe, at=self.clock.wall())
        fingerprint = (
            sample.system_ram,
            tuple((g["uuid"], g["total"]) for g in sample.gpus),
            sample.budget_override_gib,
        )
        if fingerprint != self._last:
            self.store.append(DEVICE_STREAM, [sample], expected_version=None)
            self._last = fingerprint
        self.budget = budget_from(sample)

    async def run(self) -> None:
        """Sample every ``interval`` seconds until cancelled; a failed sample is tried later."""
        complained = ""
        while True:
            await self.clock.sleep(self.interval)
            try:
                await anyio.to_thread.run_sync(self.sample)
                complained = ""
            except HostlerError as exc:  # the log or the probe: the old budget stands
                if exc.message != complained:
                    log.error("hostler: device sample not recorded: %s", exc.message)  # noqa: TRY400
                    complained = exc.message
