"""The host-wide ledger on a real SQLite file, shared by several daemons (real processes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hostler import EventStore
from hostler.capacity.budget import HostMemory, compute_budget
from hostler.capacity.origin import API_SOURCE
from hostler.capacity.units import GIB
from hostler.drivers.host_ledger import HostLedger, OwnerIdentity, owner_alive
from hostler.events.ledger import LEDGER_STREAM, LedgerDenied, LedgerReleased, LedgerReserved

from _support import REPO

BUDGET = compute_budget(HostMemory(system_ram=16 * GIB))  # 9.6 GiB, RAM host


def ledger_for(store: EventStore, label: str, **kwargs: object) -> HostLedger:
    return HostLedger(store, OwnerIdentity.current(label), lambda: BUDGET, **kwargs)  # type: ignore[arg-type]


def test_two_daemons_share_one_ledger(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with EventStore.open(path) as one_store, EventStore.open(path) as two_store:
        one = ledger_for(one_store, "alice")
        two = ledger_for(two_store, "bob")
        assert one.reserve("llamacpp:a:0", 6 * GIB).granted
        denied = two.reserve("llamacpp:b:0", 6 * GIB)
        assert not denied.granted
        assert denied.committed_other == 6 * GIB
        assert denied.reason.startswith("budget exhausted: would commit")
        assert two.reserve("llamacpp:b:0", 3 * GIB).granted
        assert one.release("llamacpp:a:0") is True
        assert one.release("llamacpp:a:0") is False  # unknown key: a no-op, nothing recorded
        snapshot = two.snapshot()
        assert snapshot["committed"] == 3 * GIB
        assert [r["key"] for r in snapshot["by_key"]] == ["llamacpp:b:0"]
        assert snapshot["by_key"][0]["owner"].startswith("bob:")
        assert snapshot["by_key"][0]["owner_alive"] is True
        types = [r.type for r in one_store.read_stream(LEDGER_STREAM)]
        assert types == ["ledger.reserved", "ledger.denied", "ledger.reserved", "ledger.released"]
        assert two.retries + one.retries == 0


def test_budget_and_spillover_settings_are_events(tmp_path: Path) -> None:
    with EventStore.open(tmp_path / "ledger.db") as store:
        ledger = ledger_for(store, "op")
        assert ledger.reserve("a", 5 * GIB).granted
        ledger.set_budget(4 * GIB, source=API_SOURCE)
        assert ledger.snapshot()["committed"] == 5 * GIB  # never evicts
        assert not ledger.reserve("b", 1).granted
        ledger.set_budget(None, source=API_SOURCE)
        assert ledger.reserve("b", 1 * GIB).granted
        ledger.set_spillover(False)
        assert ledger.limits().spillover_allowed is False
        other = ledger_for(store, "late")
        assert other.limits().spillover_allowed is False  # a newcomer folds the settings


_HOLDER = """
import sys, time
from hostler import EventStore
from hostler.capacity.budget import HostMemory, compute_budget
from hostler.drivers.host_ledger import HostLedger, OwnerIdentity
from hostler.capacity.units import GIB
with EventStore.open(sys.argv[1]) as store:
    ledger = HostLedger(store, OwnerIdentity.current("doomed"), lambda: compute_budget(HostMemory(16 * GIB)))
    assert ledger.reserve("llamacpp:stranded:0", 8 * GIB).granted
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_dead_daemons_reservations_are_released_by_the_next_reserve(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "held"
    with EventStore.open(path) as store:
        ledger = ledger_for(store, "survivor")
        assert not ledger.reserve("llamacpp:mine:0", 4 * GIB).granted  # the holder is alive
        holder.send_signal(signal.SIGKILL)
        holder.communicate()
        decision = ledger.reserve("llamacpp:mine:0", 4 * GIB)
        assert decision.granted
        records = store.read_stream(LEDGER_STREAM)
        released = [r.event for r in records if isinstance(r.event, LedgerReleased)]
        assert len(released) == 1
        assert released[0].key == "llamacpp:stranded:0"
        assert released[0].cause == "owner-gone"
        assert released[0].owner.startswith(f"doomed:{holder.pid}:")


def test_owner_liveness() -> None:
    me = OwnerIdentity.current("me")
    assert owner_alive(me.text(), this_boot=me.boot)
    assert not owner_alive(me.text(), this_boot="another-boot")
    reused = OwnerIdentity(me.pid, me.create_time - 100, me.boot, "me")  # pid reused
    assert not owner_alive(reused.text(), this_boot=me.boot)
    assert owner_alive("not an owner string", this_boot=me.boot)  # unknown: kept
    assert OwnerIdentity.parse(me.text()) == me


_HAMMER = """
import json, random, sys, time
from hostler import EventStore, HostlerError
from hostler.capacity.budget import HostMemory, compute_budget
from hostler.drivers.host_ledger import HostLedger, OwnerIdentity
from hostler.capacity.units import GIB, MIB
path, seconds, me = sys.argv[1], float(sys.argv[2]), sys.argv[3]
rng = random.Random(me)
stats = {"granted": 0, "denied": 0, "released": 0, "errors": [], "retries": 0}
with EventStore.open(path) as store:
    ledger = HostLedger(store, OwnerIdentity.current(me), lambda: compute_budget(HostMemory(16 * GIB)))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        key = f"llamacpp:m{rng.randrange(6)}:0"  # the same keys in every process
        try:
            if rng.random() < 0.6:
                decision = ledger.reserve(key, rng.randrange(64 * MIB, 5 * GIB))
                stats["granted" if decision.granted else "denied"] += 1
            elif ledger.release(key):
                stats["released"] += 1
        except HostlerError as exc:
            stats["errors"].append(str(exc))
    stats["retries"] = ledger.retries
print(json.dumps(stats))
"""


def test_four_processes_hammering_never_overcommit(tmp_path: Path) -> None:
    seconds = float(os.environ.get("HOSTLER_HAMMER_SECONDS", "30"))
    path = tmp_path / "ledger.db"
    EventStore.open(path).close()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _HAMMER, str(path), str(seconds), f"p{i}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO / "tests",
        )
        for i in range(4)
    ]
    outputs = [p.communicate(timeout=seconds + 120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outputs]
    stats = [json.loads(out) for out, _ in outputs]
    assert all(s["errors"] == [] for s in stats), [
        s["errors"] for s in stats
    ]  # no "database is locked"
    assert sum(s["granted"] for s in stats) > 100
    assert sum(s["denied"] for s in stats) > 0  # the budget was actually contended
    # Replay the ledger log: at no seq do granted reservations exceed the budget.
    held: dict[tuple[str, str], int] = {}
    owners_per_key: dict[str, set[str]] = {}
    peak = 0
    with EventStore.open(path) as store:
        records = list(store.read_all(streams=[LEDGER_STREAM]))
        for record in records:
            event = record.event
            if isinstance(event, LedgerReserved):
                held[(event.owner, event.key)] = event.bytes
                owners_per_key.setdefault(event.key, set()).add(event.owner)
                assert event.budget == BUDGET.budget
            elif isinstance(event, LedgerReleased):
                assert (event.owner, event.key) in held, "released what it did not hold"
                held.pop((event.owner, event.key))
            else:
                assert isinstance(event, LedgerDenied)
            committed = sum(held.values())
            peak = max(peak, committed)
            assert committed <= BUDGET.budget, f"over budget at seq {record.seq}"
        assert [r.version for r in records] == list(range(1, len(records) + 1))
    assert peak > BUDGET.budget * 0.5
    # the same keys really were contended by several owners at once
    assert max(len(owners) for owners in owners_per_key.values()) >= 2
    print(
        f"ledger events: {len(records)}, peak {peak / GIB:.2f} GiB of {BUDGET.budget / GIB:.1f}, "
        f"retries {sum(s['retries'] for s in stats)}"
    )


@pytest.mark.parametrize("owner", ["x", "a:b", "a:1:notafloat:boot"])
def test_parse_rejects_malformed_owner_strings(owner: str) -> None:
    assert OwnerIdentity.parse(owner) is None
