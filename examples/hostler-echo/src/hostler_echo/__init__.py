"""hostler-echo: a hostler engine plugin for the echo engine (the tutorial's plugin).

The adapter supplies the facts of one engine kind; hostler decides when, where and whether to
run it (docs/plugins/tutorial.md builds this file step by step).
"""

from __future__ import annotations

import sys
from pathlib import Path

from hostler.plugin import (
    EngineAdapter,
    LaunchCommand,
    LaunchSpec,
    ModelFileError,
    ModelGeometry,
    Panic,
    ReadinessProbe,
    Register,
    hookimpl,
)

__version__ = "0.1.0"

MIB = 1024**2


class EchoAdapter(EngineAdapter):
    """The echo engine (``python -m hostler_echo.server``) under hostler."""

    engine_type = "echo"  # [[models]] engine = "echo"; keys echo:MODEL:0
    model_kind = "file"  # a model is one file (the default; "directory" for a folder)
    options_schema = {"upper": bool, "load_seconds": float}  # noqa: RUF012 - a ClassVar

    def build_command(self, spec: LaunchSpec) -> LaunchCommand:
        """The engine's argv: our server on hostler's port, bound to loopback only."""
        python = str(spec.binary or sys.executable)  # [engine_defaults.echo] binary wins
        argv = [python, "-m", "hostler_echo.server", "--model", str(spec.model)]
        argv += ["--host", "127.0.0.1", "--port", str(spec.port)]
        if spec.options.get("upper"):
            argv.append("--upper")
        if "load_seconds" in spec.options:
            argv += ["--load-seconds", str(spec.options["load_seconds"])]
        return LaunchCommand(argv, env={"PYTHONUNBUFFERED": "1"})

    def readiness(self, spec: LaunchSpec) -> ReadinessProbe:
        """Ready when /health's body says so: it answers 200 "loading" while it loads."""
        return ReadinessProbe(path="/health", expect_json={"status": "ok"})

    def classify_line(self, line: str) -> Panic | None:
        """The engine's fatal lines: hostler aborts a start on one at once."""
        if line.startswith("error: cannot read model"):
            return Panic("model-unreadable", line)
        if "Address already in use" in line:
            return Panic("address-in-use", line)
        return None

    def read_geometry(self, model: Path) -> ModelGeometry:
        """The model's shape: an echo model has a size and nothing else."""
        try:
            size = model.stat().st_size
        except OSError as exc:
            raise ModelFileError(f"{model}: cannot be read ({exc.strerror})") from None
        return ModelGeometry(architecture="echo", file_size=size)

    def estimate_footprint(self, geometry: ModelGeometry, spec: LaunchSpec) -> int:
        """Peak bytes: a Python process, the model, and 1 KiB per token of context."""
        return 32 * MIB + geometry.file_size + spec.ctx_per_slot * spec.slots * 1024

    def build_identity(self, command: LaunchCommand) -> str:
        """The engine build, for learning: this package's version."""
        return f"hostler-echo {__version__}"


@hookimpl
def register_engines(register: Register) -> None:
    """Called by hostler once at start-up, through the entry point in pyproject.toml."""
    register(EchoAdapter)
