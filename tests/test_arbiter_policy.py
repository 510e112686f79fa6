"""The GPU arbiter's pure rules (GA2–GA4, GA6, GA7): edges pinned by value."""

from __future__ import annotations

import math

import pytest

from hostler.policies.arbiter import (
    POLICY_NAME,
    POLICY_VERSION,
    SLOTS,
    STALE_LEASE_CEILING,
    HeldLease,
    Pressure,
    acquire_waits,
    gpu_pressure,
    lease_verdict,
    recheck_interval,
    resolve_policy,
)

GIB = 1024**3
MIB = 1024**2
NOW = 50_000.0


def test_constants_by_value() -> None:
    assert SLOTS == ("llm", "image", "video")
    assert STALE_LEASE_CEILING == 5400.0
    assert (POLICY_NAME, POLICY_VERSION) == ("gpu-arbiter", 1)


@pytest.mark.parametrize(
    ("text", "mode"),
    [
        ("swap", "swap"),
        (" SWAP ", "swap"),
        ("coexist", "coexist"),
        ("auto", "coexist"),
        (None, "coexist"),
        ("", "coexist"),
    ],
)
def test_policy_resolution(text: str | None, mode: str) -> None:
    assert resolve_policy(text) == mode


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(
        ValueError, match="'exclusive' is not a GPU policy: use swap, coexist or auto"
    ):
        resolve_policy("exclusive")


def test_recheck_interval() -> None:
    assert recheck_interval() == 60.0
    assert recheck_interval(30.0) == 30.0
    assert recheck_interval(60.0) == 60.0
    assert recheck_interval(-1.0) == 0.0


def test_plain_acquire_waits_only_for_another_slots_lease_in_swap_mode() -> None:
    image = HeldLease("image", NOW)
    assert acquire_waits("llm", image, "swap") is True
    assert acquire_waits("image", image, "swap") is False
    assert acquire_waits("llm", None, "swap") is False
    assert acquire_waits("llm", image, "coexist") is False


def test_a_free_card_is_taken_and_coexist_never_holds() -> None:
    assert lease_verdict("image", None, "swap", NOW).action == "take"
    assert lease_verdict("image", HeldLease("llm", NOW), "coexist", NOW).action == "free"


@pytest.mark.parametrize(
    ("held_for", "action"),
    [(0.0, "wait"), (5399.999, "wait"), (5400.0, "wait"), (5400.001, "break"), (-30.0, "wait")],
)
def test_any_lease_blocks_until_it_is_a_leak(held_for: float, action: str) -> None:
    verdict = lease_verdict("image", HeldLease("image", NOW - held_for), "swap", NOW)
    assert verdict.action == action
    assert verdict.decision == {
        "policy": "gpu-arbiter",
        "version": 1,
        "rule": "GA4" if action == "break" else "GA3",
        "slot": "image",
        "mode": "swap",
        "held_by": "image",
        "held_for": round(max(held_for, 0.0), 3),
        "ceiling": 5400.0,
    }


def test_a_custom_ceiling_and_the_decision_of_a_take() -> None:
    lease = HeldLease("video", NOW - 61)
    assert lease_verdict("llm", lease, "swap", NOW, ceiling=60).action == "break"
    assert lease_verdict("llm", lease, "swap", NOW, ceiling=61).action == "wait"
    taken = lease_verdict("llm", None, "coexist", NOW)
    assert taken.decision["held_by"] is None and taken.decision["held_for"] is None
    assert taken.decision["rule"] == "GA3"
    assert (
        lease_verdict("llm", HeldLease("video", NOW - 1.23456), "swap", NOW).decision["held_for"]
        == 1.235
    )


def test_pressure_is_free_at_or_below_the_larger_of_1_gib_and_8_percent() -> None:
    small = 8 * 1024  # an 8 GiB card: the 1 GiB floor binds (8 % is 655 MiB)
    assert gpu_pressure([(small, small - 1024)]) == Pressure(8 * GIB, 7 * GIB, GIB, True)
    assert gpu_pressure([(small, small - 1025)]).pressured is False
    big = 100 * 1024  # 100 GiB: 8 % (8 GiB) binds
    assert gpu_pressure([(big, big - 8 * 1024)]).pressured is True
    assert gpu_pressure([(big, big - 8 * 1024 - 1)]).pressured is False


def test_pressure_sums_cards_and_drops_nonsense_readings() -> None:
    readings = [
        (8192.0, 1024.0),
        (8192.0, 8192.0),
        (math.nan, 10.0),
        (0.0, 512.0),  # no card's total, so its used figure is not counted either
        (0.5, 0.0),  # a tiny card is still a card
        (-5.0, 0.0),
        (4096.0, -1.0),
        (4096.0, math.inf),
        (math.inf, 1.0),
    ]
    status = gpu_pressure(readings)
    assert status == Pressure(16 * GIB + MIB // 2, 9 * GIB, 7 * GIB + MIB // 2, False)


def test_no_readings_and_overfull_cards() -> None:
    assert gpu_pressure([]) == Pressure(0, 0, 0, False)
    assert gpu_pressure([(0.0, 0.0)]) == Pressure(0, 0, 0, False)
    assert gpu_pressure([(1024.0, 2048.0)]) == Pressure(GIB, 2 * GIB, 0, True)
    assert gpu_pressure([(1024.0, 0.0)]).pressured is True  # 1 GiB free is at the floor
