"""L16: the llama.cpp cache adapter against a tiny HTTP server, then against llama-server."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest

from hostler.plugin import CacheAdapter, CacheEntry, EngineAdapter, LaunchSpec
from hostler.testing.tiny_gguf import write_tiny_llama
from hostler_llamacpp import LlamaCppAdapter
from hostler_llamacpp.cache import (
    SLOTS_FILE,
    LlamaCacheAdapter,
    model_stamp,
    retire_other_versions,
    session_filename,
)

pytestmark = pytest.mark.anyio
UNIT = 102_400


class FakeServer:
    """Answers ``/slots`` actions with a canned status and records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.status = 200
        self.slots: Any = [{"id": 0, "n_ctx": 512}, {"id": 1, "n_ctx": 512}]
        self.slots_status = 200
        self.save_dir: Path | None = None  # where a save writes its file, as llama-server does
        self.short_by = 0  # a save writes this much less than it says (a full disk)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _reply(self, status: int, data: Any) -> None:
                raw = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                server.calls.append(("GET", self.path, None))
                self._reply(server.slots_status, server.slots)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                server.calls.append(("POST", self.path, body))
                if server.status == 200 and "restore" in self.path:
                    self._reply(200, {"n_restored": 37})
                elif server.status == 200 and "save" in self.path:
                    if server.save_dir is not None and body is not None:
                        target = server.save_dir / body["filename"]
                        target.write_bytes(b"k" * (3456 - server.short_by))
                    self._reply(200, {"n_saved": 12, "n_written": 3456})
                else:
                    self._reply(server.status, {"error": {"code": server.status}})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def posts(self) -> list[tuple[str, Any]]:
        return [(path, body) for method, path, body in self.calls if method == "POST"]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[FakeServer]:
    fake = FakeServer()
    yield fake
    fake.close()


def names(folder: Path) -> list[str]:
    """The session files and the version file (the slot table is checked on its own)."""
    return sorted(path.name for path in folder.iterdir() if path.name != SLOTS_FILE)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        self.now += 1
        return self.now


def adapter(server: FakeServer, save_dir: Path | None, slots: int = 2) -> LlamaCacheAdapter:
    server.save_dir = save_dir
    return LlamaCacheAdapter(server.port, slots, save_dir, clock=Clock(), timeout=5)


ERASE0 = ("/slots/0?action=erase", None)


def test_it_is_a_cache_adapter_and_refuses_zero_slots() -> None:
    assert isinstance(LlamaCacheAdapter(1, 1, None), CacheAdapter)
    with pytest.raises(ValueError, match="at least one slot, not 0"):
        LlamaCacheAdapter(1, 0, None)


def test_session_file_names() -> None:
    assert session_filename("abc-1_X") == "sess-abc-1_X.bin"
    hashed = session_filename("../etc/passwd")
    digest = hashlib.sha256(b"../etc/passwd").hexdigest()[:40]
    assert hashed == f"sess-{digest}.h.bin"
    assert "/" not in hashed
    # found by a breaking helper: a client sending another session's hash as its own id named
    # that session's file; a hashed name now has a shape no plain id makes
    assert session_filename(digest) == f"sess-{digest}.bin" != hashed
    assert session_filename(digest[:32]) != session_filename("alice@example.com")
    # a lone surrogate (JSON's "\ud800") is an id like any other, not a crash
    assert session_filename("\ud800").endswith(".h.bin")
    assert session_filename("x" * 65) != f"sess-{'x' * 65}.bin"
    assert session_filename("x" * 64) == f"sess-{'x' * 64}.bin"


def test_request_extras_bind_sessions_to_launched_slots_then_recycle_lru() -> None:
    cache = LlamaCacheAdapter(1, 2, None, clock=Clock())
    assert cache.request_extras("a") == {"cache_prompt": True, "id_slot": 0}
    assert cache.request_extras("b") == {"cache_prompt": True, "id_slot": 1}
    assert cache.request_extras("a")["id_slot"] == 0  # touches a: b is now the LRU
    assert cache.request_extras("c")["id_slot"] == 1
    assert (cache.slot_of("a"), cache.slot_of("b"), cache.slot_of("c")) == (0, None, 1)
    assert cache.slots == 2


def test_one_slot_engine_shares_its_only_slot() -> None:
    cache = LlamaCacheAdapter(1, 1, None, clock=Clock())
    assert [cache.request_extras(s)["id_slot"] for s in ("a", "b", "a")] == [0, 0, 0]
    assert cache.slot_of("a") == 0 and cache.slot_of("b") is None


async def test_prepare_saves_the_victim_then_restores_the_session(
    server: FakeServer, tmp_path: Path
) -> None:
    cache = adapter(server, tmp_path, slots=1)
    assert (await cache.prepare("a")).source == "fresh"  # no file: no restore asked
    assert server.posts() == [ERASE0]  # what the slot held before is not a's to read
    server.calls.clear()
    assert (await cache.prepare("a")).source == "memory"
    (tmp_path / "sess-b.bin").write_bytes(b"kv")
    b = await cache.prepare("b")
    assert (b.source, b.fields, b.restored_tokens, b.error) == (
        "disk",
        {"cache_prompt": True, "id_slot": 0},
        37,
        "",
    )
    assert b.displaced is not None
    assert (b.displaced.session_id, b.displaced.tokens, b.displaced.bytes) == ("a", 12, 3456)
    assert b.displaced.error == ""
    assert server.posts() == [
        ("/slots/0?action=save", {"filename": "sess-a.bin.part"}),
        ("/slots/0?action=restore", {"filename": "sess-b.bin"}),
    ]
    assert cache.slot_of("b") == 0 and cache.slot_of("a") is None
    assert (tmp_path / "sess-a.bin").stat().st_size == 3456  # the partial became a's file


async def test_a_failed_restore_is_a_fresh_start(server: FakeServer, tmp_path: Path) -> None:
    cache = adapter(server, tmp_path)
    (tmp_path / "sess-a.bin").write_bytes(b"kv")
    server.status = 400
    a = await cache.prepare("a")
    assert (a.source, a.error) == (
        "fresh",
        "llama-server did not restore sess-a.bin; the file was deleted",
    )
    assert cache.slot_actions is True  # only 501 latches
    assert server.posts() == [("/slots/0?action=restore", {"filename": "sess-a.bin"}), ERASE0]
    # found by a breaking helper: a cut-short file crashed llama-server at every restore, and
    # the model was fatal for everyone; a file that failed once is gone
    assert not (tmp_path / "sess-a.bin").exists()


async def test_a_501_latches_slot_actions_off_and_says_so_once(
    server: FakeServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = adapter(server, tmp_path, slots=1)
    server.status = 501
    with caplog.at_level(logging.WARNING, logger="hostler_llamacpp.cache"):
        await cache.prepare("a")  # its slot's erase -> 501: latched off
        assert (await cache.prepare("b")).source == "fresh"  # a is not saved
        assert cache.slot_actions is False
        (tmp_path / "sess-a.bin").write_bytes(b"kv")
        assert (await cache.prepare("a")).source == "fresh"  # neither save nor restore tried
        assert await cache.save("a") is False
        await cache.evict(["a"])
    assert server.posts() == [ERASE0]
    assert caplog.text.count("has no slot save/restore (HTTP 501 to erase)") == 1
    assert cache.request_extras("b") == {"cache_prompt": True, "id_slot": 0}
    assert not (tmp_path / "sess-a.bin").exists()  # evict still deletes the file


async def test_without_a_save_dir_nothing_is_ever_saved(server: FakeServer) -> None:
    cache = adapter(server, None, slots=1)
    assert cache.slot_actions is False
    await cache.prepare("a")
    await cache.prepare("b")
    await cache.flush()
    await cache.evict(["b"])
    assert server.posts() == []


async def test_evict_erases_bound_slots_and_deletes_files(
    server: FakeServer, tmp_path: Path
) -> None:
    cache = adapter(server, tmp_path)
    await cache.prepare("a")
    await cache.prepare("b")
    server.calls.clear()
    (tmp_path / "sess-a.bin").write_bytes(b"kv")
    (tmp_path / "sess-gone.bin").write_bytes(b"kv")
    await cache.evict(["a", "gone", "never"])
    assert server.posts() == [("/slots/0?action=erase", None)]
    assert cache.slot_of("a") is None and cache.slot_of("b") == 1
    assert names(tmp_path) == []
    assert cache.request_extras("c")["id_slot"] == 0  # the erased slot is free again


async def test_a_file_that_cannot_be_deleted_does_not_stop_the_others(
    server: FakeServer, tmp_path: Path
) -> None:
    cache = adapter(server, tmp_path)
    (tmp_path / "sess-stuck.bin").mkdir()  # unlink fails on a directory
    (tmp_path / "sess-a.bin").write_bytes(b"kv")
    await cache.evict(["stuck", "a"])
    assert names(tmp_path) == ["sess-stuck.bin"]


async def test_flush_saves_every_bound_slot(server: FakeServer, tmp_path: Path) -> None:
    cache = adapter(server, tmp_path, slots=3)
    await cache.prepare("a")
    await cache.prepare("b")
    server.calls.clear()
    assert await cache.flush() == 2
    assert server.posts() == [  # the most recently used first: a stop's time may run out
        ("/slots/1?action=save", {"filename": "sess-b.bin.part"}),
        ("/slots/0?action=save", {"filename": "sess-a.bin.part"}),
    ]
    assert await cache.save("unbound") is False
    saved = await cache.save_all()
    assert [(s.session_id, s.tokens, s.bytes, s.error) for s in saved] == [
        ("b", 12, 3456, ""),
        ("a", 12, 3456, ""),
    ]
    server.status = 500
    (failed,) = [s for s in await cache.save_all() if s.session_id == "a"]
    assert (failed.tokens, failed.bytes, failed.error) == (
        0,
        0,
        "llama-server did not save; the previous file is kept",
    )
    assert (tmp_path / "sess-a.bin").stat().st_size == 3456  # the last good one


async def test_a_save_cut_short_keeps_the_previous_file_and_counts_nothing(
    server: FakeServer, tmp_path: Path
) -> None:
    """Found by a breaking helper on a full disk: llama-server said it wrote 383,616 bytes and
    left 380,928 over the session's good file (whose next restore then failed), and a failed
    save left a cut-short file that crashed the engine when restored. A save goes to a partial
    file that becomes the session's only when its size is what the engine said it wrote."""
    cache = adapter(server, tmp_path, slots=1)
    await cache.prepare("a")
    good = await cache.save_session("a")
    assert (good.bytes, good.error) == (3456, "")
    server.short_by = 100  # the disk fills mid-save
    cut = await cache.save_session("a")
    assert (cut.bytes, cut.error) == (
        0,
        "llama-server wrote a short or no file for sess-a.bin; the previous file is kept",
    )
    assert names(tmp_path) == ["sess-a.bin"]  # no partial left behind
    assert (tmp_path / "sess-a.bin").stat().st_size == 3456


async def test_report_usage_from_slots(server: FakeServer, tmp_path: Path) -> None:
    cache = adapter(server, tmp_path, slots=3)
    await cache.prepare("a")
    (tmp_path / "sess-b.bin").write_bytes(b"kv")
    await cache.prepare("b")  # restored 37 tokens
    await cache.prepare("c")
    server.slots = [
        {"id": 0, "n_prompt_tokens": 12},
        {"id": 1},  # says nothing: the restore's count
        {"id": 2, "n_cache_tokens": 5, "n_prompt_tokens": 99},  # the older field wins
        "junk",
        {"id": "x"},
    ]
    usage = await cache.report_usage()
    assert usage == [
        CacheEntry("a", 12, 12 * UNIT, 101.0),
        CacheEntry("b", 37, 37 * UNIT, 102.0),
        CacheEntry("c", 5, 5 * UNIT, 103.0),
    ]
    server.slots = [{"id": 0}, {"id": 1}, {"id": 2}]
    assert [e.session_id for e in await cache.report_usage() or []] == ["b"]


@pytest.mark.parametrize(("status", "body"), [(501, []), (404, []), (200, {"slots": []})])
async def test_report_usage_is_none_when_the_engine_cannot_tell(
    server: FakeServer, status: int, body: Any
) -> None:
    server.slots_status, server.slots = status, body
    assert await adapter(server, None).report_usage() is None


async def test_an_engine_that_is_not_there_is_not_an_error(tmp_path: Path) -> None:
    cache = LlamaCacheAdapter(1, 1, tmp_path, timeout=2)  # nothing listens on port 1
    assert await cache.report_usage() is None
    await cache.prepare("a")
    (tmp_path / "sess-b.bin").write_bytes(b"kv")
    assert (await cache.prepare("b")).source == "fresh"
    assert cache.slot_actions is True


def spec(**kw: Any) -> LaunchSpec:
    return LaunchSpec(key="llamacpp:m:0", model=Path("m.gguf"), port=4321, ctx_per_slot=512, **kw)


def test_the_llamacpp_adapter_builds_one_sized_by_the_launched_slots(tmp_path: Path) -> None:
    made = LlamaCppAdapter().cache_adapter(spec(slots=3, work_dir=tmp_path))
    assert isinstance(made, LlamaCacheAdapter)
    assert made.slots == 3 and made.slot_actions is True
    overridden = LlamaCppAdapter().cache_adapter(
        spec(slots=3, work_dir=tmp_path, extra_args={"parallel": 1, "--slot-save-path": False})
    )
    assert isinstance(overridden, LlamaCacheAdapter)
    assert overridden.slots == 1 and overridden.slot_actions is False
    short = LlamaCppAdapter().cache_adapter(spec(slots=2, extra_args={"-np": "4"}))
    assert isinstance(short, LlamaCacheAdapter)
    assert short.slots == 4 and short.slot_actions is False  # no work dir, no saving
    moved = LlamaCppAdapter().cache_adapter(spec(extra_args={"slot-save-path": str(tmp_path)}))
    assert isinstance(moved, LlamaCacheAdapter) and moved.slot_actions is True


def test_the_default_engine_adapter_has_no_cache() -> None:
    class Bare(EngineAdapter):
        engine_type = "bare"

        def build_command(self, spec: LaunchSpec) -> Any:
            raise NotImplementedError

    assert Bare().cache_adapter(spec()) is None


# -- the real llama-server ---------------------------------------------------------------------


def _chat(port: int, slot: int, text: str) -> dict[str, Any]:
    body = json.dumps(
        {
            "messages": [{"role": "user", "content": text}],
            "temperature": 0,
            "max_tokens": 2,
            "cache_prompt": True,
            "id_slot": slot,
        }
    ).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _serve(tmp_path: Path, work_dir: Path | None) -> tuple[subprocess.Popen[bytes], LaunchSpec]:
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    launch = LaunchSpec(
        "llamacpp:tiny:0", model, _free_port(), ctx_per_slot=512, slots=1, work_dir=work_dir
    )
    command = LlamaCppAdapter().build_command(launch)
    process = subprocess.Popen(
        command.argv,
        env={**os.environ, **command.env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{launch.port}/health", timeout=2):
                return process, launch
        except OSError:
            if process.poll() is not None:
                break
            time.sleep(0.1)
    process.kill()
    process.wait()
    pytest.fail("llama-server did not get ready")


async def test_real_llama_server_saves_and_restores_a_session_across_one_slot(
    tmp_path: Path,
) -> None:
    slots_dir = tmp_path / "slots"
    slots_dir.mkdir()
    process, launch = _serve(tmp_path, slots_dir)
    try:
        cache = LlamaCppAdapter().cache_adapter(launch)
        assert isinstance(cache, LlamaCacheAdapter)
        assert (await cache.prepare("alice")).source == "fresh"
        first = await anyio.to_thread.run_sync(
            _chat, launch.port, cache.request_extras("alice")["id_slot"], "tell me about cats"
        )
        usage = await cache.report_usage()
        assert usage is not None and [e.session_id for e in usage] == ["alice"]
        assert usage[0].tokens >= first["usage"]["prompt_tokens"] > 0
        assert (
            await cache.prepare("bob")
        ).source == "fresh"  # alice's slot is saved, then recycled
        assert (slots_dir / "sess-alice.bin").stat().st_size > 0
        await anyio.to_thread.run_sync(_chat, launch.port, 0, "and dogs?")
        assert (await cache.prepare("alice")).source == "disk"  # bob saved, alice restored
        again = await anyio.to_thread.run_sync(_chat, launch.port, 0, "tell me about cats")
        assert again["timings"]["cache_n"] > 0  # the restored prompt was reused
        assert names(slots_dir) == ["sess-alice.bin", "sess-bob.bin", "sessions.version"]
        (saved,) = await cache.save_all()  # one slot: alice's
        assert saved.session_id == "alice" and saved.error == ""
        assert saved.tokens >= again["usage"]["prompt_tokens"] > 0
        assert saved.bytes == (slots_dir / "sess-alice.bin").stat().st_size
        await cache.evict(["alice", "bob"])
        assert names(slots_dir) == ["sessions.version"]
        assert cache.slot_actions is True
    finally:
        process.kill()
        process.wait()


async def test_real_llama_server_without_a_save_path_latches_off(tmp_path: Path) -> None:
    process, launch = _serve(tmp_path, None)
    try:
        cache = LlamaCacheAdapter(launch.port, 1, tmp_path)  # we think it saves; it does not
        await cache.prepare("a")
        await anyio.to_thread.run_sync(_chat, launch.port, 0, "hello")
        assert (await cache.prepare("b")).source == "fresh"
        assert cache.slot_actions is False
    finally:
        process.kill()
        process.wait()


async def test_session_files_of_another_model_version_are_never_restored(
    server: FakeServer, tmp_path: Path
) -> None:
    """Issue 20: a session file saved by another model (or window, or KV type) would restore a
    state the engine cannot use: the first use of a save directory retires such files."""
    model = tmp_path / "model.gguf"
    model.write_bytes(b"weights v1")
    save = tmp_path / "slots"
    save.mkdir()

    def cache_for(version: str) -> LlamaCacheAdapter:
        return LlamaCacheAdapter(server.port, 1, save, clock=Clock(), version=version, model=model)

    (save / "sess-a.bin").write_bytes(b"kv of an unknown version")
    assert (await cache_for("m|ctx=512").prepare("a")).source == "fresh"  # retired, not restored
    assert names(save) == ["sessions.version"]
    (save / "sess-a.bin").write_bytes(b"kv of this version")
    assert (await cache_for("m|ctx=512").prepare("a")).source == "disk"  # the same version
    assert (await cache_for("m|ctx=1024").prepare("a")).source == "fresh"  # another window
    assert names(save) == ["sessions.version"]
    (save / "sess-a.bin").write_bytes(b"kv")
    model.write_bytes(b"weights v2, replaced")  # the model file itself changed
    assert (await cache_for("m|ctx=1024").prepare("a")).source == "fresh"
    assert names(save) == ["sessions.version"]
    (save / "sess-a.bin").write_bytes(b"kv")
    assert retire_other_versions(save, "m|ctx=1024" + model_stamp(model)) == 0  # its own: kept


async def test_a_model_replaced_under_its_running_engine_does_not_adopt_that_engines_states(
    server: FakeServer, tmp_path: Path
) -> None:
    """The version is stamped when the launch's adapter is made: states saved by an engine
    still running the old weights are not taken for the new file's at its next launch."""
    model = tmp_path / "model.gguf"
    model.write_bytes(b"weights v1")
    save = tmp_path / "slots"
    save.mkdir()
    running = LlamaCacheAdapter(server.port, 1, save, clock=Clock(), version="m", model=model)
    model.write_bytes(b"weights v2, written while the engine runs v1")
    await running.prepare("a")
    await running.prepare("b")  # a's slot is saved: a state of v1
    (save / "sess-a.bin").write_bytes(b"kv of v1")  # the fake server writes nothing: as it would
    relaunched = LlamaCacheAdapter(server.port, 1, save, clock=Clock(), version="m", model=model)
    assert (await relaunched.prepare("a")).source == "fresh"  # v1's state is never restored
    assert names(save) == ["sessions.version"]


async def test_saved_sizes_tells_the_files_this_engine_can_restore_and_discard_deletes(
    tmp_path: Path,
) -> None:
    """CC14: what the disk budget counts is each file's real size; another version's files
    are deleted and left out; ``discard`` needs no engine (this one has none)."""
    save = tmp_path / "slots"
    save.mkdir()
    (save / "sess-a.bin").write_bytes(b"k" * 1234)
    (save / "sess-b.bin").write_bytes(b"k" * 10)
    other = LlamaCacheAdapter(1, 1, save, clock=Clock(), version="other-model")
    assert await other.saved_sizes(["a", "b", "never"]) == {}  # another version: deleted
    assert names(save) == ["sessions.version"]
    (save / "sess-a.bin").write_bytes(b"k" * 1234)
    (save / "sess-b.bin").write_bytes(b"k" * 10)
    again = LlamaCacheAdapter(1, 1, save, clock=Clock(), version="other-model")
    assert await again.saved_sizes(["a", "b", "never"]) == {"a": 1234, "b": 10}
    await again.discard(["a", "never"])
    assert names(save) == ["sess-b.bin", "sessions.version"]
    assert await LlamaCacheAdapter(1, 1, None).saved_sizes(["b"]) == {}  # no save dir: none


def test_a_state_saved_by_another_engine_build_is_another_version(tmp_path: Path) -> None:
    """CC14: the engine build is part of what a saved state depends on."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights")
    one, two = tmp_path / "one" / "llama-server", tmp_path / "two" / "llama-server"
    for binary, body in ((one, b"#!/bin/sh\n"), (two, b"#!/bin/sh\n# another build\n")):
        binary.parent.mkdir()
        binary.write_bytes(body)
        binary.chmod(0o755)

    def version(binary: Path) -> str:
        made = LlamaCppAdapter().cache_adapter(
            LaunchSpec("llamacpp:m:0", model, 4321, ctx_per_slot=512, work_dir=tmp_path,
                       binary=binary)
        )  # fmt: skip
        assert isinstance(made, LlamaCacheAdapter)
        return made.version

    assert version(one) != version(two)
    assert version(one) == version(one)
    assert "|build=" in version(one)


async def test_an_adopted_engine_keeps_each_session_on_its_slot(
    server: FakeServer, tmp_path: Path
) -> None:
    """CC13: a restarted daemon's adapter for the engine it adopted (same port, same version)
    reads the slot table the earlier one wrote: each session is still held (``memory``), in
    its own slot. A new launch (another port) or another version starts with none."""
    save = tmp_path / "slots"
    first = LlamaCacheAdapter(server.port, 2, save, clock=Clock(), version="v")
    assert (await first.prepare("ana")).fields["id_slot"] == 0
    assert (await first.prepare("bo")).fields["id_slot"] == 1
    table = json.loads((save / SLOTS_FILE).read_text())
    assert table["bound"] == ["ana", "bo"] and table["port"] == server.port
    server.slots = [{"id": 0, "n_ctx": 512, "n_prompt_tokens": 40}, {"id": 1, "n_ctx": 512}]
    fresh_engine = LlamaCacheAdapter(server.port, 2, save, clock=Clock(), version="v", recall=True)
    # slot 1 is unused: not the engine that held bo (a new one on a reused port), so bo is
    # restored from its file (none here) rather than taken as held
    assert (await fresh_engine.prepare("bo")).source == "fresh"
    assert fresh_engine.slot_of("ana") == 0
    server.slots = [
        {"id": 0, "n_ctx": 512, "n_prompt_tokens": 40},
        {"id": 1, "n_ctx": 512, "n_cache_tokens": 12},
    ]
    first = LlamaCacheAdapter(server.port, 2, save, clock=Clock(), version="v")
    await first.prepare("ana")
    await first.prepare("bo")
    adopted = LlamaCacheAdapter(server.port, 2, save, clock=Clock(), version="v", recall=True)
    back = await adopted.prepare("bo")
    assert (back.source, back.fields["id_slot"]) == ("memory", 1)
    assert set(adopted.held_sessions()) == {"ana", "bo"}
    # found by the benchmark: a launch made now that got the same port (and served a one-shot
    # on slot 1 first) passed for the adopted one; a new launch never recalls
    same_port = LlamaCacheAdapter(server.port, 2, save, clock=Clock(), version="v")
    assert (await same_port.prepare("bo")).source == "fresh"
    await first.prepare("bo")  # the table names bo again
    relaunched = LlamaCacheAdapter(
        server.port + 1, 2, save, clock=Clock(), version="v", recall=True
    )
    assert (await relaunched.prepare("bo")).source == "fresh"
    other = LlamaCacheAdapter(server.port, 2, save, clock=Clock(), version="v2", recall=True)
    assert (await other.prepare("bo")).source == "fresh"
    (save / SLOTS_FILE).write_text(
        json.dumps({"port": server.port, "version": "v", "bound": ["x"]})
    )
    wrong = LlamaCacheAdapter(server.port, 2, save, clock=Clock(), version="v", recall=True)
    assert (await wrong.prepare("bo")).source == "fresh"  # a table of another width: ignored


def test_a_model_replaced_by_one_of_the_same_size_and_time_is_another_version(
    tmp_path: Path,
) -> None:
    """Found by a breaking helper: weights replaced by others of the same size, their time
    put back (cp -p, rsync -a, touch -r), were restored onto; the stamp samples the content.
    Found by the benchmark: a hard link to the model (its ctime moves) made every saved state
    another version's; a link, a rename or a chmod changes no stamp."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights one" * 50_000)
    before = model_stamp(model)
    os.link(model, tmp_path / "linked.gguf")
    model.chmod(0o600)
    assert model_stamp(model) == before
    facts = model.stat()
    with model.open("r+b") as handle:  # cp -p over it: same size, time put back
        handle.seek(300_000)
        handle.write(b"other")
    os.utime(model, ns=(facts.st_atime_ns, facts.st_mtime_ns))
    assert model.stat().st_size == facts.st_size and model.stat().st_mtime_ns == facts.st_mtime_ns
    assert model_stamp(model) != before


async def test_an_engine_that_stopped_answering_is_polled_less_and_less_and_said_once(
    server: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 21: a stopped engine's ``GET /slots`` failed every 5 s, each time an INFO line."""
    now = [1000.0]
    cache = LlamaCacheAdapter(server.port, 1, None, clock=lambda: now[0], timeout=2)
    assert await cache.report_usage() == []
    server.close()  # the engine is gone: its port refuses
    caplog.set_level(logging.DEBUG, logger="hostler_llamacpp.cache")
    polled_at = []
    for _ in range(60):  # five minutes of the controller's polls, one every 5 s
        before = len(caplog.records)
        assert await cache.report_usage() is None
        if len(caplog.records) > before:
            polled_at.append(now[0] - 1000.0)
        now[0] += 5.0
    assert polled_at == [0.0, 5.0, 15.0, 35.0, 75.0, 155.0]  # paused 5, 10, 20, 40, 80 s
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert len(said) == 1
    assert said[0].startswith("llama-server GET /slots failed: ") and "paused" in said[0]
