"""The fake engine's server process: a small OpenAI / llama-server look-alike (stdlib only).

Run as ``python fake_server.py PORT BEHAVIOUR_JSON [--model PATH ...]`` (what follows the
behaviour is ignored); :class:`hostler.testing.fake_engine.FakeEngineAdapter` builds that
command. It imports nothing outside the standard library, so it starts in milliseconds in any
interpreter. What it does is scripted by the behaviour (the fields of
:class:`hostler.testing.fake_engine.Behaviour`):

- ``load_seconds``: it "loads the model" this long before it is ready. Meanwhile its port is
  closed, unless ``listen_while_loading`` (``/health`` answers 503, as llama-server's does) or
  ``health_before_ready`` (``/health`` answers 200 while completions still answer 503, as
  ``mlx_lm.server``'s does).
- ``ballast_mib``: it holds this much touched memory (a known footprint).
- ``fatal_line``: printed once at startup, before loading.
- ``exit_code``: when not None, it exits with this code where it would have become ready.
- ``crash_on_request``: the completion request (1-based) on which it exits with ``crash_exit_code``.
- ``ignore_sigterm``: SIGTERM is ignored (an engine that hangs on stop; only SIGKILL ends it).
- ``reply`` / ``reply_delay``: the completion text and how long each completion takes.
- ``stream_seconds``: how long a streamed completion runs (its final chunk comes this late).
- ``serial``: one request at a time, ``/health`` included (it waits behind a completion).
- ``cut_streams``: a new completion ends every running stream at once (``[DONE]``, no
  ``finish_reason``), as llama-cpp-python's server does.

Endpoints: ``GET /health``, ``GET /v1/models``, ``POST /v1/completions``,
``POST /v1/chat/completions`` (``"stream": true`` answers server-sent events), ``POST
/completion`` (llama-server's own), ``GET /busy/<seconds>`` (holds the request that long),
``GET /spam/<n>`` (prints ``n`` lines), ``GET /stats`` (requests seen); any other ``GET`` is
answered ``ok`` and printed as ``asked for <path>``.

Every line it prints goes to its output (the engine log): ``fake-engine: listening on
127.0.0.1:PORT``, ``fake-engine: model loaded`` (the ready line), ``fake-engine: crashing on
request N``, ``fake-engine: stream cut by a new request``.

Other fakes build on its skeleton (``plugins/hostler_ds4/fake_server.py``,
``tests/_fake_sdserver.py``): :class:`JsonHandler` (a quiet HTTP/1.1 handler with JSON answers,
JSON errors, a length-checked body read and server-sent events), so that each keeps only its own
protocol. Importing this module loads only the standard library.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import socketserver
import sys
import threading
import time
from typing import Any

__all__ = ["MAX_BODY", "MODEL_ID", "READY_LINE", "JsonHandler", "main"]

READY_LINE = "fake-engine: model loaded"
MODEL_ID = "fake-model"
_COMPLETIONS = ("/v1/completions", "/v1/chat/completions", "/completion")


class _State:
    """What the server knows: its behaviour, whether it is loaded, the requests it saw."""

    def __init__(self, behaviour: dict[str, Any]) -> None:
        self.behaviour = behaviour
        self.ready = threading.Event()
        self.lock = threading.Lock()
        self.completions = 0
        self.requests = 0
        self.serial = threading.Lock()  # held for a whole request by a ``serial`` engine
        self.streams: set[threading.Event] = set()  # each running stream's "cut" flag

    def one_at_a_time(self) -> contextlib.AbstractContextManager[object]:
        """The whole request under the serial lock, for a ``serial`` engine; else nothing."""
        return self.serial if self.behaviour.get("serial") else contextlib.nullcontext()

    def cut_streams(self) -> None:
        """End every running stream now (``cut_streams``: a new completion came)."""
        with self.lock:
            for cut in self.streams:
                cut.set()


#: The largest request body :meth:`JsonHandler.read_body` reads (16 MiB).
MAX_BODY = 16 * 1024 * 1024


class JsonHandler(http.server.BaseHTTPRequestHandler):
    """The skeleton of a fake engine's HTTP handler: HTTP/1.1, JSON answers, no access log.

    Subclass it with ``do_GET`` / ``do_POST``; answer with :meth:`send_json` or
    :meth:`send_error_json`, read a request body with :meth:`read_body`, stream with
    :meth:`start_events`, :meth:`send_event` and :meth:`end_events`.
    """

    protocol_version = "HTTP/1.1"
    #: The largest body :meth:`read_body` accepts; a longer one is answered 413.
    max_body = MAX_BODY

    def send_json(self, status: int, body: object, *, close: bool = False) -> None:
        """Answer ``status`` with ``body`` as JSON (with its ``Content-Length``).

        ``close``: say ``Connection: close`` and close the connection after it.
        """
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if close:
            self.send_header("Connection", "close")  # also sets close_connection
        self.end_headers()
        self.wfile.write(data)

    def error_body(self, status: int, message: str) -> object:
        """The JSON of an error answer: ``{"error": {"code": status, "message": message}}``.

        Override it to speak another server's error shape.
        """
        return {"error": {"code": status, "message": message}}

    def send_error_json(self, status: int, message: str, *, close: bool = False) -> None:
        """Answer ``status`` with :meth:`error_body` (``close``: as :meth:`send_json`)."""
        self.send_json(status, self.error_body(status, message), close=close)

    def read_body(self) -> bytes | None:
        """The request body, read by its ``Content-Length`` (none given: empty).

        A length that is not a whole number from 0 to :attr:`max_body` is answered (400, or
        413 when too large; the body is left unread and the connection closed): then None,
        and the caller returns.
        """
        text = self.headers.get("Content-Length") or "0"
        digits = text.isascii() and text.isdigit() and len(text) <= 18  # int() refuses long texts
        length = int(text) if digits else -1
        if 0 <= length <= self.max_body:
            return self.rfile.read(length) if length else b""
        if length < 0:
            self.send_error_json(400, f"bad Content-Length {text[:40]!r}", close=True)
        else:
            self.send_error_json(413, f"a body over {self.max_body} bytes", close=True)
        return None

    def start_events(self) -> None:
        """Begin a server-sent event stream (200, ``text/event-stream``, closed at the end)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()

    def send_event(self, data: object) -> None:
        """One event: ``data: <data as JSON>`` and a blank line."""
        self.wfile.write(f"data: {json.dumps(data)}\n\n".encode())

    def end_events(self) -> None:
        """End the stream with ``data: [DONE]`` and close the connection."""
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a fake's output is its engine log, not an access log."""
        del format, args


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _handler(state: _State) -> type[JsonHandler]:
    behaviour = state.behaviour

    class Handler(JsonHandler):
        def _loading(self) -> None:
            self.send_error_json(503, "Loading model")

        def do_GET(self) -> None:
            with state.one_at_a_time():
                self._get()

        def _get(self) -> None:
            with state.lock:
                state.requests += 1
            path = self.path.split("?")[0]
            if path == "/health":
                if state.ready.is_set() or behaviour.get("health_before_ready"):
                    self.send_json(200, {"status": "ok"})
                else:
                    self._loading()
            elif path == "/v1/models":
                models = [{"id": MODEL_ID, "object": "model"}]
                self.send_json(200, {"object": "list", "data": models})
            elif path == "/stats":
                with state.lock:
                    stats = {"requests": state.requests, "completions": state.completions}
                self.send_json(200, {**stats, "ready": state.ready.is_set()})
            elif path.startswith("/busy/"):
                time.sleep(float(path.split("/")[2]))
                self.send_json(200, {"status": "ok"})
            elif path.startswith("/spam/"):
                for i in range(int(path.split("/")[2])):
                    sys.stdout.write(f"spam {i:08d} " + "x" * 100 + "\n")
                sys.stdout.flush()
                self.send_json(200, {"status": "ok"})
            else:
                _say(f"asked for {self.path}")
                self.send_json(200, {"status": "ok"})

        def do_POST(self) -> None:
            with state.one_at_a_time():
                self._post()

        def _post(self) -> None:
            raw = self.read_body()
            if raw is None:
                return
            path = self.path.split("?")[0]
            if path not in _COMPLETIONS:
                self.send_error_json(404, f"no route {path}")
                return
            if not state.ready.is_set():
                self._loading()
                return
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                self.send_error_json(400, "invalid JSON")
                return
            with state.lock:
                state.requests += 1
                state.completions += 1
                number = state.completions
            if behaviour.get("cut_streams"):
                state.cut_streams()
            if number == behaviour.get("crash_on_request"):
                _say(f"fake-engine: crashing on request {number}")
                os._exit(int(behaviour.get("crash_exit_code", 1)))
            time.sleep(float(behaviour.get("reply_delay", 0.0)))
            self._complete(path, body if isinstance(body, dict) else {})

        def _complete(self, path: str, body: dict[str, Any]) -> None:
            text = str(behaviour.get("reply", "hello from the fake engine"))
            usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            created = int(time.time())
            if path == "/completion":
                self.send_json(200, {"content": text, "stop": True, "tokens_predicted": 1})
                return
            chat = path == "/v1/chat/completions"
            choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            kind = "chat.completion" if chat else "text_completion"
            reply = {
                "id": f"fake-{created}",
                "object": kind,
                "created": created,
                "model": str(body.get("model") or MODEL_ID),
                "choices": [choice],
                "usage": usage,
                # what it was sent, as sent (hostler renames ``model`` to the client's own)
                "fake_engine": {"model": body.get("model")},
            }
            if not body.get("stream"):
                self.send_json(200, reply)
                return
            self._stream(reply, chat, text)

        def _stream(self, reply: dict[str, Any], chat: bool, text: str) -> None:
            self.start_events()
            delta = {"role": "assistant", "content": text} if chat else None
            first = {**reply, "object": "chat.completion.chunk" if chat else reply["object"]}
            first["choices"] = [
                {
                    "index": 0,
                    "finish_reason": None,
                    **({"delta": delta} if chat else {"text": text}),
                }
            ]
            last = {**first, "choices": [{"index": 0, "finish_reason": "stop", "delta": {}}]}
            self.send_event(first)
            self.wfile.flush()
            cut = threading.Event()
            with state.lock:
                state.streams.add(cut)
            try:
                if cut.wait(float(behaviour.get("stream_seconds", 0.0))):
                    _say("fake-engine: stream cut by a new request")
                else:
                    self.send_event(last)
            finally:
                with state.lock:
                    state.streams.discard(cut)
            self.end_events()

    return Handler


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = False


def main(argv: list[str]) -> int:
    """Serve on ``argv[0]`` (the port) as ``argv[1]`` (the behaviour, JSON) scripts."""
    port = int(argv[0])
    behaviour: dict[str, Any] = json.loads(argv[1]) if len(argv) > 1 else {}
    if behaviour.get("ignore_sigterm"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ballast = bytearray(int(behaviour.get("ballast_mib", 0)) * 1024 * 1024)
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    state = _State(behaviour)
    if behaviour.get("fatal_line"):
        _say(str(behaviour["fatal_line"]))
    early = bool(behaviour.get("listen_while_loading") or behaviour.get("health_before_ready"))
    server: _Server | None = None
    if early:
        server = _Server(("127.0.0.1", port), _handler(state))
        _say(f"fake-engine: listening on 127.0.0.1:{port}")
        threading.Thread(target=server.serve_forever, daemon=True).start()
    time.sleep(float(behaviour.get("load_seconds", 0.0)))
    if behaviour.get("exit_code") is not None:
        _say(f"fake-engine: exiting with {behaviour['exit_code']} before ready")
        return int(behaviour["exit_code"])
    state.ready.set()
    if server is None:
        server = _Server(("127.0.0.1", port), _handler(state))
        _say(f"fake-engine: listening on 127.0.0.1:{port}")
        _say(READY_LINE)
        server.serve_forever()
    else:
        _say(READY_LINE)
        threading.Event().wait()  # the server thread serves; this one waits for a signal
    del ballast
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
