"""Capacity ledger policy (behaviour §2.4): shortfall, co-residency, denials, fallback sizes."""

from __future__ import annotations

import pytest

from hostler.capacity.budget import HostMemory, compute_budget
from hostler.capacity.ledger import (
    LedgerState,
    decide_reserve,
    fallback_resident_bytes,
    format_denial,
    limits_of,
    shortfall,
    state_from,
)
from hostler.capacity.units import GIB, MIB
from hostler.events.ledger import (
    LedgerBudgetSet,
    LedgerReleased,
    LedgerReserved,
    LedgerSpilloverSet,
)

RAM_HOST = compute_budget(HostMemory(system_ram=64 * GIB))  # 38.4 GiB, spillover on
CARD_HOST = compute_budget(HostMemory(system_ram=64 * GIB, vram=24 * GIB))  # 61.2 / fast 22.8


def holding(*pairs: tuple[str, int], owner: str = "d1") -> LedgerState:
    return state_from(LedgerReserved(k, b, owner, 0, 0, 0, 0, True) for k, b in pairs)


def test_grant_replaces_the_keys_prior_reservation() -> None:
    state = holding(("a", 10 * GIB))
    decision = decide_reserve(state, RAM_HOST, "a", 30 * GIB, "d1")
    assert decision.granted
    assert decision.prior == 10 * GIB
    assert decision.committed_other == 0
    state.apply(decision.event())
    assert state.committed == 30 * GIB  # replaced, not added


def test_denial_keeps_the_prior_and_says_why_in_a_stable_line() -> None:
    state = holding(("a", 20 * GIB), ("b", 10 * GIB))
    decision = decide_reserve(state, RAM_HOST, "b", 20 * GIB, "d1")
    assert not decision.granted
    budget = RAM_HOST.budget
    assert decision.shortfall == 20 * GIB + 20 * GIB - budget
    assert decision.reason == f"budget exhausted: would commit {40 * GIB} against {budget}"
    state.apply(decision.event())
    assert state.reservations[("d1", "b")].bytes == 10 * GIB


def test_co_residency_ceiling_binds_only_while_something_else_is_resident() -> None:
    # Discrete card, no spillover: ceiling = fast budget (22.8 GiB) while others are resident.
    limits = limits_of(LedgerState(), CARD_HOST)
    assert not limits.spillover_allowed
    assert limits.ceiling == CARD_HOST.fast
    # Alone, a 40 GiB MoE bigger than the card is admissible (budget 61.2).
    assert decide_reserve(LedgerState(), CARD_HOST, "moe", 40 * GIB, "d").granted
    # With 10 GiB resident, a 15 GiB model breaks the ceiling by 2.2 GiB.
    state = holding(("small", 10 * GIB))
    decision = decide_reserve(state, CARD_HOST, "big", 15 * GIB, "d")
    assert not decision.granted
    assert decision.shortfall == 10 * GIB + 15 * GIB - CARD_HOST.fast
    assert decision.reason.endswith("(co-residency ceiling — RAM spillover off)")
    assert f"against {CARD_HOST.fast}" in decision.reason
    # A model bigger than the ceiling needs the pool empty, never more than everything else.
    huge = decide_reserve(state, CARD_HOST, "huge", 40 * GIB, "d")
    assert huge.shortfall == 10 * GIB
    # Allowing spillover lifts the ceiling to the budget.
    state.apply(LedgerSpilloverSet(True))
    assert decide_reserve(state, CARD_HOST, "big", 15 * GIB, "d").granted


def test_one_combined_shortfall_for_victim_batching() -> None:
    """IN18: the shortfall covers the budget AND the co-residency rule at once."""
    limits = limits_of(LedgerState(), CARD_HOST)
    committed = 20 * GIB
    wanted = 5 * GIB
    assert shortfall(limits, committed, wanted) == committed + wanted - CARD_HOST.fast


def test_explicit_budgets() -> None:
    state = LedgerState()
    state.apply(LedgerBudgetSet(int(0.5 * GIB)))  # under 1 GiB: recorded, not enforced
    limits = limits_of(state, RAM_HOST)
    assert not limits.enforced
    assert decide_reserve(state, RAM_HOST, "x", 500 * GIB, "d").granted
    assert shortfall(limits, 0, 10**15) == 0
    state.apply(LedgerBudgetSet(0))
    assert not limits_of(state, RAM_HOST).enforced
    state.apply(LedgerBudgetSet(8 * GIB))
    limits = limits_of(state, CARD_HOST)
    assert limits.enforced
    assert limits.budget == 8 * GIB
    assert limits.fast_budget == 8 * GIB  # an explicit budget lowers the card, never raises it
    state.apply(LedgerBudgetSet(100 * GIB))
    assert limits_of(state, CARD_HOST).fast_budget == CARD_HOST.fast
    state.apply(LedgerBudgetSet(None))
    assert limits_of(state, RAM_HOST).budget == RAM_HOST.budget


def test_shrinking_the_budget_never_evicts() -> None:
    state = holding(("a", 30 * GIB))
    state.apply(LedgerBudgetSet(10 * GIB))
    assert state.committed == 30 * GIB
    assert not decide_reserve(state, RAM_HOST, "b", 1 * GIB, "d").granted
    state.apply(LedgerReleased("a", 30 * GIB, "d1", "released"))
    assert decide_reserve(state, RAM_HOST, "b", 1 * GIB, "d").granted


def test_negative_request_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        decide_reserve(LedgerState(), RAM_HOST, "a", -1, "d")


def test_fallback_resident_estimates() -> None:
    size = 4 * GIB
    assert fallback_resident_bytes("llamacpp", size) == round(size * 1.10) + 256 * MIB
    assert (
        fallback_resident_bytes("llamacpp", size, 600 * MIB)
        == round((size + 600 * MIB) * 1.10) + 640 * MIB
    )
    assert fallback_resident_bytes("mlx", size) == round(size * 1.02) + 1024 * MIB
    assert fallback_resident_bytes("ds4", 80 * GIB) == 48 * GIB
    assert fallback_resident_bytes("ds4", 10 * GIB) == 10 * GIB


def test_human_denial_text_on_a_card_host_names_the_card() -> None:
    limits = limits_of(LedgerState(), CARD_HOST)
    text = format_denial("qwen2.5-72b", 70 * GIB, limits, 0)
    assert text.startswith("qwen2.5-72b needs 70.0 GiB but 61.2 GiB is available")
    assert "22.8 GiB of usable VRAM plus 38.4 GiB of system RAM" in text
    assert str(70 * GIB) not in text  # never raw byte counts


def test_human_denial_text_on_a_ram_host_states_the_percent() -> None:
    limits = limits_of(LedgerState(), RAM_HOST)
    text = format_denial("m", 40 * GIB, limits, 10 * GIB)
    assert "needs 40.0 GiB but 28.4 GiB is available" in text
    assert "60% of 64.0 GiB of RAM" in text
    assert "other models hold 10.0 GiB" in text


def test_human_denial_text_for_the_co_residency_case() -> None:
    limits = limits_of(LedgerState(), CARD_HOST)
    text = format_denial("m", 15 * GIB, limits, 10 * GIB)
    assert "graphics card (22.8 GiB)" in text
    assert "allow RAM spillover" in text
    assert "smaller" not in text


def test_victims_are_the_least_wanted_idle_engines_covering_the_shortfall() -> None:
    from hostler.capacity.victims import Resident, choose_victims

    residents = [
        Resident("hot", 4 * GIB, busy=False, draining=False, recent_hits=9, last_used_at=100),
        Resident("cold-old", 2 * GIB, busy=False, draining=False, recent_hits=0, last_used_at=10),
        Resident("cold-new", 3 * GIB, busy=False, draining=False, recent_hits=0, last_used_at=50),
        Resident("busy", 8 * GIB, busy=True, draining=False, recent_hits=0, last_used_at=1),
        Resident("leaving", 8 * GIB, busy=False, draining=True, recent_hits=0, last_used_at=1),
    ]
    plan = choose_victims(residents, 4 * GIB)
    assert plan.victims == ("cold-old", "cold-new")
    assert plan.freed == 5 * GIB
    assert plan.covers
    everything = choose_victims(residents, 20 * GIB)
    assert everything.victims == ("cold-old", "cold-new", "hot")
    assert not everything.covers
    assert everything.busy_fallback == "busy"  # never chosen as an idle victim
    assert choose_victims(residents, 0).victims == ()
