"""Breaks of the plugin contract (issue 12) found by a hostile round.

Each test states the promised behaviour and fails today for the reason its docstring names.
Real files, real FIFOs, real processes and the real CLI: nothing is mocked.
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

import anyio
import pytest

import test_contract as contract
from hostler import EventStore
from hostler.errors import EngineStartError, ModelFileError, PluginError
from hostler.plugin import LaunchCommand, LaunchSpec, ReadinessProbe
from hostler.testing.fake_engine import FakeEngineAdapter
from hostler_mlx import MlxAdapter

from _support import run_cli

GIB = 2**30


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cli_env(tmp_path: Path) -> dict[str, str]:
    """A private HOME and data directory for one CLI run (never the user's)."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {
        "HOME": str(home),
        "HOSTLER_HOME": str(home / "data"),
        "XDG_DATA_HOME": str(home / "xdg"),
        "HOSTLER_LEDGER": str(home / "ledger.db"),
    }


def mlx_folder(tmp_path: Path, name: str, config: str | None) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_text(config)
    (folder / "model.safetensors").write_bytes(b"\0" * 1024)
    return folder


def assert_one_line_error(done: subprocess.CompletedProcess[str]) -> None:
    """Promise 9: a refused input is ONE line `hostler: error [...]`, never a traceback."""
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.returncode not in (0, None), done.stdout[-500:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("hostler: error"), done.stderr[-2000:]


# --- 1. model files: config.json is outside input (promise 9, RD2/RD3) -----------------------


def test_a_deeply_nested_mlx_config_json_is_one_line_not_a_recursion_error(
    tmp_path: Path,
) -> None:
    """A 400 KiB config.json of nested arrays is a bad model, refused in one line.

    Today json.loads raises RecursionError, which read_config (hostler_mlx.geometry) does not
    catch (it catches ValueError/UnicodeDecodeError only): validate_model raises a raw
    RecursionError and `hostler preview --engine mlx` prints a traceback.
    """
    depth = 200_000
    folder = mlx_folder(tmp_path, "nested", '{"a": ' + "[" * depth + "]" * depth + "}")
    with pytest.raises(ModelFileError):
        MlxAdapter().validate_model(folder)
    done = run_cli("preview", "--engine", "mlx", "--standalone", str(folder), env=cli_env(tmp_path))
    assert_one_line_error(done)


def test_an_mlx_config_json_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    """config.json as a named pipe: refused at once in one line, as a FIFO model file is.

    Today read_config (hostler_mlx.geometry) checks only st_size (0 for a FIFO) and then
    read_bytes() blocks forever: `hostler preview --engine mlx DIR` hangs (and so does
    validate_model at daemon start, for every engine configured after it).
    """
    folder = mlx_folder(tmp_path, "piped", None)
    os.mkfifo(folder / "config.json")
    try:
        done = run_cli(
            "preview", "--engine", "mlx", "--standalone", str(folder),
            env=cli_env(tmp_path), timeout=15,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("hostler preview blocked for 15 s reading a FIFO config.json")
    assert_one_line_error(done)
    assert "fifo" in done.stderr.lower() or "named pipe" in done.stderr.lower()


# --- 2. readiness probes a plugin builds (RD1) ------------------------------------------------


def start_with_probe(tmp_path: Path, make_probe: object) -> BaseException | None:
    """Start the scripted engine with the probe ``make_probe()`` builds; what the start raised."""
    model = tmp_path / "model.bin"
    model.write_bytes(b"weights")

    class Probed(contract.Scripted):
        def readiness(self, spec: LaunchSpec) -> ReadinessProbe:
            return make_probe()  # type: ignore[operator,no-any-return]

    async def main() -> BaseException | None:
        with EventStore.open(tmp_path / "events.db", owner=True) as store:
            sup = contract.supervisor(
                store, Probed(tmp_path, load=0.1), model, tmp_path / "work", startup_timeout=5.0
            )
            try:
                await sup.ensure_running()
            except BaseException as exc:
                assert sup.pid is None, "a failed start left its engine running"
                return exc
            finally:
                await sup.stop()
            return None

    return anyio.run(main)


def test_a_non_ascii_probe_path_fails_where_it_is_made(tmp_path: Path) -> None:
    """A probe path HTTP cannot carry is the plugin's error, never a stray exception.

    readiness.md: "An invalid probe fails where the adapter builds it: ValueError ...". Either
    ReadinessProbe refuses the path (ValueError), or the start fails as the plugin's error
    (PluginError / EngineStartError naming it) with nothing left running. Today
    ReadinessProbe.__post_init__ (hostler.plugin) checks only the leading '/': a non-ASCII
    path escapes Supervisor.ensure_running as a raw UnicodeEncodeError from
    hostler.engines.http.probe_response (`.encode("ascii")` of the request line). (A CR/LF
    or space in the path is also accepted and written verbatim into the request line.)
    """
    path = "/h\u00e9alth"
    try:
        ReadinessProbe(path=path)
    except ValueError:
        return  # refused where it is made: the documented behaviour
    raised = start_with_probe(tmp_path, lambda: ReadinessProbe(path=path))
    assert isinstance(raised, PluginError | EngineStartError), repr(raised)


def test_a_probe_method_other_than_get_or_post_fails_where_it_is_made() -> None:
    """`method` is GET or POST (readiness.md); anything else is a ValueError at construction.

    Today ReadinessProbe.__post_init__ (hostler.plugin) never looks at `method`: a
    Literal["GET", "POST"] is not enforced at run time, so `method="DELETE"` or a method
    holding CR/LF is accepted and sent to the engine as the request line.
    """
    for method in ("DELETE", "GET /other HTTP/1.1\r\nX: y\r\n\r\nGET", "get"):
        with pytest.raises(ValueError, match=r"(?i)method"):
            ReadinessProbe(path="/health", method=method)  # type: ignore[arg-type]


def start_adapter(tmp_path: Path, adapter_class: type[contract.Scripted]) -> BaseException | None:
    """Start ``adapter_class`` (a scripted engine) under the real supervisor; what it raised."""
    model = tmp_path / "model.bin"
    model.write_bytes(b"weights")

    async def main() -> BaseException | None:
        with EventStore.open(tmp_path / "events.db", owner=True) as store:
            sup = contract.supervisor(
                store, adapter_class(tmp_path, load=0.3), model, tmp_path / "work",
                startup_timeout=5.0,
            )  # fmt: skip
            try:
                await sup.ensure_running()
            except BaseException as exc:
                return exc
            finally:
                await sup.stop()
            return None

    return anyio.run(main)


def test_a_classify_line_hook_that_returns_junk_is_the_plugins_error(tmp_path: Path) -> None:
    """classify_line returning a non-Panic fails the start as a PluginError naming the hook.

    A readiness() that returns junk is already a PluginError naming the plugin
    (test_contract.py), and so is a classify_line that raises. Today a classify_line that
    *returns* junk (a str) escapes the supervisor as a raw AttributeError ("'str' object has
    no attribute 'fatal_at_startup'", hostler.engines.supervisor reading the line), not the
    plugin's error.
    """

    class Junk(contract.Scripted):
        def classify_line(self, line: str) -> object:  # type: ignore[override]
            return "fatal"

    raised = start_adapter(tmp_path, Junk)
    assert isinstance(raised, PluginError), repr(raised)
    assert "classify_line" in str(raised)


def test_an_is_ready_response_hook_that_returns_junk_is_the_plugins_error(
    tmp_path: Path,
) -> None:
    """is_ready_response must return a bool; anything else is the plugin's error, not 'ready'.

    Today the supervisor takes any truthy return as ready: an is_ready_response that returns
    the string "no" (or a dict, or a coroutine from an accidental `async def`) declares the
    engine ready while it is still loading, where a junk readiness() return is refused as a
    PluginError.
    """

    class Junk(contract.Scripted):
        def is_ready_response(self, status: int, body: bytes) -> bool:
            return "no"  # type: ignore[return-value]

    raised = start_adapter(tmp_path, Junk)
    assert isinstance(raised, PluginError), repr(raised)


# --- 3. MLX pricing and admission (promises 3 and 6) -----------------------------------------

QWEN_LIKE = {
    "model_type": "qwen3",
    "hidden_size": 1024,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 131072,
    "vocab_size": 151936,
}


def preview_json(tmp_path: Path, folder: Path, *args: str, budget_gb: int) -> dict[str, object]:
    env = {**cli_env(tmp_path), "HOSTLER_CAPACITY_BUDGET_GB": str(budget_gb)}
    done = run_cli("preview", "--engine", "mlx", "--json", *args, str(folder), env=env)
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_an_mlx_model_that_fits_at_f16_is_admitted_and_planned_at_f16(tmp_path: Path) -> None:
    """MLX holds its KV at f16 (M5); the plan sizes the window at f16, so what fits is admitted.

    A 28-layer model (f16 KV 112 KiB/token) with 300 MiB of weights under a 12 GiB budget:
    `hostler preview --engine mlx --kv f16` admits it at a 79,872-token window (9.8 GiB).
    Today the planner (hostler.engines.price.price_engine -> the llama.cpp KV trade) offers
    MLX q8_0, sizes the window with q8_0's half price (131,072 tokens), then prices that
    window with MlxAdapter.estimate_footprint, which is f16 (15.3 GiB): the launch is
    REFUSED under every budget where the native window does not fit, though a smaller window
    at f16 would. `hostler preview` also shows "KV q8_0" and a q8_0 per-token price for an
    engine that cannot quantize its cache.
    """
    folder = mlx_folder(tmp_path, "qwen-like", json.dumps(QWEN_LIKE))
    os.truncate(folder / "model.safetensors", 300 * 2**20)
    plan = preview_json(tmp_path, folder, budget_gb=12)
    assert plan["kv_type"] == "f16", plan
    assert plan["admitted"] is True, plan["denial"]
    assert isinstance(plan["reserved_bytes"], int) and plan["reserved_bytes"] <= 12 * GIB


def test_an_mlx_model_of_unknown_geometry_is_planned_serial(tmp_path: Path) -> None:
    """M6: unknown geometry -> one slot; the plan, the price and the argv agree on serial.

    Today MlxAdapter.build_command launches `--decode-concurrency 1`, and estimate_mlx prices
    one slot, but the planner still plans several (3 under a 32 GiB budget: `hostler preview`
    shows "--parallel 3", and the runtime counts 3 slots for an engine that serves one
    request at a time).
    """
    folder = mlx_folder(tmp_path, "unknown", json.dumps({"model_type": "llama"}))
    os.truncate(folder / "model.safetensors", 300 * 2**20)
    plan = preview_json(tmp_path, folder, budget_gb=32)
    assert plan["slots"] == 1, plan


# --- 4. options and extra_args from the config (promise 4) ------------------------------------


def daemon_refuses(tmp_path: Path, toml: str) -> subprocess.CompletedProcess[str]:
    """`hostler daemon --config` on ``toml``; it must refuse it (one line) within 10 s."""
    from hostler.testing.tiny_mlx import write_tiny_mlx

    write_tiny_mlx(tmp_path / "tiny")
    config = tmp_path / "hostler.toml"
    config.write_text(toml)
    args = ("daemon", "--config", str(config), "--data-dir", str(tmp_path / "data"))
    try:
        done = run_cli(*args, env=cli_env(tmp_path), timeout=10)
    except subprocess.TimeoutExpired:
        pytest.fail("hostler daemon accepted the config and ran (killed after 10 s)")
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


# --- 5. a crash at the worst moment -----------------------------------------------------------


def test_an_engine_that_died_before_its_stop_is_recorded_as_crashed_not_stopped(
    tmp_path: Path,
) -> None:
    """An engine SIGKILLed from outside, then stopped (an eviction) before the watch looked.

    Found with sd-cpp: kill sd-server mid-image; the render's client gets RemoteDisconnected,
    the `image` lease is released (good), the waiting chat's GA1 eviction then stops the
    already-dead sd-server 12 ms later, and the log says `engine.stop_requested
    reason=evicted` + `engine.stopped signal=9`: the crash is never recorded (no
    engine.crashed, no output tail, nothing for `hostler explain` or the restart budget).
    Cause: Supervisor._stop_locked (hostler.engines.supervisor) signals and reaps without
    asking whether the process had already exited, and records its status as the stop's.
    Expected: the death it did not cause is recorded as a crash (engine.crashed with
    signal 9), whatever stop was asked afterwards.
    """
    model = tmp_path / "model.bin"
    model.write_bytes(b"weights")

    async def main() -> list[str]:
        with EventStore.open(tmp_path / "events.db", owner=True) as store:
            sup = contract.supervisor(
                store, contract.Scripted(tmp_path, load=0.0), model, tmp_path / "work",
                watch_interval=30.0,
            )  # fmt: skip
            await sup.ensure_running()
            pid = sup.pid
            assert pid is not None
            os.kill(pid, 9)  # the engine dies on its own (OOM killer, a bug, an operator)
            await anyio.sleep(0.3)  # it is dead; the watch has not looked yet
            await sup.stop("evicted", {"rule": "GA1"})
            return [r.type for r in store.read_all() if r.stream_id == f"engine/{sup.key}"]

    types = anyio.run(main)
    assert "engine.crashed" in types, types


# --- 6. the conformance suite against an adapter that lies (promise 7) ------------------------

pytest_plugins = ["pytester"]

WIDE_OPEN_PLUGIN = """
from pathlib import Path

from hostler.plugin import LaunchCommand, hookimpl
from hostler.testing.fake_engine import SERVER, FakeEngineAdapter

#: the fake engine, listening on every interface: its launch names no address at all
EVERYWHERE = Path(__file__).with_name("wide_server.py")
TEXT = SERVER.read_text().replace('("127.0.0.1", port)', '("0.0.0.0", port)')
assert '("0.0.0.0", port)' in TEXT
EVERYWHERE.write_text(TEXT)


class Everywhere(FakeEngineAdapter):
    engine_type = "everywhere"

    def build_command(self, spec):
        command = super().build_command(spec)
        argv = list(command.argv)
        argv[1] = str(EVERYWHERE)
        return LaunchCommand(argv, dict(command.env))


@hookimpl
def register_engines(register):
    register(Everywhere)
"""

WIDE_OPEN_SUITE = """
import pytest

import wide_plugin
from hostler.testing.conformance import AdapterConformance


class TestEverywhere(AdapterConformance):
    stop_grace = 1.0
    startup_timeout = 10.0

    @pytest.fixture
    def adapter(self):
        return wide_plugin.Everywhere()

    @pytest.fixture
    def model(self, tmp_path):
        path = tmp_path / "weights.bin"
        path.write_bytes(b"x" * 64)
        return path

    @pytest.fixture
    def plugin_module(self):
        return wide_plugin
"""


def test_the_conformance_suite_fails_an_engine_that_listens_on_every_interface(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine reachable from the network fails the suite ("Engines bind 127.0.0.1").

    The adapter's engine (the fake engine, bound to 0.0.0.0 — as many servers do when no
    --host is given) names no address in its launch. Today every check passes:
    AdapterConformance.test_binds_loopback_only (hostler.testing.conformance) only parses
    IP literals in argv/env text (so no flag, `--host 0`, `--host localhost.` or
    `0.0.0.0:PORT` all pass), and the live checks never look at the socket the real
    engine listens on. Expected: the live start checks the listening sockets of the engine's
    process group and fails a non-loopback one.
    """
    pytester.makepyfile(wide_plugin=WIDE_OPEN_PLUGIN, test_suite=WIDE_OPEN_SUITE)
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(pytester.path), path) if p))
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-k", "loopback or live_start", timeout=300
    )
    outcomes = result.parseoutcomes()
    ran = outcomes.get("passed", 0) + outcomes.get("failed", 0)
    assert ran == 2, "\n".join(result.outlines[-30:])  # both checks ran, for real
    assert outcomes.get("failed", 0) >= 1, "the suite passed an engine listening on 0.0.0.0"


# --- 7. environment settings: integers of any length (promise 9) ------------------------------

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


# --- 8. ds4 is strictly serial (promise 6) -----------------------------------------------------


def test_ds4_is_planned_and_previewed_with_one_slot(tmp_path: Path) -> None:
    """ds4 serves one request at a time: its plan has one slot, and --slots 3 is refused.

    README: "Strictly serial: one slot, one request at a time; slots above 1 is refused."
    Today `hostler preview --engine ds4 MODEL` plans 2 slots ("--parallel 2"), and
    `--slots 3` is planned as 3 slots: the planner (hostler.engines.price.price_engine) has
    no way to hear that an adapter is serial, so the preview/admission plan disagrees with
    the launch.
    """
    from hostler.testing.tiny_gguf import write_tiny_llama

    model = write_tiny_llama(tmp_path / "tiny.gguf")
    done = run_cli("preview", "--engine", "ds4", "--json", str(model), env=cli_env(tmp_path))
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert json.loads(done.stdout)["slots"] == 1
    three = run_cli("preview", "--engine", "ds4", "--slots", "3", str(model), env=cli_env(tmp_path))
    assert_one_line_error(three)


# --- 9. readiness bodies are outside input (promises 1 and 9) ---------------------------------

DEEP_BODY = b'{"a":' + b"[" * 30000 + b"]" * 30000 + b"}"  # 60 KiB: inside the 64 KiB read

DEEP_ENGINE = """
import http.server, sys
port = int(sys.argv[1])
BODY = b'{"a":' + b"[" * 30000 + b"]" * 30000 + b"}"
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)
    def log_message(self, *args):
        pass
print("listening", flush=True)
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def test_a_deeply_nested_readiness_body_is_not_ready_not_a_recursion_error(
    tmp_path: Path,
) -> None:
    """An engine whose /health answers 200 with 60 KiB of nested arrays is simply not ready.

    With `ReadinessProbe(path="/health", expect_json={"status": "ok"})` the start must time
    out ("did not become ready within 3 s"), as for any body without the field. Today
    hostler.plugin.json_fields_match catches only ValueError/UnicodeDecodeError around
    json.loads, so the engine's body raises RecursionError straight out of
    Supervisor.ensure_running in 0.06 s: an engine's HTTP body crashes hostler's own code.
    """
    script = tmp_path / "deep_engine.py"
    script.write_text(DEEP_ENGINE)
    model = tmp_path / "model.bin"
    model.write_bytes(b"weights")

    class Deep(contract.Scripted):
        def build_command(self, spec: LaunchSpec) -> LaunchCommand:
            return LaunchCommand([sys.executable, str(script), str(spec.port), str(spec.model)])

        def readiness(self, spec: LaunchSpec) -> ReadinessProbe:
            return ReadinessProbe(path="/health", expect_json={"status": "ok"})

    async def main() -> BaseException | None:
        with EventStore.open(tmp_path / "events.db", owner=True) as store:
            sup = contract.supervisor(
                store, Deep(tmp_path), model, tmp_path / "work", startup_timeout=3.0
            )
            try:
                await sup.ensure_running()
            except BaseException as exc:
                return exc
            finally:
                await sup.stop()
            return None

    raised = anyio.run(main)
    assert isinstance(raised, EngineStartError), repr(raised)
    assert "did not become ready" in str(raised)


def test_the_mlx_readiness_judges_a_deeply_nested_body_not_ready() -> None:
    """MlxAdapter.is_ready_response(200, <60 KiB of nested arrays>) is False, not an error.

    Today it raises RecursionError (hostler_mlx.adapter.MlxAdapter.is_ready_response catches
    ValueError/UnicodeDecodeError only); under the supervisor that turns an engine's odd
    answer into "the 'mlx' engine plugin raised RecursionError" and fails the engine.
    """
    assert MlxAdapter().is_ready_response(200, DEEP_BODY) is False


# --- 10. a readiness probe that hangs (slowloris engine) ---------------------------------------


class Hanging(FakeEngineAdapter):
    """The fake engine, probed on its /busy/60 endpoint: it accepts, then answers a minute later."""

    engine_type = "hanging"

    def readiness(self, spec: LaunchSpec) -> ReadinessProbe:
        return ReadinessProbe(path="/busy/60", wait=15)


def test_a_hanging_probe_does_not_stretch_the_start_timeout(tmp_path: Path) -> None:
    """The start's timeout bounds the whole wait, a probe in flight included.

    readiness.md: "After 180 s without readiness the start fails with `did not become ready
    within 180 s`". With startup_timeout=2 and a probe `wait=15` on an engine that accepts
    and never answers, today the start fails after ~15 s with the message "did not become
    ready within 2 s": the supervisor checks its deadline only between probes, and
    hostler.engines.http.probe_response runs for its full `wait` (up to 600 s).
    """
    model = tmp_path / "model.bin"
    model.write_bytes(b"weights")

    async def main() -> tuple[BaseException | None, float]:
        with EventStore.open(tmp_path / "events.db", owner=True) as store:
            sup = contract.supervisor(
                store, Hanging(), model, tmp_path / "work", startup_timeout=2.0
            )
            began = time.monotonic()
            try:
                await sup.ensure_running()
            except BaseException as exc:
                return exc, time.monotonic() - began
            finally:
                await sup.stop()
            return None, time.monotonic() - began

    raised, took = anyio.run(main)
    assert isinstance(raised, EngineStartError), repr(raised)
    assert took < 6.0, f"a 2 s start timeout ended after {took:.1f} s"


def test_a_stop_during_a_hanging_probe_ends_the_engine_promptly(tmp_path: Path) -> None:
    """A stop asked while the start waits on a hanging probe ends the engine in seconds.

    README: "SIGTERM stops every engine within 2 s whatever lock is held". Today
    Supervisor.stop() only sets an abort flag read "at its next readiness poll", which comes
    after the probe in flight times out: the stop takes the probe's `wait` (~14 s here; up to
    600 s for a legal probe), the engine running all along.
    """
    model = tmp_path / "model.bin"
    model.write_bytes(b"weights")

    async def main() -> float:
        with EventStore.open(tmp_path / "events.db", owner=True) as store:
            sup = contract.supervisor(
                store, Hanging(), model, tmp_path / "work", startup_timeout=120.0
            )

            async def start() -> None:
                with pytest.raises(EngineStartError):
                    await sup.ensure_running()

            async with anyio.create_task_group() as tg:
                tg.start_soon(start)
                await anyio.sleep(1.5)  # the first probe is in flight
                began = time.monotonic()
                await sup.stop()
                took = time.monotonic() - began
            assert sup.pid is None
            return took

    took = anyio.run(main)
    assert took < 5.0, f"the stop took {took:.1f} s"


# --- 11. extra_args / options values that start with '-' (promise 4) ---------------------------


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


# --- 12. the fake clock (promise 7) -------------------------------------------------------------


@pytest.mark.parametrize(
    "move",
    [
        lambda clock: clock.set(float("nan")),
        lambda clock: clock.advance(float("nan")),
        lambda clock: clock.advance(float("inf")),
    ],
    ids=["set-nan", "advance-nan", "advance-inf"],
)
def test_the_fake_clock_refuses_a_time_that_is_not_a_time(move: object) -> None:
    """FakeClock takes finite times only: NaN or infinity raise UsageError, like a step back.

    testing.md: "It never goes back: a negative step raises UsageError". Today
    FakeClock.set / advance (hostler.testing.harness) compare with `<`, which NaN passes,
    so `clock.set(nan)` is accepted and the clock reads NaN from then on (every idle and
    health decision under it then compares false); `advance(inf)` is accepted too.
    """
    from hostler.errors import UsageError
    from hostler.testing.harness import FakeClock

    clock = FakeClock()
    with pytest.raises(UsageError):
        move(clock)  # type: ignore[operator]
    assert clock() == 1_800_000_000.0


# --- 13. a plugin whose options_schema is junk (promises 4 and 9) ------------------------------

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
