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

from hostler.capacity.units import round_half_up
from hostler.events.base import Event
from hostler.events.calibration import CALIBRATION_STREAM, FootprintMeasured

__all__ = ["CALIBRATION_STREAM", "Calibration", "FootprintMeasured"]


@dataclass
class Calibration:
    """What past measurements teach, folded from :class:`FootprintMeasured` events.

    Attributes:
        offsets: What each model, build and KV type's estimates missed (bytes), in order.
        points: Each measured shape's ``(estimated, measured)``.
        version: The calibration stream's version folded so far.
    """

    offsets: dict[tuple[str, str, str], list[int]] = field(default_factory=dict)
    points: dict[tuple[str, str, str, int, int], tuple[int, int]] = field(default_factory=dict)
    version: int = 0

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
            return round_half_up(corrected * estimated, measured)
        offsets = self.offsets.get(family)
        if not offsets:
            return corrected
        return corrected - round_half_up(statistics.median(offsets))

    def correct(
        self, estimate: int, *, model: str, build: str, kv_type: str, ctx_total: int, slots: int
    ) -> int:
        """The estimate corrected by what this model and build taught (unchanged if nothing)."""
        family = (model, build, kv_type)
        point = self.points.get((*family, ctx_total, slots))
        if point is not None and point[0] > 0:
            estimated, measured = point
            return round_half_up(estimate * measured, estimated)
        offsets = self.offsets.get(family)
        if not offsets:
            return estimate
        return max(0, estimate + round_half_up(statistics.median(offsets)))
