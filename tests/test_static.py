"""ruff and mypy --strict over the whole tree: part of the suite, so CI enforces them."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from _support import REPO

pytestmark = pytest.mark.static


def _tool(name: str) -> list[str]:
    found = shutil.which(name, path=str(REPO / ".venv" / "bin")) or shutil.which(name)
    return [found] if found else [sys.executable, "-m", name]


@pytest.mark.parametrize(
    "command",
    [["ruff", "check", "."], ["ruff", "format", "--check", "."], ["mypy"]],
    ids=["ruff-check", "ruff-format", "mypy-strict"],
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
