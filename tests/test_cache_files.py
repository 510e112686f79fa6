"""CC14: session files count against their engine's cache budget with their real size.

The controller with an in-memory saving adapter (a :class:`~hostler.plugin.SessionCache`) and
a fake clock: a held session counts what its file will be at the cost one token measured by
the engine's saves; after its engine stops only its file is left, counted at the size written;
over the budget the least recently used files are deleted down to the low watermark, through
the adapter even though its engine is gone; a new launch keeps the files it can restore and
drops (and records) the others; a restart folds them back from the log.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio
import pytest

from hostler.events.base import Event, UnknownEvent
from hostler.events.cache import CacheEvicted, CacheSaved
from hostler.machines.saved_files import fold_saved_files
from hostler.plugin import CacheEntry, SessionCache, SessionPrepared, SessionSaved
from hostler.runtime.cache import CacheController

pytestmark = pytest.mark.anyio
KEY = "llamacpp:m:0"
MB = 1_000_000


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Saving:
    """A saving adapter in memory: one slot per session, files as a dict."""

    def __init__(self, files: dict[str, int] | None = None) -> None:
        self.files: dict[str, int] = dict(files or {})
        self.discarded: list[list[str]] = []
        self.evicted: list[list[str]] = []
        self.held: list[str] = []
        self.displace: SessionSaved | None = None

    def request_extras(self, session_id: str) -> dict[str, Any]:
        return {"id_slot": 0}

    async def evict(self, ids: Sequence[str]) -> None:
        self.evicted.append(list(ids))
        for session in ids:
            self.files.pop(session, None)

    async def report_usage(self) -> list[CacheEntry] | None:
        return None

    async def prepare(self, session_id: str) -> SessionPrepared:
        displaced, self.displace = self.displace, None
        if session_id in self.files:
            return SessionPrepared("disk", {"id_slot": 0}, 10, 0.01, displaced)
        return SessionPrepared("fresh", {"id_slot": 0}, displaced=displaced)

    def held_sessions(self) -> list[str]:
        return list(self.held)

    async def save_session(self, session_id: str) -> SessionSaved:
        return SessionSaved(session_id, error="not used here")

    async def saved_sizes(self, session_ids: Sequence[str]) -> dict[str, int]:
        return {s: self.files[s] for s in session_ids if s in self.files}

    async def discard(self, session_ids: Sequence[str]) -> None:
        self.discarded.append(list(session_ids))
        for session in session_ids:
            self.files.pop(session, None)


def make() -> tuple[CacheController, Clock, list[Event]]:
    clock = Clock()
    events: list[Event] = []
    return CacheController(clock=clock, record=events.append), clock, events


def saved(session: str, tokens: int, size: int, used_at: float, error: str = "") -> CacheSaved:
    return CacheSaved(KEY, session, "evicted", tokens, size, 0.1, error, used_at)


def test_the_fake_is_a_saving_adapter() -> None:
    assert isinstance(Saving(), SessionCache)


async def test_a_held_session_counts_its_tokens_at_the_cost_the_saves_measured() -> None:
    ctl, clock, _ = make()
    ctl.register(KEY, Saving())
    await ctl.prepare(KEY, "ana")
    await ctl.record_turn(KEY, "ana", 100, hit_source="fresh")
    stats = ctl.stats(KEY)
    assert stats is not None
    assert (stats.total_bytes, stats.bytes_per_token, stats.files) == (100 * 102_400, 102_400, 0)
    # its engine stops, having saved 100 tokens in 2,300,050 bytes: 23,001 a token (rounded up)
    await ctl.retire(KEY, [saved("ana", 100, 2_300_050, 1000.0)])
    stats = ctl.stats(KEY)
    assert stats is not None and not stats.running
    assert (stats.entries, stats.files, stats.file_bytes, stats.total_bytes) == (
        1, 1, 2_300_050, 2_300_050,
    )  # fmt: skip
    assert stats.bytes_per_token == 23_001
    # the next launch: the file is there, and the held session counts at the measured cost
    ctl.register(KEY, Saving({"ana": 2_300_050}))
    await ctl.verify_files(KEY)
    clock.now = 1010.0
    await ctl.record_turn(KEY, "ana", 200, hit_source="disk")
    stats = ctl.stats(KEY)
    assert stats is not None and stats.running
    assert (stats.total_bytes, stats.file_bytes) == (200 * 23_001, 2_300_050)


async def test_a_stop_that_saved_nothing_leaves_nothing_but_older_files() -> None:
    ctl, _, _ = make()
    ctl.register(KEY, Saving())
    for session in ("ana", "bo"):
        await ctl.record_turn(KEY, session, 10, hit_source="fresh")
    await ctl.retire(KEY, [saved("bo", 0, 0, 1000.0, error="llama-server did not save it")])
    assert ctl.stats(KEY) is not None
    assert ctl.entries(KEY) == []  # neither has a file: their memory went with the engine


async def test_files_over_the_budget_are_deleted_oldest_first_to_the_low_watermark() -> None:
    ctl, _, events = make()
    adapter = Saving()
    ctl.register(KEY, adapter)
    await ctl.set_budget(KEY, 5 * MB)
    events.clear()
    await ctl.retire(
        KEY,
        [
            saved("new", 100, 2 * MB, 1003.0),
            saved("mid", 100, 2 * MB, 1002.0),
            saved("old", 100, 2 * MB, 1001.0),
        ],
    )
    # 6 MB >= 5 MB: "old" then "mid" go (4 MB is not under 0.8 x 5 MB), "new" stays
    assert adapter.discarded == [["old", "mid"]] and adapter.evicted == []
    assert [e.session_id for e in ctl.entries(KEY)] == ["new"]
    (evicted,) = events
    assert isinstance(evicted, CacheEvicted)
    assert (evicted.reason, evicted.ids) == ("watermark", ["old", "mid"])
    assert evicted.decision["running"] is False
    assert evicted.decision["total"] == 6 * MB and evicted.decision["total_after"] == 2 * MB


async def test_exactly_at_the_budget_evicts_and_just_under_keeps() -> None:
    ctl, _, _ = make()
    adapter = Saving()
    ctl.register(KEY, adapter)
    await ctl.set_budget(KEY, 4 * MB)
    await ctl.retire(KEY, [saved("a", 1, 2 * MB, 1.0), saved("b", 1, 2 * MB - 1, 2.0)])
    assert adapter.discarded == []  # 4 MB - 1 byte: under the budget
    adapter.files = {"a": 2 * MB, "b": 2 * MB - 1}
    ctl.register(KEY, adapter)
    await ctl.verify_files(KEY)
    assert adapter.discarded == []
    await ctl.retire(KEY, [saved("b", 1, 2 * MB, 2.0)])
    assert adapter.discarded == [["a"]]  # exactly 4 MB: at the high watermark


async def test_a_new_launch_drops_the_files_it_cannot_restore_and_says_so() -> None:
    ctl, _, events = make()
    ctl.register(KEY, Saving())
    await ctl.retire(KEY, [saved("ana", 10, 300, 1.0), saved("bo", 10, 400, 2.0)])
    events.clear()
    ctl.register(KEY, Saving({"bo": 410}))  # "ana" was of another model file or build
    await ctl.verify_files(KEY)
    assert [(e.session_id, e.file_bytes) for e in ctl.entries(KEY)] == [("bo", 410)]
    (gone,) = events
    assert isinstance(gone, CacheEvicted)
    assert (gone.reason, gone.ids, gone.decision["rule"]) == ("invalidated", ["ana"], "CC14")


async def test_a_recycled_slot_leaves_its_session_as_a_file() -> None:
    ctl, _, events = make()
    adapter = Saving()
    ctl.register(KEY, adapter)
    await ctl.prepare(KEY, "ana")
    await ctl.record_turn(KEY, "ana", 10, hit_source="fresh")
    adapter.displace = SessionSaved("ana", 10, 230_010, 0.1, used_at=1000.0)
    await ctl.prepare(KEY, "bo")
    (entry,) = ctl.entries(KEY)
    assert (entry.session_id, entry.held, entry.bytes, entry.file_bytes) == (
        "ana", False, 230_010, 230_010,
    )  # fmt: skip
    assert isinstance(events[0], CacheSaved) and events[0].used_at == 1000.0


@dataclass(frozen=True)
class Row:
    stream_id: str
    recorded_at: datetime
    event: Event | UnknownEvent


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


async def test_a_restart_counts_the_files_the_log_says_are_on_disk() -> None:
    rows = [
        Row(f"cache/{KEY}", at(10), saved("ana", 10, 300, 5.0)),
        Row(f"cache/{KEY}", at(11), saved("bo", 10, 400, 0.0)),  # used_at untold: recorded_at
        Row(f"cache/{KEY}", at(12), saved("cy", 10, 0, 6.0, error="llama-server did not save")),
        Row(f"cache/{KEY}", at(13), CacheEvicted(KEY, ["ana"], "watermark", {})),
        Row(f"cache/{KEY}", at(14), saved("di", 20, 900, 7.0)),
    ]
    folded = fold_saved_files(rows)
    files = folded[KEY]
    assert {s: (e.bytes, e.last_used_at, e.held) for s, e in files.files.items()} == {
        "bo": (400, 11.0, False),
        "di": (900, 7.0, False),
    }
    assert files.per_token == 45
    ctl, _, _ = make()
    ctl.restore_files(folded)
    stats = ctl.stats(KEY)
    assert stats is not None and not stats.running
    assert (stats.files, stats.file_bytes, stats.bytes_per_token) == (2, 1300, 45)
    adapter = Saving({"di": 900})
    await ctl.set_budget(KEY, 1000)  # nothing to delete with until its engine is launched
    ctl.register(KEY, adapter)
    await ctl.verify_files(KEY)  # "bo" is gone from disk; "di" alone fits
    assert [e.session_id for e in ctl.entries(KEY)] == ["di"] and adapter.discarded == []


async def test_a_decided_eviction_is_carried_out_even_when_its_caller_is_cancelled() -> None:
    """Found through ``hostler serve``: the turn's record runs at the end of the client's
    request, which may be cancelled as the answer ends; the map said the file was gone while
    it stayed on disk. The adapter call is shielded (and bounded by its timeout)."""
    ctl, _, _ = make()
    started, release = anyio.Event(), anyio.Event()

    class Slow(Saving):
        async def evict(self, ids: Sequence[str]) -> None:
            started.set()
            await release.wait()
            await super().evict(ids)

    adapter = Slow({"ana": 2 * MB})
    ctl.register(KEY, adapter)
    await ctl.set_budget(KEY, 3 * MB)
    await ctl.retire(KEY, [saved("ana", 20, 2 * MB, 1.0)])
    ctl.register(KEY, adapter)
    await ctl.verify_files(KEY)
    with anyio.fail_after(30):  # a broken controller fails here, never hangs the suite
        await _cancel_mid_evict(ctl, started, release)
    assert adapter.evicted == [["ana"]] and "ana" not in adapter.files


async def _cancel_mid_evict(
    ctl: CacheController, started: anyio.Event, release: anyio.Event
) -> None:
    async with anyio.create_task_group() as tg:
        scope = anyio.CancelScope()

        async def turn() -> None:
            with scope:
                await ctl.record_turn(
                    KEY, "bo", 20, hit_source="fresh"
                )  # 2 MB + 20 x 100 kB: over 3 MB

        tg.start_soon(turn)
        await started.wait()
        scope.cancel()
        release.set()
