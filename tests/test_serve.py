"""The HTTP face over a runtime of real ``llama-server`` engines, through real HTTP."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

import hostler
from _rigs import LlamaRig, room_for
from hostler import EventStore
from hostler.events.daemon import DaemonStopped
from hostler.serve.app import MAX_BODY, make_app
from hostler.serve.server import HttpServer, is_loopback, load_token

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

GIB = 2**30
TOKEN = "t" * 43
MODELS = {"alpha": "llamacpp:alpha", "beta": "llamacpp:beta"}


class Face(LlamaRig):
    """A runtime of two tiny models, served on a loopback port."""

    def __init__(self, tmp_path: Path, store: EventStore) -> None:
        super().__init__(tmp_path, store, MODELS)


@pytest.fixture
def face(tmp_path: Path) -> Iterator[Face]:
    with EventStore.open(tmp_path / "events.db") as store:
        yield Face(tmp_path, store)


@pytest.fixture
async def served(face: Face) -> AsyncIterator[tuple[hostler.Runtime, httpx.AsyncClient]]:
    runtime = hostler.Runtime(face.store, face.build, ledger=face.ledger)
    async with runtime, anyio.create_task_group() as tg:
        server = HttpServer(make_app(runtime, MODELS, token=TOKEN), "127.0.0.1", 0)
        tg.start_soon(server.serve)
        await server.started.wait()
        base = f"http://127.0.0.1:{server.port}"
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            yield runtime, client
        server.stop()


def chat(model: str, *, stream: bool = False, n: int = 4) -> dict[str, object]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": n,
        "temperature": 0,
        "stream": stream,
    }


async def test_models_and_a_completion_through_the_proxy(
    served: tuple[hostler.Runtime, httpx.AsyncClient],
) -> None:
    runtime, client = served
    listed = (await client.get("/v1/models")).json()
    assert [m["id"] for m in listed["data"]] == ["alpha", "beta"]
    assert not any(m["resident"] for m in listed["data"])  # nothing loaded by listing
    answer = await client.post("/v1/chat/completions", json=chat("alpha"))
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["finish_reason"] in {"length", "stop"}
    assert runtime.pool.resident("llamacpp:alpha:0")


async def test_streaming_passes_chunks_through_to_done(
    served: tuple[hostler.Runtime, httpx.AsyncClient],
) -> None:
    _runtime, client = served
    lines = []
    async with client.stream(
        "POST", "/v1/chat/completions", json=chat("beta", stream=True, n=16)
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        async for line in r.aiter_lines():
            if line:
                lines.append(line)
    assert lines[-1] == "data: [DONE]" and len(lines) > 3


async def test_a_budget_for_one_swaps_on_demand(
    face: Face, served: tuple[hostler.Runtime, httpx.AsyncClient]
) -> None:
    runtime, client = served
    assert (await client.post("/v1/chat/completions", json=chat("alpha"))).status_code == 200
    one = (await runtime.memory.budget())["committed"]
    face.budget_gib = room_for(1, face.price("llamacpp:beta:0"), one) / GIB
    for model in ("beta", "alpha", "beta"):
        answer = await client.post("/v1/chat/completions", json=chat(model))
        assert answer.status_code == 200, answer.text
        resident = [v.key for v in runtime.status().engines if v.state == "running"]
        assert resident == [f"llamacpp:{model}:0"]
    stops = [
        r.payload["reason"] for r in face.store.read_all() if r.type == "engine.stop_requested"
    ]
    assert stops.count("evicted") == 3


async def test_a_client_that_disconnects_mid_stream_frees_its_slot(
    served: tuple[hostler.Runtime, httpx.AsyncClient],
) -> None:
    runtime, client = served
    async with client.stream(
        "POST", "/v1/chat/completions", json=chat("alpha", stream=True, n=400)
    ) as r:
        async for line in r.aiter_lines():
            if line.startswith("data:"):
                break  # one chunk, then hang up
    with anyio.fail_after(10):
        while any(s.running for s in runtime.queues().values()):
            await anyio.sleep(0.05)
    # the engine has one slot: a request that still held it would block this one
    with anyio.fail_after(30):
        answer = await client.post("/v1/chat/completions", json=chat("alpha"))
    assert answer.status_code == 200


async def test_errors_come_back_in_openai_shape(
    served: tuple[hostler.Runtime, httpx.AsyncClient],
) -> None:
    _runtime, client = served
    missing = await client.post("/v1/chat/completions", json=chat("gamma"))
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"
    assert "alpha, beta" in missing.json()["error"]["message"]
    bad = await client.post("/v1/chat/completions", content=b"{not json")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid-request"
    listy = await client.post("/v1/chat/completions", content=b"[1, 2]")
    assert listy.status_code == 400
    huge = await client.post("/v1/chat/completions", content=b" " * (MAX_BODY + 1))
    assert huge.status_code == 400 and "over 16 MiB" in huge.json()["error"]["message"]
    # found by a breaking helper: a lone surrogate as the session was a 500 "internal"
    # (its file name could not be encoded), after the engine was loaded
    lone = b'{"model": "alpha", "messages": [{"role": "user", "content": "hi"}], "user": "\\ud800"}'
    surrogate = await client.post("/v1/chat/completions", content=lone)
    assert surrogate.status_code == 400, surrogate.text
    assert surrogate.json()["error"]["message"] == (
        "user holds a lone UTF-16 surrogate (\\ud800-\\udfff), in a value or a key: "
        "send valid Unicode"
    )
    assert surrogate.json()["error"]["param"] == "user"


async def test_state_changing_routes_need_the_token(
    served: tuple[hostler.Runtime, httpx.AsyncClient],
) -> None:
    runtime, client = served
    await client.post("/v1/chat/completions", json=chat("alpha"))
    denied = await client.post("/api/engines/llamacpp:alpha:0/unload")
    assert denied.status_code == 401 and denied.json()["error"]["code"] == "unauthorized"
    wrong = await client.post(
        "/api/engines/llamacpp:alpha:0/unload", headers={"authorization": "Bearer nope"}
    )
    assert wrong.status_code == 401
    for spelled in (f"bearer {TOKEN}x", f"Basic {TOKEN}", f"Bearer{TOKEN}", TOKEN):
        near = await client.post(
            "/api/engines/llamacpp:alpha:0/unload", headers={"authorization": spelled}
        )
        assert near.status_code == 401, spelled
    assert runtime.pool.resident("llamacpp:alpha:0")
    # the scheme is case-insensitive (RFC 9110 11.1): issue 22 found "bearer" refused
    done = await client.post(
        "/api/engines/llamacpp:alpha:0/unload", headers={"authorization": f"bearer  {TOKEN}"}
    )
    assert done.status_code == 200 and done.json() == {"key": "llamacpp:alpha:0", "unloaded": True}
    engines = (await client.get("/api/engines")).json()
    assert [e["key"] for e in engines["engines"]] == ["llamacpp:alpha:0"]
    assert engines["engines"][0]["state"] == "stopped"


def test_the_token_is_made_once_private_and_checked(tmp_path: Path) -> None:
    first = load_token(tmp_path)
    assert len(first) >= 32 and load_token(tmp_path) == first
    assert (tmp_path / "token").stat().st_mode & 0o777 == 0o600
    (tmp_path / "token").write_text("short")
    with pytest.raises(hostler.UsageError, match="not a hostler token"):
        load_token(tmp_path)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5")  # noqa: S104
    assert not is_loopback("example.com")


def test_the_error_bodies_parse_as_json() -> None:
    from hostler.serve.errors import error_response

    response = error_response(503, "server_error", "engine-busy", "busy", retry_after=30)
    assert response.headers["retry-after"] == "30"
    assert json.loads(bytes(response.body))["error"] == {
        "message": "busy",
        "type": "server_error",
        "code": "engine-busy",
        "param": None,
    }


AUTH = {"authorization": f"Bearer {TOKEN}"}


async def test_operator_routes_answer_and_check_their_input(
    served: tuple[hostler.Runtime, httpx.AsyncClient],
) -> None:
    runtime, client = served
    assert (await client.post("/v1/chat/completions", json=chat("alpha"))).status_code == 200
    key = "llamacpp:alpha:0"
    # the budget, live
    budget = (await client.get("/api/budget")).json()
    assert budget["committed"] > 0
    assert (await client.put("/api/budget", json={"bytes": 8 * GIB})).status_code == 401
    changed = await client.put(
        "/api/budget", json={"bytes": 8 * GIB, "spillover": True}, headers=AUTH
    )
    assert changed.status_code == 200 and changed.json()["budget"] == 8 * GIB
    for bad in ({"bytes": -1}, {"bytes": "8G"}, {"spillover": "yes"}, {}, {"budget": 1}):
        answer = await client.put("/api/budget", json=bad, headers=AUTH)
        assert answer.status_code == 400, bad
        assert answer.json()["error"]["code"] == "invalid-request"
    # CB1: a budget under 1 GiB would not be enforced: refused, naming the floor
    small = await client.put("/api/budget", json={"bytes": 100 * 2**20}, headers=AUTH)
    assert small.status_code == 400
    assert small.json()["error"]["message"].startswith(
        "104857600 bytes is under 1 GiB (1073741824 bytes), the smallest budget hostler enforces"
    )
    assert (await client.get("/api/budget")).json()["budget"] == 8 * GIB  # unchanged
    # queues: cancel and move by id (QA3, QA4)
    assert (await client.delete(f"/api/queues/{key}/7", headers=AUTH)).json() == {
        "cancelled": False
    }
    assert (await client.delete(f"/api/queues/{key}/x7", headers=AUTH)).status_code == 400
    moved = await client.post(f"/api/queues/{key}/7/move", json={"direction": "up"}, headers=AUTH)
    assert moved.json() == {"moved": False}
    sideways = await client.post(
        f"/api/queues/{key}/7/move", json={"direction": "sideways"}, headers=AUTH
    )
    assert sideways.status_code == 400
    assert key in (await client.get("/api/queues")).json()
    # the cache
    stats = (await client.get(f"/api/cache/{key}")).json()
    assert stats["key"] == key and stats["budget"] == 4 * GIB
    put = await client.put(f"/api/cache/{key}/budget", json={"bytes": 2**20}, headers=AUTH)
    assert put.json() == {"bytes": 2**20}
    assert (
        await client.put(f"/api/cache/{key}/budget", json={"bytes": True}, headers=AUTH)
    ).status_code == 400
    assert (await client.post(f"/api/cache/{key}/clear", headers=AUTH)).json() == {"cleared": True}
    assert (await client.delete("/api/sessions/s1/cache", headers=AUTH)).json() == {"evicted": True}
    # leases: acquire, list, release
    lease = (
        await client.post("/api/leases", json={"slot": "image", "holder": "render"}, headers=AUTH)
    ).json()
    assert lease["slot"] == "image"
    assert (
        await client.post("/api/leases", json={"slot": "gpu", "holder": "x"}, headers=AUTH)
    ).status_code == 400
    assert (await client.delete(f"/api/leases/{lease['id']}", headers=AUTH)).json() == {
        "released": True
    }
    assert (await client.delete(f"/api/leases/{lease['id']}", headers=AUTH)).json() == {
        "released": False
    }
    # reconcile, with its input checked
    refused = await client.post("/api/reconcile", json={"targets": {"alpha": 1}}, headers=AUTH)
    assert refused.status_code == 400 and "engine:model" in refused.json()["error"]["message"]
    report = await client.post(
        "/api/reconcile", json={"targets": {"llamacpp:beta": 1}}, headers=AUTH
    )
    assert report.json()["started"] == ["llamacpp:beta:0"]
    assert runtime.pool.resident("llamacpp:beta:0")
    assert (await client.get("/api/device")).json() is None  # no gate in this runtime
    assert (await client.get("/api/preview/llamacpp:alpha:0")).status_code == 400  # no pricer


async def test_metrics_and_the_event_tail_come_from_the_same_log(
    face: Face, served: tuple[hostler.Runtime, httpx.AsyncClient]
) -> None:
    runtime, client = served
    assert (await client.post("/v1/chat/completions", json=chat("alpha"))).status_code == 200
    measured = (await runtime.report.engine_details())["llamacpp:alpha:0"]["measured_bytes"]
    assert isinstance(measured, int) and measured > 0
    text = (await client.get("/metrics")).text
    sample = next(
        line for line in text.splitlines() if line.startswith("hostler_engine_measured_bytes{")
    )
    assert sample.startswith('hostler_engine_measured_bytes{engine="llamacpp:alpha:0"} ')
    assert float(sample.split()[-1]) == measured
    assert "hostler_lease_wait_seconds_total" in text
    assert await runtime.unload("llamacpp:alpha:0")
    with anyio.fail_after(5):  # queue events reach the log within half a second
        while "hostler_queue_dispatched_total 1.0" not in (
            text := (await client.get("/metrics")).text
        ):
            await anyio.sleep(0.1)
    assert 'hostler_engine_stops_total{reason="evicted"} 1.0' in text
    assert 'hostler_engine_starts_total{cause="session"}' not in text  # a one-shot, not a session
    assert 'hostler_engine_up{engine="llamacpp:alpha:0",state="stopped"} 0.0' in text
    assert "hostler_queue_dispatched_total 1.0" in text
    assert 'hostler_queue_width{engine="llamacpp:alpha:0"} 2.0' in text  # one slot + 1 lane
    # the live tail, resumable from a seq
    last = face.store.last_seq()
    seen: list[tuple[int, str]] = []
    async with client.stream("GET", "/api/events", headers={"last-event-id": str(last - 3)}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        event_id = ""
        async for line in r.aiter_lines():
            if line.startswith("id: "):
                event_id = line[4:]
            elif line.startswith("event: "):
                seen.append((int(event_id), line[7:]))
            if len(seen) == 3:
                break
    assert [seq for seq, _ in seen] == [last - 2, last - 1, last]
    assert (await client.get("/api/events?after=x")).status_code == 400


def test_lease_waits_are_summed_from_requested_to_granted(tmp_path: Path) -> None:
    from hostler import Lease, commit
    from hostler.serve.metrics import Metrics

    with EventStore.open(tmp_path / "leases.db") as store:
        first, second, waiting = Lease("l1"), Lease("l2"), Lease("l3")
        first.fire("request", at=10.0, slot="llm", holder="a")
        first.fire("grant", at=12.5, expires_at=100.0)
        second.fire("request", at=20.0, slot="image", holder="b")
        second.fire("grant", at=20.0, expires_at=100.0)  # granted at once: 0 s
        waiting.fire("request", at=30.0, slot="llm", holder="c")  # not granted yet: no wait
        for lease in (first, second, waiting):
            commit(store, lease)
        metrics = Metrics(runtime=None, store=store)  # type: ignore[arg-type]
        metrics._fold()
        assert (metrics._leases, metrics._lease_wait) == (2, 2.5)


def test_a_log_that_cannot_record_is_a_503_to_retry_never_a_bug() -> None:
    from hostler.errors import StoreError, StoreFullError
    from hostler.serve.errors import http_error_for

    for error in (StoreError("'start' not done: the disk is full"), StoreFullError("full")):
        answer = http_error_for(error)
        assert (answer.status, answer.code, answer.retry_after) == (503, "store-unavailable", 10)


def test_a_log_corrupted_while_serving_is_a_503_never_an_internal_500() -> None:
    """Issue 22: every start after the log was damaged answered 500 ``internal``."""
    from hostler.errors import StoreCorruptError, StoreDamagedRowError, StoreLockedError
    from hostler.serve.errors import http_error_for

    for error in (StoreCorruptError("malformed"), StoreDamagedRowError("row 7")):
        answer = http_error_for(error)
        # waiting does not mend it: no Retry-After; the message names the log and the fix
        assert (answer.status, answer.code, answer.retry_after) == (503, "store-unavailable", None)
    answer = http_error_for(StoreLockedError("owned by another daemon"))
    assert (answer.status, answer.code, answer.retry_after) == (503, "store-unavailable", 1)


def _events_scope(after: int) -> dict[str, Any]:
    """An ASGI scope of ``GET /api/events?after=AFTER`` from loopback."""
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/api/events",
        "raw_path": b"/api/events",
        "query_string": f"after={after}".encode(),
        "headers": [(b"host", b"127.0.0.1")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }


async def test_the_event_stream_sends_each_page_of_the_log_as_one_write(face: Face) -> None:
    """Issue 21: after ``hostler events --limit 1`` left, asyncio logged ``socket.send() raised
    exception.`` 204 times: the tail wrote event by event, with no pause in between for the
    server to see the closed connection. A page now goes out as one write.
    """
    after = face.store.last_seq()
    face.store.append(
        "test/stream", [DaemonStopped(at=float(n), pid=n) for n in range(40)], expected_version=None
    )
    runtime = hostler.Runtime(face.store, face.build, ledger=face.ledger)
    bodies: list[bytes] = []
    gone = anyio.Event()

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.body":
            bodies.append(message["body"])
            if len(bodies) == 2:
                gone.set()

    async def receive() -> dict[str, Any]:
        await gone.wait()  # the client leaves once the first page came
        return {"type": "http.disconnect"}

    scope = _events_scope(after)
    async with runtime:
        with anyio.fail_after(30):
            await make_app(runtime, MODELS, token=TOKEN)(scope, receive, send)
    assert bodies[0] == b": hostler event stream\n\n"
    page = bodies[1].decode()
    assert page.count("event: daemon.stopped\n") == 40
    assert page.startswith(f"id: {after + 1}\nevent: daemon.stopped\ndata: ")
    assert len(bodies) == 2 or bodies[2:] == [b""]  # the stream ended with its client


async def test_the_event_stream_ends_when_the_daemon_stops_taking_work(face: Face) -> None:
    """Issue 22: ``hostler serve`` took 5.6 s to exit after SIGTERM with one ``GET /api/events``
    client open (the server's 5 s grace for a stream that never ended). The tail ends once the
    runtime stops taking work, after what it had to send."""
    runtime = hostler.Runtime(face.store, face.build, ledger=face.ledger)
    bodies: list[bytes] = []
    ended = anyio.Event()

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.body":
            bodies.append(message["body"])
            if not message.get("more_body", False):
                ended.set()

    async def receive() -> dict[str, Any]:
        await anyio.sleep_forever()  # the client stays
        raise AssertionError

    scope = _events_scope(face.store.last_seq())
    async with runtime, anyio.create_task_group() as tasks:
        tasks.start_soon(make_app(runtime, MODELS, token=TOKEN), scope, receive, send)
        await anyio.wait_all_tasks_blocked()
        assert not ended.is_set()
        runtime.stop_taking_work()
        with anyio.fail_after(10):  # a few tail polls, not the server's grace
            await ended.wait()
        tasks.cancel_scope.cancel()
    assert bodies[0] == b": hostler event stream\n\n"
