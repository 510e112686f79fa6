"""Estimate → measure → learn (pure): measured footprints correct the next estimates.

After an engine is ready its real footprint is measured and recorded
(:class:`FootprintMeasured`). For each model, engine build and KV type, the calibration keeps
what the estimate missed. The KV part of an estimate is exact arithmetic over the model's
geometry, so what a measurement teaches is an offset on the rest (weights as mapped, runtime,
compute): one measured launch corrects the estimates of every other context and slot count of
that model. A point measured exactly is answered with its measurement scaled to the estimate.

A measurement's ``estimated`` is what the ledger reserved for the launch: the estimate as
this calibration had already corrected it when the launch was priced
(:mod:`hostler.capacity.pricing`). Folding undoes that correction first, so what is learned is
always measured minus the *raw* estimate, and relaunching at a learned point keeps reserving
what was measured there instead of drifting back towards the raw estimate.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from hostler.events.base import Event, event_type

__all__ = ["CALIBRATION_STREAM", "Calibration", "FootprintMeasured"]

CALIBRATION_STREAM = "calibration/host"


@event_type("calibration.measured")
@dataclass(frozen=True, slots=True)
class FootprintMeasured(Event):
    """One ready engine's measured footprint beside what hostler had estimated.

    Attributes:
        engine_key: The engine measured.
        model: The model's identity (its file's name and size, or a digest).
        build: The engine build (``llama-server`` build info).
        kv_type: The KV cache type it ran with.
        ctx_total: ``--ctx-size``.
        slots: ``--parallel``.
        estimated: What hostler reserved before launch (bytes): the estimate, corrected by
            what earlier measurements had taught.
        measured: The footprint (bytes): RSS plus per-process GPU memory.
        rss: Resident set size.
        gpu: GPU memory attributed to the process (NVML), 0 without.
        buffers: The engine's own buffer-size lines, summed (0 when not logged).
    """

    engine_key: str
    model: str
    build: str
    kv_type: str
    ctx_total: int
    slots: int
    estimated: int
    measured: int
    rss: int
    gpu: int
    buffers: int


@dataclass
class Calibration:
    """What past measurements teach, folded from :class:`FootprintMeasured` events."""

    offsets: dict[tuple[str, str, str], list[int]] = field(default_factory=dict)
    points: dict[tuple[str, str, str, int, int], tuple[int, int]] = field(default_factory=dict)

    def apply(self, event: Event) -> None:
        """Fold one measurement (other events are ignored)."""
        if not isinstance(event, FootprintMeasured):
            return
        family = (event.model, event.build, event.kv_type)
        raw = self.raw(
            event.estimated,
            model=event.model,
            build=event.build,
            kv_type=event.kv_type,
            ctx_total=event.ctx_total,
            slots=event.slots,
        )
        self.offsets.setdefault(family, []).append(event.measured - raw)
        self.points[(*family, event.ctx_total, event.slots)] = (raw, event.measured)

    def raw(
        self, corrected: int, *, model: str, build: str, kv_type: str, ctx_total: int, slots: int
    ) -> int:
        """The raw estimate that :meth:`correct` turns into ``corrected`` now (its inverse)."""
        family = (model, build, kv_type)
        point = self.points.get((*family, ctx_total, slots))
        if point is not None and point[0] > 0 and point[1] > 0:
            estimated, measured = point
            return round(corrected * estimated / measured)
        offsets = self.offsets.get(family)
        if not offsets:
            return corrected
        return corrected - round(statistics.median(offsets))

    def correct(
        self, estimate: int, *, model: str, build: str, kv_type: str, ctx_total: int, slots: int
    ) -> int:
        """The estimate corrected by what this model and build taught (unchanged if nothing)."""
        family = (model, build, kv_type)
        point = self.points.get((*family, ctx_total, slots))
        if point is not None and point[0] > 0:
            estimated, measured = point
            return round(estimate * measured / estimated)
        offsets = self.offsets.get(family)
        if not offsets:
            return estimate
        return max(0, estimate + round(statistics.median(offsets)))
