"""The make-room loop's one step (pure), asked by the pool and by the what-if alike (PP4, PP17).

A start that needs room looks at the ledger, asks :func:`room_step` what to do, carries it
out, and asks again until it fits or is refused. The step holds the loop's state itself (a
:class:`RoomSearch`: the engines already tried, the patience deadline), so the runtime's pool
(:mod:`hostler.runtime.pool`) and the what-if's simulator (:mod:`hostler.postmortem.whatif`)
run the same sequence of decisions and differ only in how they carry them out: the pool stops
real engines and sleeps on a real clock; the simulator moves its virtual time.

The rules, in order (docs/rules.md PP4):

- it fits (no shortfall): start;
- engines that are being built, or built and not yet handed to those who asked for them, are
  *spoken for* and never victims (evicting one would hand its waiters nothing and start the
  swap over); pinned and protected engines are never victims either;
- when even every candidate could not free the shortfall but spoken-for engines stand, the
  start waits for them (until the patience deadline), then looks again;
- when nothing could make it fit, nothing is unloaded and the start is refused, with why;
- otherwise the policy's idle victims go at once and one busy engine is drained (PP5).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from hostler.capacity.ledger import LedgerLimits
from hostler.capacity.origin import raise_hint
from hostler.policies.eviction import DEFAULT_EVICTION_POLICY, EvictionPolicy
from hostler.policies.pool import MakeRoom, PoolEntry, plan_make_room

__all__ = ["RoomSearch", "RoomStep", "Standing", "room_step", "start_share"]


def start_share(wanted: int, budget: int) -> int:
    """What a start asks of the ledger: its price, or the whole budget when priced at nothing.

    An engine whose size is unknown (priced at 0) runs alone, as the seed's serial mode did.
    """
    return wanted if wanted > 0 else budget


@dataclass(frozen=True, slots=True)
class Standing:
    """An engine up beside the one being started, as the step sees it.

    Attributes:
        entry: Its pool entry (bytes held, demand, busy, draining).
        spoken: Being built, or built and not yet handed to those who asked for it.
        kept: Pinned, or a replica a reconcile is building: never a victim.
    """

    entry: PoolEntry
    spoken: bool = False
    kept: bool = False


@dataclass(frozen=True, slots=True)
class RoomSearch:
    """One start's search for room: what it has tried and how long it may wait.

    Attributes:
        key: The engine being started.
        wanted: What its start asks of the ledger (bytes, :func:`start_share`).
        patience_until: Until when it waits for spoken-for engines (the caller's clock).
        tried: Engines already evicted or drained for it: never planned twice.
    """

    key: str
    wanted: int
    patience_until: float
    tried: frozenset[str] = frozenset()


Action = Literal["fit", "wait", "refuse", "unload"]


@dataclass(frozen=True, slots=True)
class RoomStep:
    """What a start does next, and the search as it stands after it.

    Attributes:
        action: ``fit`` (start now), ``wait`` (for spoken-for engines, then ask again),
            ``refuse`` (nothing could make it fit: unload nothing) or ``unload``.
        search: The search after this step (``unload`` adds its victims to ``tried``).
        shortfall: Bytes more than the budget has free (0 or less: it fits).
        candidates: The engines the policy could choose from.
        plan: The policy's plan (None for ``fit``).
        refusal: For ``refuse``: why, in one line that names the fix.
    """

    action: Action
    search: RoomSearch
    shortfall: int
    candidates: tuple[PoolEntry, ...] = ()
    plan: MakeRoom | None = None
    refusal: str = ""

    @property
    def evict(self) -> tuple[str, ...]:
        """Idle engines to evict together (``unload`` only)."""
        return self.plan.evict if self.plan is not None and self.action == "unload" else ()

    @property
    def drain(self) -> str | None:
        """A busy engine to drain, then evict (``unload`` only)."""
        return self.plan.drain if self.plan is not None and self.action == "unload" else None

    @property
    def recorded(self) -> bool:
        """Whether this step is a decision for the log (``pool.room_planned``)."""
        return self.action in ("refuse", "unload")


def room_step(
    search: RoomSearch,
    shortfall: int,
    standing: Sequence[Standing],
    now: float,
    *,
    limits: LedgerLimits,
    policy: EvictionPolicy = DEFAULT_EVICTION_POLICY,
    patience_now: float | None = None,
) -> RoomStep:
    """PP4: the next step of ``search`` with ``shortfall`` bytes missing, at ``now``.

    ``standing`` is every engine up beside ``search.key``; those already tried are left out
    here, so a caller passes them all. ``limits`` are the ledger's (a refusal names the budget
    and where it was set). ``patience_now`` is the reading of the clock that
    ``search.patience_until`` is on, when that is not ``now``'s (a monotonic clock).
    """
    if shortfall <= 0:
        return RoomStep("fit", search, shortfall)
    looked_at = [
        s for s in standing if s.entry.key != search.key and s.entry.key not in search.tried
    ]
    spoken = any(s.spoken for s in looked_at)
    candidates = tuple(s.entry for s in looked_at if not s.kept and not s.spoken)
    plan = plan_make_room(candidates, shortfall, now, policy)
    waiting_at = now if patience_now is None else patience_now
    if not plan.reachable and spoken and waiting_at < search.patience_until:
        return RoomStep("wait", search, shortfall, candidates, plan)
    if not plan.reachable or not (plan.evict or plan.drain):
        evictable = sum(c.bytes for c in candidates if not c.draining)
        why = (
            f"{search.key}: needs {_gib(search.wanted)}, {_gib(shortfall)} more than the budget "
            f"has free, and the engines hostler may unload hold only {_gib(evictable)}; nothing "
            f"was unloaded. {raise_hint(limits.origin, limits.budget)}; or stop what else "
            "holds memory (hostler state shows it)"
        )
        return RoomStep("refuse", search, shortfall, candidates, plan, why)
    gone = set(plan.evict) | ({plan.drain} if plan.drain is not None else set())
    after = RoomSearch(search.key, search.wanted, search.patience_until, search.tried | gone)
    return RoomStep("unload", after, shortfall, candidates, plan)


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB"
