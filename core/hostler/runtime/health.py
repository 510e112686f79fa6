"""The device health gate (anyio driver): holds GPU work while a card is too hot.

It samples the cards (NVML through :class:`~hostler.probes.nvml.NvmlProbe`, on a worker
thread; tests inject a sampler), asks the pure policy (:mod:`hostler.policies.health`) after
each sample, and either admits the work, sleeps a poll interval, or — past the max wait —
raises :class:`~hostler.errors.DeviceUnhealthyError`. Concurrent admissions share one
(single flight, DH4). :meth:`DeviceHealthGate.status` is a cached snapshot (DH5).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread

from hostler.clock import SYSTEM_CLOCK, ClockLike, as_clock
from hostler.errors import DeviceUnhealthyError
from hostler.policies.health import (
    AdmissionState,
    AdmissionStep,
    HealthPolicy,
    Reading,
    admission_step,
    evaluate,
    health_state,
    readings_from_gpus,
    resolve_health_policy,
)
from hostler.probes.nvml import NvmlProbe, open_nvml

__all__ = ["DeviceHealthGate", "HealthSample", "HealthStatus", "nvml_sampler"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HealthSample:
    """One sample of every card; ``error`` says why there are none (telemetry is optional)."""

    readings: tuple[Reading, ...] = ()
    error: str = ""


Sampler = Callable[[], Awaitable[HealthSample]]


def nvml_sampler(probe: NvmlProbe | None = None) -> Sampler:
    """A sampler that reads NVML on a worker thread (NVML is opened on first use)."""
    opened: list[NvmlProbe] = [] if probe is None else [probe]

    def read() -> HealthSample:
        if not opened:
            opened.append(open_nvml())
        nvml = opened[0]
        gpus = nvml.sample()
        readings = readings_from_gpus(dataclasses.asdict(g) for g in gpus)
        error = "" if readings else (nvml.unavailable_reason or "NVML reports no GPU")
        return HealthSample(readings, error)

    async def sample() -> HealthSample:
        return await anyio.to_thread.run_sync(read)

    return sample


@dataclass(frozen=True, slots=True)
class HealthStatus:
    """DH5: the device as last seen.

    Attributes:
        state: ``off``, ``unavailable``, ``healthy``, ``blocked``, ``cooling`` or ``warm``.
        mode: The gate's mode.
        readings: The cards (read in every mode, ``off`` included).
        reasons: Why work would be held now.
        error: Why there is no telemetry, if there is none.
        sampled_at: When (the gate's clock).
    """

    state: str
    mode: str
    readings: tuple[Reading, ...]
    reasons: tuple[str, ...]
    error: str
    sampled_at: float


@dataclass
class _Flight:
    """One admission in progress, shared by every caller that arrives meanwhile."""

    done: anyio.Event = field(default_factory=anyio.Event)
    step: AdmissionStep | None = None
    waited: float = 0.0
    abandoned: bool = False


class DeviceHealthGate:
    """Admits GPU work when the cards are healthy enough (DH3–DH5).

    Args:
        policy: The settings (default: DH1's defaults; see :meth:`from_environment`).
        sampler: Takes one sample (default: NVML, off the event loop). A sampler that raises
            counts as a sample with no readings and the error (DH5).
        clock: The clock: monotonic time for the waits' lengths, sleeps between samples.
        status_max_age: How long :meth:`status` reuses its last sample (seconds).
    """

    def __init__(
        self,
        policy: HealthPolicy | None = None,
        sampler: Sampler | None = None,
        *,
        clock: ClockLike = SYSTEM_CLOCK,
        status_max_age: float = 5.0,
    ) -> None:
        self.policy = policy or HealthPolicy()
        self._sampler = sampler or nvml_sampler()
        self._clock = as_clock(clock)
        self.status_max_age = status_max_age
        self._cooling = False
        self._blocked = False
        self._flight: _Flight | None = None
        self._status: HealthStatus | None = None
        self._last_error = ""

    @classmethod
    def from_environment(
        cls,
        config: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> DeviceHealthGate:
        """A gate whose policy is DH1's resolution of the environment over ``config``.

        Raises:
            SettingError: A ``HOSTLER_DEVICE_*`` variable is malformed (named).
            UsageError: A ``config`` value is malformed (named).
        """
        env = os.environ if environ is None else environ
        return cls(resolve_health_policy(env, config), **kwargs)

    async def sample(self) -> HealthSample:
        """One sample; a failing sampler gives none, with its error (logged once per change)."""
        try:
            result = await self._sampler()
        except Exception as exc:  # noqa: BLE001 - telemetry is optional; never fatal
            result = HealthSample((), f"device telemetry failed: {exc!r}")
        if result.error and result.error != self._last_error:
            log.info("hostler: device telemetry unavailable: %s", result.error)
        self._last_error = result.error
        return result

    async def admit(self, context: str) -> AdmissionStep | None:
        """DH4: wait until ``context``'s GPU work may start; concurrent callers share one wait.

        Returns the admitting step (None in mode ``off``, which samples nothing).

        Raises:
            DeviceUnhealthyError: The max wait passed and the cards were still not healthy.
        """
        if self.policy.mode == "off":
            return None
        while True:
            flight = self._flight
            if flight is None:
                return await self._run_flight(context)
            await flight.done.wait()
            if flight.abandoned:
                continue  # its runner was cancelled: run a fresh one
            step = flight.step
            assert step is not None  # noqa: S101 - a finished flight has its step
            if step.action == "blocked":
                raise self._error(context, flight.waited, step)
            return step

    async def _run_flight(self, context: str) -> AdmissionStep:
        flight = self._flight = _Flight()
        try:
            step, waited = await self._admission()
            flight.step, flight.waited = step, waited
        except BaseException:
            flight.abandoned = True
            raise
        finally:
            self._flight = None
            flight.done.set()
        if step.action == "blocked":
            raise self._error(context, waited, step)
        return step

    async def _admission(self) -> tuple[AdmissionStep, float]:
        start = self._clock.monotonic()
        state = AdmissionState(0, self._cooling)
        while True:
            sample = await self.sample()
            elapsed = self._clock.monotonic() - start
            step = admission_step(state, sample.readings, self.policy, elapsed)
            self._cooling = step.state.cooling
            self._blocked = step.action == "blocked"
            self._remember(sample)
            if step.action != "wait":
                if step.action == "blocked":
                    log.warning(
                        "hostler: device health gate blocked GPU work after %.1f s: %s",
                        elapsed,
                        "; ".join(step.evaluation.reasons),
                    )
                return step, elapsed
            await self._clock.sleep(step.sleep)
            state = step.state

    def _error(self, context: str, waited: float, step: AdmissionStep) -> DeviceUnhealthyError:
        return DeviceUnhealthyError(
            context, waited, list(step.evaluation.reasons), self.policy.mode
        )

    def _remember(self, sample: HealthSample) -> None:
        evaluation = evaluate(self.policy, sample.readings, self._cooling)
        state = health_state(
            self.policy,
            evaluation,
            cooling=self._cooling,
            blocked=self._blocked,
            telemetry=bool(sample.readings),
        )
        self._status = HealthStatus(
            state,
            self.policy.mode,
            sample.readings,
            evaluation.reasons,
            sample.error,
            self._clock.monotonic(),
        )

    async def status(self, max_age: float | None = None) -> HealthStatus:
        """DH5: the device as of at most ``max_age`` seconds ago (default ``status_max_age``)."""
        limit = self.status_max_age if max_age is None else max_age
        cached = self._status
        if cached is not None and self._clock.monotonic() - cached.sampled_at < limit:
            return cached
        sample = await self.sample()
        self._remember(sample)
        assert self._status is not None  # noqa: S101 - just set
        return self._status
