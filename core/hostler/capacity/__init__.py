"""Capacity: the host's budget, the ledger's rules, the planner, and the footprint estimator.

Everything here is pure (budget, ledger policy, KV, slots, context, plan, estimate, learning,
victims): it takes observations and returns decisions. :mod:`hostler.capacity.gguf_header`
reads a bounded header from a file it is handed. The drivers that execute these rules (the
host-wide ledger, launch measurement) live in :mod:`hostler.drivers`.

:func:`read_geometry` is imported on first use: its GGUF reader loads numpy, about a second
of every CLI command's start on a busy machine, and most importers of this package (the
config's key parser, the store) never read a model file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hostler.capacity.budget import BudgetKind, CapacityBudget, HostMemory, compute_budget
from hostler.capacity.estimate import LlamaFootprint, estimate_llama
from hostler.capacity.geometry import ModelGeometry
from hostler.capacity.keys import EngineKey, make_key, parse_key
from hostler.capacity.learning import Calibration, FootprintMeasured
from hostler.capacity.ledger import LedgerLimits, LedgerState, ReserveDecision, decide_reserve
from hostler.capacity.plan import LaunchPlan, PlanRequest, plan_llama

if TYPE_CHECKING:
    from hostler.capacity.gguf_header import read_geometry

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
    """``read_geometry``, imported when first asked for (see the module's docstring)."""
    if name == "read_geometry":
        from hostler.capacity.gguf_header import read_geometry  # noqa: PLC0415 - numpy

        return read_geometry
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
