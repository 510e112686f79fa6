"""``hostler state``: every machine's state rebuilt from the log, now or as of a moment."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from hostler.cli.common import DamageReport, add_log_options, open_existing_log
from hostler.cli.numbers import count
from hostler.cli.timeparse import parse_moment
from hostler.replay import World, replay

__all__ = ["add_parser", "format_world", "run"]

_COLUMNS: dict[str, tuple[str, ...]] = {
    "Engine": ("pid", "stop_reason", "starts", "crashes", "retry_at", "last_error"),
    "Lease": ("slot", "holder", "expires_at", "end_cause"),
    "Reservation": ("requested_bytes", "granted_bytes", "owner", "shortfall", "denial_reason"),
}


def add_parser(sub: Any) -> None:
    """Register the subcommand."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "state",
        help="replay the log into every machine's state (now, or as of a seq or time)",
    )
    add_log_options(parser)
    parser.add_argument("--until-seq", type=count(0), help="replay events up to this seq only")
    parser.add_argument("--until", help="replay events recorded up to this time")
    parser.add_argument("--json", action="store_true", help="print the state as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Replay and print."""
    until = parse_moment(args.until, now=datetime.now(UTC)) if args.until else None
    with open_existing_log(args) as store:
        world = replay(store, until_seq=args.until_seq, until=until)
        damage = DamageReport(store.name)
    for seq, why in world.damaged:
        damage.note(seq, why)
    if args.json:
        print(json.dumps(world.snapshot(), indent=2, sort_keys=True))
    else:
        print("\n".join(format_world(world)))
    return damage.status()


def format_world(world: World) -> list[str]:
    """Readable lines: one block per lifecycle, one row per instance."""
    lines = [f"as of seq {world.last_seq} ({world.events} events replayed)"]
    if world.unknown:
        lines.append(f"{len(world.unknown)} events of unknown types were kept but not folded")
    for cls, models in world.models.items():
        if not models:
            continue
        columns = _COLUMNS.get(cls.__name__, ())
        lines.append("")
        lines.append(f"{cls.__name__.upper()}S")
        for key, model in sorted(models.items()):
            facts = " ".join(
                f"{c}={getattr(model, c)}" for c in columns if getattr(model, c, None) is not None
            )
            lines.append(f"  {key:<36} {model.state:<10} v{model.version:<4} {facts}")
    return lines
