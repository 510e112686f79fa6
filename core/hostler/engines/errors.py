"""Errors of engine supervision (part of the :class:`~hostler.HostlerError` hierarchy)."""

from __future__ import annotations

from hostler.errors import HostlerError

__all__ = ["CapacityDeniedError", "EngineStartError", "RestartBudgetError"]


class EngineStartError(HostlerError):
    """An engine could not be started or did not become ready; the message says why."""

    code = "engine.start-failed"


class RestartBudgetError(HostlerError):
    """An engine crashed too often in a short time; it is locked out until a stated moment."""

    code = "engine.restart-budget"


class CapacityDeniedError(HostlerError):
    """The host's ledger refused the engine's footprint; nothing was started."""

    code = "capacity.denied"
