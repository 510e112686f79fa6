"""The daemon's HTTP face (docs/serve.md) on its runtime: the token, the app, the server."""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass

import anyio
from starlette.applications import Starlette

from hostler.config import DaemonConfig, DiscoverySettings
from hostler.daemon_parts.catalog import Catalog
from hostler.drivers.offloop import OffLoop
from hostler.errors import UsageError
from hostler.paths import private_file
from hostler.runtime.facade import Runtime
from hostler.serve.app import make_app
from hostler.serve.server import ADDRESS_FILE, HttpServer, is_loopback, load_token

__all__ = [
    "HttpFace",
    "check_listen",
    "http_face",
    "http_token",
    "no_models_hint",
    "serve_http",
]

log = logging.getLogger("hostler.daemon")  # the daemon's records keep its logger's name


def check_listen(listen: tuple[str, int]) -> None:
    """Refuse an address that cannot be listened on (no host, or a port beyond 0-65535).

    Raises:
        UsageError: One line naming the address.
    """
    host, port = listen
    if not host or not 0 <= port <= 65535:
        raise UsageError(f"cannot listen on {host!r}:{port}: give a host and a port 0-65535")


async def http_token(config: DaemonConfig, offloop: OffLoop) -> tuple[str | None, str]:
    """The token the face asks for (None: every route open) and where a user finds it."""
    if config.auth == "none":  # loopback only (check_exposure): every route open
        return None, "no token: every route is open to this machine's users"
    if config.token is not None:
        return config.token, "the token is HOSTLER_TOKEN"
    token = await offloop.run(load_token, config.data_dir)
    return token, f"the token is in {config.data_dir / 'token'}"


@dataclass(frozen=True, slots=True)
class HttpFace:
    """The app on the runtime, the models it offers (live), and where a user finds its token."""

    app: Starlette
    models: Catalog
    where: str


def http_face(
    runtime: Runtime,
    catalog: Catalog,
    config: DaemonConfig,
    host: str,
    token: tuple[str | None, str],
) -> HttpFace:
    """The app over ``runtime`` offering ``catalog``'s models for ``host``.

    ``token`` is :func:`http_token`'s answer.
    """
    secret, where = token
    app = make_app(
        runtime,
        catalog,
        about=catalog.about,
        token=secret,
        public=not is_loopback(host),
        open_routes=config.auth == "none",
    )
    return HttpFace(app, catalog, where)


async def serve_http(
    tasks: anyio.abc.TaskGroup,
    face: HttpFace,
    config: DaemonConfig,
    listen: tuple[str, int],
    sock: socket.socket | None,
    *,
    offloop: OffLoop,
) -> HttpServer:
    """``face`` served in ``tasks`` on ``sock`` (bound to ``listen``), once it listens.

    The address goes to the data directory's address file, where the client commands find it.
    """
    host, port = listen
    models = face.models
    server = HttpServer(face.app, host, port, sock=sock)
    tasks.start_soon(server.serve)
    await server.started.wait()
    where_file = config.data_dir / ADDRESS_FILE  # the client commands send the token there
    url = f"http://{host if ':' not in host else f'[{host}]'}:{server.port}"
    await offloop.run(lambda: private_file(where_file, url + "\n"))
    log.info(
        "hostler: serving on http://%s:%d (%d models; %s)",
        host,
        server.port,
        len(models),
        face.where,
    )
    if not models:
        log.warning("hostler: %s", no_models_hint(config.discovery))
    return server


def no_models_hint(discovery: DiscoverySettings | None) -> str:
    """What to do when nothing is offered: the places searched, and whether again."""
    if discovery is None or not discovery.places:
        return (
            "no models to serve: the config names none and searches no folder; add [[models]] "
            "or a [discovery] table to it (docs/daemon.md)"
        )
    searched = "; ".join(f"{source}: {folder}" for source, folder in discovery.places)
    again = (
        f"searched again every {discovery.rescan_seconds:g} s"
        if discovery.rescan_seconds
        else "searched at start only (rescan_seconds = 0): restart after adding one"
    )
    return f"no models to serve yet: put a .gguf model in one of these ({again}): {searched}"
