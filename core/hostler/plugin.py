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

import math
import re
import stat
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

import pluggy

from hostler.capacity.context import CONTEXT_FLOOR
from hostler.capacity.estimate import estimate_llama
from hostler.capacity.geometry import ModelGeometry
from hostler.capacity.kv import exact_linearization, heuristic_per_slot_kv
from hostler.capacity.offload import Offload, OffloadPlan
from hostler.capacity.overrides import read_context_overrides
from hostler.capacity.slots import MAX_SLOTS as _MAX_SLOTS
from hostler.capacity.units import round_half_up
from hostler.engines.binary import find_engine_binary
from hostler.engines.http import PROBE_METHODS, header_value_problem, probe_path_problem
from hostler.errors import (
    EngineBinaryError,
    EngineStartError,
    ModelFileError,
    SettingError,
    UsageError,
)
from hostler.policies.arbiter import SLOTS as GPU_SLOTS
from hostler.policies.cache import CacheEntry, entry_bytes
from hostler.probes.cpu import cpu_flags as host_cpu_flags
from hostler.smallfile import read_small_file
from hostler.untrusted import parse_json, parse_whole

__all__ = [
    "ENGINE_NAME_MAX",
    "ENGINE_NAME_PATTERN",
    "GPU_SLOTS",
    "MAX_IDLE_TIMEOUT",
    "MAX_STARTUP_TIMEOUT",
    "PROJECT",
    "RESERVED_ENGINE_NAMES",
    "CacheAdapter",
    "CacheEntry",
    "EngineAdapter",
    "EngineBinaryError",
    "EngineStartError",
    "ExtraArgs",
    "FatalLines",
    "LaunchCommand",
    "LaunchSpec",
    "ModelFileError",
    "ModelGeometry",
    "ModelKind",
    "Offload",
    "OffloadPlan",
    "OptionType",
    "Panic",
    "Progress",
    "ReadinessProbe",
    "Register",
    "SessionCache",
    "SessionPrepared",
    "SessionSaved",
    "SettingError",
    "UsageError",
    "check_model_path",
    "context_floor",
    "engine_name_problem",
    "entry_bytes",
    "estimate_llama",
    "exact_linearization",
    "extra_args_argv",
    "find_engine_binary",
    "flag_argv",
    "flag_key_problem",
    "flag_of",
    "heuristic_per_slot_kv",
    "hookimpl",
    "hookspec",
    "host_cpu_flags",
    "json_fields_match",
    "launch_command",
    "options_schema_problem",
    "parse_json",
    "parse_whole",
    "read_gguf_metadata",
    "read_small_file",
    "round_half_up",
    "timing_problem",
    "validate_options",
]

#: The hook project name, the entry-point group and the distribution prefix.
PROJECT = "hostler"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

#: The rule for an engine name (``engine_type``, the first part of ``engine:model:replica``
#: keys and ``[[models]] engine``): lower-case letters, digits, ``-`` and ``_``, starting with
#: a letter or digit, at most :data:`ENGINE_NAME_MAX` characters.
ENGINE_NAME_PATTERN = r"[a-z0-9][a-z0-9_-]*"
#: The longest engine name.
ENGINE_NAME_MAX = 40
#: Names no plugin may register: hostler's own stand-in for an engine whose plugin is gone.
#: Built-in plugins hold only the names they actually register (``llamacpp``...); a built-in
#: placeholder that registers no engine reserves nothing (docs/plugins/reference.md).
RESERVED_ENGINE_NAMES: frozenset[str] = frozenset({"unavailable"})
_ENGINE_TYPE = re.compile(ENGINE_NAME_PATTERN)
_KV_TYPE = re.compile(r"[a-z][a-z0-9_]{0,15}")
#: RD7: the longest ``startup_timeout`` (a day) and ``default_idle_timeout`` (a year) allowed.
MAX_STARTUP_TIMEOUT = 24 * 3600.0
MAX_IDLE_TIMEOUT = 365 * 24 * 3600.0

#: Operator flags: a value of True is a bare flag, False omits it, anything else its text.
ExtraArgs = Mapping[str, str | int | float | bool]
#: What a model is for an engine: one file, one directory, or either.
ModelKind = Literal["file", "directory", "either"]
#: The type an option's value must have: one of ``bool``, ``int``, ``float``, ``str``, or a
#: tuple of them (an ``int`` is accepted where ``float`` is; a ``bool`` never is a number).
OptionType = type | tuple[type, ...]


def context_floor(environ: Mapping[str, str]) -> int:
    """The smallest launch context the host asks for, in tokens (C1).

    ``HOSTLER_MIN_CONTEXT_TOKENS`` when set (validated: a bad value raises
    :class:`~hostler.errors.SettingError`), else hostler's floor of 65,536 tokens. For an engine
    that sizes its own launch context (ds4) rather than taking the planner's window.
    """
    return read_context_overrides(environ).min_context or CONTEXT_FLOOR


def engine_name_problem(name: object) -> str | None:
    """Why ``name`` cannot be an engine name, or None when it can (the one rule, public)."""
    if not isinstance(name, str) or not name:
        return "an engine name is a non-empty string"
    if len(name) > ENGINE_NAME_MAX or not _ENGINE_TYPE.fullmatch(name):
        return (
            f"{name[:60]!r}: an engine name is lower-case letters, digits, '-' or '_', "
            f"starting with a letter or digit, at most {ENGINE_NAME_MAX} characters"
        )
    if name in RESERVED_ENGINE_NAMES:
        return f"{name!r} is reserved by hostler"
    return None


def timing_problem(adapter: object) -> str | None:
    """Why an adapter's (or adapter class's) RD7 timings are unusable, or None if fine.

    ``startup_timeout`` must be a number of seconds over 0 and at most a day;
    ``default_idle_timeout`` None (the daemon's idle timeout) or from 0 (never idle-stopped)
    to a year. A bool, NaN or infinity is never a number of seconds.
    """
    name = (adapter if isinstance(adapter, type) else type(adapter)).__qualname__
    startup: object = getattr(adapter, "startup_timeout", None)
    if not _seconds(startup) or not 0 < startup <= MAX_STARTUP_TIMEOUT:  # type: ignore[operator]
        return (
            f"{name}.startup_timeout {repr(startup)[:60]}: seconds over 0 and at most "
            f"{MAX_STARTUP_TIMEOUT:.0f}"
        )
    idle: object = getattr(adapter, "default_idle_timeout", None)
    if idle is not None and (not _seconds(idle) or not 0 <= idle <= MAX_IDLE_TIMEOUT):  # type: ignore[operator]
        return (
            f"{name}.default_idle_timeout {repr(idle)[:60]}: None (the daemon's) or seconds "
            f"from 0 (never) to {MAX_IDLE_TIMEOUT:.0f}"
        )
    return None


def _seconds(value: object) -> bool:
    """Whether ``value`` is a finite int or float (a bool is not)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


_NOT_REGULAR: tuple[tuple[Callable[[int], bool], str], ...] = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def check_model_path(model: Path, kind: ModelKind = "file") -> Path:
    """``model`` made absolute (against the working directory) and checked against ``kind``.

    Raises:
        ModelFileError: One line, as the GGUF reader words it: ``PATH: no such model file``,
            ``PATH: is a directory, not a model file``, ``PATH: is a file, not a model
            directory``, ``PATH: is a FIFO (named pipe), not a model file``...
    """
    path = Path(model).absolute()
    what = {"file": "model file", "directory": "model directory"}.get(kind, "model")
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise ModelFileError(f"{path}: no such {what}") from None
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ModelFileError(f"{path}: cannot be read ({reason})") from None
    if stat.S_ISDIR(mode):
        if kind == "file":
            raise ModelFileError(f"{path}: is a directory, not a model file")
        return path
    if not stat.S_ISREG(mode):
        found = next((name for test, name in _NOT_REGULAR if test(mode)), "not a regular file")
        raise ModelFileError(f"{path}: is {found}, not a {what}")
    if kind == "directory":
        raise ModelFileError(f"{path}: is a file, not a model directory")
    return path


#: RD5: an ``extra_args`` key, as written: a flag name (letters, digits, ``_ . -``, starting
#: with a letter or digit) after at most two dashes. ``""``, ``-`` and ``--`` are no flag:
#: ``--`` would end the engine's options and turn the value into a positional argument.
_FLAG_KEY = re.compile(r"-{0,2}[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def flag_key_problem(key: object) -> str | None:
    """Why ``key`` cannot be an ``extra_args`` key (RD5), or None when it can."""
    if not isinstance(key, str) or not _FLAG_KEY.fullmatch(key):
        return (
            f"extra_args key {repr(key)[:40]} is no flag name: letters, digits, '_', '.' or "
            "'-' (up to 64), starting with a letter or digit after at most two dashes"
        )
    return None


def flag_of(key: str) -> str:
    """RD5: the flag an ``extra_args`` key names.

    As written when it starts with ``-``, else with ``--`` before it: ``no-mmap`` and
    ``--no-mmap`` are one flag.
    """
    return key if key.startswith("-") else f"--{key}"


def flag_argv(flag: str, value: object, *, join_dash_values: bool = False) -> list[str]:
    """RD5: one flag and its value as argv tokens.

    True is the bare ``flag``, False nothing, anything else ``flag`` then its text. With
    ``join_dash_values`` a value that starts with ``-`` is one token, ``flag=value``: an
    argparse engine (``mlx_lm.server``) takes a separate ``-x`` for an option of its own and
    exits with "expected one argument". llama.cpp's parser is the opposite: it refuses
    ``--flag=value`` and takes any next token as the value, so the default keeps them apart.
    """
    if value is False:
        return []
    if value is True:
        return [flag]
    text = str(value)
    if join_dash_values and text.startswith("-"):
        return [f"{flag}={text}"]
    return [flag, text]


def extra_args_argv(extra_args: ExtraArgs, *, join_dash_values: bool = False) -> list[str]:
    """The one rule for ``extra_args``: each as ``--key value`` in the config's order (RD5).

    A key that starts with ``-`` is used as written (``-ngl``); any other gets ``--``. A value
    of True is the bare flag, False leaves the flag out, anything else follows as its text
    (as ``--key=value`` when it starts with ``-`` and ``join_dash_values``: see
    :func:`flag_argv`).
    """
    argv: list[str] = []
    for raw, value in extra_args.items():
        argv += flag_argv(flag_of(raw), value, join_dash_values=join_dash_values)
    return argv


#: The types an option may have (RD6).
_OPTION_VALUE_TYPES: tuple[type, ...] = (bool, int, float, str)


def options_schema_problem(schema: object) -> str | None:
    """Why ``schema`` is no ``options_schema`` (RD6), or None when it is one.

    A schema maps up to 256 option names (1 to 64 characters, no control characters) each to
    one of ``bool``, ``int``, ``float``, ``str`` or a non-empty tuple of them.
    """
    if not isinstance(schema, Mapping):
        return f"options_schema must map option names to types, not {type(schema).__name__}"
    if len(schema) > 256:
        return "options_schema has more than 256 options"
    for name, kind in schema.items():
        if not isinstance(name, str) or not 0 < len(name) <= 64 or not name.isprintable():
            return f"options_schema key {repr(name)[:40]} is not an option name"
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not kinds or not all(k in _OPTION_VALUE_TYPES for k in kinds):
            return (
                f"options_schema[{name!r}] is {repr(kind)[:40]}: use bool, int, float, str "
                "or a tuple of them"
            )
    return None


def _type_name(kind: OptionType) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def _fits(value: object, kind: OptionType) -> bool:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    for wanted in kinds:
        if wanted is bool:
            if isinstance(value, bool):
                return True
        elif isinstance(value, bool):
            continue
        elif isinstance(value, int | float if wanted is float else wanted):
            return True
    return False


def validate_options(
    options: Mapping[str, object], schema: Mapping[str, OptionType], *, where: str, engine: str
) -> dict[str, object]:
    """``options`` checked against an adapter's ``options_schema``.

    Raises:
        UsageError: One line naming ``where`` (the file and table) and the key: an unknown
            key, or a value of the wrong type.
    """
    for key, value in options.items():
        kind = schema.get(key)
        if kind is None:
            known = ", ".join(sorted(schema)) or "none"
            raise UsageError(
                f"{where}.{key}: unknown option for engine {engine!r} (known: {known})"[:500]
            )
        if not _fits(value, kind):
            raise UsageError(
                f"{where}.{key}: should be {_type_name(kind)} (got {repr(value)[:60]})"
            )
    return dict(options)


def json_fields_match(body: bytes, expected: Mapping[str, object]) -> bool:
    """Whether ``body`` is a JSON object holding every ``expected`` field with its value.

    A dotted key looks into nested objects (``"model.loaded": true``).
    An engine's body is outside input: one that :func:`parse_json` refuses (not JSON, nested
    too deeply) simply does not match.
    """
    try:
        data = parse_json(body)
    except ValueError:
        return False
    for dotted, wanted in expected.items():
        node: object = data
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        if node != wanted or type(node) is not type(wanted):
            return False
    return True


@dataclass(frozen=True, slots=True)
class ReadinessProbe:
    """How hostler tells that a starting engine is ready (RD1): every part given must pass.

    Attributes:
        path: The HTTP path to ask (None: no HTTP check, only ``ready_line``).
        method: ``GET``, or ``POST`` for a probe request (a 1-token completion, say).
        body: The request body of a probe (sent as ``content_type``).
        content_type: The body's media type.
        expect_json: Fields the response body must hold, with these values (a dotted key
            looks into nested objects), on top of :meth:`EngineAdapter.is_ready_response`.
        ready_line: A regular expression; the engine is not ready before a line of its
            output matches it (searched, not anchored).
        wait: Seconds one probe request may take (a 1-token completion on a CPU: a few).
    """

    path: str | None = "/health"
    method: Literal["GET", "POST"] = "GET"
    body: bytes | None = None
    content_type: str = "application/json"
    expect_json: Mapping[str, object] | None = None
    ready_line: str | None = None
    wait: float = 1.0

    def __post_init__(self) -> None:
        if self.path is None and self.ready_line is None:
            raise ValueError("a readiness probe needs a path, a ready_line, or both")
        if self.path is not None and (problem := probe_path_problem(self.path)) is not None:
            raise ValueError(problem)
        method: object = self.method  # a plugin's: a Literal is not enforced at run time
        if type(method) is not str or method not in PROBE_METHODS:
            raise ValueError(f"readiness method {method!r} must be 'GET' or 'POST'")
        body: object = self.body
        if body is not None and not isinstance(body, bytes):
            raise ValueError(f"readiness body must be bytes or None, not {type(body).__name__}")
        if (problem := header_value_problem("content_type", self.content_type)) is not None:
            raise ValueError(problem)
        fields: object = self.expect_json
        if fields is not None and (
            not isinstance(fields, Mapping)
            or not all(isinstance(key, str) and key for key in fields)
        ):
            raise ValueError(
                f"readiness expect_json must map field names to values, not {repr(fields)[:40]}"
            )
        ready_line: object = self.ready_line
        if ready_line is not None:
            if not isinstance(ready_line, str):
                raise ValueError(f"readiness ready_line must be a str, not {ready_line!r:.40}")
            re.compile(ready_line)  # a bad pattern fails where the adapter made it
        wait: object = self.wait
        if type(wait) not in (int, float) or not 0 < wait <= 600:  # type: ignore[operator]
            raise ValueError(f"readiness wait must be over 0 and at most 600 seconds, not {wait!r}")


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """Everything an adapter needs to build a launch, decided by hostler.

    Attributes:
        key: The engine key (``engine:model:replica``).
        model: The model, an absolute path: a file or a directory, as the adapter's
            ``model_kind`` says (what :meth:`EngineAdapter.validate_model` returned).
        port: The loopback port hostler chose; the engine must bind 127.0.0.1 only.
        ctx_per_slot: The planned per-slot context window.
        slots: Concurrent slots.
        kv_type: KV cache type, or None for the engine's default.
        work_dir: A directory the engine may write (slot saves, caches).
        extra_args: Operator flags (``extra_args`` in the config), appended by hostler after
            the adapter's argv (see :func:`extra_args_argv`) unless the adapter sets
            ``applies_extra_args`` and places them itself: a value of True is a bare flag,
            False omits it, anything else is passed as its text.
        options: Engine-specific settings from the config's ``options`` tables
            (``[engine_defaults.<engine>.options]``, then the model's own ``options``),
            already checked against the adapter's ``options_schema``.
        offload: The planner's GPU offload plan (L12; after a start that died of GPU
            out-of-memory, the next step of the L13 ladder), or None to leave it to the engine.
            The operator's own offload settings in ``options`` or ``extra_args`` win over it.
        binary: The engine program the operator configured (``[engine_defaults.<engine>]
            binary``), or None to let the adapter find its own. An adapter that runs one
            program runs this one when it is given.
        reserved_bytes: RD8: the bytes hostler reserved for this launch in the ledger (the
            adapter's estimate corrected by learning), set by the supervisor before
            :meth:`EngineAdapter.build_command` is asked; None when nothing was reserved (no
            ledger: a preview's trial specs, a test). An engine that takes a memory limit
            (MLX's wired limit, M9) sets it to this figure.
        adopted: True for the spec of an engine an earlier daemon started and this one
            adopted (rebuilt from the log's ``engine.spawned`` record): its engine may still
            hold state from before (CC13: sessions in their slots). False for a launch made now.
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
    reserved_bytes: int | None = None
    adopted: bool = False


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


@dataclass(frozen=True, slots=True)
class Progress:
    """How far a long job in the engine has come, read from a line of its output (PG1).

    Attributes:
        done: Steps done (0 or more, at most ``total``).
        total: Steps in all (1 or more).
        unit: What a step is (``step`` for a diffusion step, ``token``...), for display.
    """

    done: int
    total: int
    unit: str = "step"

    def __post_init__(self) -> None:
        if type(self.total) is not int or not 1 <= self.total <= 2**31:
            raise ValueError(f"Progress.total must be an int from 1 to 2**31, not {self.total!r}")
        if type(self.done) is not int or not 0 <= self.done <= self.total:
            raise ValueError(f"Progress.done must be an int from 0 to total, not {self.done!r}")
        unit: object = self.unit  # a plugin's: checked
        if not isinstance(unit, str) or not 0 < len(unit) <= 20 or not unit.isprintable():
            raise ValueError("Progress.unit must be a short printable name (1 to 20 characters)")


class FatalLines:
    """An engine's fatal lines as a table: ``(kind, priority, pattern)``, the first match wins.

    Call it with a line of the engine's output; it answers the :class:`Panic` of the first
    pattern (a regular expression, case-insensitive) found in the line's first ``clip``
    characters, or None. An adapter's ``classify_line`` can return ``self.fatal(line)``.
    """

    def __init__(self, rules: Iterable[tuple[str, int, str]], *, clip: int = 1000) -> None:
        self.rules = [(kind, rank, re.compile(text, re.IGNORECASE)) for kind, rank, text in rules]
        self.clip = clip

    def __call__(self, line: str) -> Panic | None:
        """The first rule ``line`` matches, as a :class:`Panic`, or None."""
        clipped = line[: self.clip]
        for kind, priority, pattern in self.rules:
            if pattern.search(clipped):
                return Panic(kind, clipped.strip(), priority)
        return None


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


@dataclass(frozen=True, slots=True)
class SessionSaved:
    """One session's prompt cache written to its file by the engine (or why it was not).

    Attributes:
        session_id: The session.
        tokens: How many tokens of KV the engine wrote (0 when it did not say).
        bytes: The file's size as written (0 when it did not say).
        seconds: How long the save took.
        error: Why it was not saved ("" when it was).
        used_at: When the session last used the engine (epoch seconds; 0.0 when not known):
            the file's place in the least-recently-used order of the disk budget (CC14).
    """

    session_id: str
    tokens: int = 0
    bytes: int = 0
    seconds: float = 0.0
    error: str = ""
    used_at: float = 0.0


@dataclass(frozen=True, slots=True)
class SessionPrepared:
    """Where a session's prompt cache comes from for its next turn, and how it is kept there.

    Attributes:
        source: ``memory`` (the engine still holds it), ``disk`` (restored from its file just
            now) or ``fresh`` (nothing to reuse).
        fields: What the turn's request body must carry to use it (a slot, ``cache_prompt``).
        restored_tokens: Tokens of KV the restore brought back (``disk`` only).
        seconds: How long the restore took.
        displaced: The session whose place it took, saved first (None when none was).
        error: Why a restore that was tried failed ("" when none failed: the turn runs cold).
    """

    source: Literal["memory", "disk", "fresh"]
    fields: dict[str, Any] = field(default_factory=dict)
    restored_tokens: int = 0
    seconds: float = 0.0
    displaced: SessionSaved | None = None
    error: str = ""


@runtime_checkable
class SessionCache(CacheAdapter, Protocol):
    """A cache adapter whose engine saves a session's KV to a file and restores it (CC13).

    hostler prepares every turn of a session through it (restoring the session's file when
    the engine does not hold it) and, before it stops the engine for any reason but a failed
    one (an eviction, an idle or pressure stop, an operator's unload, a shutdown), saves every
    session the engine holds, within a bound. Both are best effort: what fails is reported
    in the answer, never raised.
    """

    async def prepare(self, session_id: str) -> SessionPrepared:
        """Ready the engine for the session's next turn (restore it from its file if needed)."""
        ...

    def held_sessions(self) -> list[str]:
        """The sessions the engine holds now, in the order to save them (no I/O)."""
        ...

    async def save_session(self, session_id: str) -> SessionSaved:
        """Save one session the engine holds to its file, before the engine stops."""
        ...

    async def saved_sizes(self, session_ids: Sequence[str]) -> dict[str, int]:
        """CC14: of these sessions, those this engine can restore, each with its file's size.

        A file this engine cannot use (made by another model file or engine build) is deleted
        first and left out, as is a session with no file. Called as the engine is registered,
        for the files hostler counts against its budget.
        """
        ...

    async def discard(self, session_ids: Sequence[str]) -> None:
        """CC14: delete these sessions' saved files (no engine needed: it may have stopped)."""
        ...


class EngineAdapter(ABC):
    """The facts of one engine kind. Subclass it, set ``engine_type``, and register it.

    Methods are plain and fast: hostler calls them from its event loop. New methods are added
    with defaults, so existing adapters keep working.
    """

    #: The engine's name in engine keys and configs (:func:`engine_name_problem` says the rule).
    engine_type: ClassVar[str] = ""
    #: The HTTP path that answers 2xx once the engine is ready (503 while loading); also the
    #: path of the periodic health check (a GET, judged by :meth:`is_ready`).
    readiness_path: ClassVar[str] = "/health"
    #: What a model is for this engine (``file``, ``directory`` or ``either``).
    model_kind: ClassVar[ModelKind] = "file"
    #: True when :meth:`build_command` places ``spec.extra_args`` itself (merging them with
    #: its own flags); False (default): hostler appends :meth:`extra_args_argv` after it.
    applies_extra_args: ClassVar[bool] = False
    #: RD5: True when the engine parses its argv as argparse does (a token starting with
    #: ``-`` is an option): a flag value that starts with ``-`` is then passed as one token,
    #: ``--key=value``. False (default): always ``--key value``, as llama.cpp needs.
    join_dash_values: ClassVar[bool] = False
    #: The ``options`` keys this engine takes and each one's type (default: none); any other
    #: key in the config is refused in one line naming the file and the key.
    options_schema: ClassVar[Mapping[str, OptionType]] = {}
    #: The share of free memory the planner holds back from KV sizing for this engine
    #: (compute buffers it grows at run time); None: hostler's figure for the engine name
    #: (0.35 for ``mlx``, else 0.20).
    kv_headroom: ClassVar[float | None] = None
    #: GA8: the GPU arbiter's workload slot this engine's requests use: ``llm`` (default; a
    #: plain acquire per request) or ``image`` / ``video``, whose requests each hold that slot's
    #: exclusive lease for their whole run, so that under ``swap`` no other slot's request
    #: evicts the engine mid-job. The engine is evicted, when idle, for the other slots.
    gpu_slot: ClassVar[str] = "llm"
    #: S8: the most concurrent slots the engine serves (``1`` for a strictly serial one);
    #: None (default): no limit of its own. A config asking for more is refused when the daemon
    #: starts, and an automatic plan (``hostler preview`` without ``--slots``) stays within it.
    max_slots: ClassVar[int | None] = None
    #: RD10: the ``model`` hostler writes into every request body it forwards to this engine
    #: (``hostler serve``); None (default): the body is forwarded unchanged. For an engine that
    #: serves one model but reads ``model`` as something to load (``mlx_lm.server`` takes any
    #: name but ``default_model`` for a hub repository). A program that talks to the engine's
    #: port itself (``hostler.Runtime.request``) sends it itself.
    request_model: ClassVar[str | None] = None
    #: S9: the KV cache types the engine supports, its default first (``("f16",)`` for MLX);
    #: None (default): any llama.cpp type. The planner picks and trades only among them; a
    #: ``kv_type`` the config or ``hostler preview --kv`` asks for outside them is refused.
    kv_types: ClassVar[tuple[str, ...] | None] = None
    #: RD7: seconds a start may take to become ready before hostler gives up on it (the
    #: process group is killed, the start fails); ``[engine_defaults.<engine>]
    #: startup_timeout`` overrides it. Over 0, at most a day.
    startup_timeout: ClassVar[float] = 180.0
    #: RD7: seconds unused before this engine is idle-stopped, unless the config says
    #: otherwise (a model's ``idle_ttl``, then ``[engine_defaults.<engine>] idle_timeout``);
    #: None (default): the daemon's ``idle_timeout``. 0: never idle-stopped.
    default_idle_timeout: ClassVar[float | None] = None

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.engine_type and not _ENGINE_TYPE.fullmatch(cls.engine_type):
            raise ValueError(
                f"{cls.__qualname__}.engine_type {cls.engine_type!r}: use lower-case letters, "
                "digits, '-' or '_'"
            )
        if type(cls.join_dash_values) is not bool:
            raise ValueError(f"{cls.__qualname__}.join_dash_values must be True or False")
        if cls.kv_headroom is not None and not 0 <= cls.kv_headroom < 1:
            raise ValueError(f"{cls.__qualname__}.kv_headroom must be from 0 to under 1")
        if (problem := options_schema_problem(cls.options_schema)) is not None:
            raise ValueError(f"{cls.__qualname__}.{problem}")
        if cls.max_slots is not None and (
            type(cls.max_slots) is not int or not 1 <= cls.max_slots <= _MAX_SLOTS
        ):
            raise ValueError(
                f"{cls.__qualname__}.max_slots must be None or an int from 1 to {_MAX_SLOTS}"
            )
        kinds: object = cls.kv_types  # a plugin's: checked
        if kinds is not None and (
            not isinstance(kinds, tuple)
            or not 0 < len(kinds) <= 16
            or not all(isinstance(k, str) and _KV_TYPE.fullmatch(k) for k in kinds)
        ):
            raise ValueError(
                f"{cls.__qualname__}.kv_types must be None or a tuple of 1 to 16 KV type names "
                "(such as 'f16', 'q8_0')"
            )
        named: object = cls.request_model  # a plugin's: checked
        if named is not None and (
            not isinstance(named, str) or not 0 < len(named) <= 200 or not named.isprintable()
        ):
            raise ValueError(
                f"{cls.__qualname__}.request_model must be None or a printable name of 1 to 200 "
                "characters"
            )
        if cls.gpu_slot not in GPU_SLOTS:
            raise ValueError(
                f"{cls.__qualname__}.gpu_slot {cls.gpu_slot!r}: use one of {', '.join(GPU_SLOTS)}"
            )
        path_problem = probe_path_problem(cls.readiness_path)
        if path_problem is not None:
            raise ValueError(f"{cls.__qualname__}: {path_problem}")
        problem = timing_problem(cls)
        if problem is not None:
            raise ValueError(problem)

    @abstractmethod
    def build_command(self, spec: LaunchSpec) -> LaunchCommand:
        """The argv and environment that start the engine for ``spec``."""

    def is_ready(self, status: int) -> bool:
        """Whether a readiness (and health) status means ready (default: any 2xx)."""
        return 200 <= status < 300

    def readiness(self, spec: LaunchSpec) -> ReadinessProbe:
        """How readiness is told for the engine launched for ``spec`` (RD1).

        Default: ``GET readiness_path``, ready on a status :meth:`is_ready` accepts. Return a
        :class:`ReadinessProbe` to check the body, send a probe request or wait for a line.
        """
        del spec
        return ReadinessProbe(path=self.readiness_path)

    def is_ready_response(self, status: int, body: bytes) -> bool:
        """Whether a readiness response (status and body, up to 64 KiB) means ready.

        Default: :meth:`is_ready` on the status; the body is for adapters that need it.
        """
        del body
        return self.is_ready(status)

    def validate_model(self, model: Path) -> Path:
        """The model path to launch with: absolute, and what ``model_kind`` says (RD2).

        Called before pricing and before each start. Override to look inside (an MLX
        directory needs its ``config.json``) and raise ``ModelFileError`` in one line.
        """
        return check_model_path(model, self.model_kind)

    def slot_limit(self, geometry: ModelGeometry) -> int | None:
        """S8: the most concurrent slots the engine serves for a model of ``geometry``.

        Default: the class's :attr:`max_slots` (None: no limit of its own). An engine whose
        concurrency depends on the model answers per model (MLX: 1 when the geometry is
        unknown, M6), so the plan, the price and the launch agree. Answer None or an int from
        1 to 1024; the planner plans at most that many and refuses ``slots`` above it.
        """
        del geometry
        return self.max_slots

    def model_identity(self, model: Path) -> str:
        """The name learning keys this model by (default: the file or directory name)."""
        return model.name

    def extra_args_argv(self, extra_args: ExtraArgs) -> list[str]:
        """The argv hostler appends for ``extra_args`` (default: :func:`extra_args_argv`).

        A value that starts with ``-`` is spelled as :attr:`join_dash_values` says (RD5).
        """
        return extra_args_argv(extra_args, join_dash_values=self.join_dash_values)

    def classify_line(self, line: str) -> Panic | None:
        """A fatal line of output, or None (default: nothing is recognised)."""
        del line
        return None

    def progress(self, line: str) -> Progress | None:
        """How far the engine's current job has come, if ``line`` tells it (PG1; default: None).

        Called for every line of output, like :meth:`classify_line` (cheap, no I/O). hostler
        keeps the last answer while the engine is busy and shows it (``hostler ps``,
        ``GET /api/engines``); it is never written to the event log.
        """
        del line
        return None

    def on_exited_before_ready(self, message: str) -> bool:
        """RD9: whether a start that ended before readiness may be a stale engine's doing.

        Asked when a start fails before it is ready because the process exited or printed a
        fatal line (not on a timeout); ``message`` is the start's error. True: hostler stops
        the strays of its own data directory that no engine of it owns and whose command line
        names this launch's binary or model, and when it stopped one, tries the start once
        more. For an engine that allows one instance per machine (ds4's lock). Default: False.
        """
        del message
        return False

    def read_geometry(self, model: Path) -> ModelGeometry:
        """The model's shape, for the planner and ``hostler preview`` (default: a GGUF header).

        A non-GGUF engine builds a :class:`ModelGeometry` from its own metadata (the fields it
        cannot know stay None: KV is then priced by the heuristic); raise ``ModelFileError``
        when the model cannot be read.
        """
        # the GGUF reader loads numpy: imported when a model is read, not by every importer
        from hostler.capacity.gguf_header import read_geometry  # noqa: PLC0415

        return read_geometry(model)

    def estimate_footprint(self, geometry: ModelGeometry, spec: LaunchSpec) -> int:
        """Bytes the ready engine will hold at its peak (default: on-disk size + 10% + 256 MiB).

        The raw estimate: hostler corrects it by what measured launches of the same
        ``model_identity`` and build taught (learning, for every engine), and the ledger
        reserves the result before a start; the measured figure replaces it once ready.
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


def read_gguf_metadata(model: Path) -> dict[str, Any]:
    """A GGUF file's header metadata, key by key (long arrays such as vocabularies left out).

    Raises:
        ModelFileError: Missing, not a regular file, not GGUF, truncated, or claiming more
            than it holds (one line).
    """
    # the GGUF reader loads numpy: imported when a model is read, not by every importer
    from hostler.capacity.gguf_header import read_metadata  # noqa: PLC0415

    return read_metadata(model)


def launch_command(adapter: EngineAdapter, spec: LaunchSpec) -> LaunchCommand:
    """The command hostler runs for ``spec``: the adapter's, then the ``extra_args`` (RD5).

    Unless the adapter sets ``applies_extra_args``, the operator's flags are appended after
    everything :meth:`EngineAdapter.build_command` returned, so the last word is theirs.
    """
    command = adapter.build_command(spec)
    if adapter.applies_extra_args or not spec.extra_args:
        return command
    extra: object = adapter.extra_args_argv(spec.extra_args)  # a plugin's: checked
    if not isinstance(extra, list) or not all(isinstance(arg, str) for arg in extra):
        raise TypeError(f"extra_args_argv returned {repr(extra)[:60]}, not a list of strings")
    return LaunchCommand([*command.argv, *map(str, extra)], command.env)


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
