"""A protocol-faithful stand-in for ``ds4-server``: ``python -m hostler_ds4.fake_server``.

No installable ds4 build exists, so hostler's ds4 adapter is tested against this process. It
takes ds4-server's flags (``docs/rules.md`` D2), refuses what ds4-server refuses, and fails the
ways it fails:

- ``--model FILE`` must be a GGUF file (``failed to load model``, exit 1);
- exactly one GPU backend, ``--metal`` (macOS only) or ``--cuda``: ds4 never runs on CPU;
- shaders load relative to the working directory (``--chdir DIR`` moves there first): a
  directory without ``shaders/`` fails (``cannot load shaders``);
- a hard singleton (D4, IN4): an exclusive ``flock`` on one lock file per machine
  (``$DS4_SERVER_LOCK``, else ``ds4-server.lock`` in the temporary directory), taken before the
  model loads; a second instance prints who holds it and exits 1 before it is ready;
- ``--ssd-streaming-cache-experts <N>GB`` only with ``--ssd-streaming``; unknown flags exit 2;
- it listens (``--host 127.0.0.1 --port P``) only once the model is loaded; readiness is
  ``GET /v1/models`` and there is no ``/health`` (404);
- strictly serial (D4): a chat request that arrives while another runs is refused with 503.

Its HTTP skeleton (JSON answers, the body read, server-sent events) is
:class:`hostler.testing.fake_server.JsonHandler`; what is here is ds4's own protocol.

Test knobs (environment, never flags, so the command line stays ds4-server's):
``FAKE_DS4_LOAD_SECONDS`` (load time, default 0.1), ``FAKE_DS4_FAIL_LOAD`` (print this line
while loading and exit 1), ``FAKE_DS4_REPLY_SECONDS`` (time per reply),
``FAKE_DS4_WORD_SECONDS`` (a pause before each streamed word after the first: a stream that
lasts), ``FAKE_DS4_CRASH_ON`` (abort on the Nth chat request, after printing a CUDA
illegal-memory-access line).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import sys
import tempfile
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from hostler.testing.fake_server import JsonHandler

__all__ = ["lock_path", "main"]

_CACHE = re.compile(r"^([1-9][0-9]*)GB$")


def lock_path() -> Path:
    """The machine's ds4-server lock file (``$DS4_SERVER_LOCK`` overrides it)."""
    named = os.environ.get("DS4_SERVER_LOCK")
    return Path(named) if named else Path(tempfile.gettempdir()) / "ds4-server.lock"


def _say(text: str) -> None:
    print(f"ds4-server: {text}", flush=True)


def _fail(text: str, code: int = 1) -> int:
    _say(f"error: {text}")
    return code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ds4-server", allow_abbrev=False)
    parser.add_argument("--model", required=True)
    parser.add_argument("--metal", action="store_true")
    parser.add_argument("--cuda", action="store_true")
    parser.add_argument("--ctx", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--kv-disk-dir")
    parser.add_argument("--kv-disk-space-mb", type=int, default=4096)
    parser.add_argument("--cors", action="store_true")
    parser.add_argument("--ssd-streaming", action="store_true")
    parser.add_argument("--ssd-streaming-cache-experts")
    parser.add_argument("--chdir")
    return parser


def _check(args: argparse.Namespace) -> str:
    """The first reason ds4-server refuses these flags, or ""."""
    cache = args.ssd_streaming_cache_experts
    refusals = [
        (
            args.metal == args.cuda,
            "choose one GPU backend, --metal or --cuda (ds4 never runs on CPU)",
        ),
        (args.metal and sys.platform != "darwin", "--metal needs macOS"),
        (args.ctx <= 0, f"--ctx must be positive, not {args.ctx}"),
        (
            args.kv_disk_space_mb <= 0,
            f"--kv-disk-space-mb must be positive, not {args.kv_disk_space_mb}",
        ),
        (
            cache is not None and not args.ssd_streaming,
            "--ssd-streaming-cache-experts needs --ssd-streaming",
        ),
        (
            cache is not None and not _CACHE.match(cache),
            f"--ssd-streaming-cache-experts {cache}: use <N>GB",
        ),
        (args.host != "127.0.0.1", f"--host {args.host}: this build binds 127.0.0.1 only"),
    ]
    return next((why for refused, why in refusals if refused), "")


def _enter(directory: str | None) -> str:
    """Move to ``--chdir`` and find the shaders there: why not, or ""."""
    if directory:
        try:
            os.chdir(directory)
        except OSError as exc:
            return f"--chdir {directory}: {exc.strerror or exc}"
    if not Path("shaders").is_dir():
        return (
            f"cannot load shaders from {Path.cwd() / 'shaders'} (run from the ds4 "
            "directory or pass --chdir)"
        )
    return ""


def _take_lock() -> tuple[int | None, str]:
    """The locked file descriptor, or None and who holds the lock."""
    path = lock_path()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        return None, f"another ds4-server instance is running (pid {holder} holds {path})"
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd, ""


def _load(model: Path) -> str:
    try:
        with model.open("rb") as handle:
            magic = handle.read(4)
    except OSError as exc:
        return f"failed to load model {model}: {exc.strerror or exc}"
    if magic != b"GGUF":
        return f"failed to load model {model}: not a GGUF file"
    failure = os.environ.get("FAKE_DS4_FAIL_LOAD")
    if failure:
        _say(failure)
        return f"failed to load model {model}"
    time.sleep(float(os.environ.get("FAKE_DS4_LOAD_SECONDS", "0.1")))
    return ""


class _Engine:
    """What the HTTP handlers share: the model's name, the serial gate, the request count."""

    def __init__(self, model: Path, ctx: int) -> None:
        self.model = model.stem
        self.ctx = ctx
        self.busy = threading.Lock()
        self.count = 0
        self.crash_on = int(os.environ.get("FAKE_DS4_CRASH_ON", "0"))
        self.reply_seconds = float(os.environ.get("FAKE_DS4_REPLY_SECONDS", "0"))
        self.word_seconds = float(os.environ.get("FAKE_DS4_WORD_SECONDS", "0"))


def _handler(engine: _Engine) -> type[JsonHandler]:
    class Handler(JsonHandler):
        def error_body(self, status: int, message: str) -> object:
            """ds4-server's error shape: ``{"error": {"message": ...}}``."""
            del status
            return {"error": {"message": message}}

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                model = {"id": engine.model, "object": "model", "owned_by": "ds4"}
                self.send_json(200, {"object": "list", "data": [{**model, "ctx": engine.ctx}]})
            else:
                self.send_error_json(404, f"no route {self.path}")

        def do_POST(self) -> None:
            raw = self.read_body()
            if raw is None:
                return
            if self.path != "/v1/chat/completions":
                self.send_error_json(404, f"no route {self.path}")
                return
            try:
                body = json.loads(raw)
                messages = body["messages"]
                text = str(messages[-1]["content"])
            except (ValueError, KeyError, IndexError, TypeError):
                self.send_error_json(400, "a chat request needs messages")
                return
            if not engine.busy.acquire(blocking=False):
                self.send_error_json(503, "ds4-server serves one request at a time")
                return
            try:
                engine.count += 1
                if engine.crash_on and engine.count >= engine.crash_on:
                    _say("CUDA error: an illegal memory access was encountered")
                    os.abort()
                time.sleep(engine.reply_seconds)
                self._answer(body, f"ds4 says: {text[:40]}")
            finally:
                engine.busy.release()

        def _answer(self, body: dict[str, Any], reply: str) -> None:
            usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
            if not body.get("stream"):
                choice = {"index": 0, "message": {"role": "assistant", "content": reply}}
                answer = {"object": "chat.completion", "model": engine.model, "usage": usage}
                self.send_json(200, {**answer, "choices": [{**choice, "finish_reason": "stop"}]})
                return
            self.start_events()
            for number, word in enumerate(reply.split(" ")):
                if number:
                    self.wfile.flush()
                    time.sleep(engine.word_seconds)
                delta = {"index": 0, "delta": {"content": word + " "}}
                self.send_event({"object": "chat.completion.chunk", "choices": [delta]})
            self.send_event({"object": "chat.completion.chunk", "choices": [], "usage": usage})
            self.end_events()

    return Handler


def _prepare(args: argparse.Namespace) -> str:
    """Everything before listening, in ds4-server's order: why it stops, or ""."""
    problem = _check(args) or _enter(args.chdir)
    if problem:
        return problem
    lock, holder = _take_lock()
    if lock is None:
        return holder
    backend = "metal" if args.metal else "cuda"
    streaming = f"ssd-streaming {args.ssd_streaming_cache_experts or 'default'} cache"
    _say(f"backend {backend}, ctx {args.ctx}, {streaming if args.ssd_streaming else 'resident'}")
    if args.kv_disk_dir:
        Path(args.kv_disk_dir).mkdir(parents=True, exist_ok=True)
        _say(f"disk KV cache {args.kv_disk_dir} ({args.kv_disk_space_mb} MB)")
    return _load(Path(args.model))


def main(argv: list[str] | None = None) -> int:
    """Run the fake ds4-server; the exit status ds4-server would give."""
    args = _parser().parse_args(argv)
    problem = _prepare(args)
    if problem:
        return _fail(problem)
    engine = _Engine(Path(args.model), args.ctx)
    try:
        server = ThreadingHTTPServer((args.host, args.port), _handler(engine))
    except OSError as exc:
        return _fail(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}")
    _say(f"listening on http://{args.host}:{args.port}")
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
