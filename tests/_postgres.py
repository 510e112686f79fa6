"""A throwaway PostgreSQL cluster for the tests: ``initdb`` in a temporary directory, a free port.

The server is Debian's ``postgresql`` (``python3 dev.py test`` installs it when it is missing
and this is root with apt-get). Its binaries are looked for in ``$HOSTLER_PG_BIN``, then
``/usr/lib/postgresql/<newest>/bin``, then ``PATH``. PostgreSQL refuses to run as root: as root
the cluster belongs to the ``postgres`` user (which Debian's package makes), its folder made in
``/tmp`` so that user can reach it.

A missing server fails the tests that need it with one line naming the package (never a skip).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg

__all__ = ["Cluster", "find_bin", "throwaway_cluster"]

#: Seconds the server gets to start or stop (pg_ctl waits for it by its own check, not a sleep).
WAIT_SECONDS = 60


def find_bin() -> Path:
    """The folder holding ``initdb``, ``pg_ctl`` and ``postgres``."""
    chosen = os.environ.get("HOSTLER_PG_BIN")
    candidates = [Path(chosen)] if chosen else []
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates += versions
    found = shutil.which("pg_ctl")
    if found:
        candidates.append(Path(found).resolve().parent)
    for folder in candidates:
        if all((folder / name).is_file() for name in ("initdb", "pg_ctl", "postgres")):
            return folder
    raise RuntimeError(
        "no PostgreSQL server here (initdb, pg_ctl, postgres): install Debian's `postgresql` "
        "(python3 dev.py test does, as root) or set HOSTLER_PG_BIN to the folder holding them"
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Cluster:
    """One running PostgreSQL server in a folder of its own; ``postgres`` is its superuser."""

    def __init__(self, folder: Path, bin_dir: Path, user: str | None) -> None:
        self.folder = folder
        self.data = folder / "data"
        self.bin = bin_dir
        self.user = user
        self.port = _free_port()
        self._databases = 0

    def _run(self, *argv: str) -> None:
        done = subprocess.run(
            [str(self.bin / argv[0]), *argv[1:]],
            user=self.user,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            check=False,
            timeout=WAIT_SECONDS + 30,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({done.returncode}): {done.stdout[-2000:]}")

    def init(self) -> None:
        """Make the cluster's files (trust authentication on this machine only)."""
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8")

    def start(self) -> None:
        """Start the server and wait until it takes connections (``pg_ctl -w``)."""
        options = (
            f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c full_page_writes=off -c shared_buffers=16MB -c max_connections=200"
        )
        self._run(
            "pg_ctl", "start", "-w", "-t", str(WAIT_SECONDS), "-D", str(self.data),
            "-l", str(self.folder / "server.log"), "-o", options,
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: sessions cut, ``immediate``: as a crash)."""
        self._run("pg_ctl", "stop", "-w", "-t", str(WAIT_SECONDS), "-D", str(self.data), "-m", mode)

    def kill(self) -> None:
        """SIGKILL the postmaster, as a machine losing the server would (its children follow)."""
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + WAIT_SECONDS
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)

    def url(self, database: str = "postgres") -> str:
        """The SQLAlchemy URL of one of its databases (psycopg 3)."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; its URL."""
        self._databases += 1
        return self.create_database(f"t{os.getpid()}_{self._databases}")

    def create_database(self, name: str) -> str:
        """Make the empty database ``name``; its URL."""
        dsn = f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@contextlib.contextmanager
def throwaway_cluster() -> Iterator[Cluster]:
    """A started cluster, stopped and removed when the block ends."""
    bin_dir = find_bin()
    user = None
    folder = Path(tempfile.mkdtemp(prefix="hostler-pg-", dir="/tmp"))
    if os.geteuid() == 0:
        user = "postgres"
        owner = pwd.getpwnam(user)
        os.chown(folder, owner.pw_uid, owner.pw_gid)
    cluster = Cluster(folder, bin_dir, user)
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        with contextlib.suppress(RuntimeError, OSError, subprocess.SubprocessError):
            cluster.stop("immediate")
        shutil.rmtree(folder, ignore_errors=True)
