"""The pure lifecycle machines: engine, GPU lease, memory reservation."""

from __future__ import annotations

from hostler.machines.base import LifecycleModel, LifecycleSpec, Step, TransitionEvent
from hostler.machines.engine import Engine, EngineState, StopReason
from hostler.machines.lease import Lease, LeaseSlot, LeaseState
from hostler.machines.reservation import Reservation, ReservationState

__all__ = [
    "LIFECYCLES",
    "Engine",
    "EngineState",
    "Lease",
    "LeaseSlot",
    "LeaseState",
    "LifecycleModel",
    "LifecycleSpec",
    "Reservation",
    "ReservationState",
    "Step",
    "StopReason",
    "TransitionEvent",
]

#: Every lifecycle model class, for replay (stream prefix → class).
LIFECYCLES: tuple[type[LifecycleModel], ...] = (Engine, Lease, Reservation)
