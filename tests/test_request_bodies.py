"""OpenAI request bodies checked at the edge (``hostler.serve.bodies``): each refusal, by value."""

from __future__ import annotations

import json

import pytest

from hostler.errors import RequestBodyError
from hostler.serve.bodies import CHAT, COMPLETIONS, EMBEDDINGS, check_body, decode_body

CHAT_OK = {"model": "alpha", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        (b"", None, "the request body is empty: send a JSON object"),
        (b"[1, 2]", None, "the request body must be a JSON object"),
        (b'{"model": "a", "x": "\xff"}', None, "the request body is not valid UTF-8 (byte 21)"),
        (json.dumps(CHAT_OK).encode("utf-16"), None, "the request body is UTF-16 or UTF-32"),
        (json.dumps(CHAT_OK).encode("utf-16-le"), None, "the request body is UTF-16 or UTF-32"),
        (b"\xef\xbb\xbf{}", None, "the request body starts with a byte order mark"),
        (b'{"model": "a", "temperature": NaN}', "temperature", "temperature is not a finite"),
        (b'{"model": "a", "top_p": 1e999}', "top_p", "top_p is not a finite number"),
        (b'{"a": {"b": [1, -Infinity]}}', "a.b[1]", "a.b[1] is not a finite number"),
        (
            b'{"model": "a", "messages": [{"role": "user", "content": "\\ud800"}]}',
            "messages[0].content",
            "messages[0].content holds a lone UTF-16 surrogate",
        ),
        (b'{"model": "a", "messages": [', None, "the request body is not JSON"),
    ],
)
def test_bodies_that_are_not_strict_json_are_refused_naming_where(
    body: bytes, param: str | None, message: str
) -> None:
    with pytest.raises(RequestBodyError) as refused:
        decode_body(body)
    assert refused.value.param == param
    assert refused.value.message.startswith(message)
    assert refused.value.code == "request.invalid"


def test_a_strict_body_decodes_to_its_object() -> None:
    assert decode_body(json.dumps(CHAT_OK).encode()) == CHAT_OK
    assert decode_body('{"model": "é", "x": 1.5}'.encode()) == {"model": "é", "x": 1.5}


@pytest.mark.parametrize(
    ("route", "payload", "param", "message"),
    [
        (CHAT, {"messages": []}, "model", "'model' is required"),
        (
            CHAT,
            {**CHAT_OK, "model": 5},
            "model",
            "'model' must be a model id (a string), not a number",
        ),
        (
            CHAT,
            {**CHAT_OK, "model": ""},
            "model",
            "'model' must be a model id (a string), not an empty string",
        ),
        (CHAT, {"model": "a"}, "messages", "'messages' is required"),
        (
            CHAT,
            {"model": "a", "messages": "hi"},
            "messages",
            "'messages' must be a non-empty list of messages, not a string",
        ),
        (
            CHAT,
            {"model": "a", "messages": []},
            "messages",
            "'messages' must be a non-empty list of messages, not an empty list",
        ),
        (
            CHAT,
            {"model": "a", "messages": ["hi"]},
            "messages[0]",
            "'messages[0]' must be an object, not a string",
        ),
        (
            CHAT,
            {"model": "a", "messages": [{"content": "hi"}]},
            "messages[0].role",
            "'messages[0].role' must be a role",
        ),
        (
            CHAT,
            {"model": "a", "messages": [{"role": "user", "content": 3}]},
            "messages[0].content",
            "'messages[0].content' must be a string or a list of parts, not a number",
        ),
        (
            CHAT,
            {**CHAT_OK, "n": 2},
            "n",
            "'n' is 2: hostler answers one choice per request (n = 1); send one request per choice",
        ),
        (CHAT, {**CHAT_OK, "n": 0}, "n", "'n' is 0: hostler answers one choice per request"),
        (CHAT, {**CHAT_OK, "n": "1"}, "n", "'n' is a string: hostler answers one choice"),
        (CHAT, {**CHAT_OK, "n": True}, "n", "'n' is a boolean: hostler answers one choice"),
        # found by a breaking helper: these reached the engine (loaded for them) and came back
        # as its 500 (502 engine-error), or passed unchecked
        (
            CHAT,
            {
                "model": "a",
                "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}],
            },
            "messages[0].content[0].text",
            "'messages[0].content[0].text' must be a string, not a number",
        ),
        (
            CHAT,
            {"model": "a", "messages": [{"role": "user", "content": ["hi"]}]},
            "messages[0].content[0]",
            "'messages[0].content[0]' must be an object with a 'type', not a string",
        ),
        (
            CHAT,
            {"model": "a", "messages": [{"role": "assistant", "content": None, "tool_calls": "x"}]},
            "messages[0].tool_calls",
            "'messages[0].tool_calls' must be a list, not a string",
        ),
        (CHAT, {**CHAT_OK, "user": 5}, "user", "'user' must be a string, not a number"),
        (
            EMBEDDINGS,
            {"model": "a", "input": "x", "user": {"a": 1}},
            "user",
            "'user' must be a string, not an object",
        ),
        (
            CHAT,
            {**CHAT_OK, "stream": "yes"},
            "stream",
            "'stream' must be true or false, not a string",
        ),
        (COMPLETIONS, {"model": "a"}, "prompt", "'prompt' is required"),
        (
            COMPLETIONS,
            {"model": "a", "prompt": {"x": 1}},
            "prompt",
            "'prompt' must be a string, a list of strings",
        ),
        (COMPLETIONS, {"model": "a", "prompt": [1, "a"]}, "prompt", "'prompt' must be a string"),
        (EMBEDDINGS, {"model": "a"}, "input", "'input' is required"),
        (EMBEDDINGS, {"model": "a", "input": ""}, "input", "'input' is empty"),
        (EMBEDDINGS, {"model": "a", "input": [[1, 2], 3]}, "input", "'input' must be a string"),
        # OpenAI's typed fields, before an engine loads (a breaking helper's list)
        (CHAT, {**CHAT_OK, "tools": "x"}, "tools", "'tools' must be a list of tools, not a string"),
        (
            CHAT,
            {**CHAT_OK, "tools": [{"type": "function"}]},
            "tools[0]",
            "'tools[0].function.name' must be a non-empty string",
        ),
        (
            CHAT,
            {**CHAT_OK, "temperature": "hot"},
            "temperature",
            "'temperature' must be a number from 0 to 2, not a string",
        ),
        (
            CHAT,
            {**CHAT_OK, "temperature": 2.5},
            "temperature",
            "'temperature' must be a number from 0 to 2, not 2.5",
        ),
        (
            CHAT,
            {**CHAT_OK, "temperature": True},
            "temperature",
            "'temperature' must be a number from 0 to 2, not a boolean",
        ),
        (
            CHAT,
            {**CHAT_OK, "max_tokens": "5"},
            "max_tokens",
            "'max_tokens' must be a whole number from 1 to 2147483647 (or -1: no limit), not a string",
        ),
        (
            COMPLETIONS,
            {"model": "a", "prompt": "x", "max_tokens": 0},
            "max_tokens",
            "'max_tokens' must be a whole number from 1 to 2147483647 (or -1: no limit), not 0",
        ),
        (CHAT, {**CHAT_OK, "max_tokens": -2}, "max_tokens", "'max_tokens' must be a whole"),
        (CHAT, {**CHAT_OK, "max_tokens": 2**31}, "max_tokens", "'max_tokens' must be a whole"),
        (
            CHAT,
            {**CHAT_OK, "tools": [{"type": "nope", "function": {"name": "f"}}]},
            "tools[0]",
            "'tools[0]' must be an object of \"type\": \"function\" with a 'function'",
        ),
        (
            CHAT,
            {**CHAT_OK, "tools": [{"type": "function", "function": {"name": ""}}]},
            "tools[0]",
            "'tools[0].function.name' must be a non-empty string",
        ),
        (
            CHAT,
            {
                **CHAT_OK,
                "tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}],
            },
            "tools[0].function.parameters",
            "'tools[0].function.parameters' must be a JSON Schema object, not a string",
        ),
        (
            CHAT,
            {**CHAT_OK, "tool_choice": {"type": "function"}},
            "tool_choice",
            "'tool_choice' must be",
        ),
        (
            CHAT,
            {**CHAT_OK, "response_format": {"type": "xml"}},
            "response_format",
            "'response_format' must be an object whose \"type\"",
        ),
        (CHAT, {**CHAT_OK, "response_format": {}}, "response_format", "'response_format' must be"),
        (
            CHAT,
            {**CHAT_OK, "stream_options": {"include_usage": "yes"}},
            "stream_options",
            "'stream_options' must be an object whose \"include_usage\"",
        ),
        (
            CHAT,
            {**CHAT_OK, "top_logprobs": 21},
            "top_logprobs",
            "'top_logprobs' must be a whole number from 0 to 20, not 21",
        ),
        (
            CHAT,
            {**CHAT_OK, "stop": 5},
            "stop",
            "'stop' must be a string or a list of at most 4 strings, not 5",
        ),
        (CHAT, {**CHAT_OK, "stop": ["a"] * 5}, "stop", "'stop' must be a string or a list"),
        (CHAT, {**CHAT_OK, "top_p": 1.5}, "top_p", "'top_p' must be a number from 0 to 1, not 1.5"),
        (
            CHAT,
            {**CHAT_OK, "tool_choice": "always"},
            "tool_choice",
            "'tool_choice' must be \"none\"",
        ),
        (
            CHAT,
            {"model": "a", "messages": [{"role": "user"}]},
            "messages[0].content",
            "'messages[0].content' is required (only an assistant's message with 'tool_calls'",
        ),
        (
            EMBEDDINGS,
            {"model": "a", "input": "x", "encoding_format": "hex"},
            "encoding_format",
            '\'encoding_format\' must be "float" or "base64", not a string',
        ),
        (
            EMBEDDINGS,
            {"model": "a", "input": "x", "dimensions": -3},
            "dimensions",
            "'dimensions' must be a whole number of at least 1, not -3",
        ),
    ],
)
def test_fields_are_checked_by_type_naming_the_param(
    route: str, payload: dict[str, object], param: str, message: str
) -> None:
    with pytest.raises(RequestBodyError) as refused:
        check_body(route, payload)
    assert refused.value.param == param
    assert refused.value.message.startswith(message)


@pytest.mark.parametrize(
    ("route", "payload"),
    [
        (CHAT, CHAT_OK),
        (CHAT, {**CHAT_OK, "n": 1, "stream": False, "anything": {"else": [1]}}),
        (
            CHAT,
            {"model": "a", "messages": [{"role": "assistant", "content": None, "tool_calls": []}]},
        ),
        (
            CHAT,
            {
                "model": "a",
                "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}],
            },
        ),
        (COMPLETIONS, {"model": "a", "prompt": "x"}),
        (COMPLETIONS, {"model": "a", "prompt": ["x", "y"]}),
        (COMPLETIONS, {"model": "a", "prompt": [1, 2, 3]}),
        (EMBEDDINGS, {"model": "a", "input": [[1, 2], [3]]}),
        (EMBEDDINGS, {"model": "a", "input": "text", "n": 2}),  # embeddings have no n
        (CHAT, {**CHAT_OK, "n": 1.0}),  # one choice, however the number is spelled
        (
            CHAT,
            {
                **CHAT_OK,
                "temperature": 0,
                "top_p": 1,
                "max_tokens": -1,  # llama.cpp's "no limit"
                "stop": ["\n", "###"],
                "seed": 7,
                "top_k": "the engine's own",  # an extension: the engine judges it
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
                "tool_choice": {"type": "function", "function": {"name": "f"}},
                "response_format": {"type": "json_object"},
            },
        ),
        (EMBEDDINGS, {"model": "a", "input": "x", "encoding_format": "base64", "dimensions": 8}),
    ],
)
def test_bodies_a_client_may_send_pass(route: str, payload: dict[str, object]) -> None:
    check_body(route, payload)


def test_a_lone_surrogate_in_a_key_names_the_object_holding_it() -> None:
    body = b'{"model": "a", "messages": [{"role": "user", "content": "x", "\\ud800": 1}]}'
    with pytest.raises(RequestBodyError) as refused:
        decode_body(body)
    assert refused.value.param == "messages[0]"
    assert refused.value.message == (
        "messages[0] holds a lone UTF-16 surrogate (\\ud800-\\udfff), in a value or a key: "
        "send valid Unicode"
    )


def test_an_integer_past_64_bits_is_valid_json_and_passes_to_the_engine() -> None:
    """Found by a breaking helper: ``"seed": 9...9`` was refused as "not JSON"."""
    huge = "9" * 30
    assert decode_body(f'{{"model": "a", "seed": {huge}}}'.encode())["seed"] == int(huge)
    with pytest.raises(RequestBodyError) as refused:  # past what Python reads: said so
        decode_body(f'{{"model": "a", "seed": {"9" * 5000}}}'.encode())
    assert refused.value.message == "a number in the body has over 4300 digits"


def test_a_deeply_nested_body_is_walked_without_recursion() -> None:
    deep = "[" * 5000 + "NaN" + "]" * 5000
    with pytest.raises(RequestBodyError) as refused:
        decode_body(f'{{"model": "a", "x": {deep}}}'.encode())
    assert refused.value.message.startswith("the request body is not JSON")
