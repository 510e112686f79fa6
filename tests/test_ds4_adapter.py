"""The ds4 adapter: its command line, settings and prices, then real processes of the fake.

The fake ``ds4-server`` (``python -m hostler_ds4.fake_server``) runs as a real process under the
real supervisor and runtime: started, ready on ``/v1/models``, answering a request through the
runtime, stopped, crashed, refused by the single-instance lock, and recovered by the
supervisor's SV10 sweep and retry (RD9: ``Ds4Adapter.on_exited_before_ready`` asks for it) of a
stray that still holds the lock.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

import hostler
import hostler_ds4
from hostler import EventStore
from hostler.engines.process import LAUNCH_TOKEN_ENV
from hostler.engines.resweep import anchors_of, sweep_strays
from hostler.engines.roster import EngineRoster
from hostler.engines.supervisor import Supervisor, SupervisorPolicy
from hostler.errors import EngineBinaryError, EngineStartError, SettingError
from hostler.machines.engine import EngineCrashed, EngineStartRequested
from hostler.plugin import LaunchSpec, ModelGeometry
from hostler.pluginhost import PluginHost
from hostler.testing.tiny_gguf import write_tiny_llama
from hostler_ds4 import Ds4Adapter
from hostler_ds4.adapter import find_ds4_server
from hostler_ds4.fake_server import lock_path

from _support import assert_one_line_error, cli_env, run_cli

GIB = 1024**3
KEY = "ds4:flash:0"


# -- a fake ds4 installation ----------------------------------------------------------------


def install_fake(root: Path) -> Path:
    """A ds4 directory: an executable ``ds4-server`` (the fake) and its ``shaders/``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "shaders").mkdir(exist_ok=True)
    plugins = Path(hostler_ds4.__file__).resolve().parent.parent
    binary = root / "ds4-server"
    binary.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"sys.path.insert(0, {str(plugins)!r})\n"
        "from hostler_ds4.fake_server import main\n"
        "sys.exit(main())\n"
    )
    binary.chmod(0o755)
    return binary


@pytest.fixture
def lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's machine-wide lock file (children inherit the variable)."""
    path = tmp_path / "ds4-server.lock"
    monkeypatch.setenv("DS4_SERVER_LOCK", str(path))
    monkeypatch.delenv("HOSTLER_DS4_KV_DISK_MB", raising=False)
    monkeypatch.delenv("HOSTLER_DS4_CWD", raising=False)
    monkeypatch.delenv("HOSTLER_MIN_CONTEXT_TOKENS", raising=False)
    return path


@pytest.fixture
def binary(tmp_path: Path) -> Path:
    return install_fake(tmp_path / "ds4")


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_tiny_llama(tmp_path / "flash.gguf")


def adapter(binary: Path | None = None, **kwargs: Any) -> Ds4Adapter:
    kwargs.setdefault("system_ram", 128 * GIB)
    kwargs.setdefault("machine", "x86_64")
    kwargs.setdefault("system", "Linux")
    kwargs.setdefault("environ", {})
    return Ds4Adapter(binary, **kwargs)


def spec_of(model: Path, port: int = 4321, **kwargs: Any) -> LaunchSpec:
    kwargs.setdefault("work_dir", model.parent / "run" / "work")
    return LaunchSpec(KEY, model, port, ctx_per_slot=4096, **kwargs)


# -- the command line (D2, D4, D5, D7, D8) ---------------------------------------------------


def test_the_command_line_on_a_linux_host(binary: Path, model: Path) -> None:
    spec = spec_of(model)
    argv = adapter(binary).build_command(spec).argv
    assert argv == [
        str(binary),
        "--model",
        str(model),
        "--cuda",
        "--ctx",
        "131072",
        "--host",
        "127.0.0.1",
        "--port",
        "4321",
        "--kv-disk-dir",
        str(model.parent / "run" / "work" / "kv"),
        "--kv-disk-space-mb",
        "16384",
        "--cors",
        "--ssd-streaming",
        "--ssd-streaming-cache-experts",
        "64GB",
        "--chdir",
        str(binary.resolve().parent),
    ]


def test_a_big_arm64_mac_asked_for_no_streaming_launches_resident(
    binary: Path, model: Path
) -> None:
    ds4 = adapter(binary, system_ram=256 * GIB, machine="arm64", system="Darwin")
    argv = ds4.build_command(spec_of(model, options={"streaming": False})).argv
    assert "--metal" in argv
    assert "--cuda" not in argv
    assert "--ssd-streaming" not in argv
    assert argv[argv.index("--ctx") + 1] == "262144"
    assert ds4.estimate_footprint(ModelGeometry(file_size=10 * GIB), spec_of(model)) == 10 * GIB
    resident = spec_of(model, options={"streaming": False})
    assert ds4.estimate_footprint(ModelGeometry(file_size=10 * GIB), resident) == 96 * GIB


def test_no_streaming_is_not_honoured_on_x86(binary: Path, model: Path) -> None:
    argv = adapter(binary).build_command(spec_of(model, options={"streaming": False})).argv
    assert "--ssd-streaming" in argv


def test_more_than_one_slot_is_refused(binary: Path, model: Path) -> None:
    with pytest.raises(EngineStartError, match=r"strictly serial \(D4\).*slots = 1, not 2"):
        adapter(binary).build_command(spec_of(model, slots=2))


def test_a_host_with_no_safe_expert_cache_refuses_a_streaming_launch(
    binary: Path, model: Path
) -> None:
    with pytest.raises(EngineStartError, match=r"32 GiB of RAM leaves none \(D8\)"):
        adapter(binary, system_ram=32 * GIB).build_command(spec_of(model))
    argv = adapter(binary, system_ram=33 * GIB).build_command(spec_of(model)).argv
    assert argv[argv.index("--ssd-streaming-cache-experts") + 1] == "1GB"


def test_the_operators_flags_are_settings_or_appended_last(binary: Path, model: Path) -> None:
    extra: dict[str, str | int | float | bool] = {
        "--ctx": 8192,
        "verbose": True,
        "--cors": False,
        "power": 80,
        "ssd-streaming-cache-experts": "12GB",
        "kv-disk-space-mb": 2048,
    }
    ds4 = adapter(binary)
    argv = ds4.build_command(spec_of(model, extra_args=extra)).argv
    assert argv[argv.index("--ctx") + 1] == "8192"
    assert argv[argv.index("--ssd-streaming-cache-experts") + 1] == "12GB"
    assert argv[argv.index("--kv-disk-space-mb") + 1] == "2048"
    assert argv[-3:] == ["--verbose", "--power", "80"]
    assert argv.count("--ctx") == 1
    assert "--cors" in argv  # False omits only an operator's own flag, never a planned one


def test_environment_settings(binary: Path, model: Path, tmp_path: Path) -> None:
    env = {"HOSTLER_DS4_KV_DISK_MB": "4096", "HOSTLER_DS4_CWD": str(tmp_path)}
    argv = adapter(binary, environ=env).build_command(spec_of(model)).argv
    assert argv[argv.index("--kv-disk-space-mb") + 1] == "4096"
    assert argv[argv.index("--chdir") + 1] == str(tmp_path)


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"context": 4096}, r"ds4 has no option 'context' \(known: cache_bytes, ctx"),
        ({"ctx": 0}, r"ds4 option ctx: must be above 0, not 0"),
        ({"ctx": -1}, r"ds4 option ctx: must be above 0, not -1"),
        ({"ctx": "lots"}, r"ds4 option ctx: a whole number, not 'lots'"),
        ({"ctx": True}, r"ds4 option ctx: a whole number, not True"),
        ({"streaming": "maybe"}, r"ds4 option streaming: true or false, not 'maybe'"),
        ({"kv_dir": ""}, r"ds4 option kv_dir: a directory path"),
        ({"expert_cache_gib": "0GB"}, r"expert_cache_gib: must be above 0, not 0"),
    ],
)
def test_bad_settings_are_one_clear_line(
    binary: Path, model: Path, options: dict[str, object], error: str
) -> None:
    with pytest.raises(SettingError, match=error):
        adapter(binary).build_command(spec_of(model, options=options))


def test_a_bad_environment_setting_is_one_clear_line(binary: Path, model: Path) -> None:
    with pytest.raises(SettingError, match="HOSTLER_DS4_KV_DISK_MB: must be above 0, not 0"):
        adapter(binary, environ={"HOSTLER_DS4_KV_DISK_MB": "0"}).build_command(spec_of(model))


def test_the_footprint_follows_the_catalog_line_at_the_launch_context(model: Path) -> None:
    catalog = {
        "resident_bytes": 40 * GIB,
        "resident_ctx": 65_536,
        "kv_bytes_per_token": 8192,
        "max_launch_ctx": 100_000,
    }
    ds4 = adapter(system_ram=256 * GIB)
    geometry = ModelGeometry(file_size=150 * GIB)
    # the tier (262,144) capped by the catalog max: 100,000 tokens
    expected = 40 * GIB - 8192 * 65_536 + 8192 * 100_000
    assert ds4.estimate_footprint(geometry, spec_of(model, options=catalog)) == expected
    # the operator's --ctx moves both the launch and the price
    flagged = spec_of(model, options=catalog, extra_args={"--ctx": 65_536})
    assert ds4.estimate_footprint(geometry, flagged) == 40 * GIB
    # nothing known: min(size, 48 GiB), whatever the planner's window and slots say
    assert ds4.estimate_footprint(geometry, spec_of(model)) == 48 * GIB


def test_the_floor_comes_from_the_environment(
    binary: Path, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOSTLER_MIN_CONTEXT_TOKENS", "200000")
    argv = adapter(binary).build_command(spec_of(model)).argv
    assert argv[argv.index("--ctx") + 1] == "200000"


def test_the_binary_is_found_or_named_in_the_error(
    binary: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("HOSTLER_DS4_SERVER", raising=False)
    with pytest.raises(EngineBinaryError, match="ds4-server not found: set HOSTLER_DS4_SERVER"):
        find_ds4_server()
    monkeypatch.setenv("HOSTLER_DS4_SERVER", str(binary))
    assert find_ds4_server() == binary
    with pytest.raises(EngineBinaryError, match="binary not found"):
        find_ds4_server(tmp_path / "nope")
    (tmp_path / "plain").write_text("")
    with pytest.raises(EngineBinaryError, match="not executable"):
        find_ds4_server(tmp_path / "plain")
    monkeypatch.setenv("PATH", str(binary.parent))
    monkeypatch.delenv("HOSTLER_DS4_SERVER")
    assert find_ds4_server() == binary


def test_fatal_lines_are_classified() -> None:
    ds4 = adapter()
    cases = {
        "ds4-server: error: another ds4-server instance is running (pid 7 holds x)": (
            "instance-locked"
        ),
        "ds4-server: error: failed to load model m.gguf: not a GGUF file": "model-load-failed",
        "ds4-server: error: cannot load shaders from /x/shaders": "shaders-missing",
        "ds4-server: error: choose one GPU backend, --metal or --cuda": "no-gpu-backend",
        "ds4-server: error: unrecognized arguments: --parallel 2": "bad-argument",
        "CUDA error: out of memory": "cuda-out-of-memory",
        "CUDA error: an illegal memory access was encountered": "cuda-illegal-memory-access",
        "CUDA error: unknown": "cuda-error",
    }
    for line, kind in cases.items():
        panic = ds4.classify_line(line)
        assert panic is not None, line
        assert panic.kind == kind
    assert ds4.classify_line("ds4-server: listening on http://127.0.0.1:1") is None
    assert ds4.classify_line("CUDA error: unknown").priority == 1  # type: ignore[union-attr]


def test_the_plugin_registers_ds4_through_its_entry_point() -> None:
    host = PluginHost().load()
    assert host.adapters["ds4"] is Ds4Adapter
    assert Ds4Adapter.readiness_path == "/v1/models"
    assert host.adapter("ds4", system_ram=GIB).engine_type == "ds4"


def test_anchors_are_the_binary_and_the_model() -> None:
    argv = ["/opt/ds4/ds4-server", "--model", "/m/flash.gguf", "--kv-disk-dir", "/d/kv", "--ctx"]
    assert anchors_of(argv) == ["/opt/ds4/ds4-server", "/m/flash.gguf"]
    assert anchors_of(["ds4-server", "/v/x.6", "/v/a.verylongext"]) == []


# -- the fake as a real process ----------------------------------------------------------------


def run_fake(binary: Path, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary), *args], capture_output=True, text=True, timeout=30, check=False, **kwargs
    )


def test_the_fake_refuses_what_ds4_server_refuses(
    binary: Path, model: Path, lock: Path, tmp_path: Path
) -> None:
    base = ["--model", str(model), "--ctx", "4096", "--port", "1"]
    cpu = run_fake(binary, *base, "--chdir", str(binary.parent))
    assert cpu.returncode == 1
    assert "ds4 never runs on CPU" in cpu.stdout
    no_shaders = run_fake(binary, *base, "--cuda", cwd=tmp_path)
    assert "cannot load shaders" in no_shaders.stdout
    unknown = run_fake(binary, *base, "--cuda", "--parallel", "2")
    assert unknown.returncode == 2
    assert "unrecognized arguments: --parallel 2" in unknown.stderr
    cache = run_fake(
        binary,
        *base,
        "--cuda",
        "--chdir",
        str(binary.parent),
        "--ssd-streaming-cache-experts",
        "8GB",
    )
    assert "needs --ssd-streaming" in cache.stdout
    (tmp_path / "bad.gguf").write_bytes(b"NOPE")
    bad = ["--model", str(tmp_path / "bad.gguf"), "--ctx", "4096", "--cuda"]
    broken = run_fake(binary, *bad, "--chdir", str(binary.parent))
    assert "failed to load model" in broken.stdout
    assert broken.returncode == 1


def types_of(store: EventStore, key: str = KEY) -> list[str]:
    return [r.type for r in store.read_stream(f"engine/{key}")]


def crash_of(store: EventStore) -> EngineCrashed:
    crashes = [r.event for r in store.read_stream(f"engine/{KEY}") if r.type == "engine.crashed"]
    assert isinstance(crashes[0], EngineCrashed)
    return crashes[0]


def http(port: int, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data, {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


class Rig:
    """Real supervisors of the fake, one log, this test's lock file."""

    def __init__(self, tmp_path: Path, store: EventStore, binary: Path, model: Path) -> None:
        self.tmp_path = tmp_path
        self.store = store
        self.binary = binary
        self.model = model
        self.adapter = adapter(binary)
        self.token = f"ds4test-{os.getpid()}-{tmp_path.name}"
        self.supervisors: dict[str, Supervisor] = {}

    def build(self, key: str, **options: Any) -> Supervisor:
        """A supervisor of ``key``; ``options`` go to it (``owned``: see :meth:`runtime`)."""
        run = self.tmp_path / "run" / key.replace(":", "_")
        supervisor = Supervisor(
            key,
            self.adapter,
            lambda port: LaunchSpec(key, self.model, port, 4096, work_dir=run / "work"),
            self.store,
            run_dir=run,
            token_prefix=self.token,
            policy=SupervisorPolicy(
                watch_interval=0.05, idle_timeout=0, startup_timeout=20, panic_exit_wait=2
            ),
            **options,
        )
        self.supervisors[key] = supervisor
        return supervisor

    def runtime(self) -> hostler.Runtime:
        """A runtime over :meth:`build`: its supervisors know this daemon's engines (RD9)."""
        roster = EngineRoster()
        return hostler.Runtime(self.store, partial(self.build, owned=roster.pids), roster=roster)

    def owned(self) -> list[int]:
        return [s.pid for s in self.supervisors.values() if s.pid is not None]

    def anchors(self) -> list[str]:
        return anchors_of([str(self.binary), "--model", str(self.model)])

    def stray(self, token: str | None) -> int:
        """A ds4-server holding the lock with no owner: its parent exits (an orphan, IN4)."""
        env = dict(os.environ)
        env.pop(LAUNCH_TOKEN_ENV, None)
        if token is not None:
            env[LAUNCH_TOKEN_ENV] = token
        argv = [
            str(self.binary),
            "--model",
            str(self.model),
            "--cuda",
            "--ctx",
            "4096",
            "--port",
            str(free_port()),
            "--chdir",
            str(self.binary.parent),
        ]
        # a session leader, like every engine hostler spawns, whose parent exits at once
        orphan = (
            "import subprocess, sys; print(subprocess.Popen(sys.argv[1:], start_new_session=True,"
            " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)"
        )
        made = subprocess.run(
            [sys.executable, "-c", orphan, *argv], env=env, check=True, capture_output=True
        )
        pid = int(made.stdout)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until it holds the lock
            if lock_path().exists() and lock_path().read_text().strip() == str(pid):
                return pid
            time.sleep(0.05)
        raise AssertionError("the stray never took the lock")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def rig(tmp_path: Path, lock: Path, binary: Path, model: Path) -> Iterator[Rig]:
    del lock
    with EventStore.open(tmp_path / "events.db") as store:
        yield Rig(tmp_path, store, binary, model)


@pytest.mark.anyio
@pytest.mark.slow
async def test_start_ready_answer_through_the_runtime_and_stop(rig: Rig) -> None:
    async with rig.runtime() as runtime:
        async with runtime.request(KEY) as port:
            status, models = await anyio.to_thread.run_sync(http, port, "/v1/models")
            assert status == 200
            assert models["data"][0]["id"] == "flash"
            assert models["data"][0]["ctx"] == 131_072  # D5 on a 128 GiB host
            status, _ = await anyio.to_thread.run_sync(http, port, "/health")
            assert status == 404  # ds4 has no /health: readiness is /v1/models
            body = {"messages": [{"role": "user", "content": "hello ds4"}]}
            status, answer = await anyio.to_thread.run_sync(
                http, port, "/v1/chat/completions", body
            )
            assert status == 200
            assert answer["choices"][0]["message"]["content"] == "ds4 says: hello ds4"
        supervisor = rig.supervisors[KEY]
        pid = supervisor.pid
        assert pid is not None
        assert lock_path().read_text().strip() == str(pid)
        spec = supervisor.launch_spec
        assert spec is not None
        assert (spec.work_dir / "kv").is_dir()  # type: ignore[operator]
        await supervisor.stop()
        assert not alive(pid)
    assert types_of(rig.store) == [
        "engine.start_requested",
        "engine.spawned",
        "engine.ready",
        "engine.stop_requested",
        "engine.stopped",
    ]


@pytest.mark.anyio
@pytest.mark.slow
async def test_concurrent_requests_reach_the_engine_one_at_a_time(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_DS4_REPLY_SECONDS", "0.3")
    body = {"messages": [{"role": "user", "content": "one at a time"}]}
    statuses: list[int] = []
    async with rig.runtime() as runtime:

        async def ask() -> None:
            async with runtime.request(KEY) as port:
                status, _ = await anyio.to_thread.run_sync(http, port, "/v1/chat/completions", body)
                statuses.append(status)

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(ask)
    assert statuses == [200, 200, 200]  # the fake answers 503 to a second request in flight


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_crash_mid_request_is_recorded_and_the_next_request_restarts(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_DS4_CRASH_ON", "1")
    body = {"messages": [{"role": "user", "content": "crash"}]}
    async with rig.runtime() as runtime:
        async with runtime.request(KEY) as port:
            first = rig.supervisors[KEY].pid
            with pytest.raises((ConnectionError, urllib.error.URLError)):
                await anyio.to_thread.run_sync(http, port, "/v1/chat/completions", body)
        with anyio.fail_after(10):
            while "engine.crashed" not in types_of(rig.store):
                await anyio.sleep(0.05)
        crash = crash_of(rig.store)
        assert crash.panic_kind == "cuda-illegal-memory-access"
        assert crash.reached_ready is True
        monkeypatch.delenv("FAKE_DS4_CRASH_ON")
        async with runtime.request(KEY) as port:
            assert rig.supervisors[KEY].pid != first
            status, _ = await anyio.to_thread.run_sync(http, port, "/v1/models")
            assert status == 200


def start_causes(store: EventStore) -> list[str]:
    return [
        r.event.cause
        for r in store.read_stream(f"engine/{KEY}")
        if isinstance(r.event, EngineStartRequested)
    ]


def test_the_adapter_asks_for_a_sweep_only_after_an_exit_before_ready() -> None:
    adapter = Ds4Adapter()
    assert adapter.on_exited_before_ready("ds4:m:0: exited (exit code 1) before becoming ready")
    assert adapter.on_exited_before_ready("another ds4-server instance holds the lock (pid 9)")
    assert not adapter.on_exited_before_ready("ds4:m:0: did not become ready within 600 s")
    assert not adapter.on_exited_before_ready("")


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_lock_held_by_someone_elses_ds4_is_never_swept(rig: Rig) -> None:
    foreign = rig.stray(token=None)  # another program's ds4-server: no launch token of ours
    try:
        supervisor = rig.build(KEY, owned=rig.owned)
        with pytest.raises(EngineStartError, match=rf"another ds4-server instance.*pid {foreign}"):
            await supervisor.ensure_running()
        assert alive(foreign)
        assert types_of(rig.store).count("engine.spawned") == 1  # no retry: nothing was swept
        assert start_causes(rig.store) == ["request"]
        crash = crash_of(rig.store)
        assert crash.panic_kind == "instance-locked"
        assert crash.reached_ready is False
    finally:
        kill(foreign)


@pytest.mark.anyio
@pytest.mark.slow
async def test_exited_before_ready_sweeps_our_stray_once_and_retries_through_the_runtime(
    rig: Rig,
) -> None:
    stray = rig.stray(token=f"{rig.token}:deadbeef")  # ours, from a daemon that died
    try:
        runtime = rig.runtime()  # its pool knows the owned engines
        async with runtime, runtime.request(KEY) as port:
            assert not alive(stray)
            supervisor = rig.supervisors[KEY]
            assert lock_path().read_text().strip() == str(supervisor.pid)
            status, _ = await anyio.to_thread.run_sync(http, port, "/v1/models")
            assert status == 200
        types = types_of(rig.store)
        assert types[:7] == [
            "engine.start_requested",
            "engine.spawned",
            "engine.crashed",  # the first start, refused by the stray's lock
            "engine.start_requested",
            "engine.spawned",
            "engine.ready",  # the retry, after the sweep
            "engine.stop_requested",
        ], types
        assert start_causes(rig.store) == ["request", "resweep-retry"]
        assert crash_of(rig.store).panic_kind == "instance-locked"
    finally:
        kill(stray)


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_supervisor_that_does_not_know_its_daemons_engines_never_sweeps(rig: Rig) -> None:
    stray = rig.stray(token=f"{rig.token}:beef")  # ours, but this supervisor has no pool
    try:
        supervisor = rig.build(KEY)
        assert supervisor.owned is None
        with pytest.raises(EngineStartError, match=rf"another ds4-server instance.*pid {stray}"):
            await supervisor.ensure_running()
        assert alive(stray)
        assert start_causes(rig.store) == ["request"]
    finally:
        kill(stray)


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_sweep_spares_the_daemons_own_running_engine(rig: Rig) -> None:
    """A second ds4 key of the same daemon exits before ready; its sweep keeps the first."""
    other = "ds4:other:0"
    async with rig.runtime() as runtime, runtime.request(KEY):
        first = rig.supervisors[KEY].pid
        assert first is not None
        with pytest.raises(EngineStartError, match=rf"another ds4-server instance.*{first}"):
            async with runtime.request(other):
                pass
        assert alive(first)  # owned by this runtime's pool: never swept
        assert rig.supervisors[KEY].pid == first
    assert [
        r.event.cause
        for r in rig.store.read_stream(f"engine/{other}")
        if isinstance(r.event, EngineStartRequested)
    ] == ["request"]


@pytest.mark.anyio
@pytest.mark.slow
async def test_the_sweep_spares_owned_engines_and_other_daemons(rig: Rig) -> None:
    ours = rig.stray(token=f"{rig.token}:cafe")
    try:
        spared = await sweep_strays(rig.token, owned=[ours], anchors=rig.anchors(), wait=1)
        assert spared == []
        held = await sweep_strays(
            rig.token,
            owned=[],
            anchors=rig.anchors(),
            held_by_other=lambda token: "daemon 42",
            wait=1,
        )
        assert held == []
        unanchored = await sweep_strays(rig.token, owned=[], anchors=["/no/such"], wait=1)
        assert unanchored == []
        assert alive(ours)
        swept = await sweep_strays(rig.token, owned=[], anchors=rig.anchors(), wait=5)
        assert [s.pid for s in swept] == [ours]
        assert not alive(ours)
    finally:
        kill(ours)


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
