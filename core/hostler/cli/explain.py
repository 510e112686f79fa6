"""``hostler explain TARGET``: every recorded decision that touched an engine, model, session..."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from hostler.cli.common import Answer, DamageReport, answer_by_host, open_existing_log
from hostler.cli.timeparse import parse_moment
from hostler.errors import UsageError
from hostler.postmortem.explain import explain, findings_json, resolve_target

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """Read the log, resolve the target, print its story."""
    now = datetime.now(UTC)
    since = parse_moment(args.since, now=now) if args.since else None
    until = parse_moment(args.until, now=now) if args.until else None
    if since is not None and until is not None and since > until:
        raise UsageError("explain: --since is after --until; nothing can match")
    return answer_by_host(args, lambda host: _explain(args, host, since, until), sort_keys=False)


def _explain(
    args: argparse.Namespace, host: str | None, since: datetime | None, until: datetime | None
) -> Answer:
    """One log's (or host's) answer: the exit status, the JSON document, the lines."""
    with open_existing_log(args, host=host) as store:
        records = list(store.read_all(until=until))
        damage = DamageReport(store.name)
    for record in records:
        if record.damage:
            damage.note(record.seq, record.damage)
    target = resolve_target(args.target, records)
    findings = explain(records, target, since=since, until=until)
    document: dict[str, Any] = {
        "target": {
            "text": target.text,
            "kind": target.kind,
            "keys": sorted(target.keys),
            "session": target.session,
            "request": target.request,
        },
        "findings": findings_json(findings),
    }
    keys = ", ".join(sorted(target.keys))
    covers = "" if keys == target.text else f" ({keys or 'no engine'})"
    lines = [f"{target.kind} {target.text}{covers}: {len(findings)} decisions"]
    lines += [finding.line() for finding in findings]
    return damage.status(), document, "\n".join(lines)
