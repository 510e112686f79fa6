"""C1 and C3 from the environment: the operator's host floor and growth ceiling.

The pure planner takes them as parameters; ``read_context_overrides`` validates the strings;
``hostler preview`` reads them, uses them and shows them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hostler.capacity.budget import HostMemory, compute_budget
from hostler.capacity.overrides import ContextOverrides, parse_tokens, read_context_overrides
from hostler.errors import SettingError, UsageError
from test_plan import _write_model, plan

from _support import run_cli

FLOOR = "HOSTLER_MIN_CONTEXT_TOKENS"
CEILING = "HOSTLER_LLAMA_GROWTH_CEILING_TOKENS"


def test_unset_and_empty_settings_leave_the_rules_defaults() -> None:
    assert read_context_overrides({}) == ContextOverrides(None, None)
    assert read_context_overrides({FLOOR: "", CEILING: "  "}) == ContextOverrides(None, None)
    assert ContextOverrides().in_force() == {}


@pytest.mark.parametrize(
    ("text", "value"),
    [("1", 1), ("16384", 16384), (" 32768 ", 32768), ("+4096", 4096), ("16777216", 16777216)],
)
def test_whole_positive_token_counts_are_read(text: str, value: int) -> None:
    assert parse_tokens(FLOOR, text) == value
    read = read_context_overrides({FLOOR: text, CEILING: text})
    assert read == ContextOverrides(value, value)
    assert read.in_force() == {FLOOR: value, CEILING: value}


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("abc", "is not a whole number"),
        ("64k", "is not a whole number"),
        ("65536.0", "is not a whole number"),
        ("1e5", "is not a whole number"),
        ("0x100", "is not a whole number"),
        ("0", "must be at least 1 token"),
        ("-1", "must be at least 1 token"),
        ("-65536", "must be at least 1 token"),
        ("16777217", "is absurdly large"),
        ("99999999999999999999", "is absurdly large"),
    ],
)
@pytest.mark.parametrize("name", [FLOOR, CEILING])
def test_bad_settings_are_refused_in_one_line(name: str, text: str, why: str) -> None:
    with pytest.raises(SettingError) as caught:
        read_context_overrides({name: text})
    message = str(caught.value)
    assert message.startswith(f"{name}={text!r} {why}")
    assert "\n" not in message
    assert isinstance(caught.value, UsageError)
    assert caught.value.code == "usage.setting"
    assert caught.value.exit_status == 2


def test_the_floor_setting_replaces_the_host_floor() -> None:
    default = plan()  # 32 GiB of RAM: floor 65536
    assert default.admitted
    assert "host floor 65536, native 131072" in default.reasons[0]
    raised = plan(min_context=100_000)
    assert (
        "100000 requested, 100000 minimum (host floor 100000, set by the operator"
        in (raised.reasons[0])
    )
    assert raised.context_window >= 100_000
    assert raised.slots == 1  # two slots cannot each hold 100000 tokens here


def test_a_lower_floor_admits_what_the_default_floor_denies() -> None:
    small = compute_budget(HostMemory(system_ram=12 * 1024**3))  # constrained: floor 32768
    denied = plan(budget=small)
    assert not denied.admitted
    assert "needs a window of 32768 tokens; one slot could hold 18432" in denied.reasons
    admitted = plan(budget=small, min_context=16384)
    assert admitted.admitted
    assert admitted.context_window == 18432
    lower_than_fits = plan(budget=small, min_context=18433)
    assert not lower_than_fits.admitted  # the minimum is an equality boundary
    assert plan(budget=small, min_context=18432).admitted


def test_the_growth_ceiling_caps_adaptive_growth() -> None:
    assert plan().context_window == 82944  # grows from 65536 towards the native 131072
    capped = plan(growth_ceiling=70_000)
    assert capped.context_window == 69632  # floored to a multiple of 1024
    assert "growth: at most 70000 tokens (operator's ceiling)" in capped.reasons
    assert plan(growth_ceiling=65536).context_window == 65536  # no growth at the request
    assert plan(growth_ceiling=1).context_window == 65536  # never below the request
    assert plan(growth_ceiling=200_000).context_window == 82944  # memory still rules


def test_the_automatic_window_beside_an_override_keeps_the_settings() -> None:
    p = plan(ctx=8192, ctx_is_model_override=True, growth_ceiling=70_000)
    assert p.context_window == 8192
    assert p.auto_window == 69632


def test_preview_cli_uses_and_shows_the_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _write_model(tmp_path / "llama8b.gguf")
    ledger = tmp_path / "ledger.db"
    monkeypatch.setenv("HOSTLER_CAPACITY_BUDGET_GB", "19.2")
    monkeypatch.delenv(FLOOR, raising=False)
    monkeypatch.delenv(CEILING, raising=False)
    plain = run_cli("preview", str(model), "--ledger", str(ledger), "--json")
    assert plain.returncode == 0, plain.stderr
    assert json.loads(plain.stdout)["settings"] == {}
    assert "setting " not in run_cli("preview", str(model), "--ledger", str(ledger)).stdout

    monkeypatch.setenv(FLOOR, "16384")
    monkeypatch.setenv(CEILING, "70000")
    result = run_cli("preview", str(model), "--ledger", str(ledger), "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["settings"] == {FLOOR: 16384, CEILING: 70000}
    assert "16384 minimum (host floor 16384, set by the operator" in data["reasons"][0]
    assert "growth: at most 70000 tokens (operator's ceiling)" in data["reasons"]
    assert data["context_window"] <= 69632
    text = run_cli("preview", str(model), "--ledger", str(ledger)).stdout
    assert "setting  HOSTLER_MIN_CONTEXT_TOKENS=16384 (host floor" in text
    assert "setting  HOSTLER_LLAMA_GROWTH_CEILING_TOKENS=70000 (ceiling of adaptive growth)" in (
        text
    )


@pytest.mark.parametrize(
    ("name", "value"), [(FLOOR, "lots"), (FLOOR, "0"), (CEILING, "-5"), (CEILING, "10000000000")]
)
def test_preview_cli_refuses_a_bad_setting_with_exit_status_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    model = _write_model(tmp_path / "llama8b.gguf")
    monkeypatch.setenv(name, value)
    result = run_cli("preview", str(model), "--ledger", str(tmp_path / "ledger.db"))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"hostler: error [usage.setting]: {name}={value!r} ")
    assert "Traceback" not in result.stderr
