"""The operator routes: queues (QA3, QA4), cache, budget, preview, leases, device, reconcile.

Every body is checked at the edge (one ``invalid-request`` line, never a traceback); every
state-changing route needs the bearer token (see :class:`Guard`).
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hostler.errors import HostlerError, UsageError
from hostler.runtime.arbiter import Release
from hostler.runtime.facade import Runtime
from hostler.serve.errors import error_response, hostler_error_response, unknown_model_response

__all__ = ["ENGINE_KEY", "Guard", "JsonAnswer", "is_number", "operator_routes"]

MAX_OPERATOR_BODY = 64 * 1024
Handler = Callable[[Request], Awaitable[Response]]


@dataclasses.dataclass(frozen=True, slots=True)
class Guard:
    """Who may call what: the token for state-changing routes, for all when public.

    ``open_routes`` (``auth = "none"``, loopback only) opens every route; without it a guard
    with no token refuses every route that needs one.
    """

    token: str | None
    public: bool
    open_routes: bool = False

    def check(self, request: Request, *, changes_state: bool) -> Response | None:
        """None when allowed, else the 401 answer."""
        if self.open_routes or not (changes_state or self.public):
            return None
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        # the scheme is case-insensitive (RFC 9110 11.1); the token is compared whole
        if (
            self.token
            and scheme.lower() == "bearer"
            and secrets.compare_digest(given.strip(" ").encode(), self.token.encode())
        ):
            return None
        return error_response(
            401,
            "invalid_request_error",
            "unauthorized",
            "this route needs the daemon's token: send 'Authorization: Bearer <token>' (the "
            "token is in the data directory's 'token' file)",
        )


class JsonAnswer(JSONResponse):
    """JSON with every non-ASCII character escaped: no text a client sent can make it fail."""

    def render(self, content: Any) -> bytes:
        """``content`` as strict JSON (no NaN), in ASCII."""
        return json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")


def is_number(text: str) -> bool:
    """``text`` is 1 to 18 ASCII digits (``str.isdigit`` admits "²", which ``int`` refuses)."""
    return 0 < len(text) <= 18 and text.isascii() and text.isdigit()


#: An engine key as K2 makes them: ``engine:model:replica`` (the model without ``:``).
ENGINE_KEY = re.compile(r"[a-z0-9][a-z0-9_-]*:[^:]+:(0|[1-9][0-9]{0,8})")


def _key(request: Request) -> str:
    """The route's ``{key}``, refused at the edge unless it is an engine key."""
    key: str = request.path_params["key"]
    if ENGINE_KEY.fullmatch(key) is None:
        raise UsageError(
            f"{key[:80]!r} is not an engine key (engine:model:replica, as GET /api/engines "
            "lists them)"
        )
    return key


def _bad(message: str) -> Response:
    return error_response(400, "invalid_request_error", "invalid-request", message[:300])


async def read_body(chunks: AsyncIterator[bytes], declared: str | None, limit: int) -> bytes:
    """A request body (``chunks`` as they come), refused as soon as it is over ``limit``.

    Raises:
        UsageError: The declared (``Content-Length``) or actual size is over ``limit``.
    """
    unit = f"{limit // 2**20} MiB" if limit >= 2**20 else f"{limit // 1024} KiB"
    too_large = f"the request body is over {unit}"
    if declared is not None and not (is_number(declared) and int(declared) <= limit):
        raise UsageError(too_large)
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise UsageError(too_large)
        parts.append(chunk)
    return b"".join(parts)


async def read_json_object(
    chunks: AsyncIterator[bytes],
    declared: str | None,
    limit: int,
    *,
    empty: bytes = b"",
    echoable: bool = True,
) -> tuple[bytes, dict[str, Any]]:
    """A request body (``chunks`` as they come) and its JSON object, checked at the edge.

    A declared (``Content-Length``) or actual size past ``limit`` is refused before the rest
    is read; an empty body reads as ``empty``. ``echoable``: refuse text no answer could echo
    (the operator routes echo theirs; the proxy passes a prompt on untouched, unscanned).

    Raises:
        UsageError: Too large, not JSON, not an object, or holding a lone UTF-16 surrogate.
    """
    body = await read_body(chunks, declared, limit)
    try:
        payload = json.loads(body or empty)
    except (ValueError, RecursionError):
        raise UsageError("the request body is not JSON") from None
    if not isinstance(payload, dict):
        raise UsageError("the request body must be a JSON object")
    try:  # JSON may spell a lone UTF-16 surrogate ("\ud800"): no text, and no answer could echo it
        if echoable:
            json.dumps(payload, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        raise UsageError("the request body has a lone UTF-16 surrogate (\\ud800-\\udfff)") from None
    return body, payload


async def _object(request: Request) -> dict[str, Any]:
    """An operator body as a JSON object (at most 64 KiB; empty: ``{}``)."""
    declared = request.headers.get("content-length")
    _body, payload = await read_json_object(
        request.stream(), declared, MAX_OPERATOR_BODY, empty=b"{}"
    )
    return payload


def _bytes(value: object, what: str, *, nullable: bool = False) -> int | None:
    if value is None and nullable:
        return None
    if type(value) is not int or not 0 <= value <= 2**60:
        raise UsageError(f"{what} is a number of bytes from 0 to 2^60, not {str(value)[:30]!r}")
    return value


async def _cancel_on_disconnect(request: Request, scope: anyio.CancelScope) -> None:
    """Cancel ``scope`` when the client of ``request`` (its body read) disconnects."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


def operator_routes(runtime: Runtime, guard: Guard, models: Mapping[str, str]) -> list[Route]:  # noqa: PLR0915
    """The operator API over ``runtime`` (``models``: model id → ``engine:model``)."""
    releases: dict[str, Release] = {}

    def route(path: str, methods: list[str], *, changes_state: bool) -> Callable[[Handler], Route]:
        def wrap(handler: Handler) -> Route:
            async def guarded(request: Request) -> Response:
                if (denied := guard.check(request, changes_state=changes_state)) is not None:
                    return denied
                try:
                    return await handler(request)
                except UsageError as exc:
                    return _bad(exc.message)
                except HostlerError as exc:
                    return hostler_error_response(exc)

            return Route(path, guarded, methods=methods)

        return wrap

    @route("/api/models/{model}/load", ["POST"], changes_state=True)
    async def load(request: Request) -> Response:
        model = request.path_params["model"]
        target = models.get(model)
        if target is None:
            return unknown_model_response(model, models)
        engine, name = target.split(":", 1)
        key = await runtime.one_shot(engine, name)
        return JsonAnswer({"model": model, "key": key, "loaded": True})

    @route("/api/engines/{key}/unload", ["POST"], changes_state=True)
    async def unload(request: Request) -> Response:
        key = _key(request)
        return JsonAnswer({"key": key, "unloaded": await runtime.unload(key)})

    @route("/api/queues/{key}/{id}", ["DELETE"], changes_state=True)
    async def cancel(request: Request) -> Response:
        key, raw = _key(request), request.path_params["id"]
        if not is_number(raw):
            raise UsageError(f"a queued request's id is a number, not {raw[:30]!r}")
        return JsonAnswer({"cancelled": runtime.cancel(key, int(raw))})

    @route("/api/queues/{key}/{id}/move", ["POST"], changes_state=True)
    async def move(request: Request) -> Response:
        key, raw = _key(request), request.path_params["id"]
        if not is_number(raw):
            raise UsageError(f"a queued request's id is a number, not {raw[:30]!r}")
        direction = (await _object(request)).get("direction")
        return JsonAnswer({"moved": runtime.move(key, int(raw), str(direction))})

    @route("/api/cache", ["GET"], changes_state=False)
    async def caches(_request: Request) -> Response:
        found = await runtime.caches.all_stats()
        return JsonAnswer({"caches": [dataclasses.asdict(stats) for stats in found]})

    @route("/api/cache/{key}", ["GET"], changes_state=False)
    async def cache(request: Request) -> Response:
        stats = await runtime.caches.stats(_key(request))
        return JsonAnswer(None if stats is None else dataclasses.asdict(stats))

    @route("/api/cache/{key}/clear", ["POST"], changes_state=True)
    async def clear(request: Request) -> Response:
        await runtime.caches.clear(_key(request))
        return JsonAnswer({"cleared": True})

    @route("/api/cache/{key}/budget", ["PUT"], changes_state=True)
    async def cache_budget(request: Request) -> Response:
        key = _key(request)
        size = _bytes((await _object(request)).get("bytes"), "bytes")
        assert size is not None  # noqa: S101 - not nullable
        await runtime.caches.set_budget(key, size)
        return JsonAnswer({"bytes": size})

    @route("/api/sessions/{session}/cache", ["DELETE"], changes_state=True)
    async def evict_session(request: Request) -> Response:
        await runtime.caches.evict_session(request.path_params["session"])
        return JsonAnswer({"evicted": True})

    @route("/api/budget", ["GET"], changes_state=False)
    async def budget(_request: Request) -> Response:
        return JsonAnswer(await runtime.memory.budget())

    @route("/api/budget", ["PUT"], changes_state=True)
    async def set_budget(request: Request) -> Response:
        payload = await _object(request)
        unknown = set(payload) - {"bytes", "spillover"}
        if unknown or not payload:
            raise UsageError("give 'bytes' (a number, or null for automatic) and/or 'spillover'")
        if "bytes" in payload:
            await runtime.memory.set_budget(_bytes(payload["bytes"], "bytes", nullable=True))
        if "spillover" in payload:
            spill = payload["spillover"]
            if spill is not None and not isinstance(spill, bool):
                raise UsageError("spillover is true, false or null (automatic)")
            await runtime.memory.set_spillover(spill)
        return JsonAnswer(await runtime.memory.budget())

    @route("/api/preview/{key}", ["GET"], changes_state=False)
    async def preview(request: Request) -> Response:
        # a model id offered (configured or found, loaded or not) means its first engine
        named = request.path_params["key"]
        target = models.get(named)
        if target is None and ":" not in named:  # a model id, not offered
            return unknown_model_response(named, models)
        key = f"{target}:0" if target else _key(request)
        if target is None and key.rsplit(":", 1)[0] not in models.values():
            return unknown_model_response(key, models)  # a key whose model is not offered
        price = await runtime.memory.preview(key)
        return JsonAnswer(
            {
                "context_window": price.ctx_per_slot,
                "slots": price.slots,
                "kv_type": price.plan.kv_type,
                "planned_bytes": price.estimated,
                "reserved_bytes": price.reserved_bytes,
                "admitted": price.admitted,
                "denial": price.denial,
            }
        )

    @route("/api/leases", ["GET"], changes_state=False)
    async def leases(_request: Request) -> Response:
        return JsonAnswer(runtime.arbiter.leases())

    @route("/api/leases", ["POST"], changes_state=True)
    async def acquire(request: Request) -> Response:
        payload = await _object(request)
        slot, holder = payload.get("slot"), payload.get("holder")
        if slot not in ("llm", "image", "video"):
            raise UsageError("slot is llm, image or video")
        if not isinstance(holder, str) or not 0 < len(holder) <= 128:
            raise UsageError("holder is a name of 1 to 128 characters")
        acquired: tuple[str | None, Release] | None = None
        async with anyio.create_task_group() as watching:
            # a client that leaves while its lease waits for the card gives up its place: a
            # lease granted to nobody would hold the card for 90 minutes
            watching.start_soon(_cancel_on_disconnect, request, watching.cancel_scope)
            acquired = await runtime.arbiter.acquire_lease_with_id(slot, holder)
            watching.cancel_scope.cancel()
        if acquired is None:
            return Response(status_code=499)  # nobody is there to read it
        lease_id, release = acquired
        if await request.is_disconnected():  # granted as the client left: give it back
            await release()
            return Response(status_code=499)
        lease_id = lease_id or f"coexist-{secrets.token_hex(8)}"  # no lease taken: nothing held
        releases[lease_id] = release
        return JsonAnswer({"id": lease_id, "slot": slot, "holder": holder})

    @route("/api/leases/{id}", ["DELETE"], changes_state=True)
    async def release(request: Request) -> Response:
        release = releases.pop(request.path_params["id"], None)
        if release is not None:
            await release()
        return JsonAnswer({"released": release is not None})

    @route("/api/device", ["GET"], changes_state=False)
    async def device(_request: Request) -> Response:
        status = await runtime.report.device_health()
        return JsonAnswer(None if status is None else dataclasses.asdict(status))

    @route("/api/reconcile", ["POST"], changes_state=True)
    async def reconcile(request: Request) -> Response:
        targets = (await _object(request)).get("targets")
        if not isinstance(targets, dict):
            raise UsageError('give {"targets": {"engine:model": count}}')
        report = await runtime.reconcile(targets)
        return JsonAnswer(dataclasses.asdict(report))

    return [
        load,
        unload,
        cancel,
        move,
        caches,
        cache,
        clear,
        cache_budget,
        evict_session,
        budget,
        set_budget,
        preview,
        leases,
        acquire,
        release,
        device,
        reconcile,
    ]
