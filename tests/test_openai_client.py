"""The real ``hostler serve`` (a child process) with real ``llama-server`` engines, as users meet it.

The official ``openai`` client, streaming and not, and plain ``curl``; ``hostler tour``, the
README's first command, end to end (two real models under a budget for one, swapping).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from hostler.testing.tiny_gguf import write_tiny_llama

from _support import untermed

pytestmark = pytest.mark.slow

HOSTLER = [sys.executable, "-c", "import sys; from hostler.cli import main; sys.exit(main())"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    for name in ("alpha", "beta"):
        write_tiny_llama(tmp_path / f"{name}.gguf")
    config = tmp_path / "hostler.toml"
    config.write_text(
        f'[daemon]\nledger = "ledger.db"\ndata_dir = "{tmp_path / "data"}"\n'
        '\n[[models]]\nid = "alpha"\npath = "alpha.gguf"\nctx = 512\n'
        '\n[[models]]\nid = "beta"\npath = "beta.gguf"\nctx = 512\n'
    )
    port = free_port()
    log = (tmp_path / "serve.log").open("wb")
    env = {**os.environ, "HOSTLER_HOME": str(tmp_path / "home")}
    daemon = subprocess.Popen(
        [*HOSTLER, "serve", "--config", str(config), "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert daemon.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                if httpx.get(f"{base}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "hostler serve did not listen in 60 s"
            time.sleep(0.1)
        yield base, tmp_path
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=30) == 0
        log.close()


def test_the_official_openai_client_streaming_and_not(served: tuple[str, Path]) -> None:
    base, _ = served
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="not-needed-on-loopback")
    assert sorted(m.id for m in client.models.list()) == ["alpha", "beta"]
    answer = client.chat.completions.create(
        model="alpha", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
    )
    assert answer.choices[0].finish_reason in {"length", "stop"}
    assert answer.usage is not None and answer.usage.completion_tokens >= 1
    pieces = [
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(
            model="beta",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=6,
            temperature=0,
            stream=True,
        )
        if chunk.choices
    ]
    assert len(pieces) >= 2 and "".join(pieces)  # chunk by chunk, not one buffered answer
    text = client.completions.create(model="alpha", prompt="once upon", max_tokens=3)
    assert text.choices[0].text
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gamma", messages=[{"role": "user", "content": "x"}])
    assert missing.value.code == "model_not_found"
    assert "alpha, beta" in str(missing.value)


def test_plain_curl(served: tuple[str, Path]) -> None:
    base, folder = served
    curl = shutil.which("curl")
    assert curl is not None, "curl is part of the check: install it (apt-get install curl)"
    body = json.dumps(
        {"model": "beta", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
         "stream": True}
    )  # fmt: skip
    done = subprocess.run(
        [curl, "-sS", "-N", f"{base}/v1/chat/completions", "-H", "content-type: application/json",
         "-d", body],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    events = [line for line in done.stdout.splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) >= 3
    token = (folder / "data" / "token").read_text().strip()
    refused = subprocess.run(
        [curl, "-sS", "-X", "POST", f"{base}/api/models/alpha/load", "-w", "%{http_code}"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert refused.stdout.endswith("401")
    loaded = subprocess.run(
        [curl, "-sS", "-X", "POST", f"{base}/api/models/alpha/load",
         "-H", f"Authorization: Bearer {token}"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert json.loads(loaded.stdout) == {
        "model": "alpha",
        "key": "llamacpp:alpha:0",
        "loaded": True,
    }


def test_the_tour_swaps_two_real_models_and_explains_it(tmp_path: Path) -> None:
    env = {**untermed(os.environ), "HOSTLER_HOME": str(tmp_path / "home")}  # tables whole
    done = subprocess.run(
        [*HOSTLER, "tour", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600, env=env, check=False,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "'smollm2' answered" in out and "Paris" in out  # a real model, answering sensibly
    assert "resident: ['llamacpp:smollm2-f32:0']" in out  # the swap: smollm2 unloaded for it
    assert out.count("resident: ['llamacpp:smollm2:0']") == 2  # and back
    assert out.count("pool.room_planned") == 2
    assert out.count("reason=evicted") == 2
    assert "exited with status 0" in out
    # the folder the tour says holds its models does: DATA_DIR/cache, not the tour's folder
    folder = Path(re.search(r"1\. models \(in (.+)\):", out)[1])  # type: ignore[index]
    assert folder == tmp_path / "cache"
    assert sorted(p.name for p in folder.glob("*.gguf")) == sorted(
        re.findall(r"= (\S+\.gguf) \(", out)
    )


def spawned_engines(base: str) -> list[str]:
    listed = httpx.get(f"{base}/api/engines").json()["engines"]
    return [e["key"] for e in listed if e["state"] not in {"stopped", "idle", "declared"}]


BAD_BODIES = [
    # (route, raw body, param, the message's start)
    (
        "/v1/chat/completions",
        b'{"model": "alpha", "messages": [{"role": "user", "content": "hi"}], "tools": "x"}',
        "tools",
        "'tools' must be a list of tools, not a string",
    ),
    (
        "/v1/chat/completions",
        b'{"model": "alpha", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}',
        "temperature",
        "'temperature' must be a number from 0 to 2, not a string",
    ),
    (
        "/v1/chat/completions",
        b'{"model": "alpha", "messages": [{"role": "user", "content": "\xff"}]}',
        None,
        "the request body is not valid UTF-8",
    ),
    (
        "/v1/chat/completions",
        json.dumps({"model": "alpha", "messages": [{"role": "user", "content": "hi"}]}).encode(
            "utf-16"
        ),
        None,
        "the request body is UTF-16 or UTF-32",
    ),
    (
        "/v1/chat/completions",
        b'{"model": "alpha", "messages": [{"role": "user", "content": "\\ud800"}]}',
        "messages[0].content",
        "messages[0].content holds a lone UTF-16 surrogate",
    ),
    (
        "/v1/chat/completions",
        b'{"model": "alpha", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
        "temperature",
        "temperature is not a finite number",
    ),
    (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "hi"}]}',
        "model",
        "'model' is required",
    ),
    (
        "/v1/chat/completions",
        b'{"model": 7, "messages": [{"role": "user", "content": "hi"}]}',
        "model",
        "'model' must be a model id",
    ),
    ("/v1/chat/completions", b'{"model": "alpha"}', "messages", "'messages' is required"),
    (
        "/v1/chat/completions",
        b'{"model": "alpha", "messages": "hi"}',
        "messages",
        "'messages' must be a non-empty list",
    ),
    (
        "/v1/chat/completions",
        b'{"model": "alpha", "messages": [{"role": "user", "content": "hi"}], "n": 2}',
        "n",
        "'n' is 2: hostler answers one choice",
    ),
    (
        "/v1/completions",
        b'{"model": "alpha", "prompt": {"a": 1}}',
        "prompt",
        "'prompt' must be a string",
    ),
    ("/v1/completions", b'{"model": "alpha"}', "prompt", "'prompt' is required"),
    ("/v1/embeddings", b'{"model": "alpha", "input": 5}', "input", "'input' must be a string"),
    ("/v1/embeddings", b'{"model": "alpha"}', "input", "'input' is required"),
]


def test_bad_bodies_are_openai_400s_naming_the_param_before_any_engine_loads(
    served: tuple[str, Path],
) -> None:
    base, _ = served
    for route, body, param, message in BAD_BODIES:
        answer = httpx.post(
            f"{base}{route}", content=body, headers={"content-type": "application/json"}
        )
        assert answer.status_code == 400, (route, body, answer.text)
        error = answer.json()["error"]
        assert error["param"] == param, (body, error)
        assert error["message"].startswith(message), (body, error)
        assert (error["type"], error["code"]) == ("invalid_request_error", "invalid-request")
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="alpha", messages=[{"role": "user", "content": "hi"}], n=2
        )
    assert refused.value.param == "n" and refused.value.code == "invalid-request"
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model="alpha", input=[])
    assert refused.value.param == "input"
    assert spawned_engines(base) == []  # no engine was loaded for any of them


def test_the_answer_names_the_model_asked_for_streamed_or_not(served: tuple[str, Path]) -> None:
    base, _ = served
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
    hi: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
    whole = client.chat.completions.create(model="alpha", messages=hi, max_tokens=3)
    assert whole.model == "alpha"
    chunks = list(
        client.chat.completions.create(model="alpha", messages=hi, max_tokens=3, stream=True)
    )
    assert len(chunks) >= 2 and {chunk.model for chunk in chunks} == {"alpha"}
    assert client.completions.create(model="alpha", prompt="once", max_tokens=2).model == "alpha"

    async def asynchronous() -> tuple[str, set[str]]:
        aclient = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="x")
        whole = await aclient.chat.completions.create(model="alpha", messages=hi, max_tokens=3)
        streamed = await aclient.chat.completions.create(
            model="alpha", messages=hi, max_tokens=3, stream=True
        )
        names = {chunk.model async for chunk in streamed}
        await aclient.close()
        return whole.model, names

    assert anyio.run(asynchronous) == ("alpha", {"alpha"})


def test_an_engine_error_reaches_the_client_in_openai_shape(served: tuple[str, Path]) -> None:
    base, _ = served
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
    ask = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with pytest.raises(openai.BadRequestError) as rejected:  # llama-server's own 400
        client.chat.completions.create(
            model="alpha",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2,
            extra_body={"grammar": "root ::= ("},  # its extension: hostler passes it unchecked
        )
    assert rejected.value.code == "engine-rejected"
    assert rejected.value.message.startswith(
        "Error code: 400 - the engine for 'alpha' refused the request (400): "
    )
    assert "failed to parse grammar" in rejected.value.message
    # llama-server answers a 500 for an image to a model without a projector (tools that are
    # not a list, its 500 before, are now refused by hostler before any engine loads)
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    failed = httpx.post(
        f"{base}/v1/chat/completions",
        json={**ask, "model": "alpha", "messages": [{"role": "user", "content": [image]}]},
        timeout=60,
    )
    assert failed.status_code == 502
    error = failed.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("server_error", "engine-error", None)
    assert error["message"].startswith("the engine for 'alpha' failed the request (500): ")


def test_embeddings_from_a_chat_model_on_the_same_engine(served: tuple[str, Path]) -> None:
    """L21: ``/v1/embeddings`` works for any llama.cpp model, chat models included, served by
    the engine that chats (one load, one reservation), as Ollama's does."""
    base, _ = served
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
    vectors = client.embeddings.create(model="alpha", input=["hello there", "general kenobi"])
    assert vectors.model == "alpha"
    assert [item.index for item in vectors.data] == [0, 1]
    sizes = {len(item.embedding) for item in vectors.data}
    assert len(sizes) == 1 and sizes.pop() >= 8
    assert vectors.data[0].embedding != vectors.data[1].embedding
    chat = client.chat.completions.create(
        model="alpha", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert chat.choices[0].message.content is not None
    assert spawned_engines(base) == ["llamacpp:alpha:0"]  # the same engine answered both
