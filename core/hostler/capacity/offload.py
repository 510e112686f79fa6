"""Where a mixture-of-experts model's weights go on one card, and the OOM ladder (pure).

Rules L12 (the offload plan) and L13 (a start that ran out of GPU memory degrades). A MoE
model's expert tensors are most of its bytes but few are used per token, so they are the part
to leave in system RAM when the card is short: llama.cpp's ``--cpu-moe`` keeps every layer's
experts on the CPU, ``--n-cpu-moe N`` the first N layers' experts. The planner packs expert
layers onto the card from the last layer backwards while they fit. A start that dies of GPU
out-of-memory anyway is retried one step down the ladder (L13). Nothing here reads a device:
the VRAM, the split of the weights and the KV bytes are observations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from hostler.capacity.units import GIB, MIB

__all__ = [
    "COMPUTE_RESERVE",
    "OOM_PANICS",
    "VRAM_MARGIN",
    "ExpertSplit",
    "Offload",
    "OffloadPlan",
    "next_oom_plan",
    "offload_args",
    "plan_moe_offload",
]

#: L12: VRAM kept free beside the weights (driver, fragmentation).
VRAM_MARGIN = 1 * GIB
#: L12: VRAM for the compute buffers, reserved when the split is known.
COMPUTE_RESERVE = 512 * MIB
#: L13: the panic kinds that mean the card ran out of memory (a smaller plan may fit).
OOM_PANICS = frozenset({"cuda-out-of-memory", "vulkan-out-of-memory"})


class Offload(StrEnum):
    """The shape of a plan, from the most on the card to the least."""

    FULL_GPU = "full-gpu"  # every layer and expert on the card
    PARTIAL = "n-cpu-moe"  # all layers on the card, the first N layers' experts in RAM
    ALL_EXPERTS_CPU = "cpu-moe"  # all layers on the card, every expert in RAM
    ENGINE_DECIDES = "cpu-moe-unpinned"  # experts in RAM, the layer count left to the engine


@dataclass(frozen=True, slots=True)
class OffloadPlan:
    """An offload decision and why (L12)."""

    kind: Offload
    n_cpu_moe: int | None
    reason: str


@dataclass(frozen=True, slots=True)
class ExpertSplit:
    """How a MoE model's weights divide: what every token uses, and each layer's experts.

    Attributes:
        non_expert: Bytes of the weights outside the expert tensors.
        expert_layers: Bytes of each layer's expert tensors, layer 0 first.
    """

    non_expert: int
    expert_layers: tuple[int, ...]


def plan_moe_offload(
    *,
    is_moe: bool,
    vram: int | None,
    resident: int,
    split: ExpertSplit | None = None,
    kv: int = 0,
) -> OffloadPlan | None:
    """L12: the offload plan for a model on a card of ``vram`` bytes, or None (no decision).

    None for a dense model, and when there is no card (the engine decides). Without the exact
    split, the model fits whole (``resident`` + margin) or keeps every expert in RAM. With it,
    the reserves are the margin, ``kv`` and the compute buffers; expert layers are packed from
    the last one backwards while they fit beside the non-expert weights.
    """
    if not is_moe or vram is None or vram <= 0:
        return None
    if split is None:
        if resident + VRAM_MARGIN <= vram:
            return OffloadPlan(Offload.FULL_GPU, None, "fits whole with the margin")
        return OffloadPlan(Offload.ALL_EXPERTS_CPU, None, "over the card without a split")
    reserves = VRAM_MARGIN + max(kv, 0) + COMPUTE_RESERVE
    if resident + reserves <= vram:
        return OffloadPlan(Offload.FULL_GPU, None, "fits whole with its reserves")
    return _pack_experts(split, vram - reserves - split.non_expert)


def _pack_experts(split: ExpertSplit, budget: int) -> OffloadPlan:
    """L12 with an exact split: as many expert layers as fit ``budget``, from the last."""
    if budget < 0:
        return OffloadPlan(
            Offload.ENGINE_DECIDES, None, "even the non-expert weights miss the card"
        )
    packed = _pack_from_the_end(split.expert_layers, budget)
    layers = len(split.expert_layers)
    if packed == 0:
        return OffloadPlan(Offload.ALL_EXPERTS_CPU, None, "no expert layer fits")
    if packed == layers:
        return OffloadPlan(Offload.FULL_GPU, None, "every expert layer fits")
    return OffloadPlan(
        Offload.PARTIAL, layers - packed, f"{packed} of {layers} expert layers fit on the card"
    )


def _pack_from_the_end(layers: Sequence[int], budget: int) -> int:
    packed, used = 0, 0
    for size in reversed(layers):
        if used + size > budget:
            break
        used += size
        packed += 1
    return packed


def next_oom_plan(plan: OffloadPlan, panic_kind: str | None, *, pinned: bool) -> OffloadPlan | None:
    """L13: the plan to retry with after a start died of GPU out-of-memory, or None (stop).

    Only for an out-of-memory panic, and never when the operator pinned all three offload
    settings. Down the ladder: whole or partial → every expert in RAM → the layer count left
    to the engine → stop. The caller keeps the degraded plan for later restarts.
    """
    if pinned or panic_kind not in OOM_PANICS:
        return None
    if plan.kind in (Offload.FULL_GPU, Offload.PARTIAL):
        return OffloadPlan(Offload.ALL_EXPERTS_CPU, None, f"out of GPU memory as {plan.kind}")
    if plan.kind is Offload.ALL_EXPERTS_CPU:
        return OffloadPlan(Offload.ENGINE_DECIDES, None, "out of GPU memory with --cpu-moe")
    return None


def offload_args(plan: OffloadPlan | None) -> list[str]:
    """The llama-server flags of a plan (L14's offload part); none without a plan."""
    if plan is None:
        return []
    if plan.kind is Offload.FULL_GPU:
        return ["--n-gpu-layers", "all"]
    if plan.kind is Offload.PARTIAL:
        return ["--n-gpu-layers", "all", "--n-cpu-moe", str(plan.n_cpu_moe)]
    if plan.kind is Offload.ALL_EXPERTS_CPU:
        return ["--n-gpu-layers", "all", "--cpu-moe"]
    return ["--cpu-moe"]
