"""``hostler doctor``: each check's OK and failing line, by value, on real files and sockets."""

from __future__ import annotations

import http.server
import json
import secrets
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hostler.config import DaemonConfig
from hostler.drivers import doctor
from hostler.drivers.doctor_verdicts import (
    BUILD_FIX,
    BinarySeen,
    CpuSeen,
    DirSeen,
    Finding,
    PortSeen,
    TokenSeen,
    binary_verdict,
    cpu_verdict,
    data_dir_verdict,
    gpu_verdict,
    models_verdict,
    port_verdict,
    token_verdict,
)
from hostler.events.cpu import CPU_STREAM, CpuUnsupported
from hostler.plugin import LaunchCommand
from hostler.pluginhost import PluginHost
from hostler.probes.cpu import cpu_identity
from hostler.store.log import EventStore
from hostler_llamacpp.binary import find_llama_server

from _daemons import ServeChild
from _support import run_cli

ANOTHER_DIR = "or use another data directory (--data-dir, HOSTLER_HOME)"


# --- the verdicts (pure) -------------------------------------------------------------------


def test_an_engine_found_says_where_and_its_version() -> None:
    seen = BinarySeen("llama-server", Path("/opt/llama-server"), version="version: 6434 (abc)")
    assert binary_verdict(seen, required=True, fix="get it") == Finding(
        "llama-server", "ok", "/opt/llama-server (version: 6434 (abc))"
    )


def test_a_missing_required_engine_fails_and_an_optional_one_is_absent() -> None:
    missing = BinarySeen("llama-server", problem="llama-server not found: set X")
    assert binary_verdict(missing, required=True, fix="get it") == Finding(
        "llama-server", "fail", "llama-server not found: set X", "get it"
    )
    assert binary_verdict(BinarySeen("sd-server"), required=False, fix="build it") == Finding(
        "sd-server", "absent", "not found (optional; build it)"
    )


def test_an_optional_engine_named_but_unusable_fails() -> None:
    named = BinarySeen("sd-server", problem="/x: sd-server binary is not executable", named=True)
    found = binary_verdict(named, required=False, fix="build it")
    assert found.status == "fail"
    assert found.detail == "/x: sd-server binary is not executable"
    assert found.fix == (
        "point the variable (or the config's `binary`) at an executable sd-server, "
        "or unset it to use the one found on PATH"
    )


def test_an_engine_that_does_not_run_here_names_the_build() -> None:
    seen = BinarySeen("llama-server", Path("/b/llama-server"), run_failure="killed by SIGILL")
    assert binary_verdict(seen, required=True, fix="get it") == Finding(
        "llama-server", "fail", "/b/llama-server: does not run here (killed by SIGILL)", BUILD_FIX
    )


FEATURES = (("avx2", True), ("avx512f", False), ("amx_tile", False))


def test_a_cpu_with_nothing_learned_is_ok() -> None:
    assert cpu_verdict(CpuSeen("EPYC", "x86_64/abc", FEATURES, "b1")) == Finding(
        "cpu",
        "ok",
        "EPYC (x86_64/abc); has avx2; lacks avx512f amx_tile; "
        "nothing this llama-server cannot run here learned",
    )


def test_what_the_log_learned_this_build_cannot_run_fails_with_the_build_command() -> None:
    seen = CpuSeen("EPYC", "x86_64/abc", FEATURES, "b1", quantized_kv=True, weights=("m1",))
    assert cpu_verdict(seen) == Finding(
        "cpu",
        "fail",
        "EPYC (x86_64/abc); has avx2; lacks avx512f amx_tile; the log says this llama-server "
        "cannot run a quantized KV cache (it runs f16 KV instead) nor the weights of m1 on "
        "this CPU (L22: it died of SIGILL)",
        "run `hostler engine build llamacpp` (builds llama-server for this CPU; needs cmake, g++)",
    )


def test_a_data_directory_verdict_for_each_state() -> None:
    here = Path("/d/hostler")
    assert data_dir_verdict(
        DirSeen(here, True, is_dir=True, mode=0o40700, owner=5, me=5, writable=True)
    ) == Finding("data dir", "ok", "/d/hostler (mode 0700)")
    assert data_dir_verdict(
        DirSeen(here, True, is_dir=True, mode=0o40755, owner=5, me=5, writable=True)
    ) == Finding("data dir", "ok", "/d/hostler (mode 0755: made 0700 at the next start)")
    assert data_dir_verdict(
        DirSeen(here, False, ancestor=Path("/d"), ancestor_is_dir=True, ancestor_writable=True)
    ) == Finding("data dir", "ok", "/d/hostler: not yet there; made (0700) at first run")
    assert data_dir_verdict(
        DirSeen(here, True, is_dir=True, mode=0o40700, owner=7, me=5, writable=True)
    ) == Finding(
        "data dir",
        "fail",
        "/d/hostler: owned by uid 7, not by this user (uid 5)",
        f"chown it to you, {ANOTHER_DIR}",
    )


def test_a_port_held_by_a_hostler_serve_is_ok_even_while_it_closes() -> None:
    assert port_verdict(PortSeen("127.0.0.1", 11435, "address already in use", "closing")) == (
        Finding("port", "ok", "127.0.0.1:11435: a hostler serve is there (GET /health: closing)")
    )


def test_a_token_that_cannot_be_read_fails_with_its_reason() -> None:
    seen = TokenSeen(Path("/d/token"), exists=True, unreadable="Permission denied")
    assert token_verdict(seen) == Finding(
        "token", "fail", "/d/token: cannot be read (Permission denied)", "chmod 600 /d/token"
    )


def test_gpus_listed_or_absent() -> None:
    assert gpu_verdict([("H100", 80 * 2**30, 2**30)], "") == Finding(
        "gpu", "ok", "H100 (80.0 GiB, 1.0 GiB used)"
    )
    assert gpu_verdict([], "NVML not available") == Finding(
        "gpu", "absent", "no NVIDIA card (NVML not available)"
    )


def test_models_found_and_where_or_the_fix() -> None:
    where = Path("/d/models")
    models = [(f"m{i}", where / f"m{i}.gguf") for i in range(8)]
    assert models_verdict(models, [], where, configured=False) == Finding(
        "models", "ok", "8 in /d/models: m0, m1, m2, m3, m4, m5 and 2 more"
    )
    assert models_verdict([], [], where, configured=False) == Finding(
        "models",
        "fail",
        "no model files in /d/models",
        "put a .gguf model into /d/models (or set HOSTLER_MODELS_DIR, or give --config FILE)",
    )
    missing = models_verdict([], [Path("/gone.gguf")], where, configured=True)
    assert missing.detail == "1 configured model files missing: /gone.gguf"


# --- the checks on real files, sockets and binaries ----------------------------------------


def test_a_private_data_directory_is_ok(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    assert doctor.check_data_dir(data) == Finding("data dir", "ok", f"{data} (mode 0700)")


def test_a_data_directory_that_is_a_file_or_under_one_fails(tmp_path: Path) -> None:
    file = tmp_path / "file"
    file.write_text("x")
    assert doctor.check_data_dir(file) == Finding(
        "data dir",
        "fail",
        f"{file}: exists and is not a directory",
        f"move that file away, {ANOTHER_DIR}",
    )
    assert doctor.check_data_dir(file / "data") == Finding(
        "data dir",
        "fail",
        f"{file / 'data'}: cannot be created ({file} is not a directory)",
        f"make {file} a directory you can write, {ANOTHER_DIR}",
    )


def test_an_unwritable_data_directory_fails_as_any_user(tmp_path: Path) -> None:
    """Run as a process that obeys file modes (root's override dropped), as a user would."""
    data = tmp_path / "data"
    data.mkdir(mode=0o500)
    (data / "models").mkdir()
    try:
        done = run_cli(
            "doctor", "--json", "--data-dir", str(data), obey_file_modes=True,
            env={"HOSTLER_PORT": str(_free_port())},
        )  # fmt: skip
    finally:
        data.chmod(0o700)
    assert done.returncode == 1, done.stderr
    checks = {c["check"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["data dir"] == {
        "check": "data dir",
        "status": "fail",
        "detail": f"{data}: cannot be written (mode 0500)",
        "fix": f"chmod 700 {data}, {ANOTHER_DIR}",
    }


def _config(data: Path, **changes: object) -> DaemonConfig:
    return DaemonConfig(data_dir=data, **changes)  # type: ignore[arg-type]


def test_the_token_file_ok_missing_public_or_malformed(tmp_path: Path) -> None:
    token = tmp_path / "token"
    config = _config(tmp_path)
    # a fresh data directory is not a failure: the first hostler serve makes the token
    assert doctor.check_token(config) == Finding(
        "token", "absent", f"{token}: not made yet (the first `hostler serve` makes it, mode 0600)"
    )
    token.write_text(secrets.token_urlsafe(32) + "\n")
    token.chmod(0o600)
    assert doctor.check_token(config) == Finding("token", "ok", f"{token} (mode 0600)")
    token.chmod(0o644)
    remake = f"delete {token}; `hostler serve` makes a new one (mode 0600)"
    assert doctor.check_token(config) == Finding(
        "token", "fail", f"{token}: readable by others (mode 0644): no secret any more", remake
    )
    token.write_text("short\n")
    token.chmod(0o600)
    assert doctor.check_token(config) == Finding(
        "token", "fail", f"{token}: not a hostler token", remake
    )
    assert doctor.check_token(_config(tmp_path, auth="none")).detail == (
        "auth = none: every route open to this machine's users"
    )
    assert doctor.check_token(_config(tmp_path, token="t" * 40)).detail == "HOSTLER_TOKEN gives it"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_free_port_is_ok() -> None:
    port = _free_port()
    assert doctor.check_port("127.0.0.1", port) == Finding(
        "port", "ok", f"127.0.0.1:{port} is free for `hostler serve`"
    )


class _NotHostler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_error(404)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def other_listener() -> Iterator[int]:
    """Another program's HTTP server on a loopback port (it answers 404 to everything)."""
    server = http.server.HTTPServer(("127.0.0.1", 0), _NotHostler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()
    thread.join()


def test_a_port_taken_by_another_listener_fails(other_listener: int) -> None:
    assert doctor.check_port("127.0.0.1", other_listener) == Finding(
        "port",
        "fail",
        f"127.0.0.1:{other_listener}: address already in use, and it is not a hostler serve",
        "stop what listens there, or choose another port (HOSTLER_PORT, [server] port, "
        "hostler serve --port)",
    )


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_a_binary_that_is_not_executable_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o644)
    monkeypatch.setenv("HOSTLER_LLAMA_SERVER", str(binary))
    assert doctor.check_binaries()[0] == Finding(
        "llama-server",
        "fail",
        f"{binary}: llama-server binary is not executable (named by $HOSTLER_LLAMA_SERVER)",
        "point the variable (or the config's `binary`) at an executable llama-server, "
        "or unset it to use the one found on PATH",
    )


def test_a_binary_that_dies_of_sigill_names_the_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = _executable(tmp_path / "llama-server", "#!/bin/sh\nkill -ILL $$\n")
    monkeypatch.setenv("HOSTLER_LLAMA_SERVER", str(binary))
    assert doctor.check_binaries()[0] == Finding(
        "llama-server",
        "fail",
        f"{binary}: does not run here (killed by SIGILL: an instruction this CPU lacks)",
        BUILD_FIX,
    )


def test_a_binary_that_fails_its_version_says_how(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = _executable(
        tmp_path / "llama-server", "#!/bin/sh\necho 'libfoo.so: missing' >&2\nexit 127\n"
    )
    monkeypatch.setenv("HOSTLER_LLAMA_SERVER", str(binary))
    assert doctor.check_binaries()[0].detail == (
        f"{binary}: does not run here (--version exited with status 127: libfoo.so: missing)"
    )


def test_the_real_llama_server_is_found_with_its_version() -> None:
    binary = find_llama_server()
    found = doctor.check_binaries()[0]
    assert found.status == "ok"
    assert found.detail.startswith(f"{binary} (version: ")


def test_what_the_log_learned_about_this_build_fails_the_cpu_check(tmp_path: Path) -> None:
    binary = find_llama_server()
    build = PluginHost().load().adapter("llamacpp").build_identity(LaunchCommand([str(binary)]))
    assert doctor.check_cpu(tmp_path).status == "ok"  # no log yet: nothing learned
    with EventStore.open(tmp_path / "events.db") as store:
        assert doctor.check_cpu(tmp_path).status == "ok"  # a log that learned nothing
        for what, version in (("quantized-kv", 0), ("weights", 1)):
            learned = CpuUnsupported(
                at=1.0, key="llamacpp:m:0", build=build, cpu=cpu_identity(), what=what,
                kv_type="f16", model="/models/m.gguf", message="exited (signal 4)",
            )  # fmt: skip
            store.append(CPU_STREAM, [learned], expected_version=version)
        other = CpuUnsupported(
            at=1.0, key="llamacpp:o:0", build="another-build", cpu=cpu_identity(),
            what="weights", kv_type="f16", model="/models/o.gguf", message="exited (signal 4)",
        )  # fmt: skip
        store.append(CPU_STREAM, [other], expected_version=2)
    found = doctor.check_cpu(tmp_path)
    assert found.status == "fail"
    assert found.detail.endswith(
        "the log says this llama-server cannot run a quantized KV cache (it runs f16 KV "
        "instead) nor the weights of /models/m.gguf on this CPU (L22: it died of SIGILL)"
    )
    assert found.fix == BUILD_FIX


#: What a model file starts with (the walk reads these 4 bytes; the rest is not read here).
GGUF = b"GGUF\x03\x00\x00\x00"


def test_models_are_those_serve_would_offer(tmp_path: Path) -> None:
    from hostler.config import discovered_config, with_places

    models = tmp_path / "models"
    models.mkdir()
    (models / "Alpha-F16.gguf").write_bytes(GGUF)
    (models / "beta.gguf").write_bytes(GGUF)
    (models / "empty.gguf").write_bytes(b"")  # not a model: serve refuses it, and so here
    only_empty = with_places(discovered_config(tmp_path / "other"), {})
    (tmp_path / "other" / "models").mkdir(parents=True)
    (tmp_path / "other" / "models" / "empty.gguf").write_bytes(b"")
    assert doctor.check_models(only_empty, tmp_path / "other" / "models", configured=False) == (
        Finding(
            "models",
            "fail",
            f"no models in {tmp_path / 'other' / 'models'}: 1 found but not offered "
            f"({tmp_path.resolve() / 'other' / 'models' / 'empty.gguf'}: not a GGUF file (it "
            "does not start with 'GGUF'))",
            f"put a .gguf model into {tmp_path / 'other' / 'models'} (or set HOSTLER_MODELS_DIR, "
            "or give --config FILE)",
        )
    )
    hub = tmp_path / "user" / ".cache" / "huggingface" / "hub" / "models--org--Gamma-GGUF"
    (hub / "snapshots" / "abc123").mkdir(parents=True)
    (hub / "snapshots" / "abc123" / "gamma-Q8_0.gguf").write_bytes(GGUF)
    config = with_places(discovered_config(tmp_path), {"HOME": str(tmp_path / "user")})
    assert doctor.check_models(config, models, configured=False) == Finding(
        "models",
        "ok",
        f"3 in {models}, {hub / 'snapshots' / 'abc123'}: alpha-f16, beta, hf-org-gamma-q8_0",
    )


# --- the command, as a user runs it ---------------------------------------------------------


def _ready_home(tmp_path: Path) -> dict[str, str]:
    """A data directory serve could use at once: a model, a private token, a free port."""
    data = tmp_path / "data"
    (data / "models").mkdir(parents=True, mode=0o700)
    data.chmod(0o700)
    (data / "models" / "tiny.gguf").write_bytes(GGUF)
    token = data / "token"
    token.write_text(secrets.token_urlsafe(32))
    token.chmod(0o600)
    # HOME: this user's own Hugging Face cache, Ollama and LM Studio folders (none here)
    return {
        "HOSTLER_HOME": str(data),
        "HOSTLER_PORT": str(_free_port()),
        "HOME": str(tmp_path / "user"),
    }


def test_doctor_on_a_ready_machine_says_ok_and_exits_0(tmp_path: Path) -> None:
    env = _ready_home(tmp_path)
    data, port = env["HOSTLER_HOME"], env["HOSTLER_PORT"]
    done = run_cli("doctor", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"hostler 0.1.0, data directory {data}"
    marks = {line[6:20].strip(): line for line in lines[1:-1]}
    assert marks["llama-server"].startswith(f"OK    llama-server  {find_llama_server()} (version")
    assert marks["cpu"].startswith("OK    cpu           ")
    assert marks["gpu"].startswith(("OK    gpu ", "--    gpu "))
    assert marks["data dir"] == f"OK    data dir      {data} (mode 0700)"
    assert marks["token"] == f"OK    token         {data}/token (mode 0600)"
    assert marks["port"] == f"OK    port          127.0.0.1:{port} is free for `hostler serve`"
    assert marks["models"] == f"OK    models        1 in {data}/models: tiny"
    assert lines[-1] == f"all {len(lines) - 2} checks OK"
    assert not done.stderr


def test_doctor_json_and_exit_1_on_a_failure(tmp_path: Path, other_listener: int) -> None:
    env = _ready_home(tmp_path)
    (Path(env["HOSTLER_HOME"]) / "token").chmod(0o644)  # readable by others: no secret
    env["HOSTLER_PORT"] = str(other_listener)
    done = run_cli("doctor", "--json", env=env)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is False
    assert report["data_dir"] == env["HOSTLER_HOME"]
    failed = {c["check"]: c["detail"] for c in report["checks"] if c["status"] == "fail"}
    assert failed == {
        "token": f"{env['HOSTLER_HOME']}/token: readable by others (mode 0644): no secret any more",
        "port": f"127.0.0.1:{other_listener}: address already in use, and it is not a hostler serve",
    }


def test_a_setting_serve_would_refuse_is_a_failed_check_not_a_traceback(tmp_path: Path) -> None:
    env = {**_ready_home(tmp_path), "HOSTLER_PORT": "99999"}
    done = run_cli("doctor", env=env)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    config_line = next(line for line in done.stdout.splitlines() if " config " in line)
    assert config_line.startswith(
        "FAIL  config        hostler serve would refuse its settings: [usage.setting] HOSTLER_PORT"
    )
    assert "OK    models        1 in" in done.stdout  # the rest judged on the default settings


def test_doctor_sees_the_hostler_serve_on_its_port(tmp_path: Path) -> None:
    child = ServeChild(tmp_path, models="")
    try:
        done = run_cli(
            "doctor", "--config", str(child.config), env={"HOSTLER_PORT": str(child.port)}
        )
    finally:
        child.close()
    lines = {line[6:20].strip(): line for line in done.stdout.splitlines()[1:-1]}
    assert lines["port"] == (
        f"OK    port          127.0.0.1:{child.port}: a hostler serve is there (GET /health: ok)"
    )
    assert lines["token"] == f"OK    token         {child.data}/token (mode 0600)"
    assert lines["models"] == (
        "FAIL  models        the config names none; fix: add a [[models]] table to the "
        "config (docs/daemon.md)"
    )
    assert done.returncode == 1


def test_models_keep_the_ids_the_daemons_log_gave_them(tmp_path: Path) -> None:
    """The doctor names a file by the id the daemon serves it under (its recorded offer), not
    by a fresh plan (a breaking helper saw ``alpha-3``, which the daemon did not have)."""
    from hostler.config import discovered_config, with_places
    from hostler.events.discovery import MODELS_STREAM, ModelsOffered
    from hostler.store.log import EventStore

    models = tmp_path / "models"
    first, second = models / "a" / "alpha.gguf", models / "b" / "alpha.gguf"
    for path in (first, second):
        path.parent.mkdir(parents=True)
        path.write_bytes(GGUF)
    recorded = [  # a's file holds an id a fresh plan would not give it (alpha, a sorting first)
        {"id": "alpha", "path": str(second.resolve()), "source": "models", "size": len(GGUF)},
        {"id": "legacy", "path": str(first.resolve()), "source": "models", "size": len(GGUF)},
    ]
    with EventStore.open(tmp_path / "events.db", owner=True) as store:
        store.append(MODELS_STREAM, [ModelsOffered(1.0, recorded, [], [])], expected_version=None)
    config = with_places(discovered_config(tmp_path), {})
    assert doctor.check_models(config, models, configured=False) == Finding(
        "models",
        "ok",
        f"2 in {first.resolve().parent}, {second.resolve().parent}: alpha, legacy",
    )


def test_every_file_found_but_not_offered_is_named_with_why() -> None:
    """A breaking helper: three files refused, one named."""
    where = Path("/d/models")
    refused = [
        ("/d/models/zero.gguf", "not a GGUF file (it does not start with 'GGUF')"),
        ("/d/models/mmproj-x.gguf", "a multimodal projector (mmproj), not a model: not offered"),
        ("/d/models/m-00001-of-00002.gguf", "split GGUF 'm': incomplete set, missing part(s) 2"),
    ]
    assert models_verdict([], [], where, configured=False, refused=refused).detail == (
        "no models in /d/models: 3 found but not offered (/d/models/zero.gguf: not a GGUF file "
        "(it does not start with 'GGUF'); /d/models/mmproj-x.gguf: a multimodal projector "
        "(mmproj), not a model: not offered; /d/models/m-00001-of-00002.gguf: split GGUF 'm': "
        "incomplete set, missing part(s) 2)"
    )
