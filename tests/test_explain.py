"""``hostler explain``'s core on synthetic logs: each decision's sentence, targets, windows, edges.

The events are the registered classes appended to a real SQLite :class:`EventStore` whose clock
is a fake (so recorded times are exact); the log recorded by real engines is in
``test_explain_real.py``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from hostler import EventStore
from hostler.cli import main
from hostler.errors import UsageError
from hostler.events.base import Event
from hostler.events.ledger import LedgerBudgetSet, LedgerDenied, LedgerReserved
from hostler.events.pool import PoolRoomPlanned
from hostler.events.queue import QueueCancelled, QueueDispatched, QueueEnqueued, QueueReleased
from hostler.events.router import SessionBound
from hostler.machines.engine import (
    EngineAdopted,
    EngineAdoptionStarted,
    EngineCrashed,
    EngineFailed,
    EngineLost,
    EngineReady,
    EngineSpawned,
    EngineStartRequested,
    EngineStopRequested,
)
from hostler.machines.lease import LeaseBroken, LeaseGranted, LeaseRequested
from hostler.machines.reservation import ReservationDenied, ReservationRequested
from hostler.postmortem.explain import (
    LEASE_NEAR,
    TARGET_KINDS,
    Finding,
    Target,
    explain,
    resolve_target,
)

T0 = datetime(2026, 11, 29, 14, 0, tzinfo=UTC)
MIB = 2**20
KEY = "llamacpp:qwen:0"


class Log:
    """A real log whose recorded time is set by the test (``tick``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.now = T0
        self.store = EventStore.open(path, clock=lambda: self.now)

    def add(self, stream: str, *events: Event, after: float = 1.0) -> int:
        self.now += timedelta(seconds=after)
        return self.store.append(stream, list(events), expected_version=None).seqs[-1]

    def findings(self, text: str, **window: Any) -> list[Finding]:
        records = list(self.store.read_all())
        return explain(records, resolve_target(text, records), **window)


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    made = Log(tmp_path / "events.db")
    yield made
    made.store.close()


def at(n: float) -> float:
    return T0.timestamp() + n


def start(log: Log, key: str = KEY, pid: int = 100) -> None:
    log.add(f"engine/{key}", EngineStartRequested("stopped", "starting", at(1), "request"))
    log.add(
        f"engine/{key}",
        EngineSpawned("starting", "starting", at(2), pid, at(2), "b", "t", "f", 4000),
    )
    log.add(f"engine/{key}", EngineReady("starting", "running", at(3.5)))


def texts(findings: list[Finding]) -> list[str]:
    return [f.text for f in findings]


def test_constants() -> None:
    assert LEASE_NEAR == 5.0
    assert TARGET_KINDS == ("engine", "model", "session", "request")


def test_a_start_is_told_with_its_plan_its_process_and_how_long_it_took(log: Log) -> None:
    seq = log.add(
        "ledger/host",
        LedgerReserved(KEY, 900 * MIB, "me", 0, 2048 * MIB, 4096 * MIB, 4096 * MIB, True),
    )
    start(log)
    found = log.findings(KEY)
    assert [f.kind for f in found] == ["admitted", "start", "spawned", "ready"]
    assert found[0].seq == seq and found[0].at == T0 + timedelta(seconds=1)
    assert found[0].text == (
        "admitted: reserved 900.0 MiB (held 0 B before); others held 2.0 GiB of the 4.0 GiB "
        "budget, leaving 1.1 GiB"
    )
    assert found[0].cause["committed_other"] == 2048 * MIB and found[0].cause["enforced"] is True
    assert found[2].text == "process started: pid 100, port 4000"
    assert found[3].text == "ready 2.5 s after its start was asked"
    assert found[3].cause["took"] == 2.5


def test_an_unenforced_budget_is_said(log: Log) -> None:
    log.add("ledger/host", LedgerReserved(KEY, MIB, "me", 0, 0, 500 * MIB, 500 * MIB, False))
    (found,) = log.findings(KEY)
    assert found.text.endswith("(budget not enforced: an explicit budget under 1 GiB)")


def test_refusals_cite_the_shortfall(log: Log) -> None:
    log.add(
        "ledger/host",
        LedgerDenied(KEY, 900 * MIB, "me", 300 * MIB, "budget", 3072 * MIB, 3584 * MIB, 3584 * MIB),
    )
    log.add(
        "pool/host",
        PoolRoomPlanned(
            at(5),
            KEY,
            900 * MIB,
            300 * MIB,
            [],
            None,
            False,
            {"candidates": [{"key": "x:y:0", "bytes": 100 * MIB, "draining": False}]},
        ),
    )
    log.add("reservation/" + KEY, ReservationRequested("new", "requested", at(6), MIB, "me"))
    log.add(
        "reservation/" + KEY,
        ReservationDenied("requested", "denied", at(7), 5 * MIB, "budget", 8 * MIB, 4 * MIB),
    )
    found = log.findings(KEY)
    assert [f.kind for f in found] == ["refused", "refused", "reserve", "refused"]
    assert found[0].text == (
        "refused: needed 900.0 MiB, 300.0 MiB short (budget); others held 3.0 GiB of the 3.5 GiB "
        "budget"
    )
    assert found[0].cause["shortfall"] == 300 * MIB
    assert found[1].text == (
        "refused: needed 900.0 MiB, 300.0 MiB short, and evicting every evictable engine would "
        "free only 100.0 MiB"
    )
    assert found[1].cause == {
        "wanted": 900 * MIB,
        "shortfall": 300 * MIB,
        "evictable": 100 * MIB,
        "reachable": False,
    }
    assert found[3].cause["shortfall"] == 5 * MIB


def _plan(policy: str, victims: list[str], drain: str | None = None) -> PoolRoomPlanned:
    candidates = [
        {"key": "llamacpp:a:0", "bytes": 1024 * MIB, "recent_hits": 0, "idle_for": 400.0},
        {"key": "llamacpp:b:0", "bytes": 512 * MIB, "recent_hits": 3, "idle_for": 2.5},
        {"key": "llamacpp:c:0", "bytes": MIB, "recent_hits": 1, "idle_for": 9.0, "busy": True},
    ]
    decision = {"eviction": policy, "eviction_version": 2, "candidates": candidates}
    return PoolRoomPlanned(at(9), KEY, 800 * MIB, 700 * MIB, victims, drain, True, decision)


def test_a_victim_is_told_why_it_and_not_the_others(log: Log) -> None:
    seq = log.add("pool/host", _plan("demand-lru", ["llamacpp:a:0", "llamacpp:b:0"]))
    (mine,) = log.findings("llamacpp:a:0")
    assert mine.seq == seq and mine.kind == "victim"
    assert mine.text == (
        f"chosen as a victim to make room for {KEY} (700.0 MiB short) by policy demand-lru v2: "
        "0 requests in the last 60 s, idle 6.7 min, 1.0 GiB vs llamacpp:b:0: 3 requests in the "
        "last 60 s, idle 2.5 s, 512.0 MiB; llamacpp:c:0: 1 request in the last 60 s, idle 9 s, "
        "1.0 MiB, busy; evicted with llamacpp:b:0"
    )
    assert mine.cause["victim"]["recent_hits"] == 0
    assert [o["key"] for o in mine.cause["others"]] == ["llamacpp:b:0", "llamacpp:c:0"]
    assert mine.cause["evicted_with"] == ["llamacpp:b:0"]
    assert mine.cause["demand_window"] == 60.0
    # the engine the room was for
    (room,) = log.findings(KEY)
    assert room.kind == "room" and room.cause["victims"] == ["llamacpp:a:0", "llamacpp:b:0"]
    assert room.text.endswith("(PP4, policy demand-lru v2)")
    # a candidate that was kept is not told it was chosen
    with pytest.raises(UsageError):
        log.findings("llamacpp:c:0")  # named only inside the decision: not an engine of the log


def test_a_drained_victim_is_told_so(log: Log) -> None:
    log.add("pool/host", _plan("lru", [], drain="llamacpp:c:0"))
    log.add("engine/llamacpp:c:0", EngineStartRequested("stopped", "starting", at(1), "request"))
    victim = [f for f in log.findings("llamacpp:c:0") if f.kind == "victim"]
    assert len(victim) == 1
    assert victim[0].text.startswith(
        "chosen as a victim to drain (every idle engine together was not enough) to make room"
    )
    (room,) = [f for f in log.findings(KEY) if f.kind == "room"]
    assert "evicting nothing and draining llamacpp:c:0" in room.text


@pytest.mark.parametrize(
    ("reason", "decision", "text"),
    [
        (
            "idle",
            {"rule": "SP4", "unused_for": 612.0, "idle_timeout": 600.0},
            "stop requested: idle (SP4): unused for 10.2 min, idle timeout 10.0 min",
        ),
        (
            "memory-pressure",
            {"rule": "SP5", "unused_for": 45.0, "pressure_idle": 30.0, "pressure": {"a": 1}},
            "stop requested: memory pressure (SP5): unused for 45 s, early-stop threshold 30 s "
            "under pressure",
        ),
        (
            "health-restart",
            {"rule": "SP3", "consecutive_failures": 3, "health_failures": 3},
            "stop requested: health restart (SP3): 3 failed probes in a row, limit 3",
        ),
        (
            "evicted",
            {"rule": "PP4", "for": "x:y:0", "drain": {"waited": 1.5}},
            "stop requested: evicted (PP4) to make room for x:y:0, after draining 1.5 s",
        ),
        (
            "evicted",
            {"rule": "PP9"},
            "stop requested: evicted (PP9): the pool is retiring, work done",
        ),
        (
            "evicted",
            {"rule": "PP10", "target": 1},
            "stop requested: evicted (PP10): above the replica target 1",
        ),
        ("evicted", {"rule": "PP6"}, "stop requested: evicted (PP6): unloaded while idle"),
        ("user", None, "stop requested: user"),
        ("shutdown", {"rule": "X1"}, "stop requested: shutdown (X1)"),
    ],
)
def test_stops_cite_their_rule_and_thresholds(
    log: Log, reason: str, decision: dict[str, Any] | None, text: str
) -> None:
    start(log)
    log.add(f"engine/{KEY}", EngineStopRequested("running", "stopping", at(9), reason, decision))
    stop = log.findings(KEY)[-1]
    assert stop.kind == "stop" and stop.text == text
    assert stop.cause["reason"] == reason


def test_a_crash_cites_its_panic_and_exit(log: Log) -> None:
    start(log)
    seq = log.add(
        f"engine/{KEY}",
        EngineCrashed(
            "running",
            "backoff",
            at(9),
            134,
            None,
            True,
            at(14),
            "cuda-oom",
            "CUDA error: oom",
            12.0,
        ),
    )
    log.add(f"engine/{KEY}", EngineStartRequested("backoff", "starting", at(15), "request"))
    crash, restart = log.findings(KEY)[-2:]
    assert crash.seq == seq
    assert crash.text == (
        "crashed: exit code 134; panic kind cuda-oom: 'CUDA error: oom'; after 12 s, had become "
        "ready"
    )
    assert crash.cause["panic_kind"] == "cuda-oom" and crash.cause["exit_code"] == 134
    assert restart.kind == "restart"
    assert restart.text == "restart requested after its crash (request)"


def test_a_crash_without_a_panic_or_status(log: Log) -> None:
    log.add(f"engine/{KEY}", EngineStartRequested("stopped", "starting", at(1), "request"))
    log.add(
        f"engine/{KEY}",
        EngineCrashed("starting", "backoff", at(2), None, None, False, at(3), None, None, None),
    )
    assert log.findings(KEY)[-1].text == (
        "crashed: exit status unknown; no panic line recognised in its output; never became ready"
    )


def test_a_failure_cites_the_restart_budget(log: Log) -> None:
    log.add(f"engine/{KEY}", EngineStartRequested("stopped", "starting", at(1), "request"))
    decision = {
        "rule": "SP1",
        "restart_budget": 5,
        "restart_window": 300.0,
        "lockout": 600.0,
        "recent_starts": [1, 2, 3, 4, 5],
    }
    log.add(
        f"engine/{KEY}",
        EngineFailed("starting", "fatal", at(2), "started 5 times within 300 s", at(602), decision),
    )
    failed = log.findings(KEY)[-1]
    assert failed.text == (
        "failed: started 5 times within 300 s (SP1: 5 starts within 5.0 min, restart budget 5, "
        "locked out 10.0 min)"
    )
    assert failed.cause["recent_starts"] == 5


def test_adoption_and_loss(log: Log) -> None:
    start(log)
    log.add(f"engine/{KEY}", EngineAdoptionStarted("running", "adopting", at(9), 77))
    log.add(f"engine/{KEY}", EngineAdopted("adopting", "running", at(10), 100))
    log.add(f"engine/{KEY}", EngineAdoptionStarted("running", "adopting", at(11), 78))
    log.add(f"engine/{KEY}", EngineLost("adopting", "stopped", at(12), "pid reused"))
    kinds = [f.kind for f in log.findings(KEY)[-4:]]
    assert kinds == ["adopting", "adopted", "adopting", "lost"]
    assert log.findings(KEY)[-1].text == "lost: pid reused"


def test_leases_are_told_while_the_engine_is_up_and_never_before(log: Log) -> None:
    log.add("lease/zero", LeaseRequested("new", "waiting", at(0), "image", "early"))
    log.add("lease/zero", LeaseGranted("waiting", "held", at(0), at(99)))
    start(log)
    log.add("lease/one", LeaseRequested("new", "waiting", at(5), "video", "comfy"))
    log.add("lease/one", LeaseGranted("waiting", "held", at(5), at(99)))
    log.add("lease/one", LeaseBroken("held", "broken", at(6), "stale", 95.0))
    leases = [f for f in log.findings(KEY) if f.kind == "lease"]
    assert texts(leases) == [
        "GPU lease one granted to comfy (slot video) while it was up",
        "GPU lease one of comfy (slot video) broken: stale, stale for 95 s",
    ]
    assert leases[0].subject == KEY


@pytest.mark.parametrize(("gap", "cited"), [(LEASE_NEAR, True), (LEASE_NEAR + 0.01, False)])
def test_an_unload_is_tied_to_a_lease_granted_at_most_five_seconds_before(
    log: Log, gap: float, cited: bool
) -> None:
    start(log)
    log.add("lease/one", LeaseRequested("new", "waiting", at(5), "image", "comfy"))
    grant = log.add("lease/one", LeaseGranted("waiting", "held", at(5), at(99)))
    log.add(
        f"engine/{KEY}",
        EngineStopRequested("running", "stopping", at(9), "evicted", {"rule": "PP6"}),
        after=gap,
    )
    stop = log.findings(KEY)[-1]
    assert ("lease_seq" in stop.cause) is cited
    if cited:
        assert stop.cause["lease_seq"] == grant
        assert stop.text.endswith(
            f"GPU lease one (slot image, holder comfy) was granted (seq {grant})"
        )


def _requests(log: Log) -> None:
    log.add("router/host", SessionBound(at(1), "s1", KEY, "first", {KEY: 0}))
    start(log)
    q = f"queue/{KEY}"
    log.add(q, QueueEnqueued(KEY, 1, "interactive", False, "s1", None, None, 1.0))
    log.add(q, QueueEnqueued(KEY, 2, "background", False, "s2", None, None, 1.0))
    log.add(q, QueueDispatched(KEY, 1, "interactive", 0.25, 1.25, {"rule": "oldest"}))
    log.add(q, QueueCancelled(KEY, 2, "background", "timeout", 30.0, 31.0))
    log.add(q, QueueReleased(KEY, 1, "interactive", 4.0, 5.25))


def test_a_session_is_told_its_binding_its_requests_and_its_engine(log: Log) -> None:
    _requests(log)
    found = log.findings("s1")
    assert [(f.subject, f.kind) for f in found] == [
        (KEY, "bound"),
        (KEY, "start"),
        (KEY, "spawned"),
        (KEY, "ready"),
        (f"{KEY}#1", "enqueued"),
        (f"{KEY}#1", "dispatched"),
        (f"{KEY}#1", "done"),
    ]
    assert found[5].text.startswith("got its slot after waiting 250 ms (Q4 rule oldest")
    assert found[6].text == "ran 4 s and gave its slot back"


def test_a_request_is_told_alone_and_the_engines_story_keeps_only_cancellations(
    log: Log,
) -> None:
    _requests(log)
    found = log.findings(f"{KEY}#2")
    assert [f.kind for f in found] == ["enqueued", "cancelled"]
    assert found[1].text == "left the queue without running (timeout) after 30 s"
    engine = log.findings(KEY)
    assert [f.kind for f in engine if f.subject.startswith(KEY + "#")] == ["cancelled"]
    assert engine[0].kind == "bound"


def test_targets_resolve_in_order_and_explicit_kinds_win(log: Log) -> None:
    _requests(log)
    log.add("engine/llamacpp:qwen:1", EngineStartRequested("stopped", "starting", at(1), "r"))
    log.add("engine/llamacpp:qwen2:0", EngineStartRequested("stopped", "starting", at(1), "r"))
    log.add("router/host", SessionBound(at(1), "qwen", "llamacpp:qwen2:0", "first", {}))
    records = list(log.store.read_all())
    both = frozenset({KEY, "llamacpp:qwen:1"})
    assert resolve_target(KEY, records) == Target("engine", KEY, frozenset({KEY}))
    assert resolve_target("qwen", records) == Target("model", "qwen", both)
    assert resolve_target("llamacpp:qwen", records).keys == both
    assert resolve_target("session=qwen", records) == Target(
        "session", "session=qwen", frozenset({"llamacpp:qwen2:0"}), session="qwen"
    )
    assert resolve_target(f"{KEY}#1", records) == Target(
        "request", f"{KEY}#1", frozenset({KEY}), request=1
    )
    assert resolve_target("s2", records).kind == "session"
    with pytest.raises(UsageError, match=r"no request in this log matches"):
        resolve_target(f"request={KEY}#9", records)
    with pytest.raises(UsageError, match=r"no engine in this log matches 'engine=qwen'"):
        resolve_target("engine=qwen", records)


def test_an_unknown_target_says_what_was_searched(log: Log) -> None:
    _requests(log)
    records = list(log.store.read_all())
    with pytest.raises(UsageError) as caught:
        resolve_target("mistral", records)
    assert caught.value.message == (
        "explain: nothing in this log matches 'mistral'; searched 1 engine keys (and their "
        "models), 2 sessions and 2 queued requests (KEY#N); engines seen: llamacpp:qwen:0"
    )
    for empty in ("", "   ", "x" * 401):
        with pytest.raises(UsageError, match="give an engine key"):
            resolve_target(empty, records)


def test_a_window_keeps_its_findings_and_remembers_what_came_before(log: Log) -> None:
    log.add("lease/one", LeaseRequested("new", "waiting", at(0), "image", "comfy"))
    start(log)
    log.add("lease/one", LeaseGranted("waiting", "held", at(5), at(99)))
    everything = log.findings(KEY)
    moment = everything[-1].at
    later = log.findings(KEY, since=moment)
    assert [f.kind for f in later] == ["lease"] and "comfy" in later[0].text
    earlier = log.findings(KEY, until=moment - timedelta(microseconds=1))
    assert [f.kind for f in earlier] == ["start", "spawned", "ready"]
    assert log.findings(KEY, since=moment, until=moment) == later


def test_budget_settings_are_context_for_engines_not_sessions(log: Log) -> None:
    _requests(log)
    log.add("ledger/host", LedgerBudgetSet(8 * 1024 * MIB))
    log.add("ledger/host", LedgerBudgetSet(None))
    assert texts(log.findings(KEY))[-2:] == [
        "memory budget set to 8.0 GiB",
        "memory budget set to automatic",
    ]
    assert all(f.kind != "budget" for f in log.findings("s1"))


def test_finding_line_and_json() -> None:
    finding = Finding(7, T0, KEY, "stop", "stop requested: user", {"reason": "user"})
    assert finding.line() == f"2026-11-29 14:00:00.000  seq 7       {KEY}: stop requested: user"
    assert finding.as_json() == {
        "seq": 7,
        "at": "2026-11-29T14:00:00+00:00",
        "subject": KEY,
        "kind": "stop",
        "text": "stop requested: user",
        "cause": {"reason": "user"},
    }


def test_the_cli_prints_json_reports_damage_and_refuses_unknown_targets(
    log: Log, capsys: pytest.CaptureFixture[str]
) -> None:
    start(log)
    log.add(f"engine/{KEY}", EngineStopRequested("running", "stopping", at(9), "user"))
    log.store.close()
    db = str(log.path)
    assert main(["explain", KEY, "--db", db, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["target"] == {
        "text": KEY,
        "kind": "engine",
        "keys": [KEY],
        "session": None,
        "request": None,
    }
    assert [f["kind"] for f in document["findings"]] == ["start", "spawned", "ready", "stop"]
    with sqlite3.connect(log.path) as conn:
        conn.execute("DROP TRIGGER IF EXISTS events_no_update")
        triggers = [
            r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='trigger'")
        ]
        for name in triggers:
            conn.execute(f"DROP TRIGGER {name}")
        conn.execute("UPDATE events SET payload = 'garbage' WHERE seq = 2")
    assert main(["explain", KEY, "--db", db]) == 1
    out, err = capsys.readouterr()
    assert "seq 2: payload is not JSON" in err
    assert out.splitlines()[0] == f"engine {KEY}: 3 decisions"
    assert main(["explain", "qwen", "--db", db]) == 1  # a model names the keys it covers
    assert capsys.readouterr().out.splitlines()[0] == f"model qwen ({KEY}): 3 decisions"
    assert main(["explain", "nothing-here", "--db", db]) == 2
    assert "hostler: error [usage.invalid]: explain: nothing in this log matches" in (
        capsys.readouterr().err
    )
    assert main(["explain", KEY, "--db", db, "--since", "2h", "--until", "3h"]) == 2
    assert "--since is after --until" in capsys.readouterr().err
