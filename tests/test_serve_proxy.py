"""The proxy's client to its engines, and clients that leave at the worst moment.

The upstream clients are tried against a small real HTTP server on loopback that counts its
connections and can misbehave on request; the proxy against real ``llama-server`` engines.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import anyio
import anyio.abc
import httpx
import pytest

import hostler
from _rigs import LlamaRig
from hostler import EventStore
from hostler.serve.app import make_app
from hostler.serve.server import HttpServer
from hostler.serve.upstream import (
    MAX_HEAD,
    MAX_IDLE_PER_PORT,
    HttpxUpstream,
    PooledUpstream,
    Upstream,
    UpstreamError,
)

pytestmark = pytest.mark.anyio

Behaviour = Callable[[anyio.abc.SocketStream, bytes], Awaitable[bool]]


class Engine:
    """A loopback HTTP/1.1 server: one answer per request, keep-alive unless told otherwise."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests: list[bytes] = []
        self.port = 0
        self.behaviour: Behaviour = self.answer
        self.closed_after_answer = False

    async def answer(self, stream: anyio.abc.SocketStream, _request: bytes) -> bool:
        body = b'{"ok":true}'
        await stream.send(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        return not self.closed_after_answer

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        self.connections += 1
        async with stream:
            buffer = b""
            while True:
                try:
                    buffer += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return
                if b"\r\n\r\n" not in buffer:
                    continue
                head, _, rest = buffer.partition(b"\r\n\r\n")
                length = int(
                    next(
                        line.split(b":")[1]
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    )
                )
                while len(rest) < length:
                    rest += await stream.receive()
                self.requests.append(rest[:length])
                buffer = rest[length:]
                if not await self.behaviour(stream, rest[:length]):
                    return


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    fake = Engine()
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    fake.port = listener.extra(anyio.abc.SocketAttribute.local_port)  # noqa: S610
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, fake.handle)
        yield fake
        tg.cancel_scope.cancel()


@pytest.fixture(params=["pooled", "httpx"])
async def upstream(request: pytest.FixtureRequest) -> AsyncIterator[Upstream]:
    client: Upstream = PooledUpstream() if request.param == "pooled" else HttpxUpstream()
    yield client
    await client.aclose()


async def read(upstream: Upstream, port: int, body: bytes = b"{}") -> tuple[int, bytes]:
    answer = await upstream.send(port, "/v1/x", body, "application/json")
    try:
        return answer.status, b"".join([chunk async for chunk in answer.body()])
    finally:
        await answer.aclose()


def test_the_pool_limits_are_pinned() -> None:
    assert MAX_HEAD == 65536
    assert MAX_IDLE_PER_PORT == 64


async def test_answers_reuse_one_kept_connection(engine: Engine, upstream: Upstream) -> None:
    for n in range(5):
        assert await read(upstream, engine.port, f'{{"n":{n}}}'.encode()) == (200, b'{"ok":true}')
    assert engine.connections == 1
    assert engine.requests == [f'{{"n":{n}}}'.encode() for n in range(5)]


async def test_a_kept_connection_the_engine_closed_is_replaced(
    engine: Engine, upstream: Upstream
) -> None:
    engine.closed_after_answer = True  # answers, then hangs up while the proxy keeps it
    assert (await read(upstream, engine.port))[0] == 200
    await anyio.sleep(0.05)
    assert (await read(upstream, engine.port))[0] == 200
    assert engine.connections == 2


async def test_an_answer_left_half_read_is_never_reused(engine: Engine) -> None:
    async def slow_stream(stream: anyio.abc.SocketStream, _request: bytes) -> bool:
        await stream.send(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n5\r\ndata:\r\n"
        )
        await anyio.sleep(0.3)  # the rest would come later
        await stream.send(b"0\r\n\r\n")
        return True

    engine.behaviour = slow_stream
    pool = PooledUpstream()
    answer = await pool.send(engine.port, "/v1/x", b"{}", "application/json")
    first = await answer.body().__anext__()
    assert first == b"data:"
    await answer.aclose()  # the client left: the engine must see its connection close
    engine.behaviour = engine.answer
    assert (await read(pool, engine.port))[0] == 200
    assert engine.connections == 2
    await pool.aclose()


async def test_chunked_bodies_come_through_in_pieces_as_sent(engine: Engine) -> None:
    async def stream_three(stream: anyio.abc.SocketStream, _request: bytes) -> bool:
        await stream.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for part in (b"one", b"two", b"three"):
            await stream.send(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            await anyio.sleep(0.02)
        await stream.send(b"0\r\n\r\n")
        return True

    engine.behaviour = stream_three
    pool = PooledUpstream()
    answer = await pool.send(engine.port, "/v1/x", b"{}", "application/json")
    pieces = [chunk async for chunk in answer.body()]
    assert pieces == [b"one", b"two", b"three"]  # not buffered into one
    await answer.aclose()
    assert (await read(pool, engine.port))[0] == 200
    assert engine.connections == 1  # a whole chunked answer leaves the connection reusable
    await pool.aclose()


@pytest.mark.parametrize(
    "reply",
    [b"SSH-2.0-OpenSSH_9.2\r\n\r\n", b"HTTP/1.1 200 OK\r\nX: " + b"a" * (MAX_HEAD + 10)],
    ids=["not-http", "head-too-large"],
)
async def test_an_answer_that_is_not_http_is_an_upstream_error(
    engine: Engine, reply: bytes
) -> None:
    async def garbage(stream: anyio.abc.SocketStream, _request: bytes) -> bool:
        await stream.send(reply)
        return True

    engine.behaviour = garbage
    pool = PooledUpstream()
    with pytest.raises(UpstreamError):
        await pool.send(engine.port, "/v1/x", b"{}", "application/json")
    await pool.aclose()


async def test_an_engine_that_hangs_up_without_answering_is_an_upstream_error(
    engine: Engine, upstream: Upstream
) -> None:
    async def hang_up(_stream: anyio.abc.SocketStream, _request: bytes) -> bool:
        return False

    engine.behaviour = hang_up
    with pytest.raises(UpstreamError):
        await upstream.send(engine.port, "/v1/x", b"{}", "application/json")


async def test_nobody_listening_is_an_upstream_error(upstream: Upstream) -> None:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)  # noqa: S610
    await listener.aclose()  # the port is free again: nothing answers there
    with pytest.raises(UpstreamError):
        await upstream.send(port, "/v1/x", b"{}", "application/json")


# ---- the proxy, with real llama-server engines -------------------------------------------------

MODELS = {"alpha": "llamacpp:alpha"}


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[LlamaRig]:
    with EventStore.open(tmp_path / "events.db") as store:
        yield LlamaRig(tmp_path, store, MODELS)


@pytest.fixture
async def served(rig: LlamaRig) -> AsyncIterator[tuple[hostler.Runtime, str]]:
    runtime = hostler.Runtime(rig.store, rig.build, ledger=rig.ledger)
    async with runtime, anyio.create_task_group() as tg:
        server = HttpServer(make_app(runtime, MODELS), "127.0.0.1", 0)
        tg.start_soon(server.serve)
        await server.started.wait()
        yield runtime, f"http://127.0.0.1:{server.port}"
        server.stop()


def chat(*, stream: bool, n: int) -> dict[str, object]:
    return {
        "model": "alpha",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": n,
        "temperature": 0,
        "stream": stream,
        "ignore_eos": True,
    }


@pytest.mark.slow
async def test_a_client_that_leaves_while_queued_gives_up_its_place(
    served: tuple[hostler.Runtime, str],
) -> None:
    runtime, base = served
    async with runtime.request("llamacpp:alpha:0"):  # the engine's one slot is taken
        # a client queues behind it and gives up after 0.5 s
        async with httpx.AsyncClient(base_url=base, timeout=0.5) as impatient:
            with pytest.raises(httpx.ReadTimeout):
                await impatient.post("/v1/chat/completions", json=chat(stream=False, n=4))
        with anyio.fail_after(5):
            while runtime.queues()["llamacpp:alpha:0"].queued_interactive:
                await anyio.sleep(0.05)
        assert runtime.queues()["llamacpp:alpha:0"].running == 1  # the holder still holds it
    with anyio.fail_after(5):
        while "queue.cancelled" not in rig_events(runtime):
            await anyio.sleep(0.1)  # queue events reach the log within half a second


def rig_events(runtime: hostler.Runtime) -> list[str]:
    return [r.type for r in runtime.store.read_all()]


async def test_forget_closes_the_idle_connections_to_one_port(engine: Engine) -> None:
    pool = PooledUpstream()
    assert (await read(pool, engine.port))[0] == 200
    await pool.forget(engine.port + 1)  # another port: nothing of this one is dropped
    assert (await read(pool, engine.port))[0] == 200
    assert engine.connections == 1
    await pool.forget(engine.port)  # the engine is about to stop: its connection goes
    assert (await read(pool, engine.port))[0] == 200
    assert engine.connections == 2
    await pool.aclose()


@pytest.mark.parametrize(
    ("headers", "refused"),
    [
        ([(b"host", b"127.0.0.1:11435")], False),
        ([(b"host", b"localhost:11435"), (b"origin", b"http://localhost:3000")], False),
        ([(b"host", b"LOCALHOST")], False),
        ([(b"host", b"[::1]:11435"), (b"origin", b"https://127.0.0.1")], False),
        ([], False),  # HTTP/1.0 without a Host: a program
        ([(b"host", b"evil.example:11435")], True),  # a name rebound to 127.0.0.1
        ([(b"host", b"127.0.0.1:11435"), (b"origin", b"http://evil.example")], True),
        ([(b"host", b"127.0.0.1:11435"), (b"origin", b"null")], True),  # a sandboxed page
        ([(b"host", b"127.0.0.1"), (b"origin", b"file://")], True),
    ],
)
def test_web_pages_of_other_sites_are_refused_on_loopback(
    headers: list[tuple[bytes, bytes]], refused: bool
) -> None:
    from hostler.serve.app import foreign_caller

    assert (foreign_caller({"type": "http", "headers": headers}) is not None) is refused
