"""Helpers for tests that run ``hostler daemon`` as a real process."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Collection
from pathlib import Path
from typing import Any

import psutil

from hostler import EventStore, replay
from hostler.engines.process import token_holders as engine_processes
from hostler.engines.reconcile import DAEMON_STREAM
from hostler.events.ledger import LEDGER_STREAM

from _support import REPO


def kill_leftovers(data: Path) -> list[int]:
    """SIGKILL whatever still carries this data directory's launch token; return the pids."""
    id_file = data / "daemon-id"
    if not id_file.exists():
        return []
    return [p.pid for p in token_holders(id_file.read_text().strip()) if _kill(p)]


def token_holders(prefix: str) -> list[psutil.Process]:
    """Live processes whose launch token starts with ``prefix:`` (zombies excluded)."""
    return [process for process, _ in engine_processes(lambda t: t.startswith(prefix + ":"))]


def _kill(process: psutil.Process) -> bool:
    try:
        process.kill()
    except psutil.Error:
        return False
    return True


def start_daemon(
    config: Path,
    data: Path,
    log: Path,
    *,
    env: dict[str, str] | None = None,
    command: str = "daemon",
    extra: tuple[str, ...] = (),
    unset: Collection[str] = (),
) -> subprocess.Popen[bytes]:
    """``hostler daemon`` (or ``command``) as a real process, its output appended to ``log``.

    ``env`` is added to this process's environment, without the variables named in ``unset``.
    """
    base = {k: v for k, v in os.environ.items() if k not in unset}
    with log.open("ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from hostler.cli import main; sys.exit(main())",
                command,
                "--config",
                str(config),
                "--data-dir",
                str(data),
                *extra,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO / "tests",
            env={**base, **(env or {})},
        )


def wait_for(predicate, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("timed out")


def events(data: Path, stream: str | None = None) -> list[tuple[str, str, dict]]:  # type: ignore[type-arg]
    path = data / "events.db"
    if not path.exists():
        return []
    with EventStore.open(path) as store:
        return [
            (r.stream_id, r.type, r.payload)
            for r in store.read_all(streams=[stream] if stream else None)
        ]


def count(data: Path, key: str, kind: str) -> int:
    return sum(1 for stream, t, _ in events(data) if stream == f"engine/{key}" and t == kind)


def engines(data: Path) -> dict[str, tuple[str, int | None, int | None]]:
    with EventStore.open(data / "events.db") as store:
        world = replay(store)
    return {
        key: (e.state, e.pid, int(e.identity["port"]) if e.identity else None)
        for key, e in world.engines.items()
    }


def alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def chat(port: int) -> str:
    body = json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "temperature": 0, "max_tokens": 4}
    ).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return str(json.loads(response.read())["choices"][0]["message"]["content"])


def daemon_starts(data: Path) -> list[dict]:  # type: ignore[type-arg]
    return [p for _, t, p in events(data, DAEMON_STREAM) if t == "daemon.started"]


def served_port(log: Path, timeout: float = 60) -> int:
    """The port a ``hostler serve`` says it listens on in ``log`` (waits up to ``timeout``)."""
    found: list[int] = []

    def listening() -> bool:
        match = re.search(r"serving on http://[^:]+:(\d+)", log.read_text())
        if match:
            found.append(int(match.group(1)))
        return bool(found)

    wait_for(listening, timeout=timeout)
    return found[0]


def first_launch_costs(config: Path, data: Path, ledger: Path, key: str) -> tuple[int, int]:
    """What ``key``'s first start reserves and then holds, from a daemon of its own.

    The daemon (``config`` starts ``key`` at once, its ledger is ``ledger``) runs until the
    engine is ready, then is stopped; its ledger's ``ledger.reserved`` and ``ledger.measured``
    are the answer (the price and the footprint that :func:`_rigs.room_for` sizes a budget by).
    """
    probe = start_daemon(config, data, data.parent / f"{data.name}.log")
    wanted = {"ledger.reserved", "ledger.measured"}

    def sizes_so_far() -> dict[str, int]:
        with EventStore.open(ledger) as store:
            return {
                r.type: int(r.payload["bytes"])
                for r in store.read_stream(LEDGER_STREAM)
                if r.type in wanted
            }

    try:
        wait_for(lambda: count(data, key, "engine.ready") == 1, timeout=60)
        # the measurement follows readiness (a loaded machine writes it a moment later)
        wait_for(lambda: wanted <= sizes_so_far().keys(), timeout=60)
        sizes = sizes_so_far()
    finally:
        probe.send_signal(signal.SIGTERM)
        probe.wait(60)
        kill_leftovers(data)
    return sizes["ledger.reserved"], sizes["ledger.measured"]


class ServeChild:
    """``hostler serve --config FOLDER/hostler.toml`` as a real child process, listening.

    ``models`` is the config's ``[[models]]`` tables (TOML text); ``extra`` more TOML after
    them; ``daemon`` more ``[daemon]`` keys; ``env`` variables set for the daemon beside this
    process's own. ``close()`` sends SIGTERM and waits for the exit; ``kill()`` SIGKILLs it.
    """

    def __init__(
        self,
        folder: Path,
        models: str,
        extra: str = "",
        env: dict[str, str] | None = None,
        daemon: str = "",
    ) -> None:
        import socket

        self.folder = folder
        self.env = dict(env or {})
        self.data = folder / "data"
        self.config = folder / "hostler.toml"
        self.config.write_text(
            f'[daemon]\nledger = "ledger.db"\ndata_dir = "{self.data}"\n{daemon}\n\n{models}\n'
            f"{extra}"
        )
        self.log = folder / "serve.log"
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.base = f"http://127.0.0.1:{self.port}"
        self.daemon = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        env = {**os.environ, "HOSTLER_HOME": str(self.folder / "home"), **self.env}
        command = [*HOSTLER, "serve", "--config", str(self.config), "--port", str(self.port)]
        with self.log.open("ab") as out:
            daemon = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 60
        while True:  # polled: the daemon answers /health once it listens
            assert daemon.poll() is None, self.log.read_text()
            try:
                with urllib.request.urlopen(f"{self.base}/health", timeout=5) as answer:
                    if answer.status == 200:
                        return daemon
            except OSError:
                pass
            assert time.monotonic() < deadline, f"{' '.join(command)}: no answer in 60 s"
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL the daemon (its engines, in sessions of their own, keep running)."""
        self.daemon.kill()
        self.daemon.wait(timeout=60)

    def start(self) -> None:
        """Start the daemon again after :meth:`kill` or :meth:`close` (same config and port)."""
        self.daemon = self._start()

    def restart(self) -> None:
        """Stop the daemon (SIGTERM) and start it again on the same config and port."""
        self.close()
        self.daemon = self._start()

    def get(self, path: str) -> Any:
        """``GET path`` as JSON."""
        with urllib.request.urlopen(f"{self.base}{path}", timeout=30) as answer:
            return json.loads(answer.read())

    def close(self) -> None:
        """SIGTERM, then wait for the exit (60 s)."""
        if self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGTERM)
        self.daemon.wait(timeout=60)


HOSTLER = [sys.executable, "-c", "import sys; from hostler.cli import main; sys.exit(main())"]
