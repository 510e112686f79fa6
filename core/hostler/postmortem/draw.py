"""Draw a :class:`~hostler.postmortem.timeline.Timeline` as SVG or PNG (matplotlib, Agg).

matplotlib is imported here only, when a picture is asked for: the CLI starts without it. It is
the ``plots`` extra (``pip install 'hostler[plots]'``): without it, :func:`require_plots` says so
in one line.
No pyplot: a :class:`~matplotlib.figure.Figure` of its own per picture, no global state.

Every series and marker carries a stable SVG element id (``gid``), so that a program can read
the picture back (PM32): ``engine-<key>`` (its reserved area), ``engine-<key>-measured``,
``budget``, ``marker-<kind>-<seq>`` and ``lease-<seq>`` (the lease's grant). Past 1,000
markers, one element per kind (``markers-<kind>``); past one step per pixel column, each
column shows the most each engine held within it (PM33).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import IO, Any

from hostler.errors import ExtraMissingError
from hostler.postmortem.timeline import (
    MARKER_KINDS,
    Marker,
    Span,
    Timeline,
    peaks_in,
    values_at,
)

__all__ = ["FORMATS", "MARKER_STYLE", "render", "require_plots"]

#: The formats :func:`render` writes.
FORMATS = ("svg", "png")

#: How each marker kind looks: (matplotlib marker, colour, legend text, row from the top).
MARKER_STYLE: dict[str, tuple[str, str, str, float]] = {
    "evicted": ("v", "#d62728", "evicted (to make room for another engine)", 0.95),
    "unloaded": ("^", "#ff7f0e", "unloaded (for a lease, or on request)", 0.89),
    "refused": ("X", "#000000", "refused (did not fit the budget)", 0.83),
    "crashed": ("*", "#9400d3", "crashed", 0.77),
    "lost": ("D", "#8c564b", "lost (found gone)", 0.71),
}

_PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#17becf", "#bcbd22",
    "#e377c2", "#7f7f7f", "#8c564b", "#9467bd", "#aec7e8",
)  # fmt: skip
_DPI = 100
_DAY = 86_400.0
#: The y axis reaches this much above the peak (room for the marker rows).
_HEADROOM = 1.5
#: A budget more than this many times the engines' peak is drawn off the scale.
_OFF_SCALE = 3
#: Marker labels are written beside each marker up to this many markers.
_LABELLED = 40
#: Up to this many markers, each is an element of its own (``marker-<kind>-<seq>``); past it,
#: one element per kind (``markers-<kind>``) keeps a picture of a long log small.
_MARKERS_EACH = 1000


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
    require_plots()
    import matplotlib  # noqa: PLC0415 - lazily: the CLI must start fast
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    with matplotlib.rc_context(
        {"svg.fonttype": "none", "svg.hashsalt": "hostler-timeline", "font.size": 10}
    ):
        figure = Figure(figsize=(width / _DPI, height / _DPI), dpi=_DPI)
        FigureCanvasAgg(figure)
        _draw(figure, timeline, title)
        metadata: dict[str, Any] = {"Date": None} if fmt == "svg" else {}
        figure.savefig(out, format=fmt, metadata=metadata)


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


def _draw(figure: Any, timeline: Timeline, title: str) -> None:  # noqa: PLR0912, PLR0915
    from matplotlib import dates as typed_dates  # noqa: PLC0415

    dates: Any = typed_dates  # matplotlib.dates is untyped
    from matplotlib.lines import Line2D  # noqa: PLC0415
    from matplotlib.patches import Patch  # noqa: PLC0415

    def x(at: float) -> float:
        return float(dates.date2num(datetime.fromtimestamp(at, UTC)))

    ax = figure.add_axes((0.07, 0.11, 0.64, 0.76))
    peak = _axis_peak(timeline)
    scale, unit = _unit(peak)
    start, end = timeline.start, max(timeline.end, timeline.start + 1.0)
    moments = [m for m in timeline.moments() if start <= m <= end]
    if moments[-1] < end:
        moments.append(end)
    columns = figure.get_figwidth() * _DPI
    resampled = len(moments) > columns
    if resampled:  # more steps than pixels: each column shows the most held in it
        moments = [start + (end - start) * i / columns for i in range(int(columns) + 1)]
    xs = [x(m) for m in moments]
    base = [0.0] * len(moments)
    handles: list[Any] = []
    for index, key in enumerate(timeline.engines):
        colour = _PALETTE[index % len(_PALETTE)]
        sample = peaks_in if resampled else values_at
        reserved = [v / scale for v in sample(timeline.reserved[key], moments)]
        measured = [v / scale for v in sample(timeline.measured[key], moments)]
        if resampled:  # one value per column: the last column's value holds to the end
            reserved.append(reserved[-1])
            measured.append(measured[-1])
        top = [b + r for b, r in zip(base, reserved, strict=True)]
        area = ax.fill_between(xs, base, top, step="post", color=colour, alpha=0.3, lw=0)
        area.set_gid(f"engine-{key}")
        solid = [b + m for b, m in zip(base, measured, strict=True)]
        used = ax.fill_between(xs, base, solid, step="post", color=colour, alpha=0.85, lw=0)
        used.set_gid(f"engine-{key}-measured")
        handles.append(Patch(facecolor=colour, alpha=0.85, label=key))
        base = [b + max(r, m) for b, r, m in zip(base, reserved, measured, strict=True)]
    ceiling = peak / scale * _HEADROOM
    if timeline.budget:
        bx = [x(max(s.at, start)) for s in timeline.budget] + [x(end)]
        by = [min(s.value / scale, ceiling) for s in timeline.budget]
        (line,) = ax.step(bx, [*by, by[-1]], where="post", color="black", lw=2, ls="--")
        line.set_gid("budget")
        for step in timeline.budget:
            if step.value / scale > ceiling:
                ax.annotate(
                    f" budget {step.value / 2**30:.1f} GiB (off the scale)",
                    (x(max(step.at, start)), ceiling), xytext=(4, -4),
                    textcoords="offset points", fontsize=8, va="top",
                )  # fmt: skip
        handles.append(Line2D([], [], color="black", lw=2, ls="--", label="budget"))
    handles += [
        Patch(facecolor="#888888", alpha=0.3, label="reserved (light)"),
        Patch(facecolor="#888888", alpha=0.85, label="measured (solid)"),
    ]
    for span in timeline.spans:
        _span(ax, span, x)
    if timeline.spans:
        handles.append(Patch(facecolor="#ffd27f", alpha=0.5, hatch="//", label="GPU lease held"))
    placed: dict[str, list[float]] = {}
    near = (x(end) - x(start)) * 0.03
    if len(timeline.markers) > _MARKERS_EACH:
        _marker_groups(ax, timeline.markers, x)
    for marker in timeline.markers if len(timeline.markers) <= _MARKERS_EACH else ():
        row = placed.setdefault(marker.kind, [])
        depth = sum(1 for other in row if abs(other - x(marker.at)) < near)
        row.append(x(marker.at))
        _marker(ax, marker, x, labelled=len(timeline.markers) <= _LABELLED, depth=depth)
    kinds = [k for k in MARKER_KINDS if any(m.kind == k for m in timeline.markers)]
    for kind in kinds:
        shape, colour, text, _row = MARKER_STYLE[kind]
        handles.append(Line2D([], [], marker=shape, color=colour, ls="", markersize=9, label=text))
    ax.set_xlim(x(start), x(end))
    ax.set_ylim(0, ceiling)
    ax.set_ylabel(f"memory ({unit})")
    days = end - start > _DAY  # past a day, the date matters more than the second
    ax.set_xlabel("time (UTC, MM-DD HH:MM)" if days else "time (UTC, HH:MM:SS)")
    locator = dates.AutoDateLocator(tz=UTC, minticks=6, maxticks=14)
    ax.xaxis.set_major_locator(locator)
    shown = "%m-%d %H:%M" if days else "%H:%M:%S"
    ax.xaxis.set_major_formatter(dates.DateFormatter(shown, tz=UTC))
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    if not timeline.engines:
        ax.set_ylim(0, 1)
        ax.set_yticks([])
        ax.text(0.5, 0.5, "no memory decisions in this range", ha="center", transform=ax.transAxes)
    figure.suptitle(title, x=0.07, ha="left", fontsize=14, fontweight="bold")
    figure.text(0.07, 0.905, _subtitle(timeline), fontsize=10, color="#444444")


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


def _span(ax: Any, span: Span, x: Any) -> None:
    shade = ax.axvspan(x(span.start), x(span.end), color="#ffd27f", alpha=0.35, hatch="//", lw=0)
    shade.set_gid(f"lease-{span.seq}")
    held = "held (still, at the end)" if span.open else "held"
    ax.text(
        x(span.start), 0.02, f" lease {span.label} {held}", transform=ax.get_xaxis_transform(),
        fontsize=8, va="bottom", color="#8a5a00",
    )  # fmt: skip


def _marker_groups(ax: Any, markers: tuple[Marker, ...], x: Any) -> None:
    """Markers past :data:`_MARKERS_EACH`: one element per kind (``markers-<kind>``)."""
    for kind in MARKER_KINDS:
        times = [x(m.at) for m in markers if m.kind == kind]
        if not times:
            continue
        shape, colour, _text, row = MARKER_STYLE[kind]
        (points,) = ax.plot(
            times, [row] * len(times), marker=shape, color=colour, markersize=7, ls="",
            transform=ax.get_xaxis_transform(), clip_on=False,
        )  # fmt: skip
        points.set_gid(f"markers-{kind}")


def _marker(ax: Any, marker: Marker, x: Any, *, labelled: bool, depth: int) -> None:
    shape, colour, _text, row = MARKER_STYLE[marker.kind]
    ax.axvline(x(marker.at), color=colour, lw=0.8, alpha=0.35, ls=":")
    (point,) = ax.plot(
        [x(marker.at)], [row], marker=shape, color=colour, markersize=10, ls="",
        transform=ax.get_xaxis_transform(), clip_on=False,
    )  # fmt: skip
    point.set_gid(f"marker-{marker.kind}-{marker.seq}")
    if labelled:
        ax.text(
            x(marker.at), row - 0.03 - 0.025 * depth, _short(marker.engine),
            transform=ax.get_xaxis_transform(), fontsize=7, ha="center", va="top", color=colour,
        )  # fmt: skip
