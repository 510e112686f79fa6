"""``hostler state``: the whole runtime rebuilt from the log, now or as of a seq or a time."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from hostler.cli.common import Answer, DamageReport, answer_by_host, open_existing_log
from hostler.cli.tables import size
from hostler.cli.timeparse import parse_moment
from hostler.errors import UsageError
from hostler.postmortem.runtime_state import RuntimeState
from hostler.postmortem.snapshots import SnapshotCache, as_of, seq_at
from hostler.replay import World
from hostler.store.log import EventStore

__all__ = ["format_runtime", "format_world", "parse_at", "run"]

_COLUMNS: dict[str, tuple[str, ...]] = {
    "Engine": ("pid", "stop_reason", "starts", "crashes", "retry_at", "last_error"),
    "Lease": ("slot", "holder", "expires_at", "end_cause"),
    "Reservation": ("requested_bytes", "granted_bytes", "owner", "shortfall", "denial_reason"),
}

#: The largest seq ``--at`` takes (SQLite's integer limit).
_MAX_SEQ = 2**63 - 1


def parse_at(text: str, *, now: datetime) -> int | datetime:
    """``--at``'s value (PM6): a seq (digits only) or a moment as :func:`parse_moment` reads."""
    cleaned = text.strip()
    if cleaned.isascii() and cleaned.isdigit():
        if len(cleaned) > 19 or int(cleaned) > _MAX_SEQ:
            raise UsageError(f"--at {cleaned[:30]}: a seq is at most {_MAX_SEQ}")
        return int(cleaned)
    return parse_moment(cleaned, now=now)


def _moment(args: argparse.Namespace) -> int | datetime | None:
    given = [g for g in (args.at, args.until_seq, args.until) if g is not None]
    if len(given) > 1:
        raise UsageError("state: give one of --at, --until-seq and --until")
    now = datetime.now(UTC)
    if args.at is not None:
        return parse_at(args.at, now=now)
    if args.until is not None:
        return parse_moment(args.until, now=now)
    return args.until_seq  # type: ignore[no-any-return]


def _target_seq(store: EventStore, moment: int | datetime | None) -> int | None:
    if isinstance(moment, datetime):
        return seq_at(store, moment)
    return moment


def run(args: argparse.Namespace) -> int:
    """Fold (from the nearest snapshot) and print: one log, or each host of a fleet's."""
    moment = _moment(args)
    return answer_by_host(args, lambda host: _fold(args, moment, host), sort_keys=True)


def _fold(args: argparse.Namespace, moment: int | datetime | None, host: str | None) -> Answer:
    """One log's (or one host's) state: the exit status, the JSON document, the text."""
    with open_existing_log(args, host=host) as store:
        seq = _target_seq(store, moment)
        cache = None if args.no_snapshots else SnapshotCache.beside(store)
        answer = as_of(store, seq, cache=cache)
        last = answer.world.last_seq
        at = next(iter(store.read_all(after_seq=last - 1, until_seq=last)), None) if last else None
        damage = DamageReport(store.name)
    world, state = answer.world, answer.state
    for damaged_seq, why in world.damaged:
        damage.note(damaged_seq, why)
    recorded = None if at is None else at.recorded_at.isoformat()
    document: dict[str, Any] = {
        **world.snapshot(),
        "as_of": {"seq": world.last_seq, "recorded_at": recorded, "events": world.events},
        "runtime": state.to_json(),
    }
    lines = format_world(world)
    if recorded:
        lines[0] += f", recorded {recorded}"
    text = "\n".join([*lines[:1], *format_runtime(state), *lines[1:]])
    return damage.status(), document, text


def format_runtime(state: RuntimeState) -> list[str]:
    """Readable lines: budget, resident engines, reservations, leases, queues, sessions."""
    budget = state.budget
    explicit = "automatic" if budget["explicit"] is None else size(budget["explicit"])
    spill = {None: "automatic", True: "allowed", False: "forbidden"}.get(budget["spillover"], "?")
    in_force = "-" if budget["budget"] is None else size(budget["budget"])
    lines = [
        "",
        f"BUDGET  {in_force} in force (operator: {explicit}; spillover {spill}); "
        f"committed {size(state.committed)}",
    ]
    resident = state.resident
    lines.append("")
    lines.append(f"RESIDENT ENGINES ({len(resident)})")
    for key, e in sorted(resident.items()):
        lines.append(
            f"  {key:<36} {e['state']:<9} pid={e['pid']} port={e['port']} "
            f"reserved={size(e['reserved'])} measured={size(e['measured'])}"
        )
    lines.append("")
    lines.append(f"RESERVATIONS ({len(state.reservations)})")
    for key, r in sorted(state.reservations.items()):
        lines.append(f"  {key:<36} {size(r['bytes']):>10}  owner={r['owner']}")
    lines.append("")
    lines.append(f"GPU LEASES ({len(state.leases)})")
    for lease, held in sorted(state.leases.items()):
        lines.append(
            f"  {lease:<20} {held['state']:<8} slot={held['slot']} holder={held['holder']} "
            f"expires_at={held['expires_at']}"
        )
    lines.append("")
    lines.append(f"QUEUES ({len(state.queues)})")
    for key, queue in sorted(state.queues.items()):
        lines.append(f"  {key:<36} waiting={queue['waiting']} running={queue['running']}")
    lines.append("")
    lines.append(f"SESSIONS ({len(state.sessions)})")
    for session, key in sorted(state.sessions.items())[:50]:
        lines.append(f"  {session:<36} -> {key}")
    if len(state.sessions) > 50:
        lines.append(f"  ... {len(state.sessions) - 50} more (--json lists every one)")
    if state.unreadable:
        lines.append(f"{len(state.unreadable)} rows of known types did not fit and were skipped")
    return lines


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
