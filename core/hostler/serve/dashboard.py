"""The web dashboard at ``/``: a page, its script and style, and the timeline as SVG.

Plain HTML and a little JavaScript (``static/``, shipped in the wheel), no build step and
nothing fetched from outside the daemon. The page holds no data: its script reads the same
routes as the CLI (``/api/engines``, ``/api/queues``, ``/api/leases``, ``/api/budget``), the
live tail of ``/api/events`` and ``/api/timeline.svg``: the timeline of this daemon's own time,
at most the minutes asked for (:func:`live_timeline`, PM37). Where reads need the token (a public
daemon), the page takes it from the URL fragment (``/#token=...``: a fragment never reaches
the server, nor its access log) and sends it as a bearer header (PM34).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from datetime import UTC, datetime
from functools import cache
from importlib.resources import files
from typing import TYPE_CHECKING

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from hostler.clock import Clock
from hostler.errors import HostlerError
from hostler.events.daemon import DAEMON_STREAM
from hostler.serve.errors import error_response, hostler_error_response
from hostler.serve.operator import Guard, is_number
from hostler.store.log import EventStore

if TYPE_CHECKING:
    from hostler.postmortem.timeline import Timeline

__all__ = [
    "ASSETS",
    "LEAST_SECONDS",
    "MAX_MINUTES",
    "TIMELINE_PATH",
    "TIMELINE_TYPES",
    "dashboard_routes",
    "live_timeline",
    "timeline_svg",
]

#: Where the timeline picture is served.
TIMELINE_PATH = "/api/timeline.svg"

#: Route → (file under ``static/``, media type).
ASSETS: dict[str, tuple[str, str]] = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}

#: The event types the timeline folds (read alone, the rest of a large log is skipped);
#: ``daemon.started`` marks nothing but where this daemon's time begins.
TIMELINE_TYPES = (
    "daemon.started",
    "ledger.reserved",
    "ledger.released",
    "ledger.adopted",
    "ledger.carried",
    "ledger.measured",
    "ledger.budget_set",
    "ledger.denied",
    "engine.stop_requested",
    "engine.crashed",
    "engine.lost",
    "pool.drain_started",
    "pool.drain_ended",
    "queue.cancelled",
    "lease.requested",
    "lease.granted",
    "lease.released",
    "lease.broken",
)

#: The widest window the timeline shows by default, and the widest one asked for (minutes).
DEFAULT_MINUTES, MAX_MINUTES = 30, 7 * 24 * 60
#: The narrowest window it shows (seconds): a daemon seconds old still has an axis to read,
#: and its data most of the picture.
LEAST_SECONDS = 10.0

#: The page may load its own script, style and pictures, and talk to its own daemon only.
_PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
#: An SVG opened on its own runs no script and loads nothing.
_SVG_POLICY = "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'"


@cache
def _asset(name: str) -> bytes:
    return files("hostler.serve").joinpath("static", name).read_bytes()


def live_timeline(
    store: EventStore, ledger: EventStore | None, *, minutes: int, now: float
) -> Timeline:
    """The dashboard's timeline (PM37; blocking: run it off the loop): this daemon's own time.

    From the daemon's start (its last ``daemon.started`` in ``store``; a log without one:
    its first event) to ``now``, at least :data:`LEAST_SECONDS` and at most ``minutes`` wide.
    ``ledger``: the host ledger's log, when the daemon keeps it apart from ``store``.
    """
    from hostler.postmortem.timeline import build_timeline  # noqa: PLC0415

    most = minutes * 60.0
    until = datetime.fromtimestamp(now, UTC)
    last = list(
        store.read_all(streams=[DAEMON_STREAM], types=["daemon.started"], until=until, last=1)
    )
    since = now - most
    if last and not last[0].damage:
        since = max(since, last[0].recorded_at.timestamp())
    return build_timeline(
        store.read_all(types=TIMELINE_TYPES),
        ledger=() if ledger is None else ledger.read_all(types=TIMELINE_TYPES),
        since=since,
        until=now,
        least=min(LEAST_SECONDS, most),
    )


def timeline_svg(
    store: EventStore, ledger: EventStore | None, *, minutes: int, now: float
) -> bytes:
    """:func:`live_timeline` drawn as SVG, titled with the time it shows (blocking)."""
    from hostler.postmortem.draw import render  # noqa: PLC0415 - matplotlib when drawn only

    timeline = live_timeline(store, ledger, minutes=minutes, now=now)
    title = f"hostler memory timeline — last {_duration(timeline.end - timeline.start)}"
    out = io.BytesIO()
    render(timeline, out, fmt="svg", width=1200, height=520, title=title)
    return out.getvalue()


def _duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``5 h``, ``3 days``: the unit that keeps the figure small."""
    for unit, size in (("days", 86_400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def dashboard_routes(
    store: EventStore, ledger: Callable[[], EventStore | None], guard: Guard, clock: Clock
) -> list[Route]:
    """The page (open: it holds nothing), its assets, and the guarded timeline route.

    ``store`` is the daemon's log; ``ledger()`` the host ledger's when it is another one
    (asked for when a timeline is drawn); ``clock`` says when "now" is.
    """

    def asset(path: str) -> Route:
        name, media = ASSETS[path]

        async def serve(_request: Request) -> Response:
            headers = {"cache-control": "no-cache", "x-content-type-options": "nosniff"}
            if name.endswith(".html"):
                headers["content-security-policy"] = _PAGE_POLICY
                headers["referrer-policy"] = "no-referrer"
            return Response(_asset(name), media_type=media, headers=headers)

        return Route(path, serve, methods=["GET"])

    limiter = anyio.CapacityLimiter(1)  # one drawing at a time: it takes a core while it runs

    async def timeline(request: Request) -> Response:
        if (denied := guard.check(request, changes_state=False)) is not None:
            return denied
        raw = request.query_params.get("minutes", str(DEFAULT_MINUTES))
        if not is_number(raw) or not 1 <= int(raw) <= MAX_MINUTES:
            message = f"minutes is a whole number from 1 to {MAX_MINUTES}, not {raw[:30]!r}"
            return error_response(400, "invalid_request_error", "invalid-request", message)
        minutes = int(raw)
        try:
            svg = await anyio.to_thread.run_sync(
                lambda: timeline_svg(store, ledger(), minutes=minutes, now=clock.wall()),
                limiter=limiter,
            )
        except HostlerError as exc:  # the log could not be read (busy, damaged file)
            return hostler_error_response(exc)
        return Response(
            svg,
            media_type="image/svg+xml",
            headers={
                "cache-control": "no-store",
                "content-security-policy": _SVG_POLICY,
                "x-content-type-options": "nosniff",
            },
        )

    return [*(asset(path) for path in ASSETS), Route(TIMELINE_PATH, timeline, methods=["GET"])]
