"""The adapter conformance suite: the engine adapter contract, checked for any adapter.

One import and two fixtures run it against your adapter::

    # tests/test_conformance.py
    from pathlib import Path

    import pytest
    from hostler.testing.conformance import AdapterConformance
    from my_plugin import MyAdapter


    class TestMyAdapter(AdapterConformance):
        @pytest.fixture
        def adapter(self) -> MyAdapter:
            return MyAdapter()

        @pytest.fixture
        def model(self, tmp_path_factory) -> Path:
            return make_a_tiny_model(tmp_path_factory.mktemp("model"))

Every check is one test method (``test_*``), so a failure names the rule it broke. The static
checks call the adapter's methods; the live ones (``test_live_*``) run the engine it builds
under hostler's real supervisor, as a real process with a real event log and ledger: started,
probed for readiness, asked for a completion, stopped, and adopted by a fresh supervisor after
a simulated daemon restart. A subclass tunes the suite with class attributes
(:attr:`AdapterConformance.serves_completions`, :attr:`~AdapterConformance.startup_timeout`,
...), and may override any fixture or check. New checks are added as new methods; the contract
grows with defaults, so a suite that passed keeps passing for adapters that keep the rules.

The suite needs neither the pytest plugin nor an async test runner (the live checks drive
their own event loop).
"""

from __future__ import annotations

import contextlib
import importlib
import ipaddress
import json
import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from importlib.metadata import EntryPoint
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import anyio
import psutil
import pytest

from hostler.capacity.budget import HostMemory, compute_budget
from hostler.drivers.host_ledger import HostLedger, OwnerIdentity
from hostler.engines.process import token_holders
from hostler.engines.reconcile import reconcile
from hostler.engines.runner import OsProcess
from hostler.engines.supervisor import Supervisor, SupervisorPolicy
from hostler.machines.engine import Engine
from hostler.plugin import (
    PROJECT,
    CacheAdapter,
    EngineAdapter,
    LaunchCommand,
    LaunchSpec,
    ModelGeometry,
    Panic,
    launch_command,
    timing_problem,
)
from hostler.pluginhost import PluginHost
from hostler.replay import load
from hostler.store.log import EventStore
from hostler.testing.harness import HOST_MEMORY

__all__ = ["EXTRA_ARGS", "AdapterConformance", "Live"]

#: The operator extras the suite passes: a value, a bare flag and one turned off.
EXTRA_ARGS: dict[str, str | int | float | bool] = {
    "--hostler-conformance-value": "v1",
    "--hostler-conformance-bare": True,
    "--hostler-conformance-off": False,
}
#: Ordinary lines an engine prints that must not read as fatal.
BENIGN_LINES = (
    "",
    "   ",
    "server is listening on http://127.0.0.1:8080",
    "loading model",
    "INFO: request served in 12 ms",
    "warming up",
)
#: Odd lines classify_line must survive (None or a Panic, never an exception).
ODD_LINES = ("\x00\x01binary", "é" * 10_000, "\t\r", "[" * 300)


class Live:
    """One live engine under the real supervisor, for the ``test_live_*`` checks.

    Args:
        suite: The conformance test (its settings).
        adapter: The adapter under test.
        model: The model to launch.
        options: The launch spec's ``options``.
        folder: A private directory (the data directory).
    """

    def __init__(
        self,
        suite: AdapterConformance,
        adapter: EngineAdapter,
        model: Path,
        options: dict[str, object],
        folder: Path,
    ) -> None:
        self.suite = suite
        self.adapter = adapter
        self.model = model
        self.options = options
        self.folder = folder
        self.key = f"{adapter.engine_type}:conformance:0"
        self.token_prefix = f"hostler-conformance-{os.getpid()}-{folder.name}"
        self.store = EventStore.open(folder / "events.db", owner=True)
        self.ledger = HostLedger(
            self.store,
            OwnerIdentity.current("hostler-conformance"),
            lambda: compute_budget(HostMemory(HOST_MEMORY)),
        )

    def spec(self, port: int) -> LaunchSpec:
        """The launch spec of the live engine on ``port``."""
        work = self.folder / "run" / "work"
        return self.suite.launch_spec(self.model, port, self.options, key=self.key, work_dir=work)

    def supervisor(self) -> Supervisor:
        """A fresh supervisor of the live engine's key (as a restarted daemon makes one)."""
        adapter = self.adapter
        return Supervisor(
            self.key,
            adapter,
            self.spec,
            self.store,
            run_dir=self.folder / "run",
            token_prefix=self.token_prefix,
            policy=SupervisorPolicy(
                startup_timeout=self.suite.startup_timeout,
                watch_interval=0.05,
                idle_timeout=0,
                stop_grace=self.suite.stop_grace,
            ),
            ledger=self.ledger,
            footprint=lambda: adapter.estimate_footprint(
                adapter.read_geometry(self.model), self.spec(0)
            ),
        )

    def engine_pids(self) -> list[int]:
        """Live processes carrying this suite's launch tokens."""
        prefix = f"{self.token_prefix}:"
        return [p.pid for p, _ in token_holders(lambda token: token.startswith(prefix))]

    def reservations(self) -> list[str]:
        """The keys the ledger holds bytes for."""
        return [str(held["key"]) for held in self.ledger.snapshot()["by_key"]]

    def events(self) -> list[str]:
        """The engine's recorded event types, in order."""
        return [r.type for r in self.store.read_stream(f"engine/{self.key}")]

    def close(self) -> None:
        """Kill whatever the suite started that is still alive, and close the log."""
        for pid in self.engine_pids():
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        self.store.close()


def _http(port: int, path: str, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data, headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:  # noqa: S310 - loopback
            return int(reply.status), reply.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def _tokens(command: LaunchCommand) -> list[str]:
    """Every argv token, and both halves of ``--flag=value`` ones, and the env values."""
    out: list[str] = []
    for token in [*command.argv, *command.env.values()]:
        out.append(token)
        if "=" in token:
            out.extend(token.split("=", 1))
    return out


class AdapterConformance:
    """The contract's checks; subclass it as ``Test...`` and supply ``adapter`` and ``model``.

    Class attributes a subclass may set:
        serves_completions: The engine answers ``completion_path`` with an OpenAI completion.
        completion_path: Where the live check asks for one.
        completion_body: What it sends.
        startup_timeout: Seconds the live checks give the engine to become ready.
        stop_grace: Seconds between the stop's SIGTERM and SIGKILL.
        ctx_per_slot: The context the launch specs ask for.
    """

    serves_completions: ClassVar[bool] = True
    completion_path: ClassVar[str] = "/v1/chat/completions"
    completion_body: ClassVar[dict[str, Any]] = {
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 2,
        "temperature": 0,
    }
    startup_timeout: ClassVar[float] = 120.0
    stop_grace: ClassVar[float] = 5.0
    ctx_per_slot: ClassVar[int] = 512

    # -- fixtures a subclass supplies ------------------------------------------------------

    @pytest.fixture
    def adapter(self) -> EngineAdapter:
        """The adapter under test: override this fixture."""
        raise NotImplementedError(
            f"{type(self).__name__}: override the 'adapter' fixture to return your adapter"
        )

    @pytest.fixture
    def model(self) -> Path:
        """A model the adapter's engine loads (small, for speed): override this fixture."""
        raise NotImplementedError(
            f"{type(self).__name__}: override the 'model' fixture to return a model path"
        )

    @pytest.fixture
    def plugin_module(self, adapter: EngineAdapter) -> ModuleType:
        """The module your entry point names (default: the adapter's top-level package)."""
        return importlib.import_module(type(adapter).__module__.split(".", maxsplit=1)[0])

    @pytest.fixture
    def launch_options(self) -> dict[str, object]:
        """The ``options`` every launch spec carries (default: none)."""
        return {}

    @pytest.fixture
    def live(
        self,
        adapter: EngineAdapter,
        model: Path,
        launch_options: dict[str, object],
        tmp_path: Path,
    ) -> Iterator[Live]:
        """A live-engine rig; anything it started is killed after the test."""
        rig = Live(self, adapter, model, launch_options, tmp_path)
        try:
            yield rig
        finally:
            rig.close()

    def launch_spec(
        self, model: Path, port: int, options: dict[str, object], **changes: Any
    ) -> LaunchSpec:
        """The spec the suite launches (``changes`` replace its fields)."""
        spec = LaunchSpec(
            "conformance:m:0", model, port, ctx_per_slot=self.ctx_per_slot, options=options
        )
        return replace(spec, **changes)

    @pytest.fixture
    def spec(self, model: Path, launch_options: dict[str, object], tmp_path: Path) -> LaunchSpec:
        """A launch spec on port 18081 with a work directory."""
        return self.launch_spec(model, 18081, launch_options, work_dir=tmp_path / "work")

    # -- names and registration ------------------------------------------------------------

    def test_engine_type_is_a_valid_name(self, adapter: EngineAdapter) -> None:
        """The engine name is set and passes hostler's rule (lower case, digits, - and _)."""
        name = adapter.engine_type
        assert name, "engine_type is empty: set it on the adapter class"

        def build(_self: EngineAdapter, spec: LaunchSpec) -> LaunchCommand:
            return LaunchCommand([str(spec.port)])

        try:
            type("NameProbe", (EngineAdapter,), {"engine_type": name, "build_command": build})
        except ValueError as exc:
            pytest.fail(str(exc))

    def test_registered_through_the_hook(
        self, adapter: EngineAdapter, plugin_module: ModuleType
    ) -> None:
        """Its plugin module registers this adapter class through ``register_engines``."""
        point = EntryPoint("conformance", plugin_module.__name__, PROJECT)
        host = PluginHost(entry_points_source=lambda: [point]).load()
        record = host.plugins["conformance"]
        assert record.status == "ok", f"the plugin failed to load: {record.error}"
        assert host.adapters.get(adapter.engine_type) is type(adapter), (
            f"{plugin_module.__name__} registers {record.engines}, not {adapter.engine_type!r}"
        )

    def test_the_host_builds_it_with_no_arguments(
        self, adapter: EngineAdapter, plugin_module: ModuleType
    ) -> None:
        """The daemon builds adapters itself, from the class alone: no constructor arguments."""
        point = EntryPoint("conformance", plugin_module.__name__, PROJECT)
        host = PluginHost(entry_points_source=lambda: [point]).load()
        built = host.adapter(adapter.engine_type)
        assert type(built) is type(adapter), type(built)

    # -- the launch --------------------------------------------------------------------------

    def test_argv_is_a_program_and_strings(self, adapter: EngineAdapter, spec: LaunchSpec) -> None:
        """``build_command`` gives a non-empty argv of strings and an env of strings."""
        command: Any = adapter.build_command(spec)
        assert isinstance(command, LaunchCommand), type(command)
        argv: list[Any] = list(command.argv)
        assert argv, "the argv is empty"
        assert all(isinstance(t, str) for t in argv), argv
        assert argv[0].strip(), "argv[0] (the program) is blank"
        env: dict[Any, Any] = dict(command.env)
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()), env

    def test_argv_names_the_port_and_the_model(
        self, adapter: EngineAdapter, spec: LaunchSpec
    ) -> None:
        """The engine is told the port hostler chose and the model it was given."""
        tokens = _tokens(adapter.build_command(spec))
        assert str(spec.port) in tokens, f"port {spec.port} is not in the launch: {tokens}"
        assert any(str(spec.model) in t for t in tokens), f"{spec.model} is not in {tokens}"

    def test_another_port_changes_only_the_port(
        self, adapter: EngineAdapter, spec: LaunchSpec
    ) -> None:
        """Two ports, two launches that differ where the port is named, and nowhere else."""
        one = adapter.build_command(spec).argv
        two = adapter.build_command(replace(spec, port=spec.port + 1)).argv
        assert len(one) == len(two)
        changed = [(a, b) for a, b in zip(one, two, strict=True) if a != b]
        assert changed, "the argv does not change with the port"
        assert all(str(spec.port) in a and str(spec.port + 1) in b for a, b in changed), changed

    def test_binds_loopback_only(self, adapter: EngineAdapter, spec: LaunchSpec) -> None:
        """No address in the launch is anything but loopback (engines bind 127.0.0.1)."""
        for token in _tokens(adapter.build_command(spec)):
            try:
                address = ipaddress.ip_address(token.strip("[]"))
            except ValueError:
                continue
            assert address.is_loopback, f"the launch names {token}: bind 127.0.0.1 only"

    def test_the_same_spec_builds_the_same_launch(
        self, adapter: EngineAdapter, spec: LaunchSpec
    ) -> None:
        """``build_command`` is a function of the spec (adoption matches argv fingerprints)."""
        assert adapter.build_command(spec) == adapter.build_command(spec)

    def test_extra_args_come_last(self, adapter: EngineAdapter, spec: LaunchSpec) -> None:
        """Operator extras end the argv in order: value, bare flag (True); False omits it.

        Checked on the launch hostler runs (:func:`~hostler.plugin.launch_command`): the
        adapter's argv, then the extras hostler appends unless ``applies_extra_args`` is set.
        """
        argv = launch_command(adapter, replace(spec, extra_args=EXTRA_ARGS)).argv
        expected = ["--hostler-conformance-value", "v1", "--hostler-conformance-bare"]
        assert argv[-3:] == expected, f"the argv ends {argv[-3:]}, not {expected}"
        assert "--hostler-conformance-off" not in argv

    # -- readiness and output -----------------------------------------------------------------

    def test_readiness_reads_2xx_as_ready_and_loading_as_not(self, adapter: EngineAdapter) -> None:
        """The readiness path is a path; 200 means ready, 503 (loading) and 500 do not."""
        assert adapter.readiness_path.startswith("/"), adapter.readiness_path
        assert adapter.is_ready(200) is True
        assert adapter.is_ready(503) is False
        assert adapter.is_ready(500) is False
        assert adapter.is_ready(404) is False

    def test_timings_are_sane(self, adapter: EngineAdapter) -> None:
        """RD7: the start and idle timings are finite seconds within hostler's bounds.

        ``startup_timeout`` over 0 and at most a day; ``default_idle_timeout`` None or from 0
        to a year; never a bool, NaN or infinity.
        """
        problem = timing_problem(adapter)
        assert problem is None, problem

    def test_ordinary_lines_are_not_fatal(self, adapter: EngineAdapter) -> None:
        """Plain output is not a panic; odd bytes never make ``classify_line`` raise."""
        for line in BENIGN_LINES:
            assert adapter.classify_line(line) is None, f"{line!r} read as fatal"
        for line in ODD_LINES:
            assert isinstance(adapter.classify_line(line), Panic | None)

    # -- pricing --------------------------------------------------------------------------------

    def test_geometry_reads_the_model(self, adapter: EngineAdapter, model: Path) -> None:
        """``read_geometry`` reads the model the live checks launch, the same twice."""
        geometry = adapter.read_geometry(model)
        assert isinstance(geometry, ModelGeometry)
        assert geometry == adapter.read_geometry(model)
        assert geometry.file_size >= 0

    def test_price_is_a_non_negative_int_and_deterministic(
        self, adapter: EngineAdapter, model: Path, spec: LaunchSpec
    ) -> None:
        """The footprint estimate is whole bytes, above zero, and the same for the same input."""
        geometry = adapter.read_geometry(model)
        price: Any = adapter.estimate_footprint(geometry, spec)
        assert type(price) is int, f"estimate_footprint gave a {type(price).__name__}"
        assert price > 0, f"estimate_footprint is {price}"
        assert price == adapter.estimate_footprint(geometry, spec)

    def test_more_context_or_slots_never_cost_less(
        self, adapter: EngineAdapter, model: Path, spec: LaunchSpec
    ) -> None:
        """Doubling the context or the slots never lowers the estimate."""
        geometry = adapter.read_geometry(model)
        base = adapter.estimate_footprint(geometry, spec)
        longer = replace(spec, ctx_per_slot=spec.ctx_per_slot * 2)
        assert adapter.estimate_footprint(geometry, longer) >= base
        assert adapter.estimate_footprint(geometry, replace(spec, slots=spec.slots * 2)) >= base

    # -- identity and cache ---------------------------------------------------------------------

    def test_build_identity_is_a_stable_name(
        self, adapter: EngineAdapter, spec: LaunchSpec
    ) -> None:
        """The build identity (learning is kept per build) is a non-empty, stable string."""
        command = adapter.build_command(spec)
        identity: Any = adapter.build_identity(command)
        assert isinstance(identity, str), type(identity)
        assert identity.strip(), "the build identity is blank"
        assert identity == adapter.build_identity(command)

    def test_cache_adapter_is_none_or_one(self, adapter: EngineAdapter, spec: LaunchSpec) -> None:
        """``cache_adapter`` gives None or an object with the cache protocol's methods."""
        cache = adapter.cache_adapter(spec)
        assert cache is None or isinstance(cache, CacheAdapter), type(cache)

    # -- live, under the real supervisor ---------------------------------------------------------

    def test_live_start_serve_stop(self, live: Live) -> None:
        """Started, ready by its own readiness rule, serving, then stopped with its group.

        The reservation is held while it runs and released once it is gone.
        """
        anyio.run(self._start_serve_stop, live)

    async def _start_serve_stop(self, live: Live) -> None:
        sup = live.supervisor()
        port = await sup.ensure_running()
        assert sup.state == "running"
        assert live.reservations() == [live.key]
        wide = await anyio.to_thread.run_sync(_listening_beyond_loopback, live.engine_pids())
        assert not wide, f"the engine listens beyond loopback on {', '.join(wide)}: bind 127.0.0.1"
        status, _ = await anyio.to_thread.run_sync(_http, port, live.adapter.readiness_path)
        assert live.adapter.is_ready(status), f"ready, yet its readiness path answers {status}"
        if self.serves_completions:
            asked = dict(self.completion_body)
            if live.adapter.request_model is not None:  # RD10: as hostler serve forwards it
                asked["model"] = live.adapter.request_model
            status, body = await anyio.to_thread.run_sync(_http, port, self.completion_path, asked)
            assert status == 200, f"{self.completion_path} answered {status}: {body[:300]!r}"
            assert json.loads(body).get("choices"), body[:300]
        began = time.monotonic()
        await sup.stop()
        assert time.monotonic() - began < self.stop_grace + 10
        assert sup.state == "stopped"
        assert live.engine_pids() == [], "processes of the engine outlived its stop"
        assert live.reservations() == []
        assert live.events()[-2:] == ["engine.stop_requested", "engine.stopped"]

    def test_live_adopted_after_a_daemon_restart(self, live: Live) -> None:
        """A fresh supervisor adopts the running engine (no reload), then stops it."""
        anyio.run(self._adopt, live)

    async def _adopt(self, live: Live) -> None:
        first = live.supervisor()
        await first.ensure_running()
        pid = first.pid
        assert pid is not None
        reaper = _orphan(first)  # the daemon dies here: nothing is stopped, the engine runs on
        engine = load(live.store, Engine, live.key)
        outcomes = await reconcile(
            live.store,
            {live.key: engine},
            token_prefix=live.token_prefix,
            daemon_pid=os.getpid(),
            readiness_path=lambda _key: live.adapter.readiness_path,
            clock=time.time,
        )
        assert [(o.result, o.pid) for o in outcomes] == [("adopted", pid)], outcomes
        second = live.supervisor()
        identity = outcomes[0].identity
        assert identity is not None
        second.adopt(identity, outcomes[0].pidfd)
        assert second.pid == pid
        await second.stop()
        assert live.engine_pids() == [], "the adopted engine outlived its stop"
        assert load(live.store, Engine, live.key).state == "stopped"
        reaper.join(timeout=10)


def _orphan(dead: Supervisor) -> threading.Thread:
    """Reap the dead daemon's engine when it ends, as init does after a real restart.

    Here the engine is this process's child (it would not be a restarted daemon's): a thread
    waits for it, so that it leaves no zombie behind for the adopter to mistake for alive.
    """
    child = getattr(dead, "_child", None)
    proc = getattr(child, "proc", None)
    popen = proc.popen if isinstance(proc, OsProcess) else None  # our child, to be reaped
    reaper = threading.Thread(target=popen.wait if popen else lambda: None, daemon=True)
    reaper.start()
    return reaper


def _listening_beyond_loopback(pids: list[int]) -> list[str]:
    """The addresses the processes (and their children) take requests on that are not loopback.

    A TCP socket counts while it listens; a UDP socket whenever it is bound (it has no listening
    state). ``pids`` are the launch token's holders, so a double-forked child is among them.
    """
    wide: list[str] = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            family = [process, *process.children(recursive=True)]
        except psutil.Error:
            continue
        for member in family:
            try:
                sockets = member.net_connections(kind="inet")
            except psutil.Error:
                continue
            for conn in sockets:
                ip: object = getattr(conn.laddr, "ip", None)  # an unbound socket has no address
                if not isinstance(ip, str):
                    continue
                if conn.type == socket.SOCK_STREAM and conn.status != psutil.CONN_LISTEN:
                    continue
                if not ipaddress.ip_address(ip.split("%")[0]).is_loopback:
                    wide.append(f"{ip}:{conn.laddr.port}")
    return sorted(set(wide))
