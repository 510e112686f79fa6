"""MoE offload planning (L12) and the GPU out-of-memory ladder (L13): pure, worked values."""

from __future__ import annotations

import pytest

from hostler.capacity.offload import (
    COMPUTE_RESERVE,
    OOM_PANICS,
    VRAM_MARGIN,
    ExpertSplit,
    Offload,
    OffloadPlan,
    next_oom_plan,
    offload_args,
    plan_moe_offload,
)

GIB = 1024**3
MIB = 1024**2


def test_constants_by_value() -> None:
    assert VRAM_MARGIN == 1073741824
    assert COMPUTE_RESERVE == 536870912
    assert {"cuda-out-of-memory", "vulkan-out-of-memory"} == OOM_PANICS


def test_no_decision_for_a_dense_model_or_without_a_card() -> None:
    assert plan_moe_offload(is_moe=False, vram=80 * GIB, resident=GIB) is None
    for vram in (None, 0, -1):
        assert plan_moe_offload(is_moe=True, vram=vram, resident=GIB) is None
    tiny = plan_moe_offload(is_moe=True, vram=1, resident=GIB)  # a card, however small
    assert tiny is not None and tiny.kind is Offload.ALL_EXPERTS_CPU


def test_without_a_split_it_fits_whole_with_the_margin_or_keeps_experts_in_ram() -> None:
    vram = 24 * GIB
    at = plan_moe_offload(is_moe=True, vram=vram, resident=23 * GIB)  # 23 + 1 == 24: fits
    assert at == OffloadPlan(Offload.FULL_GPU, None, "fits whole with the margin")
    over = plan_moe_offload(is_moe=True, vram=vram, resident=23 * GIB + 1)
    assert over == OffloadPlan(Offload.ALL_EXPERTS_CPU, None, "over the card without a split")


#: A 48-layer MoE: 6 GiB outside the experts, 1 GiB of experts a layer (54 GiB resident).
SPLIT = ExpertSplit(6 * GIB, (GIB,) * 48)
RESIDENT = 54 * GIB


def test_with_a_split_it_fits_whole_with_margin_kv_and_compute() -> None:
    kv = 2 * GIB
    vram = RESIDENT + VRAM_MARGIN + kv + COMPUTE_RESERVE
    whole = plan_moe_offload(is_moe=True, vram=vram, resident=RESIDENT, split=SPLIT, kv=kv)
    assert whole == OffloadPlan(Offload.FULL_GPU, None, "fits whole with its reserves")
    short = plan_moe_offload(is_moe=True, vram=vram - 1, resident=RESIDENT, split=SPLIT, kv=kv)
    assert short is not None and short.kind is Offload.PARTIAL
    assert short.n_cpu_moe == 1  # the last 47 layers' experts fit; layer 0's go to RAM


def test_expert_layers_are_packed_from_the_last_while_they_fit() -> None:
    # 24 GiB card: reserves 1 + 2 + 0.5 GiB, non-expert 6 GiB -> 14.5 GiB for experts: 14 layers
    plan = plan_moe_offload(is_moe=True, vram=24 * GIB, resident=RESIDENT, split=SPLIT, kv=2 * GIB)
    assert plan == OffloadPlan(Offload.PARTIAL, 34, "14 of 48 expert layers fit on the card")
    assert offload_args(plan) == ["--n-gpu-layers", "all", "--n-cpu-moe", "34"]
    uneven = ExpertSplit(GIB, (4 * GIB, GIB, GIB))  # the last two fit, the first does not
    budget_vram = GIB + 2 * GIB + VRAM_MARGIN + COMPUTE_RESERVE
    packed = plan_moe_offload(is_moe=True, vram=budget_vram, resident=7 * GIB, split=uneven)
    assert packed == OffloadPlan(Offload.PARTIAL, 1, "2 of 3 expert layers fit on the card")


def test_no_expert_layer_fits_or_not_even_the_rest() -> None:
    reserves = VRAM_MARGIN + COMPUTE_RESERVE
    none_fit = plan_moe_offload(
        is_moe=True, vram=reserves + 6 * GIB + GIB - 1, resident=RESIDENT, split=SPLIT
    )
    assert none_fit == OffloadPlan(Offload.ALL_EXPERTS_CPU, None, "no expert layer fits")
    one_fits = plan_moe_offload(
        is_moe=True, vram=reserves + 6 * GIB + GIB, resident=RESIDENT, split=SPLIT
    )
    assert one_fits is not None and one_fits.n_cpu_moe == 47
    exactly_rest = plan_moe_offload(
        is_moe=True, vram=reserves + 6 * GIB, resident=RESIDENT, split=SPLIT
    )
    assert exactly_rest is not None and exactly_rest.kind is Offload.ALL_EXPERTS_CPU
    missing = plan_moe_offload(
        is_moe=True, vram=reserves + 6 * GIB - 1, resident=RESIDENT, split=SPLIT
    )
    assert missing == OffloadPlan(
        Offload.ENGINE_DECIDES, None, "even the non-expert weights miss the card"
    )
    assert offload_args(missing) == ["--cpu-moe"]


def test_a_negative_kv_counts_as_none() -> None:
    vram = RESIDENT + VRAM_MARGIN + COMPUTE_RESERVE
    plan = plan_moe_offload(is_moe=True, vram=vram, resident=RESIDENT, split=SPLIT, kv=-5 * GIB)
    assert plan is not None and plan.kind is Offload.FULL_GPU
    over = plan_moe_offload(is_moe=True, vram=vram - 1, resident=RESIDENT, split=SPLIT, kv=-5)
    assert over is not None and over.kind is not Offload.FULL_GPU


def test_when_every_expert_layer_fits_beside_an_oversized_resident_figure() -> None:
    # resident over-counted (e.g. with a projector): the split still says every layer fits
    split = ExpertSplit(GIB, (GIB, GIB))
    vram = 3 * GIB + VRAM_MARGIN + COMPUTE_RESERVE
    plan = plan_moe_offload(is_moe=True, vram=vram, resident=4 * GIB, split=split)
    assert plan == OffloadPlan(Offload.FULL_GPU, None, "every expert layer fits")
    assert offload_args(plan) == ["--n-gpu-layers", "all"]


# -- L13 -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("panic", sorted(OOM_PANICS))
def test_the_oom_ladder_steps_down_then_stops(panic: str) -> None:
    partial = OffloadPlan(Offload.PARTIAL, 34, "")
    step1 = next_oom_plan(partial, panic, pinned=False)
    assert step1 == OffloadPlan(Offload.ALL_EXPERTS_CPU, None, "out of GPU memory as n-cpu-moe")
    assert offload_args(step1) == ["--n-gpu-layers", "all", "--cpu-moe"]
    full = next_oom_plan(OffloadPlan(Offload.FULL_GPU, None, ""), panic, pinned=False)
    assert full == OffloadPlan(Offload.ALL_EXPERTS_CPU, None, "out of GPU memory as full-gpu")
    assert step1 is not None
    step2 = next_oom_plan(step1, panic, pinned=False)
    assert step2 == OffloadPlan(Offload.ENGINE_DECIDES, None, "out of GPU memory with --cpu-moe")
    assert step2 is not None
    assert next_oom_plan(step2, panic, pinned=False) is None


def test_the_ladder_is_only_for_oom_and_never_when_pinned() -> None:
    plan = OffloadPlan(Offload.PARTIAL, 3, "")
    for panic in (None, "cuda-illegal-memory-access", "illegal-instruction", ""):
        assert next_oom_plan(plan, panic, pinned=False) is None
    assert next_oom_plan(plan, "cuda-out-of-memory", pinned=True) is None


def test_no_plan_no_flags() -> None:
    assert offload_args(None) == []
