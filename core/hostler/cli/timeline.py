"""``hostler timeline LOG -o FILE.svg|png``: the log's memory over time, as a picture."""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from datetime import UTC, datetime
from pathlib import Path

from hostler.cli.common import (
    DamageReport,
    atomic_output,
    open_existing_log,
    take_log_argument,
)
from hostler.cli.ledger_rows import recorded_ledger_rows
from hostler.cli.timeparse import parse_moment
from hostler.errors import UsageError
from hostler.events.ledger import LEDGER_STREAM
from hostler.store.log import RecordedEvent

__all__ = ["run"]

#: Picture sizes accepted, in pixels.


def run(args: argparse.Namespace) -> int:
    """Read the log, draw, write the file; warn about damaged rows."""
    output: Path = args.output
    fmt = output.suffix.lower().removeprefix(".")
    if fmt not in ("svg", "png"):
        raise UsageError(f"{str(output)[:200]}: the picture is written as .svg or .png")
    now = datetime.now(UTC)
    since = parse_moment(args.since, now=now) if args.since else None
    until = parse_moment(args.until, now=now) if args.until else None
    if since and until and since >= until:
        raise UsageError("--since must be before --until")
    take_log_argument(args, "timeline")
    from hostler.postmortem.draw import render, require_plots  # noqa: PLC0415
    from hostler.postmortem.timeline import build_timeline  # noqa: PLC0415

    require_plots()  # before the log is read: a missing extra is said at once

    with contextlib.ExitStack() as stack:
        store = stack.enter_context(open_existing_log(args))
        name = store.name
        rows = list(store.read_all(until=until))
        if args.ledger is not None:
            log_file = store.sqlite_file
            if log_file is not None and _same_file(log_file, args.ledger):
                raise UsageError(f"--ledger {args.ledger} is the log itself: give it once")
            given = stack.enter_context(open_existing_log(argparse.Namespace(db=args.ledger)))
            ledger: list[RecordedEvent] | None = list(given.read_all(until=until))
        else:
            ledger = recorded_ledger_rows(store, rows, until=until)
        timeline = build_timeline(
            rows,
            ledger=ledger or (),
            since=since.timestamp() if since else None,
            until=until.timestamp() if until else None,
        )
        has_ledger = ledger is not None or store.stream_version(LEDGER_STREAM) > 0
    damage = DamageReport(name)
    for seq, why in timeline.damaged:
        damage.note(seq, why)
    if not has_ledger:
        print(
            f"hostler: note: {name} holds no memory decisions (ledger.*): a daemon keeps them "
            "in the host ledger's log; give it with --ledger PATH",
            file=sys.stderr,
        )
    picture = io.BytesIO()
    render(
        timeline,
        picture,
        fmt=fmt,
        width=args.width,
        height=args.height,
        title=f"hostler memory timeline — {Path(name).name}",
    )
    with atomic_output(output) as out:  # whole or not at all: never a half picture
        out.write(picture.getvalue())
    marks = len(timeline.markers)
    print(
        f"{output}: {len(timeline.engines)} engines, {marks} markers, "
        f"{len(timeline.spans)} leases, {timeline.events} events read"
    )
    return damage.status()


def _same_file(one: Path, other: Path) -> bool:
    try:
        return one.samefile(other)
    except OSError:
        return False
