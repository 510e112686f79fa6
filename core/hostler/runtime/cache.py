"""The prompt-cache controller (driver): per-engine cache entries kept within a byte budget.

Each engine that has a cache mechanism registers its :class:`~hostler.plugin.CacheAdapter`;
every turn is recorded (its prompt length prices the session's entry), the budget is enforced
after every change by the pure plan (:func:`hostler.policies.cache.plan_eviction`), and every
:data:`~hostler.policies.cache.RECONCILE_INTERVAL` seconds the engine's own report replaces
the map. Adapter calls are best effort: bounded by a timeout, their failures logged and
ignored, so a broken or hung engine never breaks the controller or the turn that called it.
The controller's own map is updated before any adapter call, so concurrent callers always see
a consistent state.

Rules (docs/rules.md): CC1–CC10, CC12.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from hostler.clock import ClockLike, as_clock
from hostler.events.base import Event
from hostler.events.cache import CacheBudgetSet, CacheEvicted, CacheRestored, CacheSaved
from hostler.plugin import CacheAdapter, SessionCache, SessionPrepared
from hostler.policies.cache import (
    DEFAULT_BUDGET,
    POLICY_NAME,
    POLICY_VERSION,
    RECONCILE_INTERVAL,
    CacheEntry,
    Priority,
    Tally,
    entry_bytes,
    plan_eviction,
    reconcile,
    record_outcome,
    turn_outcome,
)

__all__ = ["ADAPTER_TIMEOUT", "CacheController", "CacheStats", "TurnUsage"]

log = logging.getLogger(__name__)

#: Seconds an adapter call (evict, report) may take before the controller gives up on it.
ADAPTER_TIMEOUT = 10.0

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class CacheStats:
    """CC10: one engine's cache, as the operator sees it.

    Attributes:
        key: The engine key.
        total_bytes: What the entries are estimated to hold.
        budget: The engine's budget.
        entries: How many sessions have an entry.
        hits: Turns that reused a cache.
        misses: Turns that did not.
        hit_rate: Hits over the last 50 turns (0.0 before any).
        sources: Turns per source (memory, disk, prefix, fresh).
        groups: Per group: ``(hits, misses)``.
        sessions: The sessions with an entry, most recently used first.
    """

    key: str
    total_bytes: int
    budget: int
    entries: int
    hits: int
    misses: int
    hit_rate: float
    sources: dict[str, int]
    groups: dict[str, tuple[int, int]]
    sessions: list[str]


@dataclass(frozen=True, slots=True)
class TurnUsage:
    """What an engine said one turn read: the whole prompt, and how much of it came cached."""

    prompt_tokens: int
    cached_tokens: int | None = None


@dataclass(slots=True)
class _Engine:
    adapter: CacheAdapter
    entries: dict[str, CacheEntry] = field(default_factory=dict)
    tally: Tally = field(default_factory=Tally)


class CacheController:
    """CC1: every registered engine's cache entries, outcomes and budget.

    Args:
        clock: The clock: wall time for entries, sleeps for the reconcile loop, timeouts for
            adapter calls.
        default_budget: An engine's budget until one is set (CC11's
            :func:`~hostler.policies.cache.default_budget` gives a RAM-sized one).
        record: Where the decisions go (``cache.evicted``, ``cache.budget_set``), if anywhere.
        adapter_timeout: Seconds an adapter call may take.
    """

    def __init__(
        self,
        *,
        clock: ClockLike = time.time,
        default_budget: int = DEFAULT_BUDGET,
        record: Callable[[Event], None] | None = None,
        adapter_timeout: float = ADAPTER_TIMEOUT,
    ) -> None:
        self._clock = as_clock(clock)
        self._default_budget = default_budget
        self._record = record
        self._timeout = adapter_timeout
        self._engines: dict[str, _Engine] = {}
        self._budgets: dict[str, int] = {}

    # -- registration -------------------------------------------------------------------

    def register(self, key: str, adapter: CacheAdapter) -> None:
        """CC2: ``adapter`` serves ``key`` from now on; its entries and outcomes start clean.

        The budget is not reset: one set for ``key`` before (even before any registration,
        or before an earlier unregistration, or restored from the log) applies from the start.
        """
        self._engines[key] = _Engine(adapter)

    def unregister(self, key: str) -> None:
        """Forget ``key``'s entries and outcomes (its engine stopped); its budget is kept."""
        self._engines.pop(key, None)

    def adapter(self, key: str) -> CacheAdapter | None:
        """The adapter registered for ``key``, if any."""
        engine = self._engines.get(key)
        return None if engine is None else engine.adapter

    async def prepare(self, key: str, session_id: str) -> SessionPrepared | None:
        """CC13/L16: ready ``key``'s engine for the session's turn (None: no cache registered).

        An adapter that saves sessions (:class:`~hostler.plugin.SessionCache`) binds the
        session and restores it from its file when the engine does not hold it, within the
        adapter timeout; the restore (``cache.restored``) and the save of a session whose slot
        it took (``cache.saved``) are recorded. Any other adapter gives its request fields. A
        failing or hung adapter gives a cold turn (``fresh``, its request fields if any).
        """
        engine = self._engines.get(key)
        if engine is None:
            return None
        adapter = engine.adapter
        if not isinstance(adapter, SessionCache):
            return SessionPrepared("fresh", self.request_extras(key, session_id))
        prepared = await self._call(key, "prepare", partial(adapter.prepare, session_id))
        if not isinstance(prepared, SessionPrepared):
            return SessionPrepared("fresh", self.request_extras(key, session_id))
        if prepared.displaced is not None:
            shed = prepared.displaced
            self._emit(
                CacheSaved(
                    key, shed.session_id, "slot-recycled", shed.tokens, shed.bytes,
                    shed.seconds, shed.error,
                )
            )  # fmt: skip
        if prepared.source == "disk" or prepared.error:
            tokens = prepared.restored_tokens
            self._emit(CacheRestored(key, session_id, tokens, prepared.seconds, prepared.error))
        return prepared

    async def finish_turn(
        self,
        key: str,
        session_id: str,
        prepared: SessionPrepared,
        usage: TurnUsage | None,
        *,
        group: str | None = None,
    ) -> None:
        """CC4: a session's turn ended: its entry priced by what the engine read, its outcome.

        ``usage`` is the engine's own count (None when its answer told none): a turn that
        reused no token is a miss whatever was prepared.
        """
        cached = None if usage is None else usage.cached_tokens
        prompt = 0 if usage is None else usage.prompt_tokens
        source = turn_outcome(prepared.source, cached)
        await self.record_turn(key, session_id, prompt, hit_source=source, group=group)

    def request_extras(self, key: str, session_id: str) -> dict[str, Any]:
        """The adapter's request fields for the session's next turn ({} when none or failing)."""
        engine = self._engines.get(key)
        if engine is None:
            return {}
        try:
            return dict(engine.adapter.request_extras(session_id))
        except Exception:
            log.warning("cache adapter of %s failed to build request extras", key, exc_info=True)
            return {}

    # -- budget -------------------------------------------------------------------------

    def budget(self, key: str) -> int:
        """``key``'s budget: the one set, else the default."""
        return self._budgets.get(key, self._default_budget)

    def restore_budgets(self, recorded: Iterable[object]) -> dict[str, int]:
        """CC3 across a restart: the last recorded budget of each key holds again.

        ``recorded`` is the log's events in order; each :class:`CacheBudgetSet` is a budget
        set, anything else is skipped. A key this controller already has a budget for keeps
        it. Nothing is recorded (the log already holds the decisions) and nothing is enforced
        here: a registered engine's next change checks its entries against the budget (CC9).

        Returns:
            The budgets restored, by key.
        """
        last: dict[str, int] = {}
        for event in recorded:
            if isinstance(event, CacheBudgetSet) and type(event.bytes) is int:
                last[event.key] = event.bytes
        restored = {key: budget for key, budget in last.items() if key not in self._budgets}
        self._budgets.update(restored)
        return restored

    async def set_budget(self, key: str, budget: int) -> None:
        """CC3: set ``key``'s budget; a registered engine enforces it at once.

        An unregistered key remembers it for its registration (CC2).
        """
        previous = self.budget(key)
        self._budgets[key] = budget
        applied = key in self._engines
        self._emit(CacheBudgetSet(key=key, bytes=budget, previous=previous, applied=applied))
        if applied:
            await self._enforce(key)

    # -- turns and invalidation -----------------------------------------------------------

    async def record_turn(
        self,
        key: str,
        session_id: str,
        prompt_tokens: int,
        *,
        hit_source: str | None = None,
        was_hit: bool = False,
        group: str | None = None,
    ) -> None:
        """CC4: the session's turn on ``key`` used ``prompt_tokens`` of prompt; then enforce.

        The entry is re-priced and touched (its priority kept); the outcome is a hit when
        ``hit_source`` is anything but ``fresh``, else ``was_hit`` when no source is named.
        An unregistered key records nothing.

        Raises:
            ValueError: ``hit_source`` is not memory, disk, prefix or fresh.
        """
        engine = self._engines.get(key)
        if engine is None:
            return
        engine.tally = record_outcome(engine.tally, hit_source, was_hit, group)
        known = engine.entries.get(session_id)
        engine.entries[session_id] = CacheEntry(
            session_id=session_id,
            tokens=max(prompt_tokens, 0),
            bytes=entry_bytes(prompt_tokens),
            last_used_at=self._clock.wall(),
            priority="normal" if known is None else known.priority,
            group=group if group is not None or known is None else known.group,
        )
        await self._enforce(key)

    def pin(self, session_id: str, priority: Priority) -> None:
        """CC7: set the session's priority on every engine that holds it (``low`` goes last)."""
        if priority not in ("low", "normal"):
            raise ValueError(f"{priority!r} is not a cache priority: use low or normal")
        for engine in self._engines.values():
            entry = engine.entries.get(session_id)
            if entry is not None:
                engine.entries[session_id] = _with_priority(entry, priority)

    async def invalidate(self, session_id: str) -> None:
        """CC5: drop the session from every engine that holds it and ask each to evict it."""
        calls = []
        for key, engine in self._engines.items():
            if engine.entries.pop(session_id, None) is None:
                continue
            decision = {
                "policy": POLICY_NAME,
                "version": POLICY_VERSION,
                "rule": "CC5",
                "session": session_id,
            }
            self._emit(
                CacheEvicted(key=key, ids=[session_id], reason="invalidate", decision=decision)
            )
            calls.append((key, engine.adapter))
        for key, adapter in calls:
            await self._call(key, "evict", partial(adapter.evict, [session_id]))

    async def invalidate_engine(self, key: str) -> None:
        """CC6: clear ``key``'s entries and outcomes, and ask its engine to evict them all."""
        engine = self._engines.get(key)
        if engine is None:
            return
        ids = sorted(engine.entries)
        engine.entries = {}
        engine.tally = Tally()
        if not ids:
            return
        decision = {"policy": POLICY_NAME, "version": POLICY_VERSION, "rule": "CC6"}
        self._emit(CacheEvicted(key=key, ids=ids, reason="clear", decision=decision))
        await self._call(key, "evict", partial(engine.adapter.evict, ids))

    # -- engine truth -------------------------------------------------------------------

    async def reconcile_once(self) -> None:
        """CC8: each engine's report replaces its map (priorities kept by session); enforce.

        An engine that cannot tell (None), fails or hangs keeps the map as it was. A turn
        recorded while the report was on its way is newer than the report and is kept.
        """
        for key, engine in list(self._engines.items()):
            asked_at = self._clock.wall()
            reported = await self._call(key, "report usage", engine.adapter.report_usage)
            if reported is None or self._engines.get(key) is not engine:
                continue  # nothing to say, or re-registered/unregistered meanwhile
            engine.entries = reconcile(engine.entries, reported, fresh_after=asked_at)
            await self._enforce(key)

    async def run(self, interval: float = RECONCILE_INTERVAL) -> None:
        """CC8: reconcile every ``interval`` seconds until cancelled."""
        while True:
            await self._clock.sleep(interval)
            try:
                await self.reconcile_once()
            except Exception:
                log.warning("cache reconcile failed", exc_info=True)

    # -- statistics ---------------------------------------------------------------------

    def stats(self, key: str) -> CacheStats | None:
        """CC10: ``key``'s cache statistics, or None when it is not registered."""
        engine = self._engines.get(key)
        if engine is None:
            return None
        entries = sorted(engine.entries.values(), key=lambda e: (-e.last_used_at, e.session_id))
        tally = engine.tally
        return CacheStats(
            key=key,
            total_bytes=sum(e.bytes for e in entries),
            budget=self.budget(key),
            entries=len(entries),
            hits=tally.hits,
            misses=tally.misses,
            hit_rate=tally.hit_rate,
            sources=dict(tally.sources),
            groups=dict(tally.groups),
            sessions=[e.session_id for e in entries],
        )

    def entries(self, key: str) -> list[CacheEntry]:
        """``key``'s entries, by session id (empty when it is not registered)."""
        engine = self._engines.get(key)
        return [] if engine is None else [engine.entries[i] for i in sorted(engine.entries)]

    # -- internals ----------------------------------------------------------------------

    async def _enforce(self, key: str) -> None:
        """CC9: evict what the plan says, from the map first, then through the adapter."""
        engine = self._engines.get(key)
        if engine is None:
            return
        plan = plan_eviction(engine.entries.values(), self.budget(key))
        if not plan.ids:
            return
        for session_id in plan.ids:
            del engine.entries[session_id]
        self._emit(
            CacheEvicted(key=key, ids=list(plan.ids), reason="watermark", decision=plan.decision)
        )
        await self._call(key, "evict", partial(engine.adapter.evict, list(plan.ids)))

    async def _call(self, key: str, what: str, call: Callable[[], Awaitable[T]]) -> T | None:
        """Await an adapter call within the timeout; None when it failed or hung (logged)."""
        try:
            with self._clock.move_on_after(self._timeout) as scope:
                return await call()
            if scope.cancelled_caught:
                log.warning("cache adapter of %s: %s timed out after %ss", key, what, self._timeout)
        except Exception:
            log.warning("cache adapter of %s: %s failed", key, what, exc_info=True)
        return None

    def _emit(self, event: Event) -> None:
        if self._record is not None:
            self._record(event)


def _with_priority(entry: CacheEntry, priority: Priority) -> CacheEntry:
    return CacheEntry(
        entry.session_id, entry.tokens, entry.bytes, entry.last_used_at, priority, entry.group
    )
