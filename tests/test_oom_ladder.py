"""L13 in the supervisor: a start that dies of GPU out-of-memory is retried with the next plan.

The engine is a real process that prints llama.cpp's CUDA out-of-memory line and exits while
its offload plan keeps layers on the card, and serves once the plan leaves them to the engine.
"""

from __future__ import annotations

import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from hostler import EventStore
from hostler.capacity.budget import HostMemory, compute_budget
from hostler.capacity.learning import Calibration
from hostler.capacity.ledger import LedgerState
from hostler.capacity.offload import Offload, OffloadPlan
from hostler.capacity.plan import LaunchPlan
from hostler.capacity.units import GIB
from hostler.engines.price import LaunchRequest, price_engine
from hostler.engines.supervisor import Supervisor, SupervisorPolicy
from hostler.errors import EngineStartError
from hostler.events.offload import offload_stream
from hostler.plugin import EngineAdapter, LaunchCommand, LaunchSpec, ModelGeometry, Panic
from hostler.testing.tiny_gguf import write_tiny_llama
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


#: A small MoE: 4 layers, 8 experts, 2 GiB of weights.
MOE = ModelGeometry(
    architecture="qwen3moe",
    block_count=4,
    head_count=8,
    head_count_kv=2,
    embedding_length=1024,
    native_context=8192,
    expert_count=8,
    file_size=2 * GIB,
)
CARD = 24 * GIB  # 22.8 GiB usable (B4)


def _moe_launch(
    tmp_path: Path, geometry: ModelGeometry, vram: int | None
) -> tuple[LaunchPlan, list[str]]:
    """The plan of a standalone launch on the host and the flags after the KV cache types."""
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    adapter = LlamaCppAdapter(binary)
    model = write_tiny_llama(tmp_path / "moe.gguf")
    priced = price_engine(
        adapter,
        LaunchRequest(key="llamacpp:moe:0", model=model, ctx=4096, slots=1, kv_type="q8_0"),
        budget=compute_budget(HostMemory(system_ram=64 * GIB, vram=vram)),
        state=LedgerState(),
        calibration=Calibration(),
        standalone=True,
        geometry=geometry,
    )
    head = [
        str(binary),
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        "8080",
        "--jinja",
        "--ctx-size",
        "4096",
        "--parallel",
        "1",
        "--cache-type-k",
        "q8_0",
        "--cache-type-v",
        "q8_0",
    ]
    argv = adapter.build_command(priced.spec(8080)).argv
    assert argv[: len(head)] == head
    tail = ["--embeddings", "--pooling", "mean"]  # L21, after every engine flag
    assert argv[-len(tail) :] == tail
    return priced.price.plan, argv[len(head) : -len(tail)]


def test_a_moe_that_fits_the_card_whole_launches_with_every_layer_on_it(tmp_path: Path) -> None:
    # L12: resident + the 1 GiB margin fit the card: whole on it, every layer, no --cpu-moe
    plan, flags = _moe_launch(tmp_path, MOE, CARD)
    assert flags == ["--n-gpu-layers", "all", "--flash-attn", "on", "--cache-reuse", "256"]
    assert plan.offload == OffloadPlan(Offload.FULL_GPU, None, "fits whole with the margin")
    assert "offload: fits whole with the margin (--n-gpu-layers all)" in plan.reasons


def test_a_moe_over_the_card_keeps_every_expert_in_ram(tmp_path: Path) -> None:
    # L12 without a split: 30 GiB of weights miss the 22.8 usable GiB: every expert in RAM
    plan, flags = _moe_launch(tmp_path, replace(MOE, file_size=30 * GIB), CARD)
    assert flags == [
        "--n-gpu-layers",
        "all",
        "--cpu-moe",
        "--flash-attn",
        "on",
        "--cache-reuse",
        "256",
    ]
    assert plan.offload == OffloadPlan(
        Offload.ALL_EXPERTS_CPU, None, "over the card without a split"
    )
    assert "offload: over the card without a split (--n-gpu-layers all --cpu-moe)" in plan.reasons


@pytest.mark.parametrize(
    ("geometry", "vram"),
    [
        (MOE, None),  # no card: the engine decides
        (MOE, 64 * GIB),  # a "card" as large as RAM is unified memory (B1): no card of its own
        (replace(MOE, expert_count=None), CARD),  # a dense model
    ],
)
def test_no_offload_flags_without_a_card_or_for_a_dense_model(
    tmp_path: Path, geometry: ModelGeometry, vram: int | None
) -> None:
    plan, flags = _moe_launch(tmp_path, geometry, vram)
    assert plan.offload is None
    assert flags == ["--flash-attn", "on", "--cache-reuse", "256"]
    assert not any(reason.startswith("offload:") for reason in plan.reasons)
