"""The ASGI app (Starlette): OpenAI-compatible routes that load on demand, and operator routes.

A completion names its ``model``; hostler maps it to an engine, binds the session (the
``X-Hostler-Session`` header, else the body's ``user``) or picks a running replica for a
one-shot, takes the engine through the runtime (queue, GPU slot, making room, physical gate),
and passes the engine's answer through as it comes — streamed chunks are never buffered
(:mod:`hostler.serve.proxy`). A client that disconnects — queued, loading or mid-answer — ends
its request at once and frees its place or slot. Failures come back
in OpenAI's error shape with hostler's code (``capacity-denied``, ``engine-busy``,
``engine-crashed``, ``queue-timeout``...) and ``Retry-After`` where waiting helps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import anyio
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hostler.bearer import token_id
from hostler.drivers.tail import follow
from hostler.errors import StoreError
from hostler.runtime.facade import Runtime
from hostler.serve.access import is_loopback
from hostler.serve.dashboard import dashboard_routes
from hostler.serve.errors import error_response, hostler_error_response
from hostler.serve.metrics import Metrics
from hostler.serve.openapi import OPENAPI_PATH, openapi_schema
from hostler.serve.operator import Guard, JsonAnswer, is_number, operator_routes
from hostler.serve.proxy import MAX_BODY, SESSION_HEADER, CompletionProxy
from hostler.serve.upstream import PooledUpstream, Upstream
from hostler.store.log import RecordedEvent, format_time

__all__ = ["MAX_BODY", "SESSION_HEADER", "make_app"]

log = logging.getLogger(__name__)


def make_app(
    runtime: Runtime,
    models: Mapping[str, str],
    *,
    token: str | None = None,
    public: bool = False,
    open_routes: bool = False,
    upstream: Upstream | None = None,
    about: Callable[[str], Mapping[str, Any]] | None = None,
) -> Starlette:
    """The app over ``runtime``.

    Args:
        runtime: The runtime that holds the engines.
        models: Model id (what clients send as ``model``) → ``engine:model``; read at each
            request (the daemon's catalog changes as discovery finds files).
        token: The bearer token; required for every state-changing operator route, and for
            every route when ``public``.
        public: The app listens beyond loopback.
        open_routes: Every route is open, no token asked (``auth = "none"``: loopback only, which
            the daemon checks before it starts).
        upstream: The client to the engines (default: a :class:`PooledUpstream`, closed with
            the app).
        about: More fields of a model's ``GET /v1/models`` entry (``source``, ``size_bytes``).
    """
    own_upstream = upstream is None
    upstream = upstream or PooledUpstream()

    guard = Guard(token, public, open_routes=open_routes)
    clock = runtime.clock

    def authorized(request: Request, *, changes_state: bool) -> Response | None:
        return guard.check(request, changes_state=changes_state)

    held = {} if token is None else {"token_id": token_id(token)}

    async def health(_request: Request) -> Response:
        return JsonAnswer({"status": "ok", "closed": runtime.status().closed, **held})

    async def list_models(request: Request) -> Response:
        if (denied := authorized(request, changes_state=False)) is not None:
            return denied
        resident = {
            v.key.rsplit(":", 1)[0] for v in runtime.status().engines if v.state == "running"
        }
        data = [
            {
                "id": model,
                "object": "model",
                "owned_by": "hostler",
                "created": 0,
                "resident": target in resident,
                **(about(model) if about is not None else {}),
            }
            for model, target in sorted(models.items())
        ]
        return JsonAnswer({"object": "list", "data": data})

    proxy = CompletionProxy(runtime, models, upstream, guard)

    metrics = Metrics(runtime, runtime.store)

    async def prometheus(request: Request) -> Response:
        if (denied := authorized(request, changes_state=False)) is not None:
            return denied
        return Response(await metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def events(request: Request) -> Response:
        if (denied := authorized(request, changes_state=False)) is not None:
            return denied
        start = request.headers.get("last-event-id") or request.query_params.get("after", "0")
        if not is_number(start):
            return error_response(
                400,
                "invalid_request_error",
                "invalid-request",
                f"resume from a seq (a number), not {start[:30]!r}",
            )
        if request.method == "HEAD":  # headers only: a tail that never ends would hold the line
            return Response(media_type="text/event-stream", headers={"cache-control": "no-cache"})
        return StreamingResponse(
            _tail(runtime, int(start)),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache"},
        )

    async def engines(request: Request) -> Response:
        if (denied := authorized(request, changes_state=False)) is not None:
            return denied
        status = runtime.status()
        details = await runtime.report.engine_details()
        try:
            last_seq: int | None = await anyio.to_thread.run_sync(runtime.store.last_seq)
        except StoreError:  # the log is away (a stopped server): what runs is still told
            last_seq = None
        return JsonAnswer(
            {
                "engines": [
                    {**dataclasses.asdict(v), **details.get(v.key, {})} for v in status.engines
                ],
                "sessions": dict(status.sessions),
                "ledger": status.ledger,
                "closed": status.closed,
                "now": clock.wall(),
                "last_seq": last_seq,
            }
        )

    document = openapi_schema(models)

    async def openapi(request: Request) -> Response:
        if (denied := authorized(request, changes_state=False)) is not None:
            return denied
        return JsonAnswer(document)

    async def queues(request: Request) -> Response:
        if (denied := authorized(request, changes_state=False)) is not None:
            return denied
        return JsonAnswer(
            {key: dataclasses.asdict(summary) for key, summary in runtime.queues().items()}
        )

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/chat/completions", proxy, methods=["POST"]),
        Route("/v1/completions", proxy, methods=["POST"]),
        Route("/v1/embeddings", proxy, methods=["POST"]),
        Route("/api/engines", engines, methods=["GET"]),
        Route("/api/events", events, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
        Route("/api/queues", queues, methods=["GET"]),
        Route(OPENAPI_PATH, openapi, methods=["GET"]),
        *operator_routes(runtime, guard, models),
        *dashboard_routes(runtime.store, runtime.memory.ledger_log, guard, clock),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        # before the pool stops an engine, drop the kept connections it would wait on
        runtime.on_stopping(upstream.forget)
        try:
            yield
        finally:
            if own_upstream:
                await upstream.aclose()

    return _App(
        _OneLine(proxy),
        local_only=not public,
        routes=routes,
        lifespan=lifespan,
        middleware=[Middleware(_OneLine)],
        exception_handlers={HTTPException: _http_error},
    )


def foreign_caller(scope: Scope) -> str | None:
    """Why a request to a loopback server comes from a web page it must not serve, else None.

    A server on loopback answers this machine only; its token guards state-changing routes,
    but a completion loads a model and may evict others, and a browser will post to
    ``127.0.0.1`` for any page (a "simple" cross-site request needs no preflight) or for a
    page whose name was rebound to ``127.0.0.1`` (DNS rebinding). Browsers name the page in
    ``Origin`` and the name they used in ``Host``: both must be loopback. Programs (curl, the
    ``openai`` client) send no ``Origin`` and a loopback ``Host``.
    """
    host = origin = None
    for name, value in scope.get("headers", ()):
        if name == b"host":
            host = bytes(value).decode("latin-1")
        elif name == b"origin":
            origin = bytes(value).decode("latin-1")
    if host is not None and not is_loopback(_hostname(host)):
        return f"the Host {host[:100]!r} is not this machine's loopback name (DNS rebinding?)"
    if origin is not None:
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not is_loopback(parts.hostname or ""):
            return (
                f"requests from web pages of {origin[:100]!r} are refused: this server answers "
                "programs on this machine, and pages served from it (localhost)"
            )
    return None


def _hostname(host: str) -> str:
    """``host`` of a ``Host`` header (``name``, ``name:port``, ``[v6]``, ``[v6]:port``)."""
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


#: The completion routes, served by the proxy ahead of the router (their cost is a headline).
PROXIED = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings"})


class _App(Starlette):
    """Starlette, with the completion routes dispatched straight to the proxy.

    Every message of a streamed answer would otherwise pass through Starlette's error and
    exception middleware and the router's wrappers; the proxy answers its own errors, and
    :class:`_OneLine` still turns a bug into one line. The routes stay listed (and routed, for
    any other method) so the schema and ``Allow`` answers are unchanged.
    """

    def __init__(self, hot: ASGIApp, *, local_only: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._hot = hot
        self._local_only = local_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Dispatch a completion POST to the proxy, everything else as Starlette does."""
        if scope["type"] == "http" and self._local_only:
            refused = foreign_caller(scope)
            if refused is not None:
                answer = error_response(403, "invalid_request_error", "forbidden-origin", refused)
                await answer(scope, receive, send)
                return
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in PROXIED:
            scope["app"] = self
            await self._hot(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


async def _http_error(request: Request, exc: Exception) -> Response:
    """The router's own refusals (no such route, a method it does not take) in OpenAI's shape.

    Their headers are kept: a 405 names the methods the route takes in ``Allow``.
    """
    assert isinstance(exc, HTTPException)  # noqa: S101 - registered for HTTPException only
    path = request.url.path[:200]
    if exc.status_code == 405:
        message = f"{request.method} is not a method of {path!r}"
        answer = error_response(405, "invalid_request_error", "method-not-allowed", message)
    elif exc.status_code == 404:
        message = f"no route {path!r} here (GET {OPENAPI_PATH} lists them)"
        answer = error_response(404, "invalid_request_error", "not-found", message)
    else:
        answer = error_response(
            exc.status_code, "invalid_request_error", "invalid-request", str(exc.detail)[:300]
        )
    answer.headers.update(exc.headers or {})
    if exc.status_code == 405:  # every route of this path, not the first one's methods alone
        answer.headers["allow"] = ", ".join(sorted(_methods_of(request)))
    return answer


def _methods_of(request: Request) -> set[str]:
    """The methods the app's routes take for the request's path (a path may have several)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        if (
            isinstance(route, Route)
            and route.methods
            and route.matches(request.scope)[0] != (Match.NONE)
        ):
            methods |= route.methods
    return methods


class _OneLine:
    """A bug answers one line in OpenAI's shape (500 ``internal``); its traceback goes to the log.

    Starlette's own handler for ``Exception`` re-raises after answering, and the server then
    resets the connection; this answers and stops there. Once an answer has started (a stream
    that breaks) nothing more can be said: the error is raised on and the connection closed.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except ClientDisconnect:
            return  # the client left before an answer: nobody to tell, and not a bug
        except StoreError as exc:  # the log refused a read: a known state, said as such
            if started:
                raise
            log.warning("hostler: %s %s: %s", scope["method"], scope["path"][:200], exc.message)
            await hostler_error_response(exc)(scope, receive, send)
        except Exception as exc:
            log.exception("hostler: %s %s failed", scope["method"], scope["path"][:200])
            if started:
                raise
            answer = error_response(
                500,
                "server_error",
                "internal",
                f"hostler failed on this request ({type(exc).__name__}); it is logged, please "
                "report it",
            )
            await answer(scope, receive, send)


async def _tail(runtime: Runtime, after: int) -> AsyncIterator[bytes]:
    """Server-Sent Events: every event after ``after``, then each new one as it is written.

    Each page of the log goes out as one write: a client that left is noticed before the
    next page (uvicorn then drops what is sent and Starlette ends this stream), never
    written to event by event (asyncio logs ``socket.send() raised exception.`` for each
    write to a closed socket).
    """
    yield b": hostler event stream\n\n"
    async for page in follow(runtime.store, after, runtime.clock):
        if page:
            yield b"".join(_sse(record) for record in page)
        elif runtime.closing:  # caught up, and the daemon is going: end, not the server's grace
            return


def _sse(record: RecordedEvent) -> bytes:
    """One event as a Server-Sent Event (``id:`` its seq, ``event:`` its type)."""
    data = json.dumps(
        {
            "seq": record.seq,
            "recorded_at": format_time(record.recorded_at),
            "stream": record.stream_id,
            "version": record.version,
            "type": record.type,
            "payload": record.payload,
        },
        default=str,
    )
    return f"id: {record.seq}\nevent: {record.type}\ndata: {data}\n\n".encode()
