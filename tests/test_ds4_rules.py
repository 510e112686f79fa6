"""ds4's pure launch and pricing rules (D2, D5–D8, D10, SV10a): constants by value, every edge."""

from __future__ import annotations

import pytest

from hostler_ds4 import rules
from hostler_ds4.rules import (
    ExpertCache,
    Residency,
    ResidentLine,
    cache_fallback_gib,
    exited_before_ready,
    expert_cache,
    footprint,
    kv_disk_mb,
    launch_context,
    ram_tier,
    residency,
    resident_line,
)

GIB = 1024**3


def test_constants_by_value() -> None:
    assert rules.GIB == 1_073_741_824
    assert rules.HIGH_RAM_TIER == 262_144
    assert rules.LOW_RAM_TIER == 131_072
    assert rules.HIGH_RAM_TIER_AT == 192 * GIB
    assert rules.NO_STREAMING_HEADROOM == 32 * GIB
    assert rules.FULL_RESIDENCY_FLOOR == 96 * GIB
    assert rules.SAFE_CACHE_HEADROOM == 32 * GIB
    assert rules.STREAMED_FALLBACK_CAP == 48 * GIB
    assert rules.DEFAULT_KV_DISK_MB == 16_384


# -- D5: the launch context -------------------------------------------------------------------


def test_ram_tier_switches_at_exactly_192_gib() -> None:
    assert ram_tier(192 * GIB) == 262_144
    assert ram_tier(192 * GIB - 1) == 131_072
    assert ram_tier(0) == 131_072
    assert ram_tier(512 * GIB) == 262_144


def test_launch_context_defaults_to_the_ram_tier_above_the_floor() -> None:
    assert launch_context(128 * GIB, floor=65_536) == 131_072
    assert launch_context(256 * GIB, floor=65_536) == 262_144
    # a floor above the tier lifts it
    assert launch_context(128 * GIB, floor=200_000) == 200_000


def test_launch_context_caps_the_tier_by_the_catalog_max() -> None:
    assert launch_context(256 * GIB, floor=65_536, catalog_max=100_000) == 100_000
    assert launch_context(256 * GIB, floor=65_536, catalog_max=262_144) == 262_144
    assert launch_context(256 * GIB, floor=65_536, catalog_max=262_145) == 262_144


def test_a_catalog_max_below_the_floor_wins_and_equality_does_not() -> None:
    assert launch_context(256 * GIB, floor=65_536, catalog_max=32_768) == 32_768
    assert launch_context(256 * GIB, floor=65_536, catalog_max=65_535) == 65_535
    assert launch_context(256 * GIB, floor=65_536, catalog_max=65_536) == 65_536
    # even over a configured window
    assert launch_context(256 * GIB, floor=65_536, configured=200_000, catalog_max=40_000) == 40_000


def test_a_configured_window_is_not_capped_by_the_catalog_but_keeps_the_floor() -> None:
    assert launch_context(64 * GIB, floor=65_536, configured=300_000, catalog_max=100_000) == (
        300_000
    )
    assert launch_context(64 * GIB, floor=65_536, configured=16_384) == 65_536
    assert launch_context(64 * GIB, floor=65_536, configured=65_536) == 65_536
    assert launch_context(64 * GIB, floor=65_536, configured=65_537) == 65_537


def test_a_model_override_below_the_floor_lowers_it() -> None:
    assert launch_context(64 * GIB, floor=65_536, override=16_384) == 16_384
    assert launch_context(64 * GIB, floor=65_536, override=16_384, configured=200_000) == 16_384
    assert launch_context(64 * GIB, floor=65_536, override=100_000) == 100_000
    # a catalog max under the lowered floor still wins; at or above it, the override stands
    assert launch_context(64 * GIB, floor=65_536, override=16_384, catalog_max=8_192) == 8_192
    assert launch_context(64 * GIB, floor=65_536, override=16_384, catalog_max=16_384) == 16_384


@pytest.mark.parametrize("name", ["floor", "configured", "override", "catalog_max"])
@pytest.mark.parametrize("bad", [0, -1])
def test_launch_context_refuses_windows_of_zero_or_less(name: str, bad: int) -> None:
    kwargs: dict[str, int] = {"floor": 65_536, name: bad}
    with pytest.raises(ValueError, match=f"{name} window must be a positive"):
        launch_context(64 * GIB, **kwargs)


def test_launch_context_takes_one_token() -> None:
    assert launch_context(64 * GIB, floor=1, override=1) == 1


# -- D6: the resident line ----------------------------------------------------------------------


def test_resident_line_needs_all_three_figures() -> None:
    assert resident_line(None, 10, 100) is None
    assert resident_line(1000, None, 100) is None
    assert resident_line(1000, 10, None) is None
    assert resident_line(0, 0, 0) == ResidentLine(0, 0)


def test_resident_line_rebases_to_any_context() -> None:
    line = resident_line(10 * GIB, 1024, 65_536)
    assert line == ResidentLine(10 * GIB - 1024 * 65_536, 1024)
    assert line is not None
    assert line.at(65_536) == 10 * GIB
    assert line.at(131_072) == 10 * GIB + 1024 * 65_536
    assert line.at(0) == 10 * GIB - 1024 * 65_536


def test_resident_line_context_free_part_is_never_negative() -> None:
    assert resident_line(100, 10, 11) == ResidentLine(0, 10)
    assert resident_line(100, 10, 10) == ResidentLine(0, 10)
    assert resident_line(100, 10, 9) == ResidentLine(10, 10)


# -- D7: residency -------------------------------------------------------------------------------


def test_streaming_is_the_default_everywhere() -> None:
    for machine in ("arm64", "x86_64"):
        assert residency(
            want_streaming=True, machine=machine, model_size=1, system_ram=512 * GIB
        ) == (Residency.STREAMING)


def test_no_streaming_is_honoured_only_on_arm64_when_size_plus_32_gib_fits() -> None:
    ram = 128 * GIB
    fits = ram - 32 * GIB
    assert residency(want_streaming=False, machine="arm64", model_size=fits, system_ram=ram) == (
        Residency.FULL
    )
    assert residency(want_streaming=False, machine="aarch64", model_size=fits, system_ram=ram) == (
        Residency.FULL
    )
    assert residency(want_streaming=False, machine="ARM64", model_size=fits, system_ram=ram) == (
        Residency.FULL
    )
    assert (
        residency(want_streaming=False, machine="arm64", model_size=fits + 1, system_ram=ram)
        == Residency.STREAMING
    )
    assert (
        residency(want_streaming=False, machine="x86_64", model_size=1, system_ram=ram)
        == Residency.STREAMING
    )
    assert (
        residency(want_streaming=False, machine="arm64", model_size=None, system_ram=ram)
        == Residency.STREAMING
    )
    assert (
        residency(want_streaming=False, machine="arm64", model_size=-1, system_ram=ram)
        == Residency.STREAMING
    )
    assert (
        residency(want_streaming=False, machine="arm64", model_size=0, system_ram=32 * GIB)
        == Residency.FULL
    )


def test_in36_a_153_gb_model_on_a_128_gib_mac_streams() -> None:
    assert (
        residency(
            want_streaming=False, machine="arm64", model_size=153 * 10**9, system_ram=128 * GIB
        )
        == Residency.STREAMING
    )


# -- D8: the expert cache ---------------------------------------------------------------------


def test_cache_fallback_by_ram_at_its_edges() -> None:
    assert cache_fallback_gib(120 * GIB) == 64
    assert cache_fallback_gib(120 * GIB - 1) == 48
    assert cache_fallback_gib(88 * GIB) == 48
    assert cache_fallback_gib(88 * GIB - 1) == 32
    assert cache_fallback_gib(0) == 32


def test_expert_cache_request_order_configured_then_catalog_then_fallback() -> None:
    ram = 512 * GIB
    assert expert_cache(ram).requested_gib == 64
    assert expert_cache(ram, catalog_cache=20 * GIB, catalog_resident=40 * GIB).requested_gib == 20
    assert expert_cache(ram, catalog_cache=20 * GIB + GIB - 1).requested_gib == 20
    assert (
        expert_cache(ram, configured_gib=7, catalog_cache=20 * GIB, catalog_resident=40 * GIB).gib
        == 7
    )


def test_expert_cache_is_clamped_to_what_is_safe() -> None:
    # safe = floor((128 - fixed 20 - 32) GiB / GiB) = 76
    plan = expert_cache(
        128 * GIB, configured_gib=100, catalog_resident=30 * GIB, catalog_cache=10 * GIB
    )
    assert plan == ExpertCache(gib=76, requested_gib=100, safe_gib=76, clamped=True, unsafe=False)
    at = expert_cache(
        128 * GIB, configured_gib=76, catalog_resident=30 * GIB, catalog_cache=10 * GIB
    )
    assert at == ExpertCache(76, 76, 76, clamped=False, unsafe=False)
    below = expert_cache(
        128 * GIB, configured_gib=75, catalog_resident=30 * GIB, catalog_cache=10 * GIB
    )
    assert below == ExpertCache(75, 75, 76, clamped=False, unsafe=False)


def test_expert_cache_fixed_part_needs_both_catalog_figures_and_is_never_negative() -> None:
    assert expert_cache(64 * GIB, catalog_resident=40 * GIB).safe_gib == 32
    assert expert_cache(64 * GIB, catalog_cache=40 * GIB).safe_gib == 32
    assert expert_cache(64 * GIB, catalog_resident=10 * GIB, catalog_cache=40 * GIB).safe_gib == 32
    assert expert_cache(64 * GIB, catalog_resident=41 * GIB, catalog_cache=40 * GIB).safe_gib == 31


def test_expert_cache_unsafe_below_one_safe_gib_and_safe_at_exactly_one() -> None:
    assert expert_cache(33 * GIB - 1) == ExpertCache(1, 32, 0, clamped=False, unsafe=True)
    assert expert_cache(32 * GIB) == ExpertCache(1, 32, 0, clamped=False, unsafe=True)
    assert expert_cache(16 * GIB).unsafe
    assert expert_cache(16 * GIB).safe_gib == -16
    assert expert_cache(33 * GIB) == ExpertCache(1, 32, 1, clamped=True, unsafe=False)


@pytest.mark.parametrize("bad", [0, -3])
def test_expert_cache_refuses_a_setting_below_one_gib(bad: int) -> None:
    with pytest.raises(ValueError, match="at least 1 GiB"):
        expert_cache(128 * GIB, configured_gib=bad)


def test_expert_cache_of_one_gib_is_allowed() -> None:
    assert expert_cache(128 * GIB, configured_gib=1).gib == 1


# -- the footprint (ER5, D6, D7, D10) ------------------------------------------------------


def test_footprint_streaming_without_catalog_is_size_capped_at_48_gib() -> None:
    stream = Residency.STREAMING
    assert footprint(stream, launch_ctx=131_072, model_size=10 * GIB) == 10 * GIB
    assert footprint(stream, launch_ctx=131_072, model_size=48 * GIB) == 48 * GIB
    assert footprint(stream, launch_ctx=131_072, model_size=48 * GIB + 1) == 48 * GIB
    assert footprint(stream, launch_ctx=131_072, model_size=0) == 0


def test_footprint_uses_the_line_at_the_launch_context_then_the_catalog_figure() -> None:
    line = ResidentLine(context_free=20 * GIB, per_token=4096)
    stream = Residency.STREAMING
    assert footprint(stream, launch_ctx=131_072, model_size=150 * GIB, line=line) == (
        20 * GIB + 4096 * 131_072
    )
    assert footprint(stream, launch_ctx=1, model_size=150 * GIB, catalog_resident=30 * GIB) == (
        30 * GIB
    )
    # the line beats the catalog figure
    assert (
        footprint(stream, launch_ctx=0, model_size=150 * GIB, line=line, catalog_resident=30 * GIB)
        == 20 * GIB
    )


def test_full_residency_reserves_at_least_96_gib_and_its_whole_file() -> None:
    full = Residency.FULL
    assert footprint(full, launch_ctx=65_536, model_size=10 * GIB) == 96 * GIB
    assert footprint(full, launch_ctx=65_536, model_size=96 * GIB) == 96 * GIB
    assert footprint(full, launch_ctx=65_536, model_size=96 * GIB + 1) == 96 * GIB + 1
    # the whole file, not D10's 48 GiB cap: nothing streams
    assert footprint(full, launch_ctx=65_536, model_size=120 * GIB) == 120 * GIB
    assert footprint(full, launch_ctx=0, model_size=1, catalog_resident=100 * GIB) == 100 * GIB
    line = ResidentLine(90 * GIB, 1)
    assert footprint(full, launch_ctx=8 * GIB, model_size=1, line=line) == 98 * GIB
    assert footprint(full, launch_ctx=6 * GIB, model_size=1, line=line) == 96 * GIB


# -- D2 / IN37: the disk KV budget ------------------------------------------------------------


def test_kv_disk_budget_defaults_to_16_gib_and_refuses_zero_or_less() -> None:
    assert kv_disk_mb(None) == 16_384
    assert kv_disk_mb(1) == 1
    assert kv_disk_mb(4096) == 4096
    for bad in (0, -1):
        with pytest.raises(ValueError, match="positive number of MiB"):
            kv_disk_mb(bad)


# -- SV10a ----------------------------------------------------------------------------------


def test_exited_before_ready_reads_the_supervisors_message_and_the_lock_line() -> None:
    assert exited_before_ready("ds4:m:0: exited (exit code 1) before becoming ready: x")
    assert exited_before_ready(
        "ds4:m:0: ds4-server: error: another ds4-server instance is running (pid 7 holds x)"
    )
    assert exited_before_ready("held by the single-instance lock")
    assert exited_before_ready("Another Instance")
    assert not exited_before_ready("ds4:m:0: did not become ready within 600 s")
    assert not exited_before_ready("ds4:m:0: CUDA error: out of memory")


# -- edges the mutation run asked for -------------------------------------------------------


def test_a_catalog_max_equal_to_the_floor_does_not_override_a_configured_window() -> None:
    assert launch_context(64 * GIB, floor=65_536, configured=200_000, catalog_max=65_536) == (
        200_000
    )
    assert launch_context(64 * GIB, floor=65_536, configured=200_000, catalog_max=65_535) == (
        65_535
    )


def test_a_catalog_cache_under_one_gib_still_gets_one() -> None:
    plan = expert_cache(128 * GIB, catalog_cache=GIB - 1)
    assert plan.requested_gib == 0
    assert plan.gib == 1
    assert not plan.clamped


def test_a_cache_larger_than_the_resident_figure_leaves_no_fixed_part_not_a_negative_one() -> None:
    # a fixed part of -1 byte would make 33 GiB - 1 byte of RAM look like one safe GiB
    plan = expert_cache(33 * GIB - 1, catalog_resident=10 * GIB, catalog_cache=40 * GIB)
    assert plan.safe_gib == 0
    assert plan.unsafe


def test_a_negative_catalog_figure_prices_a_stream_at_nothing() -> None:
    stream = Residency.STREAMING
    assert footprint(stream, launch_ctx=1, model_size=GIB, catalog_resident=-5) == 0
    assert footprint(stream, launch_ctx=1, model_size=GIB, line=ResidentLine(0, -1)) == 0
