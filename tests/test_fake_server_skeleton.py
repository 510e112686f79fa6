"""The fake engines' shared HTTP skeleton (hostler.testing.fake_server.JsonHandler), over a socket.

The fake engine, ds4's fake and sd-cpp's fake each keep only their protocol on top of it; here
its own parts are pinned once: JSON answers, the error shape and its override, the
length-checked body read, and server-sent events.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest

from hostler.testing.fake_server import MAX_BODY, JsonHandler


class Echo(JsonHandler):
    """Answers a POST with what it read; ``/events`` streams it back as two events."""

    max_body = 64

    def do_GET(self) -> None:
        self.send_error_json(404, f"no route {self.path}")

    def do_POST(self) -> None:
        raw = self.read_body()
        if raw is None:
            return
        if self.path == "/events":
            self.start_events()
            self.send_event({"n": 1})
            self.send_event({"body": raw.decode()})
            self.end_events()
            return
        self.send_json(200, {"read": raw.decode()})


class Plain(Echo):
    """Another server's error shape."""

    def error_body(self, status: int, message: str) -> object:
        return {"error": message, "status": status}


@pytest.fixture(params=[Echo, Plain])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[int, type[Echo]]]:
    handler: type[Echo] = request.param
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield httpd.server_address[1], handler
    httpd.shutdown()
    httpd.server_close()


def raw_request(port: int, head: str, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """Send bytes as written (a bad Content-Length included); the status, headers and body."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(head.encode("latin-1") + b"\r\n\r\n" + body)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, dict(response.getheaders()), response.read()


def expected_error(handler: type[Echo], status: int, message: str) -> object:
    if handler is Plain:
        return {"error": message, "status": status}
    return {"error": {"code": status, "message": message}}


def test_the_default_limit_is_16_mib() -> None:
    assert MAX_BODY == 16 * 1024 * 1024
    assert JsonHandler.max_body == MAX_BODY
    assert JsonHandler.protocol_version == "HTTP/1.1"


def test_a_json_answer_has_its_length_and_type(server: tuple[int, type[Echo]]) -> None:
    port, _ = server
    body = b'{"x": 1}'
    status, headers, data = raw_request(
        port, f"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: {len(body)}", body
    )
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    assert int(headers["Content-Length"]) == len(data)
    assert json.loads(data) == {"read": '{"x": 1}'}


def test_errors_take_the_handlers_shape(server: tuple[int, type[Echo]]) -> None:
    port, handler = server
    status, _, data = raw_request(port, "GET /nowhere HTTP/1.1\r\nHost: h")
    assert status == 404
    assert json.loads(data) == expected_error(handler, 404, "no route /nowhere")


@pytest.mark.parametrize(("length", "read"), [(None, ""), ("0", ""), ("3", "abc")])
def test_a_body_is_read_by_its_length(
    server: tuple[int, type[Echo]], length: str | None, read: str
) -> None:
    port, _ = server
    head = "POST /x HTTP/1.1\r\nHost: h" + (f"\r\nContent-Length: {length}" if length else "")
    status, _, data = raw_request(port, head, read.encode())
    assert (status, json.loads(data)) == (200, {"read": read})


def test_a_body_at_the_limit_is_read_and_one_over_is_413(server: tuple[int, type[Echo]]) -> None:
    port, handler = server
    at = b"a" * 64
    status, _, data = raw_request(port, "POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 64", at)
    assert (status, json.loads(data)) == (200, {"read": at.decode()})
    status, headers, data = raw_request(
        port, "POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 65", b"a" * 65
    )
    assert status == 413
    assert headers["Connection"] == "close"
    assert json.loads(data) == expected_error(handler, 413, "a body over 64 bytes")


@pytest.mark.parametrize("length", ["-1", "abc", "1.5", "²", "9" * 19, "+3"])
def test_a_bad_length_is_400_not_a_hang(server: tuple[int, type[Echo]], length: str) -> None:
    """A negative length read to the end of the stream: the request hung until closed."""
    port, handler = server
    status, headers, data = raw_request(
        port, f"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: {length}", b"abc"
    )
    assert status == 400
    assert headers["Connection"] == "close"
    assert json.loads(data) == expected_error(handler, 400, f"bad Content-Length {length!r}")


def test_events_stream_then_done_then_close(server: tuple[int, type[Echo]]) -> None:
    port, _ = server
    status, headers, data = raw_request(
        port, "POST /events HTTP/1.1\r\nHost: h\r\nContent-Length: 2", b"hi"
    )
    assert status == 200
    assert headers["Content-Type"] == "text/event-stream"
    assert headers["Connection"] == "close"
    assert data == b'data: {"n": 1}\n\ndata: {"body": "hi"}\n\ndata: [DONE]\n\n'
