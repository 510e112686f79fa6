"""Breaks of the plugin contract (issue 12) found by a hostile round.

Each test states the promised behaviour and fails today for the reason its docstring names.
Real files, real FIFOs, real processes and the real CLI: nothing is mocked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from _support import run_cli
from hostler import EventStore
from hostler.errors import EngineStartError, ModelFileError, PluginError
from hostler.plugin import LaunchSpec, ReadinessProbe
from hostler_mlx import MlxAdapter

import test_contract as contract

GIB = 2**30


def cli_env(tmp_path: Path) -> dict[str, str]:
    """A private HOME and data directory for one CLI run (never the user's)."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {
        "HOME": str(home),
        "HOSTLER_HOME": str(home / "data"),
        "XDG_DATA_HOME": str(home / "xdg"),
        "HOSTLER_LEDGER": str(home / "ledger.db"),
    }


def mlx_folder(tmp_path: Path, name: str, config: str | None) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_text(config)
    (folder / "model.safetensors").write_bytes(b"\0" * 1024)
    return folder


def assert_one_line_error(done: subprocess.CompletedProcess[str]) -> None:
    """Promise 9: a refused input is ONE line `hostler: error [...]`, never a traceback."""
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.returncode not in (0, None), done.stdout[-500:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("hostler: error"), done.stderr[-2000:]


# --- 1. model files: config.json is outside input (promise 9, RD2/RD3) -----------------------


def test_a_deeply_nested_mlx_config_json_is_one_line_not_a_recursion_error(
    tmp_path: Path,
) -> None:
    """A 400 KiB config.json of nested arrays is a bad model, refused in one line.

    Today json.loads raises RecursionError, which read_config (hostler_mlx.geometry) does not
    catch (it catches ValueError/UnicodeDecodeError only): validate_model raises a raw
    RecursionError and `hostler preview --engine mlx` prints a traceback.
    """
    depth = 200_000
    folder = mlx_folder(tmp_path, "nested", '{"a": ' + "[" * depth + "]" * depth + "}")
    with pytest.raises(ModelFileError):
        MlxAdapter().validate_model(folder)
    done = run_cli("preview", "--engine", "mlx", "--standalone", str(folder), env=cli_env(tmp_path))
    assert_one_line_error(done)


def test_an_mlx_config_json_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    """config.json as a named pipe: refused at once in one line, as a FIFO model file is.

    Today read_config (hostler_mlx.geometry) checks only st_size (0 for a FIFO) and then
    read_bytes() blocks forever: `hostler preview --engine mlx DIR` hangs (and so does
    validate_model at daemon start, for every engine configured after it).
    """
    folder = mlx_folder(tmp_path, "piped", None)
    os.mkfifo(folder / "config.json")
    try:
        done = run_cli(
            "preview", "--engine", "mlx", "--standalone", str(folder),
            env=cli_env(tmp_path), timeout=30,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("hostler preview blocked for 30 s reading a FIFO config.json")
    assert_one_line_error(done)
    assert "fifo" in done.stderr.lower() or "named pipe" in done.stderr.lower()
