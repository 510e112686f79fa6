"""Planner rules as pure functions: L5 (KV type), L7 (``--swa-full`` fit) and C6 (denial)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hostler.capacity.budget import HostMemory, compute_budget
from hostler.capacity.context import plan_ctx_for_memory, window_denial
from hostler.capacity.geometry import ModelGeometry
from hostler.capacity.kvtrade import (
    FULL_PRECISION,
    KV_POLICY,
    KV_POLICY_VERSION,
    TRADE_SLOTS,
    KvChoice,
    KvStep,
    default_kv_choice,
    gemma_trade,
    is_gemma,
    is_quantized,
)
from hostler.capacity.ledger import LedgerState, limits_of
from hostler.capacity.plan import PlanRequest, launch_choice, plan_llama
from hostler.capacity.pricing import price_launch
from hostler.capacity.swa import (
    SWA_POLICY,
    SWA_POLICY_VERSION,
    SwaFullVerdict,
    swa_full_verdict,
)
from hostler.capacity.units import GIB, MIB

# ---------------------------------------------------------------- L5: the KV cache type


def test_constants() -> None:
    assert (KV_POLICY, KV_POLICY_VERSION, TRADE_SLOTS) == ("kv-type", 1, 2)
    assert frozenset({"f32", "f16", "bf16"}) == FULL_PRECISION
    assert (SWA_POLICY, SWA_POLICY_VERSION) == ("swa-full", 1)


@pytest.mark.parametrize(
    ("kv_type", "quantized"),
    [
        (None, False),
        ("f16", False),
        ("F16", False),
        ("bf16", False),
        ("f32", False),
        ("q8_0", True),
        ("Q4_0", True),
        ("q5_1", True),
        ("iq4_nl", True),
    ],
)
def test_quantized_types(kv_type: str | None, quantized: bool) -> None:
    assert is_quantized(kv_type) is quantized


@pytest.mark.parametrize(
    ("architecture", "model", "gemma"),
    [
        ("gemma3", "x", True),
        ("Gemma2", "x", True),
        ("llama", "my-GEMMA-ft", True),
        ("codegemma", "x", False),  # the architecture must START with gemma
        ("llama", "x", False),
        ("", "", False),
    ],
)
def test_gemma_is_the_architecture_or_the_name(architecture: str, model: str, gemma: bool) -> None:
    assert is_gemma(architecture, model) is gemma


def test_the_operators_type_wins_over_everything() -> None:
    choice = default_kv_choice(explicit="q4_0", gemma=True, flash_attn_off=True, q8_unfit_width=7)
    assert (choice.kv_type, choice.step) == ("q4_0", KvStep.EXPLICIT)
    assert choice.reason == "KV q4_0: set by the operator"
    assert choice.decision == {
        "policy": "kv-type",
        "version": 1,
        "step": "explicit",
        "kv_type": "q4_0",
        "explicit": "q4_0",
        "gemma": True,
        "flash_attn_off": True,
        "q8_unfit_width": 7,
    }


def test_an_empty_explicit_type_is_no_type() -> None:
    assert default_kv_choice(explicit="", gemma=False).kv_type == "q8_0"


def test_gemma_keeps_f16_and_others_use_q8_0() -> None:
    gemma = default_kv_choice(explicit=None, gemma=True)
    assert (gemma.kv_type, gemma.step, gemma.reason) == (
        "f16",
        KvStep.DEFAULT,
        "KV f16: Gemma keeps full precision",
    )
    other = default_kv_choice(explicit=None, gemma=False)
    assert (other.kv_type, other.step, other.reason) == (
        "q8_0",
        KvStep.DEFAULT,
        "KV q8_0: the default",
    )
    assert other.decision["step"] == "default"


def test_flash_attention_off_rules_a_quantized_default_out() -> None:
    choice = default_kv_choice(explicit=None, gemma=False, flash_attn_off=True)
    assert (choice.kv_type, choice.step) == ("f16", KvStep.NO_FLASH)
    assert "needs flash attention" in choice.reason
    assert choice.decision["kv_type"] == "f16"


def test_a_head_width_q8_0_cannot_divide_keeps_f16() -> None:
    choice = default_kv_choice(explicit=None, gemma=False, q8_unfit_width=80)
    assert (choice.kv_type, choice.step) == ("f16", KvStep.HEAD_WIDTH)
    assert choice.reason == "KV f16: q8_0 blocks do not divide the head width 80"


def _trade(
    choice: KvChoice | None = None,
    *,
    slots_configured: bool = False,
    tier: int = 2,
    f16: int = 1,
    q8: int = 2,
) -> tuple[KvChoice, list[int]]:
    calls: list[int] = []

    def q8_ceiling() -> int:
        calls.append(q8)
        return q8

    base = choice or default_kv_choice(explicit=None, gemma=True)
    traded = gemma_trade(
        base, slots_configured=slots_configured, tier=tier, f16_ceiling=f16, q8_ceiling=q8_ceiling
    )
    return traded, calls


def test_gemma_trades_f16_for_a_second_slot() -> None:
    traded, calls = _trade()
    assert (traded.kv_type, traded.step, traded.slot_ceiling) == ("q8_0", KvStep.TRADE, 2)
    assert traded.reason == "KV f16 → q8_0: f16 leaves 1 slot, q8_0 allows 2"
    assert traded.decision["step"] == "gemma-trade"
    assert traded.decision["kv_type"] == "q8_0"
    assert (traded.decision["tier"], traded.decision["f16_ceiling"]) == (2, 1)
    assert traded.decision["q8_ceiling"] == 2
    assert calls == [2]


@pytest.mark.parametrize(
    "kw",
    [
        {"slots_configured": True},
        {"tier": 1},  # the tier must allow two slots
        {"f16": 2},  # f16 already gives two
        {"q8": 1},  # q8_0 would not give two either
    ],
)
def test_no_trade_without_every_condition(kw: dict[str, int | bool]) -> None:
    base = default_kv_choice(explicit=None, gemma=True)
    traded, _ = _trade(base, **kw)  # type: ignore[arg-type]
    assert traded is base
    assert traded.slot_ceiling is None


def test_trade_boundaries() -> None:
    assert _trade(tier=3, f16=0, q8=9)[0].kv_type == "q8_0"
    assert _trade(f16=1, q8=3)[0].slot_ceiling == 3


@pytest.mark.parametrize(
    "base",
    [
        default_kv_choice(explicit="f16", gemma=True),  # the operator's f16
        default_kv_choice(explicit=None, gemma=False),  # not a Gemma default
        default_kv_choice(explicit=None, gemma=False, q8_unfit_width=80),  # f16 for a reason
        default_kv_choice(explicit=None, gemma=False, flash_attn_off=True),
    ],
)
def test_only_gemmas_default_f16_is_traded(base: KvChoice) -> None:
    traded, calls = _trade(base)
    assert traded is base
    assert calls == []


def test_a_gemma_whose_q8_0_cannot_be_built_is_not_traded() -> None:
    unfit = default_kv_choice(explicit=None, gemma=True, q8_unfit_width=80)
    assert unfit.kv_type == "f16"
    assert _trade(unfit)[0] is unfit
    no_flash = default_kv_choice(explicit=None, gemma=True, flash_attn_off=True)
    assert no_flash.kv_type == "f16"
    assert _trade(no_flash)[0] is no_flash
    assert _trade(default_kv_choice(explicit=None, gemma=True, q8_unfit_width=None))[0].step is (
        KvStep.TRADE
    )


def test_the_q8_ceiling_is_only_priced_when_needed() -> None:
    assert _trade(f16=2)[1] == []
    assert _trade(tier=1)[1] == []


GEMMA = ModelGeometry(
    architecture="gemma3",
    block_count=4,
    head_count=8,
    head_count_kv=2,
    key_length=128,
    value_length=128,
    embedding_length=1024,
    sliding_window=1024,
    swa_pattern=(True, True, True, False),
    native_context=131072,
    file_size=1 * GIB,
)


def test_the_planner_uses_the_rule() -> None:
    assert launch_choice(PlanRequest("m"), GEMMA).kv_type == "f16"
    assert launch_choice(PlanRequest("m"), replace(GEMMA, architecture="llama")).kv_type == "q8_0"
    odd = replace(GEMMA, architecture="llama", key_length=80, value_length=80)
    assert launch_choice(PlanRequest("m"), odd).step is KvStep.HEAD_WIDTH
    assert launch_choice(PlanRequest("m", kv_type="q4_0"), odd).kv_type == "q4_0"


# ---------------------------------------------------------------- L7: --swa-full

# f16: windowed slot = 3 SWA layers x 2 heads x 256 x 2 B x (1024 + 2048) fixed
# = 9,437,184 B + 1 global layer x 2 x 256 x 2 = 1024 B/token; full = 4096 B/token of total.
FIXED, SLOPE, FULL_SLOPE = 9_437_184, 1024, 4096
CTX, SLOTS = 8192, 2
FULL = FULL_SLOPE * CTX * SLOTS  # 67,108,864
WINDOWED = SLOTS * (FIXED + SLOPE * CTX)  # 35,651,584


def verdict(**kw: object) -> SwaFullVerdict:
    args: dict[str, object] = {
        "model": "m",
        "ctx_per_slot": CTX,
        "slots": SLOTS,
        "kv_type": "f16",
        "weights_resident": 1 * GIB,
        "fast_budget": 2 * GIB,
        "committed_other": 0,
    }
    geometry = kw.pop("geometry", GEMMA)
    args.update(kw)
    return swa_full_verdict(geometry, **args)  # type: ignore[arg-type]


def test_a_gemma_whose_full_cache_fits_gets_swa_full() -> None:
    v = verdict()
    assert (v.applies, v.swa_full, v.fits) == (True, True, True)
    assert (v.full_kv, v.windowed_kv, v.kv_bytes) == (FULL, WINDOWED, FULL)
    assert v.needed == 1 * GIB + FULL
    assert v.available == 2 * GIB
    assert v.reason == "--swa-full: weights + full cache 1.1 GiB against 2.0 GiB fits"
    d = v.decision
    assert (d["policy"], d["version"], d["gemma"], d["swa_full"]) == ("swa-full", 1, True, True)
    assert (d["full_kv"], d["windowed_kv"], d["needed"], d["available"]) == (
        FULL,
        WINDOWED,
        1 * GIB + FULL,
        2 * GIB,
    )
    assert (d["ctx_per_slot"], d["slots"], d["kv_type"], d["committed_other"]) == (
        CTX,
        SLOTS,
        "f16",
        0,
    )


def test_the_fit_is_an_equality_boundary_beside_other_engines() -> None:
    exact = verdict(fast_budget=3 * GIB, committed_other=2 * GIB - FULL)
    assert (exact.fits, exact.swa_full, exact.available) == (True, True, 1 * GIB + FULL)
    short = verdict(fast_budget=3 * GIB, committed_other=2 * GIB - FULL + 1)
    assert (short.fits, short.swa_full, short.kv_bytes) == (False, False, WINDOWED)
    assert short.reason.startswith("--swa-full declined: weights + full cache")
    assert short.reason.endswith("does not fit")


def test_a_degraded_full_plan_declines_even_when_it_fits() -> None:
    v = verdict(full_plan_degraded=True)
    assert (v.fits, v.swa_full, v.kv_bytes) == (True, False, WINDOWED)
    assert "shed slots or context" in v.reason


def test_other_models_stay_windowed() -> None:
    v = verdict(model="qwen", geometry=replace(GEMMA, architecture="llama"))
    assert (v.applies, v.fits, v.swa_full, v.kv_bytes) == (True, True, False, WINDOWED)
    assert v.reason == "windowed cache: --swa-full is only automatic for Gemma"


def test_the_operator_wins_both_ways() -> None:
    forced = verdict(explicit=True, fast_budget=1 * GIB)  # over budget, asked anyway
    assert (forced.fits, forced.swa_full, forced.kv_bytes) == (False, True, FULL)
    assert forced.reason.startswith("--swa-full on as the operator asked")
    off = verdict(explicit=False)
    assert (off.fits, off.swa_full, off.kv_bytes) == (True, False, WINDOWED)
    assert off.reason.startswith("--swa-full off as the operator asked")


def test_quantized_caches_are_priced_at_their_type() -> None:
    v = verdict(kv_type="q8_0")
    assert v.full_kv == -(-FULL * 34 // 64)  # 34/32 B vs 2 B
    assert v.decision["kv_type"] == "q8_0"


def test_zero_slots_count_as_one() -> None:
    v = verdict(slots=0)
    assert v.full_kv == FULL_SLOPE * CTX
    assert v.windowed_kv == FIXED + SLOPE * CTX


@pytest.mark.parametrize(
    "geometry",
    [
        replace(GEMMA, swa_pattern=None),  # the header hides the layout
        replace(GEMMA, sliding_window=None),
        replace(GEMMA, swa_pattern=(True, False)),  # wrong length
        replace(GEMMA, head_count=None, key_length=None),  # no dimensions
    ],
)
def test_no_layout_prices_nothing(geometry: ModelGeometry) -> None:
    v = verdict(geometry=geometry)
    assert (v.applies, v.swa_full, v.fits, v.full_kv, v.kv_bytes, v.needed) == (
        False,
        False,
        None,
        None,
        None,
        None,
    )
    assert v.available == 2 * GIB
    assert v.reason == "no sliding-window layout in the header: nothing to price"
    assert v.decision["applies"] is False
    asked = verdict(geometry=geometry, explicit=True)
    assert asked.swa_full is True
    assert asked.reason.endswith("; --swa-full as the operator asked")
    assert verdict(geometry=geometry, explicit=False).swa_full is False


def test_no_kv_head_count_prices_no_full_cache() -> None:
    # L10: the windowed line reads the heads, but the full cache has no answer without KV heads
    v = verdict(geometry=replace(GEMMA, head_count_kv=None))
    assert (v.applies, v.swa_full, v.fits, v.full_kv, v.kv_bytes, v.needed) == (
        False,
        False,
        None,
        None,
        None,
        None,
    )
    assert v.reason == "no KV head count in the header: the full cache cannot be priced"
    asked = verdict(geometry=replace(GEMMA, head_count_kv=None), explicit=True)
    assert asked.swa_full is True
    assert asked.reason.endswith("; --swa-full as the operator asked")


# ---------------------------------------------------------------- C6: the denial


def test_the_window_denial_states_the_window_and_one_slot() -> None:
    assert (
        window_denial(65536, 18432) == "needs a window of 65536 tokens; one slot could hold 18432"
    )
    assert window_denial(1, 0) == "needs a window of 1 tokens; one slot could hold 0"


def test_the_ladder_denies_with_it() -> None:
    r = plan_ctx_for_memory(
        requested=65536,
        minimum=65536,
        slots=2,
        kv_per_token=1024,
        weights_resident=0,
        budget=40 * MIB,
        committed_other=0,
    )
    assert (r.minimum_satisfied, r.slots) == (False, 1)
    assert r.reason == window_denial(65536, r.ctx)


SMALL = compute_budget(HostMemory(system_ram=12 * GIB))  # constrained host: floor 32768
LLAMA_8B = ModelGeometry(
    architecture="llama",
    block_count=32,
    head_count=32,
    head_count_kv=8,
    embedding_length=4096,
    native_context=131072,
    file_size=int(4.9 * GIB),
)


def test_the_plan_and_the_price_state_the_window_in_their_denial() -> None:
    limits = limits_of(LedgerState(), SMALL)
    plan = plan_llama(PlanRequest("m"), LLAMA_8B, SMALL, limits, committed_other=0)
    assert not plan.admitted and not plan.minimum_satisfied
    assert plan.window_denial == "needs a window of 32768 tokens; one slot could hold 18432"
    assert f"does not fit ({plan.window_denial})." in plan.denial
    price = price_launch(
        PlanRequest("m"),
        LLAMA_8B,
        SMALL,
        limits,
        committed_other=0,
        estimate=lambda ctx, slots, kv: 5 * GIB,
    )
    assert not price.admitted  # its resident is the estimate's 5 GiB, not CB11's
    assert price.plan.window_denial == "needs a window of 32768 tokens; one slot could hold 26624"
    assert f"does not fit ({price.plan.window_denial})." in price.denial


def test_an_admitted_plan_has_no_window_denial() -> None:
    limits = limits_of(LedgerState(), SMALL)
    plan = plan_llama(
        PlanRequest("m", min_context=16384), LLAMA_8B, SMALL, limits, committed_other=0
    )
    assert plan.minimum_satisfied
    assert (plan.window_denial, plan.denial) == ("", "")
