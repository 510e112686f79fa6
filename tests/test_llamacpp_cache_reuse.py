"""L14: ``--cache-reuse`` is 256 by default at any slot count, and omitted when 0."""

from __future__ import annotations

from pathlib import Path

import pytest

from hostler.plugin import LaunchSpec
from hostler_llamacpp.adapter import LlamaCppAdapter


def argv(slots: int = 1, **kw: object) -> list[str]:
    spec = LaunchSpec(
        key="llamacpp:m:0",
        model=Path("m.gguf"),
        port=4321,
        ctx_per_slot=4096,
        slots=slots,
        **kw,  # type: ignore[arg-type]
    )
    return LlamaCppAdapter().build_command(spec).argv


@pytest.mark.parametrize("slots", [1, 2, 4])
def test_default_is_256_at_any_slot_count(slots: int) -> None:
    args = argv(slots)
    assert args.count("--cache-reuse") == 1
    assert args[args.index("--cache-reuse") + 1] == "256"


@pytest.mark.parametrize("value", [0, "0", " 0 ", False])
def test_zero_in_the_options_omits_the_flag(value: object) -> None:
    args = argv(2, options={"cache_reuse": value})
    assert "--cache-reuse" not in args
    assert "0" not in args[args.index("--parallel") + 2 :]


@pytest.mark.parametrize("value", [1, 64, "512"])
def test_a_nonzero_option_is_passed(value: object) -> None:
    args = argv(options={"cache_reuse": value})
    assert args[args.index("--cache-reuse") + 1] == str(value)


@pytest.mark.parametrize("key", ["cache-reuse", "--cache-reuse"])
@pytest.mark.parametrize("value", [0, "0"])
def test_zero_in_the_extra_args_omits_the_flag(key: str, value: object) -> None:
    args = argv(extra_args={key: value, "threads": 0})
    assert "--cache-reuse" not in args
    assert args[-2:] == ["--threads", "0"]  # only --cache-reuse treats 0 as "off"


def test_an_extra_nonzero_value_wins_over_the_default() -> None:
    args = argv(extra_args={"cache-reuse": 128})
    assert args.count("--cache-reuse") == 1
    assert args[-2:] == ["--cache-reuse", "128"]
