"""``hostler serve``'s settings: flags > ``HOSTLER_*`` > the file > defaults, and who may listen.

The refusals run through the real CLI in a child process (exit 2, one line, nothing created);
one real ``hostler serve`` on port 0 shows the file's models, budget, binary and idle TTL at
work.
"""

from __future__ import annotations

import signal
import stat
import subprocess
from pathlib import Path

import httpx
import pytest

from hostler.cli.daemon import serve_config
from hostler.config import DEFAULT_HOST, DEFAULT_PORT
from hostler.errors import SettingError, UsageError
from hostler.serve.access import check_exposure
from hostler.settings_env import (
    ENV_VARIABLES,
    EnvOverrides,
    apply_overrides,
    read_overrides,
    valid_token,
)
from hostler.testing.tiny_gguf import write_tiny_llama

from _daemons import events, kill_leftovers, served_port, start_daemon, wait_for
from _support import run_cli

TOKEN = "t" * 40
FILE = """
[server]
host = "127.0.0.2"
port = 9000
auth = "token"
[daemon]
idle_timeout = 60
[budget]
bytes = 2147483648
spillover = true
[arbiter]
policy = "swap"
"""


def write(tmp_path: Path, text: str = FILE) -> Path:
    path = tmp_path / "hostler.toml"
    path.write_text(text)
    return path


def test_defaults_with_no_file_and_no_environment(tmp_path: Path) -> None:
    config = serve_config(None, tmp_path, environ={})
    assert (config.host, config.port, config.auth) == ("127.0.0.1", 11435, "token")
    assert (DEFAULT_HOST, DEFAULT_PORT) == ("127.0.0.1", 11435)
    assert (config.budget_bytes, config.spillover, config.arbiter) == (None, None, "auto")
    assert config.token is None and config.idle_timeout == 300.0
    assert config.data_dir == tmp_path.resolve()


def test_the_file_beats_the_defaults(tmp_path: Path) -> None:
    config = serve_config(write(tmp_path), tmp_path, environ={})
    assert (config.host, config.port) == ("127.0.0.2", 9000)
    assert (config.budget_bytes, config.spillover, config.arbiter) == (2**31, True, "swap")
    assert config.budget_from == f"config:{(tmp_path / 'hostler.toml').resolve()}"
    assert config.idle_timeout == 60


def test_the_environment_beats_the_file_and_flags_beat_both(tmp_path: Path) -> None:
    env = {
        "HOSTLER_HOST": "127.0.0.3",
        "HOSTLER_PORT": "9001",
        "HOSTLER_AUTH": "NONE",
        "HOSTLER_TOKEN": TOKEN,
        "HOSTLER_IDLE_TIMEOUT": "0",
        "HOSTLER_BUDGET_BYTES": "auto",
        "HOSTLER_SPILLOVER": "off",
        "HOSTLER_ARBITER": "coexist",
    }
    config = serve_config(write(tmp_path), tmp_path, environ=env)
    assert (config.host, config.port, config.auth, config.token) == (
        "127.0.0.3",
        9001,
        "none",
        TOKEN,
    )
    assert (config.idle_timeout, config.budget_bytes, config.spillover) == (0.0, "auto", False)
    assert config.budget_from == "env:HOSTLER_BUDGET_BYTES"  # recorded as the variable's
    assert config.arbiter == "coexist"
    flagged = serve_config(write(tmp_path), tmp_path, host="::1", port=0, environ=env)
    assert (flagged.host, flagged.port) == ("::1", 0)
    assert TOKEN not in repr(flagged)  # the secret stays out of logs and tracebacks


def test_hostler_config_names_the_file_when_no_flag_does(tmp_path: Path) -> None:
    path = write(tmp_path)
    assert serve_config(None, tmp_path, environ={"HOSTLER_CONFIG": str(path)}).port == 9000
    other = tmp_path / "other.toml"
    other.write_text("[server]\nport = 9002\n")
    chosen = serve_config(other, tmp_path, environ={"HOSTLER_CONFIG": str(path)})
    assert chosen.port == 9002


def test_hostler_models_dir_is_where_serve_without_a_file_looks(tmp_path: Path) -> None:
    shelf = tmp_path / "shelf"
    config = serve_config(None, tmp_path, environ={"HOSTLER_MODELS_DIR": str(shelf)})
    assert config.engines == ()
    assert config.discovery is not None
    assert config.discovery.places == (("models", shelf),)  # no HOME: no other place
    default = serve_config(None, tmp_path, environ={})
    assert default.discovery is not None
    assert default.discovery.places == (("models", tmp_path.resolve() / "models"),)


def places_of(tmp_path: Path, environ: dict[str, str]) -> dict[str, Path]:
    config = serve_config(None, tmp_path, environ=environ)
    assert config.discovery is not None
    return dict(config.discovery.places)


def test_each_source_is_found_where_its_own_program_keeps_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {"HOME": str(home)}
    assert places_of(tmp_path, env) == {
        "models": tmp_path.resolve() / "models",
        "huggingface": home / ".cache" / "huggingface" / "hub",
        "ollama": home / ".ollama" / "models",
        "lmstudio": home / ".lmstudio" / "models",
    }
    moved = {
        **env,
        "HF_HOME": str(tmp_path / "hf"),
        "OLLAMA_MODELS": str(tmp_path / "ol"),
        "XDG_CACHE_HOME": str(tmp_path / "xdg"),
    }
    places = places_of(tmp_path, moved)
    assert places["huggingface"] == tmp_path / "hf" / "hub"
    assert places["ollama"] == tmp_path / "ol"
    xdg = places_of(tmp_path, {**env, "XDG_CACHE_HOME": "/x"})
    assert xdg["huggingface"] == Path("/x/huggingface/hub")
    hub = places_of(tmp_path, {**moved, "HF_HUB_CACHE": str(tmp_path / "hub")})
    assert hub["huggingface"] == tmp_path / "hub"
    assert "ollama" not in places_of(tmp_path, {"OLLAMA_MODELS": "rel"})  # relative: nobody's


def test_a_config_file_discovers_nothing_unless_it_says_discovery(tmp_path: Path) -> None:
    plain = tmp_path / "plain.toml"
    plain.write_text("[server]\nport = 9000\n")
    assert serve_config(plain, tmp_path, environ={"HOME": str(tmp_path)}).discovery is None
    chosen = tmp_path / "chosen.toml"
    chosen.write_text(
        '[discovery]\nsources = ["ollama", "models"]\nfolders = ["shelf"]\nrescan_seconds = 0\n'
        '[engine_defaults.llamacpp]\nextra_args = { "no-mmap" = true }\n'
    )
    config = serve_config(chosen, tmp_path, environ={"HOME": str(tmp_path)})
    assert config.discovery is not None
    assert config.discovery.rescan_seconds == 0
    assert config.discovery.places == (
        ("ollama", tmp_path / ".ollama" / "models"),
        ("models", tmp_path.resolve() / "models"),
        ("config", tmp_path.resolve() / "shelf"),
    )
    assert config.discovery.template.extra_args == {"no-mmap": True}  # the engine's defaults
    off = tmp_path / "off.toml"
    off.write_text("[discovery]\nsources = []\n")
    none = serve_config(off, tmp_path, environ={"HOME": str(tmp_path)})
    assert none.discovery is not None and none.discovery.places == ()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('[discovery]\nsources = ["ollamma"]\n', "discovery.sources[0]: should be 'models'"),
        ("[discovery]\nrescan = 3\n", "unknown setting; did you mean 'rescan_seconds'?"),
        ("[discovery]\nrescan_seconds = -1\n", "discovery.rescan_seconds"),
        (
            "[discovery]\nrescan_seconds = 0.001\n",
            "discovery.rescan_seconds: 0 (search only at start) or at least 1 seconds",
        ),
        ('[discovery]\nfolders = ["a\\u0000b"]\n', "cannot hold a NUL"),
    ],
)
def test_a_bad_discovery_section_is_one_line(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(UsageError) as caught:
        serve_config(path, tmp_path, environ={})
    assert words in caught.value.message
    assert "\n" not in caught.value.message


def test_an_empty_variable_counts_as_unset() -> None:
    assert read_overrides(dict.fromkeys(ENV_VARIABLES, "  ")) == EnvOverrides()


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        ("HOSTLER_HOST", "0.0.0.0 x", "an address or host name"),
        ("HOSTLER_HOST", "http://x/", "no scheme, no path"),
        ("HOSTLER_HOST", "h" * 254, "an address or host name"),
        ("HOSTLER_PORT", "65536", "a port from 0 to 65535"),
        ("HOSTLER_PORT", "-1", "a port from 0 to 65535"),
        ("HOSTLER_PORT", "²", "a port from 0 to 65535"),
        ("HOSTLER_PORT", "8" * 40, "a port from 0 to 65535"),
        ("HOSTLER_AUTH", "basic", "one of token, none"),
        ("HOSTLER_IDLE_TIMEOUT", "-1", "seconds from 0 to 31536000"),
        ("HOSTLER_IDLE_TIMEOUT", "nan", "seconds from 0 to 31536000"),
        ("HOSTLER_IDLE_TIMEOUT", "31536001", "seconds from 0 to 31536000"),
        ("HOSTLER_IDLE_TIMEOUT", "soon", "seconds from 0 to 31536000"),
        ("HOSTLER_BUDGET_BYTES", "8GiB", "a whole number of bytes from 1073741824"),
        ("HOSTLER_BUDGET_BYTES", "0", "a whole number of bytes from 1073741824"),
        ("HOSTLER_BUDGET_BYTES", "1048575", "1048575 bytes is under 1 GiB (1073741824 bytes)"),
        ("HOSTLER_BUDGET_BYTES", "1073741823", "the smallest budget hostler enforces (CB1"),
        ("HOSTLER_BUDGET_BYTES", str(2**60 + 1), "a whole number of bytes from 1073741824"),
        ("HOSTLER_BUDGET_BYTES", "9" * 400, "a whole number of bytes from 1073741824"),
        ("HOSTLER_SPILLOVER", "maybe", "true, false or auto"),
        ("HOSTLER_ARBITER", "share", "one of auto, swap, coexist"),
        ("HOSTLER_CONFIG", "~hostler-no-such-user/h.toml", "no home directory known"),
        ("HOSTLER_MODELS_DIR", "a\0b", "cannot hold a NUL"),
        ("HOSTLER_ARBITER", "x" * 5000, "over 4096 characters"),
    ],
)
def test_each_malformed_variable_is_one_line_naming_it(name: str, value: str, words: str) -> None:
    with pytest.raises(SettingError) as caught:
        read_overrides({name: value})
    message = caught.value.message
    assert message.startswith(f"{name}"), message
    assert words in message and "\n" not in message and len(message) < 300


@pytest.mark.parametrize("value", ["short", "x" * 31, "x" * 257, "é" * 40, "a b" * 20, "\x01" * 40])
def test_a_malformed_token_is_refused_without_being_echoed(value: str) -> None:
    with pytest.raises(SettingError) as caught:
        read_overrides({"HOSTLER_TOKEN": value})
    assert caught.value.message.startswith("HOSTLER_TOKEN: not a usable token")
    assert value not in caught.value.message


def test_token_bounds_are_32_and_256_characters() -> None:
    assert valid_token("x" * 32) and valid_token("x" * 256)
    assert not valid_token("x" * 31) and not valid_token("x" * 257)


def test_apply_overrides_with_nothing_set_changes_nothing(tmp_path: Path) -> None:
    config = serve_config(write(tmp_path), tmp_path, environ={})
    assert apply_overrides(config, EnvOverrides()) == config


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "example.org"])  # noqa: S104
def test_a_public_bind_without_a_token_is_refused(host: str) -> None:
    with pytest.raises(UsageError) as caught:
        check_exposure(host, 11435, "none")
    assert caught.value.message.startswith(f"refusing to listen on {host}:11435 without a token")
    check_exposure(host, 11435, "token")  # with a token it may


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.1.2.3"])
def test_loopback_may_go_without_a_token(host: str) -> None:
    check_exposure(host, 0, "none")


def test_serve_refuses_a_public_bind_without_a_token_and_creates_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    config = write(tmp_path, '[server]\nhost = "0.0.0.0"\nauth = "none"\n')
    result = run_cli("serve", "--config", str(config), "--data-dir", str(data), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == (
        "hostler: error [usage.invalid]: refusing to listen on 0.0.0.0:11435 without a token: "
        'every route would be open to the network; set auth = "token" (the default) or listen '
        "on 127.0.0.1\n"
    )
    assert not data.exists()  # no data directory, no events.db, no token
    # the same through the environment, and through the flag over a loopback file
    by_env = run_cli(
        "serve",
        "--data-dir",
        str(data),
        env={"HOSTLER_HOST": "0.0.0.0", "HOSTLER_AUTH": "none", "HOSTLER_PORT": "1"},  # noqa: S104
        cwd=tmp_path,
    )
    assert by_env.returncode == 2
    assert "refusing to listen on 0.0.0.0:1 without a token" in by_env.stderr
    loopback = write(tmp_path, 'server = { auth = "none" }\n')
    by_flag = run_cli(
        "serve", "--config", str(loopback), "--data-dir", str(data), "--host", "::", cwd=tmp_path
    )
    assert by_flag.returncode == 2 and by_flag.stderr.count("\n") == 1
    assert "refusing to listen on :::11435 without a token" in by_flag.stderr
    assert not data.exists()


def test_serve_refuses_a_bad_variable_in_one_line_and_creates_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    result = run_cli("serve", "--data-dir", str(data), env={"HOSTLER_PORT": "http"}, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == (
        "hostler: error [usage.setting]: HOSTLER_PORT='http': a port from 0 to 65535; fix it "
        "or unset the variable\n"
    )
    assert not data.exists()


def test_daemon_without_a_config_or_hostler_config_is_one_line(tmp_path: Path) -> None:
    result = run_cli("daemon", "--data-dir", str(tmp_path / "d"), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == (
        "hostler: error [usage.invalid]: no config: give --config FILE or set HOSTLER_CONFIG\n"
    )


def test_an_open_guard_lets_every_request_through_and_a_tokenless_one_none() -> None:
    from starlette.requests import Request

    from hostler.serve.operator import Guard

    bare = Request({"type": "http", "headers": []})
    wrong = Request({"type": "http", "headers": [(b"authorization", b"Bearer wrong")]})
    opened = Guard(None, public=False, open_routes=True)
    assert opened.check(bare, changes_state=True) is None
    assert opened.check(wrong, changes_state=True) is None
    closed = Guard(None, public=False)  # no token and not open: what needs one is refused
    refused = closed.check(bare, changes_state=True)
    assert refused is not None and refused.status_code == 401
    assert closed.check(bare, changes_state=False) is None  # a loopback read needs none
    public = Guard(None, public=True)
    denied = public.check(bare, changes_state=False)
    assert denied is not None and denied.status_code == 401


FAKE_BINARY = """#!/bin/sh
printf '%s\\n' "$@" > "{argv}"
exec "{real}" "$@"
"""


@pytest.mark.slow
def test_a_real_serve_runs_the_files_models_budget_binary_and_idle_ttl(tmp_path: Path) -> None:
    """One real ``hostler serve``: everything the file says is what the daemon does."""
    from hostler_llamacpp.binary import find_llama_server

    write_tiny_llama(tmp_path / "tiny.gguf")
    argv_file = tmp_path / "argv.txt"
    binary = tmp_path / "my-llama-server"
    binary.write_text(FAKE_BINARY.format(argv=argv_file, real=find_llama_server()))
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    config = write(
        tmp_path,
        f"""
[daemon]
ledger = "ledger.db"
[server]
port = 0
[budget]
bytes = 3221225472
spillover = false
[engine_defaults.llamacpp]
binary = "{binary.name}"
extra_args = {{ threads = 1, batch-size = 64 }}
[[models]]
id = "tiny-chat"
path = "tiny.gguf"
ctx = 256
idle_ttl = 1
extra_args = {{ batch-size = 32 }}
""",
    )
    data = tmp_path / "data"
    log = tmp_path / "serve.log"
    server = start_daemon(config, data, log, command="serve", unset=ENV_VARIABLES)
    try:
        base = f"http://127.0.0.1:{served_port(log)}"
        models = httpx.get(f"{base}/v1/models", timeout=30).json()
        assert [m["id"] for m in models["data"]] == ["tiny-chat"]
        budget = httpx.get(f"{base}/api/budget", timeout=30).json()
        assert budget["budget"] == 3221225472, budget
        assert budget["ram_spillover"]["allowed"] is False
        assert budget["ram_spillover"]["overridden"] is True
        token = (data / "token").read_text().strip()
        loaded = httpx.post(
            f"{base}/api/models/tiny-chat/load",
            headers={"authorization": f"Bearer {token}"},
            timeout=120,
        )
        assert loaded.status_code == 200, loaded.text
        assert loaded.json()["key"] == "llamacpp:tiny-chat:0"
        argv = argv_file.read_text().splitlines()  # what the configured binary was given
        assert str((tmp_path / "tiny.gguf").resolve()) in argv
        assert argv[argv.index("--threads") + 1] == "1"
        assert argv[argv.index("--batch-size") + 1] == "32"  # the model's own extra wins
        stream = "engine/llamacpp:tiny-chat:0"
        idle: list[dict[str, object]] = []

        def idle_stopped() -> bool:
            idle[:] = [
                p["decision"]
                for _, kind, p in events(data, stream)
                if kind == "engine.stop_requested" and p.get("reason") == "idle"
            ]
            return bool(idle) and any(k == "engine.stopped" for _, k, _ in events(data, stream))

        wait_for(idle_stopped, timeout=30)
        assert idle[0]["idle_timeout"] == 1.0  # the model's idle_ttl, not the daemon's 300 s
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0
        kill_leftovers(data)


#: A llama-server wrapper whose launches of a model named ``slow`` never become ready.
SLOW_BINARY = """#!/bin/sh
case "$*" in *slow.gguf*) exec sleep 120;; esac
exec "{real}" "$@"
"""


@pytest.mark.slow
def test_a_real_serve_takes_the_engines_startup_and_idle_timeouts_from_engine_defaults(
    tmp_path: Path,
) -> None:
    """RD7: ``[engine_defaults.llamacpp]`` timings reach the daemon's supervisors."""
    from hostler_llamacpp.binary import find_llama_server

    write_tiny_llama(tmp_path / "tiny.gguf")
    write_tiny_llama(tmp_path / "slow.gguf")
    binary = tmp_path / "my-llama-server"
    binary.write_text(SLOW_BINARY.format(real=find_llama_server()))
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    config = write(
        tmp_path,
        f"""
[daemon]
ledger = "ledger.db"
idle_timeout = 300
[server]
port = 0
[engine_defaults.llamacpp]
binary = "{binary.name}"
startup_timeout = 8
idle_timeout = 1
[[models]]
id = "tiny"
path = "tiny.gguf"
ctx = 256
[[models]]
id = "slow"
path = "slow.gguf"
ctx = 256
""",
    )
    data = tmp_path / "data"
    log = tmp_path / "serve.log"
    server = start_daemon(config, data, log, command="serve", unset=ENV_VARIABLES)
    try:
        base = f"http://127.0.0.1:{served_port(log)}"
        headers = {"authorization": f"Bearer {(data / 'token').read_text().strip()}"}
        slow = httpx.post(f"{base}/api/models/slow/load", headers=headers, timeout=120)
        assert slow.status_code != 200, slow.text
        assert "did not become ready within 8 s" in slow.text, slow.text  # not the adapter's 180
        loaded = httpx.post(f"{base}/api/models/tiny/load", headers=headers, timeout=120)
        assert loaded.status_code == 200, loaded.text
        stream = "engine/llamacpp:tiny:0"
        idle: list[dict[str, object]] = []

        def idle_stopped() -> bool:
            idle[:] = [
                p["decision"]
                for _, kind, p in events(data, stream)
                if kind == "engine.stop_requested" and p.get("reason") == "idle"
            ]
            return bool(idle)

        wait_for(idle_stopped, timeout=30)
        assert idle[0]["idle_timeout"] == 1.0  # the engine's configured idle, not the daemon's
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0
        kill_leftovers(data)


def start_serve(
    tmp_path: Path, config_text: str, env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], str, Path]:
    """A real ``hostler serve`` of no model on port 0; its process, base URL and data dir."""
    config = write(tmp_path, config_text)
    data = tmp_path / "data"
    log = tmp_path / "serve.log"
    server = start_daemon(
        config,
        data,
        log,
        env={"HOSTLER_LEDGER": str(tmp_path / "ledger.db"), **env},
        command="serve",
        extra=("--port", "0"),
        unset=ENV_VARIABLES,
    )
    return server, f"http://127.0.0.1:{served_port(log)}", data


def stop_serve(server: subprocess.Popen[bytes], data: Path) -> None:
    server.send_signal(signal.SIGTERM)
    assert server.wait(60) == 0
    kill_leftovers(data)


@pytest.mark.slow
def test_auth_none_on_loopback_opens_every_route_and_writes_no_token(tmp_path: Path) -> None:
    server, base, data = start_serve(tmp_path, '[server]\nauth = "none"\n', {})
    try:
        put = httpx.put(f"{base}/api/budget", json={"bytes": 2**30}, timeout=30)
        assert put.status_code == 200, put.text
        assert httpx.get(f"{base}/api/budget", timeout=30).json()["budget"] == 2**30
        wrong = {"authorization": "Bearer nothing-like-it"}
        assert (
            httpx.put(f"{base}/api/budget", json={"bytes": None}, headers=wrong).status_code == 200
        )
        assert not (data / "token").exists()
        assert "no token: every route is open" in (tmp_path / "serve.log").read_text()
    finally:
        stop_serve(server, data)


@pytest.mark.slow
def test_hostler_token_is_the_token_and_no_file_is_made(tmp_path: Path) -> None:
    server, base, data = start_serve(tmp_path, "", {"HOSTLER_TOKEN": TOKEN})
    try:
        body = {"bytes": 2**30}
        assert httpx.put(f"{base}/api/budget", json=body, timeout=30).status_code == 401
        bad = {"authorization": "Bearer " + "u" * 40}
        assert httpx.put(f"{base}/api/budget", json=body, headers=bad).status_code == 401
        good = {"authorization": f"Bearer {TOKEN}"}
        assert httpx.put(f"{base}/api/budget", json=body, headers=good).status_code == 200
        assert not (data / "token").exists()
        assert TOKEN not in (tmp_path / "serve.log").read_text()
    finally:
        stop_serve(server, data)


@pytest.mark.anyio
async def test_open_daemon_refuses_an_open_public_bind_and_creates_nothing(tmp_path: Path) -> None:
    import hostler
    from hostler.config import DaemonConfig

    config = DaemonConfig(data_dir=tmp_path / "data", auth="none")
    with pytest.raises(UsageError, match=r"refusing to listen on 0\.0\.0\.0:0 without a token"):
        async with hostler.open_daemon(config, listen=("0.0.0.0", 0)):  # noqa: S104
            pass
    assert not (tmp_path / "data").exists()


@pytest.mark.anyio
@pytest.mark.slow
async def test_the_daemon_runs_with_the_files_arbiter_policy_and_spillover(tmp_path: Path) -> None:
    import hostler

    config = write(
        tmp_path,
        f'[daemon]\nledger = "ledger.db"\ndata_dir = "{tmp_path / "data"}"\n'
        '[arbiter]\npolicy = "swap"\n[budget]\nbytes = 5368709120\nspillover = true\n',
    )
    async with hostler.open_daemon(config) as daemon:
        assert daemon.runtime is not None
        assert daemon.runtime.arbiter.mode == "swap"
        budget = await daemon.runtime.memory.budget()
        assert budget["budget"] == 5 * 2**30
        assert budget["overridden"] is True
        assert budget["ram_spillover"]["overridden"] is True
    # "auto" puts both back to the automatic values at the next start
    config.write_text(
        config.read_text()
        .replace("5368709120", '"auto"')
        .replace("spillover = true", 'spillover = "auto"')
    )
    async with hostler.open_daemon(config) as daemon:
        assert daemon.runtime is not None
        budget = await daemon.runtime.memory.budget()
        assert budget["budget"] == budget["auto_budget"] != 5 * 2**30
        assert budget["ram_spillover"]["overridden"] is False
