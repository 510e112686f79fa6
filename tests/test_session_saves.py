"""CC13: before every stop of an engine that still answers, its sessions are saved, within a bound.

The supervisor runs on in-memory processes and HTTP in virtual time; the engine's cache adapter
is an in-memory :class:`~hostler.plugin.SessionCache` that records what it is asked and can be
slow or broken. The stop's own decision is recorded first, then the saves (``cache.saved``),
then the signal: a save never holds up a stop beyond its bound, and fails alone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from hostler.engines.supervisor import Supervisor, SupervisorPolicy
from hostler.plugin import CacheAdapter, CacheEntry, LaunchSpec, SessionPrepared, SessionSaved
from hostler.policies.cache import SAVE_BOUND, SHUTDOWN_SAVE_BOUND
from hostler.store.log import EventStore
from hostler.testing.clock import VirtualClock
from hostler.testing.fake_engine import FakeEngineAdapter
from hostler.testing.fake_process import FakeRunner, FakeTransport

pytestmark = pytest.mark.anyio

KEY = "fake:m:0"


class Sessions:
    """An engine's sessions in memory: each save takes ``save_seconds`` of the clock."""

    def __init__(self, clock: VirtualClock, held: Sequence[str], save_seconds: float = 0.2):
        self.clock = clock
        self.held = list(held)
        self.save_seconds = save_seconds
        self.asked: list[str] = []
        self.broken: set[str] = set()

    def request_extras(self, session_id: str) -> dict[str, Any]:
        return {"id_slot": 0}

    async def evict(self, ids: Sequence[str]) -> None:
        pass

    async def report_usage(self) -> list[CacheEntry] | None:
        return None

    async def prepare(self, session_id: str) -> SessionPrepared:
        return SessionPrepared("memory", {"id_slot": 0})

    def held_sessions(self) -> list[str]:
        return list(self.held)

    async def save_session(self, session_id: str) -> SessionSaved:
        self.asked.append(session_id)
        await self.clock.sleep(self.save_seconds)
        if session_id in self.broken:
            raise RuntimeError("the plugin's bug")
        return SessionSaved(session_id, 100, 2_300_000, self.save_seconds)

    async def saved_sizes(self, session_ids: Sequence[str]) -> dict[str, int]:
        return {}

    async def discard(self, session_ids: Sequence[str]) -> None:
        pass


class SessionEngine(FakeEngineAdapter):
    """The fake engine, with an in-memory session cache per launch."""

    def __init__(self, sessions: Sessions) -> None:
        super().__init__()
        self.sessions = sessions
        self.made = 0

    def cache_adapter(self, spec: LaunchSpec) -> CacheAdapter | None:
        self.made += 1
        return self.sessions


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EventStore]:
    with EventStore.open(tmp_path / "events.db", owner=True) as opened:
        yield opened


@pytest.fixture
async def clock() -> AsyncIterator[VirtualClock]:
    virtual = VirtualClock()
    async with virtual.autojump():
        yield virtual


def supervisor(
    tmp_path: Path, store: EventStore, clock: VirtualClock, sessions: Sessions
) -> Supervisor:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights")
    runner = FakeRunner(clock, ready_after=1.0)
    return Supervisor(
        KEY,
        SessionEngine(sessions),
        lambda port: LaunchSpec(KEY, model, port, ctx_per_slot=512, slots=1),
        store,
        run_dir=tmp_path / "run",
        token_prefix="saves-test",
        policy=SupervisorPolicy(idle_timeout=0, watch_interval=1.0, readiness_poll=0.5),
        clock=clock,
        runner=runner,
        transport=FakeTransport(runner),
    )


def story(store: EventStore) -> list[tuple[str, Any]]:
    """The engine's stop and the cache's saves, in the log's order."""
    out: list[tuple[str, Any]] = []
    for record in store.read_all():
        if record.type in ("engine.stop_requested", "engine.stopped"):
            out.append((record.type, record.payload.get("reason")))
        elif record.type == "cache.saved":
            p = record.payload
            out.append((record.type, (p["session"], p["cause"], p["tokens"], p["error"])))
    return out


@pytest.mark.parametrize(
    "reason", ["evicted", "idle", "memory-pressure", "user", "shutdown", "unconfigured"]
)
async def test_every_stop_of_an_answering_engine_saves_its_sessions_first(
    tmp_path: Path, store: EventStore, clock: VirtualClock, reason: str
) -> None:
    sessions = Sessions(clock, ["ana", "bo"])
    sup = supervisor(tmp_path, store, clock, sessions)
    await sup.ensure_running()
    assert sup.cache_adapter() is sessions  # the launch's own: the runtime registers this one
    await sup.stop(reason)
    assert sessions.asked == ["ana", "bo"]
    assert story(store) == [
        ("engine.stop_requested", reason),
        ("cache.saved", ("ana", reason, 100, "")),
        ("cache.saved", ("bo", reason, 100, "")),
        ("engine.stopped", None),
    ]


@pytest.mark.parametrize("reason", ["health-restart", "start-failed"])
async def test_a_stop_of_an_engine_that_does_not_answer_saves_nothing(
    tmp_path: Path, store: EventStore, clock: VirtualClock, reason: str
) -> None:
    sessions = Sessions(clock, ["ana"])
    sup = supervisor(tmp_path, store, clock, sessions)
    await sup.ensure_running()
    sup.cache_adapter()
    await sup.stop(reason)
    assert sessions.asked == []
    assert [t for t, _ in story(store)] == ["engine.stop_requested", "engine.stopped"]


@pytest.mark.parametrize(
    ("reason", "bound"), [("evicted", SAVE_BOUND), ("shutdown", SHUTDOWN_SAVE_BOUND)]
)
async def test_slow_saves_never_hold_the_stop_past_the_bound(
    tmp_path: Path, store: EventStore, clock: VirtualClock, reason: str, bound: float
) -> None:
    """Each save takes 40 % of the bound: two fit, the third runs out, the fourth is not tried."""
    sessions = Sessions(clock, ["a", "b", "c", "d"], save_seconds=0.4 * bound)
    sup = supervisor(tmp_path, store, clock, sessions)
    await sup.ensure_running()
    sup.cache_adapter()
    began = clock.monotonic()
    await sup.stop(reason)
    took = clock.monotonic() - began
    assert bound <= took < bound + 1.0  # the bound, then the stop itself (virtual seconds)
    assert sessions.asked == ["a", "b", "c"]
    ran_out = f"not saved: the stop's {bound:g} s for saves ran out"
    assert story(store)[1:-1] == [
        ("cache.saved", ("a", reason, 100, "")),
        ("cache.saved", ("b", reason, 100, "")),
        ("cache.saved", ("c", reason, 0, ran_out)),
        ("cache.saved", ("d", reason, 0, ran_out)),
    ]


async def test_a_plugin_that_raises_costs_that_session_its_file_never_the_stop(
    tmp_path: Path, store: EventStore, clock: VirtualClock
) -> None:
    sessions = Sessions(clock, ["ana", "bo"])
    sessions.broken.add("ana")
    sup = supervisor(tmp_path, store, clock, sessions)
    await sup.ensure_running()
    sup.cache_adapter()
    await sup.stop("evicted")
    assert sup.state == "stopped"
    assert story(store)[1:] == [
        ("cache.saved", ("ana", "evicted", 0, "the plugin raised RuntimeError")),
        ("cache.saved", ("bo", "evicted", 100, "")),
        ("engine.stopped", None),
    ]


async def test_the_launchs_cache_adapter_is_made_once_when_it_is_ready(
    tmp_path: Path, store: EventStore, clock: VirtualClock
) -> None:
    """Made as the launch becomes ready (off the loop: a plugin may stat its files then), once:
    the runtime's registration and the stop's saves use that very one."""
    sessions = Sessions(clock, [])
    sup = supervisor(tmp_path, store, clock, sessions)
    adapter = sup._parts.guard.adapter
    assert isinstance(adapter, SessionEngine)
    await sup.ensure_running()
    assert adapter.made == 1
    assert sup.cache_adapter() is sessions and sup.cache_adapter() is sessions
    assert adapter.made == 1
    await sup.stop("evicted")
    assert sessions.asked == []  # it held no session: nothing to save
    assert sup.cache_adapter() is None  # no process, no adapter
