"""Shared pieces of the pool and runtime tests: one daemon's log, ledger and engines."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from hostler import EventStore
from hostler.capacity.budget import HostMemory, compute_budget
from hostler.capacity.origin import API_SOURCE
from hostler.drivers.host_ledger import HostLedger, OwnerIdentity
from hostler.engines.supervisor import Supervisor, SupervisorPolicy
from hostler.events.pool import POOL_STREAM
from hostler.plugin import EngineAdapter, LaunchSpec
from hostler.runtime.pool import Pool

from _fake_engine import BallastEngine

GIB = 2**30
MIB = 2**20
#: Each engine's price: its ballast plus an interpreter; three of them exceed 1 GiB, two fit.
BALLAST_MIB = 400
PRICE = 430 * MIB


class World:
    """One daemon's pieces: its log (also holding the ledger), ledger, and engines' folder."""

    def __init__(self, tmp_path: Path, store: EventStore, ledger: HostLedger) -> None:
        self.tmp_path = tmp_path
        self.store = store
        self.ledger = ledger
        self.model = tmp_path / "model.bin"
        self.model.write_bytes(b"weights")
        self.now = time.time()
        self.token = f"pooltest-{os.getpid()}-{tmp_path.name}"

    def clock(self) -> float:
        return self.now

    def supervisor_factory(
        self, engine: EngineAdapter, price: int = PRICE, launcher: Any = None
    ) -> Callable[[str], Supervisor]:
        """Supervisors of ``engine`` costing ``price``; ``launcher(key, run)`` makes each's own."""

        def build(key: str) -> Supervisor:
            run = self.tmp_path / "run" / key.replace(":", "_")
            if launcher is not None:
                return Supervisor(
                    key,
                    engine,
                    None,
                    self.store,
                    run_dir=run,
                    token_prefix=self.token,
                    policy=SupervisorPolicy(watch_interval=0.05, idle_timeout=0, stop_grace=1.0),
                    ledger=self.ledger,
                    launcher=launcher(key, run),
                )
            return Supervisor(
                key,
                engine,
                lambda port: LaunchSpec(
                    key, self.model, port, ctx_per_slot=512, slots=1, work_dir=run
                ),
                self.store,
                run_dir=run,
                token_prefix=self.token,
                policy=SupervisorPolicy(watch_interval=0.05, idle_timeout=0, stop_grace=1.0),
                ledger=self.ledger,
                footprint=lambda: price,
            )

        return build

    def pool(
        self,
        adapter: BallastEngine | None = None,
        *,
        clock: Callable[[], float] | None = None,
        price: int = PRICE,
        launcher: Any = None,
        **options: Any,
    ) -> Pool:
        engine = adapter or BallastEngine(self.tmp_path, BALLAST_MIB)
        build = self.supervisor_factory(engine, price, launcher)
        return Pool(
            self.store,
            build,
            ledger=self.ledger,
            clock=clock or time.time,
            drain_poll=0.02,
            **options,
        )

    def types(self, stream: str) -> list[str]:
        return [r.type for r in self.store.read_stream(stream)]

    def pool_events(self, kind: str) -> list[dict[str, Any]]:
        return [
            dataclasses.asdict(r.event)  # type: ignore[arg-type]
            for r in self.store.read_stream(POOL_STREAM)
            if r.type == kind
        ]

    def stops(self, key: str) -> list[tuple[str, dict[str, Any] | None]]:
        return [
            (getattr(r.event, "reason"), getattr(r.event, "decision"))  # noqa: B009
            for r in self.store.read_stream(f"engine/{key}")
            if r.type == "engine.stop_requested"
        ]


@contextlib.contextmanager
def world_at(tmp_path: Path) -> Iterator[World]:
    """A log (also holding the ledger) with an enforced 1 GiB budget and spillover on."""
    with EventStore.open(tmp_path / "events.db") as store:
        ledger = HostLedger(
            store, OwnerIdentity.current("pooltest"), lambda: compute_budget(HostMemory(64 * GIB))
        )
        ledger.set_budget(GIB, source=API_SOURCE)
        ledger.set_spillover(True)
        yield World(tmp_path, store, ledger)


@contextlib.contextmanager
def world_leaving_nothing(tmp_path: Path) -> Iterator[World]:
    """:func:`world_at`, and afterwards every engine process of its token SIGKILLed."""
    with world_at(tmp_path) as made:
        yield made
        for pid in engine_processes(made.token):  # never leave our own engines behind
            os.kill(pid, signal.SIGKILL)


def work(port: int, seconds: float) -> None:
    """A request that keeps the engine busy for ``seconds``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/busy/{seconds}", timeout=30) as r:
        r.read()


def engine_processes(prefix: str) -> list[int]:
    """Pids of live processes carrying a launch token that starts with ``prefix``."""
    found = []
    for proc in psutil.process_iter(["pid", "environ"]):
        with_token = (proc.info.get("environ") or {}).get("HOSTLER_LAUNCH_TOKEN", "")
        if with_token.startswith(prefix) and proc.is_running():
            found.append(proc.info["pid"])
    return found


def held(world: World) -> list[str]:
    """The keys the ledger holds a reservation for, sorted."""
    return sorted(h.key for h in world.ledger.refresh().reservations.values())
