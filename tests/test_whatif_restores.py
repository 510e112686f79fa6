"""CC13 in the what-if: a session's restore from its file, from the log (issue 20, D5).

The workload learns which engines keep their sessions across a stop and what a restore cost
(the median of ``cache.restored``), and takes the restore a request paid out of its work as
it takes its cold start out. The simulator restores a session whose engine stopped since its
last turn there (a stop saved it; a crash lost it), as part of the client's whole wait, and
counts restores beside evictions and cold starts; the recorded figures count them from the log.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hostler.events.cache import CacheRestored, CacheSaved
from hostler.events.queue import QueueDispatched, QueueEnqueued, QueueReleased
from hostler.postmortem.figures import Waits, recorded_figures
from hostler.postmortem.whatif import simulate
from hostler.postmortem.workload import Model, Outside, Request, Settings, Workload, workload_from
from test_whatif import A, B, Log, Q, T, _decision, _rows

SESSION_TURN = 1.0


def workload(requests: list[Request], restore: float | None, **kw: object) -> Workload:
    table = {
        A: Model(A, 10, 10, 2.0, 0.0, 0.0, restore),
        B: Model(B, 10, 10, 2.0, 0.0, 0.0, None),
    }
    return Workload(tuple(requests), table, Settings(10), **kw)  # type: ignore[arg-type]


def conversation() -> list[Request]:
    """Session ana on a, a one-shot on b (which evicts a under a budget for one), ana again."""
    return [
        Request(0.0, A, SESSION_TURN, "ana"),
        Request(10.0, B, 1.0),
        Request(20.0, A, SESSION_TURN, "ana"),
    ]


def test_a_session_back_on_its_reloaded_engine_is_restored_as_part_of_its_wait() -> None:
    figures = simulate(workload(conversation(), 0.25), Settings(10))
    assert figures.by_key[A].restores == 1 and figures.total.restores == 1
    assert figures.by_key[A].cold_starts == 2 and figures.by_key[A].evictions == 1
    # its whole wait: the reload (2 s) and the restore (0.25 s); the first turn only the load
    assert figures.by_key[A].served == Waits(2, 2.125, 2.25, 2.25)
    assert figures.as_dict()["by_key"][A]["restores"] == 1


def test_room_for_both_keeps_the_session_in_memory_and_restores_nothing() -> None:
    figures = simulate(workload(conversation(), 0.25), Settings(20))
    assert figures.by_key[A].restores == 0 and figures.by_key[A].evictions == 0
    assert figures.by_key[A].served.max == pytest.approx(2.0)  # only the first load


def test_an_engine_that_keeps_no_session_restores_none() -> None:
    figures = simulate(workload(conversation(), None), Settings(10))
    assert figures.by_key[A].restores == 0 and figures.by_key[A].cold_starts == 2


def test_a_crash_loses_what_the_engine_held_and_a_one_shot_is_never_restored() -> None:
    requests = [
        Request(0.0, A, SESSION_TURN, "ana"),
        Request(5.0, A, 1.0),  # a one-shot: nothing to restore
        Request(20.0, A, SESSION_TURN, "ana"),
    ]
    crash = (Outside(0.0, A, "crashed", after=1, gap=1.0),)
    crashed = simulate(workload(requests, 0.25, outside=crash), Settings(10))
    assert crashed.by_key[A].restores == 0  # the crash lost ana's cache: a cold turn
    unload = (Outside(0.0, A, "unloaded", after=1, gap=1.0),)
    unloaded = simulate(workload(requests, 0.25, outside=unload), Settings(10))
    assert unloaded.by_key[A].restores == 1  # an unload saved it first


def test_the_workload_learns_the_restore_and_takes_it_out_of_the_work(tmp_path: Path) -> None:
    log = Log(tmp_path / "events.db")
    log.queue(QueueEnqueued(A, 1, "interactive", False, "ana", None, None, Q), Q)
    log.queue(QueueDispatched(A, 1, "interactive", 0.0, Q, _decision()), Q)
    log.queue(QueueReleased(A, 1, "interactive", 1.0, Q + 1.0), Q + 1.0)
    log.add(f"cache/{A}", CacheSaved(A, "ana", "evicted", 100, 2300, 0.01), T + 2.0)
    log.queue(QueueEnqueued(A, 2, "interactive", False, "ana", None, None, Q + 10), Q + 10)
    log.queue(QueueDispatched(A, 2, "interactive", 0.0, Q + 10, _decision()), Q + 10)
    log.add(f"cache/{A}", CacheRestored(A, "ana", 100, 0.3), T + 10.2)
    log.queue(QueueReleased(A, 2, "interactive", 1.5, Q + 11.5), Q + 11.5)
    log.queue(QueueEnqueued(A, 3, "interactive", False, "bo", None, None, Q + 20), Q + 20)
    log.queue(QueueDispatched(A, 3, "interactive", 0.0, Q + 20, _decision()), Q + 20)
    log.add(f"cache/{A}", CacheRestored(A, "bo", 0, 0.1, error="llama-server did not"), T + 20.1)
    log.queue(QueueReleased(A, 3, "interactive", 1.0, Q + 21), Q + 21)
    log.store.close()
    rows = _rows(tmp_path / "events.db")
    found = workload_from(rows)
    assert found.models[A].restore == pytest.approx(0.3)  # the failed restore is no cost
    first, second, third = found.requests
    assert first.work == pytest.approx(1.0)
    assert second.work == pytest.approx(1.2)  # ran 1.5 s, of which 0.3 s restored ana
    assert third.work == pytest.approx(1.0)
    assert recorded_figures(rows).by_key[A].restores == 1
