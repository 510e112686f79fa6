"""Where the budget in force was set and how to raise it there (CB13), and CB1's floor (pure).

Each source's sentence is pinned by value, as the refusals that end with it read; the record
(``ledger.budget_set`` v2 and its v1 upcast) and the fold that carry the source to them.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from hostler.capacity.budget import CapacityBudget, HostMemory, compute_budget
from hostler.capacity.ledger import LedgerState, format_denial, limits_of, state_from
from hostler.capacity.origin import (
    API_SOURCE,
    VARIABLE_SOURCE,
    BudgetOrigin,
    BudgetSource,
    config_source,
    floor_problem,
    origin_of,
    raise_hint,
)
from hostler.capacity.units import GIB, MIB
from hostler.events.ledger import LEDGER_STREAM, LedgerBudgetSet
from hostler.policies.pool import PoolEntry
from hostler.policies.room import RoomSearch, Standing, room_step
from hostler.store.log import EventStore

RAM_HOST = compute_budget(HostMemory(system_ram=64 * GIB))  # 38.4 GiB: 60 %
CARD_HOST = compute_budget(HostMemory(system_ram=64 * GIB, vram=24 * GIB))  # 22.8 + 38.4
ENV_HOST = compute_budget(HostMemory(system_ram=64 * GIB), override_gib=4)  # the variable at 4
FILE = "/etc/hostler/hostler.toml"
LIVE = "`hostler budget --set SIZE` (PUT /api/budget)"


@pytest.mark.parametrize(
    ("explicit", "source", "auto", "expected"),
    [
        (GIB, config_source(FILE), RAM_HOST, BudgetOrigin(BudgetSource.CONFIG, file=FILE)),
        (GIB, config_source(""), RAM_HOST, BudgetOrigin(BudgetSource.CONFIG)),
        (GIB, VARIABLE_SOURCE, RAM_HOST, BudgetOrigin(BudgetSource.VARIABLE)),
        (GIB, API_SOURCE, RAM_HOST, BudgetOrigin(BudgetSource.API)),
        (GIB, "", RAM_HOST, BudgetOrigin(BudgetSource.RECORDED)),
        (GIB, "something-newer", RAM_HOST, BudgetOrigin(BudgetSource.RECORDED)),
        (None, "", ENV_HOST, BudgetOrigin(BudgetSource.ENVIRONMENT)),
        (None, "", RAM_HOST, BudgetOrigin(BudgetSource.AUTOMATIC, auto=RAM_HOST)),
        (
            GIB,
            config_source(FILE),
            ENV_HOST,
            BudgetOrigin(BudgetSource.CONFIG, file=FILE, overridden=4 * GIB),
        ),
        (GIB, API_SOURCE, ENV_HOST, BudgetOrigin(BudgetSource.API, overridden=4 * GIB)),
    ],
)
def test_the_origin_is_the_explicit_budgets_recorded_source_else_the_variable_else_automatic(
    explicit: int | None, source: str, auto: CapacityBudget, expected: BudgetOrigin
) -> None:
    assert origin_of(explicit, source, auto) == expected


@pytest.mark.parametrize(
    ("origin", "expected"),
    [
        (
            BudgetOrigin(BudgetSource.CONFIG, file=FILE),
            f"The budget, 1.0 GiB, is set in {FILE} ([budget] bytes): raise it there and restart "
            f"hostler, or raise it live until the next start with {LIVE}",
        ),
        (
            BudgetOrigin(BudgetSource.CONFIG),
            "The budget, 1.0 GiB, is set in the daemon's config: raise it there and restart "
            f"hostler, or raise it live until the next start with {LIVE}",
        ),
        (
            BudgetOrigin(BudgetSource.VARIABLE),
            "The budget, 1.0 GiB, is set by HOSTLER_BUDGET_BYTES (in place of the config's "
            "[budget] bytes): raise it there and restart hostler, or raise it live until the "
            f"next start with {LIVE}",
        ),
        (
            BudgetOrigin(BudgetSource.API),
            f"The budget, 1.0 GiB, was set live with {LIVE}: raise it the same way, or go back "
            "to the automatic one with `hostler budget --set auto`",
        ),
        (
            BudgetOrigin(BudgetSource.RECORDED),
            "The budget, 1.0 GiB, was set by an operator (`hostler budget --set`, PUT /api/budget "
            f"or a config's [budget] bytes): raise it with {LIVE}, or go back to the automatic "
            "one with `hostler budget --set auto`",
        ),
        (
            BudgetOrigin(BudgetSource.ENVIRONMENT),
            "The budget, 1.0 GiB, is set by HOSTLER_CAPACITY_BUDGET_GB: raise it there and "
            f"restart hostler, or live with {LIVE}",
        ),
        (
            BudgetOrigin(BudgetSource.AUTOMATIC),
            "The budget, 1.0 GiB, is automatic (a share of this host's memory): set a larger one "
            f"with {LIVE}, a config's [budget] bytes, or HOSTLER_CAPACITY_BUDGET_GB",
        ),
        (
            BudgetOrigin(BudgetSource.CONFIG, file=FILE, overridden=4 * GIB),
            f"The budget, 1.0 GiB, is set in {FILE} ([budget] bytes): raise it there and restart "
            f"hostler, or raise it live until the next start with {LIVE}; "
            "HOSTLER_CAPACITY_BUDGET_GB (4.0 GiB) does not apply while this budget is set",
        ),
        (
            BudgetOrigin(BudgetSource.API, overridden=4 * GIB),
            f"The budget, 1.0 GiB, was set live with {LIVE}: raise it the same way, or go back "
            "to the automatic one with `hostler budget --set auto`; HOSTLER_CAPACITY_BUDGET_GB "
            "(4.0 GiB) does not apply while this budget is set",
        ),
    ],
)
def test_each_source_is_worded_with_where_to_raise_it(origin: BudgetOrigin, expected: str) -> None:
    assert raise_hint(origin, GIB) == expected


def test_the_automatic_budget_says_what_it_is_a_share_of() -> None:
    ram = origin_of(None, "", RAM_HOST)
    assert raise_hint(ram, RAM_HOST.budget).startswith(
        "The budget, 38.4 GiB, is automatic (60% of 64.0 GiB of RAM): set a larger one"
    )
    card = origin_of(None, "", CARD_HOST)
    assert raise_hint(card, CARD_HOST.budget).startswith(
        "The budget, 61.2 GiB, is automatic (22.8 GiB of usable VRAM plus 38.4 GiB of system "
        "RAM): set a larger one"
    )


def test_the_denial_and_the_room_refusal_end_with_the_same_sentence() -> None:
    """CB12 and PP4 ask :func:`raise_hint` alike: the config's 1 GiB over the variable's 4."""
    limits = limits_of(state_from([LedgerBudgetSet(GIB, config_source(FILE))]), ENV_HOST)
    hint = (
        f"The budget, 1.0 GiB, is set in {FILE} ([budget] bytes): raise it there and restart "
        f"hostler, or raise it live until the next start with {LIVE}; "
        "HOSTLER_CAPACITY_BUDGET_GB (4.0 GiB) does not apply while this budget is set"
    )
    assert format_denial("big", 1475 * MIB, limits, 0) == (
        f"big needs 1.4 GiB but 1.0 GiB is available. {hint}; or unload a model."
    )
    step = room_step(
        RoomSearch("llamacpp:big:0", 1475 * MIB, 0.0), 451 * MIB, [], 0.0, limits=limits
    )
    assert step.refusal == (
        "llamacpp:big:0: needs 1.44 GiB, 0.44 GiB more than the budget has free, and the "
        f"engines hostler may unload hold only 0.00 GiB; nothing was unloaded. {hint}; or stop "
        "what else holds memory (hostler state shows it)"
    )
    idle = PoolEntry("small", 100 * MIB, last_used_at=0.0)
    assert "hold only 0.10 GiB" in str(
        room_step(RoomSearch("k", GIB, 0.0), GIB, [Standing(idle)], 0.0, limits=limits).refusal
    )


def test_the_fold_keeps_the_source_of_the_budget_in_force_and_forgets_it_on_auto() -> None:
    state = state_from([LedgerBudgetSet(2 * GIB, config_source(FILE))])
    assert (state.explicit_budget, state.budget_source) == (2 * GIB, f"config:{FILE}")
    state.apply(LedgerBudgetSet(3 * GIB, API_SOURCE))
    assert (state.explicit_budget, state.budget_source) == (3 * GIB, "api")
    assert state.copy().budget_source == "api"
    state.apply(LedgerBudgetSet(None, API_SOURCE))
    assert (state.explicit_budget, state.budget_source) == (None, "")
    assert limits_of(state, RAM_HOST).origin == BudgetOrigin(BudgetSource.AUTOMATIC, auto=RAM_HOST)


def test_a_v1_budget_record_reads_as_set_by_an_operator_who_is_not_named(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    with EventStore.open(path) as store:
        store.append(LEDGER_STREAM, [LedgerBudgetSet(2 * GIB, API_SOURCE)], expected_version=None)
    with sqlite3.connect(path) as conn:  # the record as a hostler before v2 wrote it
        conn.execute("DROP TRIGGER events_no_update")
        conn.execute("UPDATE events SET schema_version = 1, payload = '{\"budget\": 2147483648}'")
    with EventStore.open(path) as store:
        [row] = store.read_stream(LEDGER_STREAM)
    assert (row.schema_version, row.event) == (1, LedgerBudgetSet(2 * GIB, ""))
    assert isinstance(row.event, LedgerBudgetSet)
    assert limits_of(state_from([row.event]), RAM_HOST).origin == BudgetOrigin(
        BudgetSource.RECORDED
    )


def test_a_v1_budget_under_the_floor_still_folds_recorded_and_not_enforced() -> None:
    """CB1 for old logs: 100 MiB was accepted once; it still grants everything."""
    limits = limits_of(state_from([LedgerBudgetSet(100 * MIB)]), RAM_HOST)
    assert (limits.enforced, limits.budget) == (False, 100 * MIB)


@pytest.mark.parametrize("value", [0, 1, 100 * MIB, GIB - 1])
def test_a_budget_under_one_gib_is_refused_naming_the_floor_and_why(value: int) -> None:
    assert floor_problem(value) == (
        f"{value} bytes is under 1 GiB (1073741824 bytes), the smallest budget hostler enforces "
        "(CB1: a smaller one would let every model start); give at least 1 GiB, or auto for "
        "the automatic budget"
    )


@pytest.mark.parametrize("value", [GIB, GIB + 1, 2**60])
def test_one_gib_and_more_pass_the_floor(value: int) -> None:
    assert floor_problem(value) is None


def test_limits_carry_the_origin_without_changing_any_figure() -> None:
    plain = limits_of(LedgerState(explicit_budget=8 * GIB), CARD_HOST)
    sourced = limits_of(state_from([LedgerBudgetSet(8 * GIB, API_SOURCE)]), CARD_HOST)
    assert (plain.budget, plain.fast_budget, plain.ceiling, plain.enforced) == (
        sourced.budget,
        sourced.fast_budget,
        sourced.ceiling,
        sourced.enforced,
    )
    assert (plain.origin.source, sourced.origin.source) == (
        BudgetSource.RECORDED,
        BudgetSource.API,
    )
