"""``hostler explain TARGET``: every recorded decision that touched an engine, model, session..."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime

from hostler.cli.common import DamageReport, open_existing_log
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
    with open_existing_log(args) as store:
        records = list(store.read_all(until=until))
        damage = DamageReport(store.name)
    for record in records:
        if record.damage:
            damage.note(record.seq, record.damage)
    target = resolve_target(args.target, records)
    findings = explain(records, target, since=since, until=until)
    if args.json:
        document = {
            "target": {
                "text": target.text,
                "kind": target.kind,
                "keys": sorted(target.keys),
                "session": target.session,
                "request": target.request,
            },
            "findings": findings_json(findings),
        }
        print(json.dumps(document, indent=2))
    else:
        keys = ", ".join(sorted(target.keys))
        covers = "" if keys == target.text else f" ({keys or 'no engine'})"
        print(f"{target.kind} {target.text}{covers}: {len(findings)} decisions")
        for finding in findings:
            print(finding.line())
    return damage.status()
