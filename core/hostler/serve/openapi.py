"""The OpenAPI 3.1 document of the HTTP face, kept as data next to the routes it describes.

Served at ``GET /openapi.json``; ``tests/test_serve_schema.py`` checks that its paths and
methods are exactly the app's routes and fuzzes every operation from it (schemathesis).
Every error is OpenAI's shape (``#/components/schemas/Error``); a status listed for an
operation is one that route can really answer, 503s included (capacity, a busy engine, a
queue timeout, shutting down, the log's storage), each with ``Retry-After`` where waiting helps.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from hostler.serve.dashboard import MAX_MINUTES
from hostler.serve.operator import ENGINE_KEY

__all__ = ["OPENAPI_PATH", "openapi_schema"]

#: Where the app serves the document.
OPENAPI_PATH = "/openapi.json"

_JSON = "application/json"
_Schema = dict[str, Any]


def _ref(kind: str, name: str) -> _Schema:
    return {"$ref": f"#/components/{kind}/{name}"}


def _json(schema: _Schema, description: str) -> _Schema:
    return {"description": description, "content": {_JSON: {"schema": schema}}}


def _obj(required: list[str], **properties: _Schema) -> _Schema:
    return {"type": "object", "required": required, "properties": properties}


_INT = {"type": "integer"}
_NUM = {"type": "number"}
_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_ANY_OBJ: _Schema = {"type": "object"}
_BYTES = {"type": "integer", "minimum": 0, "maximum": 2**60}


def _nullable(schema: _Schema) -> _Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def _error_response(description: str, *, retry: bool = False) -> _Schema:
    answer = _json(_ref("schemas", "Error"), description)
    if retry:
        answer["headers"] = {"Retry-After": _ref("headers", "RetryAfter")}
    return answer


_RESPONSES: dict[str, _Schema] = {
    "BadRequest": _error_response(
        "`invalid-request`: the body, a path or query parameter is malformed (one line saying "
        "what was expected; `param` names the body's field at fault), or `engine-rejected`: "
        "the engine refused the request (its own 4xx status and message)"
    ),
    "Unauthorized": _error_response(
        "`unauthorized`: the route needs `Authorization: Bearer <token>` (the data "
        "directory's `token` file)"
    ),
    "NotFound": _error_response(
        "`model_not_found` (the model or engine is not configured here; the message lists the "
        "models that are) or `not-found` (no such route)"
    ),
    "Conflict": _error_response("`queue-cancelled`: an operator cancelled the queued request"),
    "BadGateway": _error_response(
        "`engine-crashed`: the engine could not start, or died under the request; "
        "`engine-error`: the engine failed the request (its own 5xx, its message kept)"
    ),
    "Unavailable": _error_response(
        "`capacity-denied`, `engine-busy` (Retry-After 30), `queue-timeout` (5), "
        "`engine-crashed` when locked out after 3 crashes in 60 s (60), `device-unhealthy` "
        "(60), `shutting-down` (5) or `store-unavailable` (1 or 10)",
        retry=True,
    ),
}

_ERROR_SCHEMA: _Schema = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "code", "param"],
            "properties": {
                "message": {"type": "string", "description": "one actionable line"},
                "type": {
                    "type": "string",
                    "description": "OpenAI's error type (`invalid_request_error`, `server_error`)",
                },
                "code": {"type": "string", "description": "hostler's stable code"},
                "param": {"type": ["string", "null"]},
            },
        }
    },
}

_ENGINE_VIEW = _obj(
    ["key", "state", "bytes", "busy", "draining", "pinned"],
    key=_STR,
    state=_STR,
    bytes=_INT,
    last_used_at=_NUM,
    recent_hits=_INT,
    busy=_BOOL,
    draining=_BOOL,
    pinned=_BOOL,
    port=_nullable(_INT),
    pid=_nullable(_INT),
    progress=_nullable(
        _obj(["done", "total", "unit"], done=_INT, total=_INT, unit=_STR),
    ),
)

_QUEUE = _obj(
    ["engine", "width", "running", "active", "pending"],
    engine=_STR,
    width=_INT,
    interactive_cap=_INT,
    background_cap=_INT,
    running=_INT,
    running_interactive=_INT,
    running_background=_INT,
    queued_interactive=_INT,
    queued_background=_INT,
    ambient_held=_INT,
    active={"type": "array", "items": _ANY_OBJ},
    pending={"type": "array", "items": _ANY_OBJ},
)

_CACHE_STATS = _obj(
    ["key", "total_bytes", "budget", "entries", "hits", "misses", "hit_rate"],
    key=_STR,
    total_bytes=_INT,
    budget=_INT,
    entries=_INT,
    hits=_INT,
    misses=_INT,
    hit_rate=_NUM,
    sources={"type": "object", "additionalProperties": _INT},
    groups=_ANY_OBJ,
    sessions={"type": "array", "items": _STR},
    files=_INT,
    file_bytes=_INT,
    bytes_per_token=_INT,
    running={"type": "boolean"},
)

_BUDGET = _obj(
    ["budget", "committed", "enforced", "by_key"],
    budget=_nullable(_INT),
    committed=_INT,
    enforced=_BOOL,
    system_ram=_INT,
    auto_budget=_nullable(_INT),
    overridden=_BOOL,
    pools=_ANY_OBJ,
    ram_spillover=_ANY_OBJ,
    by_key={"type": "array", "items": _ANY_OBJ},
)

_LEASE = _obj(
    ["id", "slot", "holder", "state"],
    id=_STR,
    slot=_STR,
    holder=_STR,
    state=_STR,
    since=_nullable(_NUM),
    held_for=_nullable(_NUM),
    expires_at=_nullable(_NUM),
)

_COMPLETION_BODY: _Schema = {
    "type": "object",
    "required": ["model"],
    "properties": {
        "model": {"type": "string", "description": "a configured model id (`GET /v1/models`)"},
        "user": {
            "description": "names the conversation when `X-Hostler-Session` is absent (a "
            "string of 1 to 256 characters; anything else is a one-shot)"
        },
        "stream": {"description": "passed to the engine: true streams Server-Sent Events"},
    },
    "description": "OpenAI's request body; every field but `model` is passed to the engine "
    "as sent, and the engine judges it",
}

_COMPLETION_ANSWER: _Schema = {
    "description": "the engine's answer, passed through as it comes (streamed chunks are "
    "never buffered)",
    "content": {
        _JSON: {"schema": _ANY_OBJ},
        "text/event-stream": {"schema": _STR},
    },
}


def _op(
    summary: str,
    ok: _Schema,
    *,
    tag: str,
    auth: str,
    errors: tuple[str, ...] = (),
    body: _Schema | None = None,
    params: tuple[_Schema, ...] = (),
) -> _Schema:
    """One operation; who needs the token (``auth``): ``never``, ``public`` or ``always``."""
    responses: dict[str, _Schema] = {"200": ok}
    codes = {
        "BadRequest": "400",
        "Unauthorized": "401",
        "NotFound": "404",
        "Conflict": "409",
        "BadGateway": "502",
        "Unavailable": "503",
    }
    listed = ("Unauthorized", *errors) if auth != "never" else errors
    for name in listed:
        responses[codes[name]] = _ref("responses", name)
    operation: _Schema = {
        "summary": summary,
        "tags": [tag],
        "x-hostler-token": auth,
        "responses": responses,
    }
    if auth == "never":
        operation["security"] = []
    elif auth == "public":
        operation["security"] = [{}, {"bearer": []}]
    else:
        operation["security"] = [{"bearer": []}]
    if params:
        operation["parameters"] = list(params)
    if body is not None:
        operation["requestBody"] = {"required": True, "content": {_JSON: {"schema": body}}}
    return operation


def _asset(summary: str, media: str) -> _Schema:
    """A file of the dashboard: open to anyone who reaches the server (it holds no data)."""
    ok = {"description": summary, "content": {media: {"schema": _STR}}}
    return _op(summary, ok, tag="dashboard", auth="never")


def _path_param(name: str, description: str, **schema: Any) -> _Schema:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": {"type": "string", "minLength": 1, **schema},
    }


_KEY = _path_param(
    "key",
    "an engine key, `engine:model:replica` (as `GET /api/engines` lists them); anything else "
    "is a 400",
    pattern=f"^{ENGINE_KEY.pattern}$",
)
_QUEUE_ID = _path_param(
    "id", "a queued request's id (a number)", pattern="^[0-9]{1,18}$", maxLength=18
)
_ROUTED = ("BadRequest", "NotFound", "Conflict", "BadGateway", "Unavailable")


def _completion(summary: str) -> _Schema:
    session = {
        "name": "X-Hostler-Session",
        "in": "header",
        "required": False,
        "description": "names the conversation: it keeps its engine replica and prompt cache "
        "(1 to 256 characters; else the body's `user`, else a one-shot)",
        "schema": _STR,
    }
    operation = _op(
        summary,
        _COMPLETION_ANSWER,
        tag="openai",
        auth="public",
        errors=_ROUTED,
        body=_COMPLETION_BODY,
        params=(session,),
    )
    operation["responses"]["default"] = {
        "description": "the engine's own answer to a request it refused, passed through"
    }
    return operation


def _paths() -> dict[str, _Schema]:
    ok = {"type": "object"}
    return {
        "/health": {
            "get": _op(
                "Liveness",
                _json(
                    _obj(
                        ["status", "closed"],
                        status={"const": "ok"},
                        closed=_BOOL,
                        token_id={
                            "type": "string",
                            "description": "16 hex digits of the token's SHA-256 (none without "
                            "a token): a client checks it before it sends a data directory's token",
                        },
                    ),
                    "up",
                ),
                tag="openai",
                auth="never",
            )
        },
        OPENAPI_PATH: {
            "get": _op("This document", _json(ok, "this document"), tag="meta", auth="public")
        },
        "/v1/models": {
            "get": _op(
                "The offered models: configured and discovered (listing loads nothing)",
                _json(
                    _obj(
                        ["object", "data"],
                        object={"const": "list"},
                        data={
                            "type": "array",
                            "items": _obj(
                                ["id", "object", "owned_by", "created", "resident"],
                                id=_STR,
                                object={"const": "model"},
                                owned_by=_STR,
                                created=_INT,
                                resident=_BOOL,
                                source={
                                    "enum": [
                                        "config",
                                        "models",
                                        "huggingface",
                                        "ollama",
                                        "lmstudio",
                                    ]
                                },
                                size_bytes=_nullable(_BYTES),
                            ),
                        },
                    ),
                    "the models",
                ),
                tag="openai",
                auth="public",
            )
        },
        "/v1/chat/completions": {"post": _completion("A chat completion, loading on demand")},
        "/v1/completions": {"post": _completion("A text completion, loading on demand")},
        "/v1/embeddings": {"post": _completion("Embeddings, loading on demand")},
        "/api/engines": {
            "get": _op(
                "Every engine the runtime knows, sessions per engine, the ledger",
                _json(
                    _obj(
                        ["engines", "sessions", "ledger", "closed"],
                        engines={"type": "array", "items": _ENGINE_VIEW},
                        sessions={"type": "object", "additionalProperties": _INT},
                        ledger=_nullable(_ANY_OBJ),
                        closed=_BOOL,
                    ),
                    "the engines",
                ),
                tag="operator",
                auth="public",
            )
        },
        "/api/queues": {
            "get": _op(
                "Every engine's queue (QA3)",
                _json({"type": "object", "additionalProperties": _QUEUE}, "engine key → queue"),
                tag="operator",
                auth="public",
            )
        },
        "/api/events": {
            "get": _op(
                "Server-Sent Events: the log after a seq, then each new event as written",
                {
                    "description": "`id:` the seq, `event:` the type, `data:` the event as JSON",
                    "content": {"text/event-stream": {"schema": _STR}},
                },
                tag="events",
                auth="public",
                errors=("BadRequest",),
                params=(
                    {
                        "name": "after",
                        "in": "query",
                        "required": False,
                        "description": "resume after this seq (default 0: the whole log)",
                        "schema": {"type": "string", "pattern": "^[0-9]{1,18}$"},
                    },
                    {
                        "name": "Last-Event-ID",
                        "in": "header",
                        "required": False,
                        "description": "resume after this seq (browsers send it on reconnect)",
                        "schema": {"type": "string", "pattern": "^[0-9]{1,18}$"},
                    },
                ),
            )
        },
        "/": {
            "get": _asset("The dashboard (HTML; its data comes from the routes below)", "text/html")
        },
        "/dashboard.js": {"get": _asset("The dashboard's script", "text/javascript")},
        "/dashboard.css": {"get": _asset("The dashboard's style", "text/css")},
        "/api/timeline.svg": {
            "get": _op(
                "The memory timeline of the last minutes of the log, as SVG (PM30-PM32)",
                {
                    "description": "reserved and measured bytes per engine, the budget, "
                    "markers (`marker-<kind>-<seq>` ids) and lease holds",
                    "content": {"image/svg+xml": {"schema": _STR}},
                },
                tag="events",
                auth="public",
                errors=("BadRequest", "Unavailable"),
                params=(
                    {
                        "name": "minutes",
                        "in": "query",
                        "required": False,
                        "description": "how far back it reaches (default 30; at most a week)",
                        "schema": {"type": "integer", "minimum": 1, "maximum": MAX_MINUTES},
                    },
                ),
            )
        },
        "/metrics": {
            "get": _op(
                "Prometheus text format",
                {"description": "the metrics", "content": {"text/plain": {"schema": _STR}}},
                tag="events",
                auth="public",
            )
        },
        "/api/models/{model}/load": {
            "post": _op(
                "Load a model now, making room as a request would",
                _json(
                    _obj(["model", "key", "loaded"], model=_STR, key=_STR, loaded={"const": True}),
                    "loaded",
                ),
                tag="operator",
                auth="always",
                errors=_ROUTED,
                params=(_path_param("model", "a configured model id"),),
            )
        },
        "/api/engines/{key}/unload": {
            "post": _op(
                "Unload an idle engine (PP6)",
                _json(_obj(["key", "unloaded"], key=_STR, unloaded=_BOOL), "false: not resident"),
                tag="operator",
                auth="always",
                errors=("BadRequest", "NotFound", "Unavailable"),
                params=(_KEY,),
            )
        },
        "/api/queues/{key}/{id}": {
            "delete": _op(
                "Cancel a queued request (QA3)",
                _json(_obj(["cancelled"], cancelled=_BOOL), "false: not queued"),
                tag="operator",
                auth="always",
                errors=("BadRequest", "NotFound", "Unavailable"),
                params=(_KEY, _QUEUE_ID),
            )
        },
        "/api/queues/{key}/{id}/move": {
            "post": _op(
                "Move a queued request up or down its lane (QA4)",
                _json(_obj(["moved"], moved=_BOOL), "false: at an edge, or not queued"),
                tag="operator",
                auth="always",
                errors=("BadRequest", "NotFound", "Unavailable"),
                params=(_KEY, _QUEUE_ID),
                body=_obj(["direction"], direction={"enum": ["up", "down"]}),
            )
        },
        "/api/cache": {
            "get": _op(
                "Every engine's prompt-cache stats (CC10), saved session files included (CC14)",
                _json(
                    _obj(["caches"], caches={"type": "array", "items": _CACHE_STATS}),
                    "the stats, by key",
                ),
                tag="operator",
                auth="public",
                errors=("Unavailable",),
            )
        },
        "/api/cache/{key}": {
            "get": _op(
                "The engine's prompt-cache stats (CC10), or null when it has no cache",
                _json(_nullable(_CACHE_STATS), "the stats"),
                tag="operator",
                auth="public",
                errors=("BadRequest", "NotFound", "Unavailable"),
                params=(_KEY,),
            )
        },
        "/api/cache/{key}/clear": {
            "post": _op(
                "Drop every cached prompt of the engine (CC6)",
                _json(_obj(["cleared"], cleared={"const": True}), "cleared"),
                tag="operator",
                auth="always",
                errors=("BadRequest", "NotFound", "Unavailable"),
                params=(_KEY,),
            )
        },
        "/api/cache/{key}/budget": {
            "put": _op(
                "The engine's cache budget, enforced at once (CC3)",
                _json(_obj(["bytes"], bytes=_INT), "the budget set"),
                tag="operator",
                auth="always",
                errors=("BadRequest", "NotFound", "Unavailable"),
                params=(_KEY,),
                body=_obj(["bytes"], bytes=_BYTES),
            )
        },
        "/api/sessions/{session}/cache": {
            "delete": _op(
                "Drop a session's cached prompt everywhere (CC5)",
                _json(_obj(["evicted"], evicted={"const": True}), "evicted"),
                tag="operator",
                auth="always",
                errors=("NotFound", "Unavailable"),
                params=(_path_param("session", "the session's name"),),
            )
        },
        "/api/budget": {
            "get": _op(
                "The memory budget, limits and every reservation (CB10)",
                _json(_BUDGET, "the budget"),
                tag="operator",
                auth="public",
                errors=("BadRequest", "Unavailable"),
            ),
            "put": _op(
                "Set the budget and/or spillover, live; never evicts (CB2, CB3)",
                _json(_BUDGET, "the budget after the change"),
                tag="operator",
                auth="always",
                errors=("BadRequest", "Unavailable"),
                body={
                    "type": "object",
                    "minProperties": 1,
                    "additionalProperties": False,
                    "properties": {
                        "bytes": {
                            **_nullable(_BYTES),
                            "description": "the budget in bytes, or null for automatic",
                        },
                        "spillover": {
                            **_nullable(_BOOL),
                            "description": "allow RAM spillover, or null for automatic",
                        },
                    },
                },
            ),
        },
        "/api/preview/{key}": {
            "get": _op(
                "What starting the engine would plan and reserve now (NR6)",
                _json(
                    _obj(
                        ["context_window", "slots", "planned_bytes", "reserved_bytes", "admitted"],
                        context_window=_INT,
                        slots=_INT,
                        kv_type=_nullable(_STR),
                        planned_bytes=_INT,
                        reserved_bytes=_INT,
                        admitted=_BOOL,
                        denial=_nullable(_STR),
                    ),
                    "the plan",
                ),
                tag="operator",
                auth="public",
                errors=("BadRequest", "NotFound", "BadGateway", "Unavailable"),
                params=(_KEY,),
            )
        },
        "/api/leases": {
            "get": _op(
                "The GPU lease held and those waiting (GA3)",
                _json({"type": "array", "items": _LEASE}, "the leases"),
                tag="operator",
                auth="public",
            ),
            "post": _op(
                "Acquire an exclusive GPU lease (waits for the card in swap mode)",
                _json(_obj(["id", "slot", "holder"], id=_STR, slot=_STR, holder=_STR), "held"),
                tag="operator",
                auth="always",
                errors=("BadRequest", "Unavailable"),
                body=_obj(
                    ["slot", "holder"],
                    slot={"enum": ["llm", "image", "video"]},
                    holder={"type": "string", "minLength": 1, "maxLength": 128},
                ),
            ),
        },
        "/api/leases/{id}": {
            "delete": _op(
                "Release a lease this server granted",
                _json(_obj(["released"], released=_BOOL), "false: not held here"),
                tag="operator",
                auth="always",
                errors=("NotFound", "Unavailable"),
                params=(_path_param("id", "the id `POST /api/leases` answered"),),
            )
        },
        "/api/device": {
            "get": _op(
                "The device health gate's status (DH5), or null when none is configured",
                _json(
                    _nullable(
                        _obj(
                            ["state", "mode"],
                            state=_STR,
                            mode=_STR,
                            readings={"type": "array", "items": _ANY_OBJ},
                            reasons={"type": "array", "items": _STR},
                            error=_STR,
                            sampled_at=_NUM,
                        )
                    ),
                    "the gate",
                ),
                tag="operator",
                auth="public",
                errors=("Unavailable",),
            )
        },
        "/api/reconcile": {
            "post": _op(
                "Hold that many replicas of each engine:model (PP10)",
                _json(
                    _obj(
                        ["evicted", "started", "failed"],
                        evicted={"type": "array", "items": _STR},
                        started={"type": "array", "items": _STR},
                        failed={"type": "object", "additionalProperties": _STR},
                    ),
                    "what changed",
                ),
                tag="operator",
                auth="always",
                errors=("BadRequest", "Unavailable"),
                body=_obj(
                    ["targets"],
                    targets={
                        "type": "object",
                        "description": "`engine:model` → replica count",
                        "propertyNames": {"pattern": "^[a-z0-9][a-z0-9_-]*:[^:]+$"},
                        "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 64},
                    },
                ),
            )
        },
    }


_DOCUMENT: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "hostler",
        "version": "1",
        "description": "Local inference engines kept resident within the machine's memory: "
        "OpenAI-compatible routes that load on demand, and operator routes. Errors are "
        "OpenAI's shape with hostler's stable `code`. `x-hostler-token` on each operation: "
        "`never`, `public` (the token is needed only when the server listens beyond "
        "loopback) or `always`.",
    },
    "paths": _paths(),
    "components": {
        "securitySchemes": {
            "bearer": {
                "type": "http",
                "scheme": "bearer",
                "description": "the daemon's token (the data directory's `token` file)",
            }
        },
        "schemas": {"Error": _ERROR_SCHEMA},
        "responses": _RESPONSES,
        "headers": {
            "RetryAfter": {
                "description": "seconds to wait before trying again",
                "schema": {"type": "string", "pattern": "^[0-9]+$"},
            }
        },
    },
}


def openapi_schema(models: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The OpenAPI document of every route :func:`hostler.serve.app.make_app` serves (a copy).

    Args:
        models: The configured models (model id → ``engine:model``), given as examples of a
            model id and of an engine key (replica 0); the routes are the same without them.
    """
    document = copy.deepcopy(_DOCUMENT)
    if models:
        ids = sorted(models)
        keys = sorted(f"{target}:0" for target in models.values())
        paths = document["paths"]
        for route in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
            body = paths[route]["post"]["requestBody"]["content"][_JSON]["schema"]
            body["properties"]["model"]["examples"] = ids
        for item in paths.values():
            for operation in item.values():
                for param in operation.get("parameters", ()):
                    if param["in"] != "path":
                        continue
                    if param["name"] == "key":
                        param["schema"]["examples"] = keys
                    elif param["name"] == "model":
                        param["schema"]["examples"] = ids
        reconcile = paths["/api/reconcile"]["post"]["requestBody"]["content"][_JSON]["schema"]
        reconcile["properties"]["targets"]["examples"] = [dict.fromkeys(sorted(models.values()), 1)]
    return document
