"""Estimate → reserve → measure → learn, with the real llama-server and real GGUF files."""

from __future__ import annotations

import platform
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from hostler import EventStore
from hostler.capacity.budget import HostMemory, compute_budget
from hostler.capacity.estimate import estimate_llama, kv_cells
from hostler.capacity.gguf_header import read_geometry
from hostler.capacity.units import GIB
from hostler.drivers.host_ledger import HostLedger, OwnerIdentity
from hostler.drivers.measure import LaunchFacts, load_calibration, record_launch
from hostler.engines.supervisor import free_port
from hostler.events.ledger import LEDGER_STREAM, LedgerMeasured
from hostler.testing.tiny_gguf import TinyModel, write_tiny_llama
from hostler_llamacpp.adapter import host_cpu_flags, repacked_types, runtime_fixed_of
from hostler_llamacpp.binary import find_llama_server
from hostler_llamacpp.logs import parse_buffer_sizes, parse_build


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(
        tmp_path_factory.mktemp("models") / "mid.gguf",
        TinyModel(layers=4, embd=256, heads=4, kv_heads=2, ff=768, f16=True),
    )


class Server:
    def __init__(self, model: Path, ctx: int, slots: int, log: Path) -> None:
        self.port = free_port()
        self.log = log
        self._out = log.open("w")
        self.proc = subprocess.Popen(
            [
                str(find_llama_server()),
                "-m",
                str(model),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "-c",
                str(ctx),
                "-np",
                str(slots),
                "-lv",
                "4",
            ],
            stdout=self._out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, log.read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.02)
        time.sleep(0.3)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self._out.close()


Start = Callable[[Path, int, int], Server]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Start]:
    """Start real llama-server processes; every one still running is stopped afterwards."""
    started: list[Server] = []

    def start(model: Path, ctx: int, slots: int) -> Server:
        server = Server(model, ctx, slots, tmp_path / f"llama{len(started)}.log")
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def test_kv_cells_follow_llama_server() -> None:
    assert kv_cells(2048, 2) == (1024, 2048)
    assert kv_cells(512, 4) == (256, 1024)  # each sequence gets at least 256 cells
    assert kv_cells(1000, 1) == (1024, 1024)  # padded to 256
    assert kv_cells(4096, 4, unified=True) == (4096, 4096)


def test_first_estimate_is_within_15_percent_of_the_real_engine(model: Path, serve: Start) -> None:
    geometry = read_geometry(model)
    for ctx, slots in ((512, 1), (4096, 2)):
        server = serve(model, ctx, slots)
        measured = _rss(server.proc.pid)
        text = server.log.read_text()
        buffers = parse_buffer_sizes(text)
        fixed = runtime_fixed_of(find_llama_server())  # this build's, as the adapter prices it
        # what this host's CPU backend copies (an AMX CPU copies the F16 matrix weights)
        copied = repacked_types(platform.machine(), cpu_flags=host_cpu_flags())
        estimate = estimate_llama(
            geometry,
            ctx_total=ctx,
            slots=slots,
            kv_type="f16",
            runtime_fixed=fixed,
            repack_types=copied,
        )
        assert abs(estimate.total / measured - 1) < 0.15, (ctx, slots, estimate, measured)
        assert estimate.kv == buffers.kv  # exact arithmetic, as the engine reports it
        # the mapped file and the backend's copy, as the engine reports its model buffers
        assert abs(estimate.weights + estimate.repack - buffers.model) < 64 * 1024, copied
        server.stop()


def _rss(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)


def test_measured_launch_replaces_the_reservation_and_teaches_other_points(
    model: Path, serve: Start, tmp_path: Path
) -> None:
    geometry = read_geometry(model)
    budget = compute_budget(HostMemory(system_ram=16 * GIB))
    with EventStore.open(tmp_path / "ledger.db") as store:
        ledger = HostLedger(store, OwnerIdentity.current("t"), lambda: budget)
        key = "llamacpp:mid:0"
        estimate = estimate_llama(geometry, ctx_total=2048, slots=2, kv_type="f16").total
        assert ledger.reserve(key, estimate).granted
        server = serve(model, 2048, 2)
        build = parse_build(server.log.read_text()) or "unknown"
        event = record_launch(
            ledger,
            LaunchFacts(key, model.name, build, "f16", 2048, 2, estimate),
            server.proc.pid,
            buffers=parse_buffer_sizes(server.log.read_text()).total,
        )
        server.stop()
        assert event.rss > 0
        assert event.gpu == 0  # no GPU on this machine
        # the ledger holds the measured figure now
        assert ledger.snapshot()["by_key"][0]["bytes"] == event.measured
        assert any(isinstance(r.event, LedgerMeasured) for r in store.read_stream(LEDGER_STREAM))
        calibration = load_calibration(store)
        # the learned estimate for another point, checked against the real engine there
        other = estimate_llama(geometry, ctx_total=8192, slots=4, kv_type="f16").total
        learned = calibration.correct(
            other, model=model.name, build=build, kv_type="f16", ctx_total=8192, slots=4
        )
        server = serve(model, 8192, 4)
        truth = _rss(server.proc.pid)
        server.stop()
        assert abs(learned / truth - 1) < 0.05, (learned, truth)
