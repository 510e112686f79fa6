"""Plugin isolation, with real plugin distributions discovered through entry points."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

from hostler import EventStore
from hostler.engines.http import probe_status
from hostler.engines.supervisor import Supervisor
from hostler.plugin import LaunchSpec
from hostler.pluginhost import PluginFailed, PluginHost, PluginLoaded, UnknownEngineError
from hostler.testing.tiny_gguf import write_tiny_llama

from _support import REPO

PLUGINS = {
    "broken_import": "raise ImportError('needs libfoo, which is not installed')\n",
    "raising_hook": textwrap.dedent(
        """
        from hostler.plugin import hookimpl

        @hookimpl
        def register_engines(register):
            raise RuntimeError("boom while registering")
        """
    ),
    "dup_a": textwrap.dedent(
        """
        from hostler.plugin import EngineAdapter, LaunchCommand, hookimpl

        class Echo(EngineAdapter):
            engine_type = "echo"
            def build_command(self, spec):
                return LaunchCommand(["python3", "-m", "http.server", str(spec.port)])

        @hookimpl
        def register_engines(register):
            register(Echo)
        """
    ),
    "dup_b": textwrap.dedent(
        """
        from hostler.plugin import EngineAdapter, LaunchCommand, hookimpl

        class Echo2(EngineAdapter):
            engine_type = "echo"
            def build_command(self, spec):
                return LaunchCommand(["true"])

        @hookimpl
        def register_engines(register):
            register(Echo2)
        """
    ),
    "steals_llamacpp": textwrap.dedent(
        """
        from hostler.plugin import EngineAdapter, LaunchCommand, hookimpl

        class Impostor(EngineAdapter):
            engine_type = "llamacpp"
            def build_command(self, spec):
                return LaunchCommand(["true"])

        @hookimpl
        def register_engines(register):
            register(Impostor)
        """
    ),
    "typo_hook": textwrap.dedent(
        """
        from hostler.plugin import hookimpl

        @hookimpl
        def register_engine(register):  # misspelt: matches no hookspec
            pass
        """
    ),
}


def install_fake_plugins(root: Path) -> Path:
    """Real distributions (package + dist-info with entry points) in a directory for sys.path."""
    for name, code in PLUGINS.items():
        package = root / f"hostler_test_{name}"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(code)
        dist = root / f"hostler_test_{name}-0.{len(name)}.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: hostler-test-{name.replace('_', '-')}\nVersion: 0.{len(name)}\n"
        )
        (dist / "entry_points.txt").write_text(f"[hostler]\n{name} = hostler_test_{name}\n")
    return root


@pytest.fixture
def plugin_path(tmp_path: Path) -> Path:
    return install_fake_plugins(tmp_path / "site")


def run_plugins_cli(plugin_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(plugin_path)}
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from hostler.cli import main; sys.exit(main())",
            "plugins",
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO / "tests",
        timeout=60,
        check=False,
    )


def test_each_broken_plugin_is_disabled_alone_with_a_clear_message(plugin_path: Path) -> None:
    result = run_plugins_cli(plugin_path, "--json")
    assert result.returncode == 0, result.stderr
    records = {r["name"]: r for r in json.loads(result.stdout)}
    assert records["llamacpp"]["status"] == "ok"
    assert records["llamacpp"]["engines"] == ["llamacpp"]
    assert records["broken_import"]["status"] == "failed"
    assert (
        records["broken_import"]["error"]
        == "import: ImportError: needs libfoo, which is not installed"
    )
    assert (
        records["raising_hook"]["error"] == "register_engines: RuntimeError: boom while registering"
    )
    assert records["dup_a"]["status"] == "ok"
    assert records["dup_a"]["engines"] == ["echo"]
    assert records["dup_b"]["status"] == "failed"
    assert "engine 'echo' is already registered by plugin 'dup_a'" in records["dup_b"]["error"]
    assert records["steals_llamacpp"]["status"] == "failed"
    assert "already registered by plugin 'llamacpp'" in records["steals_llamacpp"]["error"]
    assert records["typo_hook"]["status"] == "failed"
    assert records["typo_hook"]["error"].startswith("validate: ")
    assert "register_engine" in records["typo_hook"]["error"]
    assert records["dup_a"]["version"] == "0.5"


def test_the_table_and_blocking(plugin_path: Path) -> None:
    result = run_plugins_cli(plugin_path, "--block", "dup_a")
    assert result.returncode == 0
    lines = {line.split()[0]: line for line in result.stdout.splitlines()[1:]}
    assert "blocked" in lines["dup_a"]
    assert "ok" in lines["dup_b"]  # with dup_a blocked, dup_b's echo is free


def test_events_are_recorded_and_the_llamacpp_engine_keeps_serving(
    plugin_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.syspath_prepend(str(plugin_path))
    import importlib

    importlib.invalidate_caches()
    recorded: list[object] = []
    host = PluginHost(record=recorded.append).load()
    failed = {e.name for e in recorded if isinstance(e, PluginFailed)}
    loaded = {e.name for e in recorded if isinstance(e, PluginLoaded)}
    assert failed == {"broken_import", "raising_hook", "dup_b", "steals_llamacpp", "typo_hook"}
    assert {"llamacpp", "dup_a"} <= loaded
    adapter = host.adapter("llamacpp")
    assert type(adapter).__module__ == "hostler_llamacpp.adapter"
    # ...and the llama.cpp engine still serves, through the adapter this host loaded
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    with EventStore.open(tmp_path / "events.db", owner=True) as store:
        supervisor = Supervisor(
            "llamacpp:tiny:0",
            adapter,
            lambda port: LaunchSpec(
                "llamacpp:tiny:0", model, port, ctx_per_slot=256, work_dir=tmp_path / "w"
            ),
            store,
            run_dir=tmp_path / "run",
            token_prefix="plugins-test",
        )

        async def serve() -> int:
            port = await supervisor.ensure_running()
            status = await probe_status(port, "/health")
            await supervisor.stop()
            return status or 0

        assert anyio.run(serve) == 200
    with pytest.raises(UnknownEngineError, match="no plugin provides engine 'nope'"):
        host.adapter("nope")


def test_built_in_adapters_are_discovered_through_entry_points() -> None:
    host = PluginHost().load()
    assert set(host.plugins) >= {"llamacpp", "ds4", "mlx", "sdcpp"}
    assert host.owners["llamacpp"] == "llamacpp"
    assert host.owners["sdcpp"] == "sdcpp"  # the built-in sd-cpp adapter holds its name
    assert host.adapters["sdcpp"].__module__ == "hostler_sdcpp.adapter"
