"""The request queue's first pure rules (Q1, Q5, Q6): edges pinned by value."""

from __future__ import annotations

import pytest

from hostler.policies.queue import (
    AMBIENT_QUIET,
    LaneCaps,
    ambient_gate_open,
    has_capacity,
    lane_caps,
)


def test_constants_by_value() -> None:
    assert AMBIENT_QUIET == 180.0


def test_caps_default_to_the_width_and_are_clamped() -> None:
    assert lane_caps(4) == LaneCaps(4, 4, 4)
    assert lane_caps(4, interactive=2, background=3) == LaneCaps(4, 2, 3)
    assert lane_caps(4, interactive=0, background=9) == LaneCaps(4, 1, 4)
    assert lane_caps(4, interactive=-3, background=4) == LaneCaps(4, 1, 4)
    assert lane_caps(1, interactive=1, background=1) == LaneCaps(1, 1, 1)


@pytest.mark.parametrize("width", [0, -1])
def test_a_queue_that_can_run_nothing_is_refused(width: int) -> None:
    with pytest.raises(ValueError, match=f"a queue's width must be at least 1, not {width}"):
        lane_caps(width)


def test_capacity_is_under_both_the_width_and_the_lane_cap() -> None:
    assert has_capacity(running=1, lane_running=1, lane_cap=2, width=4) is True
    assert has_capacity(running=3, lane_running=0, lane_cap=4, width=4) is True
    assert has_capacity(running=4, lane_running=0, lane_cap=4, width=4) is False  # width full
    assert has_capacity(running=2, lane_running=2, lane_cap=2, width=4) is False  # lane full
    assert has_capacity(running=2, lane_running=1, lane_cap=2, width=4, extra=1) is False
    assert has_capacity(running=2, lane_running=0, lane_cap=4, width=4, extra=1) is True
    assert has_capacity(running=3, lane_running=0, lane_cap=4, width=4, extra=1) is False


CAPS = LaneCaps(4, 4, 3)


def gate(**kw: float) -> bool:
    values = {
        "running": 0,
        "non_ambient_running": 0,
        "non_ambient_pending": 0,
        "quiet_for": 0.0,
        **kw,
    }
    return ambient_gate_open(caps=CAPS, **values)  # type: ignore[arg-type]


def test_spare_capacity_keeps_one_interactive_slot_free() -> None:
    # interactive cap 4: ambient may run while fewer than 3 run, whatever else happens
    assert gate(running=2, non_ambient_running=2, non_ambient_pending=5) is True
    assert gate(running=3, non_ambient_running=3) is False


def test_a_one_wide_engine_gives_ambient_work_only_quiet_time() -> None:
    one = LaneCaps(1, 1, 1)
    assert (
        ambient_gate_open(
            caps=one, running=0, non_ambient_running=0, non_ambient_pending=0, quiet_for=179.999
        )
        is False
    )
    assert (
        ambient_gate_open(
            caps=one, running=0, non_ambient_running=0, non_ambient_pending=0, quiet_for=180.0
        )
        is True
    )
    two = LaneCaps(2, 2, 2)  # spare of 1: open only while nothing runs
    assert (
        ambient_gate_open(
            caps=two, running=0, non_ambient_running=0, non_ambient_pending=1, quiet_for=0
        )
        is True
    )
    assert (
        ambient_gate_open(
            caps=two, running=1, non_ambient_running=0, non_ambient_pending=0, quiet_for=0
        )
        is False
    )


def test_quiet_means_nothing_else_running_or_waiting_for_the_whole_window() -> None:
    busy = {"running": 3, "quiet_for": 500.0}
    assert gate(**busy) is True
    assert gate(**busy, non_ambient_running=1) is False
    assert gate(**busy, non_ambient_pending=1) is False
    assert gate(running=3, quiet_for=179.999) is False


def test_the_gate_can_be_switched_off() -> None:
    assert gate(running=3, non_ambient_running=3, quiet_window=0) is True
    assert gate(running=3, non_ambient_running=3, quiet_window=-1) is True
    assert gate(running=3, quiet_for=10, quiet_window=10) is True
    assert gate(running=3, quiet_for=10, quiet_window=10.001) is False
    assert gate(running=3, quiet_for=0.2, quiet_window=0.5) is False  # a short window is a window
