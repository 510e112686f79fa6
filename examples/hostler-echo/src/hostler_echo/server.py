"""The echo engine: a tiny OpenAI-compatible server that answers with what it was told.

It stands for the third-party engine a plugin drives (``mlx_lm.server``, ``sd-server``...):
started as ``python -m hostler_echo.server --model FILE --port N``, it binds 127.0.0.1, loads
its "model" (the file's first line: the prefix of every answer) in the background while
``/health`` says ``{"status": "loading"}``, then says ``{"status": "ok"}`` and prints
``echo: ready``. A model it cannot read prints ``error: cannot read model ...`` and exits 1.
Asked to stream, it sends its answer a word at a time, as a model generates it.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

loaded = threading.Event()
prefix: list[str] = []
WORD_SECONDS = 0.1  # a streamed answer's pace: one word every tenth of a second


def load(model: Path, seconds: float, upper: bool) -> None:
    """Read the model's first line (slowly, when told), then say ready."""
    try:
        line = model.read_text(encoding="utf-8").partition("\n")[0].strip()
    except (OSError, UnicodeDecodeError) as exc:
        print(f"error: cannot read model {model}: {exc}", flush=True)
        os._exit(1)  # from this thread: the whole process
    time.sleep(seconds)
    prefix.append(line.upper() if upper else line)
    loaded.set()
    print("echo: ready", flush=True)


class Handler(BaseHTTPRequestHandler):
    """``GET /health``, ``GET /v1/models`` and ``POST /v1/chat/completions``."""

    def reply(self, status: int, body: object) -> None:
        """Send ``body`` as JSON."""
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        """Health and the model list."""
        if self.path == "/health":
            self.reply(200, {"status": "ok" if loaded.is_set() else "loading"})
        elif self.path == "/v1/models":
            self.reply(200, {"object": "list", "data": [{"id": "echo", "object": "model"}]})
        else:
            self.reply(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        """A chat completion: the model's prefix and the last message, word-clipped."""
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        if self.path != "/v1/chat/completions":
            self.reply(404, {"error": {"message": f"no route {self.path}"}})
            return
        if not loaded.is_set():
            self.reply(503, {"error": {"message": "loading model"}})
            return
        words = f"{prefix[0]} {request['messages'][-1]['content']}".split()
        words = words[: request.get("max_tokens") or len(words)]
        if request.get("stream"):
            self.stream(words)
            return
        message = {"role": "assistant", "content": " ".join(words)}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        self.reply(200, {"object": "chat.completion", "model": "echo", "choices": [choice]})

    def stream(self, words: list[str]) -> None:
        """Server-sent events: a chunk per word, then the finish reason and ``[DONE]``."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chunks: list[dict[str, object]] = [
            {"delta": {"content": f"{word} "}, "finish_reason": None} for word in words
        ]
        chunks.append({"delta": {}, "finish_reason": "stop"})
        for number, choice in enumerate(chunks):
            if number:
                time.sleep(WORD_SECONDS)
            event = {"object": "chat.completion.chunk", "choices": [{"index": 0, **choice}]}
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, format: str, *args: object) -> None:
        """One line per request, on stdout (hostler keeps it in the engine log)."""
        print(f"echo: {format % args}", flush=True)


def main() -> None:
    """Parse the flags, bind, load in the background, serve until killed."""
    parser = argparse.ArgumentParser(prog="hostler-echo")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--load-seconds", type=float, default=0.0)
    parser.add_argument("--upper", action="store_true")
    args, unknown = parser.parse_known_args()
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"echo: listening on {args.host}:{args.port} (ignoring {unknown})", flush=True)
    threading.Thread(target=load, args=(args.model, args.load_seconds, args.upper)).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
