"""Run the HTTP face inside the caller's task group, and keep its token.

uvicorn serves the app without taking over the process's signals (the daemon owns SIGTERM and
SIGINT, and stops the server as part of its own shutdown). The bearer token is made once, at
first start, in the data directory (mode 0600) and read back afterwards.
"""

from __future__ import annotations

import contextlib
import ipaddress
import secrets
import socket
from collections.abc import Iterator
from pathlib import Path

import anyio
import uvicorn
from starlette.types import ASGIApp

from hostler.errors import UsageError
from hostler.paths import private_file

__all__ = ["HttpServer", "is_loopback", "load_token"]

TOKEN_FILE = "token"  # noqa: S105 - the file name, not a secret


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (``localhost`` counts)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_token(data_dir: Path) -> str:
    """The daemon's bearer token: read from ``data_dir/token``, made there (0600) the first time."""
    path = data_dir / TOKEN_FILE
    if path.is_file():
        text = path.read_text(encoding="utf-8").strip()
        if 32 <= len(text) <= 256 and text.isascii() and text.isprintable():
            return text
        raise UsageError(f"{path}: not a hostler token; delete it and a new one is made")
    token = secrets.token_urlsafe(32)
    private_file(path, token + "\n")
    return token


class _Embedded(uvicorn.Server):
    """uvicorn without its own signal handlers: the daemon decides when it stops."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpServer:
    """The app on ``host:port``; :meth:`serve` runs until :meth:`stop` (or cancellation).

    Raises (from :meth:`serve`):
        UsageError: The address cannot be bound (in use, not ours), said in one line.
    """

    def __init__(self, app: ASGIApp, host: str, port: int) -> None:
        self.host = host
        self.port = port
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            lifespan="on",
            access_log=False,
            timeout_graceful_shutdown=5,
        )
        self._server = _Embedded(config)
        self.started = anyio.Event()

    async def serve(self) -> None:
        """Listen and serve until stopped."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # accepted connections inherit it: without, a response's head and body wait on the
        # client's delayed ACK (~40 ms a request)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise UsageError(
                f"cannot listen on {self.host}:{self.port} ({exc.strerror}); choose another "
                "address with --host / --port"
            ) from None
        sock.listen(2048)  # connections queue from now: started means reachable
        self.port = int(sock.getsockname()[1])
        self.started.set()
        try:
            async with anyio.create_task_group() as tasks:

                async def run() -> None:
                    # shielded: a cancelled daemon asks it to finish, it is not torn down
                    with anyio.CancelScope(shield=True):
                        await self._server.serve(sockets=[sock])
                    tasks.cancel_scope.cancel()

                tasks.start_soon(run)
                try:
                    await anyio.sleep_forever()
                finally:
                    self._server.should_exit = True
        finally:
            sock.close()

    def stop(self) -> None:
        """Ask the server to finish its requests and stop."""
        self._server.should_exit = True
