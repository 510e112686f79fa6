"""Edges of the pure capacity rules: thresholds at, just below and just above; zero and
negative inputs; constants pinned by their literal values (B, S, C, L, CB, PP4).

Written to kill the mutants ``bench/mutate.py`` showed surviving (docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from hostler.capacity.budget import (
    BudgetKind,
    CapacityBudget,
    HostMemory,
    compute_budget,
    parse_budget_override,
)
from hostler.capacity.context import (
    CONSTRAINED_FLOOR,
    CONTEXT_FLOOR,
    ContextRequirement,
    clamp_ctx_for_memory,
    host_floor,
    llama_requirement,
    plan_adaptive_growth,
    plan_ctx_for_memory,
    requirement,
)
from hostler.capacity.geometry import ModelGeometry
from hostler.capacity.kv import (
    KvLinear,
    bytes_per_element,
    exact_linearization,
    exact_per_slot_f16,
    full_attention_kv,
    heuristic_per_slot_kv,
    hybrid_linearization,
    kv_scale,
    windowed_linearization,
)
from hostler.capacity.ledger import (
    Held,
    LedgerLimits,
    LedgerState,
    committed_other_for,
    committed_snapshot,
    decide_reserve,
    denial_reason,
    fallback_resident_bytes,
    format_denial,
    limits_of,
    shortfall,
    state_from,
)
from hostler.capacity.origin import BudgetOrigin, BudgetSource
from hostler.capacity.plan import LaunchPlan, PlanRequest, default_kv_type, plan_llama
from hostler.capacity.slots import compute_headroom, default_slots, planned_slots, slot_ceiling
from hostler.capacity.victims import DEMAND_WINDOW, Resident, VictimPlan, choose_victims
from hostler.errors import SettingError
from hostler.events.ledger import LedgerDenied, LedgerReserved

G = 1024**3
M = 1024**2


# -- B: budget ---------------------------------------------------------------------------------


def _figures(host: HostMemory, **kw: float) -> tuple[str, int, int, int, int, int, bool]:
    b = compute_budget(host, **kw)
    return (
        b.kind.value,
        b.ram_share,
        b.vram,
        b.budget,
        b.fast,
        b.concurrency_sizing,
        b.ram_spillover_auto,
    )


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        # the 96 GiB threshold: one byte below keeps the low fractions (0.6 / 0.7)
        (
            HostMemory(96 * G - 1),
            ("system-ram", 61847529061, 0, 61847529061, 61847529061, 61847529061, True),
        ),
        (
            HostMemory(96 * G),
            ("system-ram", 82463372083, 0, 82463372083, 82463372083, 82463372083, True),
        ),
        (
            HostMemory(96 * G - 1, apple_silicon=True),
            ("unified", 85899345919, 0, 85899345919, 85899345919, 72155450572, True),
        ),
        # unified: the OS keeps at least 4 GiB, and nothing is left below that
        (HostMemory(2 * G, apple_silicon=True), ("unified", 0, 0, 0, 0, 0, True)),
        (HostMemory(4 * G, apple_silicon=True), ("unified", 0, 0, 0, 0, 0, True)),
        (
            HostMemory(5 * G, apple_silicon=True),
            ("unified", 1073741824, 0, 1073741824, 1073741824, 1073741824, True),
        ),
        (
            HostMemory(20 * G, apple_silicon=True),
            ("unified", 15032385536, 0, 15032385536, 15032385536, 15032385536, True),
        ),
        # unified above 96 GiB: RAM - 16 GiB beats 80 %; slots still sized on 96 GiB
        (
            HostMemory(160 * G, apple_silicon=True),
            ("unified", 154618822656, 0, 154618822656, 154618822656, 103079215104, True),
        ),
        # the shared-pool ratio 0.75: exactly there is unified, one byte less a real card
        (
            HostMemory(64 * G, vram=48 * G),
            ("unified", 51539607552, 0, 51539607552, 51539607552, 48103633715, True),
        ),
        (
            HostMemory(64 * G, vram=48 * G - 1),
            (
                "discrete-gpu",
                41231686041,
                48962627173,
                90194313214,
                48962627173,
                48962627173,
                False,
            ),
        ),
        # no card: zero, absent or negative VRAM
        (
            HostMemory(64 * G, vram=0),
            ("system-ram", 41231686041, 0, 41231686041, 41231686041, 41231686041, True),
        ),
        (
            HostMemory(64 * G, vram=-G),
            ("system-ram", 41231686041, 0, 41231686041, 41231686041, 41231686041, True),
        ),
        # a one-byte card is a card (95 % of it rounds down to nothing)
        (HostMemory(64 * G, vram=1), ("discrete-gpu", 41231686041, 0, 41231686041, 0, 0, False)),
        # a negative RAM reading counts as none
        (HostMemory(-5), ("system-ram", 0, 0, 0, 0, 0, True)),
        # the RAM share is capped at 96 GiB on a card host too
        (
            HostMemory(256 * G, vram=24 * G),
            (
                "discrete-gpu",
                103079215104,
                24481313587,
                127560528691,
                24481313587,
                24481313587,
                False,
            ),
        ),
    ],
)
def test_budget_edges(
    host: HostMemory, expected: tuple[str, int, int, int, int, int, bool]
) -> None:
    assert _figures(host) == expected


def test_unified_flag_false_on_apple_silicon_is_obeyed() -> None:
    assert compute_budget(HostMemory(16 * G, unified=False, apple_silicon=True)).kind is (
        BudgetKind.SYSTEM_RAM
    )


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        # exactly the usable VRAM: the RAM share is 0, fast is the whole override
        (
            24481313587 / G,
            ("discrete-gpu", 0, 24481313587, 24481313587, 24481313587, 24481313587, False),
        ),
        (1.0, ("discrete-gpu", 0, 24481313587, 1073741824, 1073741824, 1073741824, False)),
        (
            30.0,
            ("discrete-gpu", 7730941133, 24481313587, 32212254720, 24481313587, 24481313587, False),
        ),
        (
            0.0,
            (
                "discrete-gpu",
                41231686041,
                24481313587,
                65712999628,
                24481313587,
                24481313587,
                False,
            ),
        ),
        (
            -1.0,
            (
                "discrete-gpu",
                41231686041,
                24481313587,
                65712999628,
                24481313587,
                24481313587,
                False,
            ),
        ),
        (
            float("inf"),
            (
                "discrete-gpu",
                41231686041,
                24481313587,
                65712999628,
                24481313587,
                24481313587,
                False,
            ),
        ),
        (
            float("nan"),
            (
                "discrete-gpu",
                41231686041,
                24481313587,
                65712999628,
                24481313587,
                24481313587,
                False,
            ),
        ),
    ],
)
def test_override_edges_on_a_card_host(
    override: float, expected: tuple[str, int, int, int, int, int, bool]
) -> None:
    assert _figures(HostMemory(64 * G, vram=24 * G), override_gib=override) == expected
    overridden = compute_budget(HostMemory(64 * G, vram=24 * G), override_gib=override)
    assert overridden.overridden is (0 < override < float("inf"))


def test_override_on_a_unified_host_is_the_whole_fast_budget() -> None:
    b = compute_budget(HostMemory(32 * G, apple_silicon=True), override_gib=0.5)
    assert (b.budget, b.fast, b.concurrency_sizing, b.ram_share, b.vram) == (
        536870912,
        536870912,
        536870912,
        536870912,
        0,
    )
    assert b.ram_spillover_auto is True


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", 1.0),
        ("0.001", 0.001),
        ("1e-3", 0.001),
        ("  2 ", 2.0),
        ("1e1", 10.0),
        ("  ", None),
        ("", None),
        ("1048576", 1048576.0),
    ],
)
def test_budget_override_text_edges(text: str, value: float | None) -> None:
    assert parse_budget_override(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "-0",
        "0",
        "-3",
        "abc",
        "nan",
        "inf",
        "-inf",
        "1048576.5",
        "1e400",
        "12 GiB",
        "1,5",
        "0.0009",
        "1e-300",
        "5e-324",
    ],
)
def test_budget_override_malformed_is_one_line_error(text: str) -> None:
    with pytest.raises(SettingError) as caught:
        parse_budget_override(text)
    message = str(caught.value)
    assert "\n" not in message
    assert message == (
        f"HOSTLER_CAPACITY_BUDGET_GB={text.strip()!r}: expected a number of GiB from 0.001 to "
        "1048576 (e.g. 24 or 12.5); unset it for the automatic budget"
    )
    assert caught.value.code == "usage.setting"
    assert caught.value.exit_status == 2


# -- PP4: victims --------------------------------------------------------------------------------


def _r(
    key: str,
    size: int,
    *,
    busy: bool = False,
    draining: bool = False,
    hits: int = 0,
    used: float = 0.0,
) -> Resident:
    return Resident(key, size, busy, draining, hits, used)


def test_demand_window_is_a_minute() -> None:
    assert DEMAND_WINDOW == 60.0


def test_no_shortfall_no_victims() -> None:
    idle = [_r("a", 5)]
    assert choose_victims(idle, 0) == VictimPlan((), 0, True, None)
    assert choose_victims(idle, -3) == VictimPlan((), 0, True, None)


def test_one_byte_of_shortfall_takes_a_victim() -> None:
    assert choose_victims([_r("a", 1)], 1) == VictimPlan(("a",), 1, True, None)
    assert choose_victims([], 1) == VictimPlan((), 0, False, None)


def test_the_batch_stops_as_soon_as_it_covers_the_shortfall() -> None:
    idle = [_r("a", 5, used=1.0), _r("b", 5, used=2.0), _r("c", 5, used=3.0)]
    assert choose_victims(idle, 5) == VictimPlan(("a",), 5, True, None)  # equality covers
    assert choose_victims(idle, 6) == VictimPlan(("a", "b"), 10, True, None)
    assert choose_victims(idle, 15) == VictimPlan(("a", "b", "c"), 15, True, None)
    assert choose_victims(idle, 16) == VictimPlan(("a", "b", "c"), 15, False, None)


def test_order_is_fewest_hits_then_oldest_then_key() -> None:
    idle = [
        _r("hot-old", 1, hits=3, used=1.0),
        _r("cold-new", 1, hits=0, used=9.0),
        _r("cold-old-b", 1, hits=0, used=2.0),
        _r("cold-old-a", 1, hits=0, used=2.0),
        _r("warm", 1, hits=1, used=0.5),
    ]
    plan = choose_victims(idle, 5)
    assert plan.victims == ("cold-old-a", "cold-old-b", "cold-new", "warm", "hot-old")


def test_busy_and_draining_engines_are_never_victims() -> None:
    residents = [
        _r("busy-old", 50, busy=True, used=1.0),
        _r("busy-new", 50, busy=True, used=5.0),
        _r("draining", 50, draining=True, used=0.0),
        _r("busy-draining", 50, busy=True, draining=True, used=0.0),
        _r("idle", 10, used=3.0),
    ]
    plan = choose_victims(residents, 20)
    assert plan == VictimPlan(("idle",), 10, False, "busy-old")
    assert choose_victims(residents, 10) == VictimPlan(("idle",), 10, True, None)


def test_busy_fallback_ties_break_by_key_and_none_when_only_draining() -> None:
    residents = [_r("b", 5, busy=True, used=1.0), _r("a", 5, busy=True, used=1.0)]
    assert choose_victims(residents, 1).busy_fallback == "a"
    draining = [_r("d", 5, busy=True, draining=True), _r("e", 5, draining=True)]
    assert choose_victims(draining, 1) == VictimPlan((), 0, False, None)


# -- S: slots ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fast", "slots"),
    [
        (0, 1),
        (12 * G - 1, 1),
        (12 * G, 2),
        (24 * G - 1, 2),
        (24 * G, 3),
        (48 * G - 1, 3),
        (48 * G, 4),
        (10**15, 4),
    ],
)
def test_default_slot_tiers_at_their_thresholds(fast: int, slots: int) -> None:
    assert default_slots(fast) == slots


def test_compute_headroom_by_engine() -> None:
    assert [compute_headroom(e) for e in ("mlx", "llamacpp", "llama-cpp", "ds4", "other")] == [
        0.35,
        0.20,
        0.20,
        0.20,
        0.20,
    ]


def _ceiling(**kw: object) -> int:
    args: dict[str, object] = {
        "engine": "ds4",  # ds4 prices 0 B of weights as 0 B: the KV budget is the budget
        "ctx": 1000,
        "weights_bytes": 0,
        "budget": 10 * G,
        "committed_other": 0,
        "cache_type": "f16",
        "exact_f16_per_slot": G,
    }
    args.update(kw)
    return slot_ceiling(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "slots"),
    [
        ({}, 8),  # 10 GiB x 0.8 / 1 GiB
        ({"engine": "mlx"}, 5),  # (10 - 1 GiB of MLX runtime) x 0.65
        ({"committed_other": 2 * G}, 6),
        ({"sizing_budget": 5 * G}, 4),
        ({"sizing_budget": 20 * G}, 8),  # the sizing budget only ever lowers
        ({"budget": 0}, 1),  # never below one slot
        ({"budget": 5 * G + 5 * G // 4}, 5),  # usable exactly 5 slots
        ({"budget": 5 * G + 5 * G // 4 - 1}, 4),
        ({"exact_f16_per_slot": 0}, 209),  # heuristic: 40 KiB/token x 1000 tokens
        ({"exact_f16_per_slot": -5}, 209),
        ({"exact_f16_per_slot": None, "ctx": 0}, 1),  # a slot that costs nothing
        ({"cache_type": "q4_0"}, 26),  # 1 GiB x 0.30 per slot
        ({"engine": "llamacpp", "weights_bytes": G}, 6),  # 10 - 1.1 GiB - 256 MiB
        ({"exact_f16_per_slot": 1, "budget": 10}, 8),  # a 1-byte slot is still priced
        ({"exact_f16_per_slot": 1, "budget": 1}, 1),
    ],
)
def test_slot_ceiling_edges(kw: dict[str, object], slots: int) -> None:
    assert _ceiling(**kw) == slots


def test_planned_slots_resolver_edges() -> None:
    assert planned_slots(None, 3, 2) == 2
    assert planned_slots(0, 3, 2) == 2  # zero and negative counts are "not configured"
    assert planned_slots(-1, 3, 2) == 2
    assert planned_slots(7, 3, 2) == 7  # verbatim, even above the ceiling
    assert planned_slots(1, 9, 4) == 1
    assert planned_slots(None, 0, 4) == 1
    assert planned_slots(None, 5, 4) == 4
    assert planned_slots(None, 4, 5) == 4


# -- C: context ----------------------------------------------------------------------------------


def test_context_constants_by_value() -> None:
    assert (CONTEXT_FLOOR, CONSTRAINED_FLOOR) == (65536, 32768)


@pytest.mark.parametrize(
    ("kw", "floor"),
    [
        ({"discrete": True, "usable_vram": 8 * G, "system_ram": 64 * G}, 32768),
        ({"discrete": True, "usable_vram": 8 * G + 1, "system_ram": 4 * G}, 65536),
        ({"discrete": False, "usable_vram": 0, "system_ram": 16 * G}, 32768),
        ({"discrete": False, "usable_vram": 0, "system_ram": 16 * G + 1}, 65536),
        ({"discrete": False, "usable_vram": 0, "system_ram": 4 * G, "env_minimum": 0}, 32768),
        ({"discrete": False, "usable_vram": 0, "system_ram": 4 * G, "env_minimum": -1}, 32768),
        ({"discrete": False, "usable_vram": 0, "system_ram": 64 * G, "env_minimum": 1}, 1),
        ({"discrete": True, "usable_vram": 4 * G, "system_ram": 4 * G, "env_minimum": 99}, 99),
    ],
)
def test_host_floor_edges(kw: dict[str, object], floor: int) -> None:
    assert host_floor(**kw) == floor  # type: ignore[arg-type]


def test_generic_requirement_edges() -> None:
    assert requirement(None, None, 65536) == ContextRequirement(65536, 65536, 65536)
    assert requirement(0, 0, 32768) == ContextRequirement(32768, 32768, 32768)
    assert requirement(4096, None, 65536) == ContextRequirement(4096, 4096, 4096)
    assert requirement(131072, 100000, 65536) == ContextRequirement(131072, 100000, 65536)
    assert requirement(131072, 1000, 65536) == ContextRequirement(131072, 65536, 65536)
    assert requirement(131072, 200000, 65536) == ContextRequirement(131072, 131072, 65536)


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({}, (131072, 65536, 65536, 131072, False)),
        ({"explicit": 8192, "override_below_floor": True}, (131072, 8192, 8192, None, False)),
        ({"explicit": 8192}, (131072, 65536, 65536, None, False)),
        ({"explicit": 65536, "override_below_floor": True}, (131072, 65536, 65536, None, False)),
        ({"explicit": 65535, "override_below_floor": True}, (131072, 65535, 65535, None, False)),
        ({"policy": "model-max"}, (131072, 131072, 131072, None, True)),
        ({"policy": "model-max", "native": None}, (65536, 65536, 65536, None, False)),
        ({"policy": "model-max", "explicit": 70000}, (131072, 70000, 65536, None, False)),
        ({"native": 66560}, (66560, 65536, 65536, 66560, False)),
        ({"native": 66559}, (66559, 65536, 65536, None, False)),  # 1024-aligned: 65536
        ({"native": 65536}, (65536, 65536, 65536, None, False)),
        ({"manifest_context": 32768}, (131072, 65536, 65536, None, False)),
        ({"manifest_context": 98304}, (131072, 98304, 65536, None, False)),
        ({"manifest_context": 99999}, (131072, 99999, 65536, None, False)),
        ({"growth_ceiling": 67583}, (131072, 65536, 65536, 66560, False)),
        ({"growth_ceiling": 66560}, (131072, 65536, 65536, 66560, False)),
        ({"growth_ceiling": 66559}, (131072, 65536, 65536, None, False)),
        ({"policy": "other"}, (131072, 65536, 65536, None, False)),
    ],
)
def test_llama_requirement_edges(
    kw: dict[str, object], expected: tuple[int, int, int, int | None, bool]
) -> None:
    args: dict[str, object] = {"native": 131072, "floor": 65536}
    args.update(kw)
    r = llama_requirement(**args)  # type: ignore[arg-type]
    assert (r.native, r.requested, r.minimum, r.growth_target, r.strict) == expected


def _clamp(**kw: object) -> tuple[int, bool]:
    args: dict[str, object] = {
        "requested": 10**7,
        "slots": 1,
        "kv_per_token": 1024,
        "weights_resident": 2 * G,
        "budget": 10 * G,
        "committed_other": 0,
    }
    args.update(kw)
    c = clamp_ctx_for_memory(**args)  # type: ignore[arg-type]
    assert c.clamped == bool(c.reason)
    return c.ctx, c.clamped


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({}, (6710272, True)),  # 8 GiB x 0.8 / 1024 B, down to a multiple of 1024
        ({"slots": 2}, (3354624, True)),
        ({"slots": 0}, (6710272, True)),  # counted as one slot
        ({"committed_other": G}, (5871616, True)),
        ({"free_ram": 6 * G}, (1677312, True)),  # live: 6 - 2 GiB reserve = 4 GiB
        ({"free_ram": 6 * G, "vram": G}, (2515968, True)),
        ({"free_ram": 2 * G, "vram": 4 * G}, (1677312, True)),
        ({"free_ram": G, "vram": -G}, (8192, True)),  # nothing live: the floor
        ({"free_ram": 20 * G}, (6710272, True)),  # the budget still caps
        ({"requested": 8192, "budget": 0}, (8192, False)),  # at the floor: untouched
        ({"requested": 8193, "budget": 0}, (8192, True)),
        ({"kv_per_token": 0}, (10**7, False)),
        ({"kv_per_token": -1}, (10**7, False)),
        ({"requested": 6710272}, (6710272, False)),  # exactly what fits
        ({"requested": 6710273}, (6710272, True)),
        ({"budget": 2 * G}, (8192, True)),  # no allowance at all
        ({"budget": 2 * G, "floor": 1}, (1, True)),
        ({"budget": 2 * G + 1280 * 1024, "floor": 1}, (1024, True)),
        ({"budget": 2 * G + 1280 * 1024 - 1, "floor": 1}, (1, True)),
    ],
)
def test_clamp_edges(kw: dict[str, object], expected: tuple[int, bool]) -> None:
    assert _clamp(**kw) == expected


def test_clamp_edges_of_the_live_half_and_tiny_slopes() -> None:
    # one byte of card or of RAM above the 2 GiB reserve decides between 1 and 1024 tokens
    assert _clamp(weights_resident=0, free_ram=2 * G, vram=1280 * 1024, floor=1) == (1024, True)
    assert _clamp(weights_resident=0, free_ram=2 * G, vram=1280 * 1024 - 1, floor=1) == (1, True)
    assert _clamp(weights_resident=0, free_ram=2 * G - 5, vram=1280 * 1024, floor=1) == (
        1024,
        True,
    )
    # an allowance under one byte still holds tokens when a token costs almost nothing
    assert _clamp(requested=10**6, kv_per_token=0.0001, weights_resident=0, budget=1, floor=1) == (
        7168,
        True,
    )


def test_clamp_reason_by_value() -> None:
    c = clamp_ctx_for_memory(
        requested=10**7,
        slots=2,
        kv_per_token=1024.5,
        weights_resident=2 * G,
        budget=10 * G,
        committed_other=G,
    )
    assert c.reason == (
        "window cut from 10000000 to 2933760 tokens per slot: 2 slot(s) of KV at 1025 B/token "
        "beside 2.0 GiB of weights fill 80% of the 9.0 GiB left"
    )


def test_clamp_constants_by_value() -> None:
    assert _clamp(requested=8193, budget=0, floor=8192) == (8192, True)
    # the 2 GiB OS reserve of the live half: 2 GiB + 1280 KiB free holds exactly 1024 tokens
    assert _clamp(weights_resident=0, free_ram=2 * G + 1280 * 1024, floor=1) == (1024, True)
    assert _clamp(weights_resident=0, free_ram=2 * G + 1280 * 1024 - 1, floor=1) == (1, True)


def _ladder(**kw: object) -> tuple[int, int, bool]:
    args: dict[str, object] = {
        "requested": 10**7,
        "minimum": 3354624,
        "slots": 3,
        "kv_per_token": 1024,
        "weights_resident": 2 * G,
        "budget": 10 * G,
        "committed_other": 0,
    }
    args.update(kw)
    r = plan_ctx_for_memory(**args)  # type: ignore[arg-type]
    return r.ctx, r.slots, r.minimum_satisfied


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({}, (3354624, 2, True)),  # 3 slots hold 2236416 each; 2 slots meet it exactly
        ({"minimum": 3354625}, (6710272, 1, True)),
        ({"minimum": 2236416}, (2236416, 3, True)),
        ({"minimum": 2236417}, (3354624, 2, True)),
        ({"slots": 0, "minimum": 1}, (6710272, 1, True)),
        ({"minimum": 6710272}, (6710272, 1, True)),
        ({"minimum": 6710273}, (6710272, 1, False)),  # denied, never launched short
        ({"requested": 4096, "minimum": 4096}, (4096, 3, True)),
    ],
)
def test_ladder_edges(kw: dict[str, object], expected: tuple[int, int, bool]) -> None:
    assert _ladder(**kw) == expected


def test_ladder_denial_says_what_one_slot_holds() -> None:
    r = plan_ctx_for_memory(
        requested=10**7,
        minimum=6710273,
        slots=2,
        kv_per_token=1024,
        weights_resident=2 * G,
        budget=10 * G,
        committed_other=0,
    )
    assert r.clamped
    assert r.reason == "needs a window of 6710273 tokens; one slot could hold 6710272"


def _grow(**kw: object) -> tuple[int, int, bool]:
    # 1280 MiB fast, no weights, 1 KiB/token: 80% holds 2**20 tokens in all
    args: dict[str, object] = {
        "base_ctx": 100000,
        "target": 300000,
        "slots": 4,
        "kv_per_token": 1024,
        "fixed_per_slot": 0,
        "weights_resident": 0,
        "fast_budget": 1280 * M,
        "committed_other": 0,
        "discrete": False,
        "vram": 0,
        "moe": False,
        "free_ram": None,
        "allow_slot_trade": True,
    }
    args.update(kw)
    g = plan_adaptive_growth(**args)  # type: ignore[arg-type]
    return g.ctx, g.slots, g.grown


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({}, (262144, 4, True)),  # 3 slots would reach 300000, but that is < 1.25x
        ({"target": 327680}, (327680, 3, True)),  # exactly 1.25x: the trade is taken
        ({"target": 327679}, (262144, 4, True)),
        ({"target": 600000}, (524288, 2, True)),  # best window while none reaches it
        ({"target": 340000}, (340000, 3, True)),  # the largest count that reaches it
        ({"slots": 2, "target": 2**21}, (524288, 2, True)),  # never trades below 2 slots
        ({"slots": 1, "target": 2**21}, (1048576, 1, True)),
        ({"discrete": True, "vram": 640 * M}, (262144, 2, True)),  # the card caps it
        ({"free_ram": 2 * G + 640 * M, "target": 600000}, (262144, 2, True)),
        ({"moe": True, "discrete": True, "vram": G}, (100000, 4, False)),
        ({"moe": True}, (262144, 4, True)),  # MoE grows on shared memory
        ({"target": 100000}, (100000, 4, False)),
        ({"target": 100001}, (100001, 4, True)),
        ({"target": None}, (100000, 4, False)),
        ({"kv_per_token": 0}, (100000, 4, False)),
        ({"allow_slot_trade": False, "target": 600000}, (262144, 4, True)),
        ({"base_ctx": 262144}, (262144, 4, False)),
        ({"base_ctx": 262143}, (262144, 4, True)),
        ({"fixed_per_slot": 64 * M}, (300000, 2, True)),
        ({"kv_per_token": 1, "target": 2**31}, (536870912, 2, True)),  # 1 B/token still grows
        ({"kv_per_token": 0.5, "slots": 1, "target": 2**31}, (2147483648, 1, True)),
    ],
)
def test_growth_edges(kw: dict[str, object], expected: tuple[int, int, bool]) -> None:
    assert _grow(**kw) == expected


# -- L9–L11, S3–S4: KV -------------------------------------------------------------------------

_BASE = ModelGeometry(block_count=4, head_count=8, head_count_kv=2, embedding_length=1024)
_SWA = replace(_BASE, swa_pattern=(True, False, True, False), sliding_window=100, key_length_swa=32)
_HYBRID = replace(
    _BASE,
    block_count=8,
    full_attention_interval=4,
    ssm_inner_size=10,
    ssm_conv_kernel=4,
    ssm_state_size=3,
)


@pytest.mark.parametrize(
    ("geometry", "ctx", "kind", "expected"),
    [
        (_BASE, 1, "f16", 4096),  # 4 layers x 2 heads x (128 + 128) x 2 B
        (_BASE, 3, "q8_0", 6528),
        (_BASE, 3, "q4_0", 3456),
        (_BASE, 0, "f16", 0),
        (replace(_BASE, key_length=64), 1, "f16", 3072),
        (replace(_BASE, value_length=64), 1, "f16", 3072),
        (
            ModelGeometry(block_count=4, head_count_kv=2, key_length=64, value_length=32),
            1,
            "f16",
            1536,
        ),
        (replace(_BASE, shared_kv_layers=-2), 1, "f16", 4096),
        (replace(_BASE, shared_kv_layers=3), 1, "f16", 1024),
        (replace(_BASE, shared_kv_layers=4), 1, "f16", 0),
        (replace(_BASE, shared_kv_layers=9), 1, "f16", 0),
        (replace(_BASE, full_attention_interval=1), 1, "f16", 4096),
        (replace(_BASE, full_attention_interval=2), 1, "f16", 2048),  # layers 1 and 3
        (replace(_BASE, full_attention_interval=4), 1, "f16", 1024),
        (replace(_BASE, full_attention_interval=5), 1, "f16", 0),
        (replace(_BASE, key_length=3, value_length=2), 4096, "q8_0", 174080),
        (replace(_BASE, key_length=3, value_length=2), 1, "q8_0", 43),  # rounded up
        (_SWA, 1, "f16", 3328),
        (replace(_SWA, shared_kv_layers=1), 1, "f16", 2304),
        (replace(_SWA, value_length_swa=16), 1, "f16", 2432),
    ],
)
def test_full_attention_kv_edges(
    geometry: ModelGeometry, ctx: int, kind: str, expected: int
) -> None:
    assert full_attention_kv(geometry, ctx, kind) == expected


@pytest.mark.parametrize(
    "geometry",
    [
        replace(_BASE, block_count=0),
        replace(_BASE, block_count=None),
        replace(_BASE, head_count=None),
        replace(_BASE, embedding_length=None),
        replace(_BASE, head_count_kv=None),  # no KV head count: never assumed = heads
        replace(_SWA, head_count_kv=None),
        replace(_BASE, head_count_kv=None, key_length=128, value_length=128),
        replace(_BASE, head_count_kv=None, head_count=None, key_length=8, value_length=8),
        replace(_SWA, head_count_kv=(2, 2, 2)),  # fewer per-layer counts than layers
    ],
)
def test_full_attention_kv_without_the_facts_is_none(geometry: ModelGeometry) -> None:
    assert full_attention_kv(geometry, 1, "f16") is None


def test_windowed_line_edges() -> None:
    assert windowed_linearization(_SWA, "f16") == KvLinear(2749440.0, 2048.0)
    # 2 SWA layers x 2 heads x (32 + 128) x 2 B x (100 + 2048 cells)
    assert windowed_linearization(replace(_SWA, shared_kv_layers=1), "f16") == KvLinear(
        2749440.0, 1024.0
    )
    assert windowed_linearization(replace(_SWA, sliding_window=0), "f16") is None
    assert windowed_linearization(replace(_SWA, head_count_kv=(2, 2, 2)), "f16") is None
    assert windowed_linearization(replace(_SWA, embedding_length=None), "f16") is None
    assert windowed_linearization(replace(_SWA, block_count=None), "f16") is None
    assert windowed_linearization(replace(_SWA, swa_pattern=(True,) * 5), "f16") is None
    assert exact_linearization(_SWA, "f16") == KvLinear(2749440.0, 2048.0)
    assert exact_per_slot_f16(_SWA, 10) == 2749440 + 20480


def test_hybrid_line_edges() -> None:
    assert hybrid_linearization(_HYBRID, "f16") == KvLinear(1440.0, 2048.0)
    # 6 linear layers x (10 x (4 - 1) + 10 x 3) x 4 B; layers 3 and 7 are full
    assert hybrid_linearization(replace(_HYBRID, full_attention_interval=2), "f16") == (
        KvLinear(960.0, 4096.0)
    )
    assert hybrid_linearization(replace(_HYBRID, head_count_kv=None), "f16") == KvLinear(
        1440.0, 8192.0
    )
    assert hybrid_linearization(replace(_HYBRID, shared_kv_layers=4), "q8_0") == KvLinear(
        720.0, 544.0
    )
    # two owning layers, neither full: layer i is full when (i + 1) % 4 == 0
    assert hybrid_linearization(replace(_HYBRID, shared_kv_layers=6), "f16") == KvLinear(480.0, 0.0)
    assert hybrid_linearization(replace(_HYBRID, shared_kv_layers=5), "f16") == KvLinear(720.0, 0.0)
    for broken in (
        replace(_HYBRID, full_attention_interval=1),
        replace(_HYBRID, full_attention_interval=None),
        replace(_HYBRID, ssm_inner_size=None),
        replace(_HYBRID, ssm_conv_kernel=None),
        replace(_HYBRID, ssm_state_size=None),
        replace(_HYBRID, block_count=None),
        replace(_HYBRID, embedding_length=None),
        replace(_HYBRID, head_count_kv=None, head_count=None, key_length=8, value_length=8),
    ):
        assert hybrid_linearization(broken, "f16") is None
    assert exact_linearization(_HYBRID, "f16") == KvLinear(1440.0, 2048.0)


def test_full_attention_line_and_exact_slot_edges() -> None:
    assert exact_linearization(replace(_BASE, key_length=3, value_length=2), "q8_0") == (
        KvLinear(0.0, 42.5)
    )
    assert exact_per_slot_f16(_BASE, 10) == 40960
    assert exact_per_slot_f16(_BASE, 0) == 0
    assert exact_per_slot_f16(ModelGeometry(), 10) is None
    assert exact_linearization(ModelGeometry(), "f16") is None


def test_heuristic_and_scale_edges() -> None:
    assert heuristic_per_slot_kv(10**10, 10, "f16") == 500000  # 50,000 B/token
    assert heuristic_per_slot_kv(10**10, 10, None) == 275000  # unspecified = q8_0
    assert heuristic_per_slot_kv(0, 0, "f16") == 0
    assert heuristic_per_slot_kv(10**12, 1, "f32") == 819200  # 400 KiB cap x 2
    assert heuristic_per_slot_kv(8_192_000_000 - 200_000, 1, "f16") == 40960  # floor
    assert heuristic_per_slot_kv(81_920_000_000 + 200_000, 1, "f16") == 409600  # cap
    assert heuristic_per_slot_kv(81_920_000_000 - 200_000, 1, "f16") == 409599
    assert [kv_scale(k) for k in ("Q4_K", "Q8_0", "F32", "q5_0", "f64")] == [
        0.30,
        0.55,
        2.0,
        1.0,
        1.0,
    ]
    assert bytes_per_element("F16") == 2.0
    assert bytes_per_element("Q4_0") == 0.5625
    assert bytes_per_element("") == 2.0


def test_kv_line_at() -> None:
    assert KvLinear(100.0, 3.0).at(0) == 100
    assert KvLinear(100.0, 3.0).at(10) == 130
    assert KvLinear(0.0, 0.0).at(10**9) == 0


# -- L4–L8: the plan -------------------------------------------------------------------------------

_GEO = ModelGeometry(
    architecture="llama",
    block_count=4,
    head_count=8,
    head_count_kv=2,
    embedding_length=1024,
    native_context=131072,
    file_size=G,
)
_GEMMA = ModelGeometry(
    architecture="gemma3",
    block_count=32,
    head_count=32,
    head_count_kv=8,
    embedding_length=4096,
    native_context=131072,
    file_size=G,
)
_RAM32 = compute_budget(HostMemory(32 * G))  # 19.2 GiB, tier 2
_RAM27 = compute_budget(HostMemory(27 * G))  # 16.2 GiB, tier 2
_WEIGHTS = 1449551462  # CB11: 1 GiB x 1.10 + 256 MiB


def _plan(
    request: PlanRequest | None = None,
    *,
    geometry: ModelGeometry = _GEO,
    auto: CapacityBudget = _RAM32,
    limits: LedgerLimits | None = None,
    others: int = 0,
    free_ram: int | None = None,
) -> LaunchPlan:
    return plan_llama(
        request or PlanRequest("m"),
        geometry,
        auto,
        limits or limits_of(LedgerState(), auto),
        committed_other=others,
        free_ram=free_ram,
    )


def test_plan_figures_by_value() -> None:
    p = _plan()
    assert (p.admitted, p.context_window, p.slots, p.kv_type) == (True, 131072, 2, "q8_0")
    assert p.weights_bytes == _WEIGHTS
    assert p.kv == KvLinear(0.0, 2176.0)  # 4 x 2 x 256 x 34/32
    assert p.planned_bytes == 1734764134  # weights + 131072 x 2176
    assert p.reserved_bytes == 2019976806  # weights + 2 slots
    assert p.total_ctx == 262144
    assert p.native_window == 131072
    assert (p.applied_override, p.auto_window, p.exact_geometry) == (None, None, True)
    assert p.expected.total == 1674575872  # 1 GiB + 544 MiB KV + 29 MiB runtime (no vocabulary)
    assert p.committed_other == 0
    assert p.reasons == [
        "window: 65536 requested, 65536 minimum (host floor 65536, native 131072)",
        "slots: 2 (tier 2, ceiling 103)",
        "grown: 65536 → 131072 tokens per slot",
    ]
    assert p.denial == ""


def test_plan_with_configured_slots_and_kv() -> None:
    p = _plan(PlanRequest("m", slots=3))
    assert (p.slots, p.reserved_bytes, p.total_ctx) == (3, 2305189478, 393216)
    assert p.reasons[1] == "slots: 3 (configured)"
    f16 = _plan(PlanRequest("m", kv_type="f16"))
    assert (f16.kv_type, f16.kv, f16.slots) == ("f16", KvLinear(0.0, 4096.0), 2)
    assert f16.reasons[1] == "slots: 2 (tier 2, ceiling 57)"


def test_plan_model_max_asks_the_native_window() -> None:
    p = _plan(PlanRequest("m", policy="model-max"))
    assert (
        p.reasons[0] == "window: 131072 requested, 131072 minimum (host floor 65536, native 131072)"
    )
    assert (p.context_window, p.slots) == (131072, 2)


def test_plan_against_live_free_ram() -> None:
    p = _plan(free_ram=4 * G)
    assert (p.context_window, p.slots, p.reserved_bytes) == (128000, 2, 2006607462)


def test_plan_with_a_heuristic_line() -> None:
    p = _plan(geometry=replace(_GEO, block_count=None))
    assert p.exact_geometry is False
    assert p.kv == KvLinear(0.0, 22528.0)  # 40 KiB/token floor x 0.55
    assert (p.context_window, p.slots) == (65536, 2)  # no growth on a guess
    assert p.reserved_bytes == 4402341478
    assert (
        "KV: exact size unknown (header geometry incomplete), heuristic pricing (may be off)"
        in (p.reasons)
    )


def test_plan_without_a_kv_head_count_says_the_kv_is_unknown() -> None:
    # L10: no head_count_kv is no answer, never heads = KV heads (that would price 4x the KV)
    p = _plan(geometry=replace(_GEO, head_count_kv=None))
    assert p.exact_geometry is False
    assert p.kv == KvLinear(0.0, 22528.0)  # the S4 heuristic, as with any unreadable header
    assert (p.context_window, p.slots, p.reserved_bytes) == (65536, 2, 4402341478)
    assert (
        "KV: exact size unknown (header geometry incomplete), heuristic pricing (may be off)"
        in (p.reasons)
    )


def test_plan_override_reports_the_automatic_window() -> None:
    p = _plan(PlanRequest("m", ctx=8192, ctx_is_model_override=True))
    assert (p.context_window, p.applied_override, p.auto_window) == (8192, 8192, 131072)
    assert p.reasons[0] == "window: 8192 requested, 8192 minimum (host floor 65536, native 131072)"


def test_plan_admits_at_exactly_the_budget() -> None:
    weightless_kv = replace(_GEO, shared_kv_layers=4)  # no KV at all: reserved = weights
    fits = _plan(
        geometry=weightless_kv, limits=LedgerLimits(True, _WEIGHTS, _WEIGHTS, True, _WEIGHTS)
    )
    assert (fits.admitted, fits.reserved_bytes, fits.denial) == (True, _WEIGHTS, "")
    tight = _WEIGHTS - 1
    short = _plan(geometry=weightless_kv, limits=LedgerLimits(True, tight, tight, True, tight))
    assert short.admitted is False
    assert short.denial == (
        "m needs 1.3 GiB but 1.3 GiB is available. The budget, 1.3 GiB, is automatic (a share "
        "of this host's memory): set a larger one with `hostler budget --set SIZE` (PUT "
        "/api/budget), a config's [budget] bytes, or HOSTLER_CAPACITY_BUDGET_GB; or unload a "
        "model."
    )


def test_plan_below_the_minimum_is_denied_with_the_reason() -> None:
    p = _plan(others=18 * G)
    # denied, and priced at the minimum window (never at the window that would "fit" and fail)
    assert (p.admitted, p.slots, p.context_window) == (False, 1, 65536)
    assert p.reserved_bytes == p.weights_bytes + p.kv.at(65536)
    assert p.reasons[-1] == "needs a window of 65536 tokens; one slot could hold 1"
    assert p.committed_other == 18 * G
    assert p.window_denial == "needs a window of 65536 tokens; one slot could hold 1"
    assert p.denial.endswith(  # C6: the window required and what one slot could hold
        "other models hold 18.0 GiB; even one slot at the minimum context window does not "
        "fit (needs a window of 65536 tokens; one slot could hold 1). The budget, 19.2 GiB, is "
        "automatic (60% of 32.0 GiB of RAM): set a larger one with `hostler budget --set SIZE` "
        "(PUT /api/budget), a config's [budget] bytes, or HOSTLER_CAPACITY_BUDGET_GB; or unload "
        "a model."
    )


def test_plan_sheds_slots_and_says_so() -> None:
    p = _plan(PlanRequest("m", slots=4), others=int(17.45 * G))
    assert (p.admitted, p.slots, p.context_window) == (True, 2, 78848)
    assert p.reasons[1:] == [
        "slots: 4 (configured)",
        "shed slots 4 → 2 so each keeps at least 65536 tokens (concurrency goes before context)",
        "grown: 65536 → 78848 tokens per slot",
    ]
    three = _plan(PlanRequest("m", slots=4), others=int(17.3 * G))
    assert (three.slots, three.context_window) == (3, 71680)


@pytest.mark.parametrize(
    ("request_", "auto", "expected"),
    [
        (PlanRequest("m"), _RAM27, (91136, 2, "q8_0", True)),  # f16 gives 1 slot, q8_0 two
        (PlanRequest("m", slots=1), _RAM27, (97280, 1, "f16", False)),
        (PlanRequest("m", kv_type="f16"), _RAM27, (97280, 1, "f16", False)),
        (PlanRequest("m"), compute_budget(HostMemory(19 * G)), (65536, 1, "f16", False)),  # tier 1
        (PlanRequest("m"), compute_budget(HostMemory(20 * G)), (69632, 1, "f16", False)),
    ],
)
def test_gemma_kv_trade_edges(
    request_: PlanRequest, auto: CapacityBudget, expected: tuple[int, int, str, bool]
) -> None:
    p = _plan(request_, geometry=_GEMMA, auto=auto)
    traded = "KV f16 → q8_0: f16 leaves 1 slot, q8_0 allows 2" in p.reasons
    assert (p.context_window, p.slots, p.kv_type, traded) == expected


def test_gemma_by_model_name() -> None:
    assert default_kv_type(replace(_GEMMA, architecture="llama"), "my-GEMMA-7b") == "f16"
    assert default_kv_type(replace(_GEMMA, architecture="gemma"), "x") == "f16"
    assert default_kv_type(replace(_GEMMA, architecture="llama"), "x") == "q8_0"
    assert default_kv_type(replace(_GEMMA, architecture="codegemma"), "x") == "q8_0"


# -- CB: the ledger's pure policy ----------------------------------------------------------------

_CARD = CapacityBudget(
    kind=BudgetKind.DISCRETE,
    system_ram=64 * G,
    ram_share=30 * G,
    vram=10 * G,
    budget=40 * G,
    fast=10 * G,
    concurrency_sizing=10 * G,
    ram_spillover_auto=False,
)
_RAMHOST = replace(_CARD, kind=BudgetKind.SYSTEM_RAM, vram=0, fast=40 * G, ram_spillover_auto=True)


#: The automatic budget of the card host; an explicit one whose record names no source (v1).
_AUTO = BudgetOrigin(BudgetSource.AUTOMATIC, auto=_CARD)
_SET = BudgetOrigin(BudgetSource.RECORDED)


def _state(
    *pairs: tuple[str, int], budget: int | None = None, spill: bool | None = None
) -> LedgerState:
    state = state_from(LedgerReserved(k, b, "o", 0, 0, 0, 0, True) for k, b in pairs)
    state.explicit_budget = budget
    state.spillover = spill
    return state


@pytest.mark.parametrize(
    ("budget", "spill", "expected"),
    [
        (None, None, LedgerLimits(True, 40 * G, 10 * G, False, 10 * G, _AUTO)),
        (G, None, LedgerLimits(True, G, G, False, G, _SET)),  # exactly 1 GiB is enforced
        (G - 1, None, LedgerLimits(False, G - 1, 10 * G, False, G - 1, _SET)),
        (0, None, LedgerLimits(False, 0, 10 * G, False, 0, _SET)),
        (10 * G, None, LedgerLimits(True, 10 * G, 10 * G, False, 10 * G, _SET)),
        (11 * G, None, LedgerLimits(True, 11 * G, 10 * G, False, 10 * G, _SET)),  # never raised
        (None, True, LedgerLimits(True, 40 * G, 10 * G, True, 40 * G, _AUTO)),
        (5 * G, True, LedgerLimits(True, 5 * G, 5 * G, True, 5 * G, _SET)),
        (None, False, LedgerLimits(True, 40 * G, 10 * G, False, 10 * G, _AUTO)),
    ],
)
def test_limits_edges(budget: int | None, spill: bool | None, expected: LedgerLimits) -> None:
    assert limits_of(_state(budget=budget, spill=spill), _CARD) == expected


def test_limits_on_a_ram_host_spill_by_default() -> None:
    assert limits_of(_state(), _RAMHOST) == LedgerLimits(
        True, 40 * G, 40 * G, True, 40 * G, BudgetOrigin(BudgetSource.AUTOMATIC, auto=_RAMHOST)
    )
    assert limits_of(_state(spill=False), _RAMHOST).ceiling == 40 * G


@pytest.mark.parametrize(
    ("committed", "wanted", "prior", "expected"),
    [
        (0, 40 * G, 0, 0),  # alone, the whole budget (beyond the 10 GiB card)
        (0, 40 * G + 1, 0, 1),
        (0, 0, 0, 0),
        (1, 1, 0, 0),  # fits with room on both counts: 0, never negative
        (1, 10 * G - 1, 0, 0),  # others + wanted exactly at the ceiling
        (1, 10 * G, 0, 1),
        (5 * G, 20 * G, 0, 5 * G),  # bigger than the card: needs everyone else out
        (5 * G, 20 * G, 5 * G, 0),  # its own prior does not count
        (5 * G, 20 * G, 6 * G, 0),  # a prior above what is committed counts as none
        (30 * G, 20 * G, 0, 30 * G),  # co-residency short is at most "everyone else"
        (35 * G, 6 * G, 0, 31 * G),  # the ceiling binds harder than the budget (1 GiB)
    ],
)
def test_shortfall_edges(committed: int, wanted: int, prior: int, expected: int) -> None:
    assert shortfall(limits_of(_state(), _CARD), committed, wanted, prior) == expected


def test_shortfall_with_spillover_is_the_budget_alone() -> None:
    limits = limits_of(_state(spill=True), _CARD)
    assert shortfall(limits, 30 * G, 10 * G) == 0
    assert shortfall(limits, 30 * G, 10 * G + 1) == 1
    assert shortfall(limits_of(_state(budget=G - 1), _CARD), 10**15, 10**15) == 0


def test_denial_reason_edges() -> None:
    card = limits_of(_state(), _CARD)
    suffix = " (co-residency ceiling — RAM spillover off)"
    assert denial_reason(card, 10 * G + 1) == (
        f"budget exhausted: would commit {10 * G + 1} against {10 * G}{suffix}"
    )
    assert (
        denial_reason(card, 10 * G) == f"budget exhausted: would commit {10 * G} against {40 * G}"
    )
    spill = limits_of(_state(spill=True), _CARD)
    assert (
        denial_reason(spill, 50 * G) == f"budget exhausted: would commit {50 * G} against {40 * G}"
    )
    lax = limits_of(_state(budget=G - 1), _CARD)
    assert denial_reason(lax, 50 * G) == f"budget exhausted: would commit {50 * G} against {G - 1}"


def test_decide_reserve_edges() -> None:
    state = _state(("a", 4 * G), ("b", 5 * G))
    zero = decide_reserve(state, _CARD, "c", 0, "o")
    assert (zero.granted, zero.shortfall, zero.reason, zero.committed_other) == (True, 0, "", 9 * G)
    fits = decide_reserve(state, _CARD, "c", G, "o")  # 10 GiB: exactly the ceiling
    assert (fits.granted, fits.prior, fits.shortfall) == (True, 0, 0)
    over = decide_reserve(state, _CARD, "c", G + 1, "o")
    assert (over.granted, over.shortfall) == (False, 1)
    assert over.reason.endswith(f"against {10 * G} (co-residency ceiling — RAM spillover off)")
    assert (over.budget, over.ceiling, over.enforced) == (40 * G, 10 * G, True)
    resize = decide_reserve(state, _CARD, "a", 5 * G, "o")
    assert (resize.granted, resize.prior, resize.committed_other) == (True, 4 * G, 5 * G)
    event = over.event()
    assert isinstance(event, LedgerDenied)
    assert (event.shortfall, event.committed_other) == (1, 9 * G)
    granted = fits.event()
    assert isinstance(granted, LedgerReserved)
    assert (granted.bytes, granted.prior, granted.ceiling) == (G, 0, 10 * G)


@pytest.mark.parametrize(
    ("engine", "size", "mmproj", "expected"),
    [
        ("llamacpp", 0, 0, 268435456),
        ("llamacpp", 10, 0, 268435467),  # 11 B + 256 MiB
        ("llamacpp", 0, 1, 671088641),  # 1.1 -> 1 B, + 256 + 384 MiB
        ("llama-cpp", 5, 0, 268435462),  # 5.5 B rounds half up to 6
        ("mlx", 50, 0, 1073741875),  # 51 B + 1 GiB
        ("ds4", 48 * G, 0, 48 * G),
        ("ds4", 48 * G + 1, 0, 48 * G),
        ("ds4", 7, 0, 7),
        ("other", 10, 0, 268435467),
        ("other", 10, 10, 268435467),  # only llama.cpp prices a projector
    ],
)
def test_fallback_resident_edges(engine: str, size: int, mmproj: int, expected: int) -> None:
    assert fallback_resident_bytes(engine, size, mmproj) == expected


def test_format_denial_edges() -> None:
    card = limits_of(_state(), _CARD)
    assert format_denial("m", 12 * G, card, 3 * G) == (
        "m needs 12.0 GiB, and hostler keeps co-resident models on the graphics card "
        "(10.0 GiB), where other models hold 3.0 GiB and are busy. Wait for them to finish, "
        "or allow RAM spillover."
    )
    alone = format_denial("m", 50 * G, card, 0)
    assert alone == (
        "m needs 50.0 GiB but 40.0 GiB is available. The budget, 40.0 GiB, is automatic "
        "(10.0 GiB of usable VRAM plus 30.0 GiB of system RAM): set a larger one with "
        "`hostler budget --set SIZE` (PUT /api/budget), a config's [budget] bytes, or "
        "HOSTLER_CAPACITY_BUDGET_GB; or unload a model."
    )
    ram48 = replace(_RAMHOST, system_ram=48 * G)
    ram = limits_of(_state(), ram48)
    assert format_denial("m", 50 * G, ram, 45 * G, below_minimum=True) == (
        "m needs 50.0 GiB but 0.0 GiB is available; other models hold 45.0 GiB; even one slot "
        "at the minimum context window does not fit. The budget, 40.0 GiB, is automatic (83% "
        "of 48.0 GiB of RAM): set a larger one with `hostler budget --set SIZE` (PUT "
        "/api/budget), a config's [budget] bytes, or HOSTLER_CAPACITY_BUDGET_GB; or unload a "
        "model."
    )
    no_ram = limits_of(_state(), replace(_RAMHOST, system_ram=0))
    assert "is automatic (a share of this host's memory)" in format_denial("m", 50 * G, no_ram, 0)
    spill = limits_of(_state(spill=True), _CARD)
    assert "graphics card" not in format_denial("m", 50 * G, spill, 3 * G)


def test_committed_snapshot_and_others_edges() -> None:
    state = _state(("llamacpp:m:0", 2 * G), ("llamacpp:m:1", 2 * G), ("ds4:m:0", 3 * G))
    state.reservations[("o", "junk")] = Held("junk", 3 * G, "o")
    assert committed_other_for(state, "llamacpp", "m") == 6 * G  # other engine + junk count
    assert committed_other_for(state, "ds4", "m") == 7 * G
    assert committed_other_for(state, "llamacpp", "x") == 10 * G
    snap = committed_snapshot(state, _CARD, ["o"])
    assert [row["key"] for row in snap["by_key"]] == [
        "ds4:m:0",
        "junk",
        "llamacpp:m:0",
        "llamacpp:m:1",
    ]
    assert snap["by_key"][0]["owner_alive"] is True
    assert committed_snapshot(state, _CARD, [])["by_key"][0]["owner_alive"] is False
    assert "owner_alive" not in committed_snapshot(state, _CARD)["by_key"][0]
    assert (snap["committed"], snap["overridden"], snap["enforced"]) == (10 * G, False, True)
    assert committed_snapshot(_state(budget=0), _CARD)["overridden"] is True
    assert committed_snapshot(_state(), replace(_CARD, overridden=True))["overridden"] is True
    assert committed_snapshot(_state(spill=True), _CARD)["ram_spillover"] == {
        "allowed": True,
        "auto": False,
        "overridden": True,
        "co_residency_bytes": 40 * G,
    }


def test_format_denial_percent_rounds_half_up() -> None:
    ram = limits_of(_state(), _RAMHOST)  # 40 of 64 GiB: 62.5 %
    assert "(63% of 64.0 GiB of RAM)" in format_denial("m", 50 * G, ram, 0)


def test_plan_operator_floor_reason_only_when_positive() -> None:
    assert _plan(PlanRequest("m", min_context=0)).reasons[0] == (
        "window: 65536 requested, 65536 minimum (host floor 65536, native 131072)"
    )
    assert _plan(PlanRequest("m", min_context=1)).reasons[0] == (
        "window: 65536 requested, 1 minimum (host floor 1, set by the operator, native 131072)"
    )


def test_gemma_keeps_f16_when_f16_already_gives_two_slots() -> None:
    p = _plan(geometry=_GEMMA, auto=compute_budget(HostMemory(40 * G)))  # tier 3, f16 ceiling 2
    assert (p.kv_type, p.slots, p.context_window) == ("f16", 2, 73728)
    assert p.reasons[1] == "slots: 2 (tier 3, ceiling 2)"


def test_plan_live_ram_by_the_byte() -> None:
    # 2 GiB OS reserve + weights + 10 x 5 MiB, less one byte: nine 1024-token steps, not ten
    free = 2 * G + _WEIGHTS + 10 * 5242880 - 1
    request = PlanRequest("m", slots=1, kv_type="f16", min_context=1024)
    assert _plan(request, free_ram=free).context_window == 9216
    assert _plan(request, free_ram=free + 1).context_window == 10240


def test_plan_ladder_prices_the_windowed_fixed_block_per_slot() -> None:
    windowed = replace(_GEO, sliding_window=1024, swa_pattern=(True, False, True, False))
    p = _plan(
        PlanRequest("m", ctx=131072, ctx_is_model_override=True, kv_type="f16", slots=2),
        geometry=windowed,
        others=int(17.43 * G),
    )
    assert p.kv == KvLinear(6291456.0, 2048.0)  # 2 SWA layers x 2 x 256 x 2 B x 3072 cells
    assert (p.admitted, p.context_window, p.slots) == (True, 84992, 2)
    assert (p.planned_bytes, p.reserved_bytes) == (1629906534, 1810261606)


def test_format_denial_one_byte_edges() -> None:
    card = limits_of(_state(), _CARD)
    assert "graphics card (10.0 GiB), where other models hold 0.0 GiB" in format_denial(
        "m", 12 * G, card, 1
    )
    ram = limits_of(_state(), _RAMHOST)
    assert "; other models hold 0.0 GiB." in format_denial("m", 50 * G, ram, 1)
    one_byte = limits_of(_state(), replace(_RAMHOST, system_ram=1))
    assert "(4294967296000% of 0.0 GiB of RAM)" in format_denial("m", 50 * G, one_byte, 0)


def test_state_from_starts_at_version_zero() -> None:
    assert state_from([]).version == 0
    assert state_from([], 7).version == 7


def test_budget_keeps_the_observed_ram_and_zero_stays_zero() -> None:
    assert compute_budget(HostMemory(0)).system_ram == 0
    assert compute_budget(HostMemory(-5)).system_ram == 0
    assert compute_budget(HostMemory(1)).system_ram == 1
    assert compute_budget(HostMemory(0)).budget == 0


def test_clamp_with_a_zero_floor_can_say_nothing_fits() -> None:
    assert _clamp(budget=2 * G, floor=0) == (0, True)


def test_head_width_is_a_whole_division() -> None:
    odd = replace(_BASE, embedding_length=1000, head_count=3)  # 333 per head, not 333.3
    assert full_attention_kv(odd, 1, "f16") == 10656  # 4 x 2 x (333 + 333) x 2
    assert exact_linearization(odd, "f16") == KvLinear(0.0, 10656.0)


def test_hybrid_prices_the_first_layers_kv_heads() -> None:
    per_layer = replace(_HYBRID, head_count_kv=(2, 2, 2, 2, 2, 2, 2, 4))
    assert hybrid_linearization(per_layer, "f16") == KvLinear(1440.0, 2048.0)
