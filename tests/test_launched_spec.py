"""``engine.spawned`` v3 records what a launch was made with; an adopter rebuilds its spec."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hostler.engines.launched import spec_from_record, spec_record
from hostler.events.base import decode
from hostler.machines.engine import EngineSpawned
from hostler.plugin import LaunchSpec

KEY = "llamacpp:m:0"
SPEC = LaunchSpec(
    KEY,
    Path("/models/m.gguf"),
    4321,
    ctx_per_slot=2048,
    slots=2,
    kv_type="q8_0",
    work_dir=Path("/data/run/llamacpp_m_0/work"),
    extra_args={"flash-attn": True, "threads": 4},
    options={"cache_reuse": 256},
    binary=Path("/opt/llama-server"),
    reserved_bytes=123_456,
)


def test_a_launch_record_gives_the_same_spec_back_on_the_adopted_port() -> None:
    record = spec_record(SPEC)
    adopted = LaunchSpec(**{**_fields(SPEC), "adopted": True})
    assert spec_from_record(KEY, 4321, record) == adopted
    assert spec_from_record(KEY, 5555, record) == LaunchSpec(**{**_fields(adopted), "port": 5555})
    bare = spec_record(LaunchSpec(KEY, Path("/m"), 1, ctx_per_slot=512))
    assert spec_from_record(KEY, 1, bare) == LaunchSpec(
        KEY, Path("/m"), 1, ctx_per_slot=512, adopted=True
    )


def _fields(spec: LaunchSpec) -> dict[str, Any]:
    return {name: getattr(spec, name) for name in LaunchSpec.__dataclass_fields__}


@pytest.mark.parametrize(
    "change",
    [
        {"model": ""},
        {"model": "/m\0x"},
        {"model": 5},
        {"ctx_per_slot": 0},
        {"ctx_per_slot": True},
        {"ctx_per_slot": 10**30},
        {"slots": "2"},
        {"kv_type": 8},
        {"work_dir": ""},
        {"extra_args": {"a": [1]}},
        {"options": ["x"]},
        {"reserved_bytes": -1},
    ],
)
def test_a_record_that_does_not_fit_gives_no_spec(change: dict[str, object]) -> None:
    assert spec_from_record(KEY, 1, {**spec_record(SPEC), **change}) is None


def test_no_record_gives_no_spec_and_an_older_spawn_reads_none() -> None:
    assert spec_from_record(KEY, 1, None) is None
    assert spec_from_record(KEY, 1, "junk") is None
    v2 = {
        "from_state": "starting",
        "to_state": "starting",
        "at": 1.0,
        "pid": 10,
        "create_time": 2.0,
        "boot_id": "b",
        "launch_token": "t",
        "argv_fingerprint": "f",
        "port": 4321,
        "since_boot": 3.0,
    }
    old = decode("engine.spawned", 2, v2)
    assert isinstance(old, EngineSpawned) and old.launched is None
    assert EngineSpawned.SCHEMA_VERSION == 3
