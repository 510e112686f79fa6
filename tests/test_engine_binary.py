"""The one engine-binary search (hostler.plugin.find_engine_binary): its order and its refusals.

Each adapter's finder is this search with its own names (llama.cpp adds its packaged binary);
the edges are pinned here once, against real files and real permission bits.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

from hostler.errors import EngineBinaryError
from hostler.plugin import find_engine_binary

ENV = "HOSTLER_TEST_SERVER"
PROGRAM = "test-server"


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(stat.S_IRWXU)
    return path


@pytest.fixture
def on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``test-server`` that is the only one on ``PATH``; ``$HOSTLER_TEST_SERVER`` unset."""
    monkeypatch.delenv(ENV, raising=False)
    found = executable(tmp_path / "path-bin" / PROGRAM)
    monkeypatch.setenv("PATH", str(found.parent))
    return found


def find(
    configured: str | os.PathLike[str] | None = None,
    *,
    fallbacks: Sequence[Callable[[], Path | None]] = (),
    hint: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Path:
    return find_engine_binary(
        configured, ENV, PROGRAM, fallbacks=fallbacks, hint=hint, environ=environ
    )


def test_the_order_is_configured_then_the_variable_then_path_then_fallbacks(
    on_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    configured = executable(tmp_path / "configured" / "server")
    by_env = executable(tmp_path / "env" / "server")
    fallback = executable(tmp_path / "fallback" / "server")
    calls: list[str] = []

    def packaged() -> Path:
        calls.append("packaged")
        return fallback

    monkeypatch.setenv(ENV, str(by_env))
    assert find(configured, fallbacks=[packaged]) == configured
    assert find(str(configured)) == configured
    assert find(None, fallbacks=[packaged]) == by_env
    monkeypatch.setenv(ENV, "")  # an empty variable counts as unset
    assert find("", fallbacks=[packaged]) == on_path
    assert calls == []  # a fallback is not even asked while an earlier place answers
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert find(None, fallbacks=[lambda: None, packaged, lambda: on_path]) == fallback
    assert calls == ["packaged"]


def test_found_nowhere_is_one_line_naming_the_variable_path_and_hint(
    on_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    with pytest.raises(EngineBinaryError) as caught:
        find(fallbacks=[lambda: None])
    assert str(caught.value) == ("test-server not found: set HOSTLER_TEST_SERVER, put it on PATH")
    assert caught.value.code == "engine.binary"
    with pytest.raises(EngineBinaryError) as caught:
        find(hint="pip install test-server")
    assert str(caught.value) == (
        "test-server not found: set HOSTLER_TEST_SERVER, put it on PATH, or pip install test-server"
    )


def test_a_configured_path_that_is_missing_is_refused_not_skipped(
    on_path: Path, tmp_path: Path
) -> None:
    """A typo must not quietly run the binary on PATH instead."""
    missing = tmp_path / "missing"
    with pytest.raises(EngineBinaryError) as caught:
        find(missing)
    assert str(caught.value) == f"{missing}: test-server binary not found"


def test_a_directory_is_not_a_binary(on_path: Path, tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    folder.chmod(stat.S_IRWXU)  # searchable: "executable" to os.access
    with pytest.raises(EngineBinaryError) as caught:
        find(folder)
    assert str(caught.value) == f"{folder}: test-server binary not found (is a directory)"


def test_a_file_without_the_execute_bit_is_refused(on_path: Path, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("#!/bin/sh\n")
    plain.chmod(stat.S_IRUSR | stat.S_IWUSR)
    with pytest.raises(EngineBinaryError) as caught:
        find(plain)
    assert str(caught.value) == f"{plain}: test-server binary is not executable"


def test_an_unknown_users_home_is_one_line(on_path: Path) -> None:
    """``~nouser/...`` was a RuntimeError from expanduser()."""
    with pytest.raises(EngineBinaryError) as caught:
        find("~no-such-user-hostler/bin/test-server")
    assert str(caught.value) == (
        "~no-such-user-hostler/bin/test-server: test-server binary not found "
        "(no such home directory)"
    )


def test_a_home_path_is_expanded(
    on_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    server = executable(tmp_path / "bin" / "server")
    assert find("~/bin/server") == server


def test_a_relative_path_is_made_absolute_against_the_working_directory(
    on_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine runs in its own work directory: a relative argv[0] would miss there."""
    server = executable(tmp_path / "bin" / "server")
    monkeypatch.chdir(tmp_path)
    found = find("bin/server")
    assert found.is_absolute()
    assert found == server
    monkeypatch.setenv(ENV, "bin/server")
    assert find() == server


@pytest.mark.parametrize(
    ("junk", "expected"),
    [
        ("nowhere/server", "{cwd}/nowhere/server: test-server binary not found"),
        ("~no-such-user-hostler/x", "~no-such-user-hostler/x: test-server binary not found"),
        (".", "{cwd}: test-server binary not found"),
    ],
)
def test_a_junk_variable_is_one_line_naming_the_variable(
    junk: str,
    expected: str,
    on_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ENV, junk)
    with pytest.raises(EngineBinaryError) as caught:
        find()
    message = str(caught.value)
    assert message.startswith(expected.format(cwd=tmp_path))
    assert message.endswith("named by $HOSTLER_TEST_SERVER)")
    assert "\n" not in message


def test_a_variable_naming_a_plain_file_says_so_and_names_the_variable(
    on_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = tmp_path / "plain"
    plain.write_text("")
    plain.chmod(stat.S_IRUSR)
    monkeypatch.setenv(ENV, str(plain))
    with pytest.raises(EngineBinaryError) as caught:
        find()
    assert str(caught.value) == (
        f"{plain}: test-server binary is not executable (named by $HOSTLER_TEST_SERVER)"
    )


def test_a_name_too_long_is_one_clipped_line(on_path: Path, tmp_path: Path) -> None:
    long = tmp_path / ("x" * 300) / "server"  # one part past NAME_MAX (255): ENAMETOOLONG
    with pytest.raises(EngineBinaryError) as caught:
        find(long)
    message = str(caught.value)
    assert message.startswith(f"{str(long)[:200]}: test-server binary not found")
    assert len(message) < 300


def test_the_environment_can_be_given(on_path: Path, tmp_path: Path) -> None:
    by_env = executable(tmp_path / "env" / "server")
    assert find(environ={ENV: str(by_env)}) == by_env
    assert find(environ={"PATH": str(on_path.parent)}) == on_path
    with pytest.raises(EngineBinaryError, match="not found: set HOSTLER_TEST_SERVER"):
        find(environ={})  # no PATH at all: the default PATH has no test-server
