"""``python3 dev.py test`` installs Debian's Chromium (the dashboard tests) and PostgreSQL server
(the store suites) when they are missing."""

from __future__ import annotations

import importlib.util
import subprocess
from types import ModuleType
from typing import Any

import pytest

from _support import REPO


def load_dev() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dev_under_test", REPO / "dev.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Runs:
    """subprocess.run stand-in: records each command; the first install fails when asked."""

    def __init__(self, first_fails: bool) -> None:
        self.calls: list[list[str]] = []
        self.first_fails = first_fails

    def __call__(self, command: list[str], **_kwargs: Any) -> subprocess.CompletedProcess[str]:
        self.calls.append(command)
        failed = self.first_fails and len(self.calls) == 1
        return subprocess.CompletedProcess(command, 100 if failed else 0)


def rig(
    monkeypatch: pytest.MonkeyPatch, *, present: set[str], uid: int, first_fails: bool = False
) -> tuple[ModuleType, Runs]:
    dev = load_dev()
    runs = Runs(first_fails)
    monkeypatch.setattr(
        dev.shutil, "which", lambda name: f"/usr/bin/{name}" if name in present else None
    )
    monkeypatch.setattr(dev.os, "geteuid", lambda: uid)
    monkeypatch.setattr(dev.subprocess, "run", runs)
    return dev, runs


INSTALL = [
    "/usr/bin/apt-get",
    "install",
    "-y",
    "--no-install-recommends",
    "chromium",
    "chromium-driver",
]


def test_nothing_is_installed_when_both_are_there(monkeypatch: pytest.MonkeyPatch) -> None:
    dev, runs = rig(monkeypatch, present={"chromium", "chromedriver", "apt-get"}, uid=0)
    dev.ensure_browser()
    assert runs.calls == []
    assert dev.BROWSER_PACKAGES == ("chromium", "chromium-driver")


def test_root_with_apt_installs_and_updates_only_when_the_install_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    dev, runs = rig(monkeypatch, present={"chromium", "apt-get"}, uid=0)
    dev.ensure_browser()
    assert runs.calls == [INSTALL]
    assert "dev.py: installing chromium chromium-driver" in capsys.readouterr().err
    dev, runs = rig(monkeypatch, present={"apt-get"}, uid=0, first_fails=True)
    dev.ensure_browser()
    assert runs.calls == [INSTALL, ["/usr/bin/apt-get", "update"], INSTALL]
    assert "running /usr/bin/apt-get update" in capsys.readouterr().err


@pytest.mark.parametrize(("present", "uid"), [({"apt-get"}, 1000), (set(), 0)])
def test_without_root_or_apt_it_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    present: set[str],
    uid: int,
) -> None:
    dev, runs = rig(monkeypatch, present=present, uid=uid)
    dev.ensure_browser()
    assert runs.calls == []
    assert "apt-get install -y chromium chromium-driver" in capsys.readouterr().err


def test_the_postgresql_server_is_installed_when_missing_and_left_when_there(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The store suites run on a real PostgreSQL: Debian's ``postgresql``, installed by root."""
    monkeypatch.delenv("HOSTLER_PG_BIN", raising=False)
    dev, runs = rig(monkeypatch, present={"apt-get"}, uid=0)
    monkeypatch.setattr(dev, "postgres_present", lambda: False)
    dev.ensure_postgres()
    assert runs.calls == [
        ["/usr/bin/apt-get", "install", "-y", "--no-install-recommends", "postgresql"]
    ]
    assert "dev.py: installing postgresql" in capsys.readouterr().err
    dev, runs = rig(monkeypatch, present={"apt-get"}, uid=1000)
    monkeypatch.setattr(dev, "postgres_present", lambda: False)
    dev.ensure_postgres()
    assert runs.calls == []
    assert "apt-get install -y postgresql" in capsys.readouterr().err
    dev, runs = rig(monkeypatch, present={"apt-get"}, uid=0)
    monkeypatch.setattr(dev, "postgres_present", lambda: True)
    dev.ensure_postgres()
    assert runs.calls == []


def test_this_machine_has_a_postgresql_server_as_the_suite_needs() -> None:
    assert load_dev().postgres_present()
