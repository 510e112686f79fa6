"""Capacity budget (behaviour §2.3): every worked value of B9, and the rules behind them."""

from __future__ import annotations

import pytest

from hostler.capacity.budget import (
    BudgetKind,
    HostMemory,
    compute_budget,
    parse_budget_override,
)
from hostler.capacity.units import GIB
from hostler.errors import SettingError


def gib(value: float) -> int:
    return int(value * GIB)


def approx_gib(value: int) -> float:
    return round(value / GIB, 1)


@pytest.mark.parametrize(
    ("ram", "expected"),
    [(16, 9.6), (64, 38.4), (96, 76.8), (128, 96.0), (512, 96.0)],
)
def test_non_unified_system_ram_budgets(ram: int, expected: float) -> None:
    budget = compute_budget(HostMemory(system_ram=gib(ram)))
    assert budget.kind is BudgetKind.SYSTEM_RAM
    assert approx_gib(budget.budget) == expected
    assert budget.fast == budget.budget == budget.ram_share
    assert budget.vram == 0
    assert budget.ram_spillover_auto is True


@pytest.mark.parametrize(
    ("ram", "expected", "sizing"),
    [
        (8, 4.0, 4.0),
        (16, 11.2, 11.2),
        (32, 22.4, 22.4),
        (64, 48.0, 44.8),
        (96, 80.0, 76.8),
        (128, 112.0, 96.0),
        (512, 496.0, 96.0),
    ],
)
def test_unified_budgets(ram: int, expected: float, sizing: float) -> None:
    budget = compute_budget(HostMemory(system_ram=gib(ram), apple_silicon=True))
    assert budget.kind is BudgetKind.UNIFIED
    assert approx_gib(budget.budget) == expected
    assert budget.fast == budget.budget
    assert approx_gib(budget.concurrency_sizing) == sizing
    assert budget.ram_spillover_auto is True


def test_discrete_card_adds_usable_vram_to_a_ram_share() -> None:
    budget = compute_budget(HostMemory(system_ram=gib(64), vram=gib(24)))
    assert budget.kind is BudgetKind.DISCRETE
    assert approx_gib(budget.vram) == 22.8
    assert approx_gib(budget.ram_share) == 38.4
    assert approx_gib(budget.budget) == 61.2
    assert approx_gib(budget.fast) == 22.8
    assert approx_gib(budget.concurrency_sizing) == 22.8
    assert budget.ram_spillover_auto is False  # never on a discrete card, whatever its size


def test_vram_that_is_really_host_ram_makes_a_unified_host() -> None:
    budget = compute_budget(HostMemory(system_ram=gib(64), vram=gib(60)))
    assert budget.kind is BudgetKind.UNIFIED
    assert budget.vram == 0
    assert approx_gib(budget.budget) == 48.0


def test_explicit_unified_flag_wins_over_inference() -> None:
    assert (
        compute_budget(HostMemory(gib(64), vram=gib(60), unified=False)).kind is BudgetKind.DISCRETE
    )
    assert compute_budget(HostMemory(gib(64), vram=None, unified=True)).kind is BudgetKind.UNIFIED


def test_operator_override_on_a_discrete_host() -> None:
    budget = compute_budget(HostMemory(gib(64), vram=gib(24)), override_gib=40)
    assert budget.overridden
    assert budget.budget == gib(40)
    assert approx_gib(budget.fast) == 22.8  # min(card, override)
    assert approx_gib(budget.ram_share) == 17.2  # override - usable vram
    assert budget.concurrency_sizing == budget.fast
    small = compute_budget(HostMemory(gib(64), vram=gib(24)), override_gib=10)
    assert small.fast == gib(10)
    assert small.ram_share == 0


def test_operator_override_on_a_ram_host() -> None:
    budget = compute_budget(HostMemory(gib(16)), override_gib=12.5)
    assert budget.budget == budget.fast == budget.concurrency_sizing == gib(12.5)


@pytest.mark.parametrize("text", [None, "", " \t"])
def test_unset_override_is_automatic(text: str | None) -> None:
    value = parse_budget_override(text)
    assert value is None
    assert compute_budget(HostMemory(gib(16)), override_gib=value).overridden is False


@pytest.mark.parametrize("text", ["0", "-3", "abc", "nan", "inf", "0.0009", "1e-300"])
def test_bad_overrides_are_refused(text: str) -> None:
    with pytest.raises(SettingError, match="HOSTLER_CAPACITY_BUDGET_GB"):
        parse_budget_override(text)


def test_good_override_text() -> None:
    assert parse_budget_override(" 24.5 ") == 24.5


@pytest.mark.parametrize(("text", "accepted"), [("0.001", True), ("0.0009", False)])
def test_the_smallest_override_is_a_thousandth_of_a_gib(text: str, accepted: bool) -> None:
    """``1e-300`` was a 0-byte budget: below 0.001 GiB (about 1 MiB) a figure is a typo (B7)."""
    if accepted:
        budget = compute_budget(HostMemory(gib(16)), override_gib=parse_budget_override(text))
        assert budget.budget > 0
        return
    with pytest.raises(SettingError, match=r"expected a number of GiB from 0\.001 to 1048576"):
        parse_budget_override(text)
