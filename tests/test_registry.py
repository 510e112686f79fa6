"""A log opened through the library decodes every event type hostler writes (a post-mortem).

``import hostler`` itself loads only the version and the errors (the CLI starts at once); the
log's reader (:mod:`hostler.store.records`, loaded with ``hostler.EventStore``) registers every
type before it decodes a row.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from _support import REPO, run_python

#: Every type hostler writes, registered once the library's log is loaded.
REGISTERED_ON_IMPORT = [
    "cache.budget_set",
    "cache.evicted",
    "cache.restored",
    "cache.saved",
    "calibration.measured",
    "cpu.unsupported",
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
hostler.EventStore  # the log, as a post-mortem opens it
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


def test_the_librarys_log_registers_every_type_it_writes() -> None:
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


READ_BACK = """
import json, sys
import hostler
store = hostler.EventStore.open(sys.argv[1])
print(json.dumps([type(r.event).__name__ for r in store.read_all()]))
"""

WRITE = """
import sys
import hostler
from hostler.machines.engine import EngineReady
store = hostler.EventStore.open(sys.argv[1], owner=True)
store.append("engine/a", [EngineReady("starting", "ready", 1.0)], expected_version=0)
"""


def test_a_fresh_reader_decodes_lifecycle_events(tmp_path: Path) -> None:
    """The lifecycle's events (defined beside its machines) come back decoded, not unknown."""
    url = f"sqlite:///{tmp_path / 'events.db'}"
    written = run_python(WRITE, url)
    assert written.returncode == 0, written.stderr
    read = run_python(READ_BACK, url)
    assert read.returncode == 0, read.stderr
    assert json.loads(read.stdout) == ["EngineReady"]
