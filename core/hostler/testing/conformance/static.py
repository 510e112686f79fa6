"""The adapter conformance suite's static checks: they call the adapter's methods, run nothing.

Names and registration, the launch, readiness and output, pricing, identity and cache; each
check is one test method, so a failure names the rule it broke.
"""

from __future__ import annotations

import ipaddress
from dataclasses import replace
from importlib.metadata import EntryPoint
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from hostler.plugin import (
    PROJECT,
    CacheAdapter,
    EngineAdapter,
    LaunchCommand,
    LaunchSpec,
    ModelGeometry,
    Panic,
    SessionCache,
    launch_command,
    timing_problem,
)
from hostler.pluginhost import PluginHost

__all__ = [
    "BENIGN_LINES",
    "EXTRA_ARGS",
    "ODD_LINES",
    "IdentityChecks",
    "LaunchChecks",
    "NamingChecks",
    "OutputChecks",
    "PricingChecks",
]

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


def _tokens(command: LaunchCommand) -> list[str]:
    """Every argv token, and both halves of ``--flag=value`` ones, and the env values."""
    out: list[str] = []
    for token in [*command.argv, *command.env.values()]:
        out.append(token)
        if "=" in token:
            out.extend(token.split("=", 1))
    return out


class NamingChecks:
    """The engine's name, and its plugin's registration through the hook."""

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


class LaunchChecks:
    """The launch ``build_command`` gives: a program, the port and model, loopback, extras last."""

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


class OutputChecks:
    """Readiness by status, sane timings, and output lines read as fatal only when they are."""

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


class PricingChecks:
    """The model's geometry and the footprint estimate (whole bytes, monotonic in the asks)."""

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


class IdentityChecks:
    """The build identity (learning is kept per build) and the prompt-cache adapter."""

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

    def test_a_saving_cache_adapter_holds_nothing_before_its_first_turn(
        self, adapter: EngineAdapter, spec: LaunchSpec
    ) -> None:
        """CC13: a ``SessionCache`` answers ``held_sessions`` at once, without I/O.

        A list of session ids, empty for a launch no turn has reached (its stop saves nothing).
        """
        cache = adapter.cache_adapter(spec)
        if isinstance(cache, SessionCache):
            held: Any = cache.held_sessions()
            assert isinstance(held, list), type(held)
            assert held == [], held
