"""Pinned engines' retries (PP17, sans I/O): doubling from 1 s to a minute, trouble said once."""

from __future__ import annotations

from hostler.machines.pins import PIN_BACKOFF_MAX, PIN_BACKOFF_MIN, PinKeeper, pin_blocked


def test_the_constants() -> None:
    assert (PIN_BACKOFF_MIN, PIN_BACKOFF_MAX) == (1.0, 60.0)


def test_a_failing_pin_waits_longer_each_time_up_to_a_minute() -> None:
    pins = PinKeeper(interval=1.0)
    now, waits = 100.0, []
    for _ in range(9):
        assert pins.due("e:m:0", now)
        failure = pins.failed("e:m:0", "no room", now)
        waits.append(failure.backoff)
        assert not pins.due("e:m:0", now + failure.backoff - 0.001)
        now += failure.backoff
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]


def test_the_interval_is_the_shortest_wait_and_pins_are_apart() -> None:
    pins = PinKeeper(interval=5.0)
    assert pins.failed("a", "x", 0.0).backoff == 5.0
    assert pins.failed("a", "x", 5.0).backoff == 10.0
    assert pins.due("b", 0.0)  # another pin has its own schedule


def test_trouble_is_said_once_per_message_and_again_after_a_success() -> None:
    pins = PinKeeper(interval=1.0)
    assert [pins.failed("a", m, 0.0).say for m in ("x", "x", "y", "y", "x")] == [
        True,
        False,
        True,
        False,
        True,
    ]
    pins.succeeded("a")
    assert pins.due("a", 0.0)
    again = pins.failed("a", "x", 0.0)
    assert (again.backoff, again.say) == (1.0, True)


def test_a_pin_up_on_its_way_or_locked_out_needs_no_start() -> None:
    idle = {"up": False, "stopping": False, "starting": False, "draining": False}
    assert not pin_blocked(**idle, locked_until=None, now=10.0)
    for flag in idle:
        assert pin_blocked(**{**idle, flag: True}, locked_until=None, now=10.0)
    assert pin_blocked(**idle, locked_until=10.001, now=10.0)
    assert not pin_blocked(**idle, locked_until=10.0, now=10.0)  # the lockout is over
