"""Capacity: the host's budget, the ledger's rules, the planner, and the footprint estimator.

Everything here is pure (budget, ledger policy, KV, slots, context, plan, estimate, learning,
victims): it takes observations and returns decisions. :mod:`hostler.capacity.gguf_header`
reads a bounded header from a file it is handed. The drivers that execute these rules (the
host-wide ledger, launch measurement) live in :mod:`hostler.drivers`.

Every public name is imported on first use: :func:`read_geometry`'s GGUF reader loads numpy,
the ledger's rules the event classes (msgspec), and most importers of a module of this package
(the config's key parser, the store, the CLI's option types) need none of them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hostler.capacity.budget import BudgetKind, CapacityBudget, HostMemory, compute_budget
    from hostler.capacity.estimate import LlamaFootprint, estimate_llama
    from hostler.capacity.geometry import ModelGeometry
    from hostler.capacity.gguf_header import read_geometry
    from hostler.capacity.keys import EngineKey, make_key, parse_key
    from hostler.capacity.learning import Calibration, FootprintMeasured
    from hostler.capacity.ledger import LedgerLimits, LedgerState, ReserveDecision, decide_reserve
    from hostler.capacity.plan import LaunchPlan, PlanRequest, plan_llama

#: Every public name and its module, imported on first use (PEP 562).
_LAZY = {
    "BudgetKind": "hostler.capacity.budget",
    "Calibration": "hostler.capacity.learning",
    "CapacityBudget": "hostler.capacity.budget",
    "EngineKey": "hostler.capacity.keys",
    "FootprintMeasured": "hostler.capacity.learning",
    "HostMemory": "hostler.capacity.budget",
    "LaunchPlan": "hostler.capacity.plan",
    "LedgerLimits": "hostler.capacity.ledger",
    "LedgerState": "hostler.capacity.ledger",
    "LlamaFootprint": "hostler.capacity.estimate",
    "ModelGeometry": "hostler.capacity.geometry",
    "PlanRequest": "hostler.capacity.plan",
    "ReserveDecision": "hostler.capacity.ledger",
    "compute_budget": "hostler.capacity.budget",
    "decide_reserve": "hostler.capacity.ledger",
    "estimate_llama": "hostler.capacity.estimate",
    "make_key": "hostler.capacity.keys",
    "parse_key": "hostler.capacity.keys",
    "plan_llama": "hostler.capacity.plan",
    "read_geometry": "hostler.capacity.gguf_header",
}

__all__ = [
    "BudgetKind",
    "Calibration",
    "CapacityBudget",
    "EngineKey",
    "FootprintMeasured",
    "HostMemory",
    "LaunchPlan",
    "LedgerLimits",
    "LedgerState",
    "LlamaFootprint",
    "ModelGeometry",
    "PlanRequest",
    "ReserveDecision",
    "compute_budget",
    "decide_reserve",
    "estimate_llama",
    "make_key",
    "parse_key",
    "plan_llama",
    "read_geometry",
]


def __getattr__(name: str) -> Any:
    """A public name, its module imported when the name is first asked for."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
