"""What-if (PM20-PM25): the workload a log records, the simulator's rules, ``hostler whatif``.

The simulator's tests use hand-built workloads whose figures can be worked out on paper (each
expected wait is derived in a comment); the workload's tests append synthetic events to a real
event log. The check against live runs with real engines is in ``test_whatif_live.py``.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hostler import EventStore
from hostler.cli import main
from hostler.errors import UsageError
from hostler.events.base import Event
from hostler.events.ledger import (
    LedgerBudgetSet,
    LedgerDenied,
    LedgerMeasured,
    LedgerReserved,
    LedgerSpilloverSet,
)
from hostler.events.pool import PoolDrainEnded, PoolDrainStarted, PoolRoomPlanned
from hostler.events.queue import QueueCancelled, QueueDispatched, QueueEnqueued, QueueReleased
from hostler.machines.engine import (
    EngineCrashed,
    EngineReady,
    EngineStartRequested,
    EngineStopped,
    EngineStopRequested,
)
from hostler.policies.eviction import RankedPolicy
from hostler.postmortem.figures import (
    Figures,
    KeyFigures,
    Tally,
    Waits,
    percentile,
    recorded_figures,
    waits_of,
)
from hostler.postmortem.whatif import DRAIN_POLL, limits_for, simulate
from hostler.postmortem.whatif_engine import SimEngine
from hostler.postmortem.workload import (
    FLUSH_LAG,
    Model,
    Outside,
    Request,
    Settings,
    Workload,
    median,
    number,
    workload_from,
)

A, B, C, P = "llamacpp:a:0", "llamacpp:b:0", "llamacpp:c:0", "llamacpp:p:0"


def models(size: int = 10, cold: float = 0.0, stop: float = 0.0, **sizes: int) -> dict[str, Model]:
    """Models a, b, c (and any named in ``sizes``) of ``size`` bytes each."""
    found = {key: Model(key, size, size, cold, stop) for key in (A, B, C)}
    for name, bytes_ in sizes.items():
        key = f"llamacpp:{name}:0"
        found[key] = Model(key, bytes_, bytes_, cold, stop)
    return found


def run(
    requests: list[Request],
    budget: int,
    table: dict[str, Model] | None = None,
    **options: Any,
) -> Figures:
    fast = options.pop("fast", None)
    pinned = frozenset(options.pop("pinned", ()))
    launched = options.pop("launched", {})
    outside = tuple(options.pop("outside", ()))
    workload = Workload(
        tuple(requests),
        table or models(),
        Settings(budget),
        fast,
        launched,
        pinned,
        outside=outside,
    )
    return simulate(workload, Settings(budget, **options))


def cycle(keys: str, gap: float = 5.0, work: float = 0.5) -> list[Request]:
    """Sequential requests, one every ``gap`` seconds, for the named models in turn."""
    return [Request(i * gap, f"llamacpp:{k}:0", work) for i, k in enumerate(keys)]


# -- constants and small pure pieces ----------------------------------------------------------


def test_constants() -> None:
    assert FLUSH_LAG == 0.5
    assert DRAIN_POLL == 0.5


def test_median_percentile_and_waits_edges() -> None:
    assert median([]) == 0.0
    assert median([3.0]) == 3.0
    assert median([4.0, 1.0]) == 2.5
    assert median([5.0, 1.0, 3.0]) == 3.0
    assert percentile([], 0.95) == 0.0
    assert percentile([1.0], 0.95) == 1.0
    values = [float(i) for i in range(1, 21)]  # 20 values: the 19th is the nearest rank of 95 %
    assert percentile(values, 0.95) == 19.0
    assert percentile(values, 0.0) == 1.0  # rank 0 is read as the first
    assert waits_of([]) == Waits(0, 0.0, 0.0, 0.0)
    assert waits_of([2.0, 0.0, 1.0]) == Waits(3, 1.0, 2.0, 2.0)


def test_number_takes_finite_numbers_only() -> None:
    assert number({"x": 2}, "x") == 2.0
    assert number({"x": 2.5}, "x") == 2.5
    for bad in (float("nan"), float("inf"), "3", None, True):
        assert number({"x": bad}, "x") is None
    assert number({}, "x") is None


def test_limits_for_enforces_any_budget_and_ceilings_without_spillover() -> None:
    on = limits_for(Settings(30), 10)
    assert (on.enforced, on.budget, on.fast_budget, on.spillover_allowed, on.ceiling) == (
        True,
        30,
        10,
        True,
        30,
    )
    off = limits_for(Settings(30, spillover=False), 10)
    assert (off.fast_budget, off.ceiling) == (10, 10)
    assert limits_for(Settings(30, spillover=False), None).ceiling == 30  # no fast budget known
    assert limits_for(Settings(5, spillover=False), 10).ceiling == 5  # fast above the budget
    assert limits_for(Settings(-1), None).budget == 0
    assert limits_for(Settings(100), None).enforced  # below 1 GiB, still enforced (PM22)


def test_tally_totals_and_as_dict() -> None:
    tally = Tally([A])
    tally.request(A)
    tally.request(B)
    tally.eviction(A)
    tally.refusal(B)
    tally.cold_start(A)
    tally.cold_start(A)
    tally.wait(A, 1.0)
    tally.wait(B, 3.0)
    figures = tally.figures()
    assert figures.by_key[A].counts() == (1, 1, 0, 2)
    assert figures.by_key[B].counts() == (1, 0, 1, 0)
    assert figures.total == KeyFigures(2, 1, 1, 2, Waits(2, 2.0, 3.0, 3.0))
    data = figures.as_dict()
    assert data["total"]["waits"] == {"count": 2, "median": 2.0, "p95": 3.0, "max": 3.0}
    assert list(data["by_key"]) == [A, B]
    assert data["by_key"][B]["refusals"] == 1


# -- the simulator: budgets ----------------------------------------------------------------


def test_a_bigger_budget_evicts_less_and_a_smaller_one_more() -> None:
    sequence = cycle("abcabcab")
    counts = {budget: run(sequence, budget).total.counts() for budget in (10, 20, 30)}
    assert counts[10] == (8, 7, 0, 8)  # one fits: every request after the first evicts
    assert counts[20] == (8, 6, 0, 8)  # LRU order thrashes a cycle of three through two
    assert counts[30] == (8, 0, 0, 3)  # all fit: three cold starts, nothing evicted


def test_a_zero_budget_refuses_every_start() -> None:
    figures = run(cycle("abcab"), 0)
    assert figures.total.counts() == (5, 0, 5, 0)
    assert figures.by_key[A].refusals == 2
    assert figures.total.waits.count == 5  # each got its queue slot, then the refusal


def test_a_model_bigger_than_the_budget_is_refused_and_nothing_is_evicted_for_it() -> None:
    table = models(big=25)
    figures = run(
        [*cycle("a"), Request(5.0, "llamacpp:big:0", 1.0), Request(10.0, A, 1.0)], 20, table
    )
    assert figures.by_key["llamacpp:big:0"].counts() == (1, 0, 1, 0)
    assert figures.by_key[A].counts() == (2, 0, 0, 1)  # still resident for its second request


def test_a_model_equal_to_the_budget_fits_and_one_byte_more_does_not() -> None:
    assert run(cycle("a"), 10).total.counts() == (1, 0, 0, 1)
    assert run(cycle("a"), 9).total.counts() == (1, 0, 1, 0)
    # two that fill the budget exactly sit together
    assert run(cycle("abab"), 20).total.counts() == (4, 0, 0, 2)
    assert run(cycle("abab"), 19).total.counts() == (4, 3, 0, 4)


def test_a_model_priced_at_nothing_runs_alone() -> None:
    table = models(free=0)
    figures = run([*cycle("b"), Request(5.0, "llamacpp:free:0", 1.0)], 20, table)
    assert figures.by_key[B].evictions == 1  # the budget is its price: b had to go
    assert figures.by_key["llamacpp:free:0"].cold_starts == 1


def test_measured_bytes_replace_the_reservation_once_ready() -> None:
    table = {A: Model(A, 15, 5), B: Model(B, 15, 15)}
    assert run(cycle("ab"), 20, table).total.evictions == 0  # 5 held + 15 asked fit
    table = {A: Model(A, 15, 15), B: Model(B, 15, 15)}
    assert run(cycle("ab"), 20, table).total.evictions == 1


def test_spillover_off_keeps_co_resident_models_within_the_fast_budget() -> None:
    table = models(8)
    sequence = cycle("aba")
    assert run(sequence, 30, table, fast=10).total.evictions == 0
    off = run(sequence, 30, table, fast=10, spillover=False)
    assert off.total.counts() == (3, 2, 0, 3)
    # alone, a model may use the whole budget even above the fast one
    big = {A: Model(A, 25, 25)}
    assert run(cycle("a"), 30, big, fast=10, spillover=False).total.counts() == (1, 0, 0, 1)


# -- the simulator: policies and pins -----------------------------------------------------------


def _demand_vs_age() -> list[Request]:
    # a is asked three times early, b once later; c needs the room of one of them
    return [Request(t, A, 0.1) for t in (0.0, 1.0, 2.0)] + [
        Request(3.0, B, 0.1),
        Request(4.0, C, 0.1),
    ]


def test_lru_and_demand_lru_choose_different_victims() -> None:
    demand = run(_demand_vs_age(), 20, policy="demand-lru")
    assert (demand.by_key[A].evictions, demand.by_key[B].evictions) == (0, 1)
    lru = run(_demand_vs_age(), 20, policy="lru")
    assert (lru.by_key[A].evictions, lru.by_key[B].evictions) == (1, 0)


def test_a_plugins_policy_is_used_by_name_and_an_unknown_one_refused() -> None:
    newest = RankedPolicy("newest", 1, lambda r: (-r.last_used_at, r.key))
    workload = Workload(tuple(_demand_vs_age()), models(), Settings(20))
    figures = simulate(workload, Settings(20, policy="newest"), policies=[newest])
    assert figures.by_key[B].evictions == 1
    with pytest.raises(UsageError, match="no eviction policy is named 'nosuch'"):
        simulate(workload, Settings(20, policy="nosuch"))


def test_pinned_engines_start_first_and_are_never_evicted() -> None:
    figures = run(cycle("abab"), 20, models(p=10), pinned={P})
    assert figures.by_key[P].counts() == (0, 0, 0, 1)
    assert figures.by_key[A].counts() == (2, 2, 0, 2)
    assert figures.by_key[B].counts() == (2, 1, 0, 2)
    # a pin that fills the budget leaves no room: the others are refused, the pin stays
    refused = run(cycle("ab"), 10, models(p=10), pinned={P})
    assert refused.total.counts() == (2, 0, 2, 1)


# -- the simulator: draining, spoken-for engines, queues -------------------------------------


def test_a_busy_victim_is_drained_then_evicted() -> None:
    table = models(cold=1.0, stop=0.25)
    requests = [Request(0.0, A, 5.0), Request(2.0, B, 1.0), Request(2.5, B, 1.0)]
    figures = run(requests, 10, table)
    assert figures.total.counts() == (3, 1, 0, 2)
    # a ready at 1, busy to 6; drained, gone at 6; b starts after its stop (0.25) and cold
    # start (1): ready 7.25, first b ends 8.25, when the second b (queued at 2.5) gets its slot
    assert figures.by_key[B].waits == Waits(2, 2.875, 5.75, 5.75)


def test_a_drain_past_the_old_bound_waits_for_the_victim_as_the_daemon_does() -> None:
    """PP5 (issue 21): a start's drain has no bound but its requesters' own: replayed so."""
    requests = [Request(0.0, A, 100.0), Request(2.0, B, 1.0), Request(3.0, B, 1.0)]
    figures = run(requests, 10)
    assert figures.by_key[A].counts() == (1, 1, 0, 1)  # evicted once its 100 s request ended
    assert figures.by_key[B].counts() == (2, 0, 0, 1)  # never refused
    # the first b waited from 2 until a's request ended at 100
    assert figures.by_key[B].waits.max == pytest.approx(98.0)


def test_an_engine_being_built_is_spoken_for_and_not_a_victim() -> None:
    table = models(cold=5.0)
    requests = [Request(0.0, A, 1.0), Request(1.0, B, 1.0), Request(1.5, B, 1.0)]
    figures = run(requests, 10, table)
    assert figures.total.counts() == (3, 1, 0, 2)
    # a ready at 5, runs to 6, drained then; b ready at 11, ends 12: the second b waited 10.5
    assert figures.by_key[B].waits.max == pytest.approx(10.5)


def test_a_start_that_only_spoken_for_engines_could_make_room_for_waits_then_is_refused() -> None:
    table = models(cold=40.0)
    figures = run([Request(0.0, A, 1.0), Request(1.0, B, 1.0), Request(2.0, B, 1.0)], 10, table)
    assert figures.by_key[B].refusals == 1
    # refused when its patience (30 s from 1) ran out: the second b got the slot then, and
    # once a was ready (40) and its request done (41), a was drained and evicted for it
    assert figures.by_key[B].waits.max == pytest.approx(29.0)
    assert figures.by_key[A].evictions == 1
    assert figures.by_key[B].cold_starts == 1


def test_queue_waits_follow_the_engines_slots() -> None:
    table = models(cold=2.0)
    both = [Request(0.0, A, 1.0), Request(0.0, A, 1.0)]
    one = run(both, 10, table)
    assert one.by_key[A].waits == Waits(2, 1.5, 3.0, 3.0)  # the second waits cold + work
    two = run(both, 10, table, slots=2)
    assert two.by_key[A].waits == Waits(2, 0.0, 0.0, 0.0)
    recorded = run(both, 10, table, launched={A: 2})  # as launched, from the log
    assert recorded.by_key[A].waits.max == 0.0


def test_the_clients_whole_wait_counts_the_cold_start_that_a_queue_wait_leaves_out() -> None:
    """Issue 19: a queue slot given at once read "waited 0.000" to a client that waited the
    whole start; the served figure is arrival to engine, as ``queue.served`` records it."""
    table = models(cold=2.0)
    both = [Request(0.0, A, 1.0), Request(0.0, A, 1.0)]
    two = run(both, 10, table, slots=2)
    assert two.by_key[A].waits == Waits(2, 0.0, 0.0, 0.0)  # both got a queue slot at once
    assert two.by_key[A].served == Waits(2, 2.0, 2.0, 2.0)  # and reached the engine at ready
    one = run(both, 10, table)
    assert one.by_key[A].served == Waits(2, 2.5, 3.0, 3.0)  # the second after the first ran
    assert run([Request(0.0, A, 1.0)], 10, models()).by_key[A].served == Waits(1, 0.0, 0.0, 0.0)
    assert one.as_dict()["by_key"][A]["served"] == {
        "count": 2,
        "median": 2.5,
        "p95": 3.0,
        "max": 3.0,
    }


def _row(seq: int, stream: str, kind: str, payload: dict[str, Any]) -> Any:
    return SimpleNamespace(seq=seq, stream_id=stream, type=kind, payload=payload, damage="")


def test_the_recorded_whole_wait_is_read_from_queue_served() -> None:
    rows = [
        _row(1, "queue/a", "queue.enqueued", {"engine": A, "id": 1, "lane": "interactive"}),
        _row(2, "queue/a", "queue.dispatched", {"engine": A, "id": 1, "waited": 0.00005}),
        _row(3, "queue/a", "queue.served", {"engine": A, "id": 1, "lane": "interactive",
                                            "waited": 7.25}),
    ]  # fmt: skip
    figures = recorded_figures(rows)
    assert figures.by_key[A].waits == Waits(1, 0.00005, 0.00005, 0.00005)
    assert figures.by_key[A].served == Waits(1, 7.25, 7.25, 7.25)


def test_background_work_waits_at_the_engines_gate_not_in_its_queue() -> None:
    requests = [
        Request(0.0, A, 1.0),
        Request(0.5, A, 1.0, lane="background"),
        Request(1.5, A, 1.0),
        Request(1.6, A, 1.0),
    ]
    figures = run(requests, 10)
    # the background one gets a queue slot at once and runs 1..2 (one slot); the third is
    # dispatched at 1.5, runs 2..3; the fourth waits in the queue until 3
    waits = figures.by_key[A].waits
    assert (waits.count, waits.median) == (4, 0.0)
    assert waits.p95 == waits.max == pytest.approx(1.4)


def test_a_request_that_gave_up_leaves_the_queue() -> None:
    requests = [Request(0.0, A, 5.0), Request(1.0, A, 0.0, gave_up=2.0), Request(1.5, A, 1.0)]
    figures = run(requests, 10)
    assert figures.by_key[A].waits == Waits(2, 1.75, 3.5, 3.5)  # the one that left: no wait


def test_a_request_follows_the_one_it_followed_when_that_ends_in_the_replay() -> None:
    table = models(cold=1.0)
    chained = [
        Request(0.0, A, 1.0),
        Request(0.1, B, 1.0, after=0, gap=0.5),
        Request(2.6, B, 1.0),
    ]
    # a ends at 2; b arrives at 2.5, a is idle and goes; b ready 3.5, ends 4.5
    assert run(chained, 10, table).by_key[B].waits.max == pytest.approx(1.9)
    open_loop = [Request(0.0, A, 1.0), Request(0.1, B, 1.0), Request(2.6, B, 1.0)]
    # b arrives at 0.1: a is spoken for, then drained; b starts at 2, ends 4
    assert run(open_loop, 10, table).by_key[B].waits.max == pytest.approx(1.4)


def test_a_refused_request_ends_and_its_follower_then_arrives() -> None:
    requests = [Request(0.0, A, 1.0), Request(5.0, B, 1.0, after=0, gap=1.0)]
    assert run(requests, 0).total.counts() == (2, 0, 2, 0)
    bad = [Request(0.0, A, 1.0), Request(5.0, B, 1.0, after=1, gap=1.0)]  # follows itself
    assert run(bad, 0).total.counts() == (2, 0, 2, 0)  # taken as arriving when recorded


# -- the workload, from a real log ------------------------------------------------------------

T = 1_700_000_000.0  # the engines' clock (epoch)
Q = 5_000.0  # the queue's clock reading at T (monotonic)


class Log:
    """A real event log whose recorded_at is set per append (queue events 0.1 s late)."""

    def __init__(self, path: Path) -> None:
        self.now = T
        self.store = EventStore.open(path, clock=lambda: datetime.fromtimestamp(self.now, UTC))

    def add(self, stream: str, event: Event, at: float) -> None:
        self.now = at
        self.store.append(stream, [event], expected_version=None)

    def queue(self, event: Event, at: float) -> None:
        self.add(f"queue/{getattr(event, 'engine')}", event, T + (at - Q) + 0.1)  # noqa: B009


def _engine(log: Log, key: str, trigger: type[Event], at: float, **fields: Any) -> None:
    log.add(f"engine/{key}", trigger(from_state="x", to_state="y", at=at, **fields), at)  # type: ignore[call-arg]


def _decision(cap: int = 1) -> dict[str, Any]:
    return {"rule": "oldest", "interactive_cap": cap}


@pytest.fixture
def recorded(tmp_path: Path) -> tuple[Path, Log]:
    """A synthetic log: a started, used twice; b refused; a request cancelled; a pin."""
    path = tmp_path / "events.db"
    log = Log(path)
    ledger = "ledger/host"
    log.add(ledger, LedgerSpilloverSet(False), T - 10)
    log.add(ledger, LedgerBudgetSet(300), T - 9)
    # request 1 on a at Q: dispatched at once; a's start (room planned first) pays 2 s
    log.queue(QueueEnqueued(A, 1, "interactive", False, "s1", None, None, Q), Q)
    log.queue(QueueDispatched(A, 1, "interactive", 0.0, Q, _decision(2)), Q)
    log.add(
        "pool/host",
        PoolRoomPlanned(T + 0.01, A, 100, 0, [], None, True, {"eviction": "lru"}),
        T + 0.01,
    )
    log.add(ledger, LedgerReserved(A, 100, "me", 0, 0, 250, 200, True), T + 0.02)
    _engine(log, A, EngineStartRequested, T + 0.03, cause="request")
    _engine(log, A, EngineReady, T + 2.01)
    log.add(ledger, LedgerMeasured(A, 90, "me", 100), T + 2.02)
    log.queue(QueueReleased(A, 1, "interactive", 2.5, Q + 2.5), Q + 2.5)
    # request 2 on a at Q+3: a is up, it runs 0.7 s
    log.queue(QueueEnqueued(A, 2, "interactive", False, "s1", None, None, Q + 3), Q + 3)
    log.queue(QueueDispatched(A, 2, "interactive", 0.0, Q + 3, _decision(2)), Q + 3)
    log.queue(QueueReleased(A, 2, "interactive", 0.7, Q + 3.7), Q + 3.7)
    # request 3 on b: refused by the ledger
    log.queue(QueueEnqueued(B, 1, "background", True, None, "g", None, Q + 4), Q + 4)
    log.queue(QueueDispatched(B, 1, "background", 0.25, Q + 4.25, _decision()), Q + 4.25)
    log.add(ledger, LedgerDenied(B, 400, "me", 150, "budget exhausted", 90, 250, 200), T + 4.3)
    log.queue(QueueReleased(B, 1, "background", 0.01, Q + 4.26), Q + 4.26)
    # request 4 on a: cancelled after 1.5 s queued; request 5: never ended
    log.queue(QueueEnqueued(A, 3, "interactive", False, None, None, None, Q + 5), Q + 5)
    log.queue(QueueCancelled(A, 3, "interactive", "cancelled", 1.5, Q + 6.5), Q + 6.5)
    log.queue(QueueEnqueued(A, 4, "interactive", False, None, None, None, Q + 7), Q + 7)
    # a evicted (stop 0.4 s); b drained busy for c; a pin
    _engine(log, A, EngineStopRequested, T + 8, reason="evicted", decision={"rule": "PP4"})
    _engine(log, A, EngineStopped, T + 8.4, exit_code=0, signal=None)
    log.add("pool/host", PoolDrainStarted(T + 9, B, C, 30.0), T + 9)
    log.add("pool/host", PoolDrainEnded(T + 40, B, "busy", 31.0, {}), T + 40)
    _engine(log, P, EngineStartRequested, T + 50, cause="pinned")
    log.store.append("other/x", [LedgerBudgetSet(None)], expected_version=None)
    log.store.close()
    with EventStore.open(path) as store:
        store.append(
            "queue/" + A,
            [QueueEnqueued(A, 9, "sideways", False, None, None, None, 1.0)],
            expected_version=None,
        )
    with sqlite3.connect(path) as db:
        db.execute("DROP TRIGGER events_no_update")
        db.execute("UPDATE events SET payload = '{not json' WHERE seq = 1")
    return path, log


def _rows(path: Path) -> list[Any]:
    with EventStore.open(path) as store:
        return list(store.read_all())


def test_the_workload_a_log_records(recorded: tuple[Path, Log]) -> None:
    path, _ = recorded
    workload = workload_from(_rows(path))
    first, second, third, fourth = workload.requests
    assert (first.at, first.key, first.session, first.lane) == (Q, A, "s1", "interactive")
    assert first.work == pytest.approx(0.5)  # ran 2.5 s, of which 2 s paid a's cold start
    assert first.after is None
    assert second.work == pytest.approx(0.7)
    assert second.after == 0
    assert second.gap == pytest.approx(0.5)
    assert (third.key, third.lane, third.ambient, third.group) == (B, "background", True, "g")
    assert third.work == pytest.approx(0.01)
    assert (fourth.gave_up, fourth.work, fourth.after) == (1.5, 0.0, 2)
    a = workload.models[A]
    assert (a.reserve, a.held) == (100, 90)
    assert a.cold_start == pytest.approx(2.0)  # from its room plan to ready
    assert a.stop == pytest.approx(0.4)
    # refused, never reserved: priced at what it asked (was 0, "runs alone": a replay then
    # started what the log refused; issue 19)
    assert workload.models[B] == Model(B, 400, 400, 0.0, 0.0)
    assert workload.settings == Settings(250, "lru", False, None)
    assert workload.fast == 200  # the ceiling below the budget
    assert workload.slots[A] == 2 and workload.slots[B] == 1
    assert workload.pinned == frozenset({P})
    assert workload.skipped == {
        "damaged": 1,
        "queue.enqueued of a request the log never saw end": 1,
        "queue.enqueued without the fields it needs": 1,
    }
    assert any("budget changed" in note for note in workload.notes)
    assert not any(B in note and "priced at 0" in note for note in workload.notes)  # its ask


def test_the_figures_a_log_records(recorded: tuple[Path, Log]) -> None:
    figures = recorded_figures(_rows(path := recorded[0]))
    assert figures.by_key[A].counts() == (4, 1, 0, 1)
    assert figures.by_key[B].counts() == (1, 0, 1, 0)
    assert figures.by_key[C].refusals == 1  # the drain made for it ended busy
    assert figures.by_key[B].waits == Waits(1, 0.25, 0.25, 0.25)
    assert figures.total.counts() == (5, 1, 2, 1)
    assert path.exists()


def test_only_evictions_for_room_count_not_unloads_someone_asked_for() -> None:
    def stop(rule: str | None) -> Any:
        decision = {} if rule is None else {"rule": rule}
        payload = {"reason": "evicted", "decision": decision, "at": 1.0}
        return SimpleNamespace(
            seq=1, stream_id=f"engine/{A}", type="engine.stop_requested", payload=payload, damage=""
        )

    for rule, counted in (("PP4", 1), ("PP6", 0), ("GA1", 0), (None, 0)):
        assert recorded_figures([stop(rule)]).total.evictions == counted, rule
    idle = stop("PP4")
    idle.payload["reason"] = "idle"
    assert recorded_figures([idle]).total.evictions == 0
    # Break (issue 19): a victim that crashed between the room plan and its stop was counted
    # as evicted (``backoff`` -> ``stopped``): its crash freed the memory, the stop freed none,
    # and the what-if, which replays the crash, rightly evicted nothing there.
    crashed = stop("PP4")
    crashed.payload["from_state"] = "backoff"
    assert recorded_figures([crashed]).total.evictions == 0
    running = stop("PP4")
    running.payload["from_state"] = "running"
    assert recorded_figures([running]).total.evictions == 1


def test_a_log_without_ledger_decisions_says_its_budget_is_unknown(tmp_path: Path) -> None:
    with EventStore.open(tmp_path / "e.db") as store:
        store.append(
            "queue/" + A,
            [QueueEnqueued(A, 1, "interactive", False, None, None, None, 1.0)],
            expected_version=None,
        )
        store.append(
            "queue/" + A, [QueueReleased(A, 1, "interactive", 0.5, 1.5)], expected_version=None
        )
        workload = workload_from(list(store.read_all()))
    assert workload.settings == Settings(0, "demand-lru", True, None)
    assert workload.requests == (Request(1.0, A, 0.5),)
    assert workload.notes[0].startswith("the log records no ledger decision")


# -- hostler whatif ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--budget", "-1"], "'-1' is not a size"),
        (["--budget", "12XB"], "'12XB' is not a size"),
        (["--budget", "auto"], "'auto' is not a size"),
        (["--slots", "0"], "0 is out of range"),
        (["--policy", "No Such"], "'No Such' is not a policy name"),
        (["--spillover", "maybe"], "spillover is on or off"),
    ],
)
def test_cli_whatif_refuses_bad_flags_in_one_line(
    flags: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["whatif", str(tmp_path / "events.db"), *flags])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hostler: error [usage.invalid]: ")
    assert said in err


def test_cli_whatif_refuses_an_unknown_policy_and_a_missing_log(
    recorded: tuple[Path, Log], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = recorded
    assert main(["whatif", str(path), "--policy", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no eviction policy is named 'nosuch'" in err
    assert main(["whatif", str(tmp_path / "none.db")]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no event log here" in err
    assert main(["whatif", str(path), "--db", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == "hostler: error [usage.invalid]: whatif: give the log once: as LOG or as --db\n"
    assert main(["whatif", "--db", str(path), "--json"]) == 1  # --db as LOG (a damaged row: 1)
    assert json.loads(capsys.readouterr().out)["requests"] == 4
    assert main(["whatif", "--data-dir", str(tmp_path / "empty")]) != 0  # no DATA_DIR/events.db
    assert "no event log here" in capsys.readouterr().err


def test_cli_whatif_prints_what_happened_beside_the_replay_and_the_what_if(
    recorded: tuple[Path, Log], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = recorded
    assert main(["whatif", str(path), "--budget", "1GiB", "--json"]) == 1  # a damaged row
    captured = capsys.readouterr()
    assert "seq 1" in captured.err
    report = json.loads(captured.out)
    assert report["requests"] == 4
    assert report["recorded_settings"] == {
        "budget": 250,
        "policy": "lru",
        "spillover": False,
        "slots": None,
        "follow_budget": False,  # every decision enforced 250: no change to replay
    }
    assert report["whatif_settings"]["budget"] == 2**30
    assert report["happened"]["by_key"][B]["refusals"] == 1
    assert report["whatif"]["by_key"][B]["refusals"] == 0  # 1 GiB: b's 400 B ask fits
    assert report["replayed"]["total"]["requests"] == 4
    main(["whatif", str(path), "--slots", "2", "--policy", "demand-lru", "--spillover", "on"])
    text = capsys.readouterr().out
    assert "happened" in text and "replayed" in text and "what-if" in text
    assert "demand-lru" in text and "lru" in text
    assert "note: the budget changed" in text and "skipped: 1 row(s): damaged" in text


def test_the_next_start_plans_only_once_the_victims_of_the_last_have_stopped() -> None:
    table = models(stop=2.0, d=10)
    requests = [
        Request(0.0, A, 1.0),
        Request(2.0, B, 1.0),
        Request(10.0, C, 1.0),
        Request(10.5, "llamacpp:d:0", 1.0),
        Request(10.6, "llamacpp:d:0", 1.0),
    ]
    figures = run(requests, 20, table)
    assert figures.total.evictions == 2
    # c evicts a (stop 2 s): the lock is held to 12; d then evicts b (2 s more): ready 14,
    # done 15, when the second d gets its slot
    assert figures.by_key["llamacpp:d:0"].waits.max == pytest.approx(4.4)


def test_ambient_work_waits_for_the_quiet_window_then_runs() -> None:
    requests = [Request(0.0, A, 1.0), Request(0.5, A, 1.0, lane="background", ambient=True)]
    figures = run(requests, 10)
    # the interactive request ends at 1; the queue is then quiet for 180 s, and the ambient
    # one is looked at again 25 ms after that (Q5)
    assert figures.by_key[A].waits.count == 2
    assert figures.by_key[A].waits.max == pytest.approx(180.525)
    # alone, it waits the window from when its engine's queue was made (its own arrival)
    alone = run([Request(0.0, B, 0.1), Request(1.0, A, 1.0, ambient=True)], 20)
    assert alone.by_key[A].waits.max == pytest.approx(180.025)


def test_ambient_work_queued_at_the_clock_s_zero_waits_the_window_once() -> None:
    # a quiet clock set at 0.0 is a time like any other: the window runs from it, the re-check
    # lands 180.025 s after it and opens the gate (it used to be read as "never set", so each
    # re-check found 0 s of quiet and asked for another, forever)
    alone = run([Request(0.0, A, 1.0, ambient=True)], 10, slots=1)
    assert alone.by_key[A].waits == Waits(1, 180.025, 180.025, 180.025)
    requests = [
        Request(0.0, A, 1.0, ambient=True),
        Request(0.0, A, 1.0, lane="background", ambient=True),
        Request(200.0, A, 1.0),
    ]
    figures = run(requests, 10, slots=1)
    # both ambient ones dispatch at 180.025 (a lane each); the gate's one slot runs the first
    # to 181.025, then the second; the person at 200 finds the queue empty
    assert figures.by_key[A].waits == Waits(3, 180.025, 180.025, 180.025)
    assert figures.by_key[A].served == Waits(3, 180.025, 181.025, 181.025)
    # an interactive one that ends at 0.0 is activity at 0.0: the window runs from then
    after = run([Request(0.0, A, 0.0), Request(0.5, A, 1.0, ambient=True)], 10, slots=1)
    assert after.by_key[A].waits.max == pytest.approx(179.525)


def test_a_re_check_made_stale_by_a_person_asks_again_without_tripping_the_guard() -> None:
    # the ambient one's re-check is asked for 181.025; a person's request (100..101) moves the
    # quiet clock, so that re-check finds the gate shut and asks for 281.025, when it runs
    requests = [Request(1.0, A, 1.0, ambient=True), Request(100.0, A, 1.0)]
    figures = run(requests, 10, slots=1)
    assert figures.by_key[A].waits == Waits(2, 140.0125, 280.025, 280.025)


def test_a_re_check_that_changes_nothing_stops_the_replay_with_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a quiet clock that never runs would have the re-check ask for another forever: the
    # simulator says so at the second one instead of looping
    monkeypatch.setattr(SimEngine, "quiet_for", lambda self, now: 0.0)
    with pytest.raises(RuntimeError, match=r"llamacpp:a:0's ambient re-check at 181\.025 s"):
        run([Request(1.0, A, 1.0, ambient=True)], 10, slots=1)


@pytest.mark.parametrize("by", ["session", "group"])
def test_a_request_of_what_ran_last_goes_first(by: str) -> None:
    def asked(at: float, work: float, tag: str) -> Request:
        if by == "session":
            return Request(at, A, work, session=tag)
        return Request(at, A, work, group=tag)

    requests = [asked(0.0, 2.0, "x"), asked(0.5, 1.0, "y"), asked(1.0, 1.0, "x")]
    figures = run(requests, 10)
    # at 2 the third (same as the one that ran) goes before the second: waits 1.0, then 2.5
    assert figures.by_key[A].waits == Waits(3, 1.0, 2.5, 2.5)
    untagged = [asked(0.0, 2.0, "x"), asked(0.5, 1.0, "y"), asked(1.0, 1.0, "z")]
    assert run(untagged, 10).by_key[A].waits == Waits(3, 1.5, 2.0, 2.0)


def test_only_the_first_of_a_session_is_shown_to_the_pick_and_the_rest_follow() -> None:
    requests = [
        Request(0.0, A, 2.0, session="x"),
        Request(0.5, A, 1.0, session="y"),
        Request(0.6, A, 1.0, session="x"),
        Request(0.7, A, 1.0, session="x"),
        Request(0.8, A, 1.0, lane="background", session="z"),
    ]
    figures = run(requests, 10, slots=1)
    # the background one gets its lane's slot at 0.8 and the gate at 2 (runs 2..3); x keeps
    # the engine: its two get their slots at 2 and 4 (run 3..4, 4..5); y goes last, at 5
    waits = figures.by_key[A].waits
    assert waits.count == 5
    assert waits.median == pytest.approx(1.4)
    assert waits.p95 == waits.max == pytest.approx(4.5)


def test_requests_that_waited_for_a_drained_engine_build_it_again() -> None:
    table = models(cold=1.0)
    requests = [
        Request(0.0, A, 5.0),
        Request(2.0, B, 1.0),
        Request(3.0, A, 1.0, lane="background"),
    ]
    figures = run(requests, 10, table)
    # a drains for b and goes at 6; the background request given a slot at 3 waited for the
    # drain, so a is built again once b (ready 7, done 8) has been drained in turn
    assert figures.by_key[A].counts() == (2, 1, 0, 2)
    assert figures.by_key[B].counts() == (1, 1, 0, 1)


def test_a_request_dispatched_before_it_would_give_up_runs() -> None:
    requests = [Request(0.0, A, 1.0), Request(0.5, A, 0.0, gave_up=2.0)]
    assert run(requests, 10).by_key[A].waits == Waits(2, 0.25, 0.5, 0.5)


def _one_daemons_run(events: Log, ledger: Log, ledger_file: str | None) -> None:
    """a started and used, b refused by the ledger, a evicted for c; ledger rows in ``ledger``."""
    from hostler.events.daemon import DAEMON_STREAM, DaemonStarted

    host = "ledger/host"
    events.add(DAEMON_STREAM, DaemonStarted(T - 11, 1, "t", [], [], [], ledger_file, "me"), T - 11)
    ledger.add(host, LedgerBudgetSet(300), T - 9)
    events.queue(QueueEnqueued(A, 1, "interactive", False, None, None, None, Q), Q)
    events.queue(QueueDispatched(A, 1, "interactive", 0.0, Q, _decision(2)), Q)
    ledger.add(host, LedgerReserved(A, 100, "me", 0, 0, 300, 300, True), T + 0.02)
    if ledger is not events:  # a ledger of its own is shared with another daemon
        other = LedgerReserved("llamacpp:x:0", 50, "them", 0, 0, 300, 300, True)
        ledger.add(host, other, T + 0.03)
    _engine(events, A, EngineStartRequested, T + 0.03, cause="request")
    _engine(events, A, EngineReady, T + 2.01)
    ledger.add(host, LedgerMeasured(A, 90, "me", 100), T + 2.02)
    events.queue(QueueReleased(A, 1, "interactive", 2.5, Q + 2.5), Q + 2.5)
    events.queue(QueueEnqueued(B, 1, "interactive", False, None, None, None, Q + 4), Q + 4)
    events.queue(QueueDispatched(B, 1, "interactive", 0.0, Q + 4, _decision()), Q + 4)
    ledger.add(host, LedgerDenied(B, 400, "me", 90, "budget exhausted", 90, 300, 300), T + 4.3)
    events.queue(QueueReleased(B, 1, "interactive", 0.01, Q + 4.01), Q + 4.01)


def test_whatif_of_a_log_whose_ledger_is_its_own_file_reads_the_recorded_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 19: the tour's layout (ledger in its own file) replays as if it were one log.

    The ledger is shared with another daemon (owner ``them``): its rows are not this log's,
    and the report equals that of the same run recorded in one log.
    """
    one = Log(tmp_path / "one.db")
    _one_daemons_run(one, one, None)
    one.store.close()
    split, ledger = Log(tmp_path / "events.db"), Log(tmp_path / "ledger.db")
    _one_daemons_run(split, ledger, str(tmp_path / "ledger.db"))
    split.store.close()
    ledger.store.close()
    assert main(["whatif", str(tmp_path / "one.db"), "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert main(["whatif", str(tmp_path / "events.db"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["recorded_settings"]["budget"] == 300  # was: "budget unknown (0)"
    assert report["happened"]["by_key"][B]["refusals"] == 1
    assert "llamacpp:x:0" not in report["happened"]["by_key"]
    assert report == alone


# -- what no request asked for: crashes and unloads, replayed where they happened --------------


def test_a_crash_between_two_requests_frees_the_room_the_next_would_have_evicted() -> None:
    requests = [Request(0.0, A, 1.0), Request(3.0, B, 1.0, after=0, gap=2.0)]
    plain = run(requests, 15)
    assert (plain.by_key[A].evictions, plain.by_key[B].cold_starts) == (1, 1)
    crashed = run(requests, 15, outside=[Outside(2.0, A, "crashed", after=0, gap=1.0)])
    assert crashed.by_key[A].evictions == 0  # gone by itself: nothing was evicted for b
    assert (crashed.by_key[A].cold_starts, crashed.by_key[B].cold_starts) == (1, 1)
    again = [*requests, Request(6.0, A, 1.0, after=1, gap=2.0)]
    back = run(again, 25, outside=[Outside(2.0, A, "unloaded", after=0, gap=1.0)])
    assert back.by_key[A].cold_starts == 2  # unloaded by hand: its next request starts it


def test_an_outside_event_for_an_engine_the_replay_has_down_changes_nothing() -> None:
    requests = [Request(0.0, A, 1.0), Request(3.0, B, 1.0, after=0, gap=2.0)]
    ghost = [Outside(2.0, C, "crashed", after=0, gap=1.0), Outside(0.0, B, "unloaded")]
    assert run(requests, 15, outside=ghost) == run(requests, 15)


def test_the_workload_places_crashes_and_asked_for_unloads_after_the_request_before_them(
    tmp_path: Path,
) -> None:
    log = Log(tmp_path / "events.db")
    log.queue(QueueEnqueued(A, 1, "interactive", False, None, None, None, Q), Q)
    log.queue(QueueDispatched(A, 1, "interactive", 0.0, Q, _decision()), Q)
    log.queue(QueueReleased(A, 1, "interactive", 1.0, Q + 1), Q + 1)
    crash = {"exit_code": None, "signal": 9, "reached_ready": True, "retry_at": T + 2}
    _engine(log, A, EngineCrashed, T + 1.5, **crash, output_tail="")
    _engine(log, B, EngineStopRequested, T + 2.0, reason="evicted", decision={"rule": "PP6"})
    _engine(log, C, EngineStopRequested, T + 2.5, reason="evicted", decision={"rule": "PP4"})
    log.store.close()
    workload = workload_from(_rows(tmp_path / "events.db"))
    assert [(o.key, o.kind, o.after) for o in workload.outside] == [
        (A, "crashed", 0),
        (B, "unloaded", 0),
    ]  # the PP4 eviction is the pool's own decision, replayed by the simulator
    # 1.5 s after the request's end, less the queue events' least delay in this log (0.1 s),
    # which is how the workload puts the queue's clock on the engines' (PM21)
    assert workload.outside[0].gap == pytest.approx(0.4)


def test_budget_changes_are_what_the_next_decision_enforced_placed_when_they_were_made(
    tmp_path: Path,
) -> None:
    log = Log(tmp_path / "events.db")
    host = "ledger/host"
    log.queue(QueueEnqueued(A, 1, "interactive", False, None, None, None, Q), Q)
    log.queue(QueueDispatched(A, 1, "interactive", 0.0, Q, _decision()), Q)
    log.add(host, LedgerReserved(A, 100, "me", 0, 0, 150, 150, True), T + 0.2)
    log.queue(QueueReleased(A, 1, "interactive", 1.0, Q + 1), Q + 1)
    log.add(host, LedgerBudgetSet(80), T + 3.0)  # asked 80; the decision enforced 400 (a floor)
    log.queue(QueueEnqueued(B, 1, "interactive", False, None, None, None, Q + 5), Q + 5)
    log.queue(QueueDispatched(B, 1, "interactive", 0.0, Q + 5, _decision()), Q + 5)
    log.add(host, LedgerReserved(B, 100, "me", 100, 0, 400, 400, True), T + 5.2)
    log.queue(QueueReleased(B, 1, "interactive", 1.0, Q + 6), Q + 6)
    log.store.close()
    workload = workload_from(_rows(tmp_path / "events.db"))
    assert workload.first_budget == 150
    (change,) = [o for o in workload.outside if o.kind == "budget"]
    assert (change.bytes, change.after, change.key) == (400, 0, "")
    assert change.gap == pytest.approx(3.0 - 1.0 - 0.1)  # after a's end, on the engines' clock
    assert workload.settings.budget == 400 and workload.settings.follow_budget
    followed = simulate(workload, workload.settings)
    assert followed.by_key[A].evictions == 0  # the raise came first: b fits beside a
    fixed = simulate(workload, Settings(150))  # a budget given holds throughout
    assert fixed.by_key[A].evictions == 1
