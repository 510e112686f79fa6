"""RD8, M9: MLX's wired-memory limit is the bytes the ledger reserved for the launch.

The reservation is the adapter's estimate corrected by learning, so once a measurement taught
something it differs from the raw estimate; the supervisor hands the reserved figure to the
adapter in ``LaunchSpec.reserved_bytes``. Run for real: a priced launch under the real
supervisor and ledger, with a stand-in interpreter that records the argv it was given.
"""

from __future__ import annotations

import json
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hostler.capacity.budget import HostMemory, compute_budget
from hostler.drivers.host_ledger import HostLedger, OwnerIdentity
from hostler.engines.price import LaunchRequest, engine_build, price_from_ledger
from hostler.engines.supervisor import Supervisor, SupervisorPolicy
from hostler.errors import EngineStartError
from hostler.events.calibration import CALIBRATION_STREAM, FootprintMeasured
from hostler.plugin import LaunchSpec
from hostler.store.log import EventStore
from hostler.testing.tiny_mlx import write_tiny_mlx
from hostler_mlx import MlxAdapter
from hostler_mlx.adapter import BOOTSTRAP

pytestmark = pytest.mark.anyio
KEY = "mlx:tiny:0"
MIB = 2**20
#: What the stand-in ``python`` does: write its argv as JSON, then exit before any readiness.
RECORDER = "import json, sys\nopen(sys.argv[0] + '.argv', 'w').write(json.dumps(sys.argv))\n"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EventStore]:
    opened = EventStore.open(tmp_path / "events.db", owner=True)
    try:
        yield opened
    finally:
        opened.close()


def recorder(folder: Path) -> Path:
    """An executable stand-in for MLX's Python: records its argv next to itself, exits 3."""
    program = folder / "python"
    program.write_text(f"#!{sys.executable}\n{RECORDER}raise SystemExit(3)\n")
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    return program


def recorded(program: Path) -> list[str]:
    """The argv the stand-in was run with."""
    return list(json.loads(Path(f"{program}.argv").read_text()))


async def test_the_wired_limit_is_the_priced_reservation_not_the_raw_estimate(
    tmp_path: Path, store: EventStore
) -> None:
    model = write_tiny_mlx(tmp_path / "tiny")
    adapter = MlxAdapter()
    ledger = HostLedger(
        store, OwnerIdentity.current("test"), lambda: compute_budget(HostMemory(64 * 2**30))
    )
    first = price_from_ledger(
        adapter,
        ledger,
        LaunchRequest(key=KEY, model=model, ctx=512, slots=1, kv_type=None),
    ).price
    assert first.reserved_bytes == first.estimated  # nothing learned yet
    # a launch of this model and build measured 512 MiB over its raw estimate (another shape)
    build = engine_build(adapter, LaunchSpec(KEY, model, 0, 256, kv_type="f16"))
    lesson = FootprintMeasured(
        engine_key=KEY,
        model="tiny",  # MLX keys learning by the folder's name (RD3)
        build=build,
        kv_type=first.plan.kv_type,
        ctx_total=64,
        slots=1,
        estimated=600 * MIB,
        measured=1112 * MIB,
        rss=1112 * MIB,
        gpu=0,
        buffers=0,
    )
    store.append(CALIBRATION_STREAM, [lesson], expected_version=None)
    priced = price_from_ledger(
        adapter,
        ledger,
        LaunchRequest(key=KEY, model=model, ctx=512, slots=1, kv_type=None),
    ).price
    assert priced.estimated == first.estimated  # the raw estimate did not move
    assert priced.reserved_bytes == priced.estimated + 512 * MIB  # learning corrected it

    python = recorder(tmp_path)
    specs: list[LaunchSpec] = []

    def spec(port: int) -> LaunchSpec:
        made = LaunchSpec(
            KEY,
            model,
            port,
            ctx_per_slot=priced.ctx_per_slot,
            slots=priced.slots,
            kv_type=priced.kv_type,
            work_dir=tmp_path / "work",
            binary=python,
        )
        specs.append(made)
        return made

    sup = Supervisor(
        KEY,
        adapter,
        spec,
        store,
        run_dir=tmp_path / "run",
        token_prefix="mlx-reserved",
        policy=SupervisorPolicy(watch_interval=0.05, idle_timeout=0),
        ledger=ledger,
        footprint=lambda: priced.reserved_bytes,  # what the daemon reserves (its price)
    )
    with pytest.raises(EngineStartError, match=r"exited \(exit code 3\) before becoming ready"):
        await sup.ensure_running()
    argv = recorded(python)
    assert argv[1:3] == ["-c", BOOTSTRAP]
    assert argv[3] == str(priced.reserved_bytes)  # the wired limit: the reservation, to the byte
    raw = adapter.estimate_footprint(adapter.read_geometry(model), specs[0])
    assert raw == priced.estimated != priced.reserved_bytes  # not the adapter's own figure
    assert specs[0].reserved_bytes is None  # the caller's spec: the supervisor filled it in


def test_build_command_takes_reserved_bytes_and_falls_back_to_its_estimate(
    tmp_path: Path,
) -> None:
    model = write_tiny_mlx(tmp_path / "tiny")
    adapter = MlxAdapter()
    bare = LaunchSpec(KEY, model, 9, ctx_per_slot=512)
    estimate = adapter.estimate_footprint(adapter.read_geometry(model), bare)
    assert adapter.build_command(bare).argv[3] == str(estimate)  # None: its own estimate
    reserved = LaunchSpec(KEY, model, 9, ctx_per_slot=512, reserved_bytes=estimate + 1)
    assert adapter.build_command(reserved).argv[3] == str(estimate + 1)
    nothing = LaunchSpec(KEY, model, 9, ctx_per_slot=512, reserved_bytes=0)
    assert adapter.build_command(nothing).argv[3] == "0"  # 0 reserved is a figure, not unset
