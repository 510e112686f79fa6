"""``hostler events``: list, filter and tail the event log."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from hostler.cli import remote_events
from hostler.cli.client import daemon_url
from hostler.cli.common import DamageReport, fleet_hosts_of, open_existing_log
from hostler.cli.render import EventRow, TableWriter, summarize_fields
from hostler.cli.timeparse import parse_moment
from hostler.errors import StoreBusyError, StoreUnavailableError, UsageError
from hostler.events.base import UnknownEvent
from hostler.store.log import EventStore, RecordedEvent, format_time

__all__ = ["event_row", "record_json", "run"]


def run(args: argparse.Namespace) -> int:
    """List (and optionally follow) the log (the running daemon's with ``--url``)."""
    url = args.url or (None if args.db else daemon_url(args, default=None))
    if url is not None:
        return remote_events.run(args, url)
    now = datetime.now(UTC)
    since = parse_moment(args.since, now=now) if args.since else None
    until = parse_moment(args.until, now=now) if args.until else None
    for option in ("limit", "tail"):
        value = getattr(args, option)
        if value is not None and value < 1:
            raise UsageError(f"--{option} must be at least 1")
    if args.follow and until is not None:
        raise UsageError("--follow and --until contradict each other")
    hosts = fleet_hosts_of(args)
    if hosts:
        return _fleet(args, hosts, since, until)
    with open_existing_log(args) as store:
        damage = DamageReport(store.name)
        records = _noting_damage(_records(store, args, since, until), damage)
        if args.json:
            lines: Iterator[str] | Iterable[str] = (record_json(r) for r in records)
        else:
            lines = TableWriter(wide=args.wide).lines(event_row(r) for r in records)
        return _print(lines, args, damage)


def _print(lines: Iterable[str], args: argparse.Namespace, damage: DamageReport) -> int:
    shown = 0
    for line in lines:
        print(line, flush=args.follow)
        shown += 1
    if shown == 0 and not args.json:
        print("(no events match)", file=sys.stderr)
    return damage.status()


def _fleet(
    args: argparse.Namespace, hosts: list[str], since: datetime | None, until: datetime | None
) -> int:
    """Every host's events of a fleet's log, in the order they were recorded, host named."""
    if args.follow:
        raise UsageError(
            f"--follow reads one host's events: add --host-name (hosts: {', '.join(hosts[:20])})"
        )
    merged: list[tuple[str, RecordedEvent]] = []
    damage = DamageReport("")
    for host in hosts:
        with open_existing_log(args, host=host) as store:
            damage.log_name = store.name
            merged += [
                (host, r) for r in _noting_damage(_records(store, args, since, until), damage)
            ]
    merged.sort(key=lambda pair: (pair[1].recorded_at, pair[0], pair[1].seq))
    if args.tail is not None:
        merged = merged[-args.tail :]
    if args.limit is not None:
        merged = merged[: args.limit]
    if args.json:  # each line's metadata names its host
        return _print((record_json(r) for _, r in merged), args, damage)
    rows = (dataclasses.replace(event_row(r), stream=f"{h}:{r.stream_id}") for h, r in merged)
    return _print(TableWriter(wide=args.wide).lines(rows), args, damage)


def event_row(record: RecordedEvent) -> EventRow:
    """A log record as the event table shows it (a damaged or unknown row says so)."""
    if record.damage:
        details = f"[DAMAGED ROW: {record.damage}]"
    else:
        details = summarize_fields(record.payload)
        if isinstance(record.event, UnknownEvent):
            details = f"{details} [unknown: {record.event.reason}]".lstrip()
    return EventRow(
        record.seq,
        format_time(record.recorded_at),
        record.stream_id,
        record.version,
        record.type,
        details,
    )


def record_json(record: RecordedEvent) -> str:
    """One JSON line for a record (the stored payload, plus the upcast one if it differs)."""
    data: dict[str, Any] = {
        "seq": record.seq,
        "recorded_at": format_time(record.recorded_at),
        "stream_id": record.stream_id,
        "version": record.version,
        "type": record.type,
        "schema_version": record.schema_version,
        "payload": record.payload,
        "metadata": record.metadata,
    }
    if record.damage:
        data["damaged"] = record.damage
    elif isinstance(record.event, UnknownEvent):
        data["unknown"] = record.event.reason
    return json.dumps(data, separators=(",", ":"), sort_keys=False)


def _noting_damage(
    records: Iterator[RecordedEvent], damage: DamageReport
) -> Iterator[RecordedEvent]:
    for record in records:
        if record.damage:
            damage.note(record.seq, record.damage)
        yield record


def _records(
    store: EventStore, args: argparse.Namespace, since: datetime | None, until: datetime | None
) -> Iterator[RecordedEvent]:
    filters: dict[str, Any] = {
        "types": args.types,
        "streams": args.stream,
        "stream_prefix": args.stream_prefix,
        "since": since,
        "until": until,
    }
    after = args.after_seq
    for record in store.read_all(after_seq=after, limit=args.limit, last=args.tail, **filters):
        after = record.seq
        yield record
    away: str | None = None
    while args.follow:
        time.sleep(args.interval)
        try:
            for record in store.read_all(after_seq=after, **filters):
                after = record.seq
                yield record
        except (StoreUnavailableError, StoreBusyError) as exc:
            # a follower outlives an outage of the log's server: said once, then it waits
            if away is None:
                print(f"hostler: warning [{exc.code}]: {exc.message}; waiting", file=sys.stderr)
            away = exc.message
            continue
        if away is not None:
            print(f"hostler: {store.name}: the log answers again", file=sys.stderr)
            away = None
