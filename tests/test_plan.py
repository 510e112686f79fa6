"""The launch plan / preview (behaviour L4–L8, NR6–NR8, IN9–IN12) and the CLI that shows it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from hostler import EventStore
from hostler.capacity.budget import CapacityBudget, HostMemory, compute_budget
from hostler.capacity.estimate import estimate_llama
from hostler.capacity.geometry import ModelGeometry
from hostler.capacity.gguf_header import read_geometry
from hostler.capacity.ledger import LedgerState, committed_other_for, limits_of, state_from
from hostler.capacity.plan import LaunchPlan, PlanRequest, default_kv_type, plan_llama
from hostler.capacity.units import GIB
from hostler.drivers.host_ledger import HostLedger, OwnerIdentity
from hostler.errors import UsageError
from hostler.events.ledger import LedgerReserved
from hostler_llamacpp.adapter import runtime_fixed_of
from hostler_llamacpp.binary import find_llama_server

from _support import run_cli

LLAMA_8B = ModelGeometry(
    architecture="llama",
    block_count=32,
    head_count=32,
    head_count_kv=8,
    embedding_length=4096,
    native_context=131072,
    file_size=int(4.9 * GIB),
)
RAM_32 = compute_budget(HostMemory(system_ram=32 * GIB))  # 19.2 GiB
#: A Gemma 3 4B's shape: f16 leaves it one slot on 19.2 GiB, q8_0 two (L5's trade).
GEMMA_4B = ModelGeometry(
    architecture="gemma3",
    block_count=34,
    head_count=8,
    head_count_kv=4,
    key_length=256,
    value_length=256,
    embedding_length=2560,
    native_context=131072,
    file_size=3 * GIB,
)


def plan(
    geometry: ModelGeometry = LLAMA_8B,
    budget: CapacityBudget = RAM_32,
    state: LedgerState | None = None,
    **request: Any,
) -> LaunchPlan:
    state = state or LedgerState()
    others = committed_other_for(state, "llamacpp", request.get("model", "m"))
    return plan_llama(
        PlanRequest(request.pop("model", "m"), **request),
        geometry,
        budget,
        limits_of(state, budget),
        committed_other=others,
    )


def test_default_plan_reserves_weights_plus_every_slot() -> None:
    p = plan()
    assert p.admitted
    assert p.kv_type == "q8_0"
    assert p.context_window >= 65536
    assert p.planned_bytes == p.weights_bytes + p.kv.at(p.context_window)
    assert p.reserved_bytes == p.weights_bytes + p.slots * p.kv.at(p.context_window)
    assert p.reserved_bytes <= RAM_32.budget
    assert p.total_ctx == p.context_window * p.slots


def test_gemma_keeps_f16_kv() -> None:
    assert default_kv_type(ModelGeometry(architecture="gemma3"), "x") == "f16"
    assert default_kv_type(ModelGeometry(architecture="llama"), "my-gemma-finetune") == "f16"
    assert default_kv_type(ModelGeometry(architecture="qwen3"), "qwen") == "q8_0"


def test_paging_incident_is_denied_not_launched_short() -> None:
    """IN12: a 12B at f16 KV (~380 KB/token) at a 64K minimum on a 32 GB machine."""
    gemma12 = ModelGeometry(
        architecture="gemma3",
        block_count=48,
        head_count=16,
        head_count_kv=8,
        key_length=256,
        value_length=256,
        embedding_length=3840,
        native_context=131072,
        file_size=8 * GIB,
    )
    p = plan(gemma12, policy="model-max")
    assert not p.admitted
    assert "needs" in p.denial and "GiB" in p.denial
    assert any("one slot could hold" in r for r in p.reasons)


def test_own_replicas_are_not_counted_against_the_preview() -> None:
    """IN9 / NR6."""
    state = state_from(
        [
            LedgerReserved("llamacpp:m:0", 12 * GIB, "d", 0, 0, 0, 0, True),
            LedgerReserved("llamacpp:m:1", 12 * GIB, "d", 0, 0, 0, 0, True),
            LedgerReserved("llamacpp:other:0", 2 * GIB, "d", 0, 0, 0, 0, True),
            LedgerReserved("garbage-key", 1 * GIB, "d", 0, 0, 0, 0, True),
        ]
    )
    assert committed_other_for(state, "llamacpp", "m") == 3 * GIB
    p = plan(state=state, model="m")
    assert p.committed_other == 3 * GIB
    assert p.admitted


def test_override_reports_the_automatic_window_too() -> None:
    p = plan(ctx=16384, ctx_is_model_override=True, slots=2)
    assert (p.context_window, p.slots, p.applied_override) == (16384, 2, 16384)
    assert p.auto_window is not None and p.auto_window >= 65536


def test_a_plan_of_1024_slots_is_quick_and_1025_refused() -> None:
    """The slot ladder (C6) walks down from the count asked: bounded by MAX_SLOTS."""
    started = time.perf_counter()
    p = plan(slots=1024, ctx=8192)
    assert time.perf_counter() - started < 2
    assert 1 <= p.slots <= 1024
    with pytest.raises(UsageError, match="slots: 1025 is more than the 1024"):
        plan(slots=1025)


def test_heuristic_when_the_header_lacks_geometry() -> None:
    p = plan(ModelGeometry(architecture="mystery", native_context=32768, file_size=2 * GIB))
    assert not p.exact_geometry
    assert any("heuristic" in r for r in p.reasons)


def _write_model(path: Path) -> Path:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(32)
    writer.add_context_length(131072)
    writer.add_embedding_length(4096)
    writer.add_head_count(32)
    writer.add_head_count_kv(8)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_preview_cli(tmp_path: Path) -> None:
    model = _write_model(tmp_path / "llama8b.gguf")
    ledger = tmp_path / "ledger.db"
    result = run_cli(
        "preview",
        str(model),
        "--ledger",
        str(ledger),
        "--json",
        "--ctx",
        "8192",
        "--slots",
        "2",
        "--kv",
        "f16",
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["context_window"] == 8192
    assert data["slots"] == 2
    assert data["kv_type"] == "f16"
    assert data["kv_per_token_per_slot"] == 131072
    # the one price: the footprint estimate at peak for exactly this launch (nothing learned)
    fixed = runtime_fixed_of(find_llama_server())  # the build the CLI prices for
    expected = estimate_llama(
        read_geometry(model),
        ctx_total=16384,
        slots=2,
        kv_type="f16",
        runtime_fixed=fixed,
        embeddings=True,  # L21: every llama.cpp launch serves /v1/embeddings too
    )
    assert expected.kv == 2 * 8192 * 131072
    assert data["reserved_bytes"] == data["estimated_bytes"] == expected.peak
    assert not data["learned"]
    assert not ledger.exists()  # a preview never creates or binds anything
    text = run_cli("preview", str(model), "--ledger", str(ledger))
    assert text.returncode == 0
    assert "plan     fits" in text.stdout and "why" in text.stdout


def test_preview_cli_counts_other_holders_and_denies(tmp_path: Path) -> None:
    model = _write_model(tmp_path / "llama8b.gguf")
    ledger_path = tmp_path / "ledger.db"
    with EventStore.open(ledger_path) as store:
        # Granted against a huge host, so that on this (real, smaller) host it fills everything.
        huge = compute_budget(HostMemory(system_ram=4096 * GIB, apple_silicon=True))
        ledger = HostLedger(store, OwnerIdentity.current("t"), lambda: huge)
        assert ledger.reserve("llamacpp:big:0", 1024 * GIB).granted
    result = run_cli("preview", str(model), "--ledger", str(ledger_path))
    assert result.returncode == 3
    assert "DOES NOT FIT" in result.stdout
    assert "others   1024.0 GiB held by other models" in result.stdout
    assert "denied" in result.stdout
    alone = run_cli("preview", str(model), "--ledger", str(ledger_path), "--standalone")
    assert alone.returncode == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("preview", "/nonexistent/x.gguf"), "no such model file"),
        (("preview", "/dev/null"), "/dev/null: is a character device, not a model file"),
        (("preview", "/dev/null", "--ctx", "0"), "--ctx: 0 is out of range"),
    ],
)
def test_preview_cli_errors_are_one_line(args: tuple[str, ...], message: str) -> None:
    result = run_cli(*args)
    assert result.returncode == (2 if "--ctx" in args else 1)  # usage 2, a bad model file 1
    assert result.stderr.count("\n") == 1
    assert message in result.stderr


def test_budget_cli(tmp_path: Path) -> None:
    ledger_path = tmp_path / "ledger.db"
    with EventStore.open(ledger_path) as store:
        budget = compute_budget(HostMemory(system_ram=64 * GIB))
        HostLedger(store, OwnerIdentity.current("me"), lambda: budget).reserve(
            "llamacpp:a:0", 2 * GIB
        )
    result = run_cli("budget", "--ledger", str(ledger_path))
    assert result.returncode == 0, result.stderr
    assert "budget" in result.stdout
    assert "llamacpp:a:0" in result.stdout
    assert "owner gone" not in result.stdout  # the owner is this (live) test process
    data = json.loads(run_cli("budget", "--ledger", str(ledger_path), "--json").stdout)
    assert data["by_key"][0]["key"] == "llamacpp:a:0"
    assert data["by_key"][0]["bytes"] == 2 * GIB


def test_gemma_trades_f16_for_q8_when_that_buys_a_second_slot() -> None:
    gemma = GEMMA_4B
    host = compute_budget(HostMemory(system_ram=32 * GIB))  # 19.2 GiB: tier 2
    p = plan(gemma, host)
    assert p.kv_type == "q8_0"
    assert any("KV f16 → q8_0" in r for r in p.reasons)
    pinned = plan(gemma, host, slots=1)
    assert pinned.kv_type == "f16"  # an explicit slot count keeps Gemma's f16
    explicit = plan(gemma, host, kv_type="f16")
    assert explicit.kv_type == "f16"


def test_an_engines_slot_limit_caps_the_automatic_plan_at_its_edges() -> None:
    """S8: the tier (2 slots on 19.2 GiB) capped by the engine's own limit; asked above, refused."""
    assert plan(LLAMA_8B).slots == 2  # the tier, no limit
    assert plan(LLAMA_8B, max_slots=1).slots == 1  # capped
    assert plan(LLAMA_8B, max_slots=2).slots == 2  # the limit equal to the tier
    assert plan(LLAMA_8B, max_slots=3).slots == 2  # a limit above the tier changes nothing
    assert plan(LLAMA_8B, slots=1, max_slots=1).slots == 1  # asked exactly the limit
    assert plan(LLAMA_8B, slots=2, max_slots=2).slots == 2
    with pytest.raises(UsageError) as caught:
        plan(LLAMA_8B, slots=2, max_slots=1, engine="ds4")
    assert caught.value.message == (
        "slots: 2 is more than engine 'ds4' serves at once (at most 1); set slots to 1 or fewer"
    )


def test_an_engines_own_kv_types_bound_the_choice_and_the_gemma_trade() -> None:
    """S9: L5's choice stands only among the engine's types; its first is the default."""
    gemma = GEMMA_4B
    host = compute_budget(HostMemory(system_ram=32 * GIB))  # tier 2: Gemma trades for q8_0
    assert plan(LLAMA_8B).kv_type == "q8_0"  # no types declared: L5's default
    only_f16 = plan(LLAMA_8B, kv_types=("f16",), engine="mlx")
    assert only_f16.kv_type == "f16"
    assert "KV f16: engine 'mlx' supports f16 only" in only_f16.reasons
    # sized at f16: half the bytes per token of q8_0 buy a smaller window or fewer slots
    assert only_f16.kv.per_token > plan(LLAMA_8B).kv.per_token
    assert plan(LLAMA_8B, kv_types=("f16", "q8_0")).kv_type == "q8_0"  # L5's, supported
    assert plan(LLAMA_8B, kv_types=("q4_0", "f16")).kv_type == "q4_0"  # the engine's first
    assert plan(gemma, host, kv_types=("f16", "q8_0")).kv_type == "q8_0"  # the trade, allowed
    no_trade = plan(gemma, host, kv_types=("f16",))
    assert no_trade.kv_type == "f16"
    assert not any("→ q8_0" in r for r in no_trade.reasons)
    assert plan(LLAMA_8B, kv_types=("f16",), kv_type="f16").kv_type == "f16"  # asked, supported
    with pytest.raises(UsageError) as caught:
        plan(LLAMA_8B, kv_types=("f16",), kv_type="q8_0", engine="mlx")
    assert caught.value.message == (
        "kv_type 'q8_0': engine 'mlx' supports f16 only; set one of them or leave kv_type unset"
    )


def test_a_launch_that_cannot_fit_beside_the_others_keeps_its_slots_for_making_room() -> None:
    """Found by bench/control_plane.py: a swap launched B with ``--parallel 1``, not its 16.

    Planned while A was still resident, B's minimum window did not fit even at one slot, so the
    ladder had shed its slots to 1; making room then evicted A, and B started with the shed
    plan. A launch that needs room made is priced as asked (C6: at the minimum window), its
    slot count kept: what making room frees is for the launch the operator configured.
    """
    crowded = state_from([LedgerReserved("llamacpp:a:0", 17 * GIB, "d", 0, 0, 0, 0, True)])
    for slots in (16, 2):  # configured (a tier's count is still capped beside the others)
        p = plan(state=crowded, model="b", slots=slots)
        alone = plan(model="b", slots=slots)
        assert not p.admitted and alone.admitted  # room must be made; alone it fits
        assert p.slots == alone.slots == 2  # 16 shed to the 2 that fit alone, never to 1
        assert p.context_window == 65536  # priced at the minimum window (C6)
        assert p.reserved_bytes == p.weights_bytes + 2 * p.kv.at(65536)
