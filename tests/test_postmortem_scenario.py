"""One recorded scenario, asked every post-mortem question: explain, verify, what-if, timeline.

The log comes from :func:`_scenario.record_scenario` (recorded once per session, each test
reading a copy: the ``scenario`` fixture in conftest.py): real ``llama-server`` engines under a
budget for two of three, three evictions for room, one SIGKILL crash and a restart, one GPU
lease in swap mode, one start refused by a cut budget. The tests check that the log alone tells what the scenario did (the
:class:`_scenario.Scenario` the recording returns is the witness), that every decision
re-derives, and that changing a policy constant changes exactly the decisions an independent
computation says it must.
"""

from __future__ import annotations

import json
import signal
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from _scenario import Scenario, key_of
from hostler import EventStore
from hostler.cli import main
from hostler.machines.engine import made_room
from hostler.policies import pool as pool_policy
from hostler.postmortem.verify import verify_records

pytestmark = pytest.mark.slow

ALPHA, BETA, GAMMA = key_of("alpha"), key_of("beta"), key_of("gamma")


def rows(log: Path, *types: str) -> list[tuple[int, str, dict[str, Any]]]:
    with EventStore.open(log) as store:
        return [(r.seq, r.stream_id, r.payload) for r in store.read_all(types=list(types))]


def explained(capsys: pytest.CaptureFixture[str], log: Path, target: str) -> list[dict[str, Any]]:
    assert main(["explain", target, "--db", str(log), "--json"]) == 0
    findings: list[dict[str, Any]] = json.loads(capsys.readouterr().out)["findings"]
    return findings


def test_the_scenario_did_what_it_says(scenario: Scenario) -> None:
    # the witness, from outside the log: each engine evicted once, in this order
    assert scenario.evicted == [(BETA, GAMMA), (GAMMA, BETA), (ALPHA, GAMMA)]
    assert scenario.crashed == BETA and scenario.crashed_pid > 0
    assert scenario.budget > 0
    assert scenario.refused == GAMMA
    assert [p["key"] for _, _, p in rows(scenario.log, "ledger.denied")] == [GAMMA]


def test_explain_tells_each_engines_evictions_crash_and_lease(
    scenario: Scenario, capsys: pytest.CaptureFixture[str]
) -> None:
    (grant,) = rows(scenario.log, "lease.granted")
    (crash,) = rows(scenario.log, "engine.crashed")
    for key in scenario.keys:
        story = explained(capsys, scenario.log, key)
        seqs = [f["seq"] for f in story]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        kinds = [f["kind"] for f in story]
        # every start was admitted first, and ended in a stop or the crash
        assert kinds.count("admitted") == kinds.count("start") + kinds.count("restart") > 0
        evictions = [f for f in story if f["kind"] == "stop" and f["cause"].get("rule") == "PP4"]
        assert [f["cause"]["for"] for f in evictions] == [
            wanted for victim, wanted in scenario.evicted if victim == key
        ]
        victims = [f for f in story if f["kind"] == "victim"]
        assert len(victims) == len(evictions) == 1
        cause = victims[0]["cause"]
        assert cause["policy"] == "demand-lru" and cause["for_key"] == evictions[0]["cause"]["for"]
        mine, others = cause["victim"], cause["others"]
        assert len(others) == 1  # two engines resident, one chosen
        # the victim was the less wanted, or as wanted and used longer ago
        assert (mine["recent_hits"], -mine["idle_for"]) < (
            others[0]["recent_hits"],
            -others[0]["idle_for"],
        )
    beta = explained(capsys, scenario.log, BETA)
    (crashed,) = [f for f in beta if f["kind"] == "crashed"]
    assert crashed["seq"] == crash[0] and crashed["cause"]["signal"] == signal.SIGKILL
    assert crashed["cause"]["reached_ready"] is True
    (restart,) = [f for f in beta if f["kind"] == "restart"]
    assert restart["seq"] > crashed["seq"]
    # the lease unloaded both llm engines then resident, and the story names its holder
    for key in (BETA, GAMMA):
        (unload,) = [
            f
            for f in explained(capsys, scenario.log, key)
            if f["kind"] == "stop" and f["cause"].get("rule") == "GA1"
        ]
        assert unload["seq"] > grant[0] and unload["cause"]["lease_seq"] == grant[0]
        assert unload["cause"]["holder"] == scenario.lease_holder
        assert unload["cause"]["slot"] == "image"
        assert "unloaded (GA1): its GPU slot (llm) gave the card" in unload["text"]
    assert not [
        f
        for f in explained(capsys, scenario.log, ALPHA)
        if f["kind"] == "stop" and f["cause"].get("rule") == "GA1"
    ]  # alpha was not resident when the lease came


def test_verify_finds_no_difference(scenario: Scenario) -> None:
    with EventStore.open(scenario.log) as store:
        report = verify_records(store.read_all())
    assert report.differences == [] and report.unreadable == []
    assert report.by_kind["pool.room_planned/PP4"] == len(rows(scenario.log, "pool.room_planned"))
    assert report.by_kind["engine.stop_requested/PP4"] == 3
    assert report.rederived == sum(report.by_kind.values()) > 3


def lru_victim(plan: dict[str, Any]) -> str:
    """The victim plain LRU picks among a plan's candidates: the longest idle."""
    candidates = plan["decision"]["candidates"]
    return str(max(candidates, key=lambda c: c["idle_for"])["key"])


def test_a_changed_demand_window_differs_exactly_where_lru_would_have_chosen_otherwise(
    scenario: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    plans = [(seq, p) for seq, _, p in rows(scenario.log, "pool.room_planned") if p["evict"]]
    assert len(plans) == 3
    stops = [
        (seq, stream.removeprefix("engine/"), p["decision"]["for"])
        for seq, stream, p in rows(scenario.log, "engine.stop_requested")
        if made_room(p["reason"], p["decision"])
    ]
    expected: set[int] = set()
    for seq, plan in plans:
        (victim,) = plan["evict"]
        if lru_victim(plan) != victim:
            expected.add(seq)  # the plan, and the stop of the victim it no longer chooses
            expected.add(
                min(
                    s
                    for s, key, wanted in stops
                    if s > seq and key == victim and wanted == plan["for_key"]
                )
            )
    assert len(expected) == 4  # the first two evictions: alpha was older but wanted more
    monkeypatch.setattr(pool_policy, "DEMAND_WINDOW", 1e-6)  # no request is recent: plain LRU
    with EventStore.open(scenario.log) as store:
        report = verify_records(store.read_all())
    assert {d.seq for d in report.differences} == expected
    for difference in report.differences:
        if difference.type == "pool.room_planned":
            assert difference.rederived is not None
            assert difference.rederived["evict"] == [ALPHA]


def whatif(capsys: pytest.CaptureFixture[str], log: Path, budget: int) -> dict[str, Any]:
    assert main(["whatif", str(log), "--budget", str(budget), "--json"]) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


def test_whatif_counts_the_evictions_and_moves_with_the_budget(
    scenario: Scenario, capsys: pytest.CaptureFixture[str]
) -> None:
    same = whatif(capsys, scenario.log, scenario.budget)
    evictions = len(scenario.evicted)
    assert same["happened"]["total"]["evictions"] == evictions  # lease unloads are not evictions
    assert same["replayed"]["total"]["evictions"] == evictions
    assert same["whatif"]["total"]["evictions"] == evictions
    assert whatif(capsys, scenario.log, 10 * scenario.budget)["whatif"]["total"]["evictions"] == 0
    smaller = whatif(capsys, scenario.log, int(scenario.budget * 0.5))  # one engine at a time
    assert smaller["whatif"]["total"]["evictions"] > evictions


def test_the_timeline_shows_every_engine_the_budget_and_each_marker(
    scenario: Scenario, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    picture = tmp_path / "scenario.svg"
    assert main(["timeline", str(scenario.log), "-o", str(picture)]) == 0
    capsys.readouterr()
    root = ET.fromstring(picture.read_bytes())  # noqa: S314 - our own picture
    ids = {e.get("id", "") for e in root.iter()} - {""}
    for key in scenario.keys:
        assert {f"engine-{key}", f"engine-{key}-measured"} <= ids
    assert "budget" in ids
    evicted = [
        seq
        for seq, _, p in rows(scenario.log, "engine.stop_requested")
        if made_room(p["reason"], p["decision"])
    ]
    assert len(evicted) == 3
    assert {f"marker-evicted-{seq}" for seq in evicted} <= ids
    ((crash, _, _),) = rows(scenario.log, "engine.crashed")
    ((grant, _, _),) = rows(scenario.log, "lease.granted")
    assert {f"marker-crashed-{crash}", f"lease-{grant}"} <= ids
