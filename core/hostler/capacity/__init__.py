"""Capacity: the host's budget, the host-wide ledger, the planner, and the footprint estimator.

The pure core (budget, ledger policy, KV, slots, context, plan, estimate, learning, victims)
takes observations and returns decisions; :mod:`hostler.capacity.host_ledger`,
:mod:`hostler.capacity.gguf_header` and :mod:`hostler.capacity.measure` are the drivers.
"""

from __future__ import annotations

from hostler.capacity.budget import BudgetKind, CapacityBudget, HostMemory, compute_budget
from hostler.capacity.estimate import LlamaFootprint, estimate_llama
from hostler.capacity.geometry import ModelGeometry
from hostler.capacity.gguf_header import read_geometry
from hostler.capacity.host_ledger import HostLedger, OwnerIdentity, default_ledger_path
from hostler.capacity.keys import EngineKey, make_key, parse_key
from hostler.capacity.learning import Calibration, FootprintMeasured
from hostler.capacity.ledger import LedgerLimits, LedgerState, ReserveDecision, decide_reserve
from hostler.capacity.plan import LaunchPlan, PlanRequest, plan_llama

__all__ = [
    "BudgetKind",
    "Calibration",
    "CapacityBudget",
    "EngineKey",
    "FootprintMeasured",
    "HostLedger",
    "HostMemory",
    "LaunchPlan",
    "LedgerLimits",
    "LedgerState",
    "LlamaFootprint",
    "ModelGeometry",
    "OwnerIdentity",
    "PlanRequest",
    "ReserveDecision",
    "compute_budget",
    "decide_reserve",
    "default_ledger_path",
    "estimate_llama",
    "make_key",
    "parse_key",
    "plan_llama",
    "read_geometry",
]
