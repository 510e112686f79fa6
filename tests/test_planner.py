"""KV pricing, slot sizing, context windows and growth (behaviour §2.5–2.6, L9–L11)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hostler.capacity.context import (
    CONSTRAINED_FLOOR,
    CONTEXT_FLOOR,
    clamp_ctx_for_memory,
    host_floor,
    llama_requirement,
    plan_adaptive_growth,
    plan_ctx_for_memory,
    requirement,
)
from hostler.capacity.geometry import ModelGeometry
from hostler.capacity.kv import (
    bytes_per_element,
    exact_per_slot_f16,
    full_attention_kv,
    heuristic_per_slot_kv,
    hybrid_linearization,
    kv_scale,
    windowed_linearization,
)
from hostler.capacity.ledger import fallback_resident_bytes
from hostler.capacity.slots import MAX_SLOTS, default_slots, planned_slots, slot_ceiling
from hostler.capacity.units import GIB, KIB
from hostler.errors import UsageError

LLAMA_8B = ModelGeometry(
    architecture="llama", block_count=32, head_count=32, head_count_kv=8, embedding_length=4096
)


# -- L9 / S3 / S4 ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "bpe"),
    [
        ("f32", 4),
        ("f16", 2),
        ("bf16", 2),
        ("q8_0", 34 / 32),
        ("q5_1", 24 / 32),
        ("q5_0", 22 / 32),
        ("q4_1", 20 / 32),
        ("q4_0", 18 / 32),
        ("iq9_z", 2),
        (None, 2),
    ],
)
def test_bytes_per_element(kind: str | None, bpe: float) -> None:
    assert bytes_per_element(kind) == bpe


@pytest.mark.parametrize(
    ("kind", "scale"),
    [
        ("q4_0", 0.30),
        ("q4_1", 0.30),
        ("q8_0", 0.55),
        ("f32", 2.0),
        ("f16", 1.0),
        ("bf16", 1.0),
        (None, 0.55),
    ],
)
def test_kv_scale(kind: str | None, scale: float) -> None:
    assert kv_scale(kind) == scale


def test_heuristic_kv_is_linear_in_ctx_and_plateaus() -> None:
    small = heuristic_per_slot_kv(1 * GIB, 8192, "f16")
    assert small == round(8192 * 40 * KIB)  # clamped up to 40 KiB/token
    assert heuristic_per_slot_kv(1 * GIB, 16384, "f16") == 2 * small
    huge = heuristic_per_slot_kv(200 * GIB, 1000, "f16")
    assert huge == round(1000 * 400 * KIB)  # plateau from ~76 GiB of weights
    assert heuristic_per_slot_kv(200 * GIB, 1000, "q8_0") == round(1000 * 400 * KIB * 0.55)


# -- L10 / L11 ------------------------------------------------------------------------------


def test_full_attention_kv_llama_8b() -> None:
    # 32 layers × 8 kv heads × (128 + 128) × 2 bytes = 128 KiB per token at f16
    assert full_attention_kv(LLAMA_8B, 1, "f16") == 131072
    assert full_attention_kv(LLAMA_8B, 8192, "f16") == 8192 * 131072
    assert full_attention_kv(LLAMA_8B, 1024, "q8_0") == round(1024 * 32 * 8 * 256 * 34 / 32)


def test_full_attention_missing_dims_is_none() -> None:
    assert full_attention_kv(ModelGeometry(block_count=32), 1024, "f16") is None
    assert (
        full_attention_kv(ModelGeometry(head_count=8, embedding_length=4096), 1024, "f16") is None
    )


def test_shared_kv_layers_own_no_cache() -> None:
    shared = ModelGeometry(
        block_count=32, head_count=32, head_count_kv=8, embedding_length=4096, shared_kv_layers=12
    )
    assert full_attention_kv(shared, 1, "f16") == 20 * 8 * 256 * 2


def test_per_layer_heads_and_swa_dims_with_a_pattern() -> None:
    geometry = ModelGeometry(
        block_count=4,
        head_count=8,
        head_count_kv=(4, 4, 4, 2),
        key_length=256,
        value_length=256,
        key_length_swa=128,
        value_length_swa=128,
        embedding_length=2048,
        sliding_window=1024,
        swa_pattern=(True, True, True, False),
    )
    # full attention (--swa-full): every layer caches ctx tokens at its own width
    per_token = 3 * 4 * 256 * 2 + 2 * 512 * 2
    assert full_attention_kv(geometry, 1, "f16") == per_token
    line = windowed_linearization(geometry, "f16")
    assert line is not None
    assert line.fixed == 3 * 4 * 256 * 2 * (1024 + 2048)
    assert line.per_token == 2 * 512 * 2
    assert exact_per_slot_f16(geometry, 4096) == round(line.fixed + line.per_token * 4096)


def test_windowed_needs_a_pattern_of_the_right_length_and_a_window() -> None:
    base = ModelGeometry(block_count=4, head_count=8, head_count_kv=4, embedding_length=2048)
    no_pattern = replace(base, sliding_window=512)
    no_window = replace(base, swa_pattern=(True, False, True, False))
    short_pattern = replace(base, sliding_window=512, swa_pattern=(True, False))
    for geometry in (no_pattern, no_window, short_pattern):
        assert windowed_linearization(geometry, "f16") is None


def test_linear_hybrid() -> None:
    geometry = ModelGeometry(
        block_count=8,
        head_count=16,
        head_count_kv=2,
        key_length=256,
        value_length=256,
        embedding_length=2048,
        full_attention_interval=4,
        ssm_inner_size=4096,
        ssm_conv_kernel=4,
        ssm_state_size=128,
    )
    # layers 3 and 7 are full attention
    assert full_attention_kv(geometry, 1, "f16") == 2 * 2 * 512 * 2
    line = hybrid_linearization(geometry, "f16")
    assert line is not None
    assert line.per_token == 2 * 2 * 512 * 2
    assert line.fixed == 6 * ((4096 * 3) + 4096 * 128) * 4


# -- S1 / S2 / S7 ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fast", "slots"), [(8, 1), (11.9, 1), (12, 2), (16, 2), (24, 3), (47, 3), (48, 4), (200, 4)]
)
def test_default_slots_by_fast_memory(fast: float, slots: int) -> None:
    assert default_slots(int(fast * GIB)) == slots


def test_planned_slots_resolver() -> None:
    assert planned_slots(None, ceiling=5, tier_default=3) == 3
    assert planned_slots(None, ceiling=2, tier_default=3) == 2
    assert planned_slots(None, ceiling=0, tier_default=3) == 1
    assert planned_slots(6, ceiling=2, tier_default=3) == 6  # an operator's count verbatim


def test_planned_slots_take_1024_and_refuse_1025_in_one_line() -> None:
    """The ladder and growth walk the slots: ``--slots 10000000`` took 57 s (issue 8)."""
    assert MAX_SLOTS == 1024
    assert planned_slots(MAX_SLOTS, ceiling=2, tier_default=3) == MAX_SLOTS
    with pytest.raises(UsageError) as caught:
        planned_slots(MAX_SLOTS + 1, ceiling=2, tier_default=3)
    assert caught.value.message == "slots: 1025 is more than the 1024 an engine may have"
    assert caught.value.exit_status == 2


def test_slot_ceiling_from_exact_geometry() -> None:
    weights = 5 * GIB
    per_slot_f16 = full_attention_kv(LLAMA_8B, 65536, "f16")
    assert per_slot_f16 == 8 * GIB
    ceiling = slot_ceiling(
        engine="llamacpp",
        ctx=65536,
        weights_bytes=weights,
        budget=40 * GIB,
        committed_other=0,
        cache_type="q8_0",
        exact_f16_per_slot=per_slot_f16,
    )
    free = 40 * GIB - fallback_resident_bytes("llamacpp", weights)
    assert ceiling == int(free * 0.8 // round(per_slot_f16 * 0.55))
    # the sizing budget caps what the ceiling sees; never below one slot
    assert (
        slot_ceiling(
            engine="mlx",
            ctx=65536,
            weights_bytes=weights,
            budget=40 * GIB,
            committed_other=38 * GIB,
            cache_type="f16",
            exact_f16_per_slot=per_slot_f16,
        )
        == 1
    )


# -- C1 / C2 / C3 / C4 ------------------------------------------------------------------------


def test_host_floor() -> None:
    assert (
        host_floor(discrete=True, usable_vram=int(22.8 * GIB), system_ram=16 * GIB) == CONTEXT_FLOOR
    )
    assert (
        host_floor(discrete=True, usable_vram=int(7.6 * GIB), system_ram=64 * GIB)
        == CONSTRAINED_FLOOR
    )
    assert host_floor(discrete=False, usable_vram=0, system_ram=16 * GIB) == CONSTRAINED_FLOOR
    assert host_floor(discrete=False, usable_vram=0, system_ram=32 * GIB) == CONTEXT_FLOOR
    assert host_floor(discrete=False, usable_vram=0, system_ram=8 * GIB, env_minimum=4096) == 4096


def test_generic_requirement() -> None:
    assert requirement(131072, 4096, 65536).requested == 65536  # low preference raised
    assert requirement(131072, 100000, 65536).requested == 100000  # higher honoured
    small = requirement(8192, None, 65536)  # a small native window is both
    assert (small.requested, small.minimum) == (8192, 8192)
    assert requirement(None, None, 32768).requested == 32768


def test_llama_requirement_policies() -> None:
    adaptive = llama_requirement(native=131072, floor=65536)
    assert (adaptive.requested, adaptive.minimum, adaptive.growth_target) == (65536, 65536, 131072)
    strict = llama_requirement(native=131072, floor=65536, policy="model-max")
    assert (strict.requested, strict.minimum, strict.strict) == (131072, 131072, True)
    explicit = llama_requirement(native=131072, floor=65536, explicit=16384)
    assert (explicit.requested, explicit.minimum, explicit.growth_target) == (65536, 65536, None)
    deliberate = llama_requirement(
        native=131072, floor=65536, explicit=16384, override_below_floor=True
    )
    assert (deliberate.requested, deliberate.minimum) == (16384, 16384)
    capped = llama_requirement(
        native=131072, floor=32768, manifest_context=40000, growth_ceiling=100000
    )
    assert capped.requested == 40000
    assert (
        capped.growth_target is None
    )  # manifest caps growth at 40000 → floored to 39936 < request
    grows = llama_requirement(native=131000, floor=32768, growth_ceiling=100500)
    assert grows.growth_target == 100352  # floored to a multiple of 1024


# -- C5 / C6: the clamp incident and the ladder -----------------------------------------------


def test_clamp_against_budget_and_live_free_ram() -> None:
    # IN12: f16 KV of ~380 KB/token at 64K on a 32 GB machine must be cut, not launched.
    weights = 8 * GIB
    clamp = clamp_ctx_for_memory(
        requested=65536,
        slots=1,
        kv_per_token=380_000,
        weights_resident=weights,
        budget=int(22.4 * GIB),
        committed_other=0,
    )
    allowance = (int(22.4 * GIB) - weights) * 0.8
    assert clamp.ctx == int(allowance / 380_000 / 1024) * 1024
    assert clamp.clamped and "window cut from 65536" in clamp.reason
    live = clamp_ctx_for_memory(
        requested=65536,
        slots=1,
        kv_per_token=380_000,
        weights_resident=weights,
        budget=int(22.4 * GIB),
        committed_other=0,
        free_ram=16 * GIB,
    )
    assert live.ctx == int((14 * GIB - weights) * 0.8 / 380_000 / 1024) * 1024 == 13312
    floored = clamp_ctx_for_memory(
        requested=65536,
        slots=1,
        kv_per_token=380_000,
        weights_resident=weights,
        budget=9 * GIB,
        committed_other=0,
    )
    assert floored.ctx == 8192  # the numeric floor
    assert (
        clamp_ctx_for_memory(
            requested=4096,
            slots=1,
            kv_per_token=380_000,
            weights_resident=weights,
            budget=1,
            committed_other=0,
        ).ctx
        == 4096
    )  # at or below the floor: unchanged


def test_ladder_sheds_slots_before_context() -> None:
    result = plan_ctx_for_memory(
        requested=65536,
        minimum=65536,
        slots=4,
        kv_per_token=36864,
        weights_resident=19 * GIB,
        budget=30 * GIB,
        committed_other=0,
    )
    assert result.minimum_satisfied
    assert result.slots == 3  # 4 × 64K does not fit, 3 do (84,992 per slot)
    assert result.ctx == 65536


def test_ladder_denies_below_the_minimum() -> None:
    result = plan_ctx_for_memory(
        requested=65536,
        minimum=65536,
        slots=2,
        kv_per_token=380_000,
        weights_resident=8 * GIB,
        budget=int(22.4 * GIB),
        committed_other=0,
    )
    assert not result.minimum_satisfied
    assert result.slots == 1
    assert "needs a window of 65536 tokens; one slot could hold" in result.reason


# -- C7 / C8: growth and slot trades ------------------------------------------------------------


def grow(
    target: int, *, fixed: float = 0, kv: float = 36864, slots: int = 3, trade: bool = True
) -> tuple[int, int]:
    g = plan_adaptive_growth(
        base_ctx=65536,
        target=target,
        slots=slots,
        kv_per_token=kv,
        fixed_per_slot=fixed,
        weights_resident=19 * GIB,
        fast_budget=30 * GIB,
        committed_other=0,
        discrete=False,
        vram=0,
        moe=False,
        free_ram=None,
        allow_slot_trade=trade,
    )
    return g.ctx, g.slots


def test_worked_trade_consolidates_to_two_lanes_for_256k() -> None:
    assert grow(262144) == (128000, 2)


def test_worked_trade_keeps_three_lanes_when_they_reach_80k() -> None:
    assert grow(81920) == (81920, 3)


def test_worked_trade_refuses_a_six_percent_gain() -> None:
    assert grow(90112) == (84992, 3)


def test_worked_windowed_block_reaches_256k_with_two_lanes() -> None:
    assert grow(262144, fixed=3 * GIB, kv=8 * KIB) == (262144, 2)


def test_no_trade_when_slots_are_pinned_and_no_growth_for_moe_on_a_card() -> None:
    assert grow(262144, trade=False) == (84992, 3)
    g = plan_adaptive_growth(
        base_ctx=65536,
        target=262144,
        slots=3,
        kv_per_token=36864,
        fixed_per_slot=0,
        weights_resident=19 * GIB,
        fast_budget=30 * GIB,
        committed_other=0,
        discrete=True,
        vram=30 * GIB,
        moe=True,
        free_ram=None,
        allow_slot_trade=True,
    )
    assert (g.ctx, g.slots, g.grown) == (65536, 3, False)


def test_growth_never_goes_below_base() -> None:
    g = plan_adaptive_growth(
        base_ctx=65536,
        target=262144,
        slots=1,
        kv_per_token=36864,
        fixed_per_slot=0,
        weights_resident=29 * GIB,
        fast_budget=30 * GIB,
        committed_other=0,
        discrete=False,
        vram=0,
        moe=False,
        free_ram=None,
        allow_slot_trade=True,
    )
    assert (g.ctx, g.grown) == (65536, False)


def test_engine_keys() -> None:
    from hostler.capacity.keys import EngineKey, make_key, parse_key

    assert make_key("llamacpp", "qwen2.5-7b", 0) == "llamacpp:qwen2.5-7b:0"
    assert parse_key("llamacpp:qwen2.5-7b:3") == EngineKey("llamacpp", "qwen2.5-7b", 3)
    assert parse_key("mlx:org/model:v1.2:0") == EngineKey("mlx", "org/model:v1.2", 0)
    for bad in (
        "llamacpp:m:01",
        "llamacpp:m:-1",
        "llamacpp::0",
        "nope",
        "llamacpp:m:x",
        "Bad Engine:m:0",
    ):
        assert parse_key(bad) is None, bad
    for args in (
        ("llamacpp", "", 0),
        ("llamacpp", "a:b", 0),
        ("llamacpp", "m", -1),
        ("LL", "m", 0),
    ):
        with pytest.raises(ValueError, match="must"):
            make_key(*args)
