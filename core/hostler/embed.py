"""Run the daemon inside a program: ``async with hostler.open_daemon(config) as daemon``.

The daemon runs in the caller's task group, its HTTP face optional; leaving the block stops
every engine it owns (recorded, as on SIGTERM). :func:`run_daemon` is the synchronous entry
point for scripts: it runs until SIGTERM or SIGINT.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator

import anyio

from hostler.config import DaemonConfig, load_config
from hostler.daemon import Daemon
from hostler.errors import HostlerError

__all__ = ["open_daemon", "run_daemon"]


def _config(config: DaemonConfig | str | os.PathLike[str]) -> DaemonConfig:
    return config if isinstance(config, DaemonConfig) else load_config(config)


@contextlib.asynccontextmanager
async def open_daemon(
    config: DaemonConfig | str | os.PathLike[str], *, listen: tuple[str, int] | None = None
) -> AsyncIterator[Daemon]:
    """The daemon, started (engines reconciled, autostarts begun, the HTTP face listening).

    ``daemon.runtime`` is its :class:`hostler.Runtime`; ``daemon.http.port`` the port it
    listens on when ``listen`` is given. The process's signals stay the caller's.

    The config's ``[server] auth`` applies to the HTTP face (``HOSTLER_*`` variables are the
    command line's: a program passes its settings in ``config``).

    Raises:
        HostlerError: It could not start (the log is locked by another daemon, a setting is
            malformed, ``listen`` is beyond loopback with ``auth = "none"``...); nothing is
            left running and nothing is created.
    """
    daemon = Daemon(_config(config), listen=listen)
    failed: list[HostlerError] = []
    settled = anyio.Event()  # ready, or ended before it was

    async def run() -> None:
        try:
            await daemon.run(handle_signals=False)
        except HostlerError as exc:
            failed.append(exc)
        finally:
            settled.set()

    async def ready() -> None:
        await daemon.ready.wait()
        settled.set()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(run)
        tasks.start_soon(ready)
        await settled.wait()
        if failed:
            tasks.cancel_scope.cancel()  # raised below, outside the group: not wrapped
        else:
            try:
                yield daemon
            finally:
                daemon.stop()
    if failed:
        raise failed[0]


def run_daemon(
    config: DaemonConfig | str | os.PathLike[str], *, listen: tuple[str, int] | None = None
) -> None:
    """Run the daemon (and its HTTP face, given ``listen``) until SIGTERM or SIGINT."""
    anyio.run(Daemon(_config(config), listen=listen).run)
