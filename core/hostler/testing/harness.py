"""One daemon's pieces for a test: a data directory, its event log, a ledger and supervisors.

:class:`Harness` builds what ``hostler serve`` would build from a config, minus the config: real
:class:`~hostler.engines.supervisor.Supervisor` objects for engine keys, over a real SQLite
event log and a real capacity ledger, and a :class:`hostler.Runtime` over them. The pytest
plugin (:mod:`hostler.testing.pytest_plugin`) hands one out as the ``hostler_harness``
fixture; it works as well outside pytest.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import hostler
from hostler.capacity.budget import HostMemory, compute_budget
from hostler.capacity.origin import API_SOURCE
from hostler.clock import ClockLike, as_clock
from hostler.drivers.host_ledger import HostLedger, OwnerIdentity
from hostler.engines.http import HTTP_TRANSPORT, EngineTransport
from hostler.engines.roster import EngineRoster
from hostler.engines.runner import OS_RUNNER, ProcessRunner
from hostler.engines.supervisor import Supervisor, SupervisorPolicy
from hostler.errors import UsageError
from hostler.plugin import EngineAdapter, LaunchSpec
from hostler.store.log import EventStore
from hostler.testing.clock import FakeClock

__all__ = ["FAST_POLICY", "HOST_MEMORY", "FakeClock", "Harness"]

#: The memory the harness's ledger believes the host has (a budget tests can reason about).
HOST_MEMORY = 64 * 2**30
#: Supervisor timings for tests: a quick watch, no idle stop, a short stop grace.
FAST_POLICY = SupervisorPolicy(watch_interval=0.05, idle_timeout=0, stop_grace=1.0)


class Harness:
    """Supervisors and a runtime for engine keys ``engine:model:replica``, over one log.

    Args:
        data_dir: The daemon's data directory (engines' run directories go under ``run/``).
        store: Its event log (an owner store).
        adapters: The adapter of each engine name.
        models: The model path of each model name; a name not given gets a small placeholder
            file under ``models/`` (enough for the fake engine).
        clock: The supervisors' and runtime's clock (a wall-time callable: a system clock with
            that wall).
        policy: Supervisor timings (default :data:`FAST_POLICY`).
        budget: The ledger's budget in bytes (None: derived from :data:`HOST_MEMORY`).
        runner: How the supervisors run their engines' processes (default: real processes);
            the ledger asks it too whether a reservation's process still runs.
        transport: How the supervisors probe their engines (default: real HTTP).
    """

    def __init__(
        self,
        data_dir: Path,
        store: EventStore,
        adapters: Mapping[str, EngineAdapter],
        *,
        models: Mapping[str, Path] | None = None,
        clock: ClockLike = time.time,
        policy: SupervisorPolicy = FAST_POLICY,
        budget: int | None = None,
        runner: ProcessRunner = OS_RUNNER,
        transport: EngineTransport = HTTP_TRANSPORT,
    ) -> None:
        self.data_dir = data_dir
        self.store = store
        self.adapters = dict(adapters)
        self.models = dict(models or {})
        self.clock = as_clock(clock)
        self.policy = policy
        self.runner = runner
        self.transport = transport
        #: Launch spec fields set per engine key (``options``, ``extra_args``, ``ctx_per_slot``).
        self.launch: dict[str, dict[str, Any]] = {}
        self.token_prefix = f"hostler-testing-{os.getpid()}-{data_dir.name}"
        self.ledger = HostLedger(
            store,
            OwnerIdentity.current("hostler-testing"),
            lambda: compute_budget(HostMemory(HOST_MEMORY)),
            engine_alive=runner.holds,
        )
        if budget is not None:
            # the harness writes to its ledger directly: no floor, as a log may hold (CB1)
            self.ledger.set_budget(budget, source=API_SOURCE)

    def adapter(self, key: str) -> EngineAdapter:
        """The adapter of ``key``'s engine."""
        engine = key.split(":", maxsplit=1)[0]
        try:
            return self.adapters[engine]
        except KeyError:
            known = ", ".join(sorted(self.adapters)) or "none"
            raise UsageError(f"{key}: no adapter for engine {engine!r} (have: {known})") from None

    def model(self, key: str) -> Path:
        """The model of ``key`` (``engine:MODEL:replica``); a placeholder file if none given."""
        parts = key.split(":")
        name = parts[1] if len(parts) > 1 else parts[0]
        if name not in self.models:
            path = self.data_dir / "models" / f"{name}.bin"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"fake weights\n")
            self.models[name] = path
        return self.models[name]

    def run_dir(self, key: str) -> Path:
        """Where ``key``'s engine log and work directory go."""
        return self.data_dir / "run" / key.replace(":", "_")

    def spec(self, key: str, port: int) -> LaunchSpec:
        """The launch spec of ``key`` on ``port`` (512 tokens, one slot, :attr:`launch` over)."""
        base = LaunchSpec(
            key, self.model(key), port, ctx_per_slot=512, slots=1, work_dir=self.run_dir(key)
        )
        return dataclasses.replace(base, **self.launch.get(key, {}))

    def price(self, key: str) -> int:
        """The adapter's estimate for ``key``: what the ledger reserves before a start."""
        adapter = self.adapter(key)
        spec = self.spec(key, 0)
        return int(adapter.estimate_footprint(adapter.read_geometry(spec.model), spec))

    def supervisor(
        self, key: str, *, owned: Callable[[], Collection[int]] | None = None, **launch: Any
    ) -> Supervisor:
        """A fresh supervisor of ``key``; ``launch`` sets spec fields (kept for later ones).

        ``owned``: the engine pids a sweep of strays spares (RD9; None: no sweep).
        """
        if launch:
            self.launch[key] = {**self.launch.get(key, {}), **launch}
        return self._supervisor(key, owned)

    def _supervisor(
        self, key: str, owned: Callable[[], Collection[int]] | None = None
    ) -> Supervisor:
        """``key``'s supervisor; ``owned``: the engine pids a sweep spares (RD9)."""
        return Supervisor(
            key,
            self.adapter(key),
            lambda port: self.spec(key, port),
            self.store,
            run_dir=self.run_dir(key),
            token_prefix=self.token_prefix,
            policy=self.policy,
            clock=self.clock,
            ledger=self.ledger,
            footprint=lambda: self.price(key),
            runner=self.runner,
            transport=self.transport,
            owned=owned,
        )

    def runtime(self, **options: Any) -> hostler.Runtime:
        """A :class:`hostler.Runtime` over these supervisors (enter it with ``async with``).

        ``options`` go to the runtime (``drain_wait``, ``arbiter``, ``eviction``...).
        """
        settings: dict[str, Any] = {"drain_poll": 0.02, "clock": self.clock, **options}
        roster = EngineRoster()  # its supervisors know each other's engines (RD9)
        return hostler.Runtime(
            self.store,
            functools.partial(self._supervisor, owned=roster.pids),
            ledger=self.ledger,
            roster=roster,
            **settings,
        )
