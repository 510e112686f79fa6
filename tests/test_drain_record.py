"""A drain is a decision: recorded before it is begun, refused at once when the log cannot take
it (issue 22's second breaking helper: with the log's table locked, an unload marked the engine
draining at once, held a request for 26 s behind it, and its ``pool.drain_started`` was never
written)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import anyio
import pytest

import hostler
from hostler.capacity.budget import HostMemory, compute_budget
from hostler.capacity.origin import API_SOURCE
from hostler.capacity.units import GIB
from hostler.drivers.host_ledger import HostLedger, OwnerIdentity
from hostler.errors import StoreBusyError
from hostler.store.log import EventStore

from _fake_engine import BallastEngine
from _pools import BALLAST_MIB, World, work

pytestmark = pytest.mark.anyio


async def test_an_unload_the_log_cannot_record_is_refused_at_once_and_not_begun(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events.db"
    with EventStore.open(path, busy_timeout=0.05) as store:  # the daemon's short wait
        ledger = HostLedger(
            store, OwnerIdentity.current("draintest"), lambda: compute_budget(HostMemory(64 * GIB))
        )
        ledger.set_budget(GIB, source=API_SOURCE)
        world = World(tmp_path, store, ledger)
        engine = BallastEngine(tmp_path, BALLAST_MIB)
        async with hostler.Runtime(
            store, world.supervisor_factory(engine), ledger=ledger, drain_poll=0.02
        ) as rt:
            key = await rt.bind("ballast", "alpha", "s")
            async with rt.request(key) as port:
                await anyio.to_thread.run_sync(work, port, 0.0)
            locker = sqlite3.connect(path, isolation_level=None)
            locker.execute("BEGIN EXCLUSIVE")  # another writer holds the log
            try:
                began = time.monotonic()
                with pytest.raises(StoreBusyError):
                    await rt.unload(key)
                assert time.monotonic() - began < 5  # refused, not waited on for 30 s
                (engine_row,) = [e for e in rt.status().engines if e.key == key]
                assert engine_row.state == "running" and not engine_row.draining
            finally:
                locker.execute("ROLLBACK")
                locker.close()
            assert await rt.unload(key)  # once the log takes it, it is done and recorded
        types = [r.type for r in store.read_all(streams=["pool/host"])]
        assert types.count("pool.drain_started") == 1 and types[-1] == "pool.drain_ended"
