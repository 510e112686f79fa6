"""The ds4 adapter: how ``ds4-server`` is launched, priced and read (facts, not policy).

ds4 runs DeepSeek-V4 / GLM 5.x GGUF models whose experts stream from the SSD. What differs from
llama.cpp (§3.2 of the reference behaviour, ``docs/rules.md`` D2–D8, D10):

- strictly serial (D4): one slot, no ``--parallel``; a launch asked for more is refused;
- its own launch context (D5), never the llama planner's window;
- SSD expert streaming by default, full residency only when safe (D7), an expert cache sized
  to what the host can spare (D8), a 16 GiB disk KV budget (D2, IN37);
- a footprint from the catalog's resident line at the launch context (D6), else
  ``min(size, 48 GiB)`` (D10);
- readiness on ``GET /v1/models`` (D3; it has no ``/health``);
- a hard singleton: a second instance exits before ready (IN4); the recovery is the
  supervisor's sweep and retry, which :meth:`Ds4Adapter.on_exited_before_ready` asks for (RD9).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Mapping
from pathlib import Path

import psutil

from hostler.plugin import (
    EngineAdapter,
    EngineStartError,
    LaunchCommand,
    LaunchSpec,
    ModelGeometry,
    Panic,
    SettingError,
    context_floor,
    find_engine_binary,
)
from hostler_ds4 import rules
from hostler_ds4.panic import classify_line
from hostler_ds4.settings import OPTION_TYPES, Ds4Settings, passthrough, read_settings

__all__ = ["BINARY_ENV", "Ds4Adapter", "Ds4Launch", "find_ds4_server"]

#: The environment variable naming the ds4-server binary (D2's ``GEZEL_*`` made ``HOSTLER_*``).
BINARY_ENV = "HOSTLER_DS4_SERVER"


def find_ds4_server(configured: str | os.PathLike[str] | None = None) -> Path:
    """The binary to run: ``configured``, ``$HOSTLER_DS4_SERVER``, then ``ds4-server`` on PATH.

    The search is :func:`hostler.plugin.find_engine_binary`.

    Raises:
        EngineBinaryError: None found, or the one named is not an executable file.
    """
    return find_engine_binary(
        configured, BINARY_ENV, "ds4-server", hint="name it as [engine_defaults.ds4] binary"
    )


class Ds4Launch:
    """One launch's decisions (pure results of :mod:`hostler_ds4.rules` over its inputs)."""

    def __init__(self, settings: Ds4Settings, *, system_ram: int, machine: str, size: int) -> None:
        self.settings = settings
        floor = context_floor(os.environ)
        try:
            self.ctx = rules.launch_context(
                system_ram,
                floor=floor,
                configured=settings.ctx,
                override=settings.model_ctx,
                catalog_max=settings.max_launch_ctx,
            )
        except ValueError as exc:
            raise SettingError(str(exc)) from None
        self.mode = rules.residency(
            want_streaming=settings.streaming,
            machine=machine,
            model_size=size,
            system_ram=system_ram,
        )
        self.cache = rules.expert_cache(
            system_ram,
            configured_gib=settings.expert_cache_gib,
            catalog_resident=settings.resident_bytes,
            catalog_cache=settings.cache_bytes,
        )
        self.line = rules.resident_line(
            settings.resident_bytes, settings.kv_bytes_per_token, settings.resident_ctx
        )
        self.footprint = rules.footprint(
            self.mode,
            launch_ctx=self.ctx,
            model_size=size,
            line=self.line,
            catalog_resident=settings.resident_bytes,
        )
        self.kv_disk_mb = rules.kv_disk_mb(settings.kv_disk_mb)
        self.system_ram = system_ram


class Ds4Adapter(EngineAdapter):
    """``ds4-server`` (DeepSeek-V4 / GLM 5.x with SSD expert streaming).

    Args:
        binary: The ds4-server to run (else ``$HOSTLER_DS4_SERVER``, else PATH).
        system_ram: The host's RAM in bytes (default: psutil's total).
        machine: ``platform.machine()`` (D7 honours full residency on arm64 only).
        system: ``platform.system()`` (``Darwin`` launches ``--metal``, else ``--cuda``).
        environ: Where ``HOSTLER_DS4_*`` settings are read (default: ``os.environ``).
    """

    engine_type = "ds4"
    readiness_path = "/v1/models"
    #: The flags that set a price are read as settings; the rest are placed by build_command.
    applies_extra_args = True
    options_schema = OPTION_TYPES
    max_slots = 1  # D4: strictly serial
    #: D3/RD7: a ds4 model loads (or maps its experts) for up to 10 minutes; idle is the
    #: daemon's ``idle_timeout`` (5 minutes by default), with no freeze stage.
    startup_timeout = 600.0

    def __init__(
        self,
        binary: str | os.PathLike[str] | None = None,
        *,
        system_ram: int | None = None,
        machine: str | None = None,
        system: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._configured = binary
        self._ram: Callable[[], int] = (
            (lambda: int(psutil.virtual_memory().total))
            if system_ram is None
            else (lambda: system_ram)
        )
        self._machine = machine or platform.machine()
        self._system = system or platform.system()
        self._environ = os.environ if environ is None else environ

    def binary(self, spec: LaunchSpec | None = None) -> Path:
        """The ds4-server a launch of ``spec`` runs (the config's wins over the adapter's)."""
        if spec is not None and spec.binary is not None:
            return find_ds4_server(spec.binary)
        return find_ds4_server(self._configured)

    def settings(self, spec: LaunchSpec) -> Ds4Settings:
        """The operator's ds4 settings for ``spec`` (raises ``SettingError`` on a bad one)."""
        return read_settings(spec.options, spec.extra_args, self._environ)

    def plan(self, spec: LaunchSpec, size: int) -> Ds4Launch:
        """The launch decisions for ``spec`` and a model of ``size`` bytes."""
        return Ds4Launch(
            self.settings(spec), system_ram=self._ram(), machine=self._machine, size=size
        )

    def build_command(self, spec: LaunchSpec) -> LaunchCommand:
        """D2: the ds4-server command line; the operator's other flags are appended last.

        Raises:
            EngineStartError: More than one slot (D4), or a streaming launch with no safe
                expert cache (D8).
            SettingError: A bad ds4 setting.
            EngineBinaryError: No ds4-server.
        """
        if spec.slots != 1:
            raise EngineStartError(
                f"{spec.key}: ds4 is strictly serial (D4): it runs one request at a time; "
                f"set slots = 1, not {spec.slots}"
            )
        binary = self.binary(spec)
        try:
            size = spec.model.stat().st_size
        except OSError:
            size = 0
        launch = self.plan(spec, size)
        if launch.mode is rules.Residency.STREAMING and launch.cache.unsafe:
            raise EngineStartError(
                f"{spec.key}: SSD streaming needs at least 1 GiB of expert cache beside the "
                f"resident part and 32 GiB for the system, and this host's "
                f"{launch.system_ram // rules.GIB} GiB of RAM leaves none (D8): run it on a "
                "bigger host or give ds4 a smaller model"
            )
        kv_dir = launch.settings.kv_dir or (
            spec.work_dir / "kv" if spec.work_dir is not None else None
        )
        if kv_dir is None:
            raise SettingError(f"{spec.key}: ds4 needs a work directory or the kv_dir option")
        cwd = launch.settings.cwd or binary.resolve().parent
        argv = [
            str(binary),
            "--model",
            str(spec.model),
            "--metal" if self._system == "Darwin" else "--cuda",
            "--ctx",
            str(launch.ctx),
            "--host",
            "127.0.0.1",
            "--port",
            str(spec.port),
            "--kv-disk-dir",
            str(kv_dir),
            "--kv-disk-space-mb",
            str(launch.kv_disk_mb),
            "--cors",
        ]
        if launch.mode is rules.Residency.STREAMING:
            argv += ["--ssd-streaming", "--ssd-streaming-cache-experts", f"{launch.cache.gib}GB"]
        # D2: shaders load relative to the working directory, which hostler sets to the
        # engine's work directory: ds4-server's --chdir moves it to the binary's own
        argv += ["--chdir", str(cwd)]
        for flag, value in passthrough(spec.extra_args):
            argv += [flag] if value is None else [flag, value]
        return LaunchCommand(argv)

    def estimate_footprint(self, geometry: ModelGeometry, spec: LaunchSpec) -> int:
        """ER5 for ds4: the catalog line at the launch context (D6), residency floor (D7).

        The window and slots the llama planner chose do not matter: ds4 launches at its own
        context (D5) with one slot (D4).
        """
        return self.plan(spec, geometry.file_size).footprint

    def classify_line(self, line: str) -> Panic | None:
        """SV14 for ds4: its startup refusals (the singleton lock first) and GPU failures."""
        return classify_line(line)

    def on_exited_before_ready(self, message: str) -> bool:
        """RD9 (SV10a): an exit before ready, or the lock refusal, may be a stale ds4 (IN4).

        ds4-server is a singleton: while an unowned one still holds the lock, a new one exits
        before it is ready. hostler sweeps this data directory's unowned strays once, then
        tries the start once more when it stopped one.
        """
        return rules.exited_before_ready(message)

    def build_identity(self, command: LaunchCommand) -> str:
        """The binary's path and size (ds4 publishes no build sidecar)."""
        binary = Path(command.argv[0])
        try:
            return f"{binary.resolve()}@{binary.stat().st_size}"
        except OSError:
            return str(binary)
