#!/usr/bin/env python3
"""Set up and run hostler from a fresh clone with nothing but Python 3.11+ and the registries.

    python3 dev.py demo        # the main job: hostler serve swapping two real models, explained
    python3 dev.py test        # install what the tests need, run the whole suite
    python3 dev.py run CMD...  # anything else inside the project environment

It installs uv (into ./.tools, so it never touches the system Python), then lets uv build
./.venv from uv.lock with this same interpreter. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
TOOLS = ROOT / ".tools"


def uv_command() -> list[str]:
    """The uv binary, installed into ./.tools first if needed."""
    binary = TOOLS / "bin" / ("uv.exe" if os.name == "nt" else "uv")
    if not binary.exists():
        print("dev.py: installing uv into .tools/ (once)", file=sys.stderr, flush=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--upgrade",
                "--target",
                str(TOOLS),
                "uv>=0.9",
            ],
            check=True,
        )
    return [str(binary)]


#: What the dashboard tests drive (tests/test_dashboard.py): Debian's Chromium and its driver.
BROWSER_PACKAGES = ("chromium", "chromium-driver")

#: What the PostgreSQL tests start as a throwaway cluster (tests/_postgres.py): Debian's server.
POSTGRES_PACKAGES = ("postgresql",)


def ensure_browser() -> None:
    """Install Chromium and chromedriver with apt-get when they are missing (root only).

    The dashboard tests fail (never skip) without them; on a fresh CI machine this puts them
    there. ``apt-get update`` runs only when the first install fails (stale package lists).
    """
    if shutil.which("chromium") and shutil.which("chromedriver"):
        return
    ensure_debian(BROWSER_PACKAGES, "chromium or chromedriver", "the dashboard tests")


def postgres_present() -> bool:
    """Whether a PostgreSQL server's binaries are here (Debian's folder, or on PATH)."""
    names = ("initdb", "pg_ctl", "postgres")
    folders = [*Path("/usr/lib/postgresql").glob("*/bin")]
    found = shutil.which("pg_ctl")
    if found:
        folders.append(Path(found).resolve().parent)
    return any(all((folder / name).is_file() for name in names) for folder in folders)


def ensure_postgres() -> None:
    """Install Debian's ``postgresql`` with apt-get when no server is here (root only).

    The store and log suites also run on a real PostgreSQL server, started by the tests as a
    throwaway cluster in a temporary directory; they fail (never skip) without one.
    """
    if os.environ.get("HOSTLER_PG_BIN") or postgres_present():
        return
    ensure_debian(POSTGRES_PACKAGES, "the PostgreSQL server", "the PostgreSQL tests")


def ensure_debian(packages: tuple[str, ...], what: str, who: str) -> None:
    """``apt-get install`` ``packages`` (root only); ``apt-get update`` if that fails first."""
    apt = shutil.which("apt-get")
    if apt is None or not hasattr(os, "geteuid") or os.geteuid() != 0:
        print(
            f"dev.py: {what} is missing and this is not root with apt-get: {who} will fail; "
            f"install them (apt-get install -y {' '.join(packages)})",
            file=sys.stderr,
            flush=True,
        )
        return
    install = [apt, "install", "-y", "--no-install-recommends", *packages]
    quiet = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    print(
        f"dev.py: installing {' '.join(packages)}: {' '.join(install)}",
        file=sys.stderr,
        flush=True,
    )
    if subprocess.run(install, env=quiet, check=False).returncode != 0:
        print(f"dev.py: that failed; running {apt} update, then again", file=sys.stderr, flush=True)
        subprocess.run([apt, "update"], env=quiet, check=False)
        subprocess.run(install, env=quiet, check=False)


def ensure_engine(uv: list[str], env: dict[str, str]) -> dict[str, str]:
    """``HOSTLER_LLAMA_SERVER`` for the demo and tests when the prebuilt one cannot run here.

    The PyPI wheel's kernels need the CPU features of its build machine; on another CPU they
    die with SIGILL at the first model load. ``hostler_llamacpp.build ensure`` tries it on a
    real model and, when it fails, builds llama.cpp's own server from source for any AVX2 CPU
    (once: about 7 minutes on two cores, cached in ~/.cache/hostler) and prints its path.
    """
    if env.get("HOSTLER_LLAMA_SERVER"):
        return {}
    where = "from hostler.testing.smollm2 import smollm2_source as s; print(s())"
    line = [*uv, "python", "-c", where]
    model = subprocess.run(line, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, check=False)
    if model.returncode != 0:
        return {}
    probe = [*uv, "python", "-m", "hostler_llamacpp.build", "ensure", model.stdout.strip()]
    done = subprocess.run(probe, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        if done.returncode != 0:
            print("dev.py: no llama-server that runs on this CPU", file=sys.stderr, flush=True)
        return {}
    print(f"dev.py: using {lines[-1]} (HOSTLER_LLAMA_SERVER)", file=sys.stderr, flush=True)
    return {"HOSTLER_LLAMA_SERVER": lines[-1]}


def test_workers(rest: list[str]) -> list[str]:
    """pytest-xdist's ``-n`` for a whole-suite run: one worker per core, plus one.

    Many tests wait on a real process (an engine loading, a daemon stopping): one worker more
    than the cores keeps them busy. A run that names its tests, or chooses its own ``-n`` or
    ``-p no:xdist``, is left as it is; ``HOSTLER_TEST_WORKERS`` sets the count (0: serial).
    """
    chosen = any(a.startswith(("-n", "--numprocesses")) or a == "no:xdist" for a in rest)
    named = any(not a.startswith("-") and ("/" in a or ".py" in a) for a in rest)
    if chosen or named:
        return []
    wanted = os.environ.get("HOSTLER_TEST_WORKERS", "")
    count = int(wanted) if wanted.isdigit() else min((os.cpu_count() or 1) + 1, 8)
    return ["-n", str(count)] if count > 1 else []


def main(argv: list[str]) -> int:
    """Dispatch ``demo``, ``test`` or ``run``."""
    if sys.version_info < (3, 11):
        print("dev.py: hostler needs Python 3.11 or newer", file=sys.stderr)
        return 2
    if not argv or argv[0] not in {"demo", "test", "run"}:
        print(__doc__, file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    uv = [*uv_command(), "run", "--locked", "--python", sys.executable]
    if command == "demo":
        line = [*uv, "hostler", "tour", *rest]
    elif command == "test":
        ensure_browser()
        ensure_postgres()
        line = [*uv, "pytest", *test_workers(rest), *rest]
    else:
        line = [*uv, *rest]
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    if command in ("demo", "test"):
        env.update(ensure_engine(uv, env))
    return run_forwarding(line, env)


#: Seconds a run stopped by a signal is given to stop in order before its group is killed.
STOP_GRACE = 60.0


def run_forwarding(line: list[str], env: dict[str, str]) -> int:
    """Run ``line`` in a process group of its own; a stop of dev.py stops all of it.

    SIGINT, SIGTERM or SIGHUP sent to dev.py alone (a CI runner's cancel, ``kill PID``) or to
    its terminal's group (Ctrl-C) reaches the whole run as SIGINT, pytest's orderly stop: the
    session guard ends every process the tests started. A second signal, or a run that has
    not ended :data:`STOP_GRACE` seconds later, kills the group.
    """
    if os.name != "posix":
        return subprocess.run(line, cwd=ROOT, env=env, check=False).returncode
    child = subprocess.Popen(line, cwd=ROOT, env=env, process_group=0)
    asked: list[float] = []

    def forward(signum: int, frame: object) -> None:
        stop = signal.SIGKILL if asked else signal.SIGINT
        asked.append(time.monotonic())
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, stop)

    for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, forward)
    while True:
        try:
            return child.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            if asked and time.monotonic() - asked[0] > STOP_GRACE:
                forward(signal.SIGKILL, None)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
