"""``hostler explain``'s sentences for memory: the ledger, reservations, PP4's room and drains."""

from __future__ import annotations

from hostler.capacity.victims import DEMAND_WINDOW
from hostler.events.base import Event
from hostler.events.ledger import (
    LedgerAdopted,
    LedgerBudgetSet,
    LedgerCarried,
    LedgerDenied,
    LedgerMeasured,
    LedgerReleased,
    LedgerReserved,
    LedgerSpilloverSet,
)
from hostler.events.pool import PoolDrainEnded, PoolDrainStarted, PoolRoomPlanned
from hostler.machines.reservation import (
    ReservationDenied,
    ReservationGranted,
    ReservationReleased,
    ReservationRequested,
)
from hostler.postmortem.explain_wording import candidates_of, figures_of, mapping_of, secs, size
from hostler.postmortem.findings import Finding, Target, cite
from hostler.store.log import RecordedEvent

__all__ = ["CapacitySentences"]


class CapacitySentences:
    """Admissions, refusals with their shortfall, victims with every candidate's figures, drains.

    Args:
        target: What is explained (an engine or a model: the caller asks only then).
    """

    def __init__(self, target: Target) -> None:
        self._target = target

    def on_ledger(  # noqa: PLR0911 - one sentence per ledger event type
        self, record: RecordedEvent, event: Event
    ) -> Finding | None:
        """The finding a keyed ledger event (reserved, denied, released...) makes, or None."""
        f = cite
        if isinstance(event, LedgerReserved):
            left = event.budget - event.committed_other - event.bytes
            text = (
                f"admitted: reserved {size(event.bytes)} (held {size(event.prior)} before); "
                f"others held {size(event.committed_other)} of the {size(event.budget)} "
                f"budget, leaving {size(left)}"
            )
            if not event.enforced:
                text += " (budget not enforced: an explicit budget under 1 GiB)"
            return f(
                record,
                event.key,
                "admitted",
                text,
                bytes=event.bytes,
                prior=event.prior,
                committed_other=event.committed_other,
                budget=event.budget,
                ceiling=event.ceiling,
                enforced=event.enforced,
            )
        if isinstance(event, LedgerDenied):
            return f(
                record,
                event.key,
                "refused",
                f"refused: needed {size(event.bytes)}, {size(event.shortfall)} short "
                f"({event.reason}); others held {size(event.committed_other)} of the "
                f"{size(event.budget)} budget",
                bytes=event.bytes,
                shortfall=event.shortfall,
                reason=event.reason,
                committed_other=event.committed_other,
                budget=event.budget,
                ceiling=event.ceiling,
            )
        if isinstance(event, LedgerReleased):
            return f(
                record,
                event.key,
                "released",
                f"its {size(event.bytes)} reservation went back ({event.cause})",
                bytes=event.bytes,
                cause=event.cause,
            )
        if isinstance(event, LedgerMeasured):
            return f(
                record,
                event.key,
                "measured",
                f"measured {size(event.bytes)} (admitted on an estimate of "
                f"{size(event.estimated)})",
                bytes=event.bytes,
                estimated=event.estimated,
            )
        if isinstance(event, LedgerAdopted):
            over = f", {size(event.over_budget)} over budget" if event.over_budget else ""
            return f(
                record,
                event.key,
                "adopted-memory",
                f"its running process's {size(event.bytes)} taken over by a new owner{over}",
                bytes=event.bytes,
                over_budget=event.over_budget,
            )
        if isinstance(event, LedgerCarried):
            return f(
                record,
                event.key,
                "carried",
                f"its {size(event.bytes)} reservation was carried into a replaced ledger",
                bytes=event.bytes,
            )
        return None

    def on_setting(self, record: RecordedEvent, event: Event) -> Finding:
        """The finding a budget or spillover setting makes (it concerns every engine)."""
        if isinstance(event, LedgerBudgetSet):
            value = "automatic" if event.budget is None else size(event.budget)
            return cite(
                record, "host", "budget", f"memory budget set to {value}", budget=event.budget
            )
        assert isinstance(event, LedgerSpilloverSet)  # noqa: S101 - the caller checked
        value = {None: "automatic", True: "allowed", False: "forbidden"}[event.allowed]
        return cite(record, "host", "spillover", f"RAM spillover {value}", allowed=event.allowed)

    def on_reservation(self, record: RecordedEvent, key: str, event: Event) -> Finding | None:
        """The finding an event of engine ``key``'s reservation stream makes, or None."""
        f = cite
        if isinstance(event, ReservationRequested):
            return f(record, key, "reserve", f"asked to reserve {size(event.bytes)}")
        if isinstance(event, ReservationGranted):
            return f(
                record,
                key,
                "admitted",
                f"admitted: {size(event.bytes)} granted; others held "
                f"{size(event.committed_other)} of the {size(event.budget)} budget",
                bytes=event.bytes,
                committed_other=event.committed_other,
                budget=event.budget,
            )
        if isinstance(event, ReservationDenied):
            return f(
                record,
                key,
                "refused",
                f"refused: {size(event.shortfall)} short ({event.reason}); others held "
                f"{size(event.committed_other)} of the {size(event.budget)} budget",
                shortfall=event.shortfall,
                reason=event.reason,
                committed_other=event.committed_other,
                budget=event.budget,
            )
        if isinstance(event, ReservationReleased):
            return f(record, key, "released", f"reservation released ({event.cause})")
        return None

    def on_room(self, record: RecordedEvent, event: PoolRoomPlanned) -> Finding | None:
        """PP4's plan: a refusal or the room made for the target, or the target as a victim."""
        keys = self._target.keys
        decision = mapping_of(event.decision)
        candidates = candidates_of(decision)
        policy = f"{decision.get('eviction', '?')} v{decision.get('eviction_version', '?')}"
        if event.for_key in keys:
            if not event.reachable:
                total = sum(c["bytes"] for c in candidates.values() if not c["draining"])
                return cite(
                    record,
                    event.for_key,
                    "refused",
                    f"refused: needed {size(event.wanted)}, {size(event.shortfall)} short, "
                    f"and evicting every evictable engine would free only {size(total)}",
                    wanted=event.wanted,
                    shortfall=event.shortfall,
                    evictable=total,
                    reachable=False,
                )
            gone = [*event.evict, *([event.drain] if event.drain else [])]
            return cite(
                record,
                event.for_key,
                "room",
                f"needed {size(event.wanted)}, {size(event.shortfall)} short: making room by "
                f"evicting {', '.join(event.evict) or 'nothing'}"
                + (f" and draining {event.drain}" if event.drain else "")
                + f" (PP4, policy {policy})",
                wanted=event.wanted,
                shortfall=event.shortfall,
                victims=gone,
                policy=decision.get("eviction"),
            )
        chosen = [k for k in keys if k in event.evict or k == event.drain]
        if not chosen:
            return None
        key = chosen[0]
        mine = candidates.get(key)
        others = [c for k, c in sorted(candidates.items()) if k != key]
        with_them = [k for k in event.evict if k != key]
        how = "to drain (every idle engine together was not enough)" if key == event.drain else ""
        text = (
            f"chosen as a victim {how + ' ' if how else ''}to make room for {event.for_key} "
            f"({size(event.shortfall)} short) by policy {policy}: "
            f"{figures_of(mine) if mine else 'no figures recorded'}"
        )
        if others:
            text += " vs " + "; ".join(f"{c['key']}: {figures_of(c)}" for c in others)
        if with_them:
            text += f"; evicted with {', '.join(with_them)}"
        return cite(
            record,
            key,
            "victim",
            text,
            rule="PP4",
            policy=decision.get("eviction"),
            policy_version=decision.get("eviction_version"),
            demand_window=DEMAND_WINDOW,
            shortfall=event.shortfall,
            for_key=event.for_key,
            victim=mine,
            others=others,
            evicted_with=with_them,
        )

    def on_drain(self, record: RecordedEvent, event: Event) -> Finding | None:
        """The finding a drain's start or end makes."""
        if isinstance(event, PoolDrainStarted):
            why = f" for {event.for_key}" if event.for_key else ""
            return cite(
                record,
                event.key,
                "drain",
                f"draining{why}: takes no new work, waits "
                + (
                    "for its requests to end, as long as the start waits (PP5)"
                    if event.wait is None
                    else f"up to {secs(event.wait)} for its requests to end"
                ),
                wait=event.wait,
                for_key=event.for_key,
            )
        assert isinstance(event, PoolDrainEnded)  # noqa: S101 - the caller checked
        return cite(
            record,
            event.key,
            "drained",
            f"drain ended after {secs(event.waited)}: {event.outcome}",
            waited=event.waited,
            outcome=event.outcome,
        )
