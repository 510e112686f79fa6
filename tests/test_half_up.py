"""Half-up rounding wherever a rule rounds (62.5 % reads 63 %, 1.25 GiB reads 1.3 GiB)."""

from __future__ import annotations

import math

import pytest

from hostler.capacity.budget import BudgetKind, CapacityBudget
from hostler.capacity.context import clamp_ctx_for_memory
from hostler.capacity.kv import KvLinear, heuristic_per_slot_kv
from hostler.capacity.slots import slot_ceiling
from hostler.capacity.units import format_half_up, round_half_up
from hostler.cli.capacity import _describe_host, _gib
from hostler.probes.device import DeviceSampled
from hostler_llamacpp.logs import parse_buffer_sizes


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, 0),
        (0.5, 1),
        (1.5, 2),
        (2.5, 3),  # round() says 2
        (62.5, 63),  # round() says 62
        (2.4999999999999996, 2),  # the float just below 2.5 is not a tie
        (0.49999999999999994, 0),  # float(x + 0.5) would say 1
        (-0.5, 0),  # ties go towards +infinity, like the reference's Math.round
        (-2.5, -2),
        (-2.5000000000000004, -3),
        (-2.6, -3),
        (7, 7),
        (-7, -7),
        (2**60 + 1, 2**60 + 1),  # ints stay exact beyond float precision
        (1e20, 100000000000000000000),
    ],
)
def test_round_half_up(value: float, expected: int) -> None:
    assert round_half_up(value) == expected


@pytest.mark.parametrize(
    ("value", "per", "expected"),
    [
        (500, 8, 63),  # 62.5 %
        (100 * 5, 8, 63),
        (100 * 3, 8, 38),  # 37.5
        (100 * 1, 8, 13),  # 12.5
        (100 * 7, 16, 44),  # 43.75
        (1, 3, 0),
        (2, 3, 1),
        (-5, 2, -2),  # -2.5
        (5, -2, -2),  # the sign of the divisor is honoured
        (-5, -2, 3),
        (0.5, 0.25, 2),
    ],
)
def test_round_half_up_of_a_ratio_is_exact(value: float, per: float, expected: int) -> None:
    assert round_half_up(value, per) == expected


def test_round_half_up_refuses_what_round_refuses() -> None:
    with pytest.raises(ZeroDivisionError):
        round_half_up(1, 0)
    with pytest.raises(OverflowError):
        round_half_up(math.inf)
    with pytest.raises(ValueError, match="NaN"):
        round_half_up(math.nan)


@pytest.mark.parametrize(
    ("value", "places", "per", "expected"),
    [
        (1.25, 1, 1, "1.3"),  # f"{1.25:.1f}" says 1.2
        (0.125, 2, 1, "0.13"),  # f"{0.125:.2f}" says 0.12
        (5 * 2**30, 1, 4 * 2**30, "1.3"),
        (2.5, 0, 1, "3"),
        (0, 1, 1, "0.0"),
        (-0.04, 1, 1, "0.0"),  # no "-0.0"
        (-1.25, 1, 1, "-1.2"),
        (-1.26, 1, 1, "-1.3"),
        (1.05, 1, 1, "1.1"),  # the stored 1.05 is just above the tie
        (0.15, 1, 1, "0.1"),  # the stored 0.15 is just below the tie
        (1023, 1, 1024, "1.0"),
        (12.3456, 2, 1, "12.35"),
        (7, 3, 1, "7.000"),
    ],
)
def test_format_half_up(value: float, places: int, per: float, expected: str) -> None:
    assert format_half_up(value, places, per=per) == expected


def test_format_half_up_refuses_negative_places() -> None:
    with pytest.raises(ValueError, match="places"):
        format_half_up(1.0, -1)


def test_cli_figures_round_half_up() -> None:
    gib = 1024**3
    assert _gib(5 * gib // 4) == "1.3 GiB"  # 1.25 GiB
    assert _gib(9 * gib // 4) == "2.3 GiB"  # 2.25 GiB: f"{2.25:.1f}" says 2.2
    assert _gib(gib + gib // 20) == "1.0 GiB"  # 1.0499... GiB is no tie
    assert _gib(3 * 2**20 // 4 + 2**20) == "1.8 MiB"  # 1.75 MiB
    assert _gib(2**20 // 4) == "0.3 MiB"  # 0.25 MiB
    assert _gib(gib) == "1.0 GiB"
    assert _gib(gib - 1) == "1024.0 MiB"


def _sample(ram: int) -> DeviceSampled:
    return DeviceSampled(
        at=0.0,
        system_ram=ram,
        free_ram=ram // 2,
        apple_silicon=False,
        gpus=[],
        gpu_note="",
        budget_override_gib=None,
    )


@pytest.mark.parametrize(
    ("budget", "percent"), [(5, "63%"), (3, "38%"), (1, "13%"), (4, "50%"), (0, "0%")]
)
def test_budget_percent_of_ram_rounds_half_up(budget: int, percent: str) -> None:
    gib = 1024**3
    ram = 8 * gib
    share = budget * gib
    lines = _describe_host(
        _sample(ram),
        CapacityBudget(
            kind=BudgetKind.SYSTEM_RAM,
            system_ram=ram,
            ram_share=share,
            vram=0,
            budget=share,
            fast=share,
            concurrency_sizing=share,
            ram_spillover_auto=True,
            overridden=True,
        ),
    )
    assert f"({percent} of RAM; set by HOSTLER_CAPACITY_BUDGET_GB)" in lines[1]


def test_kv_line_rounds_half_up() -> None:
    assert KvLinear(0.5, 0.0).at(0) == 1
    assert KvLinear(2.0, 0.25).at(2) == 3  # 2.5
    assert KvLinear(0.0, 1.5).at(1) == 2
    assert KvLinear(0.0, 2.5).at(1) == 3
    assert KvLinear(0.0, 0.25).at(1) == 0


def test_heuristic_kv_rounds_half_up() -> None:
    assert heuristic_per_slot_kv(0, 1, "f16") == 40960  # the 40 KiB/token floor
    assert heuristic_per_slot_kv(0, 1, "q4_0") == 12288
    # 8,192,100,000 B of weights x 5e-6 = 40960.5 B/token: a tie, up (round() says 40960)
    assert heuristic_per_slot_kv(8_192_100_000, 1, "f16") == 40961


def test_slot_ceiling_tie_rounds_up_not_to_even() -> None:
    # exact f16 15 B x q4 0.30 = 4.5 -> 5 B per slot (round() says 4); the engine "x" is
    # priced at 256 MiB of weights, so 50 B remain and 80% of them (40 B) hold 8 slots, not 10.
    budget = 256 * 2**20 + 50
    ceiling = slot_ceiling(
        engine="x",
        ctx=1,
        weights_bytes=0,
        budget=budget,
        committed_other=0,
        cache_type="q4_0",
        exact_f16_per_slot=15,
        sizing_budget=1024**3,
    )
    assert ceiling == 8


def test_clamp_reason_figures_round_half_up() -> None:
    gib = 1024**3
    clamp = clamp_ctx_for_memory(
        requested=65536,
        slots=1,
        kv_per_token=2.5,
        weights_resident=5 * gib // 4,  # 1.25 GiB
        budget=3 * gib,
        committed_other=gib // 4,  # leaves 2.75 GiB
        floor=1,
    )
    assert not clamp.clamped  # 2.5 B/token: plenty
    clamp = clamp_ctx_for_memory(
        requested=10**9,
        slots=1,
        kv_per_token=2.5,
        weights_resident=5 * gib // 4,
        budget=3 * gib,
        committed_other=gib // 4,
        floor=1,
    )
    assert clamp.clamped
    assert "at 3 B/token beside 1.3 GiB of weights fill 80% of the 2.8 GiB left" in clamp.reason


def test_buffer_sizes_round_half_up_to_bytes() -> None:
    # 2**-21 MiB is half a byte; 5 x 2**-21 MiB is 2.5 B (round() says 0 and 2)
    text = (
        "llama_kv_cache:        CPU KV buffer size =     0.000000476837158203125 MiB\n"
        "llama_context:        CPU compute buffer size =  0.000002384185791015625 MiB\n"
        "load_tensors:   CPU_Mapped model buffer size =  1.5 MiB\n"
    )
    sizes = parse_buffer_sizes(text)
    assert sizes.kv == 1
    assert sizes.compute == 3
    assert sizes.model == 1572864
