"""``hostler export`` and ``hostler import``: a log as JSON lines, and back into an empty log."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import msgspec

from hostler._version import __version__
from hostler.cli.common import (
    DamageReport,
    atomic_output,
    log_target,
    open_existing_log,
    refuse_fleet_without_host,
    take_log_argument,
)
from hostler.cli.options import path_argument
from hostler.cli.timeparse import parse_moment
from hostler.errors import ExportFormatError, UsageError
from hostler.paths import masked
from hostler.postmortem.exchange import (
    MAX_LINE_BYTES,
    decode_line,
    end_line,
    header,
    is_end,
    parse_end,
    parse_header,
    parse_row,
    row_line,
)
from hostler.postmortem.redact import Redaction, Redactor, parse_redaction
from hostler.postmortem.snapshots import SIDECAR_SUFFIX
from hostler.store.connect import sqlite_path_of
from hostler.store.log import EventStore, RawRow, format_time

__all__ = ["run_export", "run_import"]

_encode = msgspec.json.Encoder().encode


def redaction_argument(text: str) -> Redaction:
    """An argparse type: what ``--redact`` takes (see :func:`parse_redaction`)."""
    try:
        return parse_redaction(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# -- export --------------------------------------------------------------------------------


def run_export(args: argparse.Namespace) -> int:
    """Write the export; the exit status is 1 when damaged rows were met."""
    take_log_argument(args, "export")
    now = datetime.now(UTC)
    since = parse_moment(args.since, now=now) if args.since else None
    until = parse_moment(args.until, now=now) if args.until else None
    with open_existing_log(args) as store:
        damage = DamageReport(store.name)
        if args.output is None:
            written = export_rows(
                store,
                sys.stdout.buffer,
                args.redact,
                damage,
                after_seq=args.after_seq,
                since=since,
                until=until,
            )
        else:
            with atomic_output(args.output) as out:
                written = export_rows(
                    store,
                    out,
                    args.redact,
                    damage,
                    after_seq=args.after_seq,
                    since=since,
                    until=until,
                )
            print(f"hostler: exported {written} rows to {args.output}", file=sys.stderr)
        return damage.status()


def export_rows(
    store: EventStore,
    out: IO[bytes],
    redaction: Redaction,
    damage: DamageReport,
    *,
    after_seq: int = 0,
    since: datetime | None = None,
    until: datetime | None = None,
) -> int:
    """Write the header, the selected rows (paged, never all in memory) and the end line.

    The export is the log as it was when it began (PM45): rows appended meanwhile are left out.
    Returns how many rows were written.
    """
    last_seq = store.last_seq()
    first = next(store.read_all(limit=1), None)
    selection = {
        "since": format_time(since) if since else None,
        "until": format_time(until) if until else None,
        "after_seq": after_seq,
    }
    head = header(
        hostler_version=__version__,
        rows=store.count(),
        first_seq=first.seq if first else 0,
        last_seq=last_seq,
        selection=selection,
        redaction=redaction,
    )
    out.write(_encode(head) + b"\n")
    redactor = Redactor(redaction)
    rows = damaged = 0
    for row, record in store.read_stored(
        after_seq=after_seq, until_seq=last_seq, since=since, until=until
    ):
        if record.damage:
            damage.note(record.seq, record.damage)
            damaged += 1
        out.write(_encode(row_line(row, record, redactor)) + b"\n")
        rows += 1
    out.write(_encode(end_line(rows, damaged)) + b"\n")
    out.flush()
    return rows


# -- import --------------------------------------------------------------------------------


class _Lines:
    """An export file read line by line, none longer than :data:`MAX_LINE_BYTES`."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self.number = 0

    def next(self) -> bytes | None:
        data = self._stream.readline(MAX_LINE_BYTES + 1)
        if not data:
            return None
        self.number += 1
        if len(data) > MAX_LINE_BYTES and not data.endswith(b"\n"):
            raise ExportFormatError(
                f"line {self.number}: longer than {MAX_LINE_BYTES // 2**20} MiB; "
                "nothing was imported"
            )
        if not data.strip():
            raise ExportFormatError(f"line {self.number}: empty; nothing was imported")
        return data

    def header(self) -> dict[str, Any]:
        data = self.next()
        if data is None:
            raise ExportFormatError("the file is empty: no hostler-events header")
        return parse_header(decode_line(data, 1))

    def rows(self) -> Iterator[RawRow]:
        previous = written = 0
        while True:
            data = self.next()
            if data is None:
                raise ExportFormatError(
                    f"the file ends after line {self.number} without its end line (cut "
                    "short?); nothing was imported"
                )
            value = decode_line(data, self.number)
            if is_end(value):
                parse_end(value, self.number, written)
                break
            row = parse_row(value, self.number, previous)
            previous, written = row[0], written + 1
            yield row
        if self.next() is not None:
            raise ExportFormatError(
                f"line {self.number}: a line after the end line; nothing was imported"
            )


def run_import(args: argparse.Namespace) -> int:
    """Import the file into the empty log ``--db`` names (created when absent)."""
    target = log_target(args)
    path = sqlite_path_of(target)
    with _source(args.file) as stream:
        lines = _Lines(stream)
        head = lines.header()
        created = path is not None and not path.exists()
        lock_made = path is not None and not Path(f"{path}.lock").exists()
        try:
            with EventStore.open(target, owner=True, host=args.host_name) as store:
                refuse_fleet_without_host(store, args.host_name, "import into one host's part")
                written = store.import_rows(_as_host(lines.rows(), args.host_name))
                name = store.name
            # a cache beside this path was made from another log: it must never answer for
            # this one (the link itself, if it is one, never what it points at)
            if path is not None:
                Path(f"{path}{SIDECAR_SUFFIX}").unlink(missing_ok=True)
        except BaseException:
            if created and path is not None:
                _remove_log(path, lock=lock_made)
            raise
    redactions = ", ".join(head["redactions"]) or "none"
    print(
        f"hostler: imported {written} rows into {name} (exported by hostler "
        f"{head.get('hostler_version', '?')}; redactions: {redactions})",
        file=sys.stderr,
    )
    return 0


def _as_host(rows: Iterator[RawRow], host: str | None) -> Iterator[RawRow]:
    """The rows, refused where their metadata names another host than the one imported into.

    Every event names its host (docs/fleet.md): a host's export goes back into that host's
    part, never into another's under the wrong name.
    """
    for row in rows:
        named = _host_of(row[6])
        if named is not None and named != host:
            raise ExportFormatError(
                f"seq {row[0]}: recorded on host {named!r}, not {host!r}; import it with "
                f"--host-name {named} (nothing was imported)"
            )
        yield row


def _host_of(metadata: object) -> str | None:
    try:
        value = json.loads(metadata) if isinstance(metadata, str) else metadata
    except ValueError:
        return None
    host = value.get("host") if isinstance(value, dict) else None
    return host if isinstance(host, str) else None


@contextlib.contextmanager
def _source(name: str) -> Iterator[IO[bytes]]:
    if name == "-":
        yield sys.stdin.buffer
        return
    try:
        stream = path_argument(name).open("rb")
    except (OSError, argparse.ArgumentTypeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise UsageError(f"{masked(name)}: cannot read ({why})") from None
    with stream:
        yield stream


def _remove_log(path: Path, *, lock: bool) -> None:
    """Remove a log this import created and left empty (and its journal and lock files)."""
    ends = ("-wal", "-shm", "-journal", ".lock") if lock else ("-wal", "-shm", "-journal")
    for leftover in (path, *(Path(f"{path}{end}") for end in ends)):
        with contextlib.suppress(OSError):
            leftover.unlink()
