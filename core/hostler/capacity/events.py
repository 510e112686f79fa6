"""Events of the host-wide capacity ledger (stream ``ledger/host``).

They are defined in :mod:`hostler.events.ledger`, so that ``import hostler`` registers them
without importing the capacity package; this module keeps their capacity-side names.
"""

from __future__ import annotations

from hostler.events.ledger import (
    LEDGER_STREAM,
    LedgerAdopted,
    LedgerBound,
    LedgerBudgetSet,
    LedgerCarried,
    LedgerDenied,
    LedgerMeasured,
    LedgerReleased,
    LedgerReserved,
    LedgerSpilloverSet,
)

__all__ = [
    "LEDGER_STREAM",
    "LedgerAdopted",
    "LedgerBound",
    "LedgerBudgetSet",
    "LedgerCarried",
    "LedgerDenied",
    "LedgerMeasured",
    "LedgerReleased",
    "LedgerReserved",
    "LedgerSpilloverSet",
]
