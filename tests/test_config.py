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
    # issue 22: a URL where a path is meant wrote a SQLite file in folders named after it
    (
        '[daemon]\nledger = "postgresql+psycopg://postgres@127.0.0.1:5544/hostler"\n',
        "daemon.ledger",
        "a file path, not a URL (postgresql+psycopg://...): this setting names a file or folder "
        "of this host",
    ),
    (
        '[[models]]\nid = "m"\npath = "https://huggingface.co/x/m.gguf"\n',
        "models[0].path",
        "a file path, not a URL (https://...)",
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


MODEL = '[[models]]\nid = "qwen"\npath = "q.gguf"\n'

#: ``[[models]]`` and the new sections: each bad input is one line naming the key.
BAD_MODELS = [
    (MODEL + "replicas = 0\n", "models[0].replicas", "greater than or equal to 1"),
    (MODEL + "replicas = -2\n", "models[0].replicas", "greater than or equal to 1"),
    (MODEL + "replicas = 65\n", "models[0].replicas", "less than or equal to 64"),
    (MODEL + 'replicas = "2"\n', "models[0].replicas", "valid integer"),
    (MODEL + "idle_ttl = -1\n", "models[0].idle_ttl", "greater than or equal to 0"),
    (MODEL + "idle_ttl = 31536001\n", "models[0].idle_ttl", "less than or equal to 31536000"),
    (MODEL + 'idle_ttl = "1h"\n', "models[0].idle_ttl", "valid number"),
    (MODEL + 'pinned = "yes"\n', "models[0].pinned", "valid boolean"),
    (MODEL + "ctx = 0\n", "models[0].ctx", "greater than or equal to 1"),
    (MODEL + "slots = 1025\n", "models[0].slots", "less than or equal to 1024"),
    (MODEL + 'kv_type = "q9"\n', "models[0].kv_type", "should be 'f32'"),
    (MODEL + "extra_args = { threads = inf }\n", "models[0].extra_args", "finite"),
    (MODEL + "replica = 2\n", "models[0].replica", "did you mean 'replicas'?"),
    (MODEL + "idle_tll = 2\n", "models[0].idle_tll", "did you mean 'idle_ttl'?"),
    ('[[models]]\nid = "qwen"\n', "models[0].path", "Field required"),
    ('[[models]]\npath = "q.gguf"\n', "models[0].id", "Field required"),
    ('[[models]]\nid = "a:b"\npath = "q.gguf"\n', "models[0].id", "cannot hold ':'"),
    ('[[models]]\nid = ""\npath = "q.gguf"\n', "models[0].id", "at least 1 character"),
    ('[[models]]\nid = " q"\npath = "q.gguf"\n', "models[0].id", "no surrounding spaces"),
    ('[[models]]\nid = "q\\n"\npath = "q.gguf"\n', "models[0].id", "no control characters"),
    (f'[[models]]\nid = "{"q" * 101}"\npath = "q.gguf"\n', "models[0].id", "at most 100"),
    (MODEL + 'engine = "Llama.cpp"\n', "models[0].engine", "lower-case letters"),
    ("models = 3\n", "models", "valid list"),
    ("[server]\nport = 65536\n", "server.port", "less than or equal to 65535"),
    ("[server]\nport = -1\n", "server.port", "greater than or equal to 0"),
    ('[server]\nhost = "a b"\n', "server.host", "an address or host name to listen on: no space"),
    ('[server]\nhost = ""\n', "server.host", "at least 1 character"),
    ('[server]\nhost = "http://0.0.0.0/"\n', "server.host", "no scheme, no path"),
    ('[server]\nauth = "basic"\n', "server.auth", "should be 'token' or 'none'"),
    ('[server]\nadress = "x"\n', "server.adress", "unknown setting"),
    (
        "[budget]\nbytes = 1073741823\n",
        "budget.bytes",
        "1073741823 bytes is under 1 GiB (1073741824 bytes), the smallest budget hostler "
        "enforces (CB1: a smaller one would let every model start); give at least 1 GiB, or "
        "auto for the automatic budget (got 1073741823)",
    ),
    ("[budget]\nbytes = 104857600\n", "budget.bytes", "104857600 bytes is under 1 GiB"),
    ("[budget]\nbytes = 1048576\n", "budget.bytes", "the smallest budget hostler enforces"),
    ("[budget]\nbytes = 1152921504606846977\n", "budget.bytes", "to 2^60"),
    ("[budget]\nbytes = 0\n", "budget.bytes", "a whole number of bytes"),
    ('[budget]\nbytes = "8G"\n', "budget.bytes", "or \"auto\" (got '8G')"),
    ("[budget]\nbytes = 8.5e9\n", "budget.bytes", "a whole number of bytes"),
    ("[budget]\nbytes = true\n", "budget.bytes", "a whole number of bytes"),
    ('[budget]\nspillover = "yes"\n', "budget.spillover", 'true, false or "auto"'),
    ("[budget]\nspillover = 1\n", "budget.spillover", 'true, false or "auto"'),
    ("[budget]\ngib = 8\n", "budget.gib", "unknown setting"),
    ('[arbiter]\npolicy = "share"\n', "arbiter.policy", "'auto', 'swap' or 'coexist'"),
    (
        '[engine_defaults.llamacpp]\nbinary = "nope"\n',
        "engine_defaults.llamacpp.binary",
        "not an executable file",
    ),
    (
        '[engine_defaults.llamacpp]\nbinry = "x"\n',
        "engine_defaults.llamacpp.binry",
        "did you mean 'binary'?",
    ),
    (
        "[engine_defaults.llamacpp]\nextra_args = 3\n",
        "engine_defaults.llamacpp.extra_args",
        "valid dictionary",
    ),
    ("[engine_defaults.Llama]\n", "engine_defaults.Llama.[key]", "lower-case letters"),
    ('[engines.llamacpp]\nbinary = "x"\n', "engines", "valid list"),
]


@pytest.mark.parametrize(("text", "key", "words"), BAD_MODELS)
def test_a_bad_model_or_section_is_one_line_naming_the_key(
    tmp_path: Path, text: str, key: str, words: str
) -> None:
    config = tmp_path / "hostler.toml"
    config.write_text(text)
    with pytest.raises(UsageError) as caught:
        load_config(config)
    message = caught.value.message
    assert message.startswith(f"{config}: {key}: "), message
    assert words in message and "\n" not in message


def test_a_model_expands_into_its_replicas_with_its_settings(tmp_path: Path) -> None:
    config = tmp_path / "hostler.toml"
    config.write_text(
        MODEL
        + 'engine = "llamacpp"\nctx = 2048\nslots = 2\nkv_type = "q8_0"\nreplicas = 3\n'
        + "pinned = true\nidle_ttl = 0\nextra_args = { threads = 2 }\n"
    )
    engines = load_config(config).engines
    assert [e.key for e in engines] == ["llamacpp:qwen:0", "llamacpp:qwen:1", "llamacpp:qwen:2"]
    for engine in engines:
        assert engine.model == (tmp_path / "q.gguf").resolve()
        assert (engine.ctx, engine.slots, engine.kv_type) == (2048, 2, "q8_0")
        assert (engine.pinned, engine.idle_ttl, engine.autostart) == (True, 0.0, False)
        assert engine.extra_args == {"threads": 2} and engine.binary is None


def test_model_defaults(tmp_path: Path) -> None:
    config = tmp_path / "hostler.toml"
    config.write_text(MODEL)
    (engine,) = load_config(config).engines
    assert engine.key == "llamacpp:qwen:0"
    assert (engine.ctx, engine.slots, engine.kv_type, engine.pinned) == (4096, 1, None, False)
    assert (engine.autostart, engine.idle_ttl, engine.extra_args) == (False, None, {})


def test_replica_and_engine_count_bounds_are_pinned() -> None:
    from hostler.config import MAX_BUDGET_BYTES, MAX_ENGINES, MAX_REPLICAS, MIN_BUDGET_BYTES
    from hostler.runtime.pool import MAX_REPLICAS as POOL_MAX

    assert MAX_REPLICAS == 64 == POOL_MAX
    assert MAX_ENGINES == 1024
    assert (MIN_BUDGET_BYTES, MAX_BUDGET_BYTES) == (2**30, 2**60)  # CB1's floor


def test_replicas_at_their_bounds(tmp_path: Path) -> None:
    config = tmp_path / "hostler.toml"
    config.write_text(MODEL + "replicas = 64\n")
    engines = load_config(config).engines
    assert len(engines) == 64 and engines[-1].key == "llamacpp:qwen:63"
    config.write_text(MODEL + "replicas = 1\n")
    assert len(load_config(config).engines) == 1


def test_more_than_1024_engines_in_all_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "hostler.toml"
    config.write_text(
        "".join(f'[[models]]\nid = "m{i}"\npath = "q.gguf"\nreplicas = 64\n' for i in range(16))
        + MODEL
    )
    with pytest.raises(UsageError) as caught:
        load_config(config)
    assert (
        caught.value.message
        == f"{config}: models[16].id: more than 1024 engines in all (replicas count)"
    )
    config.write_text(
        "".join(f'[[models]]\nid = "m{i}"\npath = "q.gguf"\nreplicas = 64\n' for i in range(16))
    )
    assert len(load_config(config).engines) == 1024  # exactly at the bound


def test_a_model_id_twice_or_also_an_engines_key_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "hostler.toml"
    config.write_text(MODEL + '[[models]]\nid = "qwen"\nengine = "other"\npath = "r.gguf"\n')
    with pytest.raises(UsageError) as caught:
        load_config(config)
    assert caught.value.message == f"{config}: models[1].id: the model 'qwen' is configured twice"
    config.write_text('[[engines]]\nkey = "vllm:qwen:3"\nmodel = "m.gguf"\n' + MODEL)
    with pytest.raises(UsageError) as caught:
        load_config(config)
    assert caught.value.message == (
        f"{config}: models[0].id: the model 'qwen' is also engines key 'vllm:qwen:3'; "
        "configure it once"
    )


def test_a_model_whose_keys_would_be_too_long_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "hostler.toml"
    model_id = "q" * 100
    config.write_text(f'[[models]]\nid = "{model_id}"\nengine = "{"e" * 25}"\npath = "q.gguf"\n')
    assert load_config(config).engines[0].key == f"{'e' * 25}:{model_id}:0"  # 128 exactly
    config.write_text(
        f'[[models]]\nid = "{model_id}"\nengine = "{"e" * 25}"\npath = "q.gguf"\nreplicas = 11\n'
    )
    with pytest.raises(UsageError) as caught:
        load_config(config)
    assert "over 128 characters" in caught.value.message


def test_engine_defaults_give_the_binary_and_extra_args_the_entries_win(tmp_path: Path) -> None:
    binary = tmp_path / "bin" / "llama-server"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o700)
    config = tmp_path / "hostler.toml"
    config.write_text(
        '[engine_defaults.llamacpp]\nbinary = "bin/llama-server"\n'
        "extra_args = { threads = 4, mlock = true }\n"
        "[engine_defaults.other]\nextra_args = { x = 1 }\n"
        + GOOD_ENGINE
        + "extra_args = { threads = 8 }\n"
        + MODEL
    )
    old, new = load_config(config).engines
    assert old.binary == new.binary == binary.resolve()
    assert list(old.extra_args.items()) == [("threads", 8), ("mlock", True)]  # in its place
    assert new.extra_args == {"threads": 4, "mlock": True}
    binary.chmod(0o600)
    with pytest.raises(UsageError, match="binary: not an executable file"):
        load_config(config)


def test_a_relative_binary_keeps_its_symbolic_link(tmp_path: Path) -> None:
    """A venv's ``bin/python`` named relative to the config stays the venv's, not its target.

    Python finds its virtual environment by the path it is started as (``pyvenv.cfg`` beside
    ``bin/``): a link resolved to the interpreter it points at runs without the venv's
    packages (``python -m llama_cpp.server``: No module named llama_cpp). An absolute path was
    kept as written; a relative one was resolved, links followed.
    """
    real = tmp_path / "base" / "python3.11"
    real.parent.mkdir()
    real.write_text("#!/bin/sh\n")
    real.chmod(0o700)
    venv = tmp_path / "engine-venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(real)
    config = tmp_path / "hostler.toml"
    config.write_text('[engine_defaults.llamacpp]\nbinary = "engine-venv/bin/python"\n' + MODEL)
    (engine,) = load_config(config).engines
    assert engine.binary == tmp_path.resolve() / "engine-venv" / "bin" / "python"


def test_idle_timeout_of_an_engine(tmp_path: Path) -> None:
    from hostler.config import DaemonConfig, EngineConfig

    daemon = DaemonConfig(data_dir=tmp_path, idle_timeout=300.0)
    plain = EngineConfig(key="llamacpp:a:0", model=tmp_path)
    assert daemon.idle_timeout_of(plain) == 300.0
    own = EngineConfig(key="llamacpp:a:0", model=tmp_path, idle_ttl=5.0)
    assert daemon.idle_timeout_of(own) == 5.0
    never = EngineConfig(key="llamacpp:a:0", model=tmp_path, idle_ttl=0.0)
    assert daemon.idle_timeout_of(never) == 0.0
    pinned = EngineConfig(key="llamacpp:a:0", model=tmp_path, idle_ttl=5.0, pinned=True)
    assert daemon.idle_timeout_of(pinned) == 0.0


def test_the_new_sections_and_their_defaults(tmp_path: Path) -> None:
    config = tmp_path / "hostler.toml"
    config.write_text("")
    empty = load_config(config)
    assert (empty.host, empty.port, empty.auth) == ("127.0.0.1", 11435, "token")
    assert (empty.budget_bytes, empty.spillover, empty.arbiter) == (None, None, "auto")
    config.write_text(
        '[server]\nhost = "::1"\nport = 0\nauth = "none"\n'
        '[budget]\nbytes = "auto"\nspillover = "auto"\n[arbiter]\npolicy = "swap"\n'
    )
    chosen = load_config(config)
    assert (chosen.host, chosen.port, chosen.auth) == ("::1", 0, "none")
    assert (chosen.budget_bytes, chosen.spillover, chosen.arbiter) == ("auto", "auto", "swap")
    config.write_text("[budget]\nbytes = 1073741824\nspillover = false\n")
    edge = load_config(config)
    assert (edge.budget_bytes, edge.spillover) == (1073741824, False)  # CB1: exactly 1 GiB
    assert edge.budget_from == f"config:{config.resolve()}"
    assert chosen.budget_from == f"config:{config.resolve()}"  # "auto" is the file's too
    assert empty.budget_from == ""


def test_a_models_extra_args_win_per_flag_however_the_key_is_spelled(tmp_path: Path) -> None:
    """RD5: the model's extra_args win per key over engine_defaults', `no-mmap` being `--no-mmap`.

    A key without dashes gets `--`, so `no-mmap` and `--no-mmap` name the same flag. Today
    hostler.config._engines_of merges the two tables by the key as written, so a model's
    `no-mmap = false` (leave the flag out) sits beside the defaults' `"--no-mmap" = true` and
    the engine is still launched with `--no-mmap`: the model's setting silently loses.
    """
    from hostler.config import load_config
    from hostler.plugin import extra_args_argv

    (tmp_path / "m.gguf").write_bytes(b"weights")
    config = tmp_path / "hostler.toml"
    config.write_text(
        "[engine_defaults.llamacpp]\n"
        'extra_args = { "--no-mmap" = true }\n\n'
        "[[models]]\n"
        'id = "m"\n'
        'path = "m.gguf"\n'
        'extra_args = { "no-mmap" = false }\n'
    )
    engine = load_config(config, data_dir=tmp_path / "data").engines[0]
    assert "--no-mmap" not in extra_args_argv(engine.extra_args), engine.extra_args
