"""How many concurrent slots an engine gets (pure): rules S1–S7 of the reference."""

from __future__ import annotations

import math

from hostler.capacity.bounds import MAX_SLOTS
from hostler.capacity.kv import heuristic_per_slot_kv, kv_scale
from hostler.capacity.ledger import fallback_resident_bytes
from hostler.capacity.units import GIB, round_half_up
from hostler.errors import UsageError

__all__ = ["MAX_SLOTS", "compute_headroom", "default_slots", "planned_slots", "slot_ceiling"]


_HEADROOM = {"llamacpp": 0.20, "llama-cpp": 0.20, "ds4": 0.20, "mlx": 0.35}


def default_slots(fast_bytes: int) -> int:
    """S1: the tier default from fast memory (8 GiB card → 1, 16 GiB → 2)."""
    fast_gib = fast_bytes / GIB
    if fast_gib < 12:
        return 1
    if fast_gib < 24:
        return 2
    if fast_gib < 48:
        return 3
    return 4


def compute_headroom(engine: str) -> float:
    """S5: the share of KV budget held back for the engine's compute buffers."""
    return _HEADROOM.get(engine, 0.20)


def slot_ceiling(
    *,
    engine: str,
    ctx: int,
    weights_bytes: int,
    budget: int,
    committed_other: int,
    cache_type: str | None,
    exact_f16_per_slot: int | None,
    sizing_budget: int | None = None,
    headroom: float | None = None,
) -> int:
    """S6–S7: how many slots of ``ctx`` tokens fit beside the weights (never below 1).

    ``headroom`` is the engine adapter's own S5 share (None: :func:`compute_headroom`).
    """
    if exact_f16_per_slot and exact_f16_per_slot > 0:
        per_slot = round_half_up(exact_f16_per_slot * kv_scale(cache_type))
    else:
        per_slot = heuristic_per_slot_kv(weights_bytes, ctx, cache_type)
    if per_slot <= 0:
        return 1
    effective = min(budget, sizing_budget) if sizing_budget is not None else budget
    free = effective - committed_other - fallback_resident_bytes(engine, weights_bytes)
    usable = free * (1 - (compute_headroom(engine) if headroom is None else headroom))
    return max(1, math.floor(usable / per_slot))


def planned_slots(configured: int | None, ceiling: int, tier_default: int) -> int:
    """S2: an operator's count verbatim, else the tier default capped by the ceiling.

    Preview and launch must both use this one resolver (IN10).

    Raises:
        UsageError: ``configured`` is more than :data:`MAX_SLOTS`.
    """
    if configured is not None and configured > MAX_SLOTS:
        raise UsageError(f"slots: {configured} is more than the {MAX_SLOTS} an engine may have")
    if configured is not None and configured > 0:
        return configured
    return max(1, min(tier_default, ceiling))
