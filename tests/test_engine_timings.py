"""RD7: an engine's startup timeout and default idle stop are the adapter's, the config's over.

The startup checks run hostler's real supervisor over the fake engine (a real process whose
model load takes as long as the test says): an adapter's short ``startup_timeout`` fails a slow
start in about that time, and a policy (the config's per-engine setting) overrides it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from hostler.config import DaemonConfig, EngineConfig, load_config
from hostler.engines.process import token_holders
from hostler.engines.supervisor import SupervisorPolicy
from hostler.errors import EngineStartError, PluginError, UsageError
from hostler.plugin import (
    MAX_IDLE_TIMEOUT,
    MAX_STARTUP_TIMEOUT,
    EngineAdapter,
    LaunchCommand,
    LaunchSpec,
    timing_problem,
)
from hostler.store.log import EventStore
from hostler.testing.fake_engine import Behaviour, FakeEngineAdapter
from hostler.testing.harness import FAST_POLICY, Harness
from hostler_ds4 import Ds4Adapter
from hostler_llamacpp import LlamaCppAdapter
from hostler_mlx import MlxAdapter
from hostler_sdcpp import SdCppAdapter

pytestmark = pytest.mark.anyio
KEY = "fake:slow:0"


class QuickToGiveUp(FakeEngineAdapter):
    """The fake engine, with an adapter that gives a start one second."""

    startup_timeout = 1.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EventStore]:
    opened = EventStore.open(tmp_path / "events.db", owner=True)
    try:
        yield opened
    finally:
        opened.close()


def harness(
    tmp_path: Path, store: EventStore, adapter: EngineAdapter, policy: SupervisorPolicy
) -> Harness:
    return Harness(tmp_path / "data", store, {"fake": adapter}, policy=policy)


def engine_types(store: EventStore) -> list[str]:
    return [r.type for r in store.read_stream(f"engine/{KEY}")]


def leftovers(rig: Harness) -> list[int]:
    prefix = f"{rig.token_prefix}:"
    return [p.pid for p, _ in token_holders(lambda token: token.startswith(prefix))]


# -- the adapter's value, under the real supervisor --------------------------------------------


async def test_an_adapters_short_startup_timeout_fails_a_slow_start_in_about_that_time(
    tmp_path: Path, store: EventStore
) -> None:
    slow = Behaviour(load_seconds=30, listen_while_loading=True)  # /health 503 while loading
    rig = harness(tmp_path, store, QuickToGiveUp(slow), FAST_POLICY)
    sup = rig.supervisor(KEY)
    assert FAST_POLICY.startup_timeout is None  # the policy leaves it to the adapter
    assert sup.startup_timeout == 1.0
    began = time.monotonic()
    with pytest.raises(EngineStartError, match=rf"^{KEY}: did not become ready within 1 s$"):
        await sup.ensure_running()
    took = time.monotonic() - began
    assert 1.0 <= took < 6.0, took  # its own second, not the default 180 s nor the 30 s load
    assert leftovers(rig) == []  # the slow process group was killed
    assert rig.ledger.snapshot()["by_key"] == []  # and its reservation released
    types = engine_types(store)
    assert types[-3:] == ["engine.start_requested", "engine.spawned", "engine.crashed"], types


async def test_the_default_startup_timeout_waits_for_the_same_slow_load(
    tmp_path: Path, store: EventStore
) -> None:
    """The control: the plain fake adapter (180 s, the base default) lets a 2 s load finish."""
    rig = harness(tmp_path, store, FakeEngineAdapter(Behaviour(load_seconds=2)), FAST_POLICY)
    sup = rig.supervisor(KEY)
    assert sup.startup_timeout == 180.0
    began = time.monotonic()
    try:
        with anyio.fail_after(60):
            await sup.ensure_running()
        assert time.monotonic() - began >= 2.0
        assert sup.state == "running"
    finally:
        await sup.stop()


async def test_a_policys_startup_timeout_overrides_the_adapters(
    tmp_path: Path, store: EventStore
) -> None:
    """The config's per-engine setting reaches the supervisor as its policy: it wins."""
    longer = SupervisorPolicy(watch_interval=0.05, idle_timeout=0, startup_timeout=60.0)
    rig = harness(tmp_path, store, QuickToGiveUp(Behaviour(load_seconds=2)), longer)
    sup = rig.supervisor(KEY)
    assert sup.startup_timeout == 60.0
    try:
        with anyio.fail_after(60):
            await sup.ensure_running()  # 2 s: past the adapter's 1 s, within the policy's 60
        assert sup.state == "running"
    finally:
        await sup.stop()


async def test_a_bad_timing_on_an_adapter_instance_is_its_plugins_fault(
    tmp_path: Path, store: EventStore
) -> None:
    adapter = FakeEngineAdapter()
    adapter.startup_timeout = math.nan  # type: ignore[misc] # past the class's own check
    rig = harness(tmp_path, store, adapter, FAST_POLICY)
    sup = rig.supervisor(KEY)
    with pytest.raises(PluginError, match=r"FakeEngineAdapter\) has a bad timing: .*nan"):
        await sup.ensure_running()
    assert leftovers(rig) == []
    types = engine_types(store)
    assert "engine.spawned" not in types and types[-1] == "engine.failed", types
    assert rig.ledger.snapshot()["by_key"] == []


# -- the class attributes -----------------------------------------------------------------------


def adapter_class(**timings: object) -> type[EngineAdapter]:
    def build(_self: EngineAdapter, spec: LaunchSpec) -> LaunchCommand:
        return LaunchCommand([str(spec.port)])

    return type(
        "Timed", (EngineAdapter,), {"engine_type": "timed", "build_command": build, **timings}
    )


def test_the_defaults_and_the_bounds_by_value() -> None:
    assert EngineAdapter.startup_timeout == 180.0
    assert EngineAdapter.default_idle_timeout is None
    assert MAX_STARTUP_TIMEOUT == 86_400.0
    assert MAX_IDLE_TIMEOUT == 31_536_000.0
    assert timing_problem(EngineAdapter) is None


@pytest.mark.parametrize(
    "value",
    [0, 0.0, -1.0, math.nan, math.inf, -math.inf, True, "10", None, MAX_STARTUP_TIMEOUT + 1],
)
def test_a_startup_timeout_that_is_no_usable_seconds_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match=r"^Timed\.startup_timeout .*: seconds over 0 and at most"):
        adapter_class(startup_timeout=value)


@pytest.mark.parametrize("value", [1e-3, 1, 600.0, MAX_STARTUP_TIMEOUT])
def test_startup_timeouts_at_the_edges_are_taken(value: float) -> None:
    assert adapter_class(startup_timeout=value).startup_timeout == value


@pytest.mark.parametrize(
    "value", [-1.0, -1e-9, math.nan, math.inf, False, "300", MAX_IDLE_TIMEOUT + 1]
)
def test_a_default_idle_timeout_that_is_no_usable_seconds_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match=r"^Timed\.default_idle_timeout .*: None \(the daemon's\)"):
        adapter_class(default_idle_timeout=value)


@pytest.mark.parametrize("value", [None, 0, 0.0, 1800.0, MAX_IDLE_TIMEOUT])
def test_default_idle_timeouts_at_the_edges_are_taken(value: float | None) -> None:
    assert adapter_class(default_idle_timeout=value).default_idle_timeout == value


def test_timing_problem_reads_an_instance_too() -> None:
    adapter = FakeEngineAdapter()
    assert timing_problem(adapter) is None
    adapter.default_idle_timeout = -5.0  # type: ignore[misc]
    assert timing_problem(adapter) == (
        "FakeEngineAdapter.default_idle_timeout -5.0: None (the daemon's) or seconds from 0 "
        "(never) to 31536000"
    )


def test_the_built_in_engines_timings_are_the_seeds() -> None:
    """llama.cpp 180 s, ds4 600 s (D3), MLX 300 s (M4), sd-server 5 min and 30 min idle (I1)."""
    timings = {
        cls.engine_type: (cls.startup_timeout, cls.default_idle_timeout)
        for cls in (LlamaCppAdapter, Ds4Adapter, MlxAdapter, SdCppAdapter)
    }
    assert timings == {
        "llamacpp": (180.0, None),  # idle: the daemon's (5 minutes by default)
        "ds4": (600.0, None),
        "mlx": (300.0, None),
        "sdcpp": (300.0, 1800.0),
    }


# -- the config's precedence --------------------------------------------------------------------


def test_idle_precedence_model_then_engine_config_then_adapter_then_daemon(tmp_path: Path) -> None:
    daemon = DaemonConfig(data_dir=tmp_path, idle_timeout=300.0)
    bare = EngineConfig(key="sdcpp:a:0", model=tmp_path)
    assert daemon.idle_timeout_of(bare) == 300.0  # nothing set: the daemon's
    assert daemon.idle_timeout_of(bare, 1800.0) == 1800.0  # the adapter's default
    engine = EngineConfig(key="sdcpp:a:0", model=tmp_path, engine_idle_timeout=60.0)
    assert daemon.idle_timeout_of(engine, 1800.0) == 60.0  # the engine's config wins
    assert daemon.idle_timeout_of(engine) == 60.0
    model = EngineConfig(key="sdcpp:a:0", model=tmp_path, idle_ttl=5.0, engine_idle_timeout=60.0)
    assert daemon.idle_timeout_of(model, 1800.0) == 5.0  # the model's own wins over all
    never = EngineConfig(key="sdcpp:a:0", model=tmp_path, idle_ttl=0.0, engine_idle_timeout=60.0)
    assert daemon.idle_timeout_of(never, 1800.0) == 0.0  # 0 is a setting (never), not unset
    off = EngineConfig(key="sdcpp:a:0", model=tmp_path, engine_idle_timeout=0.0)
    assert daemon.idle_timeout_of(off, 1800.0) == 0.0
    assert daemon.idle_timeout_of(bare, 0.0) == 0.0  # an adapter's 0: never
    pinned = EngineConfig(
        key="sdcpp:a:0", model=tmp_path, pinned=True, idle_ttl=5.0, engine_idle_timeout=60.0
    )
    assert daemon.idle_timeout_of(pinned, 1800.0) == 0.0  # PP17: pinned is never idle


def test_engine_defaults_carry_the_timings_to_each_entry(tmp_path: Path) -> None:
    config = tmp_path / "hostler.toml"
    config.write_text(
        "[daemon]\nidle_timeout = 120\n"
        "[engine_defaults.sdcpp]\nidle_timeout = 600\nstartup_timeout = 42.5\n"
        '[[models]]\nid = "pic"\nengine = "sdcpp"\npath = "p.gguf"\n'
        '[[models]]\nid = "pic2"\nengine = "sdcpp"\npath = "p.gguf"\nidle_ttl = 7\n'
        '[[models]]\nid = "chat"\npath = "c.gguf"\n'
        '[[engines]]\nkey = "sdcpp:old:0"\nmodel = "p.gguf"\n'
    )
    loaded = load_config(config)
    by_key = {e.key: e for e in loaded.engines}
    pic, pic2, chat, old = (
        by_key[k] for k in ("sdcpp:pic:0", "sdcpp:pic2:0", "llamacpp:chat:0", "sdcpp:old:0")
    )
    assert (pic.engine_idle_timeout, pic.startup_timeout) == (600.0, 42.5)
    assert (old.engine_idle_timeout, old.startup_timeout) == (600.0, 42.5)
    assert (chat.engine_idle_timeout, chat.startup_timeout) == (None, None)
    assert loaded.idle_timeout_of(pic, SdCppAdapter.default_idle_timeout) == 600.0
    assert loaded.idle_timeout_of(pic2, SdCppAdapter.default_idle_timeout) == 7.0
    assert loaded.idle_timeout_of(chat, LlamaCppAdapter.default_idle_timeout) == 120.0


def test_engine_defaults_timings_at_the_edges_are_taken(tmp_path: Path) -> None:
    config = tmp_path / "hostler.toml"
    config.write_text("[engine_defaults.x]\nidle_timeout = 0\nstartup_timeout = 86400\n")
    load_config(config)  # 0: never idle-stopped; a day: the longest start
    config.write_text("[engine_defaults.x]\nidle_timeout = 31536000\nstartup_timeout = 0.001\n")
    load_config(config)


@pytest.mark.parametrize(
    ("setting", "wanted"),
    [
        ("startup_timeout = 0", "greater than 0"),
        ("startup_timeout = -1", "greater than 0"),
        ("startup_timeout = nan", "(got nan)"),
        ("startup_timeout = inf", "less than or equal to 86400"),
        ("startup_timeout = 86401", "less than or equal to 86400"),
        ("startup_timeout = true", "valid number"),
        ('startup_timeout = "3m"', "valid number"),
        ("idle_timeout = -1", "greater than or equal to 0"),
        ("idle_timeout = nan", "(got nan)"),
        ("idle_timeout = 31536001", "less than or equal to 31536000"),
        ("idle_timeout = false", "valid number"),
        ("startup_timout = 3", "did you mean 'startup_timeout'?"),
    ],
)
def test_a_bad_engine_timing_is_one_line_naming_the_key(
    tmp_path: Path, setting: str, wanted: str
) -> None:
    config = tmp_path / "hostler.toml"
    config.write_text(f"[engine_defaults.sdcpp]\n{setting}\n")
    key = setting.split(" ", 1)[0]
    with pytest.raises(UsageError) as caught:
        load_config(config)
    message = caught.value.message
    assert message.startswith(f"{config}: engine_defaults.sdcpp.{key}: "), message
    assert wanted in message and "\n" not in message, message
