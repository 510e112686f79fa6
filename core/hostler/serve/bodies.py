"""OpenAI request bodies, checked at the edge before any engine is loaded (pure).

A completion's body is decoded strictly (UTF-8 JSON, finite numbers, no lone UTF-16
surrogate) and the fields hostler and every engine rely on are checked by type: ``model``;
``messages`` for a chat, ``prompt`` for a completion, ``input`` for an embedding; ``stream``;
``n`` (one choice only). A body that fails is a :class:`~hostler.errors.RequestBodyError`
naming the ``param`` at fault, answered as OpenAI's 400 — never sent to an engine, whose own
parser answers such bodies with a 500 after the model was loaded (and maybe another evicted).

Everything else in the body passes untouched: the engine judges its own options.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any, Final

import msgspec

from hostler.errors import RequestBodyError

__all__ = ["CHAT", "COMPLETIONS", "EMBEDDINGS", "check_body", "decode_body"]

CHAT: Final = "/v1/chat/completions"
COMPLETIONS: Final = "/v1/completions"
EMBEDDINGS: Final = "/v1/embeddings"
#: The most items a list field may hold before it is refused (a prompt batch, messages).
MAX_ITEMS: Final = 65536
_DECODER: Final = msgspec.json.Decoder()


class _NotFinite:
    """Where a ``NaN`` or ``Infinity`` stood in a body (found only to name its param)."""


_NOT_FINITE: Final = _NotFinite()


def decode_body(body: bytes) -> dict[str, Any]:
    """``body`` as a JSON object, decoded strictly.

    Raises:
        RequestBodyError: Not UTF-8, not JSON, not an object, a number that is not finite, or
            a lone UTF-16 surrogate (``param`` names where, when it can).
    """
    try:
        payload = _DECODER.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        payload = _slow_decode(body, exc)
    if not isinstance(payload, dict):
        raise RequestBodyError("the request body must be a JSON object", None)
    return payload


def _slow_decode(body: bytes, error: Exception) -> object:
    """What the fast decoder refused, decoded by the standard one, or the one-line reason.

    Valid JSON the fast decoder cannot hold (an integer past 64 bits) is taken as it is: the
    engine judges its own options.

    Raises:
        RequestBodyError: Not UTF-8 JSON, a number that is not finite, a lone surrogate.
    """
    if (encoding := _encoding_problem(body)) is not None:
        raise RequestBodyError(encoding, None)
    try:
        parsed = json.loads(body.decode("utf-8"), parse_constant=lambda _: _NOT_FINITE)
    except ValueError as exc:
        if "digits" in str(exc):  # Python's int() limit: a number no engine could use
            raise RequestBodyError("a number in the body has over 4300 digits", None) from None
        raise RequestBodyError(f"the request body is not JSON ({_short(error)})", None) from None
    except RecursionError:
        raise RequestBodyError(f"the request body is not JSON ({_short(error)})", None) from None
    if (where := _find(parsed, _is_not_finite, "")) is not None:
        raise RequestBodyError(
            f"{where or 'the body'} is not a finite number (NaN and Infinity are not JSON)",
            where or None,
        )
    if (where := _find(parsed, _has_lone_surrogate, "")) is not None:
        raise RequestBodyError(
            f"{where or 'the body'} holds a lone UTF-16 surrogate (\\ud800-\\udfff), in a "
            "value or a key: send valid Unicode",
            where or None,
        )
    return parsed


def _encoding_problem(body: bytes) -> str | None:
    """Why ``body`` is not UTF-8 text, if it is not."""
    if not body.strip():
        return "the request body is empty: send a JSON object"
    if body[:2] in (b"\xff\xfe", b"\xfe\xff") or (len(body) > 1 and b"\x00" in body[:4]):
        return "the request body is UTF-16 or UTF-32: send UTF-8 JSON"
    if body.startswith(b"\xef\xbb\xbf"):
        return "the request body starts with a byte order mark: drop it"
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"the request body is not valid UTF-8 (byte {exc.start}): send UTF-8 JSON"
    return None


def _short(error: Exception) -> str:
    return str(error).splitlines()[0][:120] if str(error) else type(error).__name__


def _is_not_finite(value: object) -> bool:
    return value is _NOT_FINITE or (isinstance(value, float) and not math.isfinite(value))


def _has_lone_surrogate(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _find(value: object, bad: Callable[[object], bool], path: str) -> str | None:
    """The path (``messages[0].content``) of the first value (or key) ``bad`` says is bad.

    Iterative, so a body nested deeply costs no recursion; bounded by the body's size.
    """
    stack: list[tuple[object, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if bad(item):
            return where
        if isinstance(item, dict):
            for key, inner in reversed(list(item.items())):
                if bad(key):
                    return where  # the object holding the key
                stack.append((inner, f"{where}.{key}".lstrip(".")))
        elif isinstance(item, list):
            stack.extend((inner, f"{where}[{i}]") for i, inner in reversed(list(enumerate(item))))
    return None


def check_body(route: str, payload: Mapping[str, Any]) -> None:
    """Check the fields of ``payload`` that ``route`` needs, by type.

    Raises:
        RequestBodyError: The first field at fault, as OpenAI's ``param``.
    """
    model = payload.get("model")
    if model is None:
        raise RequestBodyError("'model' is required: the id of a model (GET /v1/models)", "model")
    if not isinstance(model, str) or not model:
        raise RequestBodyError(
            f"'model' must be a model id (a string), not {_kind(model)}", "model"
        )
    stream = payload.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise RequestBodyError(f"'stream' must be true or false, not {_kind(stream)}", "stream")
    user = payload.get("user")
    if user is not None and not isinstance(user, str):  # it names the session (CC13)
        raise RequestBodyError(f"'user' must be a string, not {_kind(user)}", "user")
    if route == CHAT:
        _check_messages(payload.get("messages"))
    elif route == COMPLETIONS:
        _check_prompt(payload.get("prompt"))
    elif route == EMBEDDINGS:
        _check_input(payload.get("input"))
    if route != EMBEDDINGS:
        _check_n(payload.get("n"))
    for name, (routes, check, wanted) in _TYPED.items():
        value = payload.get(name)
        if value is not None and route in routes and not check(value):
            shown = value if type(value) in (int, float) else _kind(value)
            raise RequestBodyError(f"'{name}' must be {wanted}, not {shown}", name)
    if route == CHAT:
        _check_tools(payload.get("tools"))


def _number(low: float, high: float) -> Callable[[object], bool]:
    """A JSON number from ``low`` to ``high``."""
    return lambda value: type(value) in (int, float) and low <= value <= high  # type: ignore[operator]


def _whole(low: int) -> Callable[[object], bool]:
    """A JSON integer of at least ``low``."""
    return lambda value: type(value) is int and value >= low


def _number_whole(low: int, high: int) -> Callable[[object], bool]:
    """A JSON integer from ``low`` to ``high``."""
    return lambda value: type(value) is int and low <= value <= high


#: The largest token limit an engine takes (llama-server's: a C int).
MAX_TOKENS_LIMIT = 2**31 - 1


def _tokens_limit(value: object) -> bool:
    """A token limit: 1 to 2^31 - 1, or -1 (llama.cpp's "until the context is full")."""
    return type(value) is int and (1 <= value <= MAX_TOKENS_LIMIT or value == -1)


def _named_function(value: object) -> bool:
    """``{"type": "function", "function": {"name": "..."}}`` (a tool, or a tool choice)."""
    if not isinstance(value, dict) or value.get("type", "function") != "function":
        return False
    function = value.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    return isinstance(name, str) and bool(name)


def _response_format(value: object) -> bool:
    """``{"type": "text" | "json_object" | "json_schema", ...}``."""
    return isinstance(value, dict) and value.get("type") in ("text", "json_object", "json_schema")


def _stream_options(value: object) -> bool:
    """``{"include_usage": true | false}`` (other keys pass)."""
    return isinstance(value, dict) and type(value.get("include_usage", False)) is bool


def _stop(value: object) -> bool:
    """``stop``: a string, or a list of at most 4 strings (OpenAI's bound)."""
    return isinstance(value, str) or (
        isinstance(value, list) and len(value) <= 4 and all(isinstance(v, str) for v in value)
    )


_SAMPLING = frozenset({CHAT, COMPLETIONS})
#: The typed fields OpenAI defines (name → routes, check, what it must be), checked before any
#: engine loads; the engine's own extensions (``top_k``, ``min_p``...) pass as they are.
_TYPED: Final[dict[str, tuple[frozenset[str], Callable[[object], bool], str]]] = {
    "temperature": (_SAMPLING, _number(0, 2), "a number from 0 to 2"),
    "top_p": (_SAMPLING, _number(0, 1), "a number from 0 to 1"),
    "frequency_penalty": (_SAMPLING, _number(-2, 2), "a number from -2 to 2"),
    "presence_penalty": (_SAMPLING, _number(-2, 2), "a number from -2 to 2"),
    "max_tokens": (
        _SAMPLING,
        _tokens_limit,
        "a whole number from 1 to 2147483647 (or -1: no limit)",
    ),
    "max_completion_tokens": (
        frozenset({CHAT}),
        _tokens_limit,
        "a whole number from 1 to 2147483647 (or -1: no limit)",
    ),
    "seed": (_SAMPLING, lambda value: type(value) is int, "a whole number"),
    "stop": (_SAMPLING, _stop, "a string or a list of at most 4 strings"),
    "top_logprobs": (frozenset({CHAT}), _number_whole(0, 20), "a whole number from 0 to 20"),
    "tool_choice": (
        frozenset({CHAT}),
        lambda value: value in ("none", "auto", "required") or _named_function(value),
        '"none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
    ),
    "response_format": (
        frozenset({CHAT}),
        _response_format,
        'an object whose "type" is "text", "json_object" or "json_schema"',
    ),
    "stream_options": (
        frozenset({CHAT, COMPLETIONS}),
        _stream_options,
        'an object whose "include_usage" is true or false',
    ),
    "dimensions": (frozenset({EMBEDDINGS}), _whole(1), "a whole number of at least 1"),
    "encoding_format": (
        frozenset({EMBEDDINGS}),
        lambda value: value in ("float", "base64"),
        '"float" or "base64"',
    ),
}


def _check_tools(tools: object) -> None:
    """``tools``: a list of ``{"type": "function", "function": {"name": ...}}``."""
    if tools is None:
        return
    if not isinstance(tools, list):
        raise RequestBodyError(f"'tools' must be a list of tools, not {_kind(tools)}", "tools")
    if len(tools) > MAX_ITEMS:
        raise RequestBodyError(f"'tools' holds over {MAX_ITEMS} tools", "tools")
    for index, tool in enumerate(tools):
        at = f"tools[{index}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise RequestBodyError(
                f"'{at}' must be an object of \"type\": \"function\" with a 'function' that "
                f"has a 'name', not {_kind(tool)}",
                at,
            )
        if not _named_function(tool):
            raise RequestBodyError(f"'{at}.function.name' must be a non-empty string", at)
        parameters = tool["function"].get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise RequestBodyError(
                f"'{at}.function.parameters' must be a JSON Schema object, not {_kind(parameters)}",
                f"{at}.function.parameters",
            )


def _check_n(n: object) -> None:
    if n is None or (type(n) in (int, float) and n == 1):
        return
    shown = n if type(n) in (int, float) else _kind(n)
    raise RequestBodyError(
        f"'n' is {shown}: hostler answers one choice per request (n = 1); send one request "
        "per choice",
        "n",
    )


def _check_messages(messages: object) -> None:
    if messages is None:
        raise RequestBodyError("'messages' is required: a list of chat messages", "messages")
    if not isinstance(messages, list) or not messages:
        raise RequestBodyError(
            f"'messages' must be a non-empty list of messages, not {_kind(messages)}", "messages"
        )
    if len(messages) > MAX_ITEMS:
        raise RequestBodyError(f"'messages' holds over {MAX_ITEMS} messages", "messages")
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise RequestBodyError(f"'{where}' must be an object, not {_kind(message)}", where)
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise RequestBodyError(
                f'\'{where}.role\' must be a role ("user", "assistant", ...), not {_kind(role)}',
                f"{where}.role",
            )
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise RequestBodyError(
                f"'{where}.content' must be a string or a list of parts, not {_kind(content)}",
                f"{where}.content",
            )
        if isinstance(content, list):
            _check_parts(content, f"{where}.content")
        calls = message.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise RequestBodyError(
                f"'{where}.tool_calls' must be a list, not {_kind(calls)}", f"{where}.tool_calls"
            )
        if content is None and not (role == "assistant" and calls is not None):
            raise RequestBodyError(
                f"'{where}.content' is required (only an assistant's message with "
                "'tool_calls' may leave it out)",
                f"{where}.content",
            )


def _check_parts(parts: list[Any], where: str) -> None:
    """A message's content parts: objects with a ``type``; a text part's ``text`` a string."""
    if len(parts) > MAX_ITEMS:
        raise RequestBodyError(f"'{where}' holds over {MAX_ITEMS} parts", where)
    for index, part in enumerate(parts):
        at = f"{where}[{index}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise RequestBodyError(f"'{at}' must be an object with a 'type', not {_kind(part)}", at)
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise RequestBodyError(
                f"'{at}.text' must be a string, not {_kind(part.get('text'))}", f"{at}.text"
            )


def _check_prompt(prompt: object) -> None:
    if prompt is None:
        raise RequestBodyError("'prompt' is required: a string, or a list of them", "prompt")
    if not _is_text_or_tokens(prompt):
        raise RequestBodyError(
            "'prompt' must be a string, a list of strings, a list of token ids or a list of "
            f"such lists, not {_kind(prompt)}",
            "prompt",
        )


def _check_input(value: object) -> None:
    if value is None:
        raise RequestBodyError("'input' is required: the text to embed, or a list of them", "input")
    if value in ("", []):
        raise RequestBodyError("'input' is empty: send the text to embed", "input")
    if not _is_text_or_tokens(value):
        raise RequestBodyError(
            "'input' must be a string, a list of strings, a list of token ids or a list of "
            f"such lists, not {_kind(value)}",
            "input",
        )


def _is_text_or_tokens(value: object) -> bool:
    if isinstance(value, str):
        return True
    if not isinstance(value, list) or len(value) > MAX_ITEMS:
        return False
    if all(isinstance(item, str) for item in value):
        return True
    if all(type(item) is int for item in value):
        return True
    return all(
        isinstance(item, list)
        and len(item) <= MAX_ITEMS
        and all(type(token) is int for token in item)
        for item in value
    )


def _kind(value: object) -> str:
    """How a wrong value is named in a message (its JSON type, never its content)."""
    if isinstance(value, str | list) and not value:
        return f"an empty {'string' if isinstance(value, str) else 'list'}"
    for kind, name in _KINDS:
        if isinstance(value, kind):
            return name
    return "null" if value is None else type(value).__name__


#: JSON's types as a message names them (bool before int: a bool is an int in Python).
_KINDS: Final = (
    (bool, "a boolean"),
    (int | float, "a number"),
    (str, "a string"),
    (list, "a list"),
    (dict, "an object"),
)
