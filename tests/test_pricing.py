"""One price (issue 7, item 11): what preview shows as reserved is what the daemon reserves."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from hostler import EventStore
from hostler.capacity.budget import HostMemory, compute_budget
from hostler.capacity.estimate import estimate_llama
from hostler.capacity.geometry import ModelGeometry
from hostler.capacity.learning import CALIBRATION_STREAM, Calibration, FootprintMeasured
from hostler.capacity.ledger import LedgerState, limits_of
from hostler.capacity.plan import PlanRequest, plan_llama
from hostler.capacity.pricing import price_launch
from hostler.capacity.units import GIB, MIB
from hostler.drivers.host_ledger import HostLedger, OwnerIdentity
from hostler.engines.price import LaunchRequest, engine_build, price_from_ledger
from hostler.events.ledger import LEDGER_STREAM
from hostler.plugin import LaunchSpec
from hostler.probes.device import budget_from, sample_device
from hostler.probes.nvml import open_nvml
from hostler.testing.tiny_gguf import TinyModel, write_tiny_llama
from hostler_llamacpp.adapter import (
    RUNTIME_FIXED_PLAIN,
    LlamaCppAdapter,
    repacked_types,
    runtime_fixed_of,
)

from _support import REPO, run_cli

LLAMA_8B = ModelGeometry(
    architecture="llama",
    block_count=32,
    head_count=32,
    head_count_kv=8,
    embedding_length=4096,
    native_context=131072,
    file_size=int(4.9 * GIB),
    tensor_bytes=int(4.8 * GIB),
    vocab_size=128256,
)
RAM_32 = compute_budget(HostMemory(system_ram=32 * GIB))  # 19.2 GiB


def _estimate(geometry: ModelGeometry, extra: int = 0):  # type: ignore[no-untyped-def]
    def estimate(ctx_total: int, slots: int, kv_type: str) -> int:
        return (
            extra + estimate_llama(geometry, ctx_total=ctx_total, slots=slots, kv_type=kv_type).peak
        )

    return estimate


def test_the_price_is_the_estimate_at_the_plans_decision() -> None:
    limits = limits_of(LedgerState(), RAM_32)
    price = price_launch(
        PlanRequest("m", ctx=16384, ctx_is_model_override=True, slots=2),
        LLAMA_8B,
        RAM_32,
        limits,
        committed_other=0,
        estimate=_estimate(LLAMA_8B),
    )
    assert price.admitted and not price.learned
    assert (price.ctx_per_slot, price.slots, price.kv_type) == (16384, 2, "q8_0")
    expected = estimate_llama(LLAMA_8B, ctx_total=32768, slots=2, kv_type="q8_0")
    assert price.estimated == price.reserved_bytes == expected.peak
    # the planner sized with the same estimator: resident = the estimate at one minimal sequence
    assert (
        price.plan.weights_bytes
        == estimate_llama(LLAMA_8B, ctx_total=256, slots=1, kv_type="q8_0").peak
    )


def test_the_price_is_corrected_by_what_was_learned() -> None:
    limits = limits_of(LedgerState(), RAM_32)
    seen: list[tuple[int, int, int, str]] = []

    def correct(value: int, ctx_total: int, slots: int, kv_type: str) -> int:
        seen.append((value, ctx_total, slots, kv_type))
        return value + 100 * MIB

    price = price_launch(
        PlanRequest("m", ctx=8192, ctx_is_model_override=True, slots=1, kv_type="f16"),
        LLAMA_8B,
        RAM_32,
        limits,
        committed_other=0,
        estimate=_estimate(LLAMA_8B),
        correct=correct,
    )
    assert price.learned
    assert price.reserved_bytes == price.estimated + 100 * MIB
    assert seen[-1] == (price.estimated, 8192, 1, "f16")


def test_admission_is_decided_on_the_one_price() -> None:
    """The plan alone fits, but the priced launch (here 12 GiB more) does not: denied."""
    limits = limits_of(LedgerState(), RAM_32)
    request = PlanRequest("m", ctx=8192, ctx_is_model_override=True, slots=1)
    assert plan_llama(request, LLAMA_8B, RAM_32, limits, committed_other=4 * GIB).admitted
    big = _estimate(LLAMA_8B, extra=12 * GIB)
    price = price_launch(request, LLAMA_8B, RAM_32, limits, committed_other=4 * GIB, estimate=big)
    assert not price.admitted
    assert "needs" in price.denial


def test_a_quantized_cache_the_engine_cannot_build_stays_f16() -> None:
    narrow = ModelGeometry(
        architecture="llama", block_count=2, head_count=4, head_count_kv=2, embedding_length=64
    )
    limits = limits_of(LedgerState(), RAM_32)
    plan = plan_llama(PlanRequest("m"), narrow, RAM_32, limits, committed_other=0)
    assert plan.kv_type == "f16"  # q8_0 blocks of 32 do not divide a head width of 16
    assert any("head width 16" in reason for reason in plan.reasons)
    asked = plan_llama(PlanRequest("m", kv_type="q8_0"), narrow, RAM_32, limits, committed_other=0)
    assert asked.kv_type == "q8_0"  # an operator's choice is taken verbatim


def test_learning_from_reserved_figures_does_not_drift_back() -> None:
    """The ledger reserves the corrected figure; relaunching at the learned point keeps it."""
    calibration = Calibration()
    raw, measured = 100 * MIB, 130 * MIB

    def correct(ctx_total: int) -> int:
        return calibration.correct(
            raw, model="m.gguf", build="b", kv_type="f16", ctx_total=ctx_total, slots=2
        )

    for _ in range(4):
        calibration.apply(
            FootprintMeasured(
                engine_key="llamacpp:m:0",
                model="m.gguf",
                build="b",
                kv_type="f16",
                ctx_total=2048,
                slots=2,
                estimated=correct(2048),  # what the ledger reserved
                measured=measured,
                rss=measured,
                gpu=0,
                buffers=0,
            )
        )
        assert correct(2048) == measured
    assert correct(4096) == raw + 30 * MIB  # the learned offset elsewhere


def _binary(folder: Path, *libraries: str) -> Path:
    folder.mkdir()
    binary = folder / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    for name in libraries:
        (folder / name).write_bytes(b"")
    return binary


def test_the_llamacpp_adapter_names_what_its_cpu_backend_repacks(tmp_path: Path) -> None:
    assert repacked_types("x86_64") == {"q4_0", "q4_k", "iq4_nl", "mxfp4"}
    assert repacked_types("x86_64", {"no-repack": True}) == frozenset()
    assert repacked_types("x86_64", {"repack": False}) == frozenset()
    assert repacked_types("riscv64") == frozenset()
    # an AMX CPU: the AMX buffer's types too (F16 and its quantized kernels), nothing without
    # both flags, nothing with the extra buffers turned off, nothing off x86-64
    amx = {"avx2", "amx_int8", "avx512_vnni"}
    assert repacked_types("x86_64", cpu_flags=amx) == {
        "q4_0",
        "q4_k",
        "iq4_nl",
        "mxfp4",
        "q4_1",
        "q8_0",
        "q5_k",
        "q6_k",
        "iq4_xs",
        "f16",
    }
    assert repacked_types("x86_64", cpu_flags={"amx_int8"}) == repacked_types("x86_64")
    assert repacked_types("x86_64", {"no-repack": True}, cpu_flags=amx) == frozenset()
    assert repacked_types("aarch64", cpu_flags=amx) == frozenset()
    wheel = _binary(tmp_path / "wheel", "libggml-vulkan.so")
    adapter = LlamaCppAdapter(wheel, repack_types={"Q4_0"})
    geometry = ModelGeometry(
        architecture="llama", tensor_bytes=1000, matmul_bytes=(("q4_0", 600), ("q8_0", 300))
    )
    spec = LaunchSpec(key="llamacpp:m:0", model=Path("m.gguf"), port=0, ctx_per_slot=256)
    plain = estimate_llama(geometry, ctx_total=256, slots=1, kv_type="f16")
    assert adapter.estimate_footprint(geometry, spec) == plain.peak + 600
    assert adapter.estimate_footprint(geometry, replace(spec, extra_args={"-nr": True})) == (
        plain.peak
    )


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_tiny_llama(tmp_path / "tiny-price.gguf", TinyModel(seed=3))


def _preview(model: Path, ledger: Path, *args: str) -> dict:  # type: ignore[type-arg]
    result = run_cli("preview", str(model), "--ledger", str(ledger), "--json", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def test_preview_shows_what_the_daemons_pricing_reserves(model: Path, tmp_path: Path) -> None:
    """The real CLI against ``price_from_ledger``, the function the daemon prices with."""
    ledger_path = tmp_path / "ledger.db"
    adapter = LlamaCppAdapter()
    key = f"llamacpp:{model.stem}:0"
    spec = LaunchSpec(key=key, model=model, port=0, ctx_per_slot=256, kv_type="f16")
    with EventStore.open(ledger_path) as store:
        probe = open_nvml()
        try:
            budget = budget_from(sample_device(probe, at=time.time()))
        finally:
            probe.close()
        ledger = HostLedger(store, OwnerIdentity.current("t"), lambda: budget)
        assert ledger.reserve("llamacpp:someone-else:0", 300 * MIB).granted
        # a measured launch of this model at another point: both sides must apply it
        store.append(
            CALIBRATION_STREAM,
            [
                FootprintMeasured(
                    engine_key=key,
                    model=model.name,
                    build=engine_build(adapter, spec),
                    kv_type="f16",
                    ctx_total=4096,
                    slots=4,
                    estimated=40 * MIB,
                    measured=52 * MIB,
                    rss=52 * MIB,
                    gpu=0,
                    buffers=0,
                )
            ],
            expected_version=None,
        )
        daemon = price_from_ledger(
            adapter,
            ledger,
            LaunchRequest(key=key, model=model, ctx=1024, slots=2, kv_type=None),
        ).price
    shown = _preview(model, ledger_path, "--ctx", "1024", "--slots", "2")
    assert daemon.learned
    assert shown["reserved_bytes"] == daemon.reserved_bytes
    assert (shown["context_window"], shown["slots"], shown["kv_type"]) == (
        daemon.ctx_per_slot,
        daemon.slots,
        daemon.kv_type,
    )
    assert shown["committed_other_bytes"] == 300 * MIB


def test_the_daemon_reserves_what_preview_showed(model: Path, tmp_path: Path) -> None:
    """End to end: preview, then the real daemon launches the model; its ledger holds the same."""
    ledger_path = tmp_path / "ledger.db"
    shown = _preview(model, ledger_path, "--ctx", "512", "--slots", "2")
    config = tmp_path / "hostler.toml"
    config.write_text(
        '[daemon]\nidle_timeout = 0\nledger = "ledger.db"\n'
        f'\n[[engines]]\nkey = "llamacpp:{model.stem}:0"\nmodel = "{model.name}"\n'
        "ctx = 512\nslots = 2\n"
    )
    log = (tmp_path / "daemon.log").open("wb")
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from hostler.cli import main; sys.exit(main())",
            "daemon",
            "--config",
            str(config),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO / "tests",
    )
    try:
        reserved: list[int] = []
        deadline = time.monotonic() + 60
        while not reserved and time.monotonic() < deadline:
            time.sleep(0.2)
            if ledger_path.exists():
                with EventStore.open(ledger_path) as store:
                    reserved = [
                        int(r.payload["bytes"])
                        for r in store.read_stream(LEDGER_STREAM)
                        if r.type == "ledger.reserved"
                    ]
        assert reserved, (tmp_path / "daemon.log").read_text()[-2000:]
        assert reserved[0] == shown["reserved_bytes"]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not _engine_pids(tmp_path):
            time.sleep(0.2)
        argv = " ".join(psutil.Process(_engine_pids(tmp_path)[0]).cmdline())
        assert f"--ctx-size {shown['total_ctx']} --parallel {shown['slots']}" in argv
        assert f"--cache-type-k {shown['kv_type']}" in argv
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            daemon.kill()
        log.close()


def _engine_pids(tmp_path: Path) -> list[int]:
    path = tmp_path / "data" / "events.db"
    if not path.exists():
        return []
    with EventStore.open(path) as store:
        return [int(r.payload["pid"]) for r in store.read_all() if r.type == "engine.spawned"]


LLAMAPY = """
from hostler.plugin import EngineAdapter, hookimpl
from hostler_llamacpp.adapter import LlamaCppAdapter

class LlamaPy(LlamaCppAdapter):
    '''A third party's llama.cpp-compatible engine: its build named by its binary's path.'''
    engine_type = "llamapy"

    def build_identity(self, command):
        return EngineAdapter.build_identity(self, command)

@hookimpl
def register_engines(register):
    register(LlamaPy)
"""


def _install_plugin(root: Path) -> None:
    (root / "price_llamapy").mkdir(parents=True)
    (root / "price_llamapy" / "__init__.py").write_text(LLAMAPY)
    dist = root / "price_llamapy-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: price_llamapy\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[hostler]\nllamapy = price_llamapy\n")


def _ledger_records(ledger: Path, stream: str, kind: str) -> list[dict]:  # type: ignore[type-arg]
    if not ledger.exists():
        return []
    with EventStore.open(ledger) as store:
        return [r.payload for r in store.read_stream(stream) if r.type == kind]


def test_a_plugins_preview_after_learning_is_the_daemons_next_reservation(
    model: Path, tmp_path: Path
) -> None:
    """Issue 19: a third-party engine, its binary configured, priced one way after learning.

    Three measured launches of the plugin's engine (each a real daemon start, each with its
    own data directory so no restart limit applies; the ledger, where learning lives, is the
    config's one), then ``hostler preview KEY --config`` shows what the fourth start reserves,
    to the byte.
    """
    from hostler_llamacpp.binary import find_llama_server

    from _daemons import start_daemon, wait_for

    site = tmp_path / "site"
    _install_plugin(site)
    (tmp_path / "bin").mkdir()
    binary = tmp_path / "bin" / "llama-server-py"
    binary.symlink_to(find_llama_server())
    config = tmp_path / "hostler.toml"
    key = "llamapy:tiny:0"
    config.write_text(
        '[daemon]\nidle_timeout = 0\nledger = "ledger.db"\n'
        f'\n[engine_defaults.llamapy]\nbinary = "{binary}"\n'
        f'\n[[engines]]\nkey = "{key}"\nmodel = "{model.name}"\nctx = 512\nslots = 1\n'
    )
    ledger = tmp_path / "ledger.db"
    env = {"PYTHONPATH": str(site)}

    def launch(measured: int) -> int:
        """One daemon start: the ledger's new reservation; waits for its measurement."""
        before = len(_ledger_records(ledger, LEDGER_STREAM, "ledger.reserved"))
        data = tmp_path / f"data{measured}"
        daemon = start_daemon(config, data, tmp_path / "daemon.log", env=env)
        try:
            wait_for(
                lambda: (
                    len(_ledger_records(ledger, CALIBRATION_STREAM, "calibration.measured"))
                    >= measured
                ),
                timeout=90,
            )
        except AssertionError:
            daemon.kill()
            daemon.wait(30)
            raise AssertionError((tmp_path / "daemon.log").read_text()[-3000:]) from None
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(60) == 0, (tmp_path / "daemon.log").read_text()[-3000:]
        reserved = _ledger_records(ledger, LEDGER_STREAM, "ledger.reserved")
        assert len(reserved) == before + 1
        return int(reserved[-1]["bytes"])

    first = launch(1)
    launch(2)
    launch(3)
    measurements = _ledger_records(ledger, CALIBRATION_STREAM, "calibration.measured")
    assert {m["build"] for m in measurements} == {str(binary)}  # the configured binary's build
    result = run_cli("preview", key, "--config", str(config), "--json", env=env)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["learned"] is True
    assert shown["reserved_bytes"] != shown["estimated_bytes"]  # learning moved the price
    assert shown["estimated_bytes"] == first  # the first start knew nothing yet
    assert launch(4) == shown["reserved_bytes"]


def test_a_plain_cpu_build_is_priced_with_its_own_fixed_runtime(tmp_path: Path) -> None:
    """The source build maps no Vulkan or AMX libraries: 19.5 MiB fixed, not the wheel's 29."""
    geometry = ModelGeometry(architecture="llama", tensor_bytes=1000)
    spec = LaunchSpec(key="llamacpp:m:0", model=Path("m.gguf"), port=0, ctx_per_slot=256)
    wheel = LlamaCppAdapter(_binary(tmp_path / "wheel", "libggml-vulkan.so"), repack_types=())
    plain = LlamaCppAdapter(_binary(tmp_path / "plain"), repack_types=())
    assert RUNTIME_FIXED_PLAIN == 20_447_232  # 19.5 MiB
    difference = wheel.estimate_footprint(geometry, spec) - plain.estimate_footprint(geometry, spec)
    assert difference == 29 * 2**20 - RUNTIME_FIXED_PLAIN
    assert runtime_fixed_of(None) is None  # no binary to look at: the estimator's default
