"""Prompt-cache policy (pure): what a cache entry costs, what to evict, engine truth, hit rates.

An engine keeps the prompt (KV) cache of recent sessions so that a session's next turn skips
re-reading its prompt. The controller (:mod:`hostler.runtime.cache`) tracks one entry per
session and engine, prices it from the prompt's length, and keeps the engine's entries within
a byte budget; these functions decide, the controller does the I/O and records the decisions
with their inputs. Nothing here reads a clock: ``last_used_at`` and ``now`` are observations.

Rules (docs/rules.md): CC1 entries, CC4 pricing and outcomes, CC8 reconcile, CC9 eviction,
CC10 statistics, CC11 the default budget.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

__all__ = [
    "DEFAULT_BUDGET",
    "ENTRY_BYTES_PER_TOKEN",
    "HIGH_WATERMARK",
    "HIT_WINDOW",
    "LOW_WATERMARK",
    "POLICY_NAME",
    "POLICY_VERSION",
    "RECONCILE_INTERVAL",
    "SAVE_BOUND",
    "SHUTDOWN_SAVE_BOUND",
    "SOURCES",
    "CacheEntry",
    "EvictionPlan",
    "Priority",
    "Tally",
    "bytes_per_token",
    "default_budget",
    "entry_bytes",
    "held_entry",
    "is_hit",
    "plan_eviction",
    "reconcile",
    "record_outcome",
    "retired_entry",
    "save_bound",
    "saves_before_stop",
    "turn_outcome",
]

POLICY_NAME = "prompt-cache"
POLICY_VERSION = 1

#: CC4: the estimated cache cost of one prompt token (100 KiB).
ENTRY_BYTES_PER_TOKEN = 102_400
#: CC9: enforcement starts when the entries reach this fraction of the budget...
HIGH_WATERMARK = 1.0
#: CC9: ... and evicts until they are strictly below this fraction.
LOW_WATERMARK = 0.8
#: CC8: seconds between two reconciliations with the engine's own report.
RECONCILE_INTERVAL = 5.0
#: CC10: the recent hit rate is over this many last turns.
HIT_WINDOW = 50
#: CC1: an engine's budget until one is set (4 GiB); CC11 gives a RAM-sized one.
DEFAULT_BUDGET = 4 * 1024**3
#: CC4/CC10: where a turn's prompt came from; anything but ``fresh`` is a hit.
SOURCES = ("memory", "disk", "prefix", "fresh")
#: CC13: seconds the sessions of an engine about to stop may take to be saved, all together.
SAVE_BOUND = 10.0
#: CC13: the same at a shutdown, whose SIGTERM stops every engine within seconds (DH3).
SHUTDOWN_SAVE_BOUND = 1.0

#: CC13: the stops before which an engine's sessions are saved: those of an engine that still
#: answers. A health restart's engine does not; a crash or a failed start has nothing to save.
_SAVING_STOPS = frozenset(
    {"evicted", "idle", "memory-pressure", "user", "shutdown", "unconfigured"}
)

_MIB = 1024**2
_GIB = 1024**3

Priority = Literal["low", "normal"]


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """CC1: one session's prompt cache on one engine.

    Attributes:
        session_id: The session the cache belongs to.
        tokens: Prompt tokens cached.
        bytes: Their estimated cost (:func:`entry_bytes`).
        last_used_at: When the session last used it (epoch seconds).
        priority: ``low`` entries are evicted after every ``normal`` one.
        group: An optional grouping (an agent, a user) for per-group statistics.
        file_bytes: CC14: the size of the session's saved file on disk (0: it has none).
        held: Whether the engine holds the session in memory now (False: only its file).
    """

    session_id: str
    tokens: int
    bytes: int
    last_used_at: float
    priority: Priority = "normal"
    group: str | None = None
    file_bytes: int = 0
    held: bool = True


def entry_bytes(prompt_tokens: int, per_token: int = ENTRY_BYTES_PER_TOKEN) -> int:
    """CC4: the bytes of a cache holding ``prompt_tokens`` (negative counts as 0).

    ``per_token`` is what one token costs: CC4's 100 KiB estimate until the engine's own saves
    measured it (CC14, :func:`bytes_per_token`).
    """
    return max(prompt_tokens, 0) * per_token


def bytes_per_token(tokens: int, size: int) -> int | None:
    """CC14: one token's cost measured by a save that wrote ``tokens`` in ``size`` bytes.

    Rounded up, so that a budget is never under-counted; None when the save told nothing.
    """
    if tokens <= 0 or size <= 0:
        return None
    return -(-size // tokens)


def held_entry(entry: CacheEntry, per_token: int) -> CacheEntry:
    """CC14: ``entry`` held by its engine: it counts what its file will be when it is saved.

    That is its tokens at the measured ``per_token`` cost, and never less than the file it
    already has on disk (which the next save replaces).
    """
    cost = max(entry_bytes(entry.tokens, per_token), entry.file_bytes)
    return replace(entry, bytes=cost, held=True)


def retired_entry(entry: CacheEntry) -> CacheEntry | None:
    """CC14: ``entry`` once its engine stopped: only its file is left (None when it has none)."""
    if entry.file_bytes <= 0:
        return None
    return replace(entry, bytes=entry.file_bytes, held=False)


@dataclass(frozen=True, slots=True)
class EvictionPlan:
    """CC9's answer: the sessions to evict, in order, and the decision with its inputs."""

    ids: tuple[str, ...]
    decision: dict[str, Any]


def _eviction_order(entry: CacheEntry) -> tuple[int, float, str]:
    # normal before low; oldest first; the id keeps equal times deterministic
    return (0 if entry.priority == "normal" else 1, entry.last_used_at, entry.session_id)


def plan_eviction(entries: Iterable[CacheEntry], budget: int) -> EvictionPlan:
    """CC9: which entries to evict so that the rest fits the budget.

    Nothing is evicted while the total is under ``HIGH_WATERMARK`` × budget. From that point
    (equality included) entries are evicted, normal priority before low and oldest
    ``last_used_at`` first within each, until the total is strictly under ``LOW_WATERMARK`` ×
    budget. A budget of zero or less holds nothing: every entry goes.
    """
    pool = list(entries)
    total = sum(entry.bytes for entry in pool)
    high = HIGH_WATERMARK * budget
    low = LOW_WATERMARK * budget
    triggered = total >= high
    evicted: list[str] = []
    remaining = total
    if triggered:
        for entry in sorted(pool, key=_eviction_order):
            if remaining < low:
                break
            evicted.append(entry.session_id)
            remaining -= entry.bytes
    decision: dict[str, Any] = {
        "policy": POLICY_NAME,
        "version": POLICY_VERSION,
        "rule": "CC9",
        "budget": budget,
        "total": total,
        "high": high,
        "low": low,
        "triggered": triggered,
        "entries": [
            [e.session_id, e.bytes, e.last_used_at, e.priority] for e in sorted(pool, key=_key)
        ],
        "evicted": list(evicted),
        "total_after": remaining,
    }
    return EvictionPlan(tuple(evicted), decision)


def _key(entry: CacheEntry) -> str:
    return entry.session_id


def reconcile(
    entries: Mapping[str, CacheEntry],
    reported: Iterable[CacheEntry],
    *,
    fresh_after: float | None = None,
) -> dict[str, CacheEntry]:
    """CC8: the engine's report replaces the map; priorities (and groups) survive by session.

    A reported session already in the map keeps the map's priority, its saved file (CC14),
    and its group when the report has none. With ``fresh_after`` (when the report was asked
    for), an entry the map touched strictly after it is newer than the report and is kept as
    it is. An entry the report leaves out that has a file on disk stays, as a file only.
    """
    result: dict[str, CacheEntry] = {}
    for told in reported:
        known = entries.get(told.session_id)
        if known is not None:
            told = replace(  # noqa: PLW2901
                told,
                priority=known.priority,
                group=known.group if told.group is None else told.group,
                file_bytes=known.file_bytes,
                bytes=max(told.bytes, known.file_bytes),
            )
        result[told.session_id] = told
    for session_id, entry in entries.items():
        if fresh_after is not None and entry.last_used_at > fresh_after:
            result[session_id] = entry
        elif session_id not in result:
            left = retired_entry(entry)
            if left is not None:
                result[session_id] = left
    return result


def default_budget(system_ram: int) -> int:
    """CC11: the cache budget for a machine with ``system_ram`` bytes (a threshold goes up).

    Under 16 GiB: 2048 MiB; under 32 GiB: 4096 MiB; under 64 GiB: 8192 MiB; else 16384 MiB.
    """
    if system_ram < 16 * _GIB:
        return 2048 * _MIB
    if system_ram < 32 * _GIB:
        return 4096 * _MIB
    if system_ram < 64 * _GIB:
        return 8192 * _MIB
    return 16384 * _MIB


def is_hit(hit_source: str | None, was_hit: bool = False) -> bool:
    """CC4: a named source decides (anything but ``fresh`` is a hit), else ``was_hit``.

    Raises:
        ValueError: ``hit_source`` is not one of :data:`SOURCES`.
    """
    if hit_source is None:
        return was_hit
    if hit_source not in SOURCES:
        raise ValueError(f"{hit_source!r} is not a cache source: use one of {', '.join(SOURCES)}")
    return hit_source != "fresh"


def _no_sources() -> dict[str, int]:
    return dict.fromkeys(SOURCES, 0)


@dataclass(frozen=True, slots=True)
class Tally:
    """CC10: an engine's cache outcomes.

    Attributes:
        hits: Turns that reused a cache.
        misses: Turns that did not.
        sources: Turns per source (only turns that named one).
        groups: Per group: ``[hits, misses]``.
        recent: The last :data:`HIT_WINDOW` outcomes, oldest first (True for a hit).
    """

    hits: int = 0
    misses: int = 0
    sources: Mapping[str, int] = field(default_factory=_no_sources)
    groups: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    recent: tuple[bool, ...] = ()

    @property
    def hit_rate(self) -> float:
        """The share of hits over the recent window (0.0 when nothing was recorded)."""
        if not self.recent:
            return 0.0
        return sum(self.recent) / len(self.recent)


def record_outcome(
    tally: Tally, hit_source: str | None, was_hit: bool = False, group: str | None = None
) -> Tally:
    """CC4/CC10: ``tally`` with one more turn counted (see :func:`is_hit`)."""
    hit = is_hit(hit_source, was_hit)
    sources = dict(tally.sources)
    if hit_source is not None:
        sources[hit_source] += 1
    groups = dict(tally.groups)
    if group is not None:
        hits, misses = groups.get(group, (0, 0))
        groups[group] = (hits + 1, misses) if hit else (hits, misses + 1)
    return Tally(
        hits=tally.hits + hit,
        misses=tally.misses + (not hit),
        sources=sources,
        groups=groups,
        recent=(*tally.recent, hit)[-HIT_WINDOW:],
    )


def saves_before_stop(reason: str) -> bool:
    """CC13: whether a stop for ``reason`` saves the engine's sessions first."""
    return reason in _SAVING_STOPS


def save_bound(reason: str) -> float:
    """CC13: how long (seconds) the saves before a stop for ``reason`` may take in all."""
    return SHUTDOWN_SAVE_BOUND if reason == "shutdown" else SAVE_BOUND


def turn_outcome(source: str, cached_tokens: int | None) -> str:
    """CC4: where a session's turn found its prompt.

    What was prepared (``source``), unless the engine's own count of reused tokens says none
    were reused: then ``fresh``.
    """
    if cached_tokens is not None and cached_tokens <= 0:
        return "fresh"
    return source
