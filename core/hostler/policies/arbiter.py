"""GPU arbiter policy (pure): who may use the card now, when a lease is a leak, pressure.

The card is shared by workload slots (``llm``, ``image``, ``video``). In ``swap`` mode one slot
at a time holds it: a long job takes an exclusive lease, others wait for its release (or for a
re-check timer, so a leaked lease never wedges the daemon) and the other slots' engines are
evicted before the holder runs; in ``coexist`` mode nothing waits and nothing is evicted. The
arbiter (a driver, to come) asks these functions and records their answers with their inputs.
Nothing here reads a clock or a device: ``now`` and the memory readings are observations.

Rules (docs/rules.md): GA2 plain acquire, GA3 leases, GA4 stale-lease break, GA6 pressure,
GA7 policy resolution.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "POLICY_NAME",
    "POLICY_VERSION",
    "SLOTS",
    "STALE_LEASE_CEILING",
    "HeldLease",
    "LeaseVerdict",
    "Pressure",
    "acquire_waits",
    "gpu_pressure",
    "lease_verdict",
    "recheck_interval",
    "resolve_policy",
]

POLICY_NAME = "gpu-arbiter"
POLICY_VERSION = 1

#: GA1: the workload slots that share a card.
SLOTS = ("llm", "image", "video")
#: GA4: a lease held longer than this is a leak (seconds).
STALE_LEASE_CEILING = 90 * 60.0
_GIB = 1024**3
_MIB = 1024**2

Mode = Literal["swap", "coexist"]


def resolve_policy(text: str | None) -> Mode:
    """GA7: ``swap`` only when asked for; ``coexist``, ``auto`` and unset mean coexist.

    Co-residency is admitted by the host ledger at each engine start, so swapping survives only
    as an explicit operator preference.

    Raises:
        ValueError: Anything else (the caller says where the value came from).
    """
    value = (text or "auto").strip().lower()
    if value == "swap":
        return "swap"
    if value in {"coexist", "auto"}:
        return "coexist"
    raise ValueError(f"{text!r} is not a GPU policy: use swap, coexist or auto")


def recheck_interval(ceiling: float = STALE_LEASE_CEILING) -> float:
    """GA3: how often a lease waiter looks again without being woken: min(60 s, ceiling)."""
    return min(60.0, max(ceiling, 0.0))


@dataclass(frozen=True, slots=True)
class HeldLease:
    """The exclusive lease on the card: which slot holds it, since when (epoch seconds)."""

    slot: str
    since: float


def acquire_waits(slot: str, lease: HeldLease | None, mode: Mode) -> bool:
    """GA2: whether a plain acquire for ``slot`` must wait: swap, and another slot's lease."""
    return mode == "swap" and lease is not None and lease.slot != slot


@dataclass(frozen=True, slots=True)
class LeaseVerdict:
    """GA3/GA4's answer to a lease request.

    ``take``: take it (evicting the other slots' engines first); ``wait``: wait for a release
    or the re-check; ``break``: the held lease is a leak, clear it and wake every waiter, then
    ask again; ``free``: coexist mode, nothing to hold.
    """

    action: Literal["take", "wait", "break", "free"]
    decision: dict[str, Any]


def lease_verdict(
    slot: str,
    lease: HeldLease | None,
    mode: Mode,
    now: float,
    ceiling: float = STALE_LEASE_CEILING,
) -> LeaseVerdict:
    """GA3–GA4: what a request for an exclusive lease on behalf of ``slot`` does now.

    In swap mode any held lease blocks, the requester's own slot included; one held longer
    than ``ceiling`` (strictly) is broken. A clock that went back counts as no time held.
    """
    held_for = None if lease is None else max(now - lease.since, 0.0)
    action: Literal["take", "wait", "break", "free"]
    if mode == "coexist":
        action = "free"
    elif lease is None:
        action = "take"
    elif held_for is not None and held_for > ceiling:
        action = "break"
    else:
        action = "wait"
    decision: dict[str, Any] = {
        "policy": POLICY_NAME,
        "version": POLICY_VERSION,
        "rule": "GA4" if action == "break" else "GA3",
        "slot": slot,
        "mode": mode,
        "held_by": None if lease is None else lease.slot,
        "held_for": None if held_for is None else round(held_for, 3),
        "ceiling": ceiling,
    }
    return LeaseVerdict(action, decision)


@dataclass(frozen=True, slots=True)
class Pressure:
    """GA6: the cards' memory, summed, and whether it is tight."""

    total: int
    used: int
    free: int
    pressured: bool


def gpu_pressure(readings: Iterable[tuple[float, float]]) -> Pressure:
    """GA6: from ``(total MiB, used MiB)`` readings; pressured iff free ≤ max(1 GiB, 8 % of total).

    Readings with a total that is not a finite positive number, or a negative or non-finite
    used figure, are dropped; none left means no pressure.
    """
    total = used = 0.0
    for reading_total, reading_used in readings:
        if not (math.isfinite(reading_total) and reading_total > 0):
            continue
        if not (math.isfinite(reading_used) and reading_used >= 0):
            continue
        total += reading_total
        used += reading_used
    total_bytes, used_bytes = int(total * _MIB), int(used * _MIB)
    free = max(0, total_bytes - used_bytes)
    if total_bytes == 0:
        return Pressure(0, 0, 0, False)
    return Pressure(total_bytes, used_bytes, free, free <= max(_GIB, 0.08 * total_bytes))
