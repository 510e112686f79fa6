"""One price for a llama.cpp launch (pure): the plan's decision and the bytes the ledger holds.

``hostler preview`` and the daemon both call :func:`price_launch` with the same inputs, so the
figure a preview shows as *reserved* is the figure the daemon's ledger reserves before the
start. That figure is the engine's footprint estimate at its peak (the adapter's estimator at
the plan's window, slots and KV type), corrected by what measured launches of the same model
and build taught (:class:`hostler.capacity.learning.Calibration`).

The planner sizes the window and the slots on the same estimator: what the engine holds
besides its KV is the estimate at one minimal sequence (so the CB11 fallback on the file size
never prices a GGUF launch), and the admission is decided on the one figure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hostler.capacity.budget import CapacityBudget
from hostler.capacity.estimate import MIN_CELLS_PER_SEQUENCE
from hostler.capacity.geometry import ModelGeometry
from hostler.capacity.ledger import LedgerLimits, format_denial, shortfall
from hostler.capacity.plan import LaunchPlan, PlanRequest, launch_kv_type, plan_llama

__all__ = ["CorrectFn", "EstimateFn", "LaunchPrice", "price_launch"]

#: The adapter's estimate: ``(ctx_total, slots, kv_type) -> bytes at peak``.
EstimateFn = Callable[[int, int, str], int]
#: What learning makes of an estimate: ``(estimate, ctx_total, slots, kv_type) -> bytes``.
CorrectFn = Callable[[int, int, int, str], int]


@dataclass(frozen=True, slots=True)
class LaunchPrice:
    """The launch decision and its one price.

    Attributes:
        plan: The planner's decision (window, slots, KV type) and its reasons.
        estimated: The adapter's estimate at the plan's decision, before learning (bytes).
        reserved_bytes: What the ledger holds for the launch: ``estimated`` corrected by what
            was learned. ``hostler preview`` shows exactly this as *reserved*.
        admitted: The minimum window fits and ``reserved_bytes`` fits beside other engines.
        denial: The human denial text when not admitted.
    """

    plan: LaunchPlan
    estimated: int
    reserved_bytes: int
    admitted: bool
    denial: str = ""

    @property
    def ctx_per_slot(self) -> int:
        """The per-slot window to launch with."""
        return self.plan.context_window

    @property
    def slots(self) -> int:
        """``--parallel``."""
        return self.plan.slots

    @property
    def kv_type(self) -> str:
        """``--cache-type-k/-v``."""
        return self.plan.kv_type

    @property
    def ctx_total(self) -> int:
        """``--ctx-size``."""
        return self.plan.total_ctx

    @property
    def learned(self) -> bool:
        """Whether a measurement changed the estimate."""
        return self.reserved_bytes != self.estimated


def price_launch(
    request: PlanRequest,
    geometry: ModelGeometry,
    auto: CapacityBudget,
    limits: LedgerLimits,
    *,
    committed_other: int,
    estimate: EstimateFn,
    correct: CorrectFn | None = None,
    free_ram: int | None = None,
) -> LaunchPrice:
    """Plan the launch and price it once (see the module's docstring)."""

    def learned(value: int, ctx_total: int, slots: int, kv_type: str) -> int:
        return value if correct is None else correct(value, ctx_total, slots, kv_type)

    kv_type = launch_kv_type(request, geometry)  # the planner's own rule, not a second one
    floor = MIN_CELLS_PER_SEQUENCE
    resident = learned(estimate(floor, 1, kv_type), floor, 1, kv_type)
    plan = plan_llama(
        request,
        geometry,
        auto,
        limits,
        committed_other=committed_other,
        free_ram=free_ram,
        resident=resident,
    )
    estimated = estimate(plan.total_ctx, plan.slots, plan.kv_type)
    reserved = learned(estimated, plan.total_ctx, plan.slots, plan.kv_type)
    admitted = plan.minimum_satisfied and shortfall(limits, committed_other, reserved) <= 0
    denial = ""
    if not admitted:
        denial = format_denial(
            request.model,
            reserved,
            limits,
            committed_other,
            below_minimum=not plan.minimum_satisfied,
            window=plan.window_denial,
        )
    return LaunchPrice(
        plan=plan, estimated=estimated, reserved_bytes=reserved, admitted=admitted, denial=denial
    )
