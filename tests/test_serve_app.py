"""The HTTP face (``make_app``) in process, over slow OpenAI-shaped stand-in engines.

Each engine is :class:`SlowChat`, a few lines of Python that stream or answer after a set time
per token (no model: deterministic timing), under a 1 GiB budget that fits one of them: a
cross-site post without the token, a client that leaves while its swap waits, an operator body
over its limit.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import httpx
import pytest

import hostler
from hostler.events.pool import PoolDrainEnded
from hostler.plugin import EngineAdapter, LaunchCommand, LaunchSpec
from hostler.serve.app import make_app
from hostler.serve.server import HttpServer

from _pools import World, engine_processes, world_at

#: /health; POST /v1/*: a stream of ``max_tokens`` chunks, one every ``argv[3]`` seconds (or one
#: JSON answer after that long per token); listens after ``argv[2]`` seconds. Every request's
#: start and end (``done`` or ``cut``) is appended to ``argv[4]``.
SLOW_CHAT = textwrap.dedent(
    """
    import http.server, json, socketserver, sys, time
    time.sleep(float(sys.argv[2]))
    tick = float(sys.argv[3])
    journal = sys.argv[4]

    def note(text):
        with open(journal, "a") as out:
            out.write(text + "\\n")

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def do_GET(self):
            self.send_response(200)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            n = int(body.get("max_tokens", 4))
            tag = body.get("tag", "?")
            note(f"start {tag}")
            try:
                if body.get("stream"):
                    self.send_response(200)
                    self.send_header("content-type", "text/event-stream")
                    self.send_header("transfer-encoding", "chunked")
                    self.end_headers()
                    for i in range(n):
                        time.sleep(tick)
                        data = f"data: {json.dumps({'i': i})}\\n\\n".encode()
                        self.wfile.write(b"%x\\r\\n%s\\r\\n" % (len(data), data))
                        self.wfile.flush()
                    data = b"data: [DONE]\\n\\n"
                    self.wfile.write(b"%x\\r\\n%s\\r\\n0\\r\\n\\r\\n" % (len(data), data))
                    self.wfile.flush()
                else:
                    time.sleep(tick * n)
                    out = json.dumps({"choices": [{"text": "x"}], "tag": tag}).encode()
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                note(f"done {tag}")
            except OSError:
                note(f"cut {tag}")
        def log_message(self, *args):
            pass

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True

    Server(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
    """
)


class SlowChat(EngineAdapter):
    engine_type = "slow"

    def __init__(self, folder: Path, load_seconds: float = 0.0, tick: float = 0.1) -> None:
        self.script = folder / "slow_chat.py"
        self.script.write_text(SLOW_CHAT)
        self.journal = folder / "journal.txt"
        self.journal.touch()
        self.load_seconds = load_seconds
        self.tick = tick

    def build_command(self, spec: LaunchSpec) -> LaunchCommand:
        return LaunchCommand(
            [
                sys.executable,
                str(self.script),
                str(spec.port),
                str(self.load_seconds),
                str(self.tick),
                str(self.journal),
            ]
        )

    def lines(self) -> list[str]:
        return self.journal.read_text().splitlines()


SLOW_MODELS = {"a": "slow:a", "b": "slow:b"}


MIB = 2**20


@pytest.fixture
def slow_world(tmp_path: Path) -> Iterator[World]:
    with world_at(tmp_path) as made:  # an enforced 1 GiB budget
        made.ledger.set_spillover(False)  # two engines of 600 MiB: only one fits
        yield made
        for pid in engine_processes(made.token):
            import os

            os.kill(pid, signal.SIGKILL)


@contextlib.asynccontextmanager
async def slow_face(
    world: World, engine: SlowChat, price: int = 1020 * MIB, drain_wait: float = 30.0
) -> AsyncIterator[tuple[hostler.Runtime, httpx.AsyncClient]]:
    """Two slow engines priced ``price`` each under the 1 GiB budget: one fits."""
    runtime = hostler.Runtime(
        world.store,
        world.supervisor_factory(engine, price),
        ledger=world.ledger,
        drain_poll=0.02,
        drain_wait=drain_wait,
    )
    async with runtime, anyio.create_task_group() as tg:
        server = HttpServer(make_app(runtime, SLOW_MODELS, token="t" * 43), "127.0.0.1", 0)
        tg.start_soon(server.serve)
        await server.started.wait()
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{server.port}", timeout=60
        ) as client:
            yield runtime, client
        server.stop()


def ask(model: str, tag: str, n: int, *, stream: bool = False) -> dict[str, object]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": tag}],
        "tag": tag,
        "max_tokens": n,
        "stream": stream,
    }


@pytest.mark.anyio
async def test_a_cross_site_simple_post_cannot_load_and_evict_without_the_token(
    slow_world: World,
) -> None:
    """Promised: "a bearer token ... is required for every state-changing route" (issue 10);
    docs/serve.md warns that without a token "a web page that makes the browser post to
    127.0.0.1" can drive the daemon — the token is what stops it.

    Instead: with ``auth = "token"`` on loopback, ``POST /v1/chat/completions`` needs no token
    and parses any body as JSON whatever its ``Content-Type``. A browser's CORS "simple
    request" (``Content-Type: text/plain``, ``Origin: http://evil.example``, no preflight)
    loads model ``b`` and evicts the resident ``a`` (state changes: an engine stopped with
    reason ``evicted``, another started) — the answer is 200.
    """
    engine = SlowChat(slow_world.tmp_path, tick=0.01)
    async with slow_face(slow_world, engine) as (runtime, client):
        auth = {"authorization": "Bearer " + "t" * 43}
        assert (await client.post("/api/models/a/load", headers=auth)).status_code == 200
        answer = await client.post(
            "/v1/chat/completions",
            content=json.dumps(ask("b", "csrf", 1)),
            headers={"content-type": "text/plain", "origin": "http://evil.example"},
        )
        resident = sorted(v.key for v in runtime.status().engines if v.state == "running")
        assert "slow:b:0" not in resident, (answer.status_code, resident)


@pytest.mark.anyio
async def test_a_client_that_leaves_while_waiting_for_a_swap_does_not_evict_for_nobody(
    slow_world: World,
) -> None:
    """Promised: a client that disconnects "queued, loading or mid-answer — ends its request at
    once and frees its place" (serve/app.py, docs/serve.md); eviction is "made room for by
    demand".

    Instead: under a budget that fits one model, a request for ``b`` waits while ``a`` drains
    its in-flight request; the ``b`` client gives up after 0.5 s. Its demand is not withdrawn:
    ~2 s later, when ``a``'s request ends, hostler still evicts the warm ``a`` and starts ``b``
    for nobody (resident afterwards: ``['slow:b:0']``, not ``['slow:a:0']``).
    """
    engine = SlowChat(slow_world.tmp_path, tick=0.05)
    async with slow_face(slow_world, engine) as (runtime, client):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: client.post("/v1/chat/completions", json=ask("a", "long", 40)))
            await anyio.sleep(0.5)
            with anyio.move_on_after(0.5):  # b waits for a's drain; the client leaves
                await client.post("/v1/chat/completions", json=ask("b", "ghost", 1))
        await anyio.sleep(1.0)
        resident = sorted(v.key for v in runtime.status().engines if v.state == "running")
        assert "start ghost" not in engine.lines()
        assert resident == ["slow:a:0"], resident


@pytest.mark.anyio
async def test_an_operator_body_over_its_limit_is_refused_before_it_is_read(
    slow_world: World,
) -> None:
    """Promised: bodies are "checked at the edge" (serve/operator.py); the completion routes
    refuse a declared ``Content-Length`` over their limit without reading a byte ("a prompt
    past it is refused, never read whole", serve/proxy.py).

    Instead: the operator routes (``PUT /api/budget``, ``/api/reconcile``, ``/api/leases``...)
    ``await request.body()`` whole and only then compare it with their 64 KiB limit. A request
    that declares ``Content-Length: 300000000`` gets no answer until all 300 MB have arrived
    (measured against ``hostler serve``: its RSS grew from 167 MB to 467 MB before the
    ``400 the request body is over 64 KiB``); a few in parallel exhaust the daemon's memory.
    """
    engine = SlowChat(slow_world.tmp_path)
    async with slow_face(slow_world, engine) as (_runtime, client):
        port = client.base_url.port
        assert port is not None
        stream = await anyio.connect_tcp("127.0.0.1", port)
        async with stream:
            await stream.send(
                b"PUT /api/budget HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                + b"t" * 43
                + b"\r\nContent-Type: application/json\r\nContent-Length: 300000000\r\n\r\n"
            )
            answer = b""
            with anyio.move_on_after(3):
                answer = await stream.receive()
        assert answer.startswith(b"HTTP/1.1 4"), answer[:200]


@pytest.mark.anyio
async def test_an_engine_killed_mid_stream_ends_the_stream_with_an_error_event(
    slow_world: World,
) -> None:
    """Break (issue 19): an engine SIGKILLed mid-answer ended the client's stream as if it were
    complete (no error, no ``[DONE]``, the last chunk's ``finish_reason`` null): the official
    client reported success. The stream now ends with an SSE error event, which the ``openai``
    client raises as an ``APIError``."""
    import os

    engine = SlowChat(slow_world.tmp_path, tick=0.05)
    async with slow_face(slow_world, engine) as (runtime, client):
        lines: list[str] = []
        async with client.stream(
            "POST", "/v1/chat/completions", json=ask("a", "cut", 400, stream=True)
        ) as answer:
            assert answer.status_code == 200
            async for line in answer.aiter_lines():
                lines.append(line)
                if line.startswith('data: {"i": 2}'):
                    pid = runtime.supervisor("slow:a:0").pid
                    assert pid is not None
                    os.kill(pid, signal.SIGKILL)
        data = [line for line in lines if line.startswith("data: ")]
        assert data[:3] == ['data: {"i": 0}', 'data: {"i": 1}', 'data: {"i": 2}']
        assert "data: [DONE]" not in data
        last = json.loads(data[-1][len("data: ") :])
        assert last == {
            "error": {
                "message": "the engine for 'a' stopped answering mid-answer (it crashed or was "
                "killed); the answer is incomplete: ask again",
                "type": "server_error",
                "code": "engine-crashed",
                "param": None,
            }
        }


@pytest.mark.anyio
async def test_a_request_that_needs_room_keeps_its_place_past_the_drain_bound(
    slow_world: World,
) -> None:
    """Issue 21 (6): a request for ``b`` behind a stream on ``a`` that outlasts the drain bound
    was refused ``503 engine-busy`` (the peer replay: b never got a token). It keeps its place
    until its own deadline instead: a's stream finishes uncut, a's requests queued after b do
    not jump ahead of it, then b is served; the drain records the whole wait."""
    engine = SlowChat(slow_world.tmp_path, tick=0.05)
    async with slow_face(slow_world, engine, drain_wait=0.5) as (runtime, client):
        answers: dict[str, httpx.Response] = {}

        async def post(name: str, model: str, n: int) -> None:
            answers[name] = await client.post("/v1/chat/completions", json=ask(model, name, n))

        async with anyio.create_task_group() as tg:
            tg.start_soon(post, "long", "a", 40)  # 2 s of a: four times the drain bound
            while "start long" not in engine.lines():
                await anyio.sleep(0.01)
            tg.start_soon(post, "bee", "b", 1)
            while not any(view.draining for view in runtime.pool.snapshot()):
                await anyio.sleep(0.01)
            tg.start_soon(post, "late", "a", 1)  # a's request after b's: waits behind it
        assert {name: answer.status_code for name, answer in answers.items()} == {
            "long": 200,
            "bee": 200,
            "late": 200,
        }
        lines = engine.lines()
        assert lines.index("done long") < lines.index("start bee") < lines.index("start late")
        assert "cut long" not in lines
        drains = [
            r.event for r in slow_world.store.read_all() if isinstance(r.event, PoolDrainEnded)
        ]
        # a for b once its stream ended (the whole wait recorded, past the old bound); then b
        # for the late request to a
        assert [(d.key, d.outcome) for d in drains] == [
            ("slow:a:0", "evicted"),
            ("slow:b:0", "evicted"),
        ]
        assert drains[0].waited >= 1.0


@pytest.mark.anyio
async def test_past_its_connection_limit_a_request_is_answered_503_at_once() -> None:
    """Issue 22: 1,000 idle connections were all kept, with no limit. Past the limit (1,024 by
    default; 3 here) a request is refused at once, and served again once connections close."""
    import socket

    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def hello(_request: object) -> PlainTextResponse:
        return PlainTextResponse("hi")

    app = Starlette(routes=[Route("/", hello)])
    async with anyio.create_task_group() as tg:
        server = HttpServer(app, "127.0.0.1", 0, max_connections=3)
        tg.start_soon(server.serve)
        await server.started.wait()
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(3)]
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
                refused = await client.get("/")
                assert refused.status_code == 503
        finally:
            for sock in idle:
                sock.close()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
            answer = await client.get("/")
            for _ in range(100):  # the server notices the closed connections as they arrive
                answer = await client.get("/")
                if answer.status_code == 200:
                    break
                await anyio.sleep(0.05)
            assert (answer.status_code, answer.text) == (200, "hi")
        server.stop()
