"""The serve terminal's story: each event kind folded into at most one line, pinned by value."""

from __future__ import annotations

from typing import Any

import pytest

from hostler.postmortem.story import DETAIL, STORY, TROUBLE, Story, StoryLine

A, B = "llamacpp:alpha:0", "llamacpp:beta:0"
OWNER = "hostler-daemon:1:2.0+3:boot"


def ev(kind: str, stream: str, seq: int = 1, **payload: Any) -> dict[str, Any]:
    return {"seq": seq, "stream": stream, "type": kind, "payload": payload}


def told(story: Story, *events: dict[str, Any]) -> list[tuple[int, str]]:
    lines = [story.tell(e) for e in events]
    return [(line.level, line.text) for line in lines if line is not None]


PP4 = {
    "policy": "pool",
    "rule": "PP4",
    "eviction": "demand-lru",
    "shortfall": 16 * 2**20,
    "candidates": [
        {"key": A, "bytes": 30 * 2**20, "recent_hits": 1, "idle_for": 0.5, "busy": False},
        {"key": "llamacpp:gamma:0", "bytes": 2**30, "recent_hits": 4, "idle_for": 2.0},
    ],
    "evict": [A],
    "drain": {"rule": "PP5", "busy": False, "waited": 0.0},
    "for": B,
}


def test_a_swap_reads_as_loading_ready_evicted_loading_ready() -> None:
    story = Story(owner=OWNER)
    lines = told(
        story,
        ev("queue.enqueued", f"queue/{A}", engine=A, id=1, lane="interactive", session_id="ana"),
        ev("engine.start_requested", f"engine/{A}", at=100.0, cause="session", from_state="stopped"),
        ev("engine.spawned", f"engine/{A}", at=100.01, pid=4242, port=5555),
        ev("engine.ready", f"engine/{A}", at=100.4),
        ev("queue.enqueued", f"queue/{B}", engine=B, id=1, lane="interactive", session_id=None),
        ev("pool.room_planned", "pool/host", for_key=B, wanted=2**25, shortfall=2**24,
           evict=[A], drain=None, reachable=True),
        ev("engine.stop_requested", f"engine/{A}", at=101.0, reason="evicted", decision=PP4),
        ev("engine.stopped", f"engine/{A}", at=101.1, exit_code=0, signal=None),
        ev("engine.start_requested", f"engine/{B}", at=101.2, cause="one-shot"),
        ev("engine.ready", f"engine/{B}", at=103.7),
    )  # fmt: skip
    assert [(level, text) for level, text in lines if level > DETAIL] == [
        (STORY, f"loading {A} for request 1 (session ana)"),
        (STORY, f"{A} ready in 400 ms (pid 4242)"),
        (
            STORY,
            f"evicted {A} for {B} — {B} needed 16.0 MiB more than was free; {A} was the least "
            "wanted of 2 idle engines (demand-lru: 1 request in the last 60 s, idle 500 ms, "
            "30.0 MiB)",
        ),
        (STORY, f"loading {B} for request 1"),
        (STORY, f"{B} ready in 2.5 s"),
    ]
    assert (DETAIL, f"{A} spawned: pid 4242, port 5555") in lines
    assert (DETAIL, f"{A} stopped (exit code 0)") in lines


def test_starts_not_asked_by_a_request_say_their_cause() -> None:
    story = Story()
    assert told(
        story,
        ev("engine.start_requested", f"engine/{A}", at=1.0, cause="pinned", from_state="stopped"),
        ev("engine.start_requested", f"engine/{B}", at=1.0, cause="session"),
        ev("engine.start_requested", f"engine/{A}", 2, at=9.0, cause="crash", from_state="backoff"),
    ) == [
        (STORY, f"loading {A} (pinned)"),
        (STORY, f"loading {B} for a request"),
        (STORY, f"restarting {A} after its crash (crash)"),
    ]


def test_a_crash_is_trouble_with_its_cause_and_when_it_may_start_again() -> None:
    line = Story().tell(
        ev(
            "engine.crashed",
            f"engine/{A}",
            at=50.0,
            exit_code=None,
            signal=9,
            reached_ready=True,
            retry_at=54.0,
            panic_kind="oom",
            panic_line="ggml: out of memory",
            uptime=12.0,
        )
    )
    assert line == StoryLine(
        TROUBLE,
        f"{A} crashed — killed by signal 9 (SIGKILL); panic kind oom: 'ggml: out of memory'; "
        "after 12 s, had become ready; may start again in 4 s",
        1,
    )


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (
            ev("engine.failed", f"engine/{A}", error="x.gguf: no such model file", retry_at=None),
            (TROUBLE, f"{A} failed — x.gguf: no such model file"),
        ),
        (
            ev("engine.lost", f"engine/{A}", cause="the process is gone"),
            (TROUBLE, f"{A} lost — the process is gone"),
        ),
        (
            ev("engine.adopted", f"engine/{A}", pid=77),
            (STORY, f"took over {A} (pid 77): still running, its caches warm"),
        ),
        (
            ev("engine.stop_failed", f"engine/{A}", pid=77, detail="D state"),
            (TROUBLE, f"{A} would not stop — alive after TERM, TERM and KILL (pid 77): D state"),
        ),
        (
            ev(
                "engine.stop_requested",
                f"engine/{A}",
                reason="idle",
                decision={"rule": "SP4", "unused_for": 301.0, "idle_timeout": 300.0},
            ),
            (STORY, f"stopping {A} — idle (SP4): unused for 5.0 min, idle timeout 5.0 min"),
        ),
        (
            ev(
                "engine.stop_requested",
                f"engine/{A}",
                reason="evicted",
                decision={"rule": "PP6"},
            ),
            (STORY, f"stopping {A} — evicted (PP6): unloaded while idle"),
        ),
        (
            ev(
                "engine.stop_requested",
                f"engine/{A}",
                reason="shutdown",
                decision={"cause": "SIGTERM"},
            ),
            (STORY, f"stopping {A} (shutdown: SIGTERM)"),
        ),
        (
            ev(
                "pool.room_planned",
                "pool/host",
                for_key=B,
                wanted=3 * 2**30,
                shortfall=2**30,
                evict=[],
                drain=None,
                reachable=False,
            ),
            (
                TROUBLE,
                f"refused {B} — needs 3.0 GiB, 1.0 GiB short, more than evicting every idle "
                "engine would free",
            ),
        ),
        (
            ev(
                "ledger.denied",
                "ledger/host",
                key=B,
                bytes=2**30,
                owner=OWNER,
                shortfall=2**29,
                reason="budget exhausted",
                committed_other=3 * 2**29,
                budget=2**31,
                ceiling=2**31,
            ),
            (
                TROUBLE,
                f"refused {B} — needs 1.0 GiB, 512.0 MiB short: 1.5 GiB held by other "
                "engines, budget 2.0 GiB",
            ),
        ),
        (
            ev("ledger.denied", "ledger/host", key=B, owner="someone-else", shortfall=1),
            (DETAIL, f"another daemon's {B} was refused by the ledger"),
        ),
        (
            ev("pool.drain_ended", "pool/host", key=A, outcome="busy", waited=30.0),
            (
                TROUBLE,
                f"{A} still busy after draining 30 s: it stays, and the start that needed its "
                "room is refused (engine-busy)",
            ),
        ),
        (
            ev("pool.drain_ended", "pool/host", key=A, outcome="abandoned", waited=1.0),
            (STORY, f"{A} stays: nobody waits any more for the room it was draining for"),
        ),
        (
            ev("queue.cancelled", f"queue/{A}", engine=A, id=3, why="timeout", waited=5.0),
            (TROUBLE, f"refused request 3 for {A} — no slot within its queue timeout (waited 5 s)"),
        ),
        (
            ev("queue.cancelled", f"queue/{A}", engine=A, id=3, why="aborted", waited=0.25),
            (STORY, f"request 3 for {A} left the queue after 250 ms: its client went"),
        ),
        (
            ev("queue.cancelled", f"queue/{A}", engine=A, id=3, why="cancelled", waited=2.0),
            (STORY, f"request 3 for {A} cancelled after 2 s in the queue (cancelled)"),
        ),
        (
            ev("ledger.spillover_set", "ledger/host", allowed=False),
            (STORY, "RAM spillover set to forbidden"),
        ),
        (
            ev("cache.budget_set", f"cache/{A}", key=A, bytes=2**30, previous=0, applied=True),
            (STORY, f"prompt-cache budget of {A} set to 1.0 GiB"),
        ),
        (
            ev("lease.broken", "lease/7", reason="holder gone", stale_for=12.0),
            (TROUBLE, "GPU lease 7 broken — holder gone (stale for 12 s)"),
        ),
        (
            ev("offload.degraded", f"offload/{A}", key=A, panic_kind="cuda-oom", plan={"kind": "moe-cpu"}),
            (TROUBLE, f"{A} ran out of GPU memory (cuda-oom): it starts again as moe-cpu"),
        ),
        (
            ev("plugin.failed", "plugins/host", name="x", version="1", stage="load", error="boom"),
            (TROUBLE, "plugin x 1 failed (load) — boom"),
        ),
        (
            ev("daemon.started", "daemon/host", pid=9, version="0.1", adopted=[A], lost=[B], reaped=[5]),
            (
                STORY,
                f"daemon started (pid 9, hostler 0.1): took over {A}; lost {B}; stopped 1 stray "
                "engine process(es)",
            ),
        ),
        (
            ev("daemon.started", "daemon/host", pid=9, version="0.1", adopted=[], lost=[], reaped=[]),
            (DETAIL, "daemon started (pid 9, hostler 0.1)"),
        ),
        (
            ev("daemon.stopped", "daemon/host", pid=9),
            (STORY, "daemon stopped (pid 9)"),
        ),
        (
            ev("daemon.gap", "daemon/host", previous_pid=8, last_seq=41),
            (
                TROUBLE,
                "the previous daemon (pid 8) ended without a record: events after seq 41 may "
                "be missing",
            ),
        ),
        (
            ev("daemon.log_recovered", "daemon/host", since=10.0, until=13.0, code="store.full", delayed=4),
            (TROUBLE, "the event log could not be written for 3 s (store.full); 4 events were written late"),
        ),
        (
            ev("daemon.reaped", "daemon/host", pid=31, launch_token="t", command="llama-server"),
            (STORY, "stopped a stray engine process no log owns (pid 31)"),
        ),
    ],
)  # fmt: skip
def test_each_event_kind_is_one_line(event: dict[str, Any], expected: tuple[int, str]) -> None:
    line = Story(owner=OWNER).tell(event)
    assert line is not None
    assert (line.level, line.text) == expected


def test_budget_changes_are_told_once_each() -> None:
    story = Story()
    lines = told(
        story,
        ev("ledger.budget_set", "ledger/host", 1, budget=2**30),
        ev("ledger.budget_set", "ledger/host", 2, budget=2**30),
        ev("ledger.budget_set", "ledger/host", 3, budget=None),
    )
    assert lines == [
        (STORY, "budget set to 1.0 GiB"),
        (DETAIL, "budget set again to 1.0 GiB: unchanged"),
        (STORY, "budget set back to automatic (from the machine's memory)"),
    ]


def test_a_line_that_would_repeat_unchanged_is_not_told_again() -> None:
    story = Story()
    refused = ev("pool.drain_ended", "pool/host", key=A, outcome="busy", waited=30.0)
    first, again = story.tell(refused), story.tell(refused)
    assert first is not None and first.level == TROUBLE
    assert again is None
    assert story.tell(ev("pool.drain_ended", "pool/host", key=A, outcome="abandoned")) is not None
    assert story.tell(refused) is not None  # something changed in between


def test_routine_events_are_detail_and_samples_nothing() -> None:
    story = Story()
    queue = ev("queue.dispatched", f"queue/{A}", engine=A, id=1, lane="interactive", waited=0.0)
    line = story.tell(queue)
    assert line is not None and line.level == DETAIL
    assert line.text.startswith(f"queue.dispatched queue/{A} {{")
    assert story.tell(ev("device.sampled", "device/host", system_ram=1)) is None


def test_the_daemons_ledger_owner_comes_from_its_start_when_not_given() -> None:
    story = Story()
    started = ev("daemon.started", "daemon/host", pid=1, version="v", ledger_owner=OWNER)
    story.tell({**started, "payload": {**started["payload"], "adopted": [], "lost": []}})
    other = story.tell(ev("ledger.denied", "ledger/host", key=A, owner="else", shortfall=1))
    assert other is not None and other.level == DETAIL


def test_malformed_events_are_detail_never_an_error() -> None:
    story = Story()
    for event in (
        {"type": "engine.ready", "stream": f"engine/{A}", "payload": "not a dict"},
        {"type": "engine.crashed", "stream": f"engine/{A}", "payload": {"at": "x"}},
        {"type": 5, "stream": None},
        {},
    ):
        story.tell(event)
    crashed = Story().tell(ev("engine.crashed", f"engine/{A}", at="x", exit_code=True))
    assert crashed is not None and crashed.level == TROUBLE


def test_what_a_build_cannot_run_here_is_told_with_what_follows() -> None:
    """L22: both kinds of ``cpu.unsupported``, as warnings, by value."""
    story = Story()
    kv = {"key": "llamacpp:a:0", "what": "quantized-kv", "kv_type": "q8_0"}
    line = story.tell({"seq": 1, "stream": "cpu/host", "type": "cpu.unsupported", "payload": kv})
    assert line is not None and line.level == TROUBLE
    assert line.text == (
        "llamacpp:a:0 died of SIGILL with a q8_0 KV cache (this engine build needs CPU features "
        "this CPU lacks): it starts again with f16 KV, and so does every later start of this "
        "build here"
    )
    weights = {**kv, "what": "weights", "kv_type": "f16"}
    line = story.tell(
        {"seq": 2, "stream": "cpu/host", "type": "cpu.unsupported", "payload": weights}
    )
    assert line is not None and line.text == (
        "llamacpp:a:0 cannot run its model's weights on this CPU (SIGILL even with f16 KV): "
        "build an engine for this CPU with `hostler engine build llamacpp`"
    )


def test_one_refusal_is_one_line_whichever_record_comes_first() -> None:
    """A model that does not fit: the ledger's denial and the unreachable room plan tell one
    refusal (a breaking helper saw two TROUBLE lines for one request, with -q too)."""
    denied = ev(
        "ledger.denied",
        "ledger/host",
        seq=2,
        key=B,
        bytes=3 * 2**30,
        shortfall=2 * 2**30,
        committed_other=0,
        budget=2**30,
        owner=OWNER,
    )
    unreachable = ev(
        "pool.room_planned",
        "pool/host",
        seq=3,
        for_key=B,
        wanted=3 * 2**30,
        shortfall=2 * 2**30,
        evict=[],
        drain=None,
        reachable=False,
    )
    asked = ev("queue.enqueued", f"queue/{B}", engine=B, id=1, lane="interactive")
    for order in ((denied, unreachable), (unreachable, denied)):
        lines = told(Story(owner=OWNER), asked, *order)
        assert [level for level, _ in lines] == [DETAIL, TROUBLE, DETAIL], lines
    # the next request's refusal is told again (when it says something new: a line that
    # repeats its stream's last one unchanged is not)
    later = ev(
        "ledger.denied",
        "ledger/host",
        seq=5,
        key=B,
        bytes=3 * 2**30,
        shortfall=2**30,
        committed_other=0,
        budget=2 * 2**30,
        owner=OWNER,
    )
    lines = told(Story(owner=OWNER), asked, denied, unreachable, asked, later, unreachable)
    assert [level for level, _ in lines].count(TROUBLE) == 2
