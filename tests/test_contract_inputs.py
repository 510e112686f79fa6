"""Operator and model input at the plugin contract's edge: flags, values, slot limits, numbers.

The argv spelling of RD5 is checked against the real parsers it is for (llama-server's, an
argparse engine's), the per-model slot limit (S8, M6) through the real ``hostler preview``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
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

from _support import assert_one_line_error, cli_env, run_cli

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


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


DIGITS = "1" * 5000  # more digits than Python converts by default (sys.get_int_max_str_digits)


@pytest.mark.parametrize(
    ("variable", "engine", "where"),
    [
        ("HOSTLER_MIN_CONTEXT_TOKENS", "llamacpp", "hostler.capacity.overrides.parse_tokens"),
        (
            "HOSTLER_LLAMA_GROWTH_CEILING_TOKENS",
            "llamacpp",
            "hostler.capacity.overrides.parse_tokens",
        ),
        ("HOSTLER_DS4_KV_DISK_MB", "ds4", "hostler_ds4.settings._int"),
    ],
)
def test_a_whole_number_setting_of_5000_digits_is_one_line(
    tmp_path: Path, variable: str, engine: str, where: str
) -> None:
    """An environment setting of 5000 digits is refused in one line like any absurd value.

    Each checks its text with a digits regex and then calls int(), which raises ValueError
    ("Exceeds the limit (4300 digits) for integer string conversion") past Python's limit;
    nothing catches it, so `hostler preview` (and the daemon) print a traceback. A value of
    40 digits already gets the proper one line ("absurdly large"). Cause: see `where`.
    """
    from hostler.testing.tiny_gguf import write_tiny_llama

    model = write_tiny_llama(tmp_path / "tiny.gguf")
    env = {**cli_env(tmp_path), variable: DIGITS}
    done = run_cli("preview", "--engine", engine, str(model), env=env)
    assert_one_line_error(done)
    assert variable in done.stderr, where


@pytest.mark.parametrize(
    ("options", "extra_args"),
    [({}, {"chat-template": "-x"}), ({"chat_template": "-x"}, {})],
    ids=["extra_args", "options"],
)
def test_a_value_that_starts_with_a_dash_reaches_the_engine_as_a_value(
    tmp_path: Path, options: dict[str, object], extra_args: dict[str, str]
) -> None:
    """`chat-template = "-x"` is the flag's value, not a new flag, for the real engine.

    The one rule (hostler.plugin.extra_args_argv) and MLX's option flags
    (hostler_mlx.adapter.mlx_argv) spell a value as a separate token, `--chat-template -x`;
    argparse (mlx_lm.server's parser) takes `-x` for an option and the engine exits at once
    with "argument --chat-template: expected one argument". `--chat-template=-x` would carry
    it. Run for real: the launch hostler would run, the real mlx_lm.server's parser.
    """
    from hostler.plugin import launch_command
    from hostler.testing.tiny_mlx import write_tiny_mlx

    folder = write_tiny_mlx(tmp_path / "tiny")
    spec = LaunchSpec(
        "mlx:m:0",
        Path(folder),
        free_port(),
        ctx_per_slot=256,
        options=options,
        extra_args=extra_args,
    )
    argv = launch_command(MlxAdapter(), spec).argv
    # the real server, with a model that is not there: it parses its argv, then fails to load
    assert argv[4:6] == ["--model", str(folder)]
    argv = [*argv[:4], "--model", str(tmp_path / "absent"), *argv[6:]]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    try:
        while process.poll() is None and time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", spec.port), timeout=0.2),
            ):
                return  # parsed, and listening (it loads lazily): the value held
            time.sleep(0.1)
    finally:
        if process.poll() is None:
            process.kill()
        _out, err = process.communicate()
    assert process.returncode is not None
    assert "expected one argument" not in err, err[-600:]
