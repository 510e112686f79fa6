"""Context windows and the admission ladder (pure): rules C1–C7 of the reference.

Shed slots before shortening context; refuse below the minimum rather than launch short; grow
the window when memory allows, trading a slot only for a real gain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hostler.capacity.units import GIB, format_half_up, round_half_up

__all__ = [
    "CONSTRAINED_FLOOR",
    "CONTEXT_FLOOR",
    "Clamp",
    "ContextRequirement",
    "Growth",
    "LadderResult",
    "clamp_ctx_for_memory",
    "host_floor",
    "llama_requirement",
    "plan_adaptive_growth",
    "plan_ctx_for_memory",
    "requirement",
    "window_denial",
]

CONTEXT_FLOOR = 65_536
CONSTRAINED_FLOOR = 32_768
CLAMP_FLOOR = 8_192
CLAMP_OS_RESERVE = 2 * GIB
CLAMP_ALLOWANCE = 0.8
GROWTH_MIN_SLOTS = 2
GROWTH_MIN_GAIN = 1.25
ALIGNMENT = 1024
ADAPTIVE_DEFAULT = 65_536


def host_floor(
    *,
    discrete: bool,
    usable_vram: int,
    system_ram: int,
    env_minimum: int | None = None,
) -> int:
    """C1: the smallest window hostler admits on this host."""
    if env_minimum is not None and env_minimum > 0:
        return env_minimum
    constrained = usable_vram <= 8 * GIB if discrete else system_ram <= 16 * GIB
    return CONSTRAINED_FLOOR if constrained else CONTEXT_FLOOR


@dataclass(frozen=True, slots=True)
class ContextRequirement:
    """The window asked for, the least acceptable one, and how far growth may go."""

    native: int
    requested: int
    minimum: int
    growth_target: int | None = None
    strict: bool = False


def requirement(model_window: int | None, requested: int | None, floor: int) -> ContextRequirement:
    """C2: raise low preferences to the floor, honour higher ones, respect small natives."""
    native = model_window or floor
    preferred = requested or floor
    minimum = min(native, floor)
    return ContextRequirement(native, min(native, max(preferred, minimum)), minimum)


def llama_requirement(
    *,
    native: int | None,
    floor: int,
    explicit: int | None = None,
    policy: str = "adaptive",
    manifest_context: int | None = None,
    override_below_floor: bool = False,
    growth_ceiling: int | None = None,
) -> ContextRequirement:
    """C3–C4: the llama.cpp requirement under the ``adaptive`` or ``model-max`` policy.

    Args:
        native: The model's native window.
        floor: The host floor (C1).
        explicit: An explicit window (env or per-model override).
        policy: ``adaptive`` (default) or ``model-max``.
        manifest_context: The catalog's context size, the adaptive target.
        override_below_floor: ``explicit`` came from a per-model override (C4): below the
            floor it lowers the floor.
        growth_ceiling: Upper bound for adaptive growth (tests, env).
    """
    if explicit is not None and override_below_floor and explicit < floor:
        floor = explicit
    strict = policy == "model-max" and explicit is None
    if strict and native:
        return ContextRequirement(native, native, native, None, strict=True)
    target = explicit if explicit is not None else (manifest_context or ADAPTIVE_DEFAULT)
    base = requirement(native, target, floor)
    growth = None
    if policy == "adaptive" and explicit is None and native:
        cap = min(native, growth_ceiling or native, manifest_context or native)
        cap = cap // ALIGNMENT * ALIGNMENT
        growth = cap if cap > base.requested else None
    return ContextRequirement(base.native, base.requested, base.minimum, growth)


@dataclass(frozen=True, slots=True)
class Clamp:
    """The window memory allows per slot, and why it was cut if it was."""

    ctx: int
    clamped: bool
    reason: str = ""


def clamp_ctx_for_memory(
    *,
    requested: int,
    slots: int,
    kv_per_token: float,
    weights_resident: int,
    budget: int,
    committed_other: int,
    free_ram: int | None = None,
    vram: int = 0,
    floor: int = CLAMP_FLOOR,
) -> Clamp:
    """C5: cut the per-slot window to what the budget (and live free RAM) can hold."""
    if kv_per_token <= 0 or requested <= floor:
        return Clamp(requested, False)
    budget_cap = budget - committed_other
    cap = budget_cap
    if free_ram is not None:
        live_cap = max(0, vram) + max(0, free_ram - CLAMP_OS_RESERVE)
        cap = min(budget_cap, live_cap)
    allowance = (cap - weights_resident) * CLAMP_ALLOWANCE
    per_turn = (
        math.floor(allowance / kv_per_token / max(1, slots) / ALIGNMENT) * ALIGNMENT
        if allowance > 0
        else 0
    )
    result = max(floor, min(requested, per_turn))
    if result >= requested:
        return Clamp(requested, False)
    return Clamp(
        result,
        True,
        f"window cut from {requested} to {result} tokens per slot: {slots} slot(s) of KV at "
        f"{format_half_up(kv_per_token, 0)} B/token beside "
        f"{format_half_up(weights_resident, 1, per=GIB)} GiB of weights fill "
        f"80% of the {format_half_up(cap, 1, per=GIB)} GiB left",
    )


def window_denial(minimum: int, one_slot: int) -> str:
    """C6: what a denial below the minimum states: the window required, what one slot holds."""
    return f"needs a window of {minimum} tokens; one slot could hold {one_slot}"


@dataclass(frozen=True, slots=True)
class LadderResult:
    """The slots and window the admission ladder settled on."""

    ctx: int
    slots: int
    minimum_satisfied: bool
    clamped: bool
    reason: str = ""


def plan_ctx_for_memory(
    *,
    requested: int,
    minimum: int,
    slots: int,
    kv_per_token: float,
    weights_resident: int,
    budget: int,
    committed_other: int,
    free_ram: int | None = None,
    vram: int = 0,
) -> LadderResult:
    """C6: walk slots down to 1; the first count whose safe window meets the minimum wins.

    Reduces concurrency before context. When even one slot cannot hold the minimum the
    result says so (``minimum_satisfied=False``): the caller must deny, never launch short.
    """

    def safe_window(count: int) -> Clamp:
        return clamp_ctx_for_memory(
            requested=requested,
            slots=count,
            kv_per_token=kv_per_token,
            weights_resident=weights_resident,
            budget=budget,
            committed_other=committed_other,
            free_ram=free_ram,
            vram=vram,
            floor=1,
        )

    for count in range(max(1, slots), 0, -1):
        clamp = safe_window(count)
        if clamp.ctx >= minimum:
            return LadderResult(clamp.ctx, count, True, clamp.clamped, clamp.reason)
    one = safe_window(1)
    return LadderResult(
        one.ctx,
        1,
        False,
        True,
        window_denial(minimum, one.ctx),
    )


@dataclass(frozen=True, slots=True)
class Growth:
    """The window after adaptive growth, and the slot count it settled on."""

    ctx: int
    slots: int
    grown: bool


def plan_adaptive_growth(
    *,
    base_ctx: int,
    target: int | None,
    slots: int,
    kv_per_token: float,
    fixed_per_slot: float,
    weights_resident: int,
    fast_budget: int,
    committed_other: int,
    discrete: bool,
    vram: int,
    moe: bool,
    free_ram: int | None,
    allow_slot_trade: bool,
) -> Growth:
    """C7: grow the window towards ``target``; trade a slot only for ≥ 1.25× the window."""
    if target is None or target <= base_ctx or kv_per_token <= 0 or (moe and discrete):
        return Growth(base_ctx, slots, False)

    def safe_at(count: int) -> int:
        clamp = clamp_ctx_for_memory(
            requested=target,
            slots=count,
            kv_per_token=kv_per_token,
            weights_resident=weights_resident + round_half_up(fixed_per_slot * count),
            budget=fast_budget,
            committed_other=committed_other,
            free_ram=0 if discrete else free_ram,
            vram=vram if discrete else 0,
            floor=1,
        )
        return min(target, clamp.ctx)

    chosen_slots, chosen_ctx = slots, safe_at(slots)
    untraded = chosen_ctx
    if allow_slot_trade and chosen_ctx < target and slots > 1:
        best_slots, best_ctx = None, -1
        for count in range(slots - 1, min(slots, GROWTH_MIN_SLOTS) - 1, -1):
            window = safe_at(count)
            if window > best_ctx:
                best_slots, best_ctx = count, window
            if window >= target:
                best_slots, best_ctx = count, window
                break
        if best_slots is not None and best_ctx >= GROWTH_MIN_GAIN * untraded:
            chosen_slots, chosen_ctx = best_slots, best_ctx
    final = max(base_ctx, chosen_ctx)
    if final <= base_ctx:
        return Growth(base_ctx, slots, False)
    return Growth(final, chosen_slots, True)
