"""``import hostler`` registers every event type hostler writes, so a post-mortem decodes them."""

from __future__ import annotations

import json
import re

from _support import REPO, run_python

#: Every type hostler writes, registered by ``import hostler`` alone.
REGISTERED_ON_IMPORT = [
    "cache.budget_set",
    "cache.evicted",
    "cache.restored",
    "cache.saved",
    "calibration.measured",
    "daemon.gap",
    "daemon.log_recovered",
    "daemon.reaped",
    "daemon.started",
    "daemon.stopped",
    "device.sampled",
    "engine.adopted",
    "engine.adoption_started",
    "engine.crashed",
    "engine.failed",
    "engine.lost",
    "engine.ready",
    "engine.reset",
    "engine.spawned",
    "engine.start_requested",
    "engine.stop_failed",
    "engine.stop_requested",
    "engine.stopped",
    "lease.broken",
    "lease.granted",
    "lease.released",
    "lease.requested",
    "ledger.adopted",
    "ledger.bound",
    "ledger.budget_set",
    "ledger.carried",
    "ledger.denied",
    "ledger.measured",
    "ledger.released",
    "ledger.reserved",
    "ledger.spillover_set",
    "models.offered",
    "offload.degraded",
    "plugin.failed",
    "plugin.loaded",
    "pool.drain_ended",
    "pool.drain_started",
    "pool.room_planned",
    "queue.cancelled",
    "queue.dispatched",
    "queue.enqueued",
    "queue.moved",
    "queue.released",
    "queue.served",
    "reservation.denied",
    "reservation.granted",
    "reservation.released",
    "reservation.requested",
    "router.bound",
]

REGISTRY_AFTER_IMPORT = """
import json, sys
import hostler
from hostler.events.base import registered_types
print(json.dumps({
    "types": sorted(registered_types()),
    "anyio": "anyio" in sys.modules,
    "numpy": "numpy" in sys.modules,
}))
"""


def _after_import() -> dict[str, object]:
    result = run_python(REGISTRY_AFTER_IMPORT)
    assert result.returncode == 0, result.stderr
    out: dict[str, object] = json.loads(result.stdout)
    return out


def test_import_hostler_registers_every_type_it_writes() -> None:
    out = _after_import()
    assert out["types"] == REGISTERED_ON_IMPORT
    # ... without pulling the async runtime or numpy into a post-mortem reader
    assert out["anyio"] is False
    assert out["numpy"] is False


def test_every_event_type_in_the_source_tree_is_registered_on_import() -> None:
    declared: dict[str, str] = {}
    pattern = re.compile(r"@event_type\(\s*\"([^\"]+)\"")
    for root in ("core", "plugins"):
        for path in sorted((REPO / root).rglob("*.py")):
            for name in pattern.findall(path.read_text(encoding="utf-8")):
                declared[name] = path.relative_to(REPO).as_posix()
    assert len(declared) >= len(REGISTERED_ON_IMPORT)
    types = _after_import()["types"]
    assert isinstance(types, list)
    registered = set(types)
    missing = {name: where for name, where in declared.items() if name not in registered}
    assert missing == {}
