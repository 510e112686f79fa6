"""Run the HTTP face inside the caller's task group, and keep its token.

uvicorn serves the app without taking over the process's signals (the daemon owns SIGTERM and
SIGINT, and stops the server as part of its own shutdown). The bearer token is made once, at
first start, in the data directory (mode 0600) and read back afterwards.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
from collections.abc import Iterator
from pathlib import Path

import anyio
import uvicorn
from starlette.types import ASGIApp

from hostler.errors import UsageError
from hostler.paths import private_file
from hostler.serve.access import is_loopback

__all__ = ["ADDRESS_FILE", "TOKEN_FILE", "HttpServer", "bind_listener", "is_loopback", "load_token"]

log = logging.getLogger(__name__)

TOKEN_FILE = "token"  # noqa: S105 - the file name, not a secret
#: Where the daemon of a data directory listens (its URL): the token is sent there only.
ADDRESS_FILE = "address"


def load_token(data_dir: Path) -> str:
    """The daemon's bearer token: read from ``data_dir/token``, made there (0600) the first time.

    A token file that others could read (restored from a backup, copied with ``cp``) is no
    secret any more: a new token replaces it, and the log says so.
    """
    path = data_dir / TOKEN_FILE
    if path.is_file():
        text = path.read_text(encoding="utf-8").strip()
        if not (32 <= len(text) <= 256 and text.isascii() and text.isprintable()):
            raise UsageError(f"{path}: not a hostler token; delete it and a new one is made")
        if path.stat().st_mode & 0o077 == 0:
            return text
        log.warning(
            "hostler: %s was readable by other users: a new token replaces it (mode 0600)", path
        )
        path.unlink()
    token = secrets.token_urlsafe(32)
    private_file(path, token + "\n")
    return token


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (connections queue from now).

    Bound before the daemon makes anything, so that an address in use (another ``hostler
    serve``) or one that cannot be bound is refused first, in one line.

    Raises:
        UsageError: The address cannot be bound (in use, not this machine's, not resolvable).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        raise UsageError(f"cannot listen on {host[:100]}:{port} ({exc.strerror})") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # accepted connections inherit it: without, a response's head and body wait on the
        # client's delayed ACK (~40 ms a request)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except (OSError, UnicodeError, OverflowError) as exc:
        sock.close()
        why = getattr(exc, "strerror", None) or str(exc)
        raise UsageError(
            f"cannot listen on {host[:100]}:{port} ({why}); choose another address with "
            "--host / --port (or HOSTLER_HOST / HOSTLER_PORT)"
        ) from None
    return sock


#: The most connections (or requests in flight) served at once; past it a request is a 503.
MAX_CONNECTIONS = 1024
#: Seconds an idle keep-alive connection stays open after its last answer: longer than the
#: clients' own pools keep one (httpx, and so the openai client: 5 s), so that the client
#: drops it first — with equal times a request sent as the server closes the connection got
#: "Server disconnected without sending a response" (seen by the suite).
KEEP_ALIVE = 75
#: The largest request head (request line and headers) read, in bytes; past it a 400.
MAX_HEADER_BYTES = 64 * 1024


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

    def __init__(
        self,
        app: ASGIApp,
        host: str,
        port: int,
        *,
        sock: socket.socket | None = None,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.host = host
        self.port = port
        self._sock = sock
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            lifespan="on",
            access_log=False,
            timeout_graceful_shutdown=5,
            # past this many connections open (or requests in flight), a request is answered
            # 503 at once: a flood of idle connections cannot take every file descriptor
            limit_concurrency=max_connections,
            timeout_keep_alive=KEEP_ALIVE,
            h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        )
        self._server = _Embedded(config)
        self.started = anyio.Event()

    async def serve(self) -> None:
        """Listen and serve until stopped (on the socket given at construction, if any)."""
        sock = self._sock if self._sock is not None else bind_listener(self.host, self.port)
        self._sock = None
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
