"""The plugin tutorial's package (examples/hostler-echo) is installed and run, so the docs
cannot rot: docs/plugins/tutorial.md shows its files verbatim, its plugin code is at most 100
lines, its own tests (hostler's conformance suite through the pytest plugin) pass once it is
installed, and ``hostler serve`` runs it from the config docs/plugins/try.md shows."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from _daemons import kill_leftovers, served_port, start_daemon, wait_for
from _support import REPO, run_cli

EXAMPLE = REPO / "examples" / "hostler-echo"
DOCS = REPO / "docs" / "plugins"
#: ``<!-- file: PATH -->`` then a fenced block: the block is that file, whole.
SHOWN = re.compile(r"<!-- file: (\S+) -->\n```[a-z]*\n(.*?)```\n", re.DOTALL)
#: ``<!-- config -->`` then a fenced block: the config the try page tells you to write.
CONFIG = re.compile(r"<!-- config -->\n```toml\n(.*?)```\n", re.DOTALL)


def shown_files(page: Path) -> dict[str, str]:
    """The files a docs page shows whole, by repository path."""
    return {path: body for path, body in SHOWN.findall(page.read_text(encoding="utf-8"))}


def install(site: Path) -> None:
    """Install the example as a wheel would: its package and a dist-info from its pyproject.

    (No build backend is needed: the wheel of a pure-Python package is its files plus the
    metadata, and the entry points are read from the pyproject itself.)
    """
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())
    for package in project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]:
        shutil.copytree(
            EXAMPLE / package,
            site / Path(package).name,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    meta = project["project"]
    info = site / f"{meta['name'].replace('-', '_')}-{meta['version']}.dist-info"
    info.mkdir()
    requires = "".join(f"Requires-Dist: {dep}\n" for dep in meta["dependencies"])
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n{requires}"
    )
    points = "".join(
        f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in entries.items())
        for group, entries in meta["entry-points"].items()
    )
    (info / "entry_points.txt").write_text(points)


@pytest.fixture
def installed(tmp_path: Path) -> dict[str, str]:
    """An environment with hostler-echo installed into a fresh site directory."""
    site = tmp_path / "site"
    site.mkdir()
    install(site)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1"}


def test_the_tutorial_shows_the_example_files_verbatim() -> None:
    shown = shown_files(DOCS / "tutorial.md")
    assert set(shown) == {
        "examples/hostler-echo/pyproject.toml",
        "examples/hostler-echo/src/hostler_echo/__init__.py",
        "examples/hostler-echo/tests/test_echo.py",
    }
    for path, body in shown.items():
        assert body == (REPO / path).read_text(encoding="utf-8"), f"{path} drifted from the docs"


#: A Markdown link: ``[text](target)``.
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """The heading anchors of a Markdown page, as GitHub spells them."""
    found = set()
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("#") and not line.startswith("#!"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def test_every_link_in_the_plugin_docs_resolves() -> None:
    pages = sorted(DOCS.glob("*.md"))
    assert {p.name for p in pages} >= {
        "README.md",
        "tutorial.md",
        "reference.md",
        "readiness.md",
        "pricing.md",
        "try.md",
    }
    checked = 0
    for page in [*pages, REPO / "docs" / "testing.md", EXAMPLE / "README.md"]:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            assert resolved.exists(), f"{page.name}: {target} does not exist"
            if anchor:
                assert anchor in anchors(resolved), f"{page.name}: no #{anchor} in {path}"
            checked += 1
    assert checked >= 20


def test_the_plugin_code_is_at_most_100_lines() -> None:
    adapter = (EXAMPLE / "src" / "hostler_echo" / "__init__.py").read_text().splitlines()
    assert 0 < len(adapter) <= 100  # every line: docstrings, imports and blanks included


def test_the_try_page_config_is_one_the_daemon_reads(tmp_path: Path) -> None:
    from hostler.config import load_config

    (config_text,) = CONFIG.findall((DOCS / "try.md").read_text(encoding="utf-8"))
    (tmp_path / "hostler.toml").write_text(config_text)
    (tmp_path / "parrot.txt").write_text("Polly says\n")
    config = load_config(tmp_path / "hostler.toml")
    assert [e.key for e in config.engines] == ["echo:parrot:0"]


@pytest.mark.slow
def test_installed_its_own_tests_pass_under_hostlers_pytest_plugin(
    installed: dict[str, str], tmp_path: Path
) -> None:
    env = {**os.environ, **installed}
    where = subprocess.run(
        [sys.executable, "-c", "import hostler_echo; print(hostler_echo.__file__)"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.startswith(str(tmp_path / "site"))  # the installed copy, not src/
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-v",
            "-p",
            "no:cacheprovider",
            "--basetemp",
            str(tmp_path / "t"),
        ],
        env=env,
        cwd=EXAMPLE,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    out = run.stdout
    assert "hostler.testing.pytest_plugin" not in run.stderr
    for check in (
        "TestEchoConformance::test_registered_through_the_hook PASSED",
        "TestEchoConformance::test_extra_args_come_last PASSED",
        "TestEchoConformance::test_live_start_serve_stop PASSED",
        "TestEchoConformance::test_live_adopted_after_a_daemon_restart PASSED",
        "TestEchoSlowLoad::test_live_start_serve_stop PASSED",
        "test_the_runtime_starts_it_on_demand_and_it_answers PASSED",
    ):
        assert check in out, out[-4000:]
    summary = out.strip().splitlines()[-1]
    passed = re.search(r"\b(\d+) passed in\b", summary)
    assert passed and int(passed.group(1)) >= 38, summary  # 18 checks twice, and 2
    assert not re.search(r"skipped|xfail|deselected|warning", summary), summary


STATUS_ONLY = """
import pytest
from hostler.plugin import ReadinessProbe
from hostler.testing.conformance import AdapterConformance
from hostler_echo import EchoAdapter


class StatusOnly(EchoAdapter):
    def readiness(self, spec):
        return ReadinessProbe(path="/health")


class TestStatusOnly(AdapterConformance):
    @pytest.fixture
    def adapter(self):
        return StatusOnly()

    @pytest.fixture
    def model(self, tmp_path):
        (tmp_path / "m.txt").write_text("x\\n")
        return tmp_path / "m.txt"

    @pytest.fixture
    def launch_options(self):
        return {"load_seconds": 1.0}
"""


@pytest.mark.slow
def test_without_the_body_check_a_slow_load_fails_the_live_check(
    installed: dict[str, str], tmp_path: Path
) -> None:
    """The tutorial's claim: the echo engine answers /health 200 while it loads, so its
    adapter checks the body; with the status alone the suite catches the early readiness."""
    (tmp_path / "test_status_only.py").write_text(STATUS_ONLY)
    only_live = ("-k", "test_live_start_serve_stop", str(tmp_path / "test_status_only.py"))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *only_live],
        env={**os.environ, **installed},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
    assert "1 failed" in run.stdout.strip().splitlines()[-1]
    assert "503" in run.stdout  # the first completion met an engine still loading


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    (config_text,) = CONFIG.findall((DOCS / "try.md").read_text(encoding="utf-8"))
    config = tmp_path / "hostler.toml"
    # the page's config, with a private ledger (the per-user one is the host's)
    config.write_text('[daemon]\nledger = "ledger.db"\n' + config_text)
    (tmp_path / "parrot.txt").write_text("Polly says\n")
    data = tmp_path / "data"
    yield config, data
    kill_leftovers(data)


@pytest.mark.slow
def test_hostler_serve_runs_the_installed_plugin(
    installed: dict[str, str], served: tuple[Path, Path], tmp_path: Path
) -> None:
    config, data = served
    listed = run_cli("plugins", env=installed)  # try.md: first check hostler found it
    assert listed.returncode == 0, listed.stderr
    assert next(r for r in listed.stdout.splitlines() if r.startswith("echo ")).split() == [
        "echo",
        "0.1.0",
        "ok",
        "echo",
    ]
    log = tmp_path / "serve.log"
    daemon = start_daemon(config, data, log, command="serve", extra=("--port", "0"), env=installed)
    try:
        base = f"http://127.0.0.1:{served_port(log)}"
        body = {"model": "parrot", "messages": [{"role": "user", "content": "hello"}]}
        answer = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] == "Polly says hello"
        table = run_cli("ps", "--url", base, "--data-dir", str(data))
        assert table.returncode == 0, table.stderr
        header = table.stdout.splitlines()[0].split()
        row = next(line for line in table.stdout.splitlines() if line.startswith("echo:parrot:0"))
        port = int(row.split()[header.index("PORT")])
        # try.md: SLOTS is busy/launched: the config's slots (1 when it says none)
        assert re.search(r" 0/1 ", row), table.stdout
        probe = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10)
        assert probe.json() == {"status": "ok"}  # the PORT column is the engine's own
        engine_log = data / "run" / "echo_parrot_0" / "engine.log"
        wait_for(lambda: "echo: ready" in engine_log.read_text())
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
    assert daemon.returncode == 0, log.read_text()[-2000:]
