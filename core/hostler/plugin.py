"""The public contract for engine adapter plugins.

An adapter supplies *facts* about one engine kind — how to launch it, where its readiness
endpoint is, how to recognise a fatal line in its log — and never policy: hostler decides when,
where and whether. A plugin registers adapter classes through the ``register_engines`` hook::

    from hostler.plugin import EngineAdapter, LaunchCommand, LaunchSpec, hookimpl

    class EchoAdapter(EngineAdapter):
        engine_type = "echo"

        def build_command(self, spec: LaunchSpec) -> LaunchCommand:
            return LaunchCommand(["python", "-m", "http.server", str(spec.port)])

    @hookimpl
    def register_engines(register):
        register(EchoAdapter)

and is declared in its ``pyproject.toml`` under ``[project.entry-points.hostler]``.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import pluggy

from hostler.capacity.estimate import estimate_llama
from hostler.capacity.geometry import ModelGeometry
from hostler.capacity.gguf_header import read_geometry as read_gguf_geometry
from hostler.capacity.offload import Offload, OffloadPlan
from hostler.capacity.units import round_half_up
from hostler.errors import EngineBinaryError, EngineStartError, ModelFileError
from hostler.policies.cache import CacheEntry, entry_bytes

__all__ = [
    "PROJECT",
    "CacheAdapter",
    "CacheEntry",
    "EngineAdapter",
    "EngineBinaryError",
    "EngineStartError",
    "LaunchCommand",
    "LaunchSpec",
    "ModelFileError",
    "ModelGeometry",
    "Offload",
    "OffloadPlan",
    "Panic",
    "Register",
    "entry_bytes",
    "estimate_llama",
    "hookimpl",
    "hookspec",
    "round_half_up",
]

#: The hook project name, the entry-point group and the distribution prefix.
PROJECT = "hostler"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

_ENGINE_TYPE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """Everything an adapter needs to build a launch, decided by hostler.

    Attributes:
        key: The engine key (``engine:model:replica``).
        model: The model file.
        port: The loopback port hostler chose; the engine must bind 127.0.0.1 only.
        ctx_per_slot: The planned per-slot context window.
        slots: Concurrent slots.
        kv_type: KV cache type, or None for the engine's default.
        work_dir: A directory the engine may write (slot saves, caches).
        extra_args: Operator flags appended last (they win): a value of True is a bare flag,
            False omits it, anything else is passed as its text.
        options: Engine-specific settings from the config.
        offload: The planner's GPU offload plan (L12; after a start that died of GPU
            out-of-memory, the next step of the L13 ladder), or None to leave it to the engine.
            The operator's own offload settings in ``options`` or ``extra_args`` win over it.
        binary: The engine program the operator configured (``[engine_defaults.<engine>]
            binary``), or None to let the adapter find its own. An adapter that runs one
            program runs this one when it is given.
    """

    key: str
    model: Path
    port: int
    ctx_per_slot: int
    slots: int = 1
    kv_type: str | None = None
    work_dir: Path | None = None
    extra_args: Mapping[str, str | int | float | bool] = field(default_factory=dict)
    options: Mapping[str, object] = field(default_factory=dict)
    offload: OffloadPlan | None = None
    binary: Path | None = None


@dataclass(frozen=True, slots=True)
class LaunchCommand:
    """The argv and extra environment of one launch."""

    argv: list[str]
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Panic:
    """A fatal line in the engine's output, classified.

    Attributes:
        kind: A stable kind (``cuda-out-of-memory``, ``assertion``, ``model-unreadable``...).
        line: The line itself, clipped.
        priority: A later panic replaces the current one when its priority is at least as high.
        fatal_at_startup: Seen before readiness, the start cannot succeed: abort at once.
    """

    kind: str
    line: str
    priority: int = 3
    fatal_at_startup: bool = True


@runtime_checkable
class CacheAdapter(Protocol):
    """CC12: an engine's prompt-cache mechanism, driven by hostler's cache controller.

    Every call is best effort: the controller bounds the async ones with a timeout and logs
    what they raise, so a failing engine never breaks it.
    """

    def request_extras(self, session_id: str) -> dict[str, Any]:
        """Fields to add to the session's next request body (synchronous, no I/O)."""
        ...

    async def evict(self, ids: Sequence[str]) -> None:
        """Drop these sessions' caches from the engine (unknown ids are ignored)."""
        ...

    async def report_usage(self) -> list[CacheEntry] | None:
        """The engine's own view of its cache entries, or None when it cannot tell."""
        ...


class EngineAdapter(ABC):
    """The facts of one engine kind. Subclass it, set ``engine_type``, and register it.

    Methods are plain and fast: hostler calls them from its event loop. New methods are added
    with defaults, so existing adapters keep working.
    """

    #: The engine's name in engine keys and configs (lower case, digits, ``-``, ``_``).
    engine_type: ClassVar[str] = ""
    #: The HTTP path that answers 2xx once the engine is ready (503 while loading).
    readiness_path: ClassVar[str] = "/health"

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.engine_type and not _ENGINE_TYPE.match(cls.engine_type):
            raise ValueError(
                f"{cls.__qualname__}.engine_type {cls.engine_type!r}: use lower-case letters, "
                "digits, '-' or '_'"
            )

    @abstractmethod
    def build_command(self, spec: LaunchSpec) -> LaunchCommand:
        """The argv and environment that start the engine for ``spec``."""

    def is_ready(self, status: int) -> bool:
        """Whether a readiness response means ready (default: any 2xx)."""
        return 200 <= status < 300

    def classify_line(self, line: str) -> Panic | None:
        """A fatal line of output, or None (default: nothing is recognised)."""
        del line
        return None

    def read_geometry(self, model: Path) -> ModelGeometry:
        """The model's shape, for the planner (default: a GGUF header)."""
        return read_gguf_geometry(model)

    def estimate_footprint(self, geometry: ModelGeometry, spec: LaunchSpec) -> int:
        """Bytes the ready engine will hold at its peak (default: on-disk size + 10% + 256 MiB).

        The ledger reserves this before a start; the measured figure replaces it once ready.
        """
        del spec
        return round_half_up((geometry.file_size + geometry.mmproj_size) * 1.10) + 256 * 1024**2

    def cache_adapter(self, spec: LaunchSpec) -> CacheAdapter | None:
        """The prompt-cache mechanism of the engine launched for ``spec``, if it has one.

        One per launch: its state (slot bindings, a latched-off feature) lives as long as the
        process does (default: none).
        """
        del spec
        return None

    def build_identity(self, command: LaunchCommand) -> str:
        """A name for the engine build, for learning per build (default: the binary's path)."""
        return command.argv[0] if command.argv else "unknown"


#: The ``register`` callable a plugin receives.
Register = Callable[[type[EngineAdapter]], None]


class Hookspecs:
    """The hooks a plugin may implement (synchronous, cheap, no I/O)."""

    @hookspec
    def register_engines(self, register: Register) -> None:
        """Register engine adapter classes by calling ``register(AdapterClass)``."""

    @hookspec
    def register_eviction_policies(self, register: Callable[[Any], None]) -> None:
        """Register eviction policies (EV1) by calling ``register(policy)``.

        A policy has a ``name`` (``^[a-z][a-z0-9-]{0,39}$``, not a built-in's), a ``version``
        and a pure ``rank(resident)`` sort key (least wanted first); see
        :class:`hostler.policies.eviction.EvictionPolicy`. Named by ``[pool] eviction`` and by
        ``hostler whatif --policy``.
        """
