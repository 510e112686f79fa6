"""The data directory's identity, and its event log opened as its owner (SF3)."""

from __future__ import annotations

import secrets
from pathlib import Path

from hostler.config import DaemonConfig
from hostler.drivers.offloop import DAEMON_BUSY_TIMEOUT
from hostler.engines.process import token_holders
from hostler.errors import StoreCorruptError, StoreUnavailableError
from hostler.paths import private_dir, private_file
from hostler.store.log import EventStore

__all__ = ["daemon_id", "open_owned_log", "orphans_note"]


def daemon_id(data_dir: Path) -> str:
    """This data directory's identity in launch tokens (created once, kept)."""
    path = data_dir / "daemon-id"
    try:
        return path.read_text(encoding="ascii").strip()
    except OSError:
        private_dir(data_dir)
        value = f"hostler-{secrets.token_hex(6)}"
        private_file(path, value + "\n")
        return value


def open_owned_log(config: DaemonConfig) -> EventStore:
    """The daemon's log, owned; a corrupt one names the engines it leaves (SF3).

    ``DATA_DIR/events.db`` unless the config names another file or a database URL
    (``[daemon] log``, ``--db``, ``HOSTLER_DB``).
    """
    try:
        store = EventStore.open(
            config.log_target,
            owner=True,
            host=config.host_name,
            busy_timeout=DAEMON_BUSY_TIMEOUT,
            max_bytes=config.log_max_bytes,
        )
    except (StoreCorruptError, StoreUnavailableError) as exc:
        raise type(exc)(exc.message + orphans_note(config.data_dir)) from None
    try:  # a damaged page start-up would not read is found now, not mid-run
        store.check_integrity()
    except StoreCorruptError as exc:
        store.close()
        raise StoreCorruptError(exc.message + orphans_note(config.data_dir)) from None
    return store


def orphans_note(data_dir: Path) -> str:
    """What a refusal to start adds: the engines of ``data_dir`` that still run, and what to do."""
    prefix = f"{daemon_id(data_dir)}:"
    pids = sorted(p.pid for p, _ in token_holders(lambda t: t.startswith(prefix)))
    if not pids:
        return "; no engine of this data directory is running"
    return (
        f"; engines of this data directory still run unsupervised (pids "
        f"{', '.join(map(str, pids[:20]))}): stop them (kill -TERM), or move the log aside "
        "and restart the daemon, which stops them as strays (docs/daemon.md)"
    )
