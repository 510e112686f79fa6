"""Where the budget in force was set, and how to change it there (pure; CB1, CB12, CB13).

A budget comes from one of: a config file's ``[budget] bytes`` (or ``HOSTLER_BUDGET_BYTES``
in its place), applied to the ledger at every start; ``hostler budget --set`` / ``PUT
/api/budget``, live; ``HOSTLER_CAPACITY_BUDGET_GB``, which replaces the automatic budget of
the process that reads it; or the automatic budget itself. An explicit budget (the first two)
wins over the variable. ``ledger.budget_set`` records which of the first two set it (its
``source``: :func:`config_source`, :data:`VARIABLE_SOURCE`, :data:`API_SOURCE`);
:func:`origin_of` tells the one in force; :func:`raise_hint` words it, for every refusal
that asks for a larger budget. :func:`floor_problem` is CB1's floor, refused where a budget
is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from hostler.capacity.budget import BudgetKind, CapacityBudget
from hostler.capacity.units import GIB, format_half_up, round_half_up

__all__ = [
    "API_SOURCE",
    "AUTOMATIC_ORIGIN",
    "BUDGET_FLOOR",
    "CONFIG_PREFIX",
    "VARIABLE_SOURCE",
    "BudgetOrigin",
    "BudgetSource",
    "config_source",
    "floor_problem",
    "origin_of",
    "raise_hint",
]

#: CB1: the smallest explicit budget that is enforced; a smaller one is refused where given.
BUDGET_FLOOR = GIB
#: ``ledger.budget_set``'s source for ``hostler budget --set`` and ``PUT /api/budget``.
API_SOURCE = "api"
#: ... for a config's ``[budget] bytes`` (followed by the file, empty when built in code).
CONFIG_PREFIX = "config:"
#: ... for ``HOSTLER_BUDGET_BYTES``, which takes the config's ``[budget] bytes``'s place.
VARIABLE_SOURCE = "env:HOSTLER_BUDGET_BYTES"
_SET_LIVE = "`hostler budget --set SIZE` (PUT /api/budget)"


class BudgetSource(StrEnum):
    """Who set the budget in force."""

    CONFIG = "config"
    """A config's ``[budget] bytes``, applied at every start."""
    VARIABLE = "variable"
    """``HOSTLER_BUDGET_BYTES``, applied at every start in the config's place."""
    API = "api"
    """``hostler budget --set`` or ``PUT /api/budget``, live."""
    RECORDED = "recorded"
    """An explicit budget whose record does not say who set it (``ledger.budget_set`` v1)."""
    ENVIRONMENT = "environment"
    """``HOSTLER_CAPACITY_BUDGET_GB``, in place of the automatic budget."""
    AUTOMATIC = "automatic"
    """A share of the host's memory (B1-B6)."""


@dataclass(frozen=True, slots=True)
class BudgetOrigin:
    """Where the budget in force was set, and what it overrides.

    Attributes:
        source: Who set it.
        file: The config file that sets it (``CONFIG``; "" for a config built in code).
        overridden: ``HOSTLER_CAPACITY_BUDGET_GB``'s budget when an explicit one wins over it.
        auto: The automatic budget (``AUTOMATIC``: what it is a share of).
    """

    source: BudgetSource
    file: str = ""
    overridden: int | None = None
    auto: CapacityBudget | None = None


#: The automatic budget, its share unknown (limits built by hand: a what-if's, a check's).
AUTOMATIC_ORIGIN = BudgetOrigin(BudgetSource.AUTOMATIC)


def config_source(file: str) -> str:
    """``ledger.budget_set``'s source for the ``[budget] bytes`` of ``file``."""
    return f"{CONFIG_PREFIX}{file}"


def origin_of(explicit: int | None, source: str, auto: CapacityBudget) -> BudgetOrigin:
    """The origin of the budget in force: the explicit one (with its recorded source) or auto.

    ``explicit`` and ``source`` are the ledger's (None: no explicit budget); ``auto`` the
    deciding process's automatic budget, which ``HOSTLER_CAPACITY_BUDGET_GB`` replaced when
    ``auto.overridden``.
    """
    if explicit is None:
        if auto.overridden:
            return BudgetOrigin(BudgetSource.ENVIRONMENT)
        return BudgetOrigin(BudgetSource.AUTOMATIC, auto=auto)
    overridden = auto.budget if auto.overridden else None
    if source.startswith(CONFIG_PREFIX):
        file = source.removeprefix(CONFIG_PREFIX)
        return BudgetOrigin(BudgetSource.CONFIG, file=file, overridden=overridden)
    kind = {API_SOURCE: BudgetSource.API, VARIABLE_SOURCE: BudgetSource.VARIABLE}.get(
        source, BudgetSource.RECORDED
    )
    return BudgetOrigin(kind, overridden=overridden)


def raise_hint(origin: BudgetOrigin, budget: int) -> str:
    """Where the ``budget`` in force comes from and how to raise it there: a sentence, no stop.

    Every refusal that asks for a larger budget ends with it (the ledger's
    :func:`~hostler.capacity.ledger.format_denial`, the pool's make-room refusal).
    """
    size = _gib(budget)
    source = origin.source
    if source is BudgetSource.CONFIG:
        where = f"{origin.file} ([budget] bytes)" if origin.file else "the daemon's config"
        text = (
            f"The budget, {size}, is set in {where}: raise it there and restart hostler, or "
            f"raise it live until the next start with {_SET_LIVE}"
        )
    elif source is BudgetSource.VARIABLE:
        text = (
            f"The budget, {size}, is set by HOSTLER_BUDGET_BYTES (in place of the config's "
            f"[budget] bytes): raise it there and restart hostler, or raise it live until the "
            f"next start with {_SET_LIVE}"
        )
    elif source is BudgetSource.API:
        text = (
            f"The budget, {size}, was set live with {_SET_LIVE}: raise it the same way, or go "
            "back to the automatic one with `hostler budget --set auto`"
        )
    elif source is BudgetSource.RECORDED:
        text = (
            f"The budget, {size}, was set by an operator (`hostler budget --set`, PUT "
            "/api/budget or a config's [budget] bytes): raise it with "
            f"{_SET_LIVE}, or go back to the automatic one with `hostler budget --set auto`"
        )
    elif source is BudgetSource.ENVIRONMENT:
        return (
            f"The budget, {size}, is set by HOSTLER_CAPACITY_BUDGET_GB: raise it there and "
            f"restart hostler, or live with {_SET_LIVE}"
        )
    else:
        return (
            f"The budget, {size}, is automatic ({_share(origin.auto, budget)}): set a larger "
            f"one with {_SET_LIVE}, a config's [budget] bytes, or HOSTLER_CAPACITY_BUDGET_GB"
        )
    if origin.overridden is not None:
        text += (
            f"; HOSTLER_CAPACITY_BUDGET_GB ({_gib(origin.overridden)}) does not apply while "
            "this budget is set"
        )
    return text


def floor_problem(value: int) -> str | None:
    """CB1: why an explicit budget of ``value`` bytes is refused (None: it is not).

    Under :data:`BUDGET_FLOOR` a budget would be recorded and not enforced (every start
    granted): refused where it is given (the config, ``PUT /api/budget``, ``hostler budget
    --set``) rather than silently ignored.
    """
    if value >= BUDGET_FLOOR:
        return None
    return (
        f"{value} bytes is under 1 GiB ({BUDGET_FLOOR} bytes), the smallest budget hostler "
        "enforces (CB1: a smaller one would let every model start); give at least 1 GiB, or "
        "auto for the automatic budget"
    )


def _gib(value: int) -> str:
    return f"{format_half_up(value, 1, per=GIB)} GiB"


def _share(auto: CapacityBudget | None, budget: int) -> str:
    if auto is None or auto.system_ram <= 0:
        return "a share of this host's memory"
    if auto.kind is BudgetKind.DISCRETE:
        return f"{_gib(auto.vram)} of usable VRAM plus {_gib(auto.ram_share)} of system RAM"
    percent = round_half_up(100 * budget, auto.system_ram)
    return f"{percent}% of {_gib(auto.system_ram)} of RAM"
