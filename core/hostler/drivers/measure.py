"""Measure a ready engine and learn from it (driver): the "measure → learn" half of the loop.

Once an engine answers its readiness probe, its real footprint (RSS, plus GPU memory NVML
attributes to it) is recorded as a :class:`~hostler.capacity.learning.FootprintMeasured`
event in the host's calibration stream, and the ledger holds the measured figure instead of
the estimate the engine was admitted with.
"""

from __future__ import annotations

from dataclasses import dataclass

from hostler.capacity.cpu_limits import CPU_STREAM, CpuLimits, CpuUnsupported
from hostler.capacity.learning import CALIBRATION_STREAM, Calibration, FootprintMeasured
from hostler.drivers.host_ledger import HostLedger
from hostler.events.fold import fold
from hostler.probes.nvml import NvmlProbe
from hostler.probes.process import measure_process
from hostler.store.log import EventStore

__all__ = ["LaunchFacts", "load_calibration", "load_cpu_limits", "record_launch"]


@dataclass(frozen=True, slots=True)
class LaunchFacts:
    """What identifies a launch for learning: the model, the build and the shape."""

    engine_key: str
    model: str
    build: str
    kv_type: str
    ctx_total: int
    slots: int
    estimated: int


def record_launch(
    ledger: HostLedger,
    facts: LaunchFacts,
    pid: int,
    *,
    buffers: int = 0,
    probe: NvmlProbe | None = None,
) -> FootprintMeasured:
    """Measure ``pid``, record the measurement, and make the ledger hold it."""
    footprint = measure_process(pid, probe)
    event = FootprintMeasured(
        engine_key=facts.engine_key,
        model=facts.model,
        build=facts.build,
        kv_type=facts.kv_type,
        ctx_total=facts.ctx_total,
        slots=facts.slots,
        estimated=facts.estimated,
        measured=footprint.total,
        rss=footprint.rss,
        gpu=footprint.gpu,
        buffers=buffers,
    )
    ledger.store.append(CALIBRATION_STREAM, [event], expected_version=None)
    ledger.record_measured(facts.engine_key, footprint.total)
    return event


def load_calibration(store: EventStore) -> Calibration:
    """Fold every recorded measurement of the host (with the one fold, as replay folds)."""
    records = store.read_stream(CALIBRATION_STREAM)
    return fold(Calibration(), records, accepts={FootprintMeasured})


def load_cpu_limits(store: EventStore) -> CpuLimits:
    """L22: fold what this data directory's starts learned engine builds cannot run here."""
    return fold(CpuLimits(), store.read_stream(CPU_STREAM), accepts={CpuUnsupported})
