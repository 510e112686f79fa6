"""The pictures read well (issue 21): labels that never overlap, a legend inside the figure, a
live window that fits the daemon, and a mark for every refusal (PM31, PM36, PM37).

Each picture is drawn from a recorded log (``_pictures.py``: events appended to a real
``EventStore`` at moments a fake clock names) by the code ``hostler timeline`` and the
dashboard run, on matplotlib's Agg canvas; what is asserted is read back from the rendered
artists (their window extents as the renderer measures them), then the picture is written as
a real PNG file.
"""

from __future__ import annotations

import itertools
import random
import re
import struct
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from _pictures import (
    BUSY_EVERY,
    BUSY_EVICTIONS,
    GIB,
    MIB,
    BusyLog,
    Clock,
    at,
    busy_log,
    put,
    queue_timeout,
    reserved,
    started,
    stop,
)
from hostler import EventStore
from hostler.events.daemon import DAEMON_STREAM
from hostler.events.ledger import LedgerDenied, LedgerReleased
from hostler.events.pool import POOL_STREAM, PoolDrainEnded, PoolDrainStarted
from hostler.postmortem.draw import MARKER_STYLE, figure_of, render
from hostler.postmortem.lanes import more, place_labels
from hostler.postmortem.timeline import MARKER_KINDS, Timeline, build_timeline
from hostler.serve.dashboard import LEAST_SECONDS, live_timeline

#: The sizes drawn: ``hostler timeline``'s default, the dashboard's, and a small one.
SIZES = [(1400, 700), (1200, 520), (700, 400)]
MORE = re.compile(r"\+(\d+) more")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(tmp_path: Path, clock: Clock) -> Iterator[EventStore]:
    with EventStore.open(tmp_path / "events.db", clock=clock) as opened:
        yield opened


@pytest.fixture
def busy(store: EventStore, clock: Clock) -> BusyLog:
    return busy_log(store, clock)


def drawn(figure: Any) -> Any:
    """The figure drawn once on its Agg canvas; its renderer (extents are then final)."""
    figure.canvas.draw()
    return figure.canvas.get_renderer()


def no_text_overlaps(figure: Any) -> None:
    """No two texts written in the axes intersect (as rendered), nor leave the axes' width."""
    renderer = drawn(figure)
    (ax,) = figure.axes
    boxes = [(t.get_gid() or t.get_text(), t.get_window_extent(renderer)) for t in ax.texts]
    for index, (name, box) in enumerate(boxes):
        assert box.width > 0 and box.height > 0, name
        # within the axes' width: never over the y axis' figures or the legend
        assert ax.bbox.x0 - 0.5 <= box.x0 and box.x1 <= ax.bbox.x1 + 0.5, name
        for other, other_box in boxes[index + 1 :]:
            assert not box.overlaps(other_box), (name, other, box, other_box)


def labels(figure: Any) -> list[Any]:
    """The text artists written under markers: names (``label-``) and counts (``more-``)."""
    (ax,) = figure.axes
    return [t for t in ax.texts if str(t.get_gid()).startswith(("label-", "more-"))]


def check_png(data: bytes, path: Path, width: int, height: int) -> None:
    """``data`` is a PNG of ``width`` × ``height`` pixels; written to ``path``."""
    path.write_bytes(data)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    assert struct.unpack(">II", data[16:24]) == (width, height)


# -- 1. labels never overlap; every victim is named or counted -----------------------------------


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_labels_of_a_busy_stretch_never_overlap_and_every_mark_is_named_or_counted(
    store: EventStore, busy: BusyLog, tmp_path: Path, width: int, height: int
) -> None:
    """Was: 14 evictions within 4 s wrote their victims' names one over another (and past 40
    markers, none at all)."""
    timeline = build_timeline(store.read_all())
    evictions = [m for m in timeline.markers if m.kind == "evicted"]
    assert len(evictions) == BUSY_EVICTIONS == len(busy.victims)
    assert evictions[-1].at - evictions[0].at == pytest.approx(BUSY_EVERY * (BUSY_EVICTIONS - 1))
    figure = figure_of(timeline, width=width, height=height)
    texts = labels(figure)
    no_text_overlaps(figure)
    # each kind: its names and its counts add up to its markers, none twice
    victims = {m.seq: m.engine for m in timeline.markers}
    for kind in MARKER_KINDS:
        seqs = {m.seq for m in timeline.markers if m.kind == kind}
        named = [t for t in texts if t.get_gid().startswith(f"label-{kind}-")]
        counts = [t for t in texts if t.get_gid().startswith(f"more-{kind}-")]
        total = 0
        for text in named:
            seq = int(text.get_gid().rsplit("-", 1)[1])
            assert seq in seqs and str(victims[seq]).split(":")[1] == text.get_text()
            total += 1
        for text in counts:
            found = MORE.fullmatch(text.get_text())
            assert found is not None and int(text.get_gid().rsplit("-", 1)[1]) in seqs
            total += int(found[1])
        assert total == len(seqs), kind
    # the busy stretch is named as far as its lanes go, and the rest counted
    *names, counted = [t.get_text() for t in texts if "-evicted-" in t.get_gid()]
    assert names == [str(v).split(":")[1] for v in busy.victims[: len(names)]]
    assert counted == more(BUSY_EVICTIONS - len(names))
    out = tmp_path / f"busy-{width}x{height}.png"
    check_png(png_of(timeline, width, height), out, width, height)


def test_a_budget_off_the_scale_is_named_clear_of_the_labels(
    store: EventStore, clock: Clock, tmp_path: Path
) -> None:
    """A 40 GiB budget over engines of a few MiB is named at the top left (PM33), where the
    first marker's labels are written too: below them, not over them."""
    put(store, clock, 0, "ledger/host", reserved("e:alpha:0", 40 * MIB, 40 * GIB))
    put(store, clock, 0.5, "ledger/host", reserved("e:beta:0", 20 * MIB, 40 * GIB))
    for n in range(4):
        put(store, clock, 1 + n * 0.1, f"engine/e:m{n}:0", stop("evicted", "e:beta:0"))
    put(store, clock, 60, "ledger/host", reserved("e:gamma:0", 20 * MIB, 40 * GIB))
    timeline = build_timeline(store.read_all())
    for width, height in SIZES:
        figure = figure_of(timeline, width=width, height=height)
        (ax,) = figure.axes
        assert any("(off the scale)" in t.get_text() for t in ax.texts)
        no_text_overlaps(figure)
    check_png(png_of(timeline, 1200, 520), tmp_path / "off-scale.png", 1200, 520)


def png_of(timeline: Timeline, width: int, height: int) -> bytes:
    import io

    picture = io.BytesIO()
    render(timeline, picture, fmt="png", width=width, height=height)
    return picture.getvalue()


def test_labels_are_written_in_the_svg_with_their_ids(store: EventStore, busy: BusyLog) -> None:
    import io
    import xml.etree.ElementTree as ET

    out = io.BytesIO()
    render(build_timeline(store.read_all()), out, fmt="svg", width=1200, height=520)
    ids = {e.get("id", "") for e in ET.fromstring(out.getvalue()).iter()}  # noqa: S314 - ours
    first = busy.seqs["evicted"][0]
    assert f"label-evicted-{first}" in ids  # the first of the stretch is named
    assert any(i.startswith("more-evicted-") for i in ids)
    assert f"label-crashed-{busy.seqs['crashed'][0]}" in ids


def test_place_labels_names_what_fits_and_counts_the_rest() -> None:
    def width(text: str) -> float:
        return 6.0 * len(text)

    # far apart: each named in the first lane, centred under its mark
    spread = place_labels([(100, "aa"), (300, "bbbb")], width, lanes=2, low=0, high=400, gap=4)
    assert [(p.text, p.left, p.lane, p.marks) for p in spread] == [
        ("aa", 94.0, 0, (0,)),
        ("bbbb", 288.0, 0, (1,)),
    ]
    # ten at one spot, three lanes: two named, the last lane counts the other eight
    crowd = place_labels(
        [(200, f"e{n}") for n in range(10)], width, lanes=3, low=0, high=400, gap=4
    )
    assert [(p.text, p.lane, p.marks) for p in crowd] == [
        ("e0", 0, (0,)),
        ("e1", 1, (1,)),
        ("+8 more", 2, tuple(range(2, 10))),
    ]
    # at the edges: moved inside; one lane: the name it would hit is counted too
    edge = place_labels(
        [(0, "left"), (400, "right"), (398, "x")], width, lanes=1, low=0, high=400, gap=4
    )
    assert [(p.text, p.left, p.marks) for p in edge] == [
        ("left", 0.0, (0,)),
        ("+2 more", 400 - width("+2 more"), (2, 1)),
    ]
    # a count is centred under the first mark it counts
    spaced = place_labels(
        [(200 + n, f"e{n}") for n in range(6)], width, lanes=2, low=0, high=400, gap=4
    )
    assert [(p.text, p.left, p.marks) for p in spaced] == [
        ("e0", 194.0, (0,)),
        ("+5 more", 201 - width("+5 more") / 2, (1, 2, 3, 4, 5)),
    ]
    # exactly the gap apart is apart: a name, and a count
    touching = place_labels([(100, "aa"), (116, "bb")], width, lanes=2, low=0, high=400, gap=4)
    assert [(p.left, p.lane) for p in touching] == [(94.0, 0), (110.0, 0)]
    apart = place_labels([(50, "aa"), (81, "x"), (82, "y")], width, lanes=1, low=0, high=400, gap=4)
    assert [(p.text, p.left, p.marks) for p in apart] == [
        ("aa", 44.0, (0,)),
        ("+2 more", 60.0, (1, 2)),
    ]
    assert place_labels([], width, lanes=1, low=0, high=10, gap=1) == []
    with pytest.raises(ValueError, match="at least one lane"):
        place_labels([(1, "a")], width, lanes=0, low=0, high=10, gap=1)


@pytest.mark.parametrize("seed", range(40))
def test_place_labels_never_overlaps_and_counts_each_mark_once(seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - reproducible marks, not secrets
    high = rng.choice([300.0, 900.0])
    marks = [(rng.uniform(0, high), "n" * rng.randint(1, 14)) for _ in range(rng.randint(1, 200))]

    def width(text: str) -> float:
        return 5.5 * len(text)

    lanes = rng.randint(1, 3)
    placed = place_labels(marks, width, lanes=lanes, low=0, high=high, gap=6)
    counted = sorted(i for p in placed for i in p.marks)
    assert counted == list(range(len(marks)))  # each mark once
    for lane in range(lanes):
        row = [p for p in placed if p.lane == lane]
        assert all(a.right + 6 <= b.left for a, b in itertools.pairwise(row))
    for p in placed:
        assert p.left >= 0 and p.right <= high + 1e-9
        assert p.text == (marks[p.marks[0]][1] if len(p.marks) == 1 else more(len(p.marks)))


# -- 2. the legend fits inside the figure --------------------------------------------------------


def legend_inside(figure: Any) -> None:
    renderer = drawn(figure)
    (legend,) = figure.legends
    outer = figure.bbox
    for text in legend.get_texts():
        box = text.get_window_extent(renderer)
        assert outer.x0 <= box.x0 and box.x1 <= outer.x1, text.get_text()
        assert outer.y0 <= box.y0 and box.y1 <= outer.y1, text.get_text()
    (ax,) = figure.axes
    assert not legend.get_window_extent(renderer).overlaps(ax.bbox)
    for text in figure.texts:  # the title and the subtitle too
        box = text.get_window_extent(renderer)
        assert outer.x0 <= box.x0 and box.x1 <= outer.x1, text.get_text()


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_the_legend_lies_within_the_figure(
    store: EventStore, busy: BusyLog, tmp_path: Path, width: int, height: int
) -> None:
    """Was: the dashboard's legend ran past the figure's edge ("evicted (to make room for
    another engin")."""
    timeline = build_timeline(store.read_all())
    figure = figure_of(timeline, width=width, height=height)
    legend_inside(figure)
    (legend,) = figure.legends
    texts = [t.get_text() for t in legend.get_texts()]
    assert {MARKER_STYLE[k][2] for k in ("evicted", "unloaded", "refused", "crashed")} <= set(texts)
    assert "llamacpp:qwen2.5-coder-7b:0" in texts  # a key that fits is written whole
    check_png(png_of(timeline, width, height), tmp_path / "legend.png", width, height)


def test_a_legend_of_long_keys_and_many_engines_is_shortened_and_stays_inside(
    store: EventStore, clock: Clock, tmp_path: Path
) -> None:
    long = "llamacpp:" + "very-long-model-name-" * 5 + "q4_k_m:0"
    put(store, clock, 0, "ledger/host", reserved(long, 4 * GIB, 64 * GIB))
    for n in range(23):  # 24 engines: the most drawn one by one (PM35)
        put(store, clock, 1 + n, "ledger/host", reserved(f"llamacpp:model-{n}:0", GIB, 64 * GIB))
    put(store, clock, 30, f"engine/{long}", stop("evicted", "llamacpp:model-0:0"))
    timeline = build_timeline(store.read_all())
    assert len(timeline.engines) == 24
    for width, height in SIZES:
        figure = figure_of(timeline, width=width, height=height)
        legend_inside(figure)
        (legend,) = figure.legends
        first = legend.get_texts()[0].get_text()
        assert "…" in first and first.startswith("llam") and first.endswith("_m:0")
        if width >= 1200:  # room for a key's start and end
            assert first.startswith("llamacpp:ve") and first.endswith("q4_k_m:0")
    check_png(png_of(timeline, 1200, 520), tmp_path / "many.png", 1200, 520)


# -- 3. the live window fits the daemon ----------------------------------------------------------


def x_range(timeline: Timeline) -> tuple[float, float]:
    """The drawn axes' time range, in seconds since the epoch."""
    from matplotlib import dates

    (ax,) = figure_of(timeline, width=1200, height=520).axes
    low, high = ax.get_xlim()
    return (
        dates.num2date(low).timestamp(),  # type: ignore[no-untyped-call]
        dates.num2date(high).timestamp(),  # type: ignore[no-untyped-call]
    )


def daemon_log(store: EventStore, clock: Clock, *, age: float, since: float) -> None:
    """A log with a run of yesterday, then a daemon started ``since`` s before ``age`` s."""
    put(store, clock, -86_400, "ledger/host", reserved("e:old:0", 10 * MIB))
    put(store, clock, -86_000, "ledger/host", LedgerReleased("e:old:0", 10 * MIB, "me", "released"))
    put(store, clock, age - since, DAEMON_STREAM, started(at(age - since)))
    put(store, clock, age - since + 1, "ledger/host", reserved("e:a:0", 40 * MIB))
    put(store, clock, age, "ledger/host", reserved("e:b:0", 20 * MIB))


@pytest.mark.parametrize(
    ("since", "shown"),
    [
        (60.0, 60.0),  # a one-minute-old daemon: its minute, not a sliver of 30
        (90.0, 90.0),
        (600.0, 600.0),
        (7200.0, 1800.0),  # two hours old: the last 30 minutes
        (10.0, 10.0),
        (3.0, LEAST_SECONDS),  # three seconds old: the narrowest window, 10 s
    ],
)
def test_the_live_window_runs_from_the_daemons_start_within_its_bounds(
    store: EventStore, clock: Clock, since: float, shown: float
) -> None:
    """Was: a one-minute-old daemon drew its minute at the right edge of a fixed 30-minute
    window (its log held a run of yesterday, so the window began 30 minutes back)."""
    assert LEAST_SECONDS == 10.0
    daemon_log(store, clock, age=0.0, since=since)
    now = at(0.0)
    timeline = live_timeline(store, None, minutes=30, now=now)
    assert (timeline.start, timeline.end) == (now - shown, now)
    low, high = x_range(timeline)
    assert low == pytest.approx(now - shown, abs=1e-3) and high == pytest.approx(now, abs=1e-3)
    narrow = live_timeline(store, None, minutes=1, now=now)  # asked for less: never more
    assert narrow.end - narrow.start == min(shown, 60.0)


def test_a_log_without_a_daemon_start_is_drawn_from_its_first_event(
    store: EventStore, clock: Clock
) -> None:
    put(store, clock, -90, "ledger/host", reserved("e:a:0", 40 * MIB))
    put(store, clock, -30, "ledger/host", reserved("e:b:0", 40 * MIB))
    timeline = live_timeline(store, None, minutes=30, now=at(0))
    assert (timeline.start, timeline.end) == (at(-90), at(0))


def test_the_live_window_carries_in_what_the_daemon_held_at_its_start(
    store: EventStore, clock: Clock
) -> None:
    put(store, clock, -7200, DAEMON_STREAM, started(at(-7200)))
    put(store, clock, -7100, "ledger/host", reserved("e:a:0", 40 * MIB))
    timeline = live_timeline(store, None, minutes=30, now=at(0))
    assert (timeline.start, timeline.end) == (at(-1800), at(0))
    assert [(s.at, s.value) for s in timeline.reserved["e:a:0"]] == [(at(-1800), 40 * MIB)]


# -- 4. a refusal has its mark and legend entry --------------------------------------------------


def refusal(store: EventStore, clock: Clock, kind: str) -> int:
    """A log of one engine and one refusal of ``kind`` at 30 s; the refusal's seq."""
    put(store, clock, 0, DAEMON_STREAM, started(at(0)))
    put(store, clock, 1, "ledger/host", reserved("e:a:0", 40 * MIB))
    if kind == "ledger":
        denied = LedgerDenied("e:b:0", 90 * MIB, "me", 30 * MIB, "budget", 40 * MIB, 100 * MIB, 0)
        return put(store, clock, 30, "ledger/host", denied)
    if kind == "queue-timeout":
        return put(store, clock, 30, "queue/e:a:0", queue_timeout("e:a:0", 7, 20.0, at(30)))
    put(store, clock, 20, POOL_STREAM, PoolDrainStarted(at(20), "e:a:0", "e:b:0", 10.0))
    ended = PoolDrainEnded(at(30), "e:a:0", "busy", 10.0, {"rule": "PP5", "waited": 10.0})
    return put(store, clock, 30, POOL_STREAM, ended)


@pytest.mark.parametrize("kind", ["ledger", "queue-timeout", "engine-busy"])
def test_a_refusal_has_a_mark_at_its_moment_and_a_legend_entry(
    store: EventStore, clock: Clock, tmp_path: Path, kind: str
) -> None:
    """Was: a request refused for a queue timeout, or a start refused because the engine
    drained for its room stayed busy, left no mark (only the ledger's refusals had one)."""
    from matplotlib import dates

    seq = refusal(store, clock, kind)
    engine = "e:a:0" if kind == "queue-timeout" else "e:b:0"
    cli = build_timeline(store.read_all())
    live = live_timeline(store, None, minutes=30, now=at(40))  # the dashboard's
    for timeline in (cli, live):
        (marker,) = timeline.markers
        assert (marker.seq, marker.kind, marker.at, marker.engine) == (
            seq,
            "refused",
            at(30),
            engine,
        )
        figure = figure_of(timeline, width=1200, height=520)
        (ax,) = figure.axes
        (point,) = [a for a in ax.lines if a.get_gid() == f"marker-refused-{seq}"]
        when = dates.date2num(datetime.fromtimestamp(at(30), UTC))  # type: ignore[no-untyped-call]
        assert list(point.get_xdata()) == [pytest.approx(when, abs=1e-9)]
        assert point.get_marker() == MARKER_STYLE["refused"][0] == "X"
        (legend,) = figure.legends
        entries = {
            t.get_text(): h for t, h in zip(legend.get_texts(), legend.legend_handles, strict=True)
        }
        assert entries["refused (no room, busy, timeout)"].get_marker() == "X"
        (label,) = [t for t in labels(figure) if t.get_gid() == f"label-refused-{seq}"]
        assert label.get_text() == engine.split(":")[1]
    check_png(png_of(live, 1200, 520), tmp_path / f"refused-{kind}.png", 1200, 520)
    said = {
        "ledger": "refused e:b:0: 30.0 MiB short",
        "queue-timeout": "refused request 7: no slot within its queue timeout",
        "engine-busy": "refused e:b:0: e:a:0 still busy after its drain",
    }
    assert cli.markers[0].label == said[kind]


def test_the_busy_log_marks_each_refusal(store: EventStore, busy: BusyLog) -> None:
    timeline = build_timeline(store.read_all())
    refused = [m.seq for m in timeline.markers if m.kind == "refused"]
    assert refused == busy.seqs["refused"] and len(refused) == 3
    live = live_timeline(store, None, minutes=30, now=at(busy.end))
    assert [m.seq for m in live.markers if m.kind == "refused"] == refused
