"""The completed contract, from the operator's side: options tables, engine names, a third
party's placeholder-named plugin, ``hostler preview`` of an adapter's own geometry, the
engine's port in ``hostler ps``, and a quiet daemon (RD4–RD6, PL1)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from hostler.cli import main
from hostler.config import load_config
from hostler.daemon import check_engine_options
from hostler.errors import PluginError, UsageError
from hostler.machines.engine import Engine
from hostler.plugin import (
    ENGINE_NAME_MAX,
    EngineAdapter,
    OptionType,
    engine_name_problem,
    options_schema_problem,
    validate_options,
)
from hostler.pluginhost import PluginHost
from hostler.testing.tiny_gguf import write_tiny_llama
from hostler.testing.tiny_mlx import write_tiny_mlx

from _daemons import count, engines, kill_leftovers, served_port, start_daemon, wait_for
from _support import assert_one_line_error, cli_env

TOY = textwrap.dedent(
    """
    import json
    from hostler.plugin import EngineAdapter, LaunchCommand, ModelGeometry, hookimpl

    class Toy(EngineAdapter):
        engine_type = "toy"
        model_kind = "directory"
        options_schema = {"temperature": float, "draft": bool}

        def build_command(self, spec):
            return LaunchCommand(["toy-server"])

        def read_geometry(self, model):
            config = json.loads((model / "config.json").read_text())
            return ModelGeometry(
                architecture=config["model_type"],
                block_count=config["num_hidden_layers"],
                head_count=config["num_attention_heads"],
                head_count_kv=config["num_key_value_heads"],
                embedding_length=config["hidden_size"],
                native_context=config["max_position_embeddings"],
                file_size=config["bytes"],
            )

        def estimate_footprint(self, geometry, spec):
            return geometry.file_size + 1000 * spec.ctx_per_slot * spec.slots

    @hookimpl
    def register_engines(register):
        register(Toy)
    """
)
THIRD_PARTY_MLX = textwrap.dedent(
    """
    from hostler.plugin import EngineAdapter, LaunchCommand, hookimpl

    class Mlx(EngineAdapter):
        engine_type = "mlx"
        def build_command(self, spec):
            return LaunchCommand(["mlx_lm.server"])

    @hookimpl
    def register_engines(register):
        register(Mlx)
    """
)
RESERVED = textwrap.dedent(
    """
    from hostler.plugin import EngineAdapter, LaunchCommand, hookimpl

    class Sneaky(EngineAdapter):
        engine_type = "unavailable"
        def build_command(self, spec):
            return LaunchCommand(["true"])

    @hookimpl
    def register_engines(register):
        register(Sneaky)
    """
)


def install(root: Path, entry: str, module: str, code: str) -> None:
    """A real distribution (package + dist-info) whose entry point is named ``entry``."""
    (root / module).mkdir(parents=True)
    (root / module / "__init__.py").write_text(code)
    dist = root / f"{module}-1.2.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.2\n")
    (dist / "entry_points.txt").write_text(f"[hostler]\n{entry} = {module}\n")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "site"
    install(root, "toy", "contract_toy", TOY)
    install(root, "mlx", "contract_mlx", THIRD_PARTY_MLX)
    install(root, "sneaky", "contract_sneaky", RESERVED)
    monkeypatch.syspath_prepend(str(root))
    return root


# -- engine names (PL1) -----------------------------------------------------------------------


def test_the_engine_name_rule_is_one_public_function() -> None:
    assert engine_name_problem("llamacpp") is None
    assert engine_name_problem("a") is None
    assert engine_name_problem("x" * ENGINE_NAME_MAX) is None
    assert engine_name_problem("x" * (ENGINE_NAME_MAX + 1)) is not None
    assert engine_name_problem("My-Engine") is not None
    assert engine_name_problem("-lead") is not None
    assert engine_name_problem("a:b") is not None
    assert engine_name_problem("") is not None
    assert engine_name_problem("unavailable") == "'unavailable' is reserved by hostler"


def test_a_real_built_in_keeps_its_name_and_a_reserved_name_is_refused(site: Path) -> None:
    host = PluginHost().load()
    # the built-in mlx plugin now registers its adapter: it is no placeholder, and a third
    # party's plugin of the same name is refused (PL1), as one over llamacpp would be
    mlx = host.plugins["mlx"]
    assert (mlx.status, mlx.version) == ("failed", "1.2")  # the third party's record
    assert mlx.error == "load: a second plugin is named 'mlx'; ignored"
    assert host.owners["mlx"] == "mlx" and host.adapters["mlx"].__module__ == "hostler_mlx.adapter"
    sneaky = host.plugins["sneaky"]
    assert sneaky.status == "failed"
    assert (
        sneaky.error == "register_engines: Sneaky.engine_type 'unavailable' is reserved by hostler"
    )
    assert host.plugins["llamacpp"].engines == ["llamacpp"]  # a real built-in keeps its name


def test_a_config_refuses_a_reserved_engine_name(tmp_path: Path) -> None:
    config = tmp_path / "h.toml"
    config.write_text('[[models]]\nid = "m"\nengine = "unavailable"\npath = "m.gguf"\n')
    with pytest.raises(UsageError, match=r"models\[0\]\.engine: .*not a reserved one"):
        load_config(config)


# -- options (RD6) ----------------------------------------------------------------------------


def test_options_come_from_the_engine_defaults_then_the_model(tmp_path: Path) -> None:
    config = tmp_path / "h.toml"
    config.write_text(
        "[engine_defaults.llamacpp.options]\nthreads = 2\nmlock = true\n"
        '\n[[models]]\nid = "m"\npath = "m.gguf"\noptions = { threads = 4 }\n'
        '\n[[engines]]\nkey = "llamacpp:e:0"\nmodel = "e.gguf"\n'
    )
    loaded = load_config(config)
    model, engine = loaded.engines[1], loaded.engines[0]
    assert model.options == {"threads": 4, "mlock": True}
    assert model.options_from == {
        "threads": f"{config}: models[0].options",
        "mlock": f"{config}: engine_defaults.llamacpp.options",
    }
    assert engine.options == {"threads": 2, "mlock": True}
    check_engine_options(loaded.engines, PluginHost().load())  # all known to llama.cpp


def test_an_unknown_or_mistyped_option_is_one_line_naming_file_and_key(tmp_path: Path) -> None:
    config = tmp_path / "h.toml"
    config.write_text('[[models]]\nid = "m"\npath = "m.gguf"\noptions = { thread = 4 }\n')
    plugins = PluginHost().load()
    with pytest.raises(UsageError) as caught:
        check_engine_options(load_config(config).engines, plugins)
    message = caught.value.message
    assert message.startswith(f"{config}: models[0].options.thread: unknown option for engine ")
    assert "'llamacpp' (known: batch_size, cache_reuse," in message and "\n" not in message
    config.write_text(
        '[engine_defaults.llamacpp.options]\nmlock = "yes"\n[[models]]\nid = "m"\npath = "m.gguf"\n'
    )
    with pytest.raises(
        UsageError,
        match=r"engine_defaults\.llamacpp\.options\.mlock: should be bool \(got 'yes'\)$",
    ):
        check_engine_options(load_config(config).engines, plugins)


def test_an_options_schema_types_values_strictly() -> None:
    schema: dict[str, OptionType] = {
        "n": int,
        "r": float,
        "s": str,
        "b": bool,
        "either": (int, str),
    }
    ok = {"n": 1, "r": 2, "s": "x", "b": False, "either": "all"}
    assert validate_options(ok, schema, where="f", engine="e") == ok
    assert validate_options({"r": 0.5, "either": 3}, schema, where="f", engine="e")
    for bad in ({"n": True}, {"n": 1.5}, {"r": True}, {"s": 1}, {"b": 0}, {"either": 1.0}):
        with pytest.raises(UsageError, match=r"^f\.\w+: should be "):
            validate_options(bad, schema, where="f", engine="e")
    with pytest.raises(UsageError, match=r"^f\.x: unknown option for engine 'e' \(known: none\)$"):
        validate_options({"x": 1}, {}, where="f", engine="e")


# -- preview of an adapter's own geometry (RD4) ----------------------------------------------


def toy_model(root: Path) -> Path:
    folder = root / "toy-0.5B-model"  # a dot in a folder's name is no extension
    folder.mkdir()
    config = {
        "model_type": "qwen2",
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "hidden_size": 64,
        "max_position_embeddings": 2048,
        "bytes": 50 * 2**20,
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_preview_prices_an_adapter_supplied_geometry(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = toy_model(tmp_path)
    ledger = str(tmp_path / "ledger.db")
    status = main(["preview", str(model), "--engine", "toy", "--ctx", "1024", "--slots", "1",
                   "--ledger", ledger, "--json"])  # fmt: skip
    out, err = capsys.readouterr()
    assert status == 0, err
    plan = json.loads(out)
    assert plan["admitted"] is True and plan["architecture"] == "qwen2"
    assert (plan["context_window"], plan["slots"]) == (1024, 1)
    assert plan["estimated_bytes"] == 50 * 2**20 + 1000 * 1024  # the adapter's own price
    assert plan["reserved_bytes"] == plan["estimated_bytes"]  # learning: nothing yet
    assert main(["preview", str(model), "--engine", "toy", "--ledger", ledger]) == 0
    assert capsys.readouterr().out.startswith("model    toy-0.5B-model (qwen2,")
    status = main(["preview", str(model / "config.json"), "--engine", "toy", "--ledger", ledger])
    _out, err = capsys.readouterr()
    assert status == 1 and "config.json: is a file, not a model directory" in err


def test_preview_of_an_engine_no_plugin_provides_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = toy_model(tmp_path)
    status = main(["preview", str(model), "--engine", "nosuch", "--ledger", str(tmp_path / "l")])
    _out, err = capsys.readouterr()
    assert status != 0 and "no plugin provides engine 'nosuch'" in err
    assert len(err.strip().splitlines()) == 1


# -- quiet by default (item 7) ----------------------------------------------------------------


def test_the_state_machine_library_says_nothing_below_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)  # a host program that logs everything
    engine = Engine("llamacpp:m:0")
    engine.fire("start", at=1.0, cause="test")
    assert engine.state == "starting"
    assert [r for r in caplog.records if r.name.startswith("transitions")] == []
    assert logging.getLogger("transitions").level == logging.WARNING


# -- a real daemon: options reach the engine, ps shows its port, quiet output ---------------


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    write_tiny_llama(tmp_path / "tiny.gguf")
    config = tmp_path / "hostler.toml"
    config.write_text(
        '[daemon]\nidle_timeout = 0\nledger = "ledger.db"\n[server]\nport = 0\nauth = "none"\n'
        "[engine_defaults.llamacpp.options]\nthreads = 2\n"
        '[[models]]\nid = "tiny"\npath = "tiny.gguf"\nctx = 512\nautostart = true\n'
        "extra_args = { seed = 7 }\n"
    )
    data = tmp_path / "data"
    yield config, data
    kill_leftovers(data)


def test_a_served_engine_gets_its_options_shows_its_port_and_the_output_is_quiet(
    served: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, data = served
    log = tmp_path / "serve.log"
    daemon = start_daemon(config, data, log, command="serve")
    key = "llamacpp:tiny:0"
    try:
        port = served_port(log)
        wait_for(lambda: count(data, key, "engine.ready") == 1, timeout=120)
        _state, pid, engine_port = engines(data)[key]
        argv = psutil.Process(pid).cmdline()
        assert argv[argv.index("--threads") + 1] == "2"  # [engine_defaults.llamacpp.options]
        assert argv[argv.index("--seed") + 1] == "7"  # extra_args, placed by the adapter
        assert argv.count("--seed") == 1
        status = main(["ps", "--url", f"http://127.0.0.1:{port}"])
        out, err = capsys.readouterr()
        assert status == 0, err
        header = out.splitlines()[0].split()
        assert header[header.index("PID") + 1] == "PORT"
        row = next(line for line in out.splitlines() if line.startswith(key)).split()
        assert row[row.index(str(pid)) + 1] == str(engine_port)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/engines", timeout=10) as r:
            assert json.loads(r.read())["engines"][0]["port"] == engine_port
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
    text = log.read_text()
    assert "serving on http://" in text  # hostler's own lines are there
    assert "Executed callback" not in text and "transitions" not in text


# -- the engine's slot limit (S8) -------------------------------------------------------------


def test_a_config_asking_a_serial_engine_for_two_slots_stops_the_start(tmp_path: Path) -> None:
    config = tmp_path / "h.toml"
    plugins = PluginHost().load()
    config.write_text('[[models]]\nid = "m"\nengine = "ds4"\npath = "m.gguf"\nslots = 1\n')
    check_engine_options(load_config(config).engines, plugins)  # one slot: the engine's limit
    config.write_text('[[models]]\nid = "m"\nengine = "ds4"\npath = "m.gguf"\nslots = 2\n')
    with pytest.raises(UsageError) as caught:
        check_engine_options(load_config(config).engines, plugins)
    assert caught.value.message == (
        "ds4:m:0: slots = 2, but engine 'ds4' serves at most 1 at once; set slots to 1 or fewer"
    )
    config.write_text('[[models]]\nid = "m"\npath = "m.gguf"\nslots = 8\n')
    check_engine_options(load_config(config).engines, plugins)  # llama.cpp: no limit of its own


def test_preview_keeps_an_automatic_plan_within_the_engines_slots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = write_tiny_llama(tmp_path / "flash.gguf")
    ledger = str(tmp_path / "ledger.db")
    common = [str(model), "--ledger", ledger, "--json", "--standalone"]
    monkeypatch.setenv("HOSTLER_CAPACITY_BUDGET_GB", "64")  # S1: a tier of 4 slots
    assert main(["preview", *common]) == 0
    assert json.loads(capsys.readouterr().out)["slots"] == 4  # llama.cpp: no limit of its own
    assert main(["preview", *common, "--engine", "ds4"]) == 0
    assert json.loads(capsys.readouterr().out)["slots"] == 1
    assert main(["preview", *common, "--engine", "ds4", "--slots", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["slots"] == 1
    assert main(["preview", *common, "--engine", "ds4", "--slots", "2"]) != 0
    _out, err = capsys.readouterr()
    assert err.strip().endswith(
        "slots: 2 is more than engine 'ds4' serves at once (at most 1); set slots to 1 or fewer"
    )


def test_an_adapters_slot_limit_is_checked_when_it_is_declared() -> None:
    for bad in (0, -1, 1.0, True, 1025):
        with pytest.raises(ValueError, match="max_slots must be None or an int from 1 to 1024"):
            type("Bad", (EngineAdapter,), {"max_slots": bad})
    for good in (None, 1, 1024):
        made: type[EngineAdapter] = type("Good", (EngineAdapter,), {"max_slots": good})
        assert made.max_slots == good


def test_an_engines_kv_types_are_checked_at_start_and_in_preview(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "h.toml"
    plugins = PluginHost().load()
    config.write_text('[[models]]\nid = "m"\nengine = "mlx"\npath = "m"\nkv_type = "q8_0"\n')
    with pytest.raises(UsageError) as caught:
        check_engine_options(load_config(config).engines, plugins)
    assert caught.value.message == (
        "mlx:m:0: kv_type = 'q8_0', but engine 'mlx' supports f16 only; set one of them or "
        "leave it unset"
    )
    config.write_text('[[models]]\nid = "m"\nengine = "mlx"\npath = "m"\nkv_type = "f16"\n')
    check_engine_options(load_config(config).engines, plugins)
    model = write_tiny_mlx(tmp_path / "tiny-mlx")
    common = [str(model), "--engine", "mlx", "--ledger", str(tmp_path / "l.db"), "--json"]
    assert main(["preview", *common]) == 0
    assert json.loads(capsys.readouterr().out)["kv_type"] == "f16"  # not llama.cpp's q8_0
    assert main(["preview", *common, "--kv", "q8_0"]) != 0
    _out, err = capsys.readouterr()
    assert "kv_type 'q8_0': engine 'mlx' supports f16 only" in err
    assert len(err.strip().splitlines()) == 1


def test_an_adapters_kv_types_are_checked_when_declared() -> None:
    for bad in ((), ["f16"], ("F16",), ("",), ("f16", 8), tuple(f"q{i}" for i in range(17))):
        with pytest.raises(ValueError, match="kv_types must be None or a tuple of 1 to 16"):
            type("Bad", (EngineAdapter,), {"kv_types": bad})
    for good in (None, ("f16",), tuple(f"q{i}" for i in range(16))):
        made: type[EngineAdapter] = type("Good", (EngineAdapter,), {"kv_types": good})
        assert made.kv_types == good


def test_an_options_schema_is_names_to_option_types() -> None:
    """RD6: a schema is checked where it is declared (and again where it registers)."""
    for good in ({}, {"n": int, "r": (int, float), "s": str, "b": bool}, {"x" * 64: str}):
        assert options_schema_problem(good) is None
    assert options_schema_problem({f"o{i}": int for i in range(256)}) is None
    problems = {
        "not a mapping": (["n"], "must map option names to types, not list"),
        "257 options": ({f"o{i}": int for i in range(257)}, "more than 256 options"),
        "empty name": ({"": int}, "key '' is not an option name"),
        "long name": ({"x" * 65: int}, "is not an option name"),
        "control": ({"a\nb": int}, "is not an option name"),
        "type name": ({"t": "float"}, "options_schema['t'] is 'float': use bool, int, float, str"),
        "other type": ({"t": list}, "options_schema['t'] is <class 'list'>"),
        "empty tuple": ({"t": ()}, "options_schema['t'] is ()"),
        "mixed tuple": ({"t": (int, bytes)}, "options_schema['t'] is (<class 'int'>, <class 'b"),
    }
    for case, (schema, expected) in problems.items():
        problem = options_schema_problem(schema)
        assert problem is not None and expected in problem, case
    with pytest.raises(ValueError, match=r"Bad\.options_schema\['t'\] is 'float'"):
        type("Bad", (EngineAdapter,), {"options_schema": {"t": "float"}})


def test_engine_defaults_options_are_checked_even_when_no_model_uses_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = tmp_path / "h.toml"
    plugins = PluginHost().load()
    config.write_text(
        '[engine_defaults.sdcpp.options]\nbogus = 1\n[[models]]\nid = "m"\npath = "m.gguf"\n'
    )
    loaded = load_config(config)
    with pytest.raises(UsageError) as caught:
        check_engine_options(loaded.engines, plugins, loaded.default_options)
    assert caught.value.message.startswith(
        f"{config}: engine_defaults.sdcpp.options.bogus: unknown option for engine 'sdcpp'"
    )
    config.write_text(
        "[engine_defaults.sdcpp.options]\nsteps = 4\n[engine_defaults.mxl.options]\nx = 1\n"
    )
    loaded = load_config(config)
    with caplog.at_level(logging.WARNING, logger="hostler.daemon"):
        check_engine_options(loaded.engines, plugins, loaded.default_options)
    assert [r.getMessage() for r in caplog.records] == [
        f"hostler: {config}: engine_defaults.mxl.options: no loaded plugin provides engine "
        "'mxl'; unused"
    ]


def daemon_refuses(tmp_path: Path, toml: str) -> subprocess.CompletedProcess[str]:
    """`hostler daemon --config` on ``toml``; it must refuse it (one line) before it starts.

    A daemon that accepted the config records ``daemon.started`` in its log: that, not a
    wall-clock limit a loaded machine could overrun, tells a refusal from an acceptance.
    """
    from hostler.testing.tiny_mlx import write_tiny_mlx

    from _daemons import daemon_starts
    from _support import REPO, untermed

    write_tiny_mlx(tmp_path / "tiny")
    config = tmp_path / "hostler.toml"
    config.write_text(toml)
    data = tmp_path / "data"
    argv = [sys.executable, "-c", "import sys; from hostler.cli import main; sys.exit(main())"]
    argv += ["daemon", "--config", str(config), "--data-dir", str(data)]
    out, err = tmp_path / "daemon.out", tmp_path / "daemon.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            argv,
            stdout=stdout,
            stderr=stderr,
            cwd=REPO / "tests",
            env={**untermed(os.environ), "PYTHONDONTWRITEBYTECODE": "1", **cli_env(tmp_path)},
        )
    try:
        while proc.poll() is None:
            if daemon_starts(data):
                pytest.fail("hostler daemon accepted the config and started")
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    done = subprocess.CompletedProcess(argv, proc.returncode, out.read_text(), err.read_text())
    assert_one_line_error(done)
    return done


MLX_MODEL = """
[[models]]
id = "m"
engine = "mlx"
path = "tiny"
autostart = false
"""


def test_an_unknown_option_in_engine_defaults_stops_the_daemon_even_with_no_model_of_it(
    tmp_path: Path,
) -> None:
    """`[engine_defaults.sdcpp.options] bogus = 1` is an unknown key: one line, no start.

    daemon.md: engine_defaults options are "checked against its adapter's schema when the
    daemon starts"; reference.md: "an unknown key or a wrong type stops the daemon". Today
    hostler.daemon.check_engine_options checks only the options merged into a configured
    model, so a typo in the defaults of an engine no model uses yet (or of a misspelled
    engine, `[engine_defaults.mxl]`) is silently ignored and the daemon runs.
    """
    done = daemon_refuses(tmp_path, "[engine_defaults.sdcpp.options]\nbogus = 1\n" + MLX_MODEL)
    assert "bogus" in done.stderr


@pytest.mark.parametrize("flag", ["", "-", "--"], ids=["empty", "dash", "dashdash"])
def test_an_extra_args_key_that_is_no_flag_is_refused_where_the_config_is_read(
    tmp_path: Path, flag: str
) -> None:
    """extra_args keys are flag names; `"" = "x"` would become argv `-- x` (end of options).

    The one rule (extra_args_argv, hostler.plugin) turns a key `""` into `--` and `-`/`--`
    are used as written, so the engine's own parser sees "end of options" and the value as
    a positional: the start fails later, inside the engine, not at the edge. Today the
    config's _arguments validator (hostler.config) checks only NUL and finite floats.
    """
    daemon_refuses(tmp_path, MLX_MODEL + f'extra_args = {{ "{flag}" = "x" }}\n')


BAD_SCHEMA_PLUGIN = """
from hostler.plugin import hookimpl
from hostler.testing.fake_engine import FakeEngineAdapter


class BadSchema(FakeEngineAdapter):
    engine_type = "badschema"
    options_schema = {"temperature": "float"}  # a type's name, not a type


@hookimpl
def register_engines(register):
    register(BadSchema)
"""


def test_a_plugin_whose_options_schema_is_not_types_fails_alone_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`options_schema = {"temperature": "float"}` disables that plugin, or is one line.

    Either PluginHost refuses the plugin when it registers (plugin.failed naming
    options_schema), or checking a config against it is a one-line UsageError/PluginError.
    Today the plugin loads "ok" (hostler.pluginhost.PluginHost._check never looks at
    options_schema) and hostler.daemon.check_engine_options -> hostler.plugin._fits raises a
    raw TypeError ("isinstance() arg 2 must be a type...") for the operator's valid config.
    """
    from importlib.metadata import EntryPoint

    from hostler.config import EngineConfig
    from hostler.daemon import check_engine_options
    from hostler.errors import UsageError
    from hostler.pluginhost import PluginHost

    (tmp_path / "badschema_plugin.py").write_text(BAD_SCHEMA_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    point = EntryPoint("badschema", "badschema_plugin", "hostler")
    host = PluginHost(entry_points_source=lambda: [point]).load()
    if host.plugins["badschema"].status != "ok":
        return  # refused where it registered: the plugin fails alone
    engine = EngineConfig(
        key="badschema:m:0", model=tmp_path / "m.bin", options={"temperature": 0.5}
    )
    try:
        check_engine_options([engine], host)
    except (UsageError, PluginError):
        return
    except Exception as exc:
        pytest.fail(f"{type(exc).__name__}: {exc}")
    pytest.fail("a schema of type names was used to accept the options")
