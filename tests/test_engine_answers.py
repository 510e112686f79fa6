"""An engine's answer as the client reads it (``hostler.serve.answers``): its ``model``, its errors."""

from __future__ import annotations

import json

import msgspec
import pytest

from hostler.serve.answers import SseRenamer, engine_error, renamed

PATH = "/models/SmolLM2-135M-Instruct.Q4_1.gguf"


def event(index: int) -> bytes:
    chunk = {"choices": [{"delta": {"content": f"t{index}"}}], "model": PATH, "x": 1.25}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def test_a_whole_answer_names_the_model_the_client_asked_for() -> None:
    body = json.dumps({"id": "a", "model": PATH, "usage": {"total_tokens": 3}}).encode()
    assert msgspec.json.decode(renamed(body, "smollm2")) == {
        "id": "a",
        "model": "smollm2",
        "usage": {"total_tokens": 3},
    }


@pytest.mark.parametrize("body", [b"not json", b"[1]", b'{"no": "model"}', b""])
def test_an_answer_that_is_not_an_object_with_a_model_passes_as_it_is(body: bytes) -> None:
    assert renamed(body, "smollm2") is body


@pytest.mark.parametrize("size", [1, 3, 7, 64, 10_000])
def test_each_streamed_event_is_renamed_however_the_stream_is_cut(size: int) -> None:
    stream = b"".join(event(i) for i in range(5)) + b": comment\n\ndata: [DONE]\n\n"
    renamer = SseRenamer("smollm2")
    out = b"".join(renamer.feed(stream[i : i + size]) for i in range(0, len(stream), size))
    out += renamer.flush()
    lines = out.decode().split("\n")
    data = [line for line in lines if line.startswith("data: {")]
    assert len(data) == 5
    assert [json.loads(line[6:])["model"] for line in data] == ["smollm2"] * 5
    assert [json.loads(line[6:])["choices"][0]["delta"]["content"] for line in data] == [
        f"t{i}" for i in range(5)
    ]
    assert out.endswith(b": comment\n\ndata: [DONE]\n\n")
    assert out.count(b"\n\n") == stream.count(b"\n\n")  # the framing is kept


def test_a_line_is_sent_as_soon_as_it_is_whole() -> None:
    renamer = SseRenamer("m")
    first = event(0)
    assert renamer.feed(first[:10]) == b""
    assert renamer.feed(first[10:-1]).startswith(b"data: {")  # the first newline ends the line
    assert renamer.feed(first[-1:]) == b"\n"


def test_a_last_line_without_its_newline_is_flushed_renamed() -> None:
    renamer = SseRenamer("m")
    assert renamer.feed(event(0).rstrip(b"\n")) == b""
    assert json.loads(renamer.flush()[6:])["model"] == "m"


@pytest.mark.parametrize(
    ("status", "body", "answered", "code", "message"),
    [
        (
            400,
            b'{"error":{"code":400,"message":"bad thing","type":"invalid_request_error"}}',
            400,
            "engine-rejected",
            "the engine for 'smollm2' refused the request (400): bad thing",
        ),
        (
            500,
            b'{"error":{"code":500,"message":"[json.exception.parse_error.101] x\\ny"}}',
            502,
            "engine-error",
            "the engine for 'smollm2' failed the request (500): [json.exception.parse_error.101] x y",
        ),
        (503, b"Service Unavailable", 502, "engine-error", "(503): Service Unavailable"),
        (422, b'{"detail": "nope"}', 422, "engine-rejected", "(422): nope"),
        (404, b"", 404, "engine-rejected", "(404): no message"),
    ],
)
def test_an_engine_error_is_told_in_openai_shape_with_a_hostler_code(
    status: int, body: bytes, answered: int, code: str, message: str
) -> None:
    got_status, shaped = engine_error(status, body, "smollm2")
    assert got_status == answered
    assert set(shaped["error"]) == {"message", "type", "code", "param"}
    assert shaped["error"]["code"] == code
    assert shaped["error"]["param"] is None
    assert message in shaped["error"]["message"]
    assert shaped["error"]["type"] == (
        "server_error" if answered == 502 else "invalid_request_error"
    )


def test_a_long_engine_message_is_cut_to_one_line() -> None:
    _, shaped = engine_error(500, b"x" * 5000, "m")
    assert len(shaped["error"]["message"]) < 400
    assert shaped["error"]["message"].endswith("...")
