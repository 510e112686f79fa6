"""ruff and mypy --strict over the whole tree: part of the suite, so CI enforces them."""

from __future__ import annotations

import atexit
import shutil
import subprocess
import sys

import pytest

from _support import REPO

pytestmark = pytest.mark.static


def _tool(name: str) -> list[str]:
    found = shutil.which(name, path=str(REPO / ".venv" / "bin")) or shutil.which(name)
    return [found] if found else [sys.executable, "-m", name]


def _start_mypy() -> subprocess.Popen[str]:
    # mypy takes most of a minute on one core: it starts when the suite is collected and runs
    # beside the other tests (which leave a core idle most of the time); its test waits for it
    process = subprocess.Popen(
        _tool("mypy"),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    atexit.register(process.kill)  # a run that deselects its test leaves nothing behind
    return process


_MYPY = _start_mypy()


def test_mypy_strict_is_clean() -> None:
    output, _ = _MYPY.communicate(timeout=600)
    assert _MYPY.returncode == 0, output


@pytest.mark.parametrize(
    "command",
    [["ruff", "check", "."], ["ruff", "format", "--check", "."]],
    ids=["ruff-check", "ruff-format"],
)
def test_tree_is_clean(command: list[str]) -> None:
    result = subprocess.run(
        [*_tool(command[0]), *command[1:]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
