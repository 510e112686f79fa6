"""The daemon's engines, composed once: one configured key in, one whole supervisor out.

:class:`ConfiguredEngines` is the one place a configured engine becomes a
:class:`~hostler.engines.supervisor.Supervisor`: its adapter, its priced launcher (the
:class:`~hostler.engines.launcher.LedgerLauncher` of its :class:`LaunchRequest`), its run
directory and its policy, built in one call from what the daemon opened at start-up. The
runtime asks it for a supervisor the first time a key is used (:meth:`supervisor`), and
``preview`` asks it for the very launcher that supervisor prices its starts with
(:meth:`launcher`), so a preview needs no supervisor and prices the same bytes.

An engine the daemon adopted but no config names gets a stop-only supervisor (OW5): it can
be stopped, never started. Besides the config's engines, the factory builds the engines of the
models discovery offers (:class:`OfferedEngines`, the daemon's catalog), which can come and go
while the daemon runs: each start asks for its engine's launch anew, so a model that is no
longer offered is not started again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Protocol

from hostler.capacity.keys import parse_key
from hostler.clock import SYSTEM_CLOCK, Clock
from hostler.config import DaemonConfig, EngineConfig
from hostler.drivers.host_ledger import HostLedger
from hostler.drivers.loghealth import LogHealth
from hostler.drivers.offloop import OffLoop
from hostler.engines.launcher import FixedLauncher, Launch, Launcher, LedgerLauncher
from hostler.engines.price import LaunchRequest
from hostler.engines.roster import EngineRoster
from hostler.engines.supervisor import Supervisor, SupervisorPolicy
from hostler.errors import EngineStartError, HostlerError, PluginError, UnknownEngineError
from hostler.plugin import EngineAdapter, LaunchCommand, LaunchSpec, timing_problem
from hostler.pluginhost import PluginHost, plugin_fault
from hostler.probes.nvml import NvmlProbe
from hostler.store.log import EventStore

__all__ = [
    "ConfiguredEngines",
    "EngineFactory",
    "OfferedEngines",
    "adapter_for",
    "configured_request",
    "launch_request",
    "run_dir",
    "run_dir_name",
    "stop_only_adapter",
]


class EngineFactory(Protocol):
    """What a runtime builds its engines with (the daemon's: :class:`ConfiguredEngines`)."""

    def supervisor(self, key: str) -> Supervisor:
        """``key``'s supervisor, built whole (called once per key)."""
        ...

    def launcher(self, key: str) -> Launcher | None:
        """The launcher ``key``'s starts are priced with; None when it has no planned launch."""
        ...


class OfferedEngines(Protocol):
    """The engines of the models offered beyond the config (the daemon's catalog)."""

    def engine_config(self, key: str) -> EngineConfig | None:
        """``key``'s engine when its model is offered now, else None."""
        ...


class _NothingOffered:
    """No model beyond the config's."""

    def engine_config(self, key: str) -> EngineConfig | None:
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class ConfiguredEngines:
    """The daemon's engines: a configured key's supervisor, its launcher, and stop-only owners.

    Args:
        config: The daemon's settings (its engines, timeouts, log sizes, data directory).
        plugins: The loaded plugins.
        adapters: The configured engines' adapters, by key (a missing plugin's is stop-only).
        store: The daemon's event log.
        ledger: The host ledger every launch is priced against and reserved in.
        token_prefix: This data directory's identity in launch tokens.
        adopted: Keys reconcile adopted (a stop-only owner is made for those nobody configured).
        probe: The GPU probe (None: none).
        offloop: Where blocking work runs.
        health: The log's health, shared by every supervisor.
        roster: The daemon's engines: every supervisor gets its pids as ``owned`` (RD9).
        clock: The daemon's clock, every supervisor's.
        offered: The models offered beyond the config (default: none).
    """

    config: DaemonConfig
    plugins: PluginHost
    adapters: Mapping[str, EngineAdapter]
    store: EventStore
    ledger: HostLedger
    token_prefix: str
    adopted: Collection[str]
    probe: NvmlProbe | None
    offloop: OffLoop
    health: LogHealth
    roster: EngineRoster
    clock: Clock = SYSTEM_CLOCK
    offered: OfferedEngines = dataclasses.field(default_factory=_NothingOffered)

    def engine_config(self, key: str) -> EngineConfig | None:
        """The config of ``key``; another replica of a configured model shares its settings.

        Else the engine of a model offered now (discovered); None when neither.
        """
        for engine in self.config.engines:
            if engine.key == key:
                return engine
        parsed = parse_key(key)
        for engine in self.config.engines:
            other = parse_key(engine.key)
            if parsed and other and (other.engine, other.model) == (parsed.engine, parsed.model):
                return dataclasses.replace(engine, key=key)
        return self.offered.engine_config(key)

    def launcher(self, key: str) -> LedgerLauncher | None:
        """The launcher ``key``'s supervisor prices every start with (None: not configured)."""
        engine = self.engine_config(key)
        return None if engine is None else self._launcher(engine, self._adapter(engine))

    def supervisor(self, key: str) -> Supervisor:
        """A configured engine's supervisor, else a stop-only one for an adopted key (OW5)."""
        engine = self.engine_config(key)
        if engine is None:
            if key not in self.adopted:
                raise UnknownEngineError(f"{key[:140]}: no engine of that name is configured")
            return self._stop_only(key)
        adapter = self._adapter(engine)
        config = self.config
        return self._build(
            key,
            adapter,
            _Current(self, key),
            SupervisorPolicy(
                # RD7: the config's per-engine startup timeout, else (None) the adapter's
                startup_timeout=engine.startup_timeout,
                # PP17: a pinned engine is never idle-stopped; RD7: a model's idle_ttl, the
                # engine's configured idle, the adapter's default, then the daemon's
                idle_timeout=config.idle_timeout_of(engine, _idle_default(adapter, engine)),
                health_interval=config.health_interval,
                log_max_bytes=config.engine_log_max_bytes,
                log_keep=config.engine_log_keep,
            ),
        )

    def _adapter(self, engine: EngineConfig) -> EngineAdapter:
        return self.adapters.get(engine.key) or adapter_for(self.plugins, engine.key)

    def _launcher(self, engine: EngineConfig, adapter: EngineAdapter) -> LedgerLauncher:
        """The one launcher of a configured engine: its request, priced against the ledger."""
        return LedgerLauncher(
            adapter, self.ledger, configured_request(self.config, engine), limits=self.store
        )

    def _stop_only(self, key: str) -> Supervisor:
        def no_spec(_port: int) -> LaunchSpec:
            raise EngineStartError(f"{key}: not in the config; hostler only stops it")

        return self._build(
            key,
            adapter_for(self.plugins, key),
            FixedLauncher(no_spec),
            SupervisorPolicy(
                log_max_bytes=self.config.engine_log_max_bytes,
                log_keep=self.config.engine_log_keep,
            ),
        )

    def _build(
        self, key: str, adapter: EngineAdapter, launcher: Launcher, policy: SupervisorPolicy
    ) -> Supervisor:
        return Supervisor(
            key,
            adapter,
            None,
            self.store,
            run_dir=run_dir(self.config, key),
            token_prefix=self.token_prefix,
            policy=policy,
            ledger=self.ledger,
            launcher=launcher,
            probe=self.probe,
            offloop=self.offloop,
            health=self.health,
            clock=self.clock,
            owned=self.roster.pids,  # RD9: a sweep spares every engine of this daemon
            held_by_other=self.ledger.held_by_other,  # RD9, IN3: never sweep another daemon's
        )


@dataclasses.dataclass(frozen=True, slots=True)
class _Current:
    """A key's launches, each from its engine as offered at that start (the factory's)."""

    engines: ConfiguredEngines
    key: str

    def price(self) -> Launch:
        """The launch of ``key``'s engine now (its model's file as offered now).

        Raises:
            EngineStartError: Its model is no longer offered (its file is gone).
        """
        launcher = self.engines.launcher(self.key)
        if launcher is None:
            raise EngineStartError(
                f"{self.key}: its model is no longer offered (its file is gone); put the file "
                "back, or ask for a model `hostler models` lists"
            )
        return launcher.price()


def run_dir(config: DaemonConfig, key: str) -> Path:
    """Where ``key``'s engine keeps its files under the daemon's data directory."""
    return config.data_dir / "run" / run_dir_name(key)


def configured_request(config: DaemonConfig, engine: EngineConfig) -> LaunchRequest:
    """The request a configured engine's launches are priced and started from.

    The daemon's supervisors and ``hostler preview --config`` both make it here, so the two
    price the very same launch (its binary, options, flags and work directory).
    """
    return launch_request(engine, run_dir(config, engine.key) / "work")


def launch_request(engine: EngineConfig, work_dir: Path | None = None) -> LaunchRequest:
    """What a configured engine asks of its launches: the one input of its price and spec."""
    return LaunchRequest(
        key=engine.key,
        model=engine.model,
        ctx=engine.ctx,
        slots=engine.slots,
        kv_type=engine.kv_type,
        extra_args=engine.extra_args,
        options=engine.options,
        binary=engine.binary,
        work_dir=work_dir,
    )


def run_dir_name(key: str) -> str:
    """A file name for a key's run directory, one per key (two keys never share one).

    ``:`` becomes ``_`` (``llamacpp:qwen:0`` → ``llamacpp_qwen_0``). A key that holds ``_``
    itself or any character outside ``[A-Za-z0-9.:-]`` could then meet another's name, so it
    gets a short hash of itself appended: ``a/0``, ``a 0`` and ``a_0`` stay apart.
    """
    safe = key.replace(":", "_")
    if re.fullmatch(r"[A-Za-z0-9.:-]+", key):
        return safe
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", key)
    return f"{safe[:180]}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def _idle_default(adapter: EngineAdapter, engine: EngineConfig) -> float | None:
    """RD7: the adapter's ``default_idle_timeout``, checked (a bad one is its plugin's bug)."""
    problem = timing_problem(adapter)
    if problem is not None:
        fault = plugin_fault(adapter.engine_type, type(adapter), f"has a bad timing: {problem}")
        raise PluginError(f"{engine.key}: {fault.message}")
    value = adapter.default_idle_timeout
    return None if value is None else float(value)


def adapter_for(plugins: PluginHost, key: str) -> EngineAdapter:
    """The adapter of a key's engine; a stop-only stand-in when its plugin is not loaded."""
    engine = parse_key(key)
    try:
        return plugins.adapter(engine.engine if engine else key)
    except HostlerError:
        return stop_only_adapter()


def stop_only_adapter() -> EngineAdapter:
    """An adapter that stands in for a plugin that is gone: its engines can only be stopped."""
    return _StopOnlyAdapter()


class _StopOnlyAdapter(EngineAdapter):
    """Stands in for a plugin that is gone, so an adopted engine can still be stopped."""

    engine_type = "unavailable"

    def build_command(self, spec: LaunchSpec) -> LaunchCommand:
        """Never called: a stop-only supervisor starts nothing."""
        raise EngineStartError(f"{spec.key}: its engine plugin is not loaded")
