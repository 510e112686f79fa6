"""The OpenAPI document of ``hostler serve``: it matches the routes, and every route is fuzzed.

The app is the real one (``make_app``) over a real ``hostler.Runtime`` on a real SQLite log,
served by uvicorn on a loopback port in a thread of its own; its engines are stand-in
processes of a few lines of Python that answer HTTP (:class:`EchoEngine`). Schemathesis generates valid and invalid
inputs for every operation of :func:`hostler.serve.openapi.openapi_schema`, with and without
the token; no input may get a 5xx other than a 502/503 the schema documents for that
operation, answered in OpenAI's error shape.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote

import anyio
import anyio.from_thread
import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)
from starlette.routing import Route
from starlette.types import Message

import hostler
from hostler.clock import SYSTEM_CLOCK
from hostler.engines.price import LaunchRequest, PricedLaunch
from hostler.errors import UnknownEngineError
from hostler.plugin import EngineAdapter, LaunchCommand, LaunchSpec
from hostler.serve.app import make_app
from hostler.serve.openapi import OPENAPI_PATH, openapi_schema
from hostler.serve.operator import ENGINE_KEY, JsonAnswer, is_number
from hostler.serve.server import HttpServer

from _pools import PRICE, world_at

Case = schemathesis.Case[Any]
TOKEN = "s" * 43
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MODELS = {"alpha": "echo:alpha", "beta": "echo:beta"}
#: The engines "configured" here: any other key is refused as the daemon refuses it (404).
KEYS = frozenset({"echo:alpha:0", "echo:beta:0"})
#: Generated examples per operation (valid and invalid together), once with the token and once
#: without; schemathesis adds its explicit and coverage cases to them.
EXAMPLES = 12

#: Answers every GET with ``ok`` and every POST with a small JSON document naming the path and
#: the number of bytes it was sent (an engine that accepts whatever it is given).
ECHO_SCRIPT = """
import http.server, json, socketserver, sys

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self, body, kind):
        self.send_response(200)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._answer(b"ok", "text/plain")

    def do_POST(self):
        size = int(self.headers.get("content-length") or 0)
        sent = self.rfile.read(size)
        body = json.dumps({"object": "echo", "path": self.path, "bytes": len(sent)})
        self._answer(body.encode(), "application/json")

    def log_message(self, *args):
        pass

class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True

print("echo engine listening", flush=True)
Server(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


class EchoEngine(EngineAdapter):
    """Runs :data:`ECHO_SCRIPT` on the port hostler chose."""

    engine_type = "echo"

    def __init__(self, folder: Path) -> None:
        self.script = folder / "echo_engine.py"
        self.script.write_text(ECHO_SCRIPT)

    def build_command(self, spec: LaunchSpec) -> LaunchCommand:
        return LaunchCommand([sys.executable, str(self.script), str(spec.port)])


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, price: int = PRICE) -> AsyncIterator[str]:
    """The app over a runtime of two echo engines, on a loopback port; yields its base URL.

    Each engine costs ``price`` bytes in a 1 GiB budget (the default: two fit, three do not).
    """
    with world_at(tmp_path) as world:

        class Planned:  # a configured engine's launches: a fixed plan of ``price`` bytes
            def __init__(self, key: str, run: Path) -> None:
                self.request = LaunchRequest(key, world.model, ctx=512, slots=1, work_dir=run)

            def price(self) -> PricedLaunch:
                plan = SimpleNamespace(kv_type="q8_0", context_window=512, slots=1)
                priced: Any = SimpleNamespace(
                    plan=plan, ctx_per_slot=512, slots=1, kv_type="q8_0", estimated=price,
                    reserved_bytes=price, admitted=True, denial="",
                )  # fmt: skip
                return PricedLaunch(self.request, priced)

        build_any = world.supervisor_factory(EchoEngine(tmp_path), price, launcher=Planned)

        def build(key: str) -> Any:
            if key not in KEYS:
                raise UnknownEngineError(f"{key[:140]}: no engine of that name is configured")
            return build_any(key)

        runtime = hostler.Runtime(
            world.store,
            build,
            ledger=world.ledger,
            drain_poll=0.02,
        )
        async with runtime, anyio.create_task_group() as tg:
            server = HttpServer(make_app(runtime, MODELS, token=TOKEN), "127.0.0.1", 0)
            tg.start_soon(server.serve)
            await server.started.wait()
            try:
                yield f"http://127.0.0.1:{server.port}"
            finally:
                server.stop()


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One served app for the whole module (its runtime lives in the portal's event loop)."""
    with (
        anyio.from_thread.start_blocking_portal() as portal,
        portal.wrap_async_context_manager(serving(tmp_path_factory.mktemp("schema"))) as url,
    ):
        yield url


@pytest.fixture
def client(base_url: str) -> Iterator[httpx.Client]:
    """A client of the served app."""
    with httpx.Client(base_url=base_url, timeout=30) as made:
        yield made


# -- the document and the routes ------------------------------------------------------------------


def test_the_schema_lists_exactly_the_apps_routes() -> None:
    # the routes are only listed, never called
    unused = SimpleNamespace(
        store=None,
        memory=SimpleNamespace(ledger_log=lambda: None),
        on_stopping=lambda _: None,
        clock=SYSTEM_CLOCK,
    )
    app = make_app(unused, MODELS, token=TOKEN)  # type: ignore[arg-type]
    served = set()
    for route in app.routes:
        assert isinstance(route, Route)
        for method in route.methods or ():
            if method != "HEAD":  # Starlette adds HEAD to every GET
                served.add((route.path, method.lower()))
    documented = {
        (path, method) for path, item in openapi_schema()["paths"].items() for method in item
    }
    assert documented == served
    assert len(served) == 31


def test_the_schema_documents_auth_and_errors() -> None:
    doc = openapi_schema()
    assert doc["openapi"] == "3.1.0"
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "the daemon's token (the data directory's `token` file)",
    }
    error = doc["components"]["schemas"]["Error"]["properties"]["error"]
    assert error["required"] == ["message", "type", "code", "param"]
    ops = {(p, m): op for p, item in doc["paths"].items() for m, op in item.items()}
    assert ops[("/health", "get")]["security"] == []
    assert ops[("/v1/models", "get")]["security"] == [{}, {"bearer": []}]
    assert ops[("/api/budget", "put")]["security"] == [{"bearer": []}]
    for (path, method), op in ops.items():
        changes = method != "get" and not path.startswith("/v1/")  # completions change nothing
        assert (op["x-hostler-token"] == "always") == changes, (path, method)
        never = path in {"/health", "/", "/dashboard.js", "/dashboard.css"}  # no data in them
        assert ("401" in op["responses"]) == (not never), (path, method)
        assert (op["x-hostler-token"] == "never") == never, (path, method)
        assert "500" not in op["responses"]
    budget = ops[("/api/budget", "put")]["requestBody"]["content"]["application/json"]["schema"]
    assert budget["additionalProperties"] is False
    assert budget["properties"]["bytes"]["anyOf"] == [
        {"type": "integer", "minimum": 0, "maximum": 2**60},
        {"type": "null"},
    ]
    unavailable = doc["components"]["responses"]["Unavailable"]
    assert unavailable["headers"] == {"Retry-After": {"$ref": "#/components/headers/RetryAfter"}}
    assert openapi_schema() is not openapi_schema()  # a copy each time: callers may change it


def test_the_schema_is_a_valid_openapi_3_1_document() -> None:
    from schemathesis.specs.openapi.definitions import OPENAPI_31_VALIDATOR

    for document in (openapi_schema(), openapi_schema(MODELS)):
        assert list(OPENAPI_31_VALIDATOR.iter_errors(document)) == []
    broken = openapi_schema()
    del broken["paths"]["/health"]["get"]["responses"]["200"]["description"]
    assert list(OPENAPI_31_VALIDATOR.iter_errors(broken))  # the validator does look


def test_the_configured_models_are_its_examples() -> None:
    doc = openapi_schema(MODELS)
    chat = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]
    assert chat["application/json"]["schema"]["properties"]["model"]["examples"] == [
        "alpha",
        "beta",
    ]
    [key] = doc["paths"]["/api/engines/{key}/unload"]["post"]["parameters"]
    assert key["schema"]["examples"] == ["echo:alpha:0", "echo:beta:0"]
    assert all(ENGINE_KEY.fullmatch(k) for k in key["schema"]["examples"])
    assert key["schema"]["pattern"] == f"^{ENGINE_KEY.pattern}$"  # the edge's own check
    assert (
        "examples"
        not in openapi_schema()["paths"]["/api/engines/{key}/unload"]["post"]["parameters"][0][
            "schema"
        ]
    )


def test_the_schema_is_served_like_other_read_routes(client: httpx.Client) -> None:
    answer = client.get(OPENAPI_PATH)
    assert answer.status_code == 200
    assert answer.json() == openapi_schema(MODELS)
    assert answer.headers["content-type"] == "application/json"


# -- what the fuzzer's kind of input broke, kept as plain requests -------------------------------


def test_numbers_are_ascii_digits() -> None:
    assert is_number("0") and is_number("1" * 18)
    for bad in ("", "1" * 19, "\u00b2", "\u0661", " 1", "-1", "1.0", "+1"):
        assert not is_number(bad), bad
    assert "\u00b2".isdigit()  # why str.isdigit alone is not the test: int() refuses it


def test_engine_keys_are_as_k2_makes_them() -> None:
    for good in ("echo:alpha:0", "llamacpp:qwen2.5-7b.gguf:12", "a-1_b:m:999999999"):
        assert ENGINE_KEY.fullmatch(good), good
    for bad in (
        "alpha",
        "echo:alpha",
        "echo:alpha:00",
        "echo:alpha:01",
        "echo:alpha:1234567890",
        "Echo:alpha:0",
        "echo::0",
        "echo:a:b:0",
        "echo:alpha:-1",
        "echo:alpha:\u00b2",
        "echo\n:alpha:0",
        "echo:alpha:0\n",
    ):
        assert not ENGINE_KEY.fullmatch(bad), bad


def test_a_queue_id_of_unicode_digits_is_a_400_not_a_500(client: httpx.Client) -> None:
    # "²" passed str.isdigit and int("²") raised: a 500 with a traceback in the log
    for raw in (quote("\u00b2"), quote("\u0661")):  # and an Arabic-Indic 1: int() takes it
        for answer in (
            client.delete(f"/api/queues/echo:alpha:0/{raw}", headers=AUTH),
            client.post(
                f"/api/queues/echo:alpha:0/{raw}/move", json={"direction": "up"}, headers=AUTH
            ),
        ):
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]["code"] == "invalid-request"
            assert "a queued request's id is a number" in answer.json()["error"]["message"]


def test_an_event_resume_point_of_unicode_digits_is_a_400_not_a_500(client: httpx.Client) -> None:
    by_query = client.get("/api/events", params={"after": "\u00b2"})
    by_header = client.get("/api/events", headers=[(b"last-event-id", b"\xb2")])  # latin-1 "²"
    for answer in (by_query, by_header):
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"] == {
            "message": "resume from a seq (a number), not '\u00b2'",
            "type": "invalid_request_error",
            "code": "invalid-request",
            "param": None,
        }


def test_what_is_not_an_engine_key_is_refused_at_the_edge(client: httpx.Client) -> None:
    for method, path in (
        ("POST", "/api/engines/alpha/unload"),
        ("GET", "/api/cache/echo:alpha"),
        ("POST", "/api/cache/echo:alpha:00/clear"),
        ("PUT", "/api/cache/ECHO:alpha:0/budget"),
        ("GET", "/api/preview/echo:a:b:0"),
        ("DELETE", "/api/queues/echo/1"),
    ):
        answer = client.request(method, path, json={"bytes": 1}, headers=AUTH)
        assert answer.status_code == 400, (path, answer.text)
        assert "is not an engine key (engine:model:replica" in answer.json()["error"]["message"]
    # a well-formed key that is not configured: nothing there, or the daemon's 404
    assert client.post("/api/engines/echo:gamma:0/unload", headers=AUTH).json() == {
        "key": "echo:gamma:0",
        "unloaded": False,
    }
    assert client.get("/api/cache/echo:gamma:0").json() is None
    missing = client.get("/api/preview/echo:gamma:0")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert client.get("/api/preview/echo:alpha:0").json()["reserved_bytes"] == PRICE


def test_a_lone_surrogate_in_an_operator_body_is_a_400_not_a_500(client: httpx.Client) -> None:
    # JSON spells "\ud800"; the answer that echoed it could not be encoded: a 500
    for path, body in (
        ("/api/leases", b'{"slot": "image", "holder": "\\ud800"}'),
        ("/api/reconcile", b'{"targets": {"echo:\\udfff": 1}}'),
    ):
        answer = client.post(path, content=body, headers=AUTH)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["message"] == (
            "the request body has a lone UTF-16 surrogate (\\ud800-\\udfff)"
        )
    holders = {lease["holder"] for lease in client.get("/api/leases").json()}
    assert "\ud800" not in holders


def test_every_json_answer_is_ascii_so_no_text_sent_can_break_it() -> None:
    # a completion's session name is taken as sent, lone surrogate and all, and an answer that
    # lists sessions (the cache stats) must still encode; Starlette's JSONResponse raised on it
    answer = JsonAnswer({"sessions": ["\ud800", "\u00e9"], "n": 1})
    assert answer.body == b'{"sessions":["\\ud800","\\u00e9"],"n":1}'
    assert answer.headers["content-type"] == "application/json"
    with pytest.raises(ValueError, match="JSON compliant"):
        JsonAnswer({"rate": float("nan")})


def test_head_of_the_event_tail_ends_and_frees_the_connection(client: httpx.Client) -> None:
    # the tail never ends; as an answer to HEAD it held the keep-alive line, and the next
    # request on it waited forever
    with httpx.Client(base_url=str(client.base_url), timeout=5) as one_line:
        head = one_line.head("/api/events")
        assert head.status_code == 200
        assert head.headers["content-type"].startswith("text/event-stream")
        assert one_line.get("/health").json()["status"] == "ok"


@pytest.mark.anyio
async def test_a_client_that_leaves_before_its_body_is_read_is_not_a_bug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    idle = SimpleNamespace(
        store=None,
        memory=SimpleNamespace(ledger_log=lambda: None),
        on_stopping=lambda _: None,
        clock=SYSTEM_CLOCK,
    )
    app = make_app(idle, MODELS, token=TOKEN)  # type: ignore[arg-type]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1:2"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    assert sent == []  # nobody to answer
    assert "failed" not in caplog.text


def test_the_routers_own_refusals_are_openai_errors(client: httpx.Client) -> None:
    nowhere = client.get("/v2/models")
    assert nowhere.status_code == 404
    assert nowhere.json()["error"]["code"] == "not-found"
    assert "GET /openapi.json lists them" in nowhere.json()["error"]["message"]
    wrong = client.delete("/health")
    assert wrong.status_code == 405
    assert set(wrong.headers["allow"].split(", ")) == {"GET", "HEAD"}
    assert wrong.json()["error"] == {
        "message": "DELETE is not a method of '/health'",
        "type": "invalid_request_error",
        "code": "method-not-allowed",
        "param": None,
    }
    # a path served by two routes (GET and PUT /api/budget) names every method it takes
    # (issue 22: OPTIONS listed GET and HEAD only)
    for path, methods in (
        ("/api/budget", {"GET", "HEAD", "PUT"}),
        ("/api/leases", {"GET", "HEAD", "POST"}),
    ):
        asked = client.options(path)
        assert asked.status_code == 405
        assert set(asked.headers["allow"].split(", ")) == methods, path


class Broken(SimpleNamespace):
    """A runtime whose status raises: a bug, as the app sees one."""

    def status(self) -> None:
        raise RuntimeError("a bug")

    def on_stopping(self, listener: object) -> None:
        """Nothing stops here."""


@pytest.mark.anyio
async def test_a_bug_is_one_line_in_openai_shape_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = Broken(store=None, clock=SYSTEM_CLOCK, memory=SimpleNamespace(ledger_log=lambda: None))
    app = make_app(broken, MODELS, token=TOKEN)  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as local:
        answer = await local.get("/api/engines")
    assert answer.status_code == 500
    assert answer.json()["error"] == {
        "message": "hostler failed on this request (RuntimeError); it is logged, please report it",
        "type": "server_error",
        "code": "internal",
        "param": None,
    }
    assert "GET /api/engines failed" in caplog.text and "a bug" in caplog.text


# -- fuzzing every operation ---------------------------------------------------------------------

schema = schemathesis.openapi.from_dict(openapi_schema(MODELS))
schema.config.generation.update(
    modes=[schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE],
    max_examples=EXAMPLES,
    deterministic=True,
)


def check_server_error(path: str, method: str, status: int, body: bytes) -> None:
    """Raise unless ``status`` is below 500, or a 5xx ``path`` documents, in the error shape."""
    if status < 500:
        return
    documented = openapi_schema()["paths"][path][method.lower()]["responses"]
    assert str(status) in documented, f"{status} is not documented here: {body[:300]!r}"
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "code", "param"}, body[:300]


def documented_server_errors(
    ctx: schemathesis.CheckContext, response: schemathesis.Response, case: Case
) -> bool | None:
    """No 5xx but a 502/503 the operation documents, in OpenAI's error shape."""
    del ctx
    check_server_error(case.path, case.method, response.status_code, response.content)
    return None


CHECKS = [
    documented_server_errors,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
    ignored_auth,
    unsupported_method,
]


def call(case: Case, base_url: str, headers: dict[str, str]) -> None:
    if case.path == "/api/events" and case.method.upper() == "GET":
        call_events(case, base_url, headers)
        return
    case.call_and_validate(base_url=base_url, headers=headers, checks=CHECKS, timeout=30)


def call_events(case: Case, base_url: str, headers: dict[str, str]) -> None:
    """The event tail never ends: only its status and first bytes are read."""
    kwargs = case.as_transport_kwargs(base_url=base_url, headers=headers)
    with (
        httpx.Client(timeout=30) as client,
        client.stream(
            kwargs["method"],
            kwargs["url"],
            params=kwargs.get("params"),
            headers={k: str(v) for k, v in kwargs.get("headers", {}).items()},
        ) as answer,
    ):
        assert answer.status_code in (200, 400), answer.status_code
        if answer.status_code == 400:
            answer.read()
            assert answer.json()["error"]["code"] == "invalid-request"
        else:
            assert answer.headers["content-type"].startswith("text/event-stream")
            assert next(answer.iter_raw()).startswith(b": hostler event stream")


FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.mark.slow
@schema.parametrize()
@FUZZ
def test_every_route_with_the_token(case: Case, base_url: str) -> None:
    call(case, base_url, AUTH)


@pytest.mark.slow
@schema.parametrize()
@FUZZ
def test_every_route_without_the_token(case: Case, base_url: str) -> None:
    call(case, base_url, {})


@pytest.mark.anyio
async def test_a_documented_503_passes_the_check_only_where_it_is_documented(
    tmp_path: Path,
) -> None:
    async with (
        serving(tmp_path, price=2 * 2**30) as url,  # never fits the 1 GiB budget
        httpx.AsyncClient(base_url=url, timeout=30, headers=AUTH) as local,
    ):
        denied = await local.post("/api/models/alpha/load")
    assert denied.status_code == 503, denied.text
    assert denied.json()["error"]["code"] == "capacity-denied"
    check_server_error("/api/models/{model}/load", "POST", 503, denied.content)
    with pytest.raises(AssertionError, match="503 is not documented here"):
        check_server_error("/api/leases", "GET", 503, denied.content)
    with pytest.raises(AssertionError, match="500 is not documented here"):
        check_server_error("/api/models/{model}/load", "POST", 500, denied.content)
    with pytest.raises(AssertionError):
        check_server_error("/api/models/{model}/load", "POST", 503, b'{"error": {"message": "x"}}')
    check_server_error("/api/leases", "GET", 404, b"not JSON: below 500 is not this check's")
