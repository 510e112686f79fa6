"""The llama.cpp launch plan and its preview (pure): one resolver for both (IN10).

From a model's geometry, the host's budget, what other engines hold and the operator's
overrides, decide the context window, the slot count, the KV cache type, and the bytes the
engine will need: *planned* (weights + one slot of KV, what one chat costs) and *reserved*
(weights + every slot, what the ledger holds). Every step says why in ``reasons``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hostler.capacity.budget import BudgetKind, CapacityBudget
from hostler.capacity.context import (
    ContextRequirement,
    LadderResult,
    host_floor,
    llama_requirement,
    plan_adaptive_growth,
    plan_ctx_for_memory,
    window_denial,
)
from hostler.capacity.estimate import LlamaFootprint, estimate_llama
from hostler.capacity.geometry import ModelGeometry
from hostler.capacity.kv import (
    KvLinear,
    exact_linearization,
    heuristic_per_slot_kv,
    unfit_head_width,
)
from hostler.capacity.kvtrade import (
    KvChoice,
    KvStep,
    default_kv_choice,
    gemma_trade,
    is_gemma,
)
from hostler.capacity.ledger import LedgerLimits, fallback_resident_bytes, format_denial, shortfall
from hostler.capacity.offload import OffloadPlan, offload_args, plan_moe_offload
from hostler.capacity.slots import compute_headroom, default_slots, planned_slots, slot_ceiling
from hostler.capacity.units import round_half_up
from hostler.errors import UsageError

__all__ = [
    "LaunchPlan",
    "PlanRequest",
    "default_kv_type",
    "launch_choice",
    "launch_kv_type",
    "plan_llama",
]


@dataclass(frozen=True, slots=True)
class PlanRequest:
    """What the operator asked for (None: decide automatically).

    Attributes:
        model: The model's name in messages.
        ctx: An explicit per-slot window (env or per-model override).
        ctx_is_model_override: ``ctx`` is a per-model override (may go below the floor, C4).
        slots: An explicit slot count (verbatim, S2).
        kv_type: An explicit KV cache type.
        policy: ``adaptive`` or ``model-max``.
        min_context: C1's host floor set by the operator (``HOSTLER_MIN_CONTEXT_TOKENS``);
            None for the rule's floor (65,536 tokens, 32,768 on a constrained host).
        manifest_context: A catalog's context size for the model.
        growth_ceiling: C3's ceiling for adaptive growth set by the operator
            (``HOSTLER_LLAMA_GROWTH_CEILING_TOKENS``); None for unbounded (the native window).
        engine: The engine name, for S5's compute headroom.
        kv_headroom: The engine adapter's own S5 share (None: hostler's for ``engine``).
        max_slots: The most slots the engine serves (S8; None: no limit of its own).
        kv_types: The KV cache types the engine supports, its default first (S9; None: any).
    """

    model: str
    ctx: int | None = None
    ctx_is_model_override: bool = False
    slots: int | None = None
    kv_type: str | None = None
    policy: str = "adaptive"
    min_context: int | None = None
    manifest_context: int | None = None
    growth_ceiling: int | None = None
    engine: str = "llamacpp"
    kv_headroom: float | None = None
    max_slots: int | None = None
    kv_types: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """The decision, with every figure a preview shows.

    Attributes:
        admitted: False when even one slot at the minimum window does not fit (deny, never
            launch short), or when the reservation does not fit beside other engines.
        context_window: Per-slot window (``--ctx-size`` is this × slots).
        slots: ``--parallel``.
        kv_type: ``--cache-type-k/-v``.
        native_window: The model's trained window.
        applied_override: The explicit window in force, if any.
        auto_window: What the automatic plan would have chosen (only when an override is set).
        weights_bytes: What the engine holds besides its KV: the footprint estimator's figure
            when the caller priced it (see :mod:`hostler.capacity.pricing`), else CB11's.
        kv: One slot's KV line at ``kv_type`` (``fixed + per_token × ctx``).
        planned_bytes: Weights + one slot.
        reserved_bytes: Weights + every slot.
        committed_other: What other engines hold (never this model's own replicas).
        exact_geometry: The KV came from the header, not the heuristic.
        expected: What the ready engine is expected to occupy (the footprint estimator), and
            its peak under a full-context request.
        denial: The human denial text when not admitted.
        reasons: Why each figure is what it is, in order.
        minimum_satisfied: Even one slot at the minimum window fits (C6); False: deny.
        window_denial: When the minimum is unmet, C6's statement of the window required and
            what one slot could hold (part of ``denial``); else empty.
        offload: Where a mixture-of-experts model's weights go on the card (L12); None for a
            dense model or a host without a card of its own (the engine decides).
    """

    admitted: bool
    context_window: int
    slots: int
    kv_type: str
    native_window: int
    applied_override: int | None
    auto_window: int | None
    weights_bytes: int
    kv: KvLinear
    planned_bytes: int
    reserved_bytes: int
    committed_other: int
    exact_geometry: bool
    expected: LlamaFootprint
    denial: str = ""
    reasons: list[str] = field(default_factory=list)
    minimum_satisfied: bool = True
    window_denial: str = ""
    offload: OffloadPlan | None = None

    @property
    def total_ctx(self) -> int:
        """``--ctx-size``: the server divides it evenly across slots."""
        return self.context_window * self.slots


def default_kv_type(geometry: ModelGeometry, model: str) -> str:
    """L5: Gemma keeps f16 KV; every other model quantizes it to q8_0."""
    return "f16" if is_gemma(geometry.architecture, model) else "q8_0"


def launch_choice(request: PlanRequest, geometry: ModelGeometry) -> KvChoice:
    """L5 steps 1–3 for this launch (:func:`hostler.capacity.kvtrade.default_kv_choice`).

    S9: an engine that supports only some KV types gets L5's choice when it is one of them,
    else its own default (the first); a type the operator asks for outside them is refused.

    Raises:
        UsageError: The operator's type is not one the engine supports.
    """
    supported = request.kv_types
    if supported is not None and request.kv_type and request.kv_type not in supported:
        raise UsageError(
            f"kv_type {request.kv_type!r}: engine {request.engine!r} supports "
            f"{', '.join(supported)} only; set one of them or leave kv_type unset"
        )
    choice = default_kv_choice(
        explicit=request.kv_type,
        gemma=is_gemma(geometry.architecture, request.model),
        q8_unfit_width=unfit_head_width(geometry, "q8_0"),
    )
    if supported is None or choice.kv_type in supported:
        return choice
    step = KvStep.ENGINE
    decision = {**choice.decision, "step": step.value, "kv_type": supported[0]}
    decision["kv_types"] = list(supported)
    reason = f"KV {supported[0]}: engine {request.engine!r} supports {', '.join(supported)} only"
    return KvChoice(supported[0], step, reason, decision)


def launch_kv_type(
    request: PlanRequest, geometry: ModelGeometry, reasons: list[str] | None = None
) -> str:
    """The KV type a launch starts from: the operator's, else L5's default.

    A quantized cache llama.cpp cannot build (head width) stays f16, and an engine's own type
    replaces one it does not support (S9), each said in ``reasons``.
    """
    choice = launch_choice(request, geometry)
    if choice.step in (KvStep.HEAD_WIDTH, KvStep.ENGINE) and reasons is not None:
        reasons.append(choice.reason)
    return choice.kv_type


def _window_reasons(
    request: PlanRequest, requirement: ContextRequirement, floor: int, native: int | None
) -> list[str]:
    operator_floor = request.min_context is not None and request.min_context > 0
    reasons = [
        f"window: {requirement.requested} requested, {requirement.minimum} minimum "
        f"(host floor {floor}{', set by the operator' if operator_floor else ''}, "
        f"native {native or 'unknown'})"
    ]
    if request.growth_ceiling is not None:
        reasons.append(f"growth: at most {request.growth_ceiling} tokens (operator's ceiling)")
    return reasons


def _engine_tier(request: PlanRequest, tier: int) -> int:
    """S8: the tier default within the engine's own limit; a count asked above it is refused."""
    if request.max_slots is None:
        return tier
    if request.slots is not None and request.slots > request.max_slots:
        raise UsageError(
            f"slots: {request.slots} is more than engine {request.engine!r} serves at once "
            f"(at most {request.max_slots}); set slots to {request.max_slots} or fewer"
        )
    return min(tier, request.max_slots)


def _offload(
    geometry: ModelGeometry,
    auto: CapacityBudget,
    *,
    resident: int,
    kv: int,
    reasons: list[str],
) -> OffloadPlan | None:
    """L12 for this launch, stated among the reasons when there is a decision.

    Only a discrete host has a card of its own (B4: a unified "card" is the RAM share).
    """
    vram = auto.vram if auto.kind is BudgetKind.DISCRETE else None
    plan = plan_moe_offload(is_moe=geometry.is_moe, vram=vram, resident=resident, kv=kv)
    if plan is not None:
        reasons.append(f"offload: {plan.reason} ({' '.join(offload_args(plan))})")
    return plan


def _ladder(
    requirement: ContextRequirement,
    slots: int,
    line: KvLinear,
    *,
    weights: int,
    limits: LedgerLimits,
    reasons: list[str],
    committed_other: int,
    free_ram: int | None,
    vram: int,
) -> LadderResult:
    """C6's ladder beside the others; for a launch room must be made for, its slots alone.

    Room will be made for a launch that does not fit beside the others, so its slot count is
    the one it keeps on its own, never the count shed to squeeze beside engines that are about
    to be evicted (one slot, not sixteen).
    """

    def walk(others: int, ram: int | None) -> LadderResult:
        return plan_ctx_for_memory(
            requested=requirement.requested,
            minimum=requirement.minimum,
            slots=slots,
            kv_per_token=line.per_token,
            weights_resident=weights + round_half_up(line.fixed * slots),
            budget=limits.budget,
            committed_other=others,
            free_ram=ram,
            vram=vram,
        )

    ladder = walk(committed_other, free_ram)
    when = ""
    if not ladder.minimum_satisfied and committed_other > 0:
        alone = walk(0, None)
        if alone.minimum_satisfied:
            ladder, when = replace(ladder, slots=alone.slots), " once room is made"
    if ladder.slots < slots and (ladder.minimum_satisfied or when):
        reasons.append(
            f"shed slots {slots} → {ladder.slots} so each keeps at least "
            f"{requirement.minimum} tokens{when or ' (concurrency goes before context)'}"
        )
    return ladder


def plan_llama(
    request: PlanRequest,
    geometry: ModelGeometry,
    auto: CapacityBudget,
    limits: LedgerLimits,
    *,
    committed_other: int,
    free_ram: int | None = None,
    resident: int | None = None,
) -> LaunchPlan:
    """Plan a llama.cpp launch (L4–L8 over C1–C7 and S1–S7).

    ``resident`` is what the engine holds besides its KV cache, from the footprint estimator
    (weights, repacked weights, runtime); without it the CB11 fallback on the file size.
    """
    reasons: list[str] = []
    discrete = auto.kind is BudgetKind.DISCRETE
    floor = host_floor(
        discrete=discrete,
        usable_vram=auto.vram,
        system_ram=auto.system_ram,
        env_minimum=request.min_context,
    )
    requirement = llama_requirement(
        native=geometry.native_context,
        floor=floor,
        explicit=request.ctx,
        policy=request.policy,
        manifest_context=request.manifest_context,
        override_below_floor=request.ctx_is_model_override,
        growth_ceiling=request.growth_ceiling,
    )
    reasons += _window_reasons(request, requirement, floor, geometry.native_context)
    kv_type = launch_kv_type(request, geometry, reasons)
    weights = (
        fallback_resident_bytes("llamacpp", geometry.file_size, geometry.mmproj_size)
        if resident is None
        else resident
    )
    line = exact_linearization(geometry, kv_type)
    exact = line is not None
    if line is None:
        per_slot = heuristic_per_slot_kv(weights, requirement.requested, kv_type)
        line = KvLinear(0.0, per_slot / max(1, requirement.requested))
        reasons.append(
            "KV: exact size unknown (header geometry incomplete), heuristic pricing (may be off)"
        )
    f16_line = exact_linearization(geometry, "f16")
    exact_f16 = f16_line.at(requirement.requested) if f16_line else None

    def ceiling_at(cache_type: str) -> int:
        return slot_ceiling(
            engine="llamacpp",
            ctx=requirement.requested,
            weights_bytes=geometry.file_size,
            budget=limits.fast_budget,
            committed_other=committed_other,
            cache_type=cache_type,
            exact_f16_per_slot=exact_f16,
            sizing_budget=auto.concurrency_sizing,
            headroom=(
                compute_headroom(request.engine)
                if request.kv_headroom is None
                else request.kv_headroom
            ),
        )

    ceiling = ceiling_at(kv_type)
    tier = _engine_tier(request, default_slots(limits.fast_budget))
    traded = gemma_trade(
        launch_choice(request, geometry),
        allowed=request.kv_types is None or "q8_0" in request.kv_types,
        slots_configured=request.slots is not None,
        tier=tier,
        f16_ceiling=ceiling,
        q8_ceiling=lambda: ceiling_at("q8_0"),
    )
    if traded.slot_ceiling is not None:  # L5: f16 alone leaves one slot, q8_0 gives two
        reasons.append(traded.reason)
        kv_type, ceiling = traded.kv_type, traded.slot_ceiling
        line = exact_linearization(geometry, kv_type) or line
    slots = planned_slots(request.slots, ceiling, tier)
    reasons.append(
        f"slots: {slots} ({'configured' if request.slots else f'tier {tier}, ceiling {ceiling}'})"
    )
    ladder = _ladder(
        requirement,
        slots,
        line,
        weights=weights,
        limits=limits,
        reasons=reasons,
        committed_other=committed_other,
        free_ram=free_ram,
        vram=auto.vram if discrete else 0,
    )
    # C6: a launch below its minimum window is never planned — priced at the minimum, the
    # shortfall is what making room must free (the shrunk window would "fit" and crash).
    ctx = ladder.ctx if ladder.minimum_satisfied else requirement.minimum
    slots = max(1, ladder.slots)
    if ladder.reason:
        reasons.append(ladder.reason)
    if exact and requirement.growth_target:
        growth = plan_adaptive_growth(
            base_ctx=ctx,
            target=requirement.growth_target,
            slots=slots,
            kv_per_token=line.per_token,
            fixed_per_slot=line.fixed,
            weights_resident=weights,
            fast_budget=limits.fast_budget,
            committed_other=committed_other,
            discrete=discrete,
            vram=auto.vram,
            moe=geometry.is_moe,
            free_ram=free_ram,
            allow_slot_trade=request.slots is None,
        )
        if growth.grown:
            reasons.append(
                f"grown: {ctx} → {growth.ctx} tokens per slot"
                + (f", {slots} → {growth.slots} slots" if growth.slots != slots else "")
            )
            ctx, slots = growth.ctx, growth.slots
    planned = weights + line.at(ctx)
    reserved = weights + slots * line.at(ctx)
    short = shortfall(limits, committed_other, reserved)
    admitted = ladder.minimum_satisfied and short <= 0
    denial = ""
    short_window = (
        "" if ladder.minimum_satisfied else window_denial(requirement.minimum, ladder.ctx)
    )
    if not admitted:
        denial = format_denial(
            request.model,
            reserved,
            limits,
            committed_other,
            below_minimum=not ladder.minimum_satisfied,
            window=short_window,
        )
    auto_window = None
    if request.ctx is not None:  # what the automatic plan (no window asked) would choose
        automatic = plan_llama(
            replace(request, ctx=None, ctx_is_model_override=False),
            geometry,
            auto,
            limits,
            committed_other=committed_other,
            free_ram=free_ram,
            resident=resident,
        )
        auto_window = automatic.context_window
    return LaunchPlan(
        admitted=admitted,
        context_window=ctx,
        slots=slots,
        kv_type=kv_type,
        native_window=requirement.native,
        applied_override=request.ctx,
        auto_window=auto_window,
        weights_bytes=weights,
        kv=line,
        planned_bytes=planned,
        reserved_bytes=reserved,
        committed_other=committed_other,
        exact_geometry=exact,
        expected=estimate_llama(geometry, ctx_total=ctx * slots, slots=slots, kv_type=kv_type),
        denial=denial,
        reasons=reasons,
        minimum_satisfied=ladder.minimum_satisfied,
        window_denial=short_window,
        # states its decision in ``reasons`` (the same list) before the plan is made
        offload=_offload(geometry, auto, resident=weights, kv=reserved - weights, reasons=reasons),
    )
