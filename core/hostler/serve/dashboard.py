"""The web dashboard at ``/``: a page, its script and style, and the timeline as SVG.

Plain HTML and a little JavaScript (``static/``, shipped in the wheel), no build step and
nothing fetched from outside the daemon. The page holds no data: its script reads the same
routes as the CLI (``/api/engines``, ``/api/queues``, ``/api/leases``, ``/api/budget``), the
live tail of ``/api/events`` and ``/api/timeline.svg``. Where reads need the token (a public
daemon), the page takes it from the URL fragment (``/#token=...``: a fragment never reaches
the server, nor its access log) and sends it as a bearer header (PM34).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from functools import cache
from importlib.resources import files

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from hostler.clock import Clock
from hostler.errors import HostlerError
from hostler.serve.errors import error_response, hostler_error_response
from hostler.serve.operator import Guard, is_number
from hostler.store.log import EventStore

__all__ = [
    "ASSETS",
    "MAX_MINUTES",
    "TIMELINE_PATH",
    "TIMELINE_TYPES",
    "dashboard_routes",
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

#: The event types the timeline folds (read alone, the rest of a large log is skipped).
TIMELINE_TYPES = (
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
    "lease.requested",
    "lease.granted",
    "lease.released",
    "lease.broken",
)

#: The window the timeline shows by default, and the widest one asked for (minutes).
DEFAULT_MINUTES, MAX_MINUTES = 30, 7 * 24 * 60

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


def timeline_svg(
    store: EventStore, ledger: EventStore | None, *, minutes: int, now: float, title: str
) -> bytes:
    """The timeline of the last ``minutes`` of ``store`` as SVG (blocking: run it off the loop).

    ``ledger``: the host ledger's log, when the daemon keeps it apart from ``store``.
    """
    from hostler.postmortem.draw import render  # noqa: PLC0415 - matplotlib when drawn only
    from hostler.postmortem.timeline import build_timeline  # noqa: PLC0415

    timeline = build_timeline(
        store.read_all(types=TIMELINE_TYPES),
        ledger=() if ledger is None else ledger.read_all(types=TIMELINE_TYPES),
        since=now - minutes * 60,
        until=now,
    )
    out = io.BytesIO()
    render(timeline, out, fmt="svg", width=1200, height=520, title=title)
    return out.getvalue()


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
        title = f"hostler memory timeline — last {minutes} min"
        try:
            svg = await anyio.to_thread.run_sync(
                lambda: timeline_svg(
                    store, ledger(), minutes=minutes, now=clock.wall(), title=title
                ),
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
