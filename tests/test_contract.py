"""The completed adapter contract against real processes: readiness, models, extra_args.

A scripted engine (a real Python HTTP server) answers ``/health`` with 200 while it is still
loading — as ``mlx_lm.server`` does — so a status-only readiness check is fooled by it; the
body check, the probe request and the ready line each wait for the real load (RD1).
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest

from hostler import EventStore
from hostler.capacity.budget import HostMemory, compute_budget
from hostler.capacity.geometry import ModelGeometry
from hostler.capacity.learning import Calibration
from hostler.capacity.ledger import LedgerState
from hostler.capacity.slots import slot_ceiling
from hostler.engines.http import probe_response, probe_status
from hostler.engines.price import LaunchRequest, price_engine
from hostler.engines.supervisor import Supervisor, SupervisorPolicy
from hostler.errors import EngineStartError, ModelFileError, PluginError
from hostler.events.calibration import CALIBRATION_STREAM, FootprintMeasured
from hostler.plugin import (
    EngineAdapter,
    LaunchCommand,
    LaunchSpec,
    ReadinessProbe,
    check_model_path,
    extra_args_argv,
    json_fields_match,
    launch_command,
)
from hostler.testing.tiny_gguf import write_tiny_llama
from hostler_llamacpp import LlamaCppAdapter

pytestmark = pytest.mark.anyio
GIB = 2**30

#: argv: port, out folder, load seconds, model. Writes its argv to out/argv.json; after the
#: load it writes out/loaded, then says "model loaded" on its output. /health answers 200
#: all along (JSON status loading/ok); POST /v1/completions answers 503 until loaded.
SCRIPT = textwrap.dedent(
    """
    import http.server, json, pathlib, sys, threading, time

    port, out, load = int(sys.argv[1]), pathlib.Path(sys.argv[2]), float(sys.argv[3])
    out.joinpath("argv.json").write_text(json.dumps(sys.argv))
    loaded = threading.Event()

    def loader():
        time.sleep(load)
        out.joinpath("loaded").write_text("1")
        loaded.set()
        print("model loaded, serving", flush=True)

    class Handler(http.server.BaseHTTPRequestHandler):
        def answer(self, status, body, chunked=False):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            if chunked:
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                half = len(data) // 2
                for part in (data[:half], data[half:]):
                    self.wfile.write(b"%x\\r\\n%s\\r\\n" % (len(part), part))
                self.wfile.write(b"0\\r\\n\\r\\n")
                return
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            state = "ok" if loaded.is_set() else "loading"
            self.answer(200, {"status": state, "model": {"loaded": loaded.is_set()}},
                        chunked=self.path == "/chunked")

        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            with out.joinpath("probes.jsonl").open("ab") as f:
                f.write(body + b"\\n")
            if loaded.is_set():
                self.answer(200, {"choices": [{"text": "x"}]})
            else:
                self.answer(503, {"error": "loading"})

        def log_message(self, *args):
            pass

    print("listening (model still loading)", flush=True)
    threading.Thread(target=loader, daemon=True).start()
    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
    """
)


class Scripted(EngineAdapter):
    """Runs :data:`SCRIPT`; readiness as the test says."""

    engine_type = "scripted"

    def __init__(self, folder: Path, load: float = 1.5, probe: ReadinessProbe | None = None):
        self.script = folder / "scripted_engine.py"
        self.script.write_text(SCRIPT)
        self.out = folder
        self.load = load
        self.probe = probe

    def build_command(self, spec: LaunchSpec) -> LaunchCommand:
        return LaunchCommand(
            [
                sys.executable,
                str(self.script),
                str(spec.port),
                str(self.out),
                str(self.load),
                str(spec.model),
            ]
        )

    def readiness(self, spec: LaunchSpec) -> ReadinessProbe:
        return self.probe or super().readiness(spec)


class ScriptedDir(Scripted):
    """The same engine taking a model directory (as MLX does)."""

    engine_type = "scripted-dir"
    model_kind: ClassVar[Any] = "directory"


def supervisor(
    store: EventStore,
    adapter: EngineAdapter,
    model: Path,
    work: Path,
    extra_args: dict[str, Any] | None = None,
    *,
    owned: Callable[[], Collection[int]] | None = None,
    **policy: Any,
) -> Supervisor:
    key = f"{adapter.engine_type}:m:0"
    return Supervisor(
        key,
        adapter,
        lambda port: LaunchSpec(
            key, model, port, ctx_per_slot=256, work_dir=work, extra_args=extra_args or {}
        ),
        store,
        run_dir=work.parent / "run",
        token_prefix="contract",
        policy=SupervisorPolicy(**{"watch_interval": 0.05, **policy}),
        owned=owned,
    )


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.bin"
    path.write_bytes(b"weights")
    return path


async def ready_then_stop(sup: Supervisor) -> float:
    """Start, return how long readiness took, and stop."""
    began = time.monotonic()
    try:
        await sup.ensure_running()
        return time.monotonic() - began
    finally:
        await sup.stop()


async def test_status_only_readiness_is_fooled_by_a_health_that_answers_while_loading(
    store: EventStore, tmp_path: Path, model_file: Path
) -> None:
    # the control: why RD1 exists; the default check passes before the model is loaded
    adapter = Scripted(tmp_path, load=3.0)
    sup = supervisor(store, adapter, model_file, tmp_path / "work")
    await sup.ensure_running()
    try:
        assert not (tmp_path / "loaded").exists()
    finally:
        await sup.stop()


async def test_a_json_body_check_waits_for_the_field(
    store: EventStore, tmp_path: Path, model_file: Path
) -> None:
    probe = ReadinessProbe(path="/health", expect_json={"status": "ok", "model.loaded": True})
    adapter = Scripted(tmp_path, load=1.5, probe=probe)
    took = await ready_then_stop(supervisor(store, adapter, model_file, tmp_path / "work"))
    assert (tmp_path / "loaded").exists()
    assert took >= 1.5


async def test_a_body_predicate_decides_readiness(
    store: EventStore, tmp_path: Path, model_file: Path
) -> None:
    seen: list[tuple[int, bytes]] = []

    class Predicate(Scripted):
        def is_ready_response(self, status: int, body: bytes) -> bool:
            seen.append((status, body))
            return status == 200 and b'"ok"' in body

    await ready_then_stop(supervisor(store, Predicate(tmp_path), model_file, tmp_path / "work"))
    assert (tmp_path / "loaded").exists()
    assert seen[0][0] == 200 and b'"loading"' in seen[0][1]  # it was asked while loading
    assert json.loads(seen[-1][1])["status"] == "ok"


async def test_a_probe_request_posts_a_one_token_completion_until_it_succeeds(
    store: EventStore, tmp_path: Path, model_file: Path
) -> None:
    body = json.dumps({"prompt": "hi", "max_tokens": 1}).encode()
    probe = ReadinessProbe(path="/v1/completions", method="POST", body=body, wait=5)
    adapter = Scripted(tmp_path, load=1.5, probe=probe)
    await ready_then_stop(supervisor(store, adapter, model_file, tmp_path / "work"))
    assert (tmp_path / "loaded").exists()
    sent = (tmp_path / "probes.jsonl").read_bytes().splitlines()
    assert len(sent) >= 2  # refused (503) while loading, then answered
    assert all(json.loads(line) == {"prompt": "hi", "max_tokens": 1} for line in sent)


async def test_a_ready_line_alone_decides_readiness(
    store: EventStore, tmp_path: Path, model_file: Path
) -> None:
    probe = ReadinessProbe(path=None, ready_line=r"model loaded, serving$")
    adapter = Scripted(tmp_path, load=1.5, probe=probe)
    await ready_then_stop(supervisor(store, adapter, model_file, tmp_path / "work"))
    assert (tmp_path / "loaded").exists()


async def test_a_ready_line_never_printed_times_the_start_out(
    store: EventStore, tmp_path: Path, model_file: Path
) -> None:
    probe = ReadinessProbe(path="/health", ready_line=r"^never printed$")
    adapter = Scripted(tmp_path, load=0.1, probe=probe)
    sup = supervisor(store, adapter, model_file, tmp_path / "work", startup_timeout=2.0)
    with pytest.raises(EngineStartError, match="did not become ready within 2 s"):
        await sup.ensure_running()
    assert sup.pid is None  # nothing left running


async def test_a_readiness_hook_that_returns_junk_fails_the_engine_naming_the_plugin(
    store: EventStore, tmp_path: Path, model_file: Path
) -> None:
    class Junk(Scripted):
        def readiness(self, spec: LaunchSpec) -> ReadinessProbe:
            return "/health"  # type: ignore[return-value]

    sup = supervisor(store, Junk(tmp_path), model_file, tmp_path / "work")
    with pytest.raises(PluginError, match=r"<locals>\.Junk\) returned '/health' from readiness$"):
        await sup.ensure_running()


def test_a_readiness_probe_is_checked_where_it_is_made() -> None:
    with pytest.raises(ValueError, match="needs a path, a ready_line, or both"):
        ReadinessProbe(path=None)
    with pytest.raises(ValueError, match="must start with '/'"):
        ReadinessProbe(path="health")
    with pytest.raises(ValueError, match="wait"):
        ReadinessProbe(wait=0)
    with pytest.raises(re.error, match=r"missing \)"):
        ReadinessProbe(ready_line="(")
    assert ReadinessProbe(wait=600).wait == 600


def test_json_fields_match_needs_every_field_with_its_value_and_type() -> None:
    assert json_fields_match(b'{"a": {"b": 1}, "c": "x"}', {"a.b": 1, "c": "x"})
    assert not json_fields_match(b'{"a": {"b": 1}}', {"a.b": True})  # 1 is not True
    assert not json_fields_match(b'{"a": {"b": 1}}', {"a.c": 1})
    assert not json_fields_match(b"[1]", {"a": 1})
    assert not json_fields_match(b"not json", {"a": 1})
    assert json_fields_match(b"{}", {})


async def test_probe_response_reads_a_chunked_body(tmp_path: Path, model_file: Path) -> None:
    store = EventStore.open(tmp_path / "events.db")
    sup = supervisor(store, Scripted(tmp_path, load=0.0), model_file, tmp_path / "work")
    try:
        port = await sup.ensure_running()
        answer = await probe_response(port, "/chunked")
        assert answer is not None
        assert answer[0] == 200 and json.loads(answer[1])["status"] == "ok"
        assert await probe_status(port, "/health") == 200
    finally:
        await sup.stop()
        store.close()
    assert await probe_response(port, "/health", wait=0.5) is None  # nothing listens now


# -- models: files and directories (RD2), identity (RD3) ------------------------------------


async def test_a_directory_model_given_relative_reaches_the_engine_absolute(
    store: EventStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "models" / "tiny-mlx").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    adapter = ScriptedDir(tmp_path, load=0.0)
    work = tmp_path / "work"
    await ready_then_stop(supervisor(store, adapter, Path("models/tiny-mlx"), work))
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[-1] == str(tmp_path / "models" / "tiny-mlx")  # not resolved in the work dir


async def test_a_file_is_refused_where_a_directory_is_wanted_and_back(
    store: EventStore, tmp_path: Path, model_file: Path
) -> None:
    sup = supervisor(store, ScriptedDir(tmp_path), model_file, tmp_path / "work")
    with pytest.raises(EngineStartError, match=r"model\.bin: is a file, not a model directory$"):
        await sup.ensure_running()
    sup = supervisor(store, Scripted(tmp_path), tmp_path, tmp_path / "work2")
    with pytest.raises(EngineStartError, match=r": is a directory, not a model file$"):
        await sup.ensure_running()
    assert not (tmp_path / "argv.json").exists()  # neither was launched


def test_check_model_path_says_what_is_wrong_in_one_line(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    with pytest.raises(ModelFileError, match=rf"^{gone}: no such model directory$"):
        check_model_path(gone, "directory")
    with pytest.raises(ModelFileError, match=rf"^{gone}: no such model$"):
        check_model_path(gone, "either")
    with pytest.raises(ModelFileError, match=rf"^{gone}: no such model file$"):
        check_model_path(gone)
    with pytest.raises(ModelFileError, match=r"^/dev/null: is a character device, not a model$"):
        check_model_path(Path("/dev/null"), "either")
    assert check_model_path(tmp_path, "either") == tmp_path
    (tmp_path / "f").write_text("x")
    assert check_model_path(tmp_path / "f", "either") == tmp_path / "f"
    assert check_model_path(tmp_path / "f") == tmp_path / "f"


async def test_a_missing_directory_model_fails_its_start_in_one_line(
    store: EventStore, tmp_path: Path
) -> None:
    sup = supervisor(store, ScriptedDir(tmp_path), tmp_path / "gone", tmp_path / "work")
    with pytest.raises(EngineStartError, match=r"^scripted-dir:m:0: model directory .*/gone does"):
        await sup.ensure_running()


# -- extra_args: one rule (RD5) ---------------------------------------------------------------


def test_extra_args_are_spelled_one_way() -> None:
    args: dict[str, str | int | float | bool] = {
        "alpha": 1,
        "flag": True,
        "off": False,
        "-x": "y",
        "ratio": 0.5,
    }
    assert extra_args_argv(args) == ["--alpha", "1", "--flag", "-x", "y", "--ratio", "0.5"]
    assert extra_args_argv({}) == []


async def test_hostler_appends_extra_args_after_the_adapters_argv(
    store: EventStore, tmp_path: Path, model_file: Path
) -> None:
    adapter = Scripted(tmp_path, load=0.0)
    extras = {"temp": 0.5, "verbose": True, "quiet": False, "-n": 4}
    await ready_then_stop(supervisor(store, adapter, model_file, tmp_path / "work", extras))
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[4:] == [str(model_file), "--temp", "0.5", "--verbose", "-n", "4"]


def test_an_adapter_that_places_extra_args_itself_gets_none_appended(tmp_path: Path) -> None:
    spec = LaunchSpec("llamacpp:m:0", tmp_path / "m.gguf", 9, 256, extra_args={"threads": 3})
    adapter = LlamaCppAdapter()
    assert LlamaCppAdapter.applies_extra_args is True
    argv = launch_command(adapter, spec).argv
    assert argv == adapter.build_command(spec).argv
    assert argv.count("--threads") == 1 and argv[argv.index("--threads") + 1] == "3"


def test_a_spelling_hook_that_returns_junk_is_the_plugins_error(tmp_path: Path) -> None:
    class Bad(Scripted):
        def extra_args_argv(self, extra_args: Any) -> list[str]:
            return [1]  # type: ignore[list-item]

    spec = LaunchSpec("scripted:m:0", tmp_path, 9, 256, extra_args={"a": 1})
    with pytest.raises(TypeError, match="extra_args_argv returned"):
        launch_command(Bad(tmp_path), spec)


# -- pricing every engine the one way (RD4) ---------------------------------------------------


class Priced(EngineAdapter):
    """A non-GGUF engine: a directory model, its own geometry and price."""

    engine_type = "priced"
    model_kind: ClassVar[Any] = "directory"
    kv_headroom: ClassVar[float | None] = 0.5

    def build_command(self, spec: LaunchSpec) -> LaunchCommand:
        return LaunchCommand(["priced-server"])

    def read_geometry(self, model: Path) -> ModelGeometry:
        config = json.loads((model / "config.json").read_text())
        return ModelGeometry(
            architecture=config["model_type"],
            block_count=config["num_hidden_layers"],
            head_count=config["num_attention_heads"],
            head_count_kv=config["num_key_value_heads"],
            embedding_length=config["hidden_size"],
            native_context=config["max_position_embeddings"],
            file_size=100 * 2**20,
        )

    def estimate_footprint(self, geometry: ModelGeometry, spec: LaunchSpec) -> int:
        return geometry.file_size + spec.ctx_per_slot * spec.slots * 1024

    def model_identity(self, model: Path) -> str:
        return f"{model.name}@{json.loads((model / 'config.json').read_text())['rev']}"


def mlx_dir(root: Path, name: str = "qwen-tiny") -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    config = {
        "model_type": "qwen2",
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_size": 256,
        "max_position_embeddings": 8192,
        "rev": "r1",
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def price(adapter: EngineAdapter, model: Path, calibration: Calibration | None = None) -> Any:
    budget = compute_budget(HostMemory(64 * GIB))
    return price_engine(
        adapter,
        LaunchRequest(
            key=f"{adapter.engine_type}:m:0", model=model, ctx=4096, slots=1, kv_type=None
        ),
        budget=budget,
        state=LedgerState(),
        calibration=calibration or Calibration(),
    ).price


def test_an_adapter_supplied_geometry_is_priced_planned_and_learned(tmp_path: Path) -> None:
    model = mlx_dir(tmp_path)
    first = price(Priced(), model)
    assert first.admitted
    assert first.estimated == 100 * 2**20 + 4096 * 1024  # the adapter's own figure
    assert first.reserved_bytes == first.estimated  # nothing learned yet
    learned = Calibration()
    measured = FootprintMeasured(
        engine_key="priced:m:0",
        model="qwen-tiny@r1",  # the adapter's identity, not "config.json"
        build="priced-server",
        kv_type=first.plan.kv_type,
        ctx_total=first.plan.total_ctx,
        slots=first.plan.slots,
        estimated=first.reserved_bytes,
        measured=first.reserved_bytes + 50 * 2**20,
        rss=0,
        gpu=0,
        buffers=0,
    )
    learned.apply(measured)
    again = price(Priced(), model, learned)
    assert again.reserved_bytes == first.reserved_bytes + 50 * 2**20
    other = mlx_dir(tmp_path / "b", "qwen-tiny")  # same name, another revision: not learned
    (other / "config.json").write_text((other / "config.json").read_text().replace('"r1"', '"r2"'))
    assert price(Priced(), other, learned).reserved_bytes == first.reserved_bytes


def test_pricing_validates_the_model_with_the_adapter(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelFileError, match=r"weights\.bin: is a file, not a model directory$"):
        price(Priced(), tmp_path / "weights.bin")


def test_an_adapters_headroom_sizes_its_slots() -> None:
    common: dict[str, Any] = {
        "engine": "other",
        "ctx": 4096,
        "weights_bytes": 2**30,
        "budget": 16 * GIB,
        "committed_other": 0,
        "cache_type": "f16",
        "exact_f16_per_slot": 2**30,
    }
    assert slot_ceiling(**common) == slot_ceiling(**common, headroom=0.20)
    assert slot_ceiling(**common, headroom=0.5) < slot_ceiling(**common)
    assert slot_ceiling(**common, headroom=0.0) > slot_ceiling(**common)


async def test_learning_records_the_adapters_model_identity(
    store: EventStore, tmp_path: Path
) -> None:
    from hostler.drivers.host_ledger import HostLedger, OwnerIdentity

    class Named(Scripted):
        engine_type = "named"
        model_kind: ClassVar[Any] = "directory"

        def model_identity(self, model: Path) -> str:
            return "named-model@7"

    model = mlx_dir(tmp_path / "models")
    ledger = HostLedger(
        store, OwnerIdentity.current("contract"), lambda: compute_budget(HostMemory(64 * GIB))
    )
    key = "named:m:0"
    sup = Supervisor(
        key,
        Named(tmp_path, load=0.0),
        lambda port: LaunchSpec(key, model, port, ctx_per_slot=256, work_dir=tmp_path / "w"),
        store,
        run_dir=tmp_path / "run",
        token_prefix="contract",
        ledger=ledger,
        footprint=lambda: 64 * 2**20,
    )
    await ready_then_stop(sup)
    rows = store.read_stream(CALIBRATION_STREAM)
    assert [r.payload["model"] for r in rows] == ["named-model@7"]


async def test_llama_server_still_starts_with_the_default_readiness(
    store: EventStore, tmp_path: Path
) -> None:
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    sup = supervisor(store, LlamaCppAdapter(), model, tmp_path / "work")
    with anyio.fail_after(120):
        took = await ready_then_stop(sup)
    assert took > 0
