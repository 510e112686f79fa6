"""The ASGI app (Starlette): OpenAI-compatible routes that load on demand, and operator routes.

A completion names its ``model``; hostler maps it to an engine, binds the session (the
``X-Hostler-Session`` header, else the body's ``user``) or picks a running replica for a
one-shot, takes the engine through the runtime (queue, GPU slot, making room, physical gate),
and passes the engine's answer through as it comes — streamed chunks are never buffered. A
client that disconnects ends the upstream request and frees its slot at once. Failures come back
in OpenAI's error shape with hostler's code (``capacity-denied``, ``engine-busy``,
``engine-crashed``, ``queue-timeout``...) and ``Retry-After`` where waiting helps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import anyio
import httpx
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from hostler.errors import HostlerError, UsageError
from hostler.runtime.facade import Runtime
from hostler.serve.errors import (
    error_response,
    hostler_error_response,
    unknown_model_response,
)
from hostler.serve.metrics import Metrics
from hostler.serve.operator import Guard, operator_routes
from hostler.store.log import EventStore, RecordedEvent

__all__ = ["MAX_BODY", "SESSION_HEADER", "make_app"]

log = logging.getLogger(__name__)

#: The largest request body accepted (bytes): a prompt past it is refused, never read whole.
MAX_BODY = 16 * 1024 * 1024
#: The header that names a conversation (its engine and prompt cache are kept for it).
SESSION_HEADER = "x-hostler-session"
_PASSED = ("content-type", "cache-control")


def make_app(  # noqa: PLR0915 - one closure per route, sharing the runtime and client
    runtime: Runtime,
    models: Mapping[str, str],
    *,
    token: str | None = None,
    public: bool = False,
    client: httpx.AsyncClient | None = None,
) -> Starlette:
    """The app over ``runtime``.

    Args:
        runtime: The runtime that holds the engines.
        models: Model id (what clients send as ``model``) → ``engine:model``.
        token: The bearer token; required for every state-changing operator route, and for
            every route when ``public``.
        public: The app listens beyond loopback.
        client: The HTTP client to the engines (one pool of connections, reused).
    """
    upstream = client or httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0))

    guard = Guard(token, public)

    def authorized(request: Request, *, changes_state: bool) -> Response | None:
        return guard.check(request, changes_state=changes_state)

    async def health(_request: Request) -> Response:
        return JSONResponse({"status": "ok", "closed": runtime.status().closed})

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
            }
            for model, target in sorted(models.items())
        ]
        return JSONResponse({"object": "list", "data": data})

    async def completion(request: Request) -> Response:
        if (denied := authorized(request, changes_state=False)) is not None:
            return denied
        try:
            body, payload = await _read_json(request)
        except UsageError as exc:
            return error_response(400, "invalid_request_error", "invalid-request", exc.message)
        model = payload.get("model")
        target = models.get(model) if isinstance(model, str) else None
        if target is None:
            return unknown_model_response(model, models)
        engine, name = target.split(":", 1)
        session = request.headers.get(SESSION_HEADER) or payload.get("user")
        session = session if isinstance(session, str) and 0 < len(session) <= 256 else None
        stack = contextlib.AsyncExitStack()
        try:
            if session is not None:
                key = await runtime.bind(engine, name, session)
            else:
                key = await runtime.one_shot(engine, name)
            port = await stack.enter_async_context(runtime.request(key, session=session))
            outgoing = upstream.build_request(
                "POST",
                f"http://127.0.0.1:{port}{request.url.path}",
                content=body,
                headers={"content-type": "application/json"},
            )
            answer = await upstream.send(outgoing, stream=True)
            stack.push_async_callback(answer.aclose)
        except HostlerError as exc:
            await _close(stack)
            return hostler_error_response(exc)
        except httpx.HTTPError as exc:
            await _close(stack)
            return error_response(
                502,
                "server_error",
                "engine-crashed",
                f"the engine for {model!r} did not answer ({type(exc).__name__}); it will be "
                "restarted on the next request",
            )
        except BaseException:
            await _close(stack)
            raise
        headers = {k: v for k, v in answer.headers.items() if k.lower() in _PASSED}
        return StreamingResponse(
            _relay(answer, stack), status_code=answer.status_code, headers=headers
        )

    metrics = Metrics(runtime, runtime.store)

    async def prometheus(request: Request) -> Response:
        if (denied := authorized(request, changes_state=False)) is not None:
            return denied
        return Response(await metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def events(request: Request) -> Response:
        if (denied := authorized(request, changes_state=False)) is not None:
            return denied
        start = request.headers.get("last-event-id") or request.query_params.get("after", "0")
        if not start.isdigit() or len(start) > 18:
            return error_response(
                400,
                "invalid_request_error",
                "invalid-request",
                f"resume from a seq (a number), not {start[:30]!r}",
            )
        return StreamingResponse(
            _tail(runtime, int(start)),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache"},
        )

    async def engines(request: Request) -> Response:
        if (denied := authorized(request, changes_state=False)) is not None:
            return denied
        status = runtime.status()
        details = await runtime.engine_details()
        last_seq = await anyio.to_thread.run_sync(runtime.store.last_seq)
        return JSONResponse(
            {
                "engines": [
                    {**dataclasses.asdict(v), **details.get(v.key, {})} for v in status.engines
                ],
                "sessions": dict(status.sessions),
                "ledger": status.ledger,
                "closed": status.closed,
                "now": time.time(),
                "last_seq": last_seq,
            }
        )

    async def queues(request: Request) -> Response:
        if (denied := authorized(request, changes_state=False)) is not None:
            return denied
        return JSONResponse(
            {key: dataclasses.asdict(summary) for key, summary in runtime.queues().items()}
        )

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/chat/completions", completion, methods=["POST"]),
        Route("/v1/completions", completion, methods=["POST"]),
        Route("/v1/embeddings", completion, methods=["POST"]),
        Route("/api/engines", engines, methods=["GET"]),
        Route("/api/events", events, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
        Route("/api/queues", queues, methods=["GET"]),
        *operator_routes(runtime, guard, models),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if client is None:
                await upstream.aclose()

    return Starlette(routes=routes, lifespan=lifespan)


async def _read_json(request: Request) -> tuple[bytes, dict[str, Any]]:
    """The body (at most :data:`MAX_BODY` bytes, read in chunks) and its JSON object."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY):
        raise UsageError(f"the request body is over {MAX_BODY // 2**20} MiB")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise UsageError(f"the request body is over {MAX_BODY // 2**20} MiB")
        chunks.append(chunk)
    body = b"".join(chunks)
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        raise UsageError("the request body is not JSON") from None
    if not isinstance(payload, dict):
        raise UsageError("the request body must be a JSON object")
    return body, payload


async def _relay(answer: httpx.Response, stack: contextlib.AsyncExitStack) -> AsyncIterator[bytes]:
    """The engine's bytes as they come; the request ends (slot freed) when this ends or is cut."""
    try:
        async for chunk in answer.aiter_raw():
            yield chunk
    except httpx.HTTPError as exc:
        log.warning("hostler: the engine's answer broke off: %s", type(exc).__name__)
    finally:
        await _close(stack)


#: How often the event tail looks for new events (seconds), and how many it sends at once.
TAIL_POLL = 0.25
TAIL_PAGE = 500


def _page(store: EventStore, after: int) -> list[RecordedEvent]:
    return list(store.read_all(after_seq=after, limit=TAIL_PAGE))


async def _tail(runtime: Runtime, after: int) -> AsyncIterator[bytes]:
    """Server-Sent Events: every event after ``after``, then each new one as it is written."""
    store = runtime.store
    yield b": hostler event stream\n\n"
    while True:
        page = await anyio.to_thread.run_sync(_page, store, after)
        for record in page:
            data = json.dumps(
                {
                    "seq": record.seq,
                    "stream": record.stream_id,
                    "version": record.version,
                    "type": record.type,
                    "payload": record.payload,
                },
                default=str,
            )
            yield f"id: {record.seq}\nevent: {record.type}\ndata: {data}\n\n".encode()
            after = record.seq
        if len(page) < TAIL_PAGE:
            await anyio.sleep(TAIL_POLL)


async def _close(stack: contextlib.AsyncExitStack) -> None:
    with anyio.CancelScope(shield=True):
        await stack.aclose()
