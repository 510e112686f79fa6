"""RD10: an adapter's ``request_model`` is what ``hostler serve`` forwards as the body's ``model``.

A real ``hostler serve`` app (real HTTP on loopback) over a real runtime whose engine is the
fake engine (a real process that answers with the ``model`` it was sent): with the adapter's
``request_model`` set, the engine receives that name whatever the client named; without it,
the body goes through unchanged. The declaration itself is checked when the class is made.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar

import anyio
import httpx
import pytest

from hostler import EventStore
from hostler.plugin import EngineAdapter
from hostler.serve.app import make_app
from hostler.serve.server import HttpServer
from hostler.testing.fake_engine import FakeEngineAdapter
from hostler.testing.harness import Harness

pytestmark = pytest.mark.anyio


class Pinned(FakeEngineAdapter):
    """An engine that serves one model and reads ``model`` as something to load."""

    request_model: ClassVar[str | None] = "default_model"


@pytest.fixture(params=[FakeEngineAdapter, Pinned], ids=["unchanged", "pinned"])
async def served(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[str, str | None]]:
    adapter: FakeEngineAdapter = request.param()
    with EventStore.open(tmp_path / "events.db") as store:
        harness = Harness(tmp_path / "data", store, {"fake": adapter})
        async with harness.runtime() as runtime, anyio.create_task_group() as tg:
            server = HttpServer(make_app(runtime, {"alpha": "fake:alpha"}), "127.0.0.1", 0)
            tg.start_soon(server.serve)
            await server.started.wait()
            yield f"http://127.0.0.1:{server.port}", adapter.request_model
            server.stop()


async def test_the_engine_gets_the_adapters_model_name_or_the_clients(
    served: tuple[str, str | None],
) -> None:
    base, pinned = served
    body = {"model": "alpha", "messages": [{"role": "user", "content": "héllo ✓"}], "max_tokens": 2}
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        answer = await client.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["fake_engine"]["model"] == (pinned or "alpha")  # what the engine got
    assert answer.json()["model"] == "alpha"  # what the client asked for, either way


async def test_a_streamed_request_carries_the_adapters_model_name_too(
    served: tuple[str, str | None],
) -> None:
    base, pinned = served
    body = {"model": "alpha", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with (
        httpx.AsyncClient(base_url=base, timeout=60) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as answer,
    ):
        assert answer.status_code == 200
        chunks = [
            json.loads(line[len("data: ") :])
            async for line in answer.aiter_lines()
            if line.startswith("data: {")
        ]
    assert chunks
    assert {chunk["fake_engine"]["model"] for chunk in chunks} == {pinned or "alpha"}
    assert {chunk["model"] for chunk in chunks} == {"alpha"}


@pytest.mark.parametrize("bad", ["", "x" * 201, "two\nlines", 5, b"bytes"])
def test_a_request_model_that_is_not_a_printable_name_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="request_model must be None or a printable name"):
        type("Bad", (EngineAdapter,), {"request_model": bad})


@pytest.mark.parametrize("good", [None, "x", "x" * 200, "default_model"])
def test_a_request_model_may_be_any_short_name(good: str | None) -> None:
    made: type[EngineAdapter] = type("Good", (EngineAdapter,), {"request_model": good})
    assert made.request_model == good
