"""L13 in the supervisor: a start that dies of GPU out-of-memory is retried with the next plan.

The engine is a real process that prints llama.cpp's CUDA out-of-memory line and exits while
its offload plan keeps layers on the card, and serves once the plan leaves them to the engine.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from hostler import EventStore
from hostler.capacity.offload import Offload, OffloadPlan
from hostler.engines.supervisor import Supervisor, SupervisorPolicy
from hostler.errors import EngineStartError
from hostler.events.offload import offload_stream
from hostler.plugin import EngineAdapter, LaunchCommand, LaunchSpec, Panic
from hostler_llamacpp import LlamaCppAdapter
from hostler_llamacpp.adapter import planned_offload
from hostler_llamacpp.flags import Planned

pytestmark = pytest.mark.anyio
KEY = "oom:moe:0"

SCRIPT = textwrap.dedent(
    """
    import http.server, sys
    if sys.argv[2] != "cpu-moe-unpinned":
        print("ggml_cuda_init: found 1 CUDA devices", flush=True)
        print("CUDA error: out of memory allocating 12 GiB", flush=True)
        sys.exit(1)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
    """
)


class OomEngine(EngineAdapter):
    """Dies of GPU OOM unless its plan leaves the layer count to the engine."""

    engine_type = "oom"

    def __init__(self, folder: Path) -> None:
        self.script = folder / "oom_engine.py"
        self.script.write_text(SCRIPT)
        self.launched: list[str] = []

    def build_command(self, spec: LaunchSpec) -> LaunchCommand:
        kind = str(spec.offload.kind) if spec.offload else "none"
        self.launched.append(kind)
        return LaunchCommand([sys.executable, str(self.script), str(spec.port), kind])

    def classify_line(self, line: str) -> Panic | None:
        return LlamaCppAdapter().classify_line(line)


def supervisor(store: EventStore, tmp_path: Path, *, pinned: bool = False) -> Supervisor:
    model = tmp_path / "moe.gguf"
    model.write_bytes(b"x")
    first = OffloadPlan(Offload.FULL_GPU, None, "fits whole with the margin")
    return Supervisor(
        KEY,
        OomEngine(tmp_path),
        lambda port: LaunchSpec(KEY, model, port, ctx_per_slot=512, offload=first),
        store,
        run_dir=tmp_path / "run",
        token_prefix="oomtest",
        policy=SupervisorPolicy(watch_interval=0.05),
        offload_pinned=pinned,
    )


async def test_an_oom_start_walks_down_the_ladder_and_keeps_the_plan(
    store: EventStore, tmp_path: Path
) -> None:
    sup = supervisor(store, tmp_path)
    adapter = sup.adapter
    assert isinstance(adapter, OomEngine)
    try:
        port = await sup.ensure_running()
        assert port > 0 and sup.state == "running"
        assert adapter.launched == ["full-gpu", "cpu-moe", "cpu-moe-unpinned"]
        types = [r.type for r in store.read_stream(f"engine/{KEY}")]
        assert types.count("engine.start_requested") == 3
        crashes = [
            r.payload for r in store.read_stream(f"engine/{KEY}") if r.type == "engine.crashed"
        ]
        assert [c["panic_kind"] for c in crashes] == ["cuda-out-of-memory"] * 2
        steps = [r.payload for r in store.read_stream(offload_stream(KEY))]
        assert [(s["previous"]["kind"], s["plan"]["kind"]) for s in steps] == [
            ("full-gpu", "cpu-moe"),
            ("cpu-moe", "cpu-moe-unpinned"),
        ]
        assert all(s["panic_kind"] == "cuda-out-of-memory" for s in steps)
        # kept for later starts (one more now would pass the restart budget: 3 in 60 s)
        assert sup.offload is not None and sup.offload.kind is Offload.ENGINE_DECIDES
    finally:
        await sup.stop()


async def test_pinned_offload_settings_get_no_ladder(store: EventStore, tmp_path: Path) -> None:
    sup = supervisor(store, tmp_path, pinned=True)
    with pytest.raises(EngineStartError, match="out of memory"):
        await sup.ensure_running()
    assert list(store.read_stream(offload_stream(KEY))) == []
    assert sup.state == "backoff"


def test_offload_plans_become_the_planners_flags() -> None:
    assert planned_offload(None) == Planned()
    assert planned_offload(OffloadPlan(Offload.FULL_GPU, None, "")) == Planned(n_gpu_layers="all")
    assert planned_offload(OffloadPlan(Offload.PARTIAL, 7, "")) == Planned(
        n_gpu_layers="all", n_cpu_moe=7
    )
    assert planned_offload(OffloadPlan(Offload.ALL_EXPERTS_CPU, None, "")) == Planned(
        n_gpu_layers="all", cpu_moe=True
    )
    assert planned_offload(OffloadPlan(Offload.ENGINE_DECIDES, None, "")) == Planned(cpu_moe=True)


def test_the_adapters_argv_carries_the_plan_and_the_operator_still_wins(tmp_path: Path) -> None:
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    adapter = LlamaCppAdapter(binary)
    plan = OffloadPlan(Offload.PARTIAL, 3, "")
    spec = LaunchSpec("llamacpp:m:0", tmp_path / "m.gguf", 1, ctx_per_slot=512, offload=plan)
    argv = adapter.build_command(spec).argv
    assert argv[argv.index("--n-gpu-layers") + 1] == "all"
    assert argv[argv.index("--n-cpu-moe") + 1] == "3"
    mine = LaunchSpec(
        "llamacpp:m:0",
        tmp_path / "m.gguf",
        1,
        ctx_per_slot=512,
        offload=plan,
        options={"n_gpu_layers": 10},
    )
    argv = adapter.build_command(mine).argv
    assert argv[argv.index("--n-gpu-layers") + 1] == "10"
