"""``hostler timeline``: the memory picture of a log (PM30-PM32).

Synthetic logs (events appended to a real SQLite ``EventStore`` with a fake clock) pin the
series, markers and spans; a real run (the recorded scenario of conftest.py: three tiny
``llama-server`` engines under a budget for two, evictions for room, a GPU lease's unloads, a
SIGKILL, a refusal) is drawn by the CLI and its SVG read back: every engine, the budget line,
every eviction and every unload in the log must be there, each as what it is.
"""

from __future__ import annotations

import os
import sqlite3
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from _scenario import Scenario
from hostler import EventStore
from hostler.events.base import Event
from hostler.events.ledger import (
    LedgerBudgetSet,
    LedgerDenied,
    LedgerMeasured,
    LedgerReleased,
    LedgerReserved,
)
from hostler.machines.engine import EngineCrashed, EngineStopRequested, made_room
from hostler.machines.lease import LeaseGranted, LeaseReleased, LeaseRequested
from hostler.postmortem.draw import FORMATS, MARKER_STYLE, render
from hostler.postmortem.timeline import (
    MARKER_KINDS,
    MAX_ENGINES_DRAWN,
    OTHERS,
    Step,
    build_timeline,
    value_at,
)

from _support import run_cli, run_python

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
MIB = 2**20
SVG = "{http://www.w3.org/2000/svg}"


class Clock:
    """``recorded_at`` of the next append: T0 + ``now`` seconds."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> datetime:
        return T0 + timedelta(seconds=self.now)


def reserved(key: str, size: int, budget: int = 100 * MIB) -> LedgerReserved:
    return LedgerReserved(key, size, "me", 0, 0, budget, budget, True)


def stop(reason: str, wanted: str | None = None) -> EngineStopRequested:
    decision = {"rule": "PP4", "for": wanted} if wanted else None
    return EngineStopRequested("running", "stopping", 0.0, reason, decision)


def crashed() -> EngineCrashed:
    return EngineCrashed("running", "backoff", 0.0, None, 9, True, 0.0)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(tmp_path: Path, clock: Clock) -> Iterator[EventStore]:
    with EventStore.open(tmp_path / "events.db", clock=clock) as opened:
        yield opened


def put(store: EventStore, clock: Clock, at: float, stream: str, event: Event) -> int:
    clock.now = at
    return store.append(stream, [event], expected_version=None).seqs[-1]


def synthetic_log(store: EventStore, clock: Clock) -> dict[str, int]:
    """Two engines, a budget, an eviction, a refusal, a crash, a lease; name → seq."""
    seqs = {}
    put(store, clock, 0, "ledger/host", LedgerBudgetSet(100 * MIB))
    put(store, clock, 1, "ledger/host", reserved("e:a:0", 40 * MIB))
    put(store, clock, 2, "ledger/host", LedgerMeasured("e:a:0", 30 * MIB, "me", 40 * MIB))
    put(store, clock, 3, "ledger/host", reserved("e:b:0", 50 * MIB))
    seqs["evicted"] = put(store, clock, 4, "engine/e:a:0", stop("evicted", "e:c:0"))
    put(store, clock, 4.5, "ledger/host", LedgerReleased("e:a:0", 30 * MIB, "me", "released"))
    denied = LedgerDenied("e:c:0", 90 * MIB, "me", 40 * MIB, "budget exhausted", 50, 80 * MIB, 0)
    seqs["refused"] = put(store, clock, 5, "ledger/host", denied)
    seqs["requested"] = put(
        store, clock, 6, "lease/l1", LeaseRequested("new", "waiting", 0, "image", "comfy")
    )
    seqs["granted"] = put(store, clock, 7, "lease/l1", LeaseGranted("waiting", "held", 0, 99.0))
    put(store, clock, 9, "lease/l1", LeaseReleased("held", "released", 0, "released"))
    seqs["crashed"] = put(store, clock, 10, "engine/e:b:0", crashed())
    put(store, clock, 10.5, "ledger/host", LedgerReleased("e:b:0", 50 * MIB, "me", "released"))
    put(store, clock, 11, "lease/l2", LeaseRequested("new", "waiting", 0, "llm", "job"))
    seqs["open"] = put(store, clock, 12, "lease/l2", LeaseGranted("waiting", "held", 0, 99.0))
    put(store, clock, 13, "engine/e:b:0", stop("idle"))  # not an eviction: no marker
    return seqs


def at(seconds: float) -> float:
    return (T0 + timedelta(seconds=seconds)).timestamp()


def test_series_markers_and_spans_of_a_log(store: EventStore, clock: Clock) -> None:
    seqs = synthetic_log(store, clock)
    timeline = build_timeline(store.read_all())
    assert timeline.engines == ("e:a:0", "e:b:0", "e:c:0")[:2]
    assert timeline.start == at(0) and timeline.end == at(13)
    assert [(s.at, s.value) for s in timeline.reserved["e:a:0"]] == [
        (at(1), 40 * MIB),
        (at(4.5), 0),
    ]
    assert [(s.at, s.value) for s in timeline.measured["e:a:0"]] == [
        (at(2), 30 * MIB),
        (at(4.5), 0),
    ]
    # the explicit budget, then the one the refusal was decided against
    assert [(s.at, s.value) for s in timeline.budget] == [(at(0), 100 * MIB), (at(5), 80 * MIB)]
    kinds = [(m.kind, m.seq, m.engine) for m in timeline.markers]
    assert kinds == [
        ("evicted", seqs["evicted"], "e:a:0"),
        ("refused", seqs["refused"], "e:c:0"),
        ("crashed", seqs["crashed"], "e:b:0"),
    ]
    labels = [m.label for m in timeline.markers]
    assert labels == ["evicted for e:c:0", "refused e:c:0: 40.0 MiB short", "crashed (signal 9)"]
    first, second = timeline.spans
    assert (first.seq, first.start, first.end, first.label, first.open) == (
        seqs["granted"], at(7), at(9), "image: comfy", False,
    )  # fmt: skip
    # still held when the log ends: it runs to the end
    assert (second.seq, second.start, second.end, second.open) == (
        seqs["open"],
        at(12),
        at(13),
        True,
    )
    assert timeline.peak() == 40 * MIB + 50 * MIB
    assert timeline.events == 15 and timeline.damaged == ()


def test_past_24_engines_the_least_are_summed_into_one_series(
    store: EventStore, clock: Clock
) -> None:
    """Was: a log of 1,680 engines drew a 402 MB SVG (every engine a series, PM35)."""
    assert (MAX_ENGINES_DRAWN, OTHERS) == (24, "others")
    for n in range(30):  # engine n holds (n + 1) MiB from second n to second n + 40
        put(store, clock, n, "ledger/host", reserved(f"e:m{n}:0", (n + 1) * MIB, 10**12))
    for n in range(30):
        put(store, clock, 40 + n, "ledger/host", LedgerReleased(f"e:m{n}:0", 0, "me", "released"))
    timeline = build_timeline(store.read_all())
    assert len(timeline.engines) == 24 and timeline.engines[-1] == "others"
    assert timeline.engines[:-1] == tuple(f"e:m{n}:0" for n in range(7, 30))  # the 23 largest
    summed = timeline.reserved["others"]
    # the seven smallest (1..7 MiB) come in one a second, and go one a second from 40 s
    assert [(s.at, s.value) for s in summed] == [
        *((at(n), sum(range(1, n + 2)) * MIB) for n in range(7)),
        *((at(40 + n), sum(range(n + 2, 8)) * MIB) for n in range(7)),
    ]
    assert summed[-1].value == 0 and "e:m0:0" not in timeline.reserved
    assert timeline.peak() == sum(range(1, 31)) * MIB  # nothing lost from the total


def test_24_engines_are_drawn_each_as_its_own(store: EventStore, clock: Clock) -> None:
    for n in range(24):
        put(store, clock, n, "ledger/host", reserved(f"e:m{n}:0", MIB, 10**12))
    assert len(build_timeline(store.read_all()).engines) == 24
    put(store, clock, 30, "ledger/host", reserved("e:m24:0", MIB, 10**12))
    engines = build_timeline(store.read_all()).engines
    assert len(engines) == 24 and engines[-1] == "others"
    assert engines[:-1] == tuple(f"e:m{n}:0" for n in range(23))  # equal peaks: first come


def test_a_window_carries_in_what_was_held_at_its_start(store: EventStore, clock: Clock) -> None:
    synthetic_log(store, clock)
    timeline = build_timeline(store.read_all(), since=at(3.5), until=at(8))
    assert (timeline.start, timeline.end) == (at(3.5), at(8))
    assert [(s.at, s.value) for s in timeline.reserved["e:b:0"]] == [(at(3.5), 50 * MIB)]
    assert [(s.at, s.value) for s in timeline.reserved["e:a:0"]] == [
        (at(3.5), 40 * MIB),
        (at(4.5), 0),
    ]
    assert [(s.at, s.value) for s in timeline.budget] == [(at(3.5), 100 * MIB), (at(5), 80 * MIB)]
    assert [m.kind for m in timeline.markers] == ["evicted", "refused"]  # crash at 10: after
    (span,) = timeline.spans
    # released at 9, after the window: at its end the lease was still held
    assert (span.start, span.end, span.open) == (at(7), at(8), True)


def test_a_window_reaching_back_before_the_log_starts_at_its_first_event(
    store: EventStore, clock: Clock
) -> None:
    synthetic_log(store, clock)
    timeline = build_timeline(store.read_all(), since=at(-600), until=at(20))
    assert (timeline.start, timeline.end) == (at(0), at(20))
    nothing = build_timeline(store.read_all(), since=at(30), until=at(40))
    assert (nothing.start, nothing.end, nothing.markers) == (at(30), at(40), ())
    assert [(s.at, s.value) for s in nothing.budget] == [(at(30), 80 * MIB)]


def test_an_edge_exactly_at_since_is_kept_once(store: EventStore, clock: Clock) -> None:
    synthetic_log(store, clock)
    timeline = build_timeline(store.read_all(), since=at(3))
    assert [(s.at, s.value) for s in timeline.reserved["e:b:0"]] == [
        (at(3), 50 * MIB),
        (at(10.5), 0),
    ]
    assert timeline.markers[0].at == at(4)


def test_steps_at_one_moment_keep_the_last_and_repeats_collapse(
    store: EventStore, clock: Clock
) -> None:
    put(store, clock, 1, "ledger/host", reserved("e:a:0", 10))
    put(store, clock, 1, "ledger/host", reserved("e:a:0", 20))
    put(store, clock, 2, "ledger/host", reserved("e:a:0", 20))
    steps = build_timeline(store.read_all()).reserved["e:a:0"]
    assert [(s.at, s.value) for s in steps] == [(at(1), 20)]
    assert value_at(steps, at(0.5)) == 0 and value_at(steps, at(1)) == 20
    assert value_at(steps, at(5)) == 20


def test_value_at_edges() -> None:
    steps = (Step(1.0, 1, 5), Step(2.0, 2, 0))
    assert [value_at(steps, t) for t in (0.0, 1.0, 1.5, 2.0, 3.0)] == [0, 5, 5, 0, 0]
    assert value_at((), 1.0) == 0


def test_an_empty_log_and_damaged_rows(store: EventStore, clock: Clock, tmp_path: Path) -> None:
    empty = build_timeline(store.read_all())
    assert (empty.engines, empty.markers, empty.budget, empty.start, empty.end) == (
        (),
        (),
        (),
        0.0,
        0.0,
    )
    put(store, clock, 1, "ledger/host", reserved("e:a:0", 10))
    raw = sqlite3.connect(tmp_path / "events.db")
    raw.execute(
        "INSERT INTO events (stream_id, version, type, schema_version, payload, metadata, "
        "recorded_at) VALUES ('ledger/host', 2, 'ledger.reserved', 2, 'not json', '{}', "
        "'2026-11-30T12:00:02.000000Z')"
    )
    raw.execute(
        "INSERT INTO events (stream_id, version, type, schema_version, payload, metadata, "
        "recorded_at) VALUES ('plugin/x', 1, 'plugin.future', 1, '{}', '{}', "
        "'2026-11-30T12:00:03.000000Z')"
    )
    raw.commit()
    raw.close()
    timeline = build_timeline(store.read_all())
    assert [seq for seq, _ in timeline.damaged] == [2]
    assert timeline.engines == ("e:a:0",) and timeline.events == 3


def svg_ids(data: bytes) -> set[str]:
    root = ET.fromstring(data)  # noqa: S314 - our own picture
    return {e.get("id", "") for e in root.iter()} - {""}


def test_only_evictions_for_room_are_marked_evicted_other_evicted_stops_are_unloads(
    store: EventStore, clock: Clock
) -> None:
    """Was: a lease's unloads (GA1) were marked as evictions, though the legend and PM31 named
    evictions for room and ``whatif`` counted only those (PM23)."""
    import io

    def evicted(decision: dict[str, object] | None) -> EngineStopRequested:
        return EngineStopRequested("running", "stopping", 0.0, "evicted", decision)

    put(store, clock, 0, "ledger/host", reserved("e:a:0", 40 * MIB))
    stops = {
        "room": evicted({"rule": "PP4", "for": "e:b:0"}),
        "swap": evicted({"rule": "GA1", "cause": "gpu-slot-swap", "slot": "llm"}),
        "swap-no-slot": evicted({"rule": "GA1"}),
        "person": evicted({"rule": "PP6", "cause": "unload-idle"}),
        "retire": evicted({"rule": "PP9", "cause": "retire"}),
        "reconcile": evicted({"rule": "PP10", "target": 1}),
        "no-decision": evicted(None),
        "room-for-nobody": evicted({"rule": "PP4"}),
        "idle": EngineStopRequested("running", "stopping", 0.0, "idle", {"rule": "PP4"}),
    }
    seqs = {
        name: put(store, clock, 1 + i, f"engine/e:{name}:0", event)
        for i, (name, event) in enumerate(stops.items())
    }
    timeline = build_timeline(store.read_all())
    marked = {m.seq: (m.kind, m.engine, m.label) for m in timeline.markers}
    assert marked == {
        seqs["room"]: ("evicted", "e:room:0", "evicted for e:b:0"),
        seqs["swap"]: ("unloaded", "e:swap:0", "unloaded (GA1): slot llm gave the card"),
        seqs["swap-no-slot"]: ("unloaded", "e:swap-no-slot:0", "unloaded (GA1)"),
        seqs["person"]: ("unloaded", "e:person:0", "unloaded (PP6)"),
        seqs["retire"]: ("unloaded", "e:retire:0", "unloaded (PP9)"),
        seqs["reconcile"]: ("unloaded", "e:reconcile:0", "unloaded (PP10)"),
        seqs["no-decision"]: ("unloaded", "e:no-decision:0", "unloaded"),
        seqs["room-for-nobody"]: ("evicted", "e:room-for-nobody:0", "evicted"),
    }  # the idle stop is not marked: nothing went wrong
    # what the timeline calls an eviction is exactly what the predicate (and whatif) does
    for record in store.read_all(types=["engine.stop_requested"]):
        assert isinstance(record.event, EngineStopRequested)
        kind = marked.get(record.seq, ("none",))[0]
        assert (kind == "evicted") == record.event.made_room, record.seq
    out = io.BytesIO()
    render(timeline, out, fmt="svg", width=800, height=400)
    ids = svg_ids(out.getvalue())
    assert f"marker-evicted-{seqs['room']}" in ids and f"marker-unloaded-{seqs['swap']}" in ids
    assert f"marker-evicted-{seqs['swap']}" not in ids
    assert sum(1 for i in ids if i.startswith("marker-evicted-")) == 2
    assert sum(1 for i in ids if i.startswith("marker-unloaded-")) == 6
    text = out.getvalue().decode()
    assert "2 evicted, 6 unloaded" in text  # the subtitle counts each kind apart
    assert "unloaded (for a lease, or on request)" in text  # the legend


def test_the_svg_names_every_series_and_marker(store: EventStore, clock: Clock) -> None:
    import io

    seqs = synthetic_log(store, clock)
    out = io.BytesIO()
    render(build_timeline(store.read_all()), out, fmt="svg", width=800, height=400)
    ids = svg_ids(out.getvalue())
    assert {"budget", "engine-e:a:0", "engine-e:b:0", "engine-e:a:0-measured"} <= ids
    assert {f"marker-evicted-{seqs['evicted']}", f"marker-refused-{seqs['refused']}"} <= ids
    assert {
        f"marker-crashed-{seqs['crashed']}",
        f"lease-{seqs['granted']}",
        f"lease-{seqs['open']}",
    } <= ids
    text = out.getvalue().decode()
    assert "memory (MiB)" in text and "time (UTC, HH:MM:SS)" in text and "12:00:" in text
    # the same timeline draws the same SVG, byte for byte
    again = io.BytesIO()
    render(build_timeline(store.read_all()), again, fmt="svg", width=800, height=400)
    assert again.getvalue() == out.getvalue()


def test_constants_and_a_png() -> None:
    import io

    assert FORMATS == ("svg", "png")
    assert MARKER_KINDS == ("evicted", "unloaded", "refused", "crashed", "lost")
    assert set(MARKER_STYLE) == set(MARKER_KINDS)
    # the legend says what each kind is: evictions are for room only, unloads were asked for
    assert MARKER_STYLE["evicted"][2] == "evicted (to make room for another engine)"
    assert MARKER_STYLE["unloaded"][2] == "unloaded (for a lease, or on request)"
    # one row each, from the top down, in the legend's order; none shares a shape
    rows = [MARKER_STYLE[k][3] for k in MARKER_KINDS]
    assert rows == sorted(rows, reverse=True) and len(set(rows)) == len(rows)
    assert len({MARKER_STYLE[k][0] for k in MARKER_KINDS}) == len(MARKER_KINDS)
    empty = build_timeline([])
    out = io.BytesIO()
    render(empty, out, fmt="png", width=600, height=300)
    assert out.getvalue().startswith(b"\x89PNG")
    with pytest.raises(ValueError, match="svg, png"):
        render(empty, io.BytesIO(), fmt="gif")


def test_the_cli_writes_and_refuses(store: EventStore, clock: Clock, tmp_path: Path) -> None:
    seqs = synthetic_log(store, clock)
    log = str(tmp_path / "events.db")
    picture = tmp_path / "t.svg"
    done = run_cli("timeline", log, "-o", str(picture), "--width", "900", "--height", "450")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{picture}: 2 engines, 3 markers, 2 leases, 15 events read"
    root = ET.fromstring(picture.read_bytes())  # noqa: S314
    assert root.get("width") == "648pt" and root.get("height") == "324pt"  # 900 px at 100 dpi
    assert f"marker-evicted-{seqs['evicted']}" in svg_ids(picture.read_bytes())
    windowed = run_cli(
        "timeline", log, "-o", str(tmp_path / "w.png"),
        "--since", "2026-11-30T12:00:03.5", "--until", "2026-11-30T12:00:08",
    )  # fmt: skip
    assert windowed.returncode == 0, windowed.stderr
    assert "2 engines, 2 markers, 1 leases" in windowed.stdout
    assert (tmp_path / "w.png").read_bytes().startswith(b"\x89PNG")
    refusals = {
        ("-o", str(tmp_path / "t.gif")): "written as .svg or .png",
        (
            "-o",
            str(tmp_path / "no" / "t.svg"),
        ): "t.svg: cannot write here (No such file or directory)",
        (
            "-o",
            str(picture),
            "--since",
            "2026-11-30T13:00",
            "--until",
            "2026-11-30T12:00",
        ): "before --until",
        ("-o", str(picture), "--width", "299"): "from 300 to 10000",
        ("-o", str(picture), "--since", "yesterday"): "use ISO-8601",
    }
    for extra, said in refusals.items():
        failed = run_cli("timeline", log, *extra)
        assert failed.returncode == 2, (extra, failed.stderr)
        assert said in failed.stderr and "Traceback" not in failed.stderr
        assert failed.stderr.startswith("hostler: error [usage.invalid]: ")
    missing = run_cli("timeline", str(tmp_path / "none.db"), "-o", str(picture))
    assert missing.returncode == 1 and "no event log here yet" in missing.stderr


def test_the_cli_warns_about_damaged_rows_and_still_draws(
    store: EventStore, clock: Clock, tmp_path: Path
) -> None:
    put(store, clock, 1, "ledger/host", reserved("e:a:0", 10))
    raw = sqlite3.connect(tmp_path / "events.db")
    raw.execute(
        "INSERT INTO events (stream_id, version, type, schema_version, payload, metadata, "
        "recorded_at) VALUES ('ledger/host', 2, 'ledger.reserved', 2, 'not json', '{}', "
        "'2026-11-30T12:00:02.000000Z')"
    )
    raw.commit()
    raw.close()
    done = run_cli("timeline", str(tmp_path / "events.db"), "-o", str(tmp_path / "d.svg"))
    assert done.returncode == 1
    assert "hostler: warning [store.damaged-row]" in done.stderr and "seq 2" in done.stderr
    assert (tmp_path / "d.svg").exists()


def test_the_cli_starts_without_matplotlib() -> None:
    code = (
        "import sys; from hostler.cli import build_parser; build_parser(); "
        "print('matplotlib' in sys.modules)"
    )
    done = run_python(code)
    assert done.stdout.strip() == "False", done.stderr


def test_without_the_plots_extra_the_cli_names_it_in_one_line(tmp_path: Path) -> None:
    """A lean install (``pip install .``) has no matplotlib: ``hostler timeline`` says which
    extra draws, before it reads the log, and writes nothing."""
    picture = tmp_path / "t.svg"
    code = (  # as if matplotlib were not installed: its import fails
        "import sys; sys.modules['matplotlib'] = None; "
        "from hostler.cli import main; sys.exit(main())"
    )
    done = run_python(code, "timeline", str(tmp_path / "none.db"), "-o", str(picture))
    assert done.returncode == 1
    assert done.stderr == (
        "hostler: error [install.extra-missing]: the timeline picture is drawn with matplotlib, "
        "which is not installed here (import of matplotlib halted; None in sys.modules): "
        "install the plots extra, pip install 'hostler[plots]'\n"
    )
    assert not picture.exists()


@pytest.mark.slow
def test_the_cli_draws_a_real_run_with_every_engine_the_budget_and_each_eviction(
    scenario: Scenario, tmp_path: Path
) -> None:
    """Three tiny ``llama-server`` engines under a budget for two (the recorded scenario of
    conftest.py): evictions to make room, a SIGKILL (a crash), an image lease that unloads the
    LLM engines while it is held, a refusal under a budget too small, then room again."""
    log = scenario.log
    with EventStore.open(log) as store:
        records = list(store.read_all())
    stops = [r for r in records if r.type == "engine.stop_requested"]
    evictions = [r.seq for r in stops if made_room(r.payload["reason"], r.payload["decision"])]
    # the lease unloads both LLM engines then resident: stops with reason evicted, not for room
    unloads = [
        r.seq
        for r in stops
        if r.payload["reason"] == "evicted" and r.payload["decision"]["rule"] == "GA1"
    ]
    crashes = [r.seq for r in records if r.type == "engine.crashed"]
    refusals = [r.seq for r in records if r.type == "ledger.denied"]
    grants = [r.seq for r in records if r.type == "lease.granted"]
    assert len(evictions) >= 3 and len(unloads) == 2
    assert len(crashes) == 1 and len(refusals) == 1 and len(grants) == 1
    picture = tmp_path / "timeline.svg"
    done = run_cli("timeline", str(log), "-o", str(picture))
    assert done.returncode == 0, done.stderr
    ids = svg_ids(picture.read_bytes())
    for name in ("alpha", "beta", "gamma"):
        assert {f"engine-llamacpp:{name}:0", f"engine-llamacpp:{name}:0-measured"} <= ids
    assert "budget" in ids
    assert {f"marker-evicted-{seq}" for seq in evictions} <= ids
    assert {f"marker-unloaded-{seq}" for seq in unloads} <= ids
    assert {
        f"marker-crashed-{crashes[0]}",
        f"marker-refused-{refusals[0]}",
        f"lease-{grants[0]}",
    } <= ids
    assert sum(1 for i in ids if i.startswith("marker-evicted-")) == len(evictions)
    assert sum(1 for i in ids if i.startswith("marker-unloaded-")) == len(unloads)
    png = tmp_path / "timeline.png"
    assert run_cli("timeline", str(log), "-o", str(png)).returncode == 0
    if target := os.environ.get("HOSTLER_KEEP_TIMELINE"):  # docs/img/timeline.png is made so
        Path(target).write_bytes(png.read_bytes())


def test_a_ledger_kept_in_its_own_log_is_merged_by_time(tmp_path: Path) -> None:
    """A daemon's log (evictions, leases) and the host ledger's log (bytes), drawn as one."""
    clock = Clock()
    with (
        EventStore.open(tmp_path / "events.db", clock=clock) as events,
        EventStore.open(tmp_path / "ledger.db", clock=clock) as ledger,
    ):
        put(ledger, clock, 1, "ledger/host", reserved("e:a:0", 40 * MIB))
        evicted = put(events, clock, 2, "engine/e:a:0", stop("evicted", "e:b:0"))
        put(ledger, clock, 3, "ledger/host", LedgerReleased("e:a:0", 40 * MIB, "me", "released"))
        put(ledger, clock, 4, "ledger/host", reserved("e:b:0", 50 * MIB))
        alone = build_timeline(events.read_all())
        assert alone.engines == () and [m.seq for m in alone.markers] == [evicted]
        merged = build_timeline(events.read_all(), ledger=ledger.read_all())
    assert merged.engines == ("e:a:0", "e:b:0") and merged.events == 4
    assert (merged.start, merged.end) == (at(1), at(4))
    assert [(s.at, s.value) for s in merged.reserved["e:a:0"]] == [(at(1), 40 * MIB), (at(3), 0)]


def test_the_cli_merges_a_ledger_log_and_says_when_one_is_missing(tmp_path: Path) -> None:
    clock = Clock()
    with (
        EventStore.open(tmp_path / "events.db", clock=clock) as events,
        EventStore.open(tmp_path / "ledger.db", clock=clock) as ledger,
    ):
        put(ledger, clock, 1, "ledger/host", reserved("e:a:0", 40 * MIB))
        evicted = put(events, clock, 2, "engine/e:a:0", stop("evicted", "e:b:0"))
        put(ledger, clock, 4, "ledger/host", reserved("e:b:0", 50 * MIB))
    picture = tmp_path / "m.svg"
    given = run_cli(
        "timeline", str(tmp_path / "events.db"), "--ledger", str(tmp_path / "ledger.db"),
        "-o", str(picture),
    )  # fmt: skip
    assert given.returncode == 0 and given.stderr == "", given.stderr
    assert {"engine-e:a:0", "engine-e:b:0", f"marker-evicted-{evicted}"} <= svg_ids(
        picture.read_bytes()
    )
    without = run_cli("timeline", str(tmp_path / "events.db"), "-o", str(picture))
    assert without.returncode == 0
    assert "holds no memory decisions (ledger.*)" in without.stderr
    assert "--ledger PATH" in without.stderr
    missing = run_cli(
        "timeline", str(tmp_path / "events.db"), "--ledger", str(tmp_path / "nope.db"),
        "-o", str(picture),
    )  # fmt: skip
    assert missing.returncode == 1 and "nope.db: no event log here yet" in missing.stderr
    twice = run_cli(  # was: every ledger decision counted twice
        "timeline", str(tmp_path / "events.db"), "--ledger", str(tmp_path / "events.db"),
        "-o", str(picture),
    )  # fmt: skip
    assert twice.returncode == 2 and "is the log itself: give it once" in twice.stderr


def test_peaks_in_keeps_every_spike_of_a_column() -> None:
    from hostler.postmortem.timeline import peaks_in

    steps = (Step(1.0, 1, 5), Step(1.2, 2, 50), Step(1.3, 3, 0), Step(3.0, 4, 7))
    assert peaks_in(steps, [0.0, 1.0, 2.0, 3.0, 4.0]) == [0, 50, 0, 7]
    assert peaks_in(steps, [1.25, 2.0]) == [50]  # held from before the span
    assert peaks_in(steps, [0.0]) == [] and peaks_in((), [0.0, 1.0]) == [0]


def test_a_long_log_is_drawn_per_pixel_column_and_markers_grouped(
    store: EventStore, clock: Clock
) -> None:
    import io

    events: list[tuple[float, str, Event]] = []
    for i in range(1200):
        events.append((i * 100.0, "ledger/host", reserved(f"e:m{i % 2}:0", (i % 7 + 1) * MIB)))
        events.append((i * 100.0 + 1, "engine/e:m0:0", crashed()))
    for when, stream, event in events:
        put(store, clock, when, stream, event)
    timeline = build_timeline(store.read_all())
    assert len(timeline.markers) == 1200 and timeline.end - timeline.start > 86_400
    out = io.BytesIO()
    render(timeline, out, fmt="svg", width=600, height=300)
    ids = svg_ids(out.getvalue())
    assert "markers-crashed" in ids and not any(i.startswith("marker-crashed-") for i in ids)
    assert {"engine-e:m0:0", "engine-e:m1:0", "budget"} <= ids
    assert "time (UTC, MM-DD HH:MM)" in out.getvalue().decode()
    assert len(out.getvalue()) < 400_000  # 2,400 steps drawn on 600 columns


def test_a_log_that_names_its_ledger_is_drawn_with_its_own_rows_only(tmp_path: Path) -> None:
    """Issue 19: ``daemon.started`` (v2) names the ledger file and owner: no --ledger needed.

    The ledger is shared with another daemon (owner ``them``): its engine is not this log's.
    """
    from hostler.events.daemon import DAEMON_STREAM, DaemonStarted

    clock = Clock()
    ledger_file = tmp_path / "shared" / "ledger.db"
    ledger_file.parent.mkdir()
    with (
        EventStore.open(tmp_path / "events.db", clock=clock) as events,
        EventStore.open(ledger_file, clock=clock) as ledger,
    ):
        put(ledger, clock, 0, "ledger/host", LedgerBudgetSet(10 * MIB))  # before: not ours
        started = DaemonStarted(0.0, 1, "t", [], [], [], str(ledger_file), "me")
        put(events, clock, 0.5, DAEMON_STREAM, started)
        put(ledger, clock, 1, "ledger/host", reserved("e:a:0", 40 * MIB))
        theirs = LedgerReserved("e:x:0", 9 * MIB, "them", 0, 0, 100 * MIB, 100 * MIB, True)
        put(ledger, clock, 1.5, "ledger/host", theirs)
        evicted = put(events, clock, 2, "engine/e:a:0", stop("evicted", "e:b:0"))
        put(ledger, clock, 3, "ledger/host", LedgerReleased("e:a:0", 40 * MIB, "me", "released"))
        put(ledger, clock, 4, "ledger/host", reserved("e:b:0", 50 * MIB))
    picture = tmp_path / "m.svg"
    drawn = run_cli("timeline", str(tmp_path / "events.db"), "-o", str(picture))
    assert drawn.returncode == 0 and drawn.stderr == "", drawn.stderr
    assert drawn.stdout.startswith(f"{picture}: 2 engines, 1 markers")
    ids = svg_ids(picture.read_bytes())
    assert {"engine-e:a:0", "engine-e:b:0", f"marker-evicted-{evicted}"} <= ids
    assert "engine-e:x:0" not in ids
    ledger_file.rename(tmp_path / "moved.db")
    gone = run_cli("timeline", str(tmp_path / "events.db"), "-o", str(picture))
    assert gone.returncode == 0
    assert gone.stderr == (
        f"hostler: note: the daemon of {tmp_path / 'events.db'} kept its memory decisions in "
        f"{ledger_file}, which is not here: the log is read alone; give the ledger with "
        "--ledger PATH\n"
    )


@pytest.mark.parametrize(
    ("recorded", "why"),
    [
        ("/tmp/x\x00y", "which cannot be read here (ValueError)"),
        ("/" + "a" * 5000, "which cannot be read here (OSError)"),
        ("DIR", "which cannot be read (store."),
        ("JUNK", "which cannot be read (store."),
    ],
)
@pytest.mark.parametrize("command", ["timeline", "whatif"])
def test_a_hostile_recorded_ledger_is_noted_and_the_log_read_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], recorded: str, why: str, command: str
) -> None:
    """Break (issue 19): a ``daemon.started`` naming a ledger path with a NUL byte, or one too
    long for the file system, made ``whatif`` and ``timeline`` end in a traceback; one naming
    a directory or a file that is no log ended the whole command."""
    from hostler.cli import main
    from hostler.events.daemon import DAEMON_STREAM, DaemonStarted

    if recorded == "DIR":
        recorded = str(tmp_path)
    elif recorded == "JUNK":
        (tmp_path / "junk.db").write_bytes(b"not a database" * 100)
        recorded = str(tmp_path / "junk.db")
    clock = Clock()
    log = tmp_path / "events.db"
    with EventStore.open(log, clock=clock) as events:
        put(
            events,
            clock,
            0.5,
            DAEMON_STREAM,
            DaemonStarted(0.0, 1, "t", [], [], [], recorded, "me"),
        )
        put(events, clock, 2, "engine/e:a:0", stop("evicted", "e:b:0"))
    args = [command, str(log)] + (["-o", str(tmp_path / "m.svg")] if command == "timeline" else [])
    assert main(args) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"hostler: note: the daemon of {log} kept its memory decisions in ")
    assert why in err and err.endswith(
        ": the log is read alone; give the ledger with --ledger PATH\n"
    )
    assert "Traceback" not in err and err.count("\n") == 1
