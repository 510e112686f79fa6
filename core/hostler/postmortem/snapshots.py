"""The runtime as of any seq, fast: folds resumed from snapshots cached beside the log (PM5).

A snapshot is the lifecycle :class:`~hostler.replay.World` and the
:class:`~hostler.postmortem.runtime_state.RuntimeState` after some seq, saved every
:data:`SNAPSHOT_EVERY` events by whoever folds past that point (``hostler state --at``). It is a
cache, never trusted over the log: each carries the fingerprint of the last row it folded
(seq, stream, version, type and recorded time) and the schema and hostler version that wrote
it, and is thrown
away when any of them no longer matches (the log replaced by another file, a newer fold), then
rebuilt from the log.

The cache is a separate SQLite file beside the log (``events.db.snapshots``), not a table in
the log: writing it never takes the log's write lock, so building snapshots cannot hold up the
daemon's writers, and deleting it loses nothing. Only SQLite logs get one: there a row's seq
is final once visible (one writer at a time), so a prefix never changes; on other databases a
sequence may commit out of order, and the fold always starts from the log.
"""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec

from hostler._version import __version__
from hostler.machines import LIFECYCLES
from hostler.postmortem.runtime_state import STATE_SCHEMA, RuntimeState, fold_rows
from hostler.replay import World
from hostler.store.log import EventStore, format_time

__all__ = [
    "MAX_BODY",
    "MAX_RATIO",
    "SIDECAR_SUFFIX",
    "SNAPSHOT_EVERY",
    "SNAPSHOT_SCHEMA",
    "AsOf",
    "SnapshotCache",
    "as_of",
    "seq_at",
    "world_from_json",
    "world_to_json",
]

#: A snapshot is saved at every multiple of this many seqs a fold passes (see
#: docs/benchmarks.md: resuming folds at most this many events, about 0.3 s).
SNAPSHOT_EVERY = 50_000

#: Bumped whenever a snapshot's layout changes (the runtime state has its own schema too).
#: 2: the fingerprint names the log's first row too, and each row's payload digest.
SNAPSHOT_SCHEMA = 2

#: A snapshot body inflating past this many times its stored size, or past MAX_BODY bytes, is
#: not read (a crafted file would otherwise take memory without bound): a cache miss.
MAX_RATIO = 64
MAX_BODY = 256 * 2**20

#: The cache file is the log's path with this appended.
SIDECAR_SUFFIX = ".snapshots"

_BY_NAME = {cls.__name__: cls for cls in LIFECYCLES}


def world_to_json(world: World) -> dict[str, Any]:
    """The world as a JSON object: every model's folded fields, and the replay's counters."""
    return {
        "models": world.snapshot(),
        "last_seq": world.last_seq,
        "events": world.events,
        "unknown": world.unknown,
        "other": world.other,
        "damaged": [[seq, why] for seq, why in world.damaged],
    }


def world_from_json(data: Any) -> World:
    """The world :func:`world_to_json` wrote.

    Raises:
        ValueError: Not such an object (rebuild it from the log).
    """
    try:
        world = World(
            last_seq=int(data["last_seq"]),
            events=int(data["events"]),
            unknown=[int(s) for s in data["unknown"]],
            other=int(data["other"]),
            damaged=[(int(seq), str(why)) for seq, why in data["damaged"]],
        )
        for name, models in data["models"].items():
            cls = _BY_NAME[name]
            into = world.models[cls]
            for key, fields in models.items():
                model = cls(key)
                model.restore(fields)
                into[key] = model
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"not a snapshot of the lifecycle world: {exc}") from None
    return world


@dataclass
class AsOf:
    """The answer of :func:`as_of`.

    Attributes:
        world: The lifecycle machines after ``world.last_seq``.
        state: The whole runtime after the same row.
        resumed_from: The seq of the snapshot the fold started from (0: the log's start).
        saved: How many snapshots this fold saved on its way.
    """

    world: World
    state: RuntimeState
    resumed_from: int
    saved: int


class SnapshotCache:
    """Snapshots of one SQLite log, in ``<log>.snapshots``; every failure is a cache miss."""

    def __init__(self, path: Path, *, mode: int = 0o600) -> None:
        self.path = path
        self._mode = mode

    @classmethod
    def beside(cls, store: EventStore) -> SnapshotCache | None:
        """The cache of ``store``'s log, or None when it is not a SQLite file."""
        log = store.sqlite_file
        if log is None:
            return None
        try:
            mode = log.stat().st_mode & 0o666
        except OSError:
            mode = 0o600
        return cls(log.with_name(log.name + SIDECAR_SUFFIX), mode=mode)

    def usable(self) -> bool:
        """False when the cache's path is a symbolic link (never followed: read nor written)."""
        return not self.path.is_symlink()

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        if not self.usable():
            raise sqlite3.OperationalError("the snapshot cache is a symbolic link")
        fresh = not self.path.exists()
        conn = sqlite3.connect(self.path, timeout=2.0)
        try:
            if fresh:
                with contextlib.suppress(OSError):
                    self.path.chmod(self._mode)
            conn.execute(
                "CREATE TABLE IF NOT EXISTS snapshots (seq INTEGER PRIMARY KEY, "
                "schema INTEGER NOT NULL, hostler TEXT NOT NULL, fingerprint TEXT NOT NULL, "
                "body BLOB NOT NULL)"
            )
            yield conn
            conn.commit()
        finally:
            conn.close()

    def load(self, store: EventStore, at_most: int) -> tuple[World, RuntimeState] | None:
        """The newest sound snapshot at or before seq ``at_most``; unsound ones are deleted."""
        if not self.path.exists() or not self.usable():
            return None
        try:
            with self._db() as conn:
                conn.execute(
                    "DELETE FROM snapshots WHERE schema != ? OR hostler != ?",
                    (_schema(), __version__),
                )
                while True:
                    row = conn.execute(
                        "SELECT seq, fingerprint, body FROM snapshots WHERE seq <= ? "
                        "ORDER BY seq DESC LIMIT 1",
                        (at_most,),
                    ).fetchone()
                    if row is None:
                        return None
                    seq, fingerprint, body = row
                    found = None
                    if fingerprint == fingerprint_at(store, seq):
                        found = _decode(body, seq)
                    if found is not None:
                        return found
                    # another log, or a damaged snapshot: none after it can be trusted either
                    conn.execute("DELETE FROM snapshots WHERE seq >= ?", (seq,))
        except sqlite3.Error:
            return None

    def save(self, store: EventStore, world: World, state: RuntimeState) -> bool:
        """Keep a snapshot at ``world.last_seq``; False when the cache cannot be written."""
        seq = world.last_seq
        if seq <= 0 or state.last_seq != seq:
            return False
        fingerprint = fingerprint_at(store, seq)
        if fingerprint is None:
            return False
        body = zlib.compress(
            msgspec.json.encode({"world": world_to_json(world), "state": state.to_json()}), 1
        )
        try:
            with self._db() as conn:
                conn.execute(
                    "INSERT OR REPLACE INTO snapshots VALUES (?, ?, ?, ?, ?)",
                    (seq, _schema(), __version__, fingerprint, body),
                )
        except (sqlite3.Error, OSError):
            return False
        return True

    def count(self) -> int:
        """How many snapshots the cache holds (0 when it cannot be read)."""
        if not self.path.exists() or not self.usable():
            return 0
        try:
            with self._db() as conn:
                return int(conn.execute("SELECT count(*) FROM snapshots").fetchone()[0])
        except sqlite3.Error:
            return 0


def _schema() -> int:
    return SNAPSHOT_SCHEMA * 1000 + STATE_SCHEMA


def _inflate(body: bytes) -> bytes | None:
    """``body`` decompressed, or None past :data:`MAX_RATIO` times its size or :data:`MAX_BODY`."""
    limit = min(MAX_BODY, MAX_RATIO * len(body))
    inflater = zlib.decompressobj()
    data = inflater.decompress(body, limit)
    if inflater.unconsumed_tail or not inflater.eof:
        return None  # a bomb, or a truncated body: a miss either way
    return data


def _decode(body: bytes, seq: int) -> tuple[World, RuntimeState] | None:
    try:
        text = _inflate(body)
        if text is None:
            return None
        data = msgspec.json.decode(text)
        world = world_from_json(data["world"])
        state = RuntimeState.from_json(data["state"])
    except (zlib.error, msgspec.DecodeError, KeyError, TypeError, ValueError, RecursionError):
        return None
    if world.last_seq != seq or state.last_seq != seq:
        return None
    state.world = world
    return world, state


def _row_print(store: EventStore, *, after_seq: int = 0, until_seq: int | None = None) -> str:
    for record in store.read_all(after_seq=after_seq, until_seq=until_seq, limit=1):
        body = msgspec.json.encode([record.payload, record.damage])
        digest = hashlib.sha256(body).hexdigest()[:16]
        stamp = record.recorded_at.isoformat()
        return f"{record.seq}|{record.stream_id}|{record.version}|{record.type}|{stamp}|{digest}"
    return ""


def fingerprint_at(store: EventStore, seq: int) -> str | None:
    """The log's first row and the row at ``seq``, fingerprinted (None: no row at ``seq``).

    Each row as ``seq|stream|version|type|recorded_at|payload digest``.
    Another log, even one that recorded the same kinds of events in the same order, differs
    here: its rows were recorded at other moments, or (a redacted import of the same log)
    hold other payloads.
    """
    last = _row_print(store, after_seq=seq - 1, until_seq=seq)
    if not last:
        return None
    return f"{_row_print(store)}/{last}"


def seq_at(store: EventStore, moment: datetime) -> int:
    """The seq of the last row recorded at or before ``moment`` (0: none).

    On SQLite the ``recorded_at`` index answers it in one step (the newest such time, the
    highest seq among equals); elsewhere, or when that read fails, the rows are scanned back
    from the end. Rows are stamped at commit, in seq order, so both agree.
    """
    log = store.sqlite_file
    if log is not None:
        try:
            conn = sqlite3.connect(f"{log.as_uri()}?mode=ro", uri=True, timeout=2.0)
            try:
                row = conn.execute(
                    "SELECT seq FROM events WHERE recorded_at <= ? "
                    "ORDER BY recorded_at DESC, seq DESC LIMIT 1",
                    (format_time(moment),),
                ).fetchone()
            finally:
                conn.close()
        except sqlite3.Error:
            pass
        else:
            return 0 if row is None else int(row[0])
    for record in store.read_all(until=moment, last=1):
        return record.seq
    return 0


def as_of(
    store: EventStore,
    seq: int | None = None,
    *,
    cache: SnapshotCache | None = None,
    every: int = SNAPSHOT_EVERY,
) -> AsOf:
    """The world and the runtime state after the row at ``seq`` (None: the whole log).

    Resumes from the newest sound snapshot at or before ``seq`` when a cache is given, and saves
    one at each multiple of ``every`` it folds past. Without a cache it folds from the start.
    """
    if every < 1:
        raise ValueError("snapshots are taken every 1 event or more")
    loaded = None if cache is None else cache.load(store, seq if seq is not None else 2**62)
    if loaded is None:
        state, resumed = RuntimeState(), 0
    else:
        state = loaded[1]
        resumed = state.last_seq
    world = state.world  # the state's engines and leases are views of it: one fold of both
    saved = 0
    log_end = store.last_seq() if cache is not None else 0

    def fold_to(until_seq: int | None) -> None:
        for page in store.read_rows(after_seq=world.last_seq, until_seq=until_seq):
            fold_rows(state, page)

    point = world.last_seq
    while True:
        stop = (point // every + 1) * every
        last = world.last_seq
        if cache is not None and stop <= log_end and (seq is None or stop <= seq):
            fold_to(stop)
            if world.last_seq > last and cache.save(store, world, state):
                saved += 1
            point = stop
            continue
        fold_to(seq)
        return AsOf(world, state, resumed, saved)
