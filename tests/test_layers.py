"""Layers a test holds: the pure core loads no I/O library; adapters speak only hostler.plugin."""

from __future__ import annotations

import ast
import json

import pytest

from _support import PURE_CAPACITY_NAMES, REPO, run_python

CORE = REPO / "core" / "hostler"

#: Every module of the pure core: state machines, policies, events, the capacity rules.
PURE_MODULES = sorted(
    [
        "hostler",
        "hostler.errors",
        "hostler.untrusted",
        *(
            f"hostler.{folder}.{path.stem}"
            for folder in ("events", "machines", "policies")
            for path in sorted((CORE / folder).glob("*.py"))
            if path.stem != "__init__"
        ),
        *(f"hostler.capacity.{name}" for name in PURE_CAPACITY_NAMES),
    ]
)

#: What a pure module must never bring in, directly or through what it imports.
IO_MODULES = ["sqlalchemy", "sqlite3", "psutil", "anyio", "subprocess", "pynvml", "socket"]

_PROBE = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
print(json.dumps(sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)))
"""


def test_the_list_of_pure_modules_is_complete() -> None:
    assert len(PURE_MODULES) >= 25
    assert "hostler.policies.supervision" in PURE_MODULES
    assert "hostler.machines.engine" in PURE_MODULES
    assert "hostler.events.daemon" in PURE_MODULES


@pytest.mark.parametrize("module", PURE_MODULES)
def test_a_pure_module_loads_no_io_library_in_a_fresh_interpreter(module: str) -> None:
    result = run_python(_PROBE, module, json.dumps(IO_MODULES))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [], f"importing {module} loaded {result.stdout.strip()}"


def test_the_probe_itself_sees_io_modules() -> None:
    """The check above could pass by never seeing anything: show it sees a driver's imports."""
    result = run_python(_PROBE, "hostler.drivers.host_ledger", json.dumps(IO_MODULES))
    assert result.returncode == 0, result.stderr
    assert {"sqlalchemy", "psutil", "anyio"} <= set(json.loads(result.stdout))


def test_the_capacity_package_no_longer_holds_drivers() -> None:
    """Break 7 (layers): capacity/ mixed rules with host_ledger.py and measure.py."""
    assert not (CORE / "capacity" / "host_ledger.py").exists()
    assert not (CORE / "capacity" / "measure.py").exists()
    assert (CORE / "drivers" / "host_ledger.py").exists()


#: A plugin's fake engine (a test stand-in run as its own process, never imported by the
#: adapter) may also build on hostler's fake-server skeleton, a public testing tool.
FAKE_ENGINE_MODULE = "fake_server.py"
FAKE_ENGINE_IMPORTS = {"hostler.plugin", "hostler.testing.fake_server"}


def test_adapters_import_only_hostler_plugin() -> None:
    plugins = sorted((REPO / "plugins").glob("hostler_*"))
    assert plugins
    for package in plugins:
        for path in sorted(package.rglob("*.py")):
            allowed = FAKE_ENGINE_IMPORTS if path.name == FAKE_ENGINE_MODULE else {"hostler.plugin"}
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = [node.module or ""]
                else:
                    continue
                for name in names:
                    if name == "hostler" or name.startswith("hostler."):
                        assert name in allowed, (
                            f"{path.relative_to(REPO)} imports {name}: adapters get what they "
                            "need from hostler.plugin"
                        )


@pytest.mark.parametrize(
    "package", sorted(path.name for path in (REPO / "plugins").glob("hostler_*"))
)
def test_an_adapter_package_loads_no_testing_tool(package: str) -> None:
    """The fake engine's exception above stays out of the adapter: importing it loads none."""
    result = run_python(_PROBE, package, json.dumps(["hostler.testing.fake_server"]))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [], f"importing {package} loaded {result.stdout.strip()}"


def test_the_testing_probe_sees_a_fake_engine_import() -> None:
    """The check above could pass by never seeing anything: ds4's fake does load it."""
    probe = json.dumps(["hostler.testing.fake_server"])
    result = run_python(_PROBE, "hostler_ds4.fake_server", probe)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == ["hostler.testing.fake_server"]
