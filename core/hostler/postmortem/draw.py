"""Draw a :class:`~hostler.postmortem.timeline.Timeline` as SVG or PNG (matplotlib, Agg).

matplotlib is imported here only, when a picture is asked for: the CLI starts without it. It is
the ``plots`` extra (``pip install 'hostler[plots]'``): without it, :func:`require_plots` says so
in one line.
No pyplot: a :class:`~matplotlib.figure.Figure` of its own per picture, no global state.

Every series and marker carries a stable SVG element id (``gid``), so that a program can read
the picture back (PM32): ``engine-<key>`` (its reserved area), ``engine-<key>-measured``,
``budget``, ``marker-<kind>-<seq>``, ``label-<kind>-<seq>`` (the engine named under a marker),
``more-<kind>-<seq>`` (``+N more``: the marks from that one on whose names found no room) and
``lease-<seq>`` (the lease's grant). Past 1,000 markers, one element per kind
(``markers-<kind>``); past one step per pixel column, each column shows the most each engine
held within it (PM33).

One place lays the picture out (:func:`_layout`, PM36): the legend takes the figure's right
edge as wide as its texts, the axes the rest; each kind of marker present a row at the top of
the axes, with as many lanes for its labels under it as they take
(:func:`hostler.postmortem.lanes.place_labels`: no two overlap, every mark named or counted),
and the y axis reaches high enough that the engines stay below them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any

from hostler.errors import ExtraMissingError
from hostler.postmortem.lanes import place_labels
from hostler.postmortem.timeline import (
    MARKER_KINDS,
    Marker,
    Span,
    Timeline,
    peaks_in,
    values_at,
)

__all__ = ["FORMATS", "MARKER_STYLE", "figure_of", "render", "require_plots"]

#: The formats :func:`render` writes.
FORMATS = ("svg", "png")

#: How each marker kind looks: (matplotlib marker, colour, legend text).
MARKER_STYLE: dict[str, tuple[str, str, str]] = {
    "evicted": ("v", "#d62728", "evicted (for another engine)"),
    "unloaded": ("^", "#ff7f0e", "unloaded (lease or request)"),
    "refused": ("X", "#000000", "refused (no room, busy, timeout)"),
    "crashed": ("*", "#9400d3", "crashed"),
    "lost": ("D", "#8c564b", "lost (found gone)"),
}

_PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#17becf", "#bcbd22",
    "#e377c2", "#7f7f7f", "#8c564b", "#9467bd", "#aec7e8",
)  # fmt: skip
_DPI = 100
_DAY = 86_400.0
#: A budget more than this many times the engines' peak is drawn off the scale.
_OFF_SCALE = 3
#: Up to this many markers, each is an element of its own (``marker-<kind>-<seq>``); past it,
#: one element per kind (``markers-<kind>``) keeps a picture of a long log small.
_MARKERS_EACH = 1000

# The layout, in pixels at 100 dpi unless named a fraction (of the figure).
_LEFT, _BOTTOM, _TOP = 0.07, 0.11, 0.87  # the axes' edges but the right one
_EDGE = 8.0  # between the legend and the figure's right edge
_LEGEND_GAP = 40.0  # between the axes and the legend: the last time tick's label overhangs
_LEGEND_MOST = 0.4  # an engine key takes at most this fraction of the figure's width
_LEGEND_KEY = 56.0  # a legend entry's key and padding, beside its text
_ROW = 18.0  # a marker row
_ROOF = 4.0  # above the first marker row
_LANE = 12.0  # a lane of labels under it
_LANES = 3  # the most lanes a marker row has
_BANDS_MOST = 0.5  # marker rows and their lanes take at most this fraction of the axes' height
_CLEAR = 0.04  # between the engines' peak and the first marker row (fraction of the height)
_LABEL_PT = 7  # the labels' font size (points)
_LEASE_PT = 8  # a lease's
_LABEL_GAP = 6.0  # between two labels of a lane
_LABEL_MOST = 150.0  # a label wider than this is shortened in the middle
_TICK = 70.0  # the axis has at most one time tick per this many pixels of its width
_COUNT, _FIGURE = re.compile(r"\+\d+ more"), re.compile(r"\d")  # what lanes.more writes


def require_plots() -> None:
    """Check that matplotlib (the ``plots`` extra) can be imported.

    Raises:
        ExtraMissingError: It cannot; the message names the install line.
    """
    try:
        import matplotlib  # noqa: F401, PLC0415 - lazily: the CLI must start fast
    except ImportError as exc:
        raise ExtraMissingError(
            f"the timeline picture is drawn with matplotlib, which is not installed here "
            f"({exc}): install the plots extra, pip install 'hostler[plots]'"
        ) from None


def render(
    timeline: Timeline,
    out: IO[bytes],
    *,
    fmt: str,
    width: int = 1400,
    height: int = 700,
    title: str = "hostler memory timeline",
) -> None:
    """Write the picture of ``timeline`` to ``out`` as ``fmt`` (``svg`` or ``png``).

    ``width`` and ``height`` are in pixels (at 100 dpi).
    """
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r}: one of {', '.join(FORMATS)}")
    figure = figure_of(timeline, width=width, height=height, title=title)
    with _style():
        metadata: dict[str, Any] = {"Date": None} if fmt == "svg" else {}
        figure.savefig(out, format=fmt, metadata=metadata)


def figure_of(
    timeline: Timeline,
    *,
    width: int = 1400,
    height: int = 700,
    title: str = "hostler memory timeline",
) -> Any:
    """The picture of ``timeline``: a matplotlib ``Figure`` on an Agg canvas, laid out.

    What :func:`render` saves; a program (or a test) may read its artists back.
    """
    require_plots()
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    with _style():
        figure = Figure(figsize=(width / _DPI, height / _DPI), dpi=_DPI)
        FigureCanvasAgg(figure)
        _draw(figure, timeline, title)
    return figure


def _style() -> Any:
    """The settings a picture is drawn and saved with (the same bytes for the same timeline)."""
    import matplotlib  # noqa: PLC0415 - lazily: the CLI must start fast

    return matplotlib.rc_context(
        {"svg.fonttype": "none", "svg.hashsalt": "hostler-timeline", "font.size": 10}
    )


def _axis_peak(timeline: Timeline) -> int:
    """What the y axis must show: the engines' peak, and each budget not far above it (PM33).

    A budget over three times what the engines ever held (a 40 GiB budget over 60 MiB
    engines) would flatten them to a line: it is drawn at the top edge and its figure named.
    """
    held = timeline.peak()
    budgets = [s.value for s in timeline.budget]
    if not held:
        return max([*budgets, 1])
    return max([held, *(b for b in budgets if b <= _OFF_SCALE * held)])


def _unit(peak: int) -> tuple[float, str]:
    """Bytes per axis unit and its name: GiB from 1 GiB up, else MiB."""
    return (2.0**30, "GiB") if peak >= 2**30 else (2.0**20, "MiB")


def _short(key: str | None) -> str:
    """``llamacpp:qwen:0`` → ``qwen`` (replica 0), ``qwen#1`` for other replicas."""
    if key is None:
        return ""
    parts = key.split(":")
    if len(parts) == 3:
        return parts[1] if parts[2] == "0" else f"{parts[1]}#{parts[2]}"
    return key


def _clock(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%H:%M:%S")


class _Measure:
    """Text widths in pixels, as the figure's renderer draws them (each text measured once)."""

    def __init__(self, figure: Any, points: float) -> None:
        from matplotlib.font_manager import FontProperties  # noqa: PLC0415

        self._renderer = figure.canvas.get_renderer()
        self._font = FontProperties(size=points)
        self._known: dict[str, float] = {}

    def __call__(self, text: str) -> float:
        if _COUNT.fullmatch(text):  # ``+N more``: its figures are all one width (tabular)
            text = _FIGURE.sub("0", text)
        known = self._known.get(text)
        if known is None:
            width, _height, _descent = self._renderer.get_text_width_height_descent(
                text, self._font, ismath=False
            )
            known = self._known[text] = float(width)
        return known

    def fit(self, text: str, most: float) -> str:
        """``text``, shortened in the middle (``…``) until it is at most ``most`` wide."""
        if self(text) <= most:
            return text
        low, high = 0, len(text)  # the most characters kept that fit
        while low < high:
            keep = (low + high + 1) // 2
            if self(_cut(text, keep)) <= most:
                low = keep
            else:
                high = keep - 1
        return _cut(text, low)


def _cut(text: str, keep: int) -> str:
    """``text`` with its middle replaced by ``…``, ``keep`` of its characters kept."""
    head = (keep + 1) // 2
    return f"{text[:head]}…{text[len(text) - (keep - head) :]}"


@dataclass(frozen=True, slots=True)
class _Label:
    """A text written in the axes, and its element id (None: none of its own).

    ``x`` is its left edge and ``y`` its top (a marker's label) or foot (a lease's), as
    fractions of the axes.
    """

    x: float
    y: float
    text: str
    gid: str | None


@dataclass(frozen=True, slots=True)
class _Layout:
    """Where everything goes (PM36): decided once, from the figure, the legend and the marks.

    Attributes:
        rect: The axes (left, bottom, width, height), fractions of the figure.
        width: The axes' width in pixels; ``height`` its height.
        start: The moment at the axes' left edge; ``end`` at the right (a second later at
            least).
        ticks: The most time ticks the axis has room for.
        subtitle: The subtitle's font size (points): the largest that keeps it on one line.
        headroom: The y axis reaches this many times the engines' peak: they stay below the
            marker rows.
        rows: Marker kind → where its row runs in the axes (fraction, from the bottom).
        labels: Marker kind → the names and counts written under its row (tops).
        leases: What each lease was for, at the axes' foot.
        floor: Below every marker row and its labels (fraction): where a note at the top
            begins.
    """

    rect: tuple[float, float, float, float]
    width: float
    height: float
    start: float
    end: float
    ticks: int
    subtitle: float
    headroom: float
    rows: dict[str, float]
    labels: dict[str, tuple[_Label, ...]]
    leases: tuple[_Label, ...]
    floor: float


def _layout(figure: Any, legend_left: float, timeline: Timeline, kinds: list[str]) -> _Layout:
    """The axes left of the legend; a row per marker kind present, its labels' lanes under it.

    Each row has as many lanes (up to :data:`_LANES`, and as half the axes' height allows)
    as its labels take: the names that fit, then ``+N more`` (:func:`place_labels`).
    """
    wide, tall = figure.bbox.width, figure.bbox.height
    right = legend_left - _LEGEND_GAP / wide
    rect = (_LEFT, _BOTTOM, max(right - _LEFT, 0.2), _TOP - _BOTTOM)
    width, height = float(rect[2] * wide), float(rect[3] * tall)
    start, end = timeline.start, max(timeline.end, timeline.start + 1.0)

    def pixel(at: float) -> float:
        return (at - start) / (end - start) * width

    most = 1
    if kinds:
        most = max(1, min(_LANES, int((_BANDS_MOST * height / len(kinds) - _ROW) // _LANE)))
    measure = _Measure(figure, _LABEL_PT)
    rows: dict[str, float] = {}
    labels: dict[str, tuple[_Label, ...]] = {}
    top = _ROOF  # pixels from the axes' top
    for kind in kinds:
        markers = [m for m in timeline.markers if m.kind == kind]
        where = [(pixel(m.at), _name(m, measure)) for m in markers]
        placed = place_labels(where, measure, lanes=most, low=0, high=width, gap=_LABEL_GAP)
        rows[kind] = 1 - (top + _ROW / 2) / height
        labels[kind] = tuple(
            _Label(
                p.left / width,
                1 - (top + _ROW + p.lane * _LANE) / height,
                p.text,
                f"{'label' if len(p.marks) == 1 else 'more'}-{kind}-{markers[p.marks[0]].seq}",
            )
            for p in placed
        )
        top += _ROW + _LANE * (1 + max((p.lane for p in placed), default=-1))
    floor = 1 - top / height
    headroom = 1 / max(floor - _CLEAR, 1 - _BANDS_MOST - _CLEAR)  # the peak stays under them
    leases = _lease_labels(figure, timeline.spans, pixel, width=width, height=height)
    ticks = max(3, min(14, int(width // _TICK)))  # a narrow axis: fewer, never overlapping
    room = (1 - _LEFT) * wide - _EDGE
    sizes = (10.0, 9.0, 8.0, 7.0, 6.0)
    subtitle = next((n for n in sizes if _Measure(figure, n)(_subtitle(timeline)) <= room), 6.0)
    return _Layout(
        rect, width, height, start, end, ticks, subtitle, headroom, rows, labels, leases, floor
    )


def _lease_labels(
    figure: Any,
    spans: tuple[Span, ...],
    pixel: Callable[[float], float],
    *,
    width: float,
    height: float,
) -> tuple[_Label, ...]:
    """What each lease was for, from where it begins, in two lanes up from the axes' foot."""
    measure = _Measure(figure, _LEASE_PT)
    texts = [
        measure.fit(f"lease {s.label} {'held (still, at the end)' if s.open else 'held'}", 300)
        for s in spans
    ]  # each centred half its width after its start: it begins where the lease does
    where = [(pixel(s.start) + measure(t) / 2 + 3, t) for s, t in zip(spans, texts, strict=True)]
    placed = place_labels(where, measure, lanes=2, low=0, high=width, gap=_LABEL_GAP)
    return tuple(
        _Label(p.left / width, (_ROOF + p.lane * _LANE * 1.2) / height, p.text, None)
        for p in placed
    )


def _legend(figure: Any, handles: list[Any], keys: int) -> float:
    """The legend at the figure's right edge; its left edge (a fraction of the figure).

    As wide as its texts: an engine key (the first ``keys`` entries) wider than
    :data:`_LEGEND_MOST` of the figure is shortened in the middle, the other texts are short;
    in more columns when one would run past the figure's foot.
    """
    measure = _Measure(figure, 10)
    renderer = figure.canvas.get_renderer()
    texts = [handle.get_label() for handle in handles[:keys]]
    anchor = (1 - _EDGE / figure.bbox.width, _TOP)
    for columns in (1, 2, 3):
        most = figure.bbox.width * _LEGEND_MOST / columns - _LEGEND_KEY
        for handle, text in zip(handles, texts, strict=False):
            handle.set_label(measure.fit(text, most))
        legend = figure.legend(
            handles=handles, loc="upper right", bbox_to_anchor=anchor, ncols=columns,
            frameon=False, borderaxespad=0.0,
        )  # fmt: skip
        box = legend.get_window_extent(renderer)
        if box.y0 >= 0 or columns == 3:
            return float(box.x0 / figure.bbox.width)
        legend.remove()
    raise AssertionError("unreachable")  # pragma: no cover


def _handles(timeline: Timeline, kinds: list[str]) -> list[Any]:
    """The legend's entries: each engine, the budget, the two shades, leases, marker kinds."""
    from matplotlib.lines import Line2D  # noqa: PLC0415
    from matplotlib.patches import Patch  # noqa: PLC0415

    handles: list[Any] = [
        Patch(facecolor=_colour(index), alpha=0.85, label=key)
        for index, key in enumerate(timeline.engines)
    ]
    if timeline.budget:
        handles.append(Line2D([], [], color="black", lw=2, ls="--", label="budget"))
    handles += [
        Patch(facecolor="#888888", alpha=0.3, label="reserved (light)"),
        Patch(facecolor="#888888", alpha=0.85, label="measured (solid)"),
    ]
    if timeline.spans:
        handles.append(Patch(facecolor="#ffd27f", alpha=0.5, hatch="//", label="GPU lease held"))
    for kind in kinds:
        shape, colour, text = MARKER_STYLE[kind]
        handles.append(Line2D([], [], marker=shape, color=colour, ls="", markersize=9, label=text))
    return handles


def _colour(index: int) -> str:
    return _PALETTE[index % len(_PALETTE)]


@dataclass(frozen=True, slots=True)
class _Plot:
    """The axes being drawn on, where they sit, and the moments at their two edges."""

    ax: Any
    layout: _Layout
    start: float
    end: float
    origin: float  # ``start`` as matplotlib's date number (days)

    @classmethod
    def of(cls, ax: Any, layout: _Layout, start: float, end: float) -> _Plot:
        """The plot on ``ax`` from ``start`` to ``end`` (seconds since the epoch)."""
        from matplotlib import dates  # noqa: PLC0415

        origin = dates.date2num(datetime.fromtimestamp(start, UTC))  # type: ignore[no-untyped-call]
        return cls(ax, layout, start, end, float(origin))

    def x(self, at: float) -> float:
        """``at`` (seconds since the epoch) as matplotlib's date number: days, linear."""
        return self.origin + (at - self.start) / _DAY


def _draw(figure: Any, timeline: Timeline, title: str) -> None:
    from matplotlib import dates as typed_dates  # noqa: PLC0415

    dates: Any = typed_dates  # matplotlib.dates is untyped
    kinds = [k for k in MARKER_KINDS if any(m.kind == k for m in timeline.markers)]
    legend = _legend(figure, _handles(timeline, kinds), len(timeline.engines))
    layout = _layout(figure, legend, timeline, kinds)
    start, end = layout.start, layout.end
    plot = _Plot.of(figure.add_axes(layout.rect), layout, start, end)
    ax = plot.ax
    peak = _axis_peak(timeline)
    scale, unit = _unit(peak)
    _series(plot, timeline, scale)
    ceiling = peak / scale * layout.headroom
    if timeline.budget:
        _budget(plot, timeline, scale=scale, ceiling=ceiling)
    _spans(plot, timeline.spans)
    _marks(plot, timeline, kinds)
    ax.set_xlim(plot.x(start), plot.x(end))
    ax.set_ylim(0, ceiling)
    ax.set_ylabel(f"memory ({unit})")
    days = end - start > _DAY  # past a day, the date matters more than the second
    ax.set_xlabel("time (UTC, MM-DD HH:MM)" if days else "time (UTC, HH:MM:SS)")
    most = layout.ticks
    locator = dates.AutoDateLocator(tz=UTC, minticks=min(6, most - 1), maxticks=most)
    if end - start <= most:  # a few seconds: a tick a second, never one label written twice
        locator = dates.SecondLocator(tz=UTC)
    ax.xaxis.set_major_locator(locator)
    shown = "%m-%d %H:%M" if days else "%H:%M:%S"
    ax.xaxis.set_major_formatter(dates.DateFormatter(shown, tz=UTC))
    ax.grid(True, axis="y", alpha=0.3)
    if not timeline.engines:
        ax.set_ylim(0, 1)
        ax.set_yticks([])
        ax.text(0.5, 0.5, "no memory decisions in this range", ha="center", transform=ax.transAxes)
    figure.suptitle(title, x=_LEFT, ha="left", fontsize=14, fontweight="bold")
    figure.text(_LEFT, 0.905, _subtitle(timeline), fontsize=layout.subtitle, color="#444444")


def _series(plot: _Plot, timeline: Timeline, scale: float) -> None:
    """Each engine's reserved (light) and measured (solid) bytes, stacked."""
    start, end = plot.start, plot.end
    moments = [m for m in timeline.moments() if start <= m <= end]
    if moments[-1] < end:
        moments.append(end)
    columns = plot.ax.figure.get_figwidth() * _DPI
    resampled = len(moments) > columns
    if resampled:  # more steps than pixels: each column shows the most held in it
        moments = [start + (end - start) * i / columns for i in range(int(columns) + 1)]
    xs = [plot.x(m) for m in moments]
    base = [0.0] * len(moments)
    for index, key in enumerate(timeline.engines):
        colour = _colour(index)
        sample = peaks_in if resampled else values_at
        reserved = [v / scale for v in sample(timeline.reserved[key], moments)]
        measured = [v / scale for v in sample(timeline.measured[key], moments)]
        if resampled:  # one value per column: the last column's value holds to the end
            reserved.append(reserved[-1])
            measured.append(measured[-1])
        top = [b + r for b, r in zip(base, reserved, strict=True)]
        area = plot.ax.fill_between(xs, base, top, step="post", color=colour, alpha=0.3, lw=0)
        area.set_gid(f"engine-{key}")
        solid = [b + m for b, m in zip(base, measured, strict=True)]
        used = plot.ax.fill_between(xs, base, solid, step="post", color=colour, alpha=0.85, lw=0)
        used.set_gid(f"engine-{key}-measured")
        base = [b + max(r, m) for b, r, m in zip(base, reserved, measured, strict=True)]


def _budget(plot: _Plot, timeline: Timeline, *, scale: float, ceiling: float) -> None:
    """The budget's steps (dashed); one far above the engines at the top edge (PM33)."""
    bx = [plot.x(max(s.at, plot.start)) for s in timeline.budget] + [plot.x(plot.end)]
    by = [min(s.value / scale, ceiling) for s in timeline.budget]
    (line,) = plot.ax.step(bx, [*by, by[-1]], where="post", color="black", lw=2, ls="--")
    line.set_gid("budget")
    for step in timeline.budget:
        if step.value / scale > ceiling:  # named under the marker rows: never over a label
            plot.ax.text(
                plot.x(max(step.at, plot.start)), plot.layout.floor,
                f" budget {step.value / 2**30:.1f} GiB (off the scale)",
                transform=plot.ax.get_xaxis_transform(), fontsize=8, va="top",
            )  # fmt: skip


def _subtitle(timeline: Timeline) -> str:
    counts = {k: sum(1 for m in timeline.markers if m.kind == k) for k in MARKER_KINDS}
    said = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
    span = timeline.end - timeline.start
    day = datetime.fromtimestamp(timeline.start, UTC).strftime("%Y-%m-%d")
    parts = [
        f"{day} {_clock(timeline.start)}–{_clock(timeline.end)} UTC ({span:.0f} s)",
        f"{len(timeline.engines)} engines",
        said or "no evictions, refusals or crashes",
        f"{len(timeline.spans)} GPU lease{'' if len(timeline.spans) == 1 else 's'}",
    ]
    return " · ".join(parts)


def _spans(plot: _Plot, spans: tuple[Span, ...]) -> None:
    """Each lease held, shaded; what it was for written at its foot (PM36)."""
    ax = plot.ax
    for span in spans:
        shade = ax.axvspan(
            plot.x(span.start), plot.x(span.end), color="#ffd27f", alpha=0.35, hatch="//", lw=0
        )
        shade.set_gid(f"lease-{span.seq}")
    for label in plot.layout.leases:
        ax.text(
            label.x, label.y, label.text, transform=ax.transAxes, fontsize=_LEASE_PT,
            va="bottom", color="#8a5a00",
        )  # fmt: skip


def _marks(plot: _Plot, timeline: Timeline, kinds: list[str]) -> None:
    """Each kind's markers on its row, and the engines they concern under it (PM36)."""
    ax, layout = plot.ax, plot.layout
    each = len(timeline.markers) <= _MARKERS_EACH
    for kind in kinds:
        markers = [m for m in timeline.markers if m.kind == kind]
        shape, colour, _text = MARKER_STYLE[kind]
        row = layout.rows[kind]
        if each:
            for marker in markers:
                _marker(plot, marker, row)
        else:
            (points,) = ax.plot(
                [plot.x(m.at) for m in markers], [row] * len(markers), marker=shape,
                color=colour, markersize=7, ls="", transform=ax.get_xaxis_transform(),
                clip_on=False,
            )  # fmt: skip
            points.set_gid(f"markers-{kind}")
        for label in layout.labels[kind]:
            text = ax.text(
                label.x, label.y, label.text, transform=ax.transAxes, fontsize=_LABEL_PT,
                ha="left", va="top", color=colour, clip_on=False,
            )  # fmt: skip
            text.set_gid(label.gid)


def _name(marker: Marker, measure: _Measure) -> str:
    """What is written under a marker: the engine it concerns, short."""
    return measure.fit(_short(marker.engine) or marker.kind, _LABEL_MOST)


def _marker(plot: _Plot, marker: Marker, row: float) -> None:
    shape, colour, _text = MARKER_STYLE[marker.kind]
    plot.ax.axvline(plot.x(marker.at), color=colour, lw=0.8, alpha=0.35, ls=":")
    (point,) = plot.ax.plot(
        [plot.x(marker.at)], [row], marker=shape, color=colour, markersize=10, ls="",
        transform=plot.ax.get_xaxis_transform(), clip_on=False,
    )  # fmt: skip
    point.set_gid(f"marker-{marker.kind}-{marker.seq}")
