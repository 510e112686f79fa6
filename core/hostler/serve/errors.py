"""hostler's errors as HTTP answers in OpenAI's error shape (``{"error": {...}}``).

Each :class:`~hostler.errors.HostlerError` code maps to one status, an OpenAI error ``type`` and,
where waiting helps, a ``Retry-After`` (seconds). Codes are hostler's own, so a client can act
on ``error.code`` without parsing the message.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from starlette.responses import Response

from hostler.errors import HostlerError

__all__ = [
    "HttpError",
    "error_response",
    "hostler_error_response",
    "http_error_for",
    "unknown_model_response",
]


@dataclass(frozen=True, slots=True)
class HttpError:
    """How one error code is answered."""

    status: int
    kind: str  # OpenAI's error "type"
    code: str  # the stable code clients act on
    retry_after: int | None = None


#: hostler error code → its HTTP answer. A code not listed is a 500 (a bug, never input).
_BY_CODE: dict[str, HttpError] = {
    "usage.invalid": HttpError(400, "invalid_request_error", "invalid-request"),
    "usage.setting": HttpError(400, "invalid_request_error", "invalid-request"),
    "request.invalid": HttpError(400, "invalid_request_error", "invalid-request"),
    "plugin.unknown-engine": HttpError(404, "invalid_request_error", "model_not_found"),
    "capacity.denied": HttpError(503, "server_error", "capacity-denied"),
    "engine.busy": HttpError(503, "server_error", "engine-busy", retry_after=30),
    "engine.abandoned": HttpError(503, "server_error", "start-abandoned", retry_after=1),
    "queue.timeout": HttpError(503, "server_error", "queue-timeout", retry_after=5),
    "queue.cancelled": HttpError(409, "server_error", "queue-cancelled"),
    "engine.start-failed": HttpError(502, "server_error", "engine-crashed"),
    "engine.restart-budget": HttpError(503, "server_error", "engine-crashed", retry_after=60),
    "engine.binary": HttpError(502, "server_error", "engine-crashed"),
    "model.unreadable": HttpError(502, "server_error", "engine-crashed"),
    "plugin.raised": HttpError(502, "server_error", "engine-crashed"),
    "runtime.closed": HttpError(503, "server_error", "shutting-down", retry_after=5),
    "device.unhealthy": HttpError(503, "server_error", "device-unhealthy", retry_after=60),
    # the log could not record a decision (a full disk, say): nothing was done; it heals
    "store.error": HttpError(503, "server_error", "store-unavailable", retry_after=10),
    "store.full": HttpError(503, "server_error", "store-unavailable", retry_after=10),
    "store.busy": HttpError(503, "server_error", "store-unavailable", retry_after=1),
    "store.unavailable": HttpError(503, "server_error", "store-unavailable", retry_after=5),
    "store.locked": HttpError(503, "server_error", "store-unavailable", retry_after=1),
    # damaged while serving: waiting does not mend it (no Retry-After); the message says which
    "store.corrupt": HttpError(503, "server_error", "store-unavailable"),
    "store.damaged-row": HttpError(503, "server_error", "store-unavailable"),
}


def http_error_for(error: HostlerError) -> HttpError:
    """The HTTP answer for ``error`` (500 ``internal`` for a code no route should raise)."""
    return _BY_CODE.get(error.code, HttpError(500, "server_error", "internal"))


def error_response(
    status: int,
    kind: str,
    code: str,
    message: str,
    retry_after: int | None = None,
    *,
    param: str | None = None,
) -> Response:
    """An OpenAI-shaped error body with its status and, when given, ``Retry-After``.

    ``param`` names the request's field at fault (OpenAI's ``error.param``).
    """
    body = {"error": {"message": message, "type": kind, "code": code, "param": param}}
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return Response(
        json.dumps(body), status_code=status, headers=headers, media_type="application/json"
    )


def hostler_error_response(error: HostlerError) -> Response:
    """``error`` answered with its status, code and ``Retry-After`` (:func:`http_error_for`)."""
    answer = http_error_for(error)
    return error_response(
        answer.status, answer.kind, answer.code, error.message, answer.retry_after
    )


def unknown_model_response(model: object, known: Iterable[str]) -> Response:
    """404 ``model_not_found``, naming the models that are offered (the first 20)."""
    offered = sorted(known)
    names = ", ".join(offered[:20]) or "none"
    if len(offered) > 20:
        names += f" and {len(offered) - 20} more: GET /v1/models"
    return error_response(
        404,
        "invalid_request_error",
        "model_not_found",
        f"model {str(model)[:100]!r} is not configured here (known: {names})",
    )
