"""The daemon's config file: every bad input gets one line naming the file, the key, the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from hostler.config import load_config
from hostler.errors import UsageError

from _support import run_cli

GOOD_ENGINE = '[[engines]]\nkey = "llamacpp:m:0"\nmodel = "m.gguf"\n'

#: (config text, the key the error must name, words the error must carry). Each was a traceback
#: or a silently accepted mistake before (issue "Bad input and broken storage").
BAD = [
    (GOOD_ENGINE + 'ctx = "big"\n', "engines[0].ctx", "should be a valid integer"),
    (GOOD_ENGINE + "ctx = [1]\n", "engines[0].ctx", "should be a valid integer"),
    (GOOD_ENGINE + "ctx = -512\n", "engines[0].ctx", "greater than or equal to 1"),
    (GOOD_ENGINE + "ctx = 0\n", "engines[0].ctx", "greater than or equal to 1"),
    (GOOD_ENGINE + "ctx = 16777217\n", "engines[0].ctx", "less than or equal to 16777216"),
    (GOOD_ENGINE + "ctx = 1.5e400\n", "engines[0].ctx", "should be a valid integer"),
    (GOOD_ENGINE + "slots = 0\n", "engines[0].slots", "greater than or equal to 1"),
    (GOOD_ENGINE + "kv_type = 5\n", "engines[0].kv_type", "should be 'f32'"),
    (GOOD_ENGINE + 'kv_type = "q9"\n', "engines[0].kv_type", "should be 'f32'"),
    (GOOD_ENGINE + 'autostart = "no"\n', "engines[0].autostart", "valid boolean"),
    (GOOD_ENGINE + 'extra_args = "x"\n', "engines[0].extra_args", "valid dictionary"),
    (GOOD_ENGINE + "extra_args = { threads = nan }\n", "engines[0].extra_args", "finite"),
    (GOOD_ENGINE + "colour = 1\n", "engines[0].colour", "unknown setting"),
    ('[[engines]]\nkey = "not a key"\nmodel = "m.gguf"\n', "engines[0].key", "engine:model:"),
    ('[[engines]]\nkey = "llamacpp:m:0"\n', "engines[0].model", "Field required"),
    ("engines = 5\n", "engines", "valid list"),
    ('engines = ["x"]\n', "engines[0]", "valid dictionary"),
    ("daemon = 5\n", "daemon", "valid dictionary"),
    ('[daemon]\nidle_timeout = "soon"\n', "daemon.idle_timeout", "valid number"),
    ("[daemon]\nidle_timeout = -1\n", "daemon.idle_timeout", "greater than or equal to 0"),
    ("[daemon]\nhealth_interval = -5\n", "daemon.health_interval", "greater than 0"),
    ("[daemon]\nhealth_interval = 0\n", "daemon.health_interval", "greater than 0"),
    ("[daemon]\nledger = 5\n", "daemon.ledger", "valid string"),
    ('[daemon]\nledger_shared = "false"\n', "daemon.ledger_shared", "valid boolean"),
    ("[daemon]\nidle_timout = 5\n", "daemon.idle_timout", "did you mean 'idle_timeout'?"),
    (
        "[daemon]\nengine_log_max_mib = 0\n",
        "daemon.engine_log_max_mib",
        "greater than or equal to 1",
    ),
    ('[daemon]\nengine_log_max_mib = "8M"\n', "daemon.engine_log_max_mib", "valid integer"),
    ("[daemon]\nengine_log_max_mib = 2.5\n", "daemon.engine_log_max_mib", "valid integer"),
    ("[daemon]\nengine_log_keep = -1\n", "daemon.engine_log_keep", "greater than or equal to 0"),
    ("[daemon]\nlog_max_mib = 0\n", "daemon.log_max_mib", "greater than or equal to 1"),
    ('[daemon]\nlog_max_mib = "1G"\n', "daemon.log_max_mib", "valid integer"),
    ("[daemon]\nengine_log_keep = 101\n", "daemon.engine_log_keep", "less than or equal to 100"),
    (
        "[daemon]\nengine_log_kept = 3\n",
        "daemon.engine_log_kept",
        "did you mean 'engine_log_keep'?",
    ),
    ('[[engine]]\nkey = "llamacpp:m:0"\nmodel = "m.gguf"\n', "engine", "did you mean 'engines'?"),
    ("[deamon]\nidle_timeout = 5\n", "deamon", "did you mean 'daemon'?"),
    # found by tests/test_fuzz.py: a ValueError from the OS, and one from int()
    (
        '[[engines]]\nkey = "llamacpp:m:0"\nmodel = "m\\u0000.gguf"\n',
        "engines[0].model",
        "a path cannot hold a NUL character",
    ),
    ('[daemon]\ndata_dir = "a\\u0000"\n', "daemon.data_dir", "a path cannot hold a NUL"),
    ('[daemon]\nledger = "\\u0000"\n', "daemon.ledger", "a path cannot hold a NUL"),
    ('[[engines]]\nkey = "llamacpp:m:²"\nmodel = "m.gguf"\n', "engines[0].key", "engine:model:"),
    (GOOD_ENGINE + "slots = 1025\n", "engines[0].slots", "less than or equal to 1024"),
    (
        f'[[engines]]\nkey = "llamacpp:{"a" * 120}:0"\nmodel = "m.gguf"\n',
        "engines[0].key",
        "at most 128 characters",
    ),
    # found by a hostile tester: accepted, then a traceback when the engine was started
    (
        GOOD_ENGINE + 'extra_args = { alias = "a\\u0000b" }\n',
        "engines[0].extra_args",
        "'alias': a command-line argument cannot hold a NUL character",
    ),
    # a user nobody knows: Path.expanduser() raised RuntimeError (a traceback)
    (
        '[[engines]]\nkey = "llamacpp:m:0"\nmodel = "~hostler-no-such-user/m.gguf"\n',
        "engines[0].model",
        "no home directory known for '~hostler-no-such-user' (got '~hostler-no-such-user/m",
    ),
    (
        '[daemon]\ndata_dir = "~hostler-no-such-user"\n',
        "daemon.data_dir",
        "no home directory known for '~hostler-no-such-user' (got '~hostler-no-such-user')",
    ),
    (
        '[daemon]\nledger = "~hostler-no-such-user/l.db"\n',
        "daemon.ledger",
        "no home directory known for '~hostler-no-such-user' (got '~hostler-no-such-user/l.db')",
    ),
]


@pytest.mark.parametrize(("text", "key", "words"), BAD)
def test_a_bad_setting_is_one_line_naming_the_file_and_the_key(
    tmp_path: Path, text: str, key: str, words: str
) -> None:
    config = tmp_path / "hostler.toml"
    config.write_text(text)
    with pytest.raises(UsageError) as caught:
        load_config(config)
    message = caught.value.message
    assert "\n" not in message
    assert message.startswith(f"{config}: {key}: "), message
    assert words in message, message


def test_the_same_key_twice_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "hostler.toml"
    config.write_text(GOOD_ENGINE + "\n" + GOOD_ENGINE)
    with pytest.raises(UsageError, match="the key 'llamacpp:m:0' is configured twice"):
        load_config(config)


def test_a_config_that_is_not_utf8_text_or_not_a_file(tmp_path: Path) -> None:
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b'[daemon]\nledger = "\xff\xfe"\n')
    with pytest.raises(UsageError, match=r"not UTF-8 text \(byte 19\)"):
        load_config(binary)
    with pytest.raises(UsageError, match="not a config file"):
        load_config(tmp_path)
    with pytest.raises(UsageError, match="not a config file"):
        load_config(tmp_path / "missing.toml")


def test_paths_resolve_against_the_config_file_and_data_dir_against_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "conf"
    folder.mkdir()
    config = folder / "hostler.toml"
    config.write_text('[daemon]\nledger = "l/ledger.db"\ndata_dir = "d"\n' + GOOD_ENGINE)
    monkeypatch.chdir(tmp_path)
    loaded = load_config(config.relative_to(tmp_path))
    assert loaded.engines[0].model == folder / "m.gguf"
    assert loaded.ledger == folder / "l" / "ledger.db"
    assert loaded.data_dir == folder / "d"
    relative = load_config(config, data_dir=Path("elsewhere"))
    assert relative.data_dir == tmp_path / "elsewhere"  # a relative --data-dir: the cwd's
    defaults = load_config(folder / "hostler.toml")
    assert (defaults.idle_timeout, defaults.health_interval) == (300.0, 15.0)
    assert (defaults.engines[0].ctx, defaults.engines[0].slots) == (4096, 1)


def test_the_daemon_cli_says_it_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(GOOD_ENGINE + 'ctx = "big"\n')
    result = run_cli("daemon", "--config", str(config), "--data-dir", str(tmp_path / "d"))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.strip() == (
        f"hostler: error [usage.invalid]: {config}: engines[0].ctx: should be a valid integer "
        "(got 'big')"
    )
    assert not (tmp_path / "d").exists()  # nothing was created for a config it refused


def test_config_kv_types_are_the_priced_ones() -> None:
    from typing import get_args

    from hostler.capacity.kv import KV_CACHE_TYPES
    from hostler.config import KvType

    assert get_args(KvType) == KV_CACHE_TYPES


def test_a_config_nested_past_what_the_parser_can_follow_is_one_line(tmp_path: Path) -> None:
    """Found by tests/test_fuzz.py: tomllib recursed into a RecursionError."""
    config = tmp_path / "hostler.toml"
    config.write_text("a = " + "[" * 2000 + "]" * 2000 + "\n")
    with pytest.raises(UsageError) as caught:
        load_config(config)
    assert caught.value.message == f"{config}: arrays or tables nested too deeply"


def test_the_engine_log_cap_is_configurable_and_defaults_to_five_times_8_mib(
    tmp_path: Path,
) -> None:
    config = tmp_path / "hostler.toml"
    config.write_text(GOOD_ENGINE)
    defaults = load_config(config)
    assert (defaults.engine_log_max_bytes, defaults.engine_log_keep) == (8 * 1024 * 1024, 5)
    config.write_text("[daemon]\nengine_log_max_mib = 32\nengine_log_keep = 0\n" + GOOD_ENGINE)
    chosen = load_config(config)
    assert (chosen.engine_log_max_bytes, chosen.engine_log_keep) == (32 * 1024 * 1024, 0)


@pytest.mark.parametrize(("text", "key", "words"), BAD)
def test_the_daemon_refuses_each_bad_config_with_exit_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, key: str, words: str
) -> None:
    """The same table through ``hostler daemon``: one line, exit 2, no directory, no engine."""
    from hostler.cli import main

    config = tmp_path / "hostler.toml"
    config.write_text(text)
    before = sorted(p.name for p in tmp_path.iterdir())
    status = main(["daemon", "--config", str(config), "--data-dir", str(tmp_path / "d")])
    captured = capsys.readouterr()
    assert status == 2
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"hostler: error [usage.invalid]: {config}: {key}: "), lines[0]
    assert words in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written, nothing run


@pytest.mark.parametrize(
    ("text", "key", "got"),
    [
        (GOOD_ENGINE.replace("m.gguf", "loop/m.gguf"), "engines[0].model", "loop/m.gguf"),
        ('[daemon]\nledger = "loop/x"\n', "daemon.ledger", "loop/x"),
        ('[daemon]\ndata_dir = "loop/d"\n', "daemon.data_dir", "loop/d"),
    ],
)
def test_a_path_through_a_symbolic_link_loop_is_one_line(
    tmp_path: Path, text: str, key: str, got: str
) -> None:
    """``model = "loop/m.gguf"`` beside ``ln -s loop loop`` was a RuntimeError traceback."""
    (tmp_path / "loop").symlink_to("loop")
    config = tmp_path / "hostler.toml"
    config.write_text(text)
    result = run_cli("daemon", "--config", str(config), "--data-dir", str(tmp_path / "d"))
    assert result.stderr == (
        f"hostler: error [usage.invalid]: {config}: {key}: cannot be resolved (Too many levels "
        f"of symbolic links) (got {got!r})\n"
    )
    assert result.returncode == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hostler.toml", "loop"]


def test_the_log_cap_is_read_in_mib(tmp_path: Path) -> None:
    config = tmp_path / "hostler.toml"
    config.write_text("[daemon]\nlog_max_mib = 3\n")
    assert load_config(config).log_max_bytes == 3 * 1024 * 1024
    config.write_text("[daemon]\n")
    assert load_config(config).log_max_bytes is None
