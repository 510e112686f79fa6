"""Operator and model input at the plugin contract's edge: flags, values, slot limits, numbers.

The argv spelling of RD5 is checked against the real parsers it is for (llama-server's, an
argparse engine's), the per-model slot limit (S8, M6) through the real ``hostler preview``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hostler.capacity.overrides import MAX_CONTEXT_TOKENS, parse_tokens
from hostler.engines.price import slot_limit_of
from hostler.errors import PluginError, SettingError
from hostler.plugin import (
    EngineAdapter,
    LaunchCommand,
    LaunchSpec,
    ModelGeometry,
    extra_args_argv,
    flag_argv,
    flag_key_problem,
)
from hostler.testing.fake_engine import FakeEngineAdapter
from hostler_ds4.settings import MAX_WHOLE, read_settings
from hostler_llamacpp.binary import find_llama_server
from hostler_mlx import MlxAdapter
from hostler_mlx.geometry import geometry_from_config

from _support import run_cli

# --- RD5: keys ---------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["ngl", "-ngl", "--ctx-size", "chat-template", "a", "x.y", "v2"])
def test_a_flag_name_is_a_key(key: str) -> None:
    assert flag_key_problem(key) is None


@pytest.mark.parametrize(
    "key", ["", "-", "--", "---x", "-x=1", "a b", "ctx\n", "é", "_x", "x" * 65, None, 1]
)
def test_what_is_no_flag_name_is_refused(key: object) -> None:
    problem = flag_key_problem(key)
    assert problem is not None and "is no flag name" in problem


def test_a_key_of_64_characters_is_a_flag_and_65_is_not() -> None:
    assert flag_key_problem("x" * 64) is None
    assert flag_key_problem("--" + "x" * 64) is None
    assert flag_key_problem("x" * 65) is not None


# --- RD5: values -------------------------------------------------------------------------------


def test_flag_values_are_separate_tokens_by_default() -> None:
    assert flag_argv("--seed", -1) == ["--seed", "-1"]
    assert flag_argv("--alias", "-x") == ["--alias", "-x"]
    assert flag_argv("--v", True) == ["--v"]
    assert flag_argv("--v", False) == []
    assert flag_argv("--n", 0) == ["--n", "0"]
    assert flag_argv("--s", "") == ["--s", ""]


def test_joined_values_join_only_a_value_that_starts_with_a_dash() -> None:
    assert flag_argv("--t", "-x", join_dash_values=True) == ["--t=-x"]
    assert flag_argv("--seed", -1, join_dash_values=True) == ["--seed=-1"]
    assert flag_argv("--t", "x-", join_dash_values=True) == ["--t", "x-"]
    assert flag_argv("--t", "", join_dash_values=True) == ["--t", ""]
    assert flag_argv("--v", True, join_dash_values=True) == ["--v"]
    assert flag_argv("--v", False, join_dash_values=True) == []


def test_extra_args_keep_their_order_and_spelling() -> None:
    extra = {"-ngl": 99, "seed": -1, "verbose": True, "quiet": False}
    assert extra_args_argv(extra) == ["-ngl", "99", "--seed", "-1", "--verbose"]
    assert extra_args_argv(extra, join_dash_values=True) == ["-ngl", "99", "--seed=-1", "--verbose"]


def test_an_adapter_spells_extra_args_as_its_class_says() -> None:
    assert EngineAdapter.join_dash_values is False
    assert MlxAdapter.join_dash_values is True
    assert FakeEngineAdapter().extra_args_argv({"t": "-x"}) == ["--t", "-x"]
    assert MlxAdapter().extra_args_argv({"t": "-x"}) == ["--t=-x"]


def test_join_dash_values_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match="join_dash_values must be True or False"):

        class Bad(FakeEngineAdapter):
            engine_type = "bad"
            join_dash_values = 1  # type: ignore[assignment]


def test_the_real_llama_server_needs_values_apart() -> None:
    """Why the default keeps ``--key value``: llama.cpp refuses ``--key=value``."""
    server = str(find_llama_server())
    joined = subprocess.run(
        [server, "--ctx-size=512", "--version"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "invalid argument: --ctx-size=512" in joined.stdout + joined.stderr
    apart = subprocess.run(
        [server, "--alias", "-x", "--version"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "invalid argument" not in apart.stdout + apart.stderr
    assert "version" in apart.stdout + apart.stderr


ARGPARSE_ENGINE = """
import argparse, sys
parser = argparse.ArgumentParser()
parser.add_argument("--chat-template")
parser.add_argument("--seed", type=int)
print(repr(vars(parser.parse_args())))
"""


def test_an_argparse_engine_reads_joined_values_as_values() -> None:
    """Why MLX joins: argparse takes a separate ``-x`` for an option; ``--key=-x`` is a value."""
    argv = [sys.executable, "-c", ARGPARSE_ENGINE]
    apart = subprocess.run(
        [*argv, "--chat-template", "-x"], check=False, capture_output=True, text=True
    )
    assert apart.returncode == 2 and "expected one argument" in apart.stderr
    extra = extra_args_argv({"chat-template": "-x", "seed": -1}, join_dash_values=True)
    joined = subprocess.run([*argv, *extra], capture_output=True, text=True, check=True)
    assert joined.stdout.strip() == repr({"chat_template": "-x", "seed": -1})


# --- S8 / M6: the per-model slot limit ---------------------------------------------------------

KNOWN = {
    "model_type": "qwen3",
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_size": 2048,
    "max_position_embeddings": 40960,
}


def test_mlx_serves_one_slot_for_an_unknown_geometry_and_no_limit_for_a_known_one() -> None:
    unknown = geometry_from_config({"model_type": "llama"}, weights=1)
    known = geometry_from_config(KNOWN, weights=1)
    assert MlxAdapter().slot_limit(unknown) == 1
    assert MlxAdapter().slot_limit(known) is None
    assert slot_limit_of(MlxAdapter(), unknown) == 1


class Limited(FakeEngineAdapter):
    engine_type = "limited"
    answer: object = None

    def slot_limit(self, geometry: ModelGeometry) -> int | None:
        return self.answer  # type: ignore[return-value]

    def build_command(self, spec: LaunchSpec) -> LaunchCommand:
        return LaunchCommand(["true"])


@pytest.mark.parametrize("answer", [None, 1, 1024])
def test_a_slot_limit_of_none_or_1_to_64_is_taken(answer: int | None) -> None:
    adapter = Limited()
    adapter.answer = answer
    assert slot_limit_of(adapter, ModelGeometry()) == answer


@pytest.mark.parametrize("answer", [0, 1025, -1, True, 2.0, "2"])
def test_any_other_slot_limit_is_the_plugins_error(answer: object) -> None:
    adapter = Limited()
    adapter.answer = answer
    with pytest.raises(PluginError, match="from slot_limit"):
        slot_limit_of(adapter, ModelGeometry())


def test_the_default_slot_limit_is_the_class_max_slots() -> None:
    class Serial(Limited):
        max_slots = 1

        def slot_limit(self, geometry: ModelGeometry) -> int | None:
            return EngineAdapter.slot_limit(self, geometry)

    assert slot_limit_of(Serial(), ModelGeometry()) == 1


def _mlx_folder(tmp_path: Path, config: dict[str, object]) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"")
    os.truncate(folder / "model.safetensors", 300 * 2**20)
    return folder


def _preview(tmp_path: Path, folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    home = tmp_path / "home"
    env = {
        "HOME": str(home),
        "HOSTLER_HOME": str(home / "data"),
        "XDG_DATA_HOME": str(home / "xdg"),
        "HOSTLER_LEDGER": str(home / "ledger.db"),
        "HOSTLER_CAPACITY_BUDGET_GB": "32",
    }
    return run_cli("preview", "--engine", "mlx", "--json", *args, str(folder), env=env)


def test_preview_refuses_more_slots_than_an_unknown_mlx_model_serves(tmp_path: Path) -> None:
    folder = _mlx_folder(tmp_path, {"model_type": "llama"})
    three = _preview(tmp_path, folder, "--slots", "3")
    assert three.returncode != 0 and "Traceback" not in three.stderr
    assert "at most 1" in three.stderr
    one = _preview(tmp_path, folder, "--slots", "1")
    assert json.loads(one.stdout)["slots"] == 1  # the limit itself is planned


def test_preview_plans_the_slots_asked_for_a_known_mlx_model(tmp_path: Path) -> None:
    folder = _mlx_folder(tmp_path, KNOWN)
    three = _preview(tmp_path, folder, "--slots", "3")
    assert "Traceback" not in three.stderr, three.stderr[-2000:]
    assert json.loads(three.stdout)["slots"] == 3


# --- whole numbers past Python's digit limit ------------------------------------------------------


def test_a_context_setting_past_the_digit_limit_is_absurdly_large_in_one_line() -> None:
    with pytest.raises(SettingError) as raised:
        parse_tokens("HOSTLER_MIN_CONTEXT_TOKENS", "1" * 5000)
    text = str(raised.value)
    assert "absurdly large" in text and "(5000 characters)" in text and len(text) < 300
    with pytest.raises(SettingError, match="at least 1 token"):
        parse_tokens("HOSTLER_MIN_CONTEXT_TOKENS", "-" + "1" * 5000)
    assert parse_tokens("X", str(MAX_CONTEXT_TOKENS)) == MAX_CONTEXT_TOKENS  # the bound: taken
    with pytest.raises(SettingError, match="absurdly large"):
        parse_tokens("X", str(MAX_CONTEXT_TOKENS + 1))


def test_a_ds4_whole_setting_is_at_most_2_to_the_60() -> None:
    assert MAX_WHOLE == 2**60
    assert read_settings({"kv_disk_mb": 2**60}, {}, {}).kv_disk_mb == 2**60
    for value in (2**60 + 1, str(2**60 + 1), "1" * 5000):
        with pytest.raises(SettingError, match="absurdly large"):
            read_settings({"kv_disk_mb": value}, {}, {})
    with pytest.raises(SettingError, match="absurdly large"):
        read_settings({"expert_cache_gib": "9" * 5000 + "GB"}, {}, {})


def test_a_config_number_past_the_digit_limit_is_one_line(tmp_path: Path) -> None:
    from hostler.config import load_config
    from hostler.errors import UsageError

    config = tmp_path / "hostler.toml"
    config.write_text("[daemon]\nidle_timeout = " + "1" * 5000 + "\n")
    with pytest.raises(UsageError, match="more than 4300 digits"):
        load_config(config)


@pytest.mark.parametrize(
    ("parallel", "slots"),
    [("1" * 5000, 3), ("²", 3), ("0", 3), ("-2", 3), ("1025", 3), ("1024", 1024), (" 5 ", 5)],
)
def test_llama_cpp_reads_an_operators_parallel_within_bounds(parallel: str, slots: int) -> None:
    """L16: ``--parallel`` sizes the cache adapter; a count it cannot be leaves the plan's."""
    from hostler_llamacpp import LlamaCppAdapter
    from hostler_llamacpp.cache import LlamaCacheAdapter

    spec = LaunchSpec(
        "llamacpp:m:0", Path("m.gguf"), 4321, 512, slots=3, extra_args={"parallel": parallel}
    )
    made = LlamaCppAdapter().cache_adapter(spec)
    assert isinstance(made, LlamaCacheAdapter) and made.slots == slots
