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
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, TypeVar

import anyio

from hostler.clock import ClockLike, as_clock
from hostler.events.base import Event
from hostler.events.cache import CacheBudgetSet, CacheEvicted, CacheRestored, CacheSaved
from hostler.machines.saved_files import SavedFiles
from hostler.plugin import CacheAdapter, SessionCache, SessionPrepared
from hostler.policies.cache import (
    DEFAULT_BUDGET,
    ENTRY_BYTES_PER_TOKEN,
    POLICY_NAME,
    POLICY_VERSION,
    RECONCILE_INTERVAL,
    CacheEntry,
    Priority,
    Tally,
    bytes_per_token,
    held_entry,
    plan_eviction,
    reconcile,
    record_outcome,
    retired_entry,
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
        total_bytes: What the entries count against the budget: a held session what its file
            will be (its tokens at the measured cost of one), a saved one its file (CC14).
        budget: The engine's budget.
        entries: How many sessions have an entry.
        hits: Turns that reused a cache.
        misses: Turns that did not.
        hit_rate: Hits over the last 50 turns (0.0 before any).
        sources: Turns per source (memory, disk, prefix, fresh).
        groups: Per group: ``(hits, misses)``.
        sessions: The sessions with an entry, most recently used first.
        files: CC14: how many sessions have a saved file on disk.
        file_bytes: Their files' sizes, as written.
        bytes_per_token: One token's cost, as the engine's last save measured it (CC4's
            estimate before one).
        running: Whether the engine runs (False: only its saved files are left).
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
    files: int = 0
    file_bytes: int = 0
    bytes_per_token: int = ENTRY_BYTES_PER_TOKEN
    running: bool = True


@dataclass(frozen=True, slots=True)
class TurnUsage:
    """What an engine said one turn read: the whole prompt, and how much of it came cached."""

    prompt_tokens: int
    cached_tokens: int | None = None


@dataclass(slots=True)
class _Engine:
    adapter: CacheAdapter | None  # None: files restored from the log, no launch since
    entries: dict[str, CacheEntry] = field(default_factory=dict)
    tally: Tally = field(default_factory=Tally)
    running: bool = True


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
        self._per_token: dict[str, int] = {}  # CC14: measured by each engine's saves

    # -- registration -------------------------------------------------------------------

    def register(self, key: str, adapter: CacheAdapter) -> None:
        """CC2: ``adapter`` serves ``key`` from now on; its entries and outcomes start clean.

        The budget is not reset: one set for ``key`` before (even before any registration,
        or before an earlier unregistration, or restored from the log) applies from the start.
        CC14: the sessions' saved files stay counted (a file outlives its engine); check them
        with :meth:`verify_files`.
        """
        known = self._engines.get(key)
        files = {} if known is None else _files_of(known.entries)
        self._engines[key] = _Engine(adapter, files)

    def unregister(self, key: str) -> None:
        """Forget ``key``'s entries and outcomes (its engine stopped); its budget is kept."""
        self._engines.pop(key, None)

    def adapter(self, key: str) -> CacheAdapter | None:
        """The adapter registered for ``key``, if any."""
        engine = self._engines.get(key)
        return None if engine is None else engine.adapter

    # -- saved files (CC14) ----------------------------------------------------------------

    def restore_files(self, folded: dict[str, SavedFiles]) -> None:
        """CC14 across a restart: the files the log says each engine left on disk count again.

        A key already known here keeps what it has. They are checked against the disk, and
        enforced, when their engine registers.
        """
        for key, files in folded.items():
            if files.per_token is not None:
                self._per_token.setdefault(key, files.per_token)
            if key not in self._engines and files.files:
                self._engines[key] = _Engine(None, dict(files.files), running=False)

    async def verify_files(self, key: str) -> None:
        """CC14: the files counted for ``key`` that its engine can no longer restore go.

        The registered adapter says which files exist and were made by its model file and
        build (deleting the others); those it leaves out are dropped from the map and
        recorded (``cache.evicted``, reason ``invalidated``). Then the budget is enforced.
        """
        engine = self._engines.get(key)
        if engine is None or not isinstance(engine.adapter, SessionCache):
            return
        ids = sorted(s for s, e in engine.entries.items() if e.file_bytes > 0)
        if ids:
            call = partial(engine.adapter.saved_sizes, ids)
            sizes = await self._call(key, "saved sizes", call)
            if sizes is not None and self._engines.get(key) is engine:
                self._check_files(key, engine, ids, sizes)
        await self._enforce(key)

    def _check_files(self, key: str, engine: _Engine, ids: list[str], sizes: object) -> None:
        if not isinstance(sizes, dict):
            return  # a plugin's answer: checked
        gone = [s for s in ids if not isinstance(sizes.get(s), int) or sizes[s] <= 0]
        for session in ids:
            entry = engine.entries.get(session)
            if entry is None:
                continue
            if session in gone:
                left = replace(entry, file_bytes=0)
                if left.held:
                    engine.entries[session] = left
                else:
                    del engine.entries[session]
            else:
                size = int(sizes[session])
                engine.entries[session] = replace(
                    entry, file_bytes=size, bytes=max(size, entry.bytes if entry.held else 0)
                )
        if gone:
            decision = {
                "policy": POLICY_NAME,
                "version": POLICY_VERSION,
                "rule": "CC14",
                "checked": ids,
                "why": "no file, or one made by another model file or engine build",
            }
            self._emit(CacheEvicted(key=key, ids=gone, reason="invalidated", decision=decision))

    async def retire(self, key: str, saves: Iterable[CacheSaved]) -> None:
        """CC14: ``key``'s engine stopped; only the files of its sessions are left.

        ``saves`` are what its stop (and its recycled slots) wrote, from the log: each
        session saved is a file of the size written; a session neither saved now nor before
        is gone with the engine's memory. Then the files are kept within the budget. An
        engine whose adapter cannot save is simply forgotten (:meth:`unregister`).
        """
        engine = self._engines.get(key)
        if engine is None:
            return
        if not isinstance(engine.adapter, SessionCache):
            self.unregister(key)
            return
        for saved in saves:
            self._saved(key, engine, saved)
        engine.entries = _files_of(engine.entries)
        engine.running = False
        await self._enforce(key)

    def _saved(self, key: str, engine: _Engine, saved: CacheSaved) -> None:
        """One session's state written to its file: the entry now has that file."""
        if saved.error or saved.bytes <= 0:
            return
        measured = bytes_per_token(saved.tokens, saved.bytes)
        if measured is not None:
            self._per_token[key] = measured
        known = engine.entries.get(saved.session)
        if known is None:
            used = saved.used_at if saved.used_at > 0 else self._clock.wall()
            known = CacheEntry(saved.session, saved.tokens, saved.bytes, used, held=False)
        entry = replace(known, file_bytes=saved.bytes)
        if entry.held:
            entry = held_entry(entry, self.per_token(key))
        else:
            entry = replace(entry, bytes=saved.bytes)
        engine.entries[saved.session] = entry

    def per_token(self, key: str) -> int:
        """CC14: one token's cost on ``key``: what its saves measured, else CC4's estimate."""
        return self._per_token.get(key, ENTRY_BYTES_PER_TOKEN)

    async def prepare(self, key: str, session_id: str) -> SessionPrepared | None:
        """CC13/L16: ready ``key``'s engine for the session's turn (None: no cache registered).

        An adapter that saves sessions (:class:`~hostler.plugin.SessionCache`) binds the
        session and restores it from its file when the engine does not hold it, within the
        adapter timeout; the restore (``cache.restored``) and the save of a session whose slot
        it took (``cache.saved``) are recorded. Any other adapter gives its request fields. A
        failing or hung adapter gives a cold turn (``fresh``, its request fields if any).
        """
        engine = self._engines.get(key)
        if engine is None or not engine.running:
            return None
        adapter = engine.adapter
        if not isinstance(adapter, SessionCache):
            return SessionPrepared("fresh", self.request_extras(key, session_id))
        prepared = await self._call(key, "prepare", partial(adapter.prepare, session_id))
        if not isinstance(prepared, SessionPrepared):
            return SessionPrepared("fresh", self.request_extras(key, session_id))
        if prepared.displaced is not None:
            shed = prepared.displaced
            saved = CacheSaved(
                key, shed.session_id, "slot-recycled", shed.tokens, shed.bytes,
                shed.seconds, shed.error, shed.used_at,
            )  # fmt: skip
            self._emit(saved)
            self._saved(key, engine, saved)
            displaced = engine.entries.get(shed.session_id)
            if displaced is not None:  # its slot went to this session: only its file is left
                left = retired_entry(displaced)
                if left is None:
                    del engine.entries[shed.session_id]
                else:
                    engine.entries[shed.session_id] = left
        known = engine.entries.get(session_id)
        if prepared.source == "fresh" and known is not None:  # no file, or one that failed to
            engine.entries[session_id] = replace(known, file_bytes=0)  # restore (deleted then)
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
        if engine is None or engine.adapter is None or not engine.running:
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
        if engine is None or not engine.running:
            return
        engine.tally = record_outcome(engine.tally, hit_source, was_hit, group)
        known = engine.entries.get(session_id)
        entry = CacheEntry(
            session_id=session_id,
            tokens=max(prompt_tokens, 0),
            bytes=0,
            last_used_at=self._clock.wall(),
            priority="normal" if known is None else known.priority,
            group=group if group is not None or known is None else known.group,
            file_bytes=0 if known is None else known.file_bytes,
        )
        engine.entries[session_id] = held_entry(entry, self.per_token(key))
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
            if engine.adapter is None or engine.entries.pop(session_id, None) is None:
                continue  # an engine not launched since the restart is checked at its launch
            decision = {
                "policy": POLICY_NAME,
                "version": POLICY_VERSION,
                "rule": "CC5",
                "session": session_id,
            }
            self._emit(
                CacheEvicted(key=key, ids=[session_id], reason="invalidate", decision=decision)
            )
            calls.append((key, engine.adapter, engine.running))
        for key, adapter, running in calls:
            await self._drop(key, adapter, [session_id], running=running)

    async def invalidate_engine(self, key: str) -> None:
        """CC6: clear ``key``'s entries and outcomes, and ask its engine to evict them all."""
        engine = self._engines.get(key)
        if engine is None or engine.adapter is None:
            return
        ids = sorted(engine.entries)
        engine.entries = {}
        engine.tally = Tally()
        if not ids:
            return
        decision = {"policy": POLICY_NAME, "version": POLICY_VERSION, "rule": "CC6"}
        self._emit(CacheEvicted(key=key, ids=ids, reason="clear", decision=decision))
        await self._drop(key, engine.adapter, ids, running=engine.running)

    # -- engine truth -------------------------------------------------------------------

    async def reconcile_once(self) -> None:
        """CC8: each engine's report replaces its map (priorities kept by session); enforce.

        An engine that cannot tell (None), fails or hangs keeps the map as it was. A turn
        recorded while the report was on its way is newer than the report and is kept.
        """
        for key, engine in list(self._engines.items()):
            adapter = engine.adapter
            if adapter is None or not engine.running:
                continue  # a stopped engine holds nothing in memory to report
            asked_at = self._clock.wall()
            reported = await self._call(key, "report usage", adapter.report_usage)
            if reported is None or self._engines.get(key) is not engine:
                continue  # nothing to say, or re-registered/unregistered meanwhile
            if isinstance(adapter, SessionCache):  # CC14: priced at the measured cost
                reported = [held_entry(e, self.per_token(key)) for e in reported]
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
            else:
                running = sorted(k for k, e in self._engines.items() if e.running and e.adapter)
                log.debug("prompt caches reconciled: asked %s", ", ".join(running) or "no engine")

    # -- statistics ---------------------------------------------------------------------

    def stats(self, key: str) -> CacheStats | None:
        """CC10: ``key``'s cache statistics, or None when it is not registered."""
        engine = self._engines.get(key)
        if engine is None:
            return None
        entries = sorted(engine.entries.values(), key=lambda e: (-e.last_used_at, e.session_id))
        tally = engine.tally
        files = [e.file_bytes for e in entries if e.file_bytes > 0]
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
            files=len(files),
            file_bytes=sum(files),
            bytes_per_token=self.per_token(key),
            running=engine.running,
        )

    def keys(self) -> list[str]:
        """Every engine with a cache here: registered, or with saved files left (CC14)."""
        return sorted(self._engines)

    def entries(self, key: str) -> list[CacheEntry]:
        """``key``'s entries, by session id (empty when it is not registered)."""
        engine = self._engines.get(key)
        return [] if engine is None else [engine.entries[i] for i in sorted(engine.entries)]

    # -- internals ----------------------------------------------------------------------

    async def _enforce(self, key: str) -> None:
        """CC9: evict what the plan says, from the map first, then through the adapter."""
        engine = self._engines.get(key)
        if engine is None or engine.adapter is None:
            return  # files restored from the log are enforced once their engine registers
        plan = plan_eviction(engine.entries.values(), self.budget(key))
        if not plan.ids:
            return
        for session_id in plan.ids:
            del engine.entries[session_id]
        decision = {**plan.decision, "running": engine.running}
        self._emit(CacheEvicted(key=key, ids=list(plan.ids), reason="watermark", decision=decision))
        await self._drop(key, engine.adapter, list(plan.ids), running=engine.running)

    async def _drop(
        self, key: str, adapter: CacheAdapter, ids: list[str], *, running: bool = True
    ) -> None:
        """Evict the sessions through their engine, or delete their files when it stopped.

        Shielded (within the adapter timeout): the map already says they are gone, so a
        caller cancelled meanwhile (a client's request ending) must not leave them behind.
        """
        with anyio.CancelScope(shield=True):
            if running:
                await self._call(key, "evict", partial(adapter.evict, ids))
            elif isinstance(adapter, SessionCache):
                await self._call(key, "discard", partial(adapter.discard, ids))

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
    return replace(entry, priority=priority)


def _files_of(entries: dict[str, CacheEntry]) -> dict[str, CacheEntry]:
    """CC14: the entries that outlive their engine's process: those with a file on disk."""
    kept = (retired_entry(e) for e in entries.values())
    return {e.session_id: e for e in kept if e is not None}
