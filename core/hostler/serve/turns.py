"""What an engine says a turn read: its prompt tokens and how many came from its cache (CC4).

The proxy relays an answer as it comes and keeps only its last :data:`TAIL` bytes beside
(a stream's last event, or a whole small JSON answer), so reading the usage costs no copy of
a long answer and no buffering of a stream. llama-server puts its own counts in ``timings``
(``prompt_n``: tokens evaluated now, ``cache_n``: tokens reused from the cache); an OpenAI
``usage`` (``prompt_tokens``, ``prompt_tokens_details.cached_tokens``) is read where there are
no timings. An answer that tells neither gives None: the turn's outcome is then what was
prepared.
"""

from __future__ import annotations

import json
from typing import Any

from hostler.runtime.cache import TurnUsage

__all__ = ["TAIL", "AnswerTail", "turn_usage"]

#: The bytes of an answer's end kept to read its usage from.
TAIL = 64 * 1024


class AnswerTail:
    """The last :data:`TAIL` bytes of an answer, fed chunk by chunk as it is relayed."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        self._kept = bytearray()

    def feed(self, chunk: bytes) -> None:
        """Keep ``chunk``'s bytes (only the last :data:`TAIL` of all are kept)."""
        if len(chunk) >= TAIL:
            self._kept[:] = chunk[-TAIL:]
            return
        self._kept += chunk
        if len(self._kept) > TAIL:
            del self._kept[: len(self._kept) - TAIL]

    def usage(self) -> TurnUsage | None:
        """The turn's usage as the answer's end tells it (None when it tells none)."""
        return turn_usage(bytes(self._kept))


def turn_usage(tail: bytes) -> TurnUsage | None:
    """The usage in the end of an answer: a JSON object, or a stream's last ``data:`` events."""
    text = tail.decode("utf-8", "replace")
    stripped = text.strip()
    if stripped.startswith("{"):
        return _usage_of(_object(stripped))
    for raw in reversed(text.splitlines()):
        line = raw.strip()
        if line.startswith("data:"):
            found = _usage_of(_object(line[5:].strip()))
            if found is not None:
                return found
    return None


def _object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:  # a cut-off start of the tail, "[DONE]", a non-JSON answer
        return None
    return value if isinstance(value, dict) else None


def _count(value: object) -> int | None:
    return value if type(value) is int and 0 <= value < 2**40 else None


def _usage_of(answer: dict[str, Any] | None) -> TurnUsage | None:
    if answer is None:
        return None
    timings = answer.get("timings")
    if isinstance(timings, dict):
        evaluated, cached = _count(timings.get("prompt_n")), _count(timings.get("cache_n"))
        if evaluated is not None:
            return TurnUsage(evaluated + (cached or 0), cached)
    usage = answer.get("usage")
    if isinstance(usage, dict) and (prompt := _count(usage.get("prompt_tokens"))) is not None:
        details = usage.get("prompt_tokens_details")
        cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
        return TurnUsage(prompt, cached)
    return None
