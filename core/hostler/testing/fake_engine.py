"""A fake engine: a real process with scriptable behaviour, and the adapter that launches it.

The process (:mod:`hostler.testing.fake_server`) speaks enough of the OpenAI and llama-server
HTTP API to serve a completion, and misbehaves on request: slow loads, a crash on the Nth
request, a hang on SIGTERM, a fatal log line, a health check that answers before the model is
loaded, a health check that waits behind a completion, a new request that cuts a running
stream. hostler's real supervisor runs it like any engine (process group, launch token,
readiness, health, stop, adoption), so a test of a plugin or an embedding application can
exercise every failure path without a model or a GPU::

    from hostler.testing.fake_engine import Behaviour, FakeEngineAdapter

    adapter = FakeEngineAdapter(Behaviour(load_seconds=2, crash_on_request=3))
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from hostler.plugin import (
    EngineAdapter,
    LaunchCommand,
    LaunchSpec,
    ModelGeometry,
    Panic,
    Register,
    hookimpl,
)
from hostler.testing import fake_server

__all__ = [
    "FATAL_PREFIX",
    "READY_LINE",
    "SERVER",
    "Behaviour",
    "FakeEngineAdapter",
    "register_engines",
]

#: The script the fake engine process runs (standard library only).
SERVER = Path(fake_server.__file__)
#: The line the fake engine prints once it is ready.
READY_LINE = fake_server.READY_LINE
#: Lines that start with this are fatal (:meth:`FakeEngineAdapter.classify_line`).
FATAL_PREFIX = "FATAL:"


@dataclass(frozen=True, slots=True)
class Behaviour:
    """What the fake engine process does; the defaults make a well-behaved, instant engine.

    Attributes:
        load_seconds: Seconds between the start and readiness (a slow model load).
        listen_while_loading: Open the port at once; ``/health`` answers 503 while loading
            (llama-server's way). Otherwise the port stays closed until ready.
        health_before_ready: Open the port at once and answer ``/health`` 200 while loading;
            completions answer 503 until loaded (``mlx_lm.server``'s way).
        crash_on_request: The completion request (1-based) on which the process exits with
            ``crash_exit_code`` instead of answering; 0: never.
        crash_exit_code: The exit status of that crash.
        ignore_sigterm: Ignore SIGTERM (an engine that hangs on stop: only SIGKILL ends it).
        fatal_line: A line printed once at startup, before loading (with the default adapter a
            line starting with ``FATAL:`` is a fatal one).
        exit_code: Exit with this status where it would have become ready (None: do not).
        ballast_mib: MiB of touched memory it holds (a known footprint).
        reply: The text of every completion.
        reply_delay: Seconds each completion takes.
        stream_seconds: Seconds a streamed completion runs: its text at once, its final chunk
            (``finish_reason``) this long after (a long generation).
        serial: Serve one request at a time, ``/health`` included: a request waits while a
            completion runs (a server with one worker, or one that holds a lock for a whole
            generation).
        cut_streams: A new completion cuts every running stream short: ``data: [DONE]`` at
            once, with no ``finish_reason`` (llama-cpp-python's server, ``interrupt_requests``).
    """

    load_seconds: float = 0.0
    listen_while_loading: bool = False
    health_before_ready: bool = False
    crash_on_request: int = 0
    crash_exit_code: int = 1
    ignore_sigterm: bool = False
    fatal_line: str = ""
    exit_code: int | None = None
    ballast_mib: int = 0
    reply: str = "hello from the fake engine"
    reply_delay: float = 0.0
    stream_seconds: float = 0.0
    serial: bool = False
    cut_streams: bool = False

    def to_json(self) -> str:
        """The behaviour as the process reads it (only the fields that differ from defaults)."""
        default = Behaviour()
        changed = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        }
        return json.dumps(changed, sort_keys=True)


class FakeEngineAdapter(EngineAdapter):
    """Launches the fake engine with a :class:`Behaviour` (engine name ``fake``).

    Its geometry is the model file's size (any file will do as a model); its footprint is the
    default estimate plus ``ballast_mib``. ``Behaviour`` may also come per launch from the
    spec's ``options`` (keys named as its fields), over the adapter's own.
    """

    engine_type = "fake"
    readiness_path = "/health"
    applies_extra_args = True  # build_command places them (flags as written, no "--" added)

    def __init__(self, behaviour: Behaviour | None = None, *, python: str | None = None) -> None:
        self.behaviour = behaviour or Behaviour()
        self.python = python or sys.executable

    def behaviour_for(self, spec: LaunchSpec) -> Behaviour:
        """The adapter's behaviour with the spec's ``options`` laid over it."""
        names = {f.name for f in dataclasses.fields(Behaviour)}
        changes = {k: v for k, v in spec.options.items() if k in names}
        return dataclasses.replace(self.behaviour, **changes)  # type: ignore[arg-type]

    def build_command(self, spec: LaunchSpec) -> LaunchCommand:
        """``python fake_server.py PORT BEHAVIOUR --model MODEL``, then the extras, last."""
        program = str(spec.binary) if spec.binary is not None else self.python
        behaviour = self.behaviour_for(spec).to_json()
        argv = [program, str(SERVER), str(spec.port), behaviour, "--model", str(spec.model)]
        for flag, value in spec.extra_args.items():
            if value is False:
                continue
            argv.append(flag)
            if value is not True:
                argv.append(str(value))
        return LaunchCommand(argv)

    def classify_line(self, line: str) -> Panic | None:
        """A line that starts with ``FATAL:`` is fatal (kind ``fake-fatal``)."""
        if line.strip().startswith(FATAL_PREFIX):
            return Panic("fake-fatal", line.strip()[:500])
        return None

    def read_geometry(self, model: Path) -> ModelGeometry:
        """Only the file's size (a directory counts as empty)."""
        size = model.stat().st_size if model.is_file() else 0
        return ModelGeometry(architecture="fake", file_size=size, tensor_bytes=size)

    def estimate_footprint(self, geometry: ModelGeometry, spec: LaunchSpec) -> int:
        """The default estimate plus the ballast the process will hold."""
        ballast = self.behaviour_for(spec).ballast_mib * 1024 * 1024
        return super().estimate_footprint(geometry, spec) + ballast


@hookimpl
def register_engines(register: Register) -> None:
    """Register the fake engine (for a plugin host a test builds; never an entry point)."""
    register(FakeEngineAdapter)
