"""The MLX adapter: how ``mlx_lm.server`` is launched, judged ready and priced (§3.3)."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from hostler.plugin import (
    EngineAdapter,
    LaunchCommand,
    LaunchSpec,
    ModelFileError,
    ModelGeometry,
    OptionType,
    Panic,
    ReadinessProbe,
    check_model_path,
    flag_argv,
    parse_json,
)
from hostler_mlx.geometry import read_mlx_model
from hostler_mlx.pricing import MLX_HEADROOM, estimate_mlx, geometry_known

__all__ = [
    "BOOTSTRAP",
    "MLX_OPTIONS",
    "OFFLINE_ENV",
    "PROBE_BODY",
    "MlxAdapter",
    "mlx_argv",
]

#: The program ``python -c`` runs: set MLX's wired-memory limit to the bytes given first
#: (M9: the planned reservation, never the whole working set), keep ``mlx_lm.server`` from
#: raising it to the recommended maximum, serve the launch's model whatever a request's
#: ``model`` says (M3: clients name hostler's model id, which ``mlx_lm.server`` would take for
#: a hub repository to download), then run the server with the rest of the argv.
BOOTSTRAP = (
    "import sys;import mlx.core as mx;import mlx_lm.server as s;"
    "mx.set_wired_limit(int(sys.argv.pop(1)));"
    "s.maybe_set_recommended_wired_limit=lambda:None;"
    "f=s.ModelProvider.load;"
    "s.ModelProvider.load=lambda p,m,a=None,d=None:f(p,'default_model',a,d);"
    "sys.argv[0]='mlx_lm.server';s.main()"
)
#: M3: model hubs offline (a model is a local directory, never a download), no telemetry.
OFFLINE_ENV: Mapping[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "PYTHONUNBUFFERED": "1",
}
#: RD1/M4: the readiness probe, a 1-token chat completion. ``/health`` answers 200 before
#: the model is loaded; a completion answers only once it is.
PROBE_BODY = json.dumps(
    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 0}
).encode()
#: The ``options`` the MLX engine takes (``[engine_defaults.mlx.options]``), each a flag.
MLX_OPTIONS: Mapping[str, OptionType] = {
    "prefill_step_size": int,
    "prompt_cache_size": int,
    "prompt_cache_bytes": int,
    "chat_template": str,
    "max_tokens": int,
}
_FATAL = re.compile(
    r"^(?:\w+\.)*(?P<error>\w*(?:Error|Exception)): (?P<detail>.+)$|"
    r"(?P<oom>\[METAL\].*Insufficient Memory|std::bad_alloc)"
)


def mlx_argv(
    python: str,
    model: Path,
    port: int,
    *,
    wired_limit: int,
    concurrency: int,
    options: Mapping[str, object],
) -> list[str]:
    """M3: the ``mlx_lm.server`` argv through :data:`BOOTSTRAP`, options as flags in order."""
    argv = [
        python, "-c", BOOTSTRAP, str(max(0, wired_limit)),
        "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
        "--decode-concurrency", str(max(1, concurrency)),
        "--prompt-concurrency", str(max(1, concurrency)),
    ]  # fmt: skip
    for key in MLX_OPTIONS:
        if key in options:
            flag = f"--{key.replace('_', '-')}"
            argv += flag_argv(flag, options[key], join_dash_values=True)  # argparse: RD5
    return argv


class MlxAdapter(EngineAdapter):
    """``mlx_lm.server`` (MLX; Metal on Apple Silicon, the CPU backend elsewhere)."""

    engine_type = "mlx"
    readiness_path = "/health"
    model_kind = "directory"
    options_schema = MLX_OPTIONS
    join_dash_values = True  # RD5: mlx_lm.server's argparse takes a separate "-x" for a flag
    kv_headroom = MLX_HEADROOM
    kv_types = ("f16",)  # M5: mlx_lm keeps its KV cache in the model's float type, priced as f16
    #: M4/RD7: 300 s to load and answer the probe; idle is the daemon's (5 minutes).
    startup_timeout = 300.0

    def validate_model(self, model: Path) -> Path:
        """RD2: an absolute directory holding a readable ``config.json``."""
        path = check_model_path(model, "directory")
        read_mlx_model(path)
        return path

    def slot_limit(self, geometry: ModelGeometry) -> int | None:
        """S8/M6: one slot when the geometry is unknown (the launch is serial), else none."""
        return self.max_slots if geometry_known(geometry) else 1

    def model_identity(self, model: Path) -> str:
        """The directory's name (``Qwen3-0.6B-4bit``), not its ``config.json``."""
        return Path(model).name or str(model)

    def read_geometry(self, model: Path) -> ModelGeometry:
        """M10: the geometry ``config.json`` gives, with the weight files' size."""
        return read_mlx_model(Path(model)).geometry

    def estimate_footprint(self, geometry: ModelGeometry, spec: LaunchSpec) -> int:
        """M5: weights (CB11-MLX) plus f16 KV for the spec's slots (one when unknown)."""
        return estimate_mlx(geometry, ctx_per_slot=spec.ctx_per_slot, slots=spec.slots)

    def build_command(self, spec: LaunchSpec) -> LaunchCommand:
        """M3, M6, M9: the server on loopback, serial when the geometry is unknown.

        The wired-memory limit is the bytes hostler reserved for this launch
        (``spec.reserved_bytes``, RD8: the estimate corrected by learning); without a
        reservation (no ledger) this launch's own estimate (M5); 0 reserved wires nothing.
        """
        try:
            geometry = self.read_geometry(spec.model)
        except ModelFileError:
            geometry = ModelGeometry()
        concurrency = spec.slots if geometry_known(geometry) else 1
        python = str(spec.binary) if spec.binary is not None else sys.executable
        argv = mlx_argv(
            python,
            spec.model,
            spec.port,
            wired_limit=(  # 0 reserved wires nothing: never more than the ledger holds (M9)
                spec.reserved_bytes
                if spec.reserved_bytes is not None
                else self.estimate_footprint(geometry, spec)
            ),
            concurrency=concurrency,
            options=spec.options,
        )
        return LaunchCommand(argv, dict(OFFLINE_ENV))

    def readiness(self, spec: LaunchSpec) -> ReadinessProbe:
        """RD1/M4: ready once a 1-token chat completion answers (the model is loaded)."""
        del spec
        return ReadinessProbe(path="/v1/chat/completions", method="POST", body=PROBE_BODY, wait=60)

    def is_ready_response(self, status: int, body: bytes) -> bool:
        """A 2xx completion that holds ``choices`` (an error body is not ready)."""
        if not self.is_ready(status):
            return False
        try:
            data = parse_json(body)
        except ValueError:  # not JSON, or nested past the decoder's depth: not ready
            return False
        return isinstance(data, dict) and bool(data.get("choices"))

    def classify_line(self, line: str) -> Panic | None:
        """M11: a Python error line (the server's load failed) or MLX out of memory."""
        match = _FATAL.search(line.strip())
        if match is None:
            return None
        if match.group("oom"):
            return Panic("out-of-memory", line[:500], priority=5)
        error = match.group("error")
        if error.endswith("Warning"):
            return None
        return Panic("startup-error", line[:500], priority=3)
