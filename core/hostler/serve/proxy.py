"""The OpenAI-compatible completion routes: a plain ASGI app on the hot path.

A completion names its ``model``; the proxy maps it to an engine, binds the session (the
``X-Hostler-Session`` header, else the body's ``user``) or picks a running replica for a one-shot,
takes the engine through the runtime (queue, GPU slot, making room, physical gate) and relays the
engine's answer as it comes — streamed chunks are never buffered.

The client is watched from the moment its body is read: one that leaves while its request waits
in the queue, while the engine loads, or mid-answer, ends the request at once — its queue place
or its engine slot is freed, and the connection to the engine is closed so the engine stops
generating. It is written against ASGI directly (no framework request/response objects): this
path's cost is a headline number (docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import anyio
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from hostler.errors import HostlerError, RequestBodyError, RuntimeClosedError, UsageError
from hostler.runtime.facade import Runtime
from hostler.serve.answers import (
    ENGINE_ERROR_LIMIT,
    SseRenamer,
    engine_error,
    renamed,
    shaped_error,
)
from hostler.serve.bodies import check_body, decode_body
from hostler.serve.errors import error_response, hostler_error_response, unknown_model_response
from hostler.serve.operator import Guard, read_body
from hostler.serve.turns import AnswerTail
from hostler.serve.upstream import Upstream, UpstreamError, UpstreamResponse

__all__ = ["MAX_BODY", "SESSION_HEADER", "CompletionProxy"]

log = logging.getLogger(__name__)

#: The largest request body accepted (bytes): a prompt past it is refused, never read whole.
MAX_BODY = 16 * 1024 * 1024
#: The header that names a conversation (its engine and prompt cache are kept for it).
SESSION_HEADER = "x-hostler-session"
#: The route whose requests use no prompt cache (an embedding keeps no conversation).
EMBEDDINGS = "/v1/embeddings"
MAX_SESSION = 256
#: Engine answer headers passed to the client (the rest describe the engine's connection).
_PASSED = frozenset({"content-type", "cache-control", "content-length"})


class _ClientGone(Exception):
    """The client disconnected before its answer was complete."""


class CompletionProxy:
    """An ASGI app for ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/embeddings``."""

    def __init__(
        self,
        runtime: Runtime,
        models: Mapping[str, str],
        upstream: Upstream,
        guard: Guard,
    ) -> None:
        self._runtime = runtime
        self._models = models
        self._upstream = upstream
        self._guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one completion request."""
        if (denied := self._guard.check(Request(scope), changes_state=False)) is not None:
            await denied(scope, receive, send)
            return
        try:
            body, payload = await _read_checked(scope, receive)
        except UsageError as exc:
            param = exc.param if isinstance(exc, RequestBodyError) else None
            answer = error_response(
                400, "invalid_request_error", "invalid-request", exc.message, param=param
            )
            await answer(scope, receive, send)
            return
        except _ClientGone:
            return
        model = payload["model"]
        target = self._models.get(model)
        if target is None:
            await unknown_model_response(model, self._models)(scope, receive, send)
            return
        session = _session(scope, payload)  # valid Unicode: the body was decoded strictly
        async with anyio.create_task_group() as tasks:
            # The client's only remaining message is its disconnect: waiting for it is how a
            # request that waits in the queue, or is mid-answer, learns that nobody wants it.
            tasks.start_soon(_watch, receive, tasks.cancel_scope)
            try:
                await self._serve(
                    scope,
                    receive,
                    send,
                    body=body,
                    payload=payload,
                    target=target,
                    model=model,
                    session=session,
                )
            finally:
                tasks.cancel_scope.cancel()

    async def _serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        *,
        body: bytes,
        payload: dict[str, Any],
        target: str,
        model: str,
        session: str | None,
    ) -> None:
        engine, name = target.split(":", 1)
        path = str(scope["path"])
        key = ""
        for attempt in range(2):
            async with contextlib.AsyncExitStack() as stack:
                try:
                    # the key only: the request queues first and its slot starts the engine,
                    # so the log has it (queue.enqueued) before the start made for it (PM21)
                    key = await self._runtime.place(engine, name, session)
                    cause = "one-shot" if session is None else "session"
                    held = self._runtime.hold(
                        key, session=session, cause=cause, prompt_cache=path != EMBEDDINGS
                    )
                    it = await stack.enter_async_context(held)
                    fields = it.fields  # CC13: the session's slot, ``cache_prompt``
                    forced = self._runtime.request_model(key)
                    if forced is not None and payload.get("model") != forced:  # RD10
                        fields["model"] = forced
                    sent = body
                    if fields:
                        sent = await anyio.to_thread.run_sync(_with_fields, payload, fields)
                    answer = await self._upstream.send(it.port, path, sent, "application/json")
                    stack.push_async_callback(_close_shielded, answer)
                except RuntimeClosedError:
                    await hostler_error_response(
                        RuntimeClosedError(
                            f"hostler is shutting down: {model!r} is not served; ask again "
                            "once it is back"
                        )
                    )(scope, receive, send)
                    return
                except HostlerError as exc:
                    await hostler_error_response(exc)(scope, receive, send)
                    return
                except UpstreamError as exc:
                    # the engine died under it before answering (handed out between its death
                    # and its exit being seen): once its crash is recorded, this request asks
                    # again — the restart serves it — once
                    if attempt == 0 and key and await self._runtime.engine_lost(key):
                        continue
                    await error_response(
                        502,
                        "server_error",
                        "engine-crashed",
                        f"the engine for {model!r} did not answer ({exc}); it will be "
                        "restarted on the next request",
                    )(scope, receive, send)
                    return
                tail = None if it.prepared is None else AnswerTail()
                whole = await _relay(answer, send, model, tail, self._runtime)
                if whole and tail is not None and it.prepared is not None and session is not None:
                    await self._runtime.caches.finish(key, session, it.prepared, tail.usage())
                return


async def _relay(
    answer: UpstreamResponse, send: Send, model: str, tail: AnswerTail | None, runtime: Runtime
) -> bool:
    """Relay the engine's answer as the client asked for it; whether it was whole.

    A stream is passed on chunk by chunk, each event's ``model`` renamed to the one the client
    asked for; a whole answer is renamed once complete (past :data:`MAX_RENAMED` bytes it
    passes as it is); an engine's error becomes hostler's, in OpenAI's shape.
    """
    if answer.status >= 400:
        await _relay_error(answer, send, model)
        return False
    if _is_stream(answer):
        return await _relay_stream(answer, send, model, tail, runtime)
    return await _relay_whole(answer, send, model, tail, runtime)


async def _relay_error(answer: UpstreamResponse, send: Send, model: str) -> None:
    parts: list[bytes] = []
    size = 0
    with contextlib.suppress(UpstreamError):
        async for chunk in answer.body():
            parts.append(chunk)
            size += len(chunk)
            if size >= ENGINE_ERROR_LIMIT:
                break
    status, shaped = engine_error(answer.status, b"".join(parts), model)
    await _send_whole(send, status, "application/json", json.dumps(shaped).encode())


async def _relay_stream(
    answer: UpstreamResponse, send: Send, model: str, tail: AnswerTail | None, runtime: Runtime
) -> bool:
    await send({"type": "http.response.start", "status": answer.status, "headers": _head(answer)})
    renamer = SseRenamer(model)
    try:
        async for chunk in answer.body():
            if ready := renamer.feed(chunk):
                await send({"type": "http.response.body", "body": ready, "more_body": True})
            if tail is not None:
                tail.feed(chunk)
    except UpstreamError as exc:
        log.debug("hostler: the engine's answer broke off: %s", exc)  # the story tells crashes
        # a stream that just stops reads as complete: say it is not, and why
        _, cut = _cut(model, runtime)  # the head is sent: its status cannot change any more
        event = b"data: " + json.dumps(cut).encode() + b"\n\n"
        await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return False
    await send({"type": "http.response.body", "body": renamer.flush(), "more_body": False})
    return True


async def _relay_whole(
    answer: UpstreamResponse, send: Send, model: str, tail: AnswerTail | None, runtime: Runtime
) -> bool:
    parts: list[bytes] = []
    size = 0
    body = answer.body()
    try:
        async for chunk in body:
            parts.append(chunk)
            size += len(chunk)
            if size > MAX_RENAMED:
                break
    except UpstreamError as exc:
        log.debug("hostler: the engine's answer broke off: %s", exc)  # the story tells crashes
        status, cut = _cut(model, runtime)
        await _send_whole(send, status, "application/json", json.dumps(cut).encode())
        return False
    whole = b"".join(parts)
    if tail is not None:
        tail.feed(whole)
    if size <= MAX_RENAMED:
        if len(whole) > _CHECKED_ON_LOOP:
            whole = await anyio.to_thread.run_sync(renamed, whole, model)
        else:
            whole = renamed(whole, model)
        await _send_whole(send, answer.status, _content_type(answer), whole)
        return True
    # too large to hold: the rest is passed as it comes, unrenamed
    headers = [(k, v) for k, v in _head(answer) if k != b"content-length"]
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": whole, "more_body": True})
    try:
        async for chunk in body:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    except UpstreamError as exc:
        log.debug("hostler: the engine's answer broke off: %s", exc)  # the story tells crashes
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return False
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    return True


async def _send_whole(send: Send, status: int, content_type: str, body: bytes) -> None:
    headers = [
        (b"content-type", content_type.encode("latin-1")),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _head(answer: UpstreamResponse) -> list[tuple[bytes, bytes]]:
    return [
        (name.encode("latin-1"), value.encode("latin-1"))
        for name, value in answer.headers
        if name in _PASSED
    ]


def _content_type(answer: UpstreamResponse) -> str:
    return next((v for k, v in answer.headers if k == "content-type"), "application/json")


#: A whole answer up to this size is renamed; a larger one passes as the engine sent it.
MAX_RENAMED = 64 * 1024 * 1024


def _cut(model: str, runtime: Runtime) -> tuple[int, dict[str, Any]]:
    """Why an answer broke off mid-way, as OpenAI's error: the daemon stopping, or the engine."""
    if runtime.closing:
        return 503, shaped_error(
            f"hostler is shutting down: the engine for {model!r} was stopped mid-answer; "
            "the answer is incomplete: ask again once it is back",
            "server_error",
            "shutting-down",
        )
    return 502, shaped_error(
        f"the engine for {model!r} stopped answering mid-answer (it crashed or was killed); "
        "the answer is incomplete: ask again",
        "server_error",
        "engine-crashed",
    )


def _is_stream(answer: UpstreamResponse) -> bool:
    return any(
        name == "content-type" and value.split(";")[0].strip() == "text/event-stream"
        for name, value in answer.headers
    )


async def _close_shielded(answer: UpstreamResponse) -> None:
    with anyio.CancelScope(shield=True):
        await answer.aclose()


async def _watch(receive: Receive, scope: anyio.CancelScope) -> None:
    """Cancel ``scope`` when the client disconnects."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


async def _read_checked(scope: Scope, receive: Receive) -> tuple[bytes, dict[str, Any]]:
    """The body (at most :data:`MAX_BODY` bytes, read as it comes) and its checked JSON object.

    A large body is decoded and checked off the loop (16 MiB takes tens of milliseconds).

    Raises:
        UsageError: Too large (a :class:`RequestBodyError` for what :mod:`.bodies` refuses).
        _ClientGone: The client left while sending it.
    """

    async def chunks() -> AsyncIterator[bytes]:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone
            yield message.get("body", b"")
            if not message.get("more_body", False):
                return

    declared = _header(scope, b"content-length")
    body = await read_body(chunks(), declared, MAX_BODY)
    route = str(scope["path"])
    if len(body) > _CHECKED_ON_LOOP:
        return body, await anyio.to_thread.run_sync(_decoded_and_checked, route, body)
    return body, _decoded_and_checked(route, body)


#: Bodies up to this size are decoded on the loop: a thread hop costs more than the decode.
_CHECKED_ON_LOOP = 256 * 1024


def _decoded_and_checked(route: str, body: bytes) -> dict[str, Any]:
    payload = decode_body(body)
    check_body(route, payload)
    return payload


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def _session(scope: Scope, payload: Mapping[str, Any]) -> str | None:
    """The conversation's name: the session header, else the body's ``user``; None for one-shots."""
    session: object = _header(scope, SESSION_HEADER.encode()) or payload.get("user")
    if isinstance(session, str) and 0 < len(session) <= MAX_SESSION:
        return session
    return None


def _with_fields(payload: dict[str, Any], fields: Mapping[str, Any]) -> bytes:
    """The request body with ``fields`` over the client's, built off the loop (it may be large).

    The fields: the engine's ``model`` (RD10), a session's cache slot (CC13).
    """
    return json.dumps({**payload, **fields}, ensure_ascii=False).encode()
