"""The re-derivers of ``hostler replay --verify``, one decision kind at a time, edges included.

Hand-built events (the shapes the runtime writes); the log recorded by the real runtime is
checked in tests/test_verify.py. Fast: ``bench/mutate.py postmortem.verify`` runs this file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

import pytest

import hostler.policies.cache as cache_policy
import hostler.policies.pool as pool_policy
from hostler.capacity.ledger import CO_RESIDENCY_SUFFIX
from hostler.events.base import Event, UnknownEvent
from hostler.events.cache import CacheEvicted
from hostler.events.ledger import LedgerDenied, LedgerReserved
from hostler.events.pool import PoolDrainEnded, PoolRoomPlanned
from hostler.events.queue import (
    QueueCancelled,
    QueueDispatched,
    QueueEnqueued,
    QueueMoved,
    QueueReleased,
)
from hostler.events.router import SessionBound
from hostler.machines.engine import EngineFailed, EngineStopRequested
from hostler.machines.lease import LeaseBroken
from hostler.policies.eviction import RankedPolicy
from hostler.postmortem.verify import (
    OPERATOR_RULES,
    REDERIVERS,
    Context,
    Rederived,
    rederive,
    verify_records,
)


def candidate(
    key: str,
    size: int,
    idle_for: float,
    hit_ages: list[float] | None = None,
    *,
    busy: bool = False,
    draining: bool = False,
    recent_hits: int | None = None,
) -> dict[str, Any]:
    ages = hit_ages or []
    out: dict[str, Any] = {
        "key": key,
        "bytes": size,
        "recent_hits": len(ages) if recent_hits is None else recent_hits,
        "idle_for": idle_for,
        "busy": busy,
        "draining": draining,
    }
    if hit_ages is not None:
        out["hit_ages"] = hit_ages
    return out


def planned(
    candidates: list[dict[str, Any]],
    shortfall: int,
    evict: list[str],
    *,
    drain: str | None = None,
    reachable: bool = True,
    **extra: Any,
) -> PoolRoomPlanned:
    decision = {"rule": "PP4", "now": 1000.0, "candidates": candidates, **extra}
    return PoolRoomPlanned(
        1000.0, "x:new:0", shortfall, shortfall, evict, drain, reachable, decision
    )


def answer(out: Rederived | None) -> tuple[str, tuple[str, ...]]:
    assert out is not None
    return out.rule, out.differs()


def test_every_decision_kind_has_a_re_deriver() -> None:
    assert set(REDERIVERS) == {
        "pool.room_planned",
        "pool.drain_ended",
        "router.bound",
        "ledger.reserved",
        "ledger.denied",
        "engine.stop_requested",
        "engine.failed",
        "cache.evicted",
        "queue.dispatched",
        "lease.broken",
    }
    assert frozenset({"PP6", "PP9", "PP10", "GA1"}) == OPERATOR_RULES


def test_room_planned_agrees_and_differs_on_the_victims() -> None:
    cands = [candidate("a", 10, 5.0, [5.0, 7.0]), candidate("b", 10, 2.0, [2.0])]
    assert answer(rederive(planned(cands, 5, ["b"]), "pool/host")) == ("PP4", ())
    out = rederive(planned(cands, 5, ["a"]), "pool/host")
    assert answer(out) == ("PP4", ("evict",))
    assert out is not None and out.rederived is not None and out.rederived["evict"] == ["b"]
    # both needed: one eviction together, least wanted first
    assert answer(rederive(planned(cands, 15, ["b", "a"]), "pool/host")) == ("PP4", ())


def test_room_planned_edges_zero_shortfall_unreachable_busy_draining() -> None:
    cands = [candidate("a", 10, 5.0, []), candidate("b", 10, 1.0, [], busy=True)]
    assert answer(rederive(planned(cands, 0, []), "p")) == ("PP4", ())
    # too big even with everything gone: nothing evicted, unreachable
    out = rederive(planned(cands, 21, [], reachable=False), "p")
    assert answer(out) == ("PP4", ())
    # idle a cannot cover 15: busy b drains
    assert answer(rederive(planned(cands, 15, ["a"], drain="b"), "p")) == ("PP4", ())
    assert answer(rederive(planned(cands, 15, ["a"], drain=None), "p")) == ("PP4", ("drain",))
    # a draining candidate counts for nothing: exactly its bytes short is unreachable
    gone = [candidate("a", 10, 5.0, []), candidate("c", 10, 9.0, [], draining=True)]
    assert answer(rederive(planned(gone, 11, [], reachable=False), "p")) == ("PP4", ())
    assert answer(rederive(planned(gone, 10, ["a"]), "p")) == ("PP4", ())


def test_room_planned_demand_window_edge_from_hit_ages(monkeypatch: pytest.MonkeyPatch) -> None:
    # a: requests exactly 60 s ago (out of the window) and 1 s ago; b: 59 and 50 s ago
    cands = [
        candidate("a", 10, 1.0, [60.0, 1.0], recent_hits=1),
        candidate("b", 10, 50.0, [59.0, 50.0]),
    ]
    assert answer(rederive(planned(cands, 5, ["a"]), "p")) == ("PP4", ())
    monkeypatch.setattr(pool_policy, "DEMAND_WINDOW", 60.5)  # a's old request counts again: a
    # tie on demand, and b, unused longer, goes
    out = rederive(planned(cands, 5, ["a"]), "p")
    assert answer(out) == ("PP4", ("evict",))


def test_room_planned_old_records_fall_back_to_recent_hits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # no hit_ages (an older hostler): each counted request taken as made at `now`
    cands = [candidate("a", 10, 30.0, None, recent_hits=3), candidate("b", 10, 1.0, None)]
    cands[1]["recent_hits"] = 1
    assert answer(rederive(planned(cands, 5, ["b"]), "p")) == ("PP4", ())
    monkeypatch.setattr(pool_policy, "DEMAND_WINDOW", 0.0)  # no demand counts any more
    assert answer(rederive(planned(cands, 5, ["b"]), "p")) == ("PP4", ("evict",))


def test_room_planned_without_any_demand_figure_counts_none() -> None:
    bare = [candidate("a", 10, 30.0, None), candidate("b", 10, 1.0, None)]
    for c in bare:
        del c["recent_hits"]
    out = rederive(planned(bare, 5, ["a"]), "p")
    assert answer(out) == ("PP4", ())
    assert out is not None and out.rederived is not None
    assert out.rederived["demand"] == {"a": 0, "b": 0}
    assert out.recorded["demand"] == {"a": None, "b": None}
    assert out.note == ""  # no eviction_version recorded: taken as v1, the installed one


def test_room_planned_prefers_the_exact_observed_figures() -> None:
    # rounded idle_for says a tie; the exact last uses say a is older by a tenth of a ms
    cands = [candidate("b", 10, 5.0, []), candidate("a", 10, 5.0, [])]
    observed = {
        "a": {"last_used_at": 995.0, "hits": []},
        "b": {"last_used_at": 995.0001, "hits": []},
    }
    assert answer(rederive(planned(cands, 5, ["a"], observed=observed), "p")) == ("PP4", ())
    observed["a"]["last_used_at"] = 995.0002
    assert answer(rederive(planned(cands, 5, ["a"], observed=observed), "p")) == (
        "PP4",
        ("evict",),
    )


def test_room_planned_names_its_eviction_policy() -> None:
    # b has more demand but was used long ago: demand-lru keeps b, lru evicts it
    cands = [candidate("a", 10, 1.0, []), candidate("b", 10, 50.0, [50.0, 55.0])]
    assert answer(rederive(planned(cands, 5, ["a"]), "p")) == ("PP4", ())  # no name: demand-lru
    assert answer(rederive(planned(cands, 5, ["b"], eviction="lru"), "p")) == ("PP4", ())
    missing = rederive(planned(cands, 5, ["a"], eviction="biggest"), "p")
    assert missing is not None and missing.rederived is None
    assert "'biggest'" in missing.missing and missing.differs() == ()
    biggest = RankedPolicy("biggest", 2, lambda r: (-r.bytes, r.key))
    ctx = Context(eviction_policies={"biggest": biggest})
    out = rederive(planned(cands, 5, ["a"], eviction="biggest", eviction_version=1), "p", ctx)
    assert answer(out) == ("PP4", ())
    assert out is not None and out.note == "recorded by biggest v1; re-derived with v2"


def drain_ended(outcome: str, decision: dict[str, Any]) -> PoolDrainEnded:
    return PoolDrainEnded(1.0, "a", outcome, float(decision.get("waited", 0.0)), decision)


def test_drain_ended_re_derives_pp5_with_exact_times_when_recorded() -> None:
    idle = {"busy": False, "waited": 0.2, "drain_wait": 30.0}
    assert answer(rederive(drain_ended("evicted", idle), "p")) == ("PP5", ())
    assert answer(rederive(drain_ended("gone", idle), "p")) == ("PP5", ())
    busy = {"busy": True, "waited": 30.0, "drain_wait": 30.0}  # the deadline itself still waits
    assert answer(rederive(drain_ended("busy", busy), "p")) == ("PP5", ("action",))
    exact = {**busy, "started_at": 100.0, "now": 130.0004}  # rounded 30.0, truly past it
    assert answer(rederive(drain_ended("busy", exact), "p")) == ("PP5", ())


def test_drain_ended_without_inputs_or_abandoned_is_not_re_derivable() -> None:
    for outcome, decision in (("gone", {}), ("abandoned", {"busy": True}), ("odd", {"x": 1})):
        out = rederive(drain_ended(outcome, decision), "p")
        assert out is not None and out.rederived is None and out.missing
        assert out.differs() == ()


def bound(key: str, how: str, sessions: dict[str, int]) -> SessionBound:
    return SessionBound(1.0, "s", key, how, sessions)


def test_router_bound_re_derives_pp11() -> None:
    counts = {"e:m:0": 2, "e:m:1": 1}
    assert answer(rederive(bound("e:m:1", "balanced", counts), "r")) == ("PP11", ())
    assert answer(rederive(bound("e:m:0", "balanced", counts), "r")) == ("PP11", ("key",))
    tie = {"e:m:0": 1, "e:m:1": 1}  # ties: the first given (sorted)
    assert answer(rederive(bound("e:m:0", "balanced", tie), "r")) == ("PP11", ())
    assert answer(rederive(bound("e:m:0", "first", {"e:m:0": 0}), "r")) == ("PP11", ())
    assert answer(rederive(bound("e:m:2", "first", {"e:m:2": 0}), "r")) == ("PP11", ("key",))
    kept = rederive(bound("e:m:1", "kept", {"e:m:1": 0}), "r")
    assert kept is not None and kept.rule == "ER2" and kept.rederived is None
    broken = rederive(bound("nonsense", "balanced", {}), "r")
    assert broken is not None and broken.rederived is None and "ValueError" in broken.missing


def reserved(bytes_: int, committed_other: int, *, enforced: bool = True) -> LedgerReserved:
    return LedgerReserved("k", bytes_, "o", 0, committed_other, 100, 80, enforced)


def denied(bytes_: int, committed_other: int, shortfall: int, reason: str) -> LedgerDenied:
    return LedgerDenied("k", bytes_, "o", shortfall, reason, committed_other, 100, 80)


def test_ledger_admission_re_derives_cb7_at_the_edges() -> None:
    assert answer(rederive(reserved(100, 0), "l")) == ("CB7", ())  # alone: the whole budget
    assert answer(rederive(reserved(40, 40), "l")) == ("CB7", ())  # exactly the ceiling
    assert answer(rederive(reserved(41, 40), "l")) == ("CB7", ("granted", "shortfall", "reason"))
    assert answer(rederive(reserved(500, 500, enforced=False), "l")) == ("CB7", ())
    line = "budget exhausted: would commit 81 against 80" + CO_RESIDENCY_SUFFIX
    out = rederive(denied(41, 40, 1, line), "l")
    assert out is not None and out.rederived is not None
    assert out.differs() == (), out.rederived
    assert answer(rederive(denied(41, 40, 2, line), "l")) == ("CB7", ("shortfall",))
    assert answer(rederive(denied(40, 40, 0, line), "l")) == ("CB7", ("granted", "reason"))


def stop(reason: str, decision: dict[str, Any] | None) -> EngineStopRequested:
    return EngineStopRequested("running", "stopping", 1.0, reason, decision)


def test_supervision_stops_re_derive_sp3_sp4_sp5() -> None:
    idle = {"rule": "SP4", "now": 400.0, "last_used": 100.0, "idle_timeout": 300.0}
    assert answer(rederive(stop("idle", idle), "engine/k")) == ("SP4", ())
    early = {**idle, "now": 399.0}  # a second short of the timeout: no stop
    assert answer(rederive(stop("idle", early), "engine/k")) == ("SP4", ("stop",))
    off = {**idle, "idle_timeout": 0.0}
    assert answer(rederive(stop("idle", off), "engine/k")) == ("SP4", ("stop",))
    pressure = {"rule": "SP5", "now": 160.0, "last_used": 100.0, "pressure_idle": 60.0}
    assert answer(rederive(stop("memory-pressure", pressure), "engine/k")) == ("SP5", ())
    soon = {**pressure, "now": 159.9}
    assert answer(rederive(stop("memory-pressure", soon), "engine/k")) == ("SP5", ("stop",))
    health = {"rule": "SP3", "now": 1.0, "consecutive_failures": 3, "health_failures": 3}
    assert answer(rederive(stop("health-restart", health), "engine/k")) == ("SP3", ())
    fewer = {**health, "consecutive_failures": 2}
    assert answer(rederive(stop("health-restart", fewer), "engine/k")) == ("SP3", ("stop",))


def test_stops_no_policy_decided_are_not_decisions() -> None:
    assert rederive(stop("shutdown", None), "engine/k") is None
    assert rederive(stop("user", {}), "engine/k") is None
    for rule in ("PP6", "PP9", "PP10"):
        assert rederive(stop("evicted", {"rule": rule}), "engine/k") is None
    odd = rederive(stop("x", {"rule": "ZZ1"}), "engine/k")
    assert odd is not None and odd.rederived is None and "ZZ1" in odd.missing
    assert odd.rule == "ZZ1" and odd.recorded == {"stop": "x"}
    nameless = rederive(stop("x", {"now": 1.0}), "engine/k")
    assert nameless is not None and nameless.rule == "?" and "(none)" in nameless.missing
    malformed = rederive(stop("idle", {"rule": "SP4", "now": "soon"}), "engine/k")
    assert malformed is not None and malformed.rederived is None


def test_an_eviction_stop_re_derives_the_choice_and_the_drain() -> None:
    cands = [candidate("a", 10, 5.0, []), candidate("b", 10, 1.0, [])]
    verdict = {"busy": False, "waited": 0.0, "drain_wait": 30.0}
    why = {**planned(cands, 5, ["a"]).decision, "shortfall": 5, "for": "x", "drain": verdict}
    assert answer(rederive(stop("evicted", why), "engine/a")) == ("PP4", ())
    assert answer(rederive(stop("evicted", why), "engine/b")) == ("PP4", ("chosen",))
    busy = {**why, "drain": {"busy": True, "waited": 1.0, "drain_wait": 30.0}}
    assert answer(rederive(stop("evicted", busy), "engine/a")) == ("PP4", ("drain",))
    bare = rederive(stop("evicted", {**why, "drain": None}), "engine/a")
    assert bare is not None and bare.rederived is None


def test_a_spent_restart_budget_re_derives_sp1() -> None:
    decision = {
        "rule": "SP1",
        "now": 100.0,
        "restart_budget": 3,
        "restart_window": 60.0,
        "lockout": 60.0,
        "recent_starts": [40.0, 70.0, 90.0],  # 40 is exactly the window ago: it counts
    }
    failed = EngineFailed("backoff", "fatal", 100.0, "started 3 times within 60 s", 160.0, decision)
    assert answer(rederive(failed, "engine/k")) == ("SP1", ())
    fewer = replace(failed, decision={**decision, "recent_starts": [70.0, 90.0]})
    assert answer(rederive(fewer, "engine/k")) == ("SP1", ("allowed", "retry_at", "error"))
    assert rederive(replace(failed, decision=None), "engine/k") is None


def test_a_cache_eviction_re_derives_cc9(monkeypatch: pytest.MonkeyPatch) -> None:
    entries = [["s1", 50, 1.0, "normal"], ["s2", 50, 2.0, "low"], ["s3", 50, 3.0, "normal"]]
    decision = {"rule": "CC9", "budget": 150, "entries": entries}  # 150 of 150: high reached
    event = CacheEvicted("k", ["s1"], "watermark", decision)  # 100 left is under 0.8 x 150
    assert answer(rederive(event, "cache/k")) == ("CC9", ())
    monkeypatch.setattr(cache_policy, "HIGH_WATERMARK", 2.0)  # 150 is no longer high
    assert answer(rederive(event, "cache/k")) == ("CC9", ("evicted",))
    assert rederive(CacheEvicted("k", ["s1"], "clear", {}), "cache/k") is None
    bad = CacheEvicted("k", [], "watermark", {**decision, "entries": [["s", 1, 1.0, "top"]]})
    out = rederive(bad, "cache/k")
    assert out is not None and out.rederived is None


def test_a_lease_break_is_reported_missing_its_verdict() -> None:
    lease = rederive(LeaseBroken("held", "broken", 1.0, "held 700 s", 1.0), "lease/x")
    assert lease is not None and lease.rule == "GA4" and lease.rederived is None


def enqueued(i: int, at: float, lane: str = "interactive", session: str | None = None) -> Row:
    return Row(
        i, "queue/e", "queue.enqueued", QueueEnqueued("e", i, lane, False, session, None, None, at)
    )


def dispatched(
    seq: int, i: int, at: float, rule: str, pending: int, *, running: int = 0, **inputs: Any
) -> Row:
    decision: dict[str, Any] = {
        "rule": rule,
        "pending": pending,
        "running": running,
        "width": 1,
        "interactive_cap": 1,
        "background_cap": 1,
        "ambient_open": True,
    }
    if inputs:
        decision["inputs"] = {
            "now": at,
            "max_wait": 60.0,
            "window": 30.0,
            "affinity": True,
            "opted_out": [],
            **inputs,
        }
    return Row(
        seq,
        "queue/e",
        "queue.dispatched",
        QueueDispatched("e", i, "interactive", 0.0, at, decision),
    )


def test_a_dispatch_re_derives_from_the_folded_queue() -> None:
    rows = [
        enqueued(1, 0.0, session="s"),
        dispatched(2, 1, 0.0, "oldest", 1, now=0.0),
        enqueued(3, 1.0),
        enqueued(4, 2.0, session="s"),
        Row(5, "queue/e", "queue.released", QueueReleased("e", 1, "interactive", 3.0, 3.0)),
        dispatched(6, 4, 3.0, "affinity", 2, now=3.0),  # same session as what just ran
    ]
    report = verify_records(rows)
    assert report.by_kind["queue.dispatched/Q4"] == 2 and report.differences == []
    opted = [*rows[:5], dispatched(6, 4, 3.0, "affinity", 2, now=3.0, opted_out=[4])]
    out = verify_records(opted).differences
    assert [(f.seq, f.rederived) for f in out] == [(6, {"id": 3, "rule": "oldest"})]
    late = [*rows[:5], dispatched(6, 4, 63.0, "affinity", 2, now=63.0)]  # ran 60 s ago
    out = verify_records(late).differences  # past the window, and 3 starves (62 s >= 60 s)
    assert [(f.seq, f.rederived) for f in out] == [(6, {"id": 3, "rule": "starvation"})]
    moved = [*rows[:4], Row(7, "queue/e", "queue.moved", QueueMoved("e", 4, "up", 3, 2.5)), rows[4]]
    no_affinity = [*moved, dispatched(8, 4, 3.0, "oldest", 2, now=3.0, affinity=False)]
    assert verify_records(no_affinity).differences == []  # 4 was moved ahead of 3
    cancelled = Row(
        9,
        "queue/e",
        "queue.cancelled",
        QueueCancelled("e", 3, "interactive", "cancelled", 1.0, 2.6),
    )
    left = [*rows[:4], cancelled, rows[4], dispatched(10, 4, 3.0, "affinity", 1, now=3.0)]
    folded = verify_records(left)  # the cancel was folded: one queued, as recorded
    assert folded.differences == [] and folded.not_rederivable == [] and folded.rederived == 2


def test_a_dispatch_without_its_inputs_or_history_is_not_re_derivable() -> None:
    lone = rederive(QueueDispatched("e", 1, "interactive", 0.0, 1.0, {"rule": "oldest"}), "q")
    assert lone is not None and lone.rule == "Q4" and lone.rederived is None
    assert "settings" in lone.missing
    old = verify_records([enqueued(1, 0.0), dispatched(2, 1, 0.0, "oldest", 1)])
    assert [f.seq for f in old.not_rederivable] == [2] and old.rederived == 0
    gap = verify_records([enqueued(1, 0.0), dispatched(2, 1, 0.0, "oldest", 2, now=0.0)])
    assert "history" in gap.not_rederivable[0].why  # the log lost an enqueue: never "agree"
    busy = verify_records(
        [enqueued(1, 0.0), dispatched(2, 1, 0.0, "oldest", 1, running=1, now=0.0)]
    )
    assert busy.rederived == 0 and len(busy.not_rederivable) == 1
    history = rederive(dispatched(2, 1, 0.0, "oldest", 1, now=0.0).event, "queue/e")  # type: ignore[arg-type]
    assert history is not None and "history" in history.missing


def test_a_long_malformation_is_clipped() -> None:
    out = rederive(bound("x" * 500, "balanced", {}), "r")
    assert out is not None and out.missing.startswith("well-formed inputs (ValueError: ")
    assert len(out.missing) == len("well-formed inputs ()") + 200


def test_a_failure_without_a_known_rule_is_listed() -> None:
    odd = rederive(EngineFailed("a", "b", 1.0, "x", None, {"rule": "ZZ2"}), "engine/k")
    assert odd is not None and odd.rule == "ZZ2" and "ZZ2" in odd.missing
    bare = rederive(EngineFailed("a", "b", 1.0, "x", None, {"now": 1.0}), "engine/k")
    assert bare is not None and bare.rule == "?" and "(none)" in bare.missing


@dataclass
class Row:
    seq: int
    stream_id: str
    type: str
    event: Event | UnknownEvent
    damage: str = ""


def test_verify_records_counts_lists_and_orders() -> None:
    rows = [
        Row(1, "l", "ledger.reserved", reserved(10, 0)),
        Row(2, "l", "ledger.reserved", reserved(41, 40)),
        Row(3, "engine/k", "engine.stop_requested", stop("shutdown", None)),
        Row(4, "q", "queue.dispatched", QueueDispatched("e", 1, "interactive", 0, 1, {})),
        Row(5, "x", "x.y", UnknownEvent("x.y", 1, {}, "type not registered here")),
        Row(6, "x", "x.z", UnknownEvent("x.z", 1, {}, ""), damage="payload is not JSON"),
    ]
    report = verify_records(rows)
    assert report.rederived == 2 and report.differ == 1
    assert [f.seq for f in report.differences] == [2]
    assert [f.seq for f in report.not_rederivable] == [4]
    assert [(f.seq, f.why) for f in report.unreadable] == [
        (5, "type not registered here"),
        (6, "payload is not JSON"),
    ]
    assert report.summary() == (
        "2 decisions re-derived, 1 differ (by kind: ledger.reserved/CB7 2); "
        "1 not re-derivable; 2 rows unreadable"
    )
    data = report.as_dict()
    assert data["differ"] == 1 and data["differences"][0]["fields"] == [
        "granted",
        "shortfall",
        "reason",
    ]
    json.dumps(data)  # JSON-ready
