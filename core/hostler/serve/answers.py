"""An engine's answer as the client should read it (pure): its ``model``, its errors.

Engines name themselves in their answers (llama-server: the GGUF's absolute path); a client
that asked for ``smollm2`` reads ``smollm2`` back, in a whole answer and in every streamed
chunk. An engine's own error is told in OpenAI's shape with a hostler code, so a client never
has to parse an engine's format (llama-server's ``{"error": {"code": 500, ...}}``).
"""

from __future__ import annotations

import json
from typing import Any, Final

import msgspec

__all__ = ["ENGINE_ERROR_LIMIT", "SseRenamer", "engine_error", "renamed", "shaped_error"]

#: The most bytes of an engine's error body read (its message is cut to a line anyway).
ENGINE_ERROR_LIMIT: Final = 64 * 1024
_ENCODER: Final = msgspec.json.Encoder()
_DECODER: Final = msgspec.json.Decoder()
_DATA: Final = b"data: {"


def renamed(body: bytes, model: str) -> bytes:
    """A JSON answer whose top-level ``model`` is ``model`` (unchanged when it has none).

    A body that is not a JSON object passes as it is: the client reads what the engine sent.
    """
    try:
        answer = _DECODER.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return body
    if not isinstance(answer, dict) or "model" not in answer or answer["model"] == model:
        return body
    answer["model"] = model
    return _ENCODER.encode(answer)


class SseRenamer:
    """Renames ``model`` in each ``data:`` event of a stream, chunk by chunk.

    An event split across chunks waits for its end of line; nothing else is held back, so a
    stream is never buffered beyond one line.
    """

    def __init__(self, model: str) -> None:
        self._model = model
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        """The bytes of ``chunk`` ready to send (whole lines, renamed)."""
        data = self._held + chunk
        end = data.rfind(b"\n")
        if end < 0:
            self._held = data
            return b""
        self._held = data[end + 1 :]
        ready = data[: end + 1]
        if _DATA not in ready:
            return ready
        return b"".join(self._line(line) for line in ready.splitlines(keepends=True))

    def flush(self) -> bytes:
        """What is held at the stream's end (a last line without its newline)."""
        held, self._held = self._held, b""
        return self._line(held) if held else b""

    def _line(self, line: bytes) -> bytes:
        if not line.startswith(_DATA):
            return line
        body = line[len(b"data: ") :]
        ending = body[len(body.rstrip(b"\r\n")) :]
        return b"data: " + renamed(body.rstrip(b"\r\n"), self._model) + ending


def engine_error(status: int, body: bytes, model: str) -> tuple[int, dict[str, Any]]:
    """An engine's error answer as hostler's: the status to send and the OpenAI-shaped body.

    A 4xx keeps its status (``engine-rejected``: the request was the problem); a 5xx is a 502
    (``engine-error``: the engine failed it). The engine's own message is kept, on one line.
    """
    message = _message_of(body[:ENGINE_ERROR_LIMIT])
    if 400 <= status < 500:
        return status, shaped_error(
            f"the engine for {model!r} refused the request ({status}): {message}",
            "invalid_request_error",
            "engine-rejected",
        )
    return 502, shaped_error(
        f"the engine for {model!r} failed the request ({status}): {message}",
        "server_error",
        "engine-error",
    )


def shaped_error(message: str, kind: str, code: str) -> dict[str, Any]:
    """An OpenAI error body: ``{"error": {message, type, code, param}}``."""
    return {"error": {"message": message, "type": kind, "code": code, "param": None}}


def _message_of(body: bytes) -> str:
    """The engine's message: ``error.message``, ``error`` or ``detail`` if JSON, else the text."""
    text = body.decode("utf-8", "replace")
    try:
        parsed: object = json.loads(text)
    except ValueError:
        parsed = None
    found: object = text
    if isinstance(parsed, dict):
        error = parsed.get("error", parsed.get("detail", parsed.get("message")))
        if isinstance(error, dict):
            error = error.get("message", error)
        if error is not None:
            found = error
    line = " ".join(str(found).split())
    return (line[:297] + "...") if len(line) > 300 else (line or "no message")
