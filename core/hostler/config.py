"""The daemon's configuration file, validated at the edge (typed models, one-line errors).

A TOML file is read into strict pydantic models: a wrong type, an out-of-range value, an
unknown key or a misspelled section is refused with one line naming the file, the key and what
was expected — never a traceback, never a setting silently ignored. Relative paths in the file
are resolved against the file's directory; a ``--data-dir`` given on the command line against
the working directory. The result is the plain :class:`DaemonConfig` the daemon runs with.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from hostler.address import DEFAULT_HOST, DEFAULT_PORT
from hostler.capacity.bounds import MAX_SLOTS
from hostler.capacity.keys import parse_key
from hostler.capacity.origin import BUDGET_FLOOR, config_source, floor_problem
from hostler.drivers.host_ledger import LedgerLocation, default_ledger_location
from hostler.engines.logs import DEFAULT_LOG_KEEP, DEFAULT_LOG_MAX_BYTES
from hostler.errors import HostlerError, UsageError
from hostler.fleet import host_name_problem
from hostler.paths import EVENTS_FILE, default_data_dir, masked, user_path
from hostler.plugin import ENGINE_NAME_MAX, engine_name_problem, flag_key_problem, flag_of
from hostler.policies.eviction import DEFAULT_EVICTION_POLICY, valid_policy_name
from hostler.policies.offer import Source

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "DISCOVERY_SOURCES",
    "MAX_REPLICAS",
    "DaemonConfig",
    "DiscoverySettings",
    "EngineConfig",
    "discovered_config",
    "load_config",
    "source_places",
    "with_places",
]

#: Bigger than any model's window (2^24 tokens); a value past it is a typo, not a wish.
MAX_CONTEXT = 16_777_216
MAX_CONFIG_BYTES = 4 * 1024 * 1024
MIB = 1024 * 1024
#: An engine log cap past 1 TiB, or more than 100 rotated copies, is a typo, not a wish.
MAX_ENGINE_LOG_MIB = 1024 * 1024
MAX_ENGINE_LOG_KEEP = 100
KvType = Literal["f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl"]
Seconds = Annotated[float, Field(ge=0, le=365 * 24 * 3600)]
#: RD7: a start's time to become ready: over 0, at most a day (as an adapter's may be).
StartupSeconds = Annotated[float, Field(gt=0, le=24 * 3600)]
ExtraValue = str | int | float | bool
#: The longest engine key: ``engine/<key>`` is its stream id (200 characters at most).
MAX_KEY_LENGTH = 128
#: The most replicas one ``[[models]]`` entry may ask for (the pool's reconcile bound too).
MAX_REPLICAS = 64
#: The most engines a config may expand to (``[[engines]]`` plus every model's replicas).
MAX_ENGINES = 1024
#: CB1: a budget under 1 GiB would not be enforced (and ``bytes = 8`` meant 8 GiB): refused;
#: past 2^60, a typo.
MIN_BUDGET_BYTES = BUDGET_FLOOR
MAX_BUDGET_BYTES = 2**60
Auth = Literal["token", "none"]
ArbiterPolicy = Literal["auto", "swap", "coexist"]
#: What a budget or spillover setting says: a value, ``"auto"`` (the automatic one), or None
#: (not configured: the ledger keeps what it was told last, by hand or by a previous start).
BudgetSetting = int | Literal["auto"] | None
SpilloverSetting = bool | Literal["auto"] | None
DiscoverySource = Literal["models", "huggingface", "ollama", "lmstudio"]


def _rescan_pace(value: float) -> float:
    """0 (only at start) or at least :data:`MIN_RESCAN` seconds: a walk is not a busy loop."""
    if 0 < value < MIN_RESCAN:
        raise ValueError(f"0 (search only at start) or at least {MIN_RESCAN:g} seconds")
    return value


def _no_nul(value: str) -> str:
    """A path the operating system can take: no NUL character (TOML can write one), no URL.

    A URL where a path is meant (``ledger = "postgresql+psycopg://..."``) was once taken as a
    relative path, and a SQLite file was written in folders named after it.
    """
    if "\0" in value:
        raise ValueError("a path cannot hold a NUL character")
    if _URL.match(value):
        raise ValueError(
            f"a file path, not a URL ({value.split('://', 1)[0]}://...): this setting names a "
            "file or folder of this host"
        )
    return value


#: What starts a URL (``scheme://``), not a path.
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def _as_used(value: str, info: ValidationInfo) -> str:
    """The path the daemon will use: ``~`` expanded, relative ones against the config's folder.

    The folder is ``base`` in the validation context. A path that cannot be used (a ``~user``
    nobody knows, a symbolic link loop) is refused in the config's usual one line.
    """
    base = info.context.get("base") if isinstance(info.context, dict) else None
    return str(user_path(value, base=base))


def _as_named(value: str, info: ValidationInfo) -> str:
    """A program's path: as :func:`_as_used`, links kept (a venv's ``bin/python`` stays it)."""
    base = info.context.get("base") if isinstance(info.context, dict) else None
    return str(user_path(value, base=base, follow_links=False))


def _arguments(value: dict[str, ExtraValue]) -> dict[str, ExtraValue]:
    """Flags an engine's command line can carry: finite numbers, no NUL anywhere."""
    for flag, item in value.items():
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"{flag} must be a finite number")
        if "\0" in flag or (isinstance(item, str) and "\0" in item):
            raise ValueError(f"{flag!r}: a command-line argument cannot hold a NUL character")
    return value


def _flags(value: dict[str, ExtraValue]) -> dict[str, ExtraValue]:
    """RD5: ``extra_args`` keys are flag names (``""``, ``-``, ``--`` are not), then as above."""
    for flag in value:
        if (problem := flag_key_problem(flag)) is not None:
            raise ValueError(problem)
    return _arguments(value)


ExtraArgs = Annotated[dict[str, ExtraValue], Field(max_length=256), AfterValidator(_flags)]
#: An engine's ``options`` table: names and plain values, checked against the engine
#: adapter's ``options_schema`` once plugins are loaded (RD6).
Options = Annotated[dict[str, ExtraValue], Field(max_length=256), AfterValidator(_arguments)]

PathText = Annotated[
    str, Field(min_length=1, max_length=4096), AfterValidator(_no_nul), AfterValidator(_as_used)
]


def _log_target(value: str, info: ValidationInfo) -> str:
    """``[daemon] log``: a database URL as given (its kind checked), or a path as PathText."""
    if "\0" in value:
        raise ValueError("a log target cannot hold a NUL character")
    if _URL.match(value):
        # sqlalchemy is imported only when a URL is given (the CLI starts without it)
        from hostler.store.connect import check_server_url  # noqa: PLC0415

        try:
            check_server_url(value)
        except HostlerError as exc:
            raise ValueError(exc.message) from None
        return value
    return _as_used(value, info)


def _host_name(value: str) -> str:
    """``[daemon] host_name``: a fleet host's name."""
    problem = host_name_problem(value)
    if problem:
        raise ValueError(problem)
    return value


#: The event log: a file path (SQLite) or a database URL (PostgreSQL, docs/fleet.md).
LogText = Annotated[str, Field(min_length=1, max_length=4096), AfterValidator(_log_target)]
#: A program's path: as :data:`PathText`, but a relative one keeps the links it names.
ProgramText = Annotated[
    str, Field(min_length=1, max_length=4096), AfterValidator(_no_nul), AfterValidator(_as_named)
]


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """One configured engine."""

    key: str
    model: Path
    ctx: int = 4096
    slots: int = 1
    kv_type: str | None = None
    autostart: bool = True
    extra_args: dict[str, Any] = field(default_factory=dict)
    pinned: bool = False
    #: Seconds unused before an idle stop, for this model (its ``idle_ttl``); None: see
    #: :meth:`DaemonConfig.idle_timeout_of`.
    idle_ttl: float | None = None
    #: RD7: ``[engine_defaults.<engine>] idle_timeout``; None: the adapter's default.
    engine_idle_timeout: float | None = None
    #: RD7: ``[engine_defaults.<engine>] startup_timeout``; None: the adapter's.
    startup_timeout: float | None = None
    #: The engine program to run (``[engine_defaults.<engine>] binary``); None: the adapter's.
    binary: Path | None = None
    #: Engine settings for ``LaunchSpec.options``: ``[engine_defaults.<engine>.options]``,
    #: then the entry's own ``options`` (which win), checked against the adapter's schema.
    options: dict[str, Any] = field(default_factory=dict)
    #: Per option, where it was set (``FILE: models[0].options``), for one-line errors.
    options_from: dict[str, str] = field(default_factory=dict)


#: The places discovery looks in by default (``[discovery] sources``), in precedence order.
DISCOVERY_SOURCES: tuple[DiscoverySource, ...] = ("models", "huggingface", "ollama", "lmstudio")
#: How often a running daemon walks its places again (seconds; ``[discovery] rescan_seconds``).
DEFAULT_RESCAN = 5.0
#: The shortest pace between walks (each reads every folder of every place).
MIN_RESCAN = 1.0


@dataclass(frozen=True, slots=True)
class DiscoverySettings:
    """Where ``hostler serve`` looks for models it was not configured with (docs/serve.md).

    Attributes:
        sources: The places by name (``models``, ``huggingface``, ``ollama``, ``lmstudio``).
        folders: More folders searched like the models folder (source ``config``).
        rescan_seconds: How often the running daemon walks them again (0: only at start).
        places: Each place as a folder, in order (:func:`source_places` fills them in from
            the environment when the daemon's settings are made).
        template: What a discovered model's engine is run with (the defaults, and the
            config's ``[engine_defaults.llamacpp]``); its key and model are replaced.
    """

    sources: tuple[DiscoverySource, ...] = DISCOVERY_SOURCES
    folders: tuple[Path, ...] = ()
    rescan_seconds: float = DEFAULT_RESCAN
    places: tuple[tuple[Source, Path], ...] = ()
    template: EngineConfig = field(
        default_factory=lambda: EngineConfig(key="llamacpp:model:0", model=Path(), autostart=False)
    )


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    """The daemon's settings.

    ``host``, ``port`` and ``auth`` are the HTTP face's (``hostler serve``); ``token`` a
    token given from outside (``HOSTLER_TOKEN``; None: the data directory's ``token`` file).
    ``budget_bytes`` and ``spillover`` are applied to the memory ledger at start when not None;
    ``budget_from`` says where ``budget_bytes`` was set, as the ledger records it
    (:mod:`hostler.capacity.origin`: ``config:<file>``, ``env:HOSTLER_BUDGET_BYTES``; "" for a
    config built in code).
    """

    data_dir: Path
    engines: tuple[EngineConfig, ...] = ()
    idle_timeout: float = 300.0
    health_interval: float = 15.0
    ledger: Path | None = None
    ledger_shared: bool = False
    engine_log_max_bytes: int = DEFAULT_LOG_MAX_BYTES
    engine_log_keep: int = DEFAULT_LOG_KEEP
    log_max_bytes: int | None = None
    #: The event log: a file path or a database URL (None: ``DATA_DIR/events.db``).
    log: str | None = None
    #: This host's name in a fleet sharing one database log (docs/fleet.md); None: unnamed.
    host_name: str | None = None
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    auth: Auth = "token"
    token: str | None = field(default=None, repr=False)
    budget_bytes: BudgetSetting = None
    spillover: SpilloverSetting = None
    budget_from: str = ""
    arbiter: ArbiterPolicy = "auto"
    #: The eviction policy's name (EV1, ``[pool] eviction``); checked against the built-ins and
    #: the plugins' policies when the daemon starts (PM17).
    eviction: str = DEFAULT_EVICTION_POLICY.name
    #: RD6: each ``[engine_defaults.<engine>.options]`` table as written (engine → where it is
    #: written, its options), checked against its adapter's schema when the daemon starts even
    #: if no model uses it.
    default_options: Mapping[str, tuple[str, Mapping[str, object]]] = field(default_factory=dict)
    #: Model discovery (``[discovery]``; on without a config file); None: off.
    discovery: DiscoverySettings | None = None

    def idle_timeout_of(self, engine: EngineConfig, adapter_default: float | None = None) -> float:
        """RD7: the idle stop of ``engine``, in seconds (0: never).

        0 when pinned (PP17); else the first set of: the model's ``idle_ttl``, its engine's
        ``[engine_defaults.<engine>] idle_timeout``, the adapter's ``default_idle_timeout``
        (``adapter_default``), and the daemon's ``idle_timeout``.
        """
        if engine.pinned:
            return 0.0
        for value in (engine.idle_ttl, engine.engine_idle_timeout, adapter_default):
            if value is not None:
                return float(value)
        return self.idle_timeout

    def engine_named(self, name: str) -> EngineConfig | None:
        """The configured engine ``name`` means: its key, its model id, or its model's path.

        A model id (``smollm2``, what clients send as ``model``) names its first replica.
        None when no engine matches.
        """
        for engine in self.engines:
            if engine.key == name:
                return engine
        for engine in self.engines:
            parsed = parse_key(engine.key)
            if parsed is not None and parsed.model == name:
                return engine
        path = Path(name).expanduser()
        if path.exists():
            for engine in self.engines:
                if engine.model.exists() and engine.model.samefile(path):
                    return engine
        return None

    @property
    def log_target(self) -> str:
        """The event log the daemon owns: ``log`` if set, else ``DATA_DIR/events.db``."""
        return self.log if self.log is not None else str(self.data_dir / EVENTS_FILE)

    def ledger_location(self) -> LedgerLocation:
        """The configured ledger, else the environment's (per user by default)."""
        if self.ledger is not None:
            return LedgerLocation(self.ledger, self.ledger_shared)
        return default_ledger_location()


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _EngineEntry(_Strict):
    key: str
    model: PathText
    ctx: Annotated[int, Field(ge=1, le=MAX_CONTEXT)] = 4096
    slots: Annotated[int, Field(ge=1, le=MAX_SLOTS)] = 1
    kv_type: KvType | None = None
    autostart: bool = True
    extra_args: ExtraArgs = {}
    options: Options = {}
    pinned: bool = False

    @field_validator("key")
    @classmethod
    def _engine_key(cls, value: str) -> str:
        if len(value) > MAX_KEY_LENGTH:  # its stream id and run directory must stay valid
            raise ValueError(f"at most {MAX_KEY_LENGTH} characters")
        if parse_key(value) is None:
            raise ValueError("must look like engine:model:replica")
        return value


def _model_id(value: str) -> str:
    """A model id: what clients send as ``model``, the middle part of its engine keys."""
    if ":" in value:
        raise ValueError("a model id cannot hold ':' (it is the middle of engine:model:replica)")
    if value != value.strip() or not value.isprintable():
        raise ValueError("a model id has no control characters and no surrounding spaces")
    return value


def _engine_name(value: str) -> str:
    """The one engine-name rule (:func:`hostler.plugin.engine_name_problem`)."""
    if engine_name_problem(value) is not None:
        raise ValueError(
            "an engine name is lower-case letters, digits, - or _ (like 'llamacpp'), "
            "not a reserved one"
        )
    return value


EngineName = Annotated[
    str, Field(min_length=1, max_length=ENGINE_NAME_MAX), AfterValidator(_engine_name)
]


class _ModelEntry(_Strict):
    id: Annotated[str, Field(min_length=1, max_length=100), AfterValidator(_model_id)]
    engine: EngineName = "llamacpp"
    path: PathText
    ctx: Annotated[int, Field(ge=1, le=MAX_CONTEXT)] = 4096
    slots: Annotated[int, Field(ge=1, le=MAX_SLOTS)] = 1
    kv_type: KvType | None = None
    replicas: Annotated[int, Field(ge=1, le=MAX_REPLICAS)] = 1
    pinned: bool = False
    idle_ttl: Seconds | None = None
    autostart: bool = False
    extra_args: ExtraArgs = {}
    options: Options = {}


class _EngineDefaults(_Strict):
    binary: ProgramText | None = None
    idle_timeout: Seconds | None = None
    startup_timeout: StartupSeconds | None = None
    extra_args: ExtraArgs = {}
    options: Options = {}

    @field_validator("binary")
    @classmethod
    def _runnable(cls, value: str | None) -> str | None:
        if value is not None and not (Path(value).is_file() and os.access(value, os.X_OK)):
            raise ValueError("not an executable file")
        return value


def _host(value: str) -> str:
    """An address or host name to listen on (``0.0.0.0``, ``::1``, ``localhost``)."""
    if not value.isascii() or not value.isprintable() or " " in value or "/" in value:
        raise ValueError("an address or host name to listen on: no space, no scheme, no path")
    return value


class _ServerSection(_Strict):
    host: Annotated[str, Field(min_length=1, max_length=253), AfterValidator(_host)] = DEFAULT_HOST
    port: Annotated[int, Field(ge=0, le=65535)] = DEFAULT_PORT
    auth: Auth = "token"


class _BudgetSection(_Strict):
    # typed by hand: a union's error would name its members, not the key
    bytes: Any = None
    spillover: Any = None

    @field_validator("bytes")
    @classmethod
    def _bytes(cls, value: object) -> BudgetSetting:
        if value == "auto" or value is None:
            return "auto" if value else None
        if type(value) is int and 0 < value <= MAX_BUDGET_BYTES:
            problem = floor_problem(value)
            if problem is None:
                return value
            raise ValueError(problem)
        raise ValueError(f'a whole number of bytes from {MIN_BUDGET_BYTES} to 2^60, or "auto"')

    @field_validator("spillover")
    @classmethod
    def _spillover(cls, value: object) -> SpilloverSetting:
        if value == "auto" or isinstance(value, bool):
            return "auto" if value == "auto" else bool(value)
        raise ValueError('true, false or "auto"')


class _ArbiterSection(_Strict):
    policy: ArbiterPolicy = "auto"


def _eviction_name(value: str) -> str:
    if not valid_policy_name(value):
        raise ValueError(
            "an eviction policy's name: lower-case letters, digits and dashes, "
            'like "demand-lru" or "lru"'
        )
    return value


class _PoolSection(_Strict):
    eviction: Annotated[str, Field(max_length=40), AfterValidator(_eviction_name)] = (
        DEFAULT_EVICTION_POLICY.name
    )


class _DiscoverySection(_Strict):
    sources: Annotated[list[DiscoverySource], Field(max_length=4)] = list(DISCOVERY_SOURCES)
    folders: Annotated[list[PathText], Field(max_length=64)] = []
    rescan_seconds: Annotated[
        float, Field(ge=0, le=365 * 24 * 3600), AfterValidator(_rescan_pace)
    ] = DEFAULT_RESCAN


class _DaemonSection(_Strict):
    data_dir: PathText | None = None
    idle_timeout: Seconds = 300.0
    health_interval: Annotated[float, Field(gt=0, le=24 * 3600)] = 15.0
    ledger: PathText | None = None
    ledger_shared: bool = False
    engine_log_max_mib: Annotated[int, Field(ge=1, le=MAX_ENGINE_LOG_MIB)] = (
        DEFAULT_LOG_MAX_BYTES // MIB
    )
    engine_log_keep: Annotated[int, Field(ge=0, le=MAX_ENGINE_LOG_KEEP)] = DEFAULT_LOG_KEEP
    log_max_mib: Annotated[int, Field(ge=1, le=MAX_ENGINE_LOG_MIB)] | None = None
    log: LogText | None = None
    host_name: Annotated[str, AfterValidator(_host_name)] | None = None


class _ConfigFile(_Strict):
    daemon: _DaemonSection = _DaemonSection()
    server: _ServerSection = _ServerSection()
    budget: _BudgetSection = _BudgetSection()
    arbiter: _ArbiterSection = _ArbiterSection()
    pool: _PoolSection = _PoolSection()
    engine_defaults: Annotated[dict[EngineName, _EngineDefaults], Field(max_length=64)] = {}
    engines: Annotated[list[_EngineEntry], Field(max_length=MAX_ENGINES)] = []
    models: Annotated[list[_ModelEntry], Field(max_length=MAX_ENGINES)] = []
    discovery: _DiscoverySection | None = None


def load_config(path: str | os.PathLike[str], *, data_dir: Path | None = None) -> DaemonConfig:
    """Read and validate a TOML config.

    Raises:
        UsageError: One line: the file, the key, and what is wrong with it.
    """
    try:
        file = user_path(path)
    except ValueError as exc:
        raise UsageError(f"{os.fspath(path)[:200]!r}: not a usable config path ({exc})") from None
    raw = _read_toml(file)
    base = file.resolve().parent  # a regular file by now: no loop to follow
    try:
        parsed = _ConfigFile.model_validate(raw, strict=True, context={"base": base})
    except ValidationError as exc:
        raise UsageError(_first_problem(file, exc)) from None
    section = parsed.daemon
    engines, template = _engines_of(file, parsed)
    if data_dir is not None:
        try:
            where = user_path(data_dir, resolve=True)  # against the working directory
        except ValueError as exc:
            raise UsageError(f"data directory {os.fspath(data_dir)[:200]!r}: {exc}") from None
    elif section.data_dir is not None:
        where = Path(section.data_dir)
    else:
        where = default_data_dir()
    return DaemonConfig(
        data_dir=where,
        engines=engines,
        idle_timeout=section.idle_timeout,
        health_interval=section.health_interval,
        ledger=Path(section.ledger) if section.ledger else None,
        ledger_shared=section.ledger_shared,
        engine_log_max_bytes=section.engine_log_max_mib * MIB,
        engine_log_keep=section.engine_log_keep,
        log_max_bytes=section.log_max_mib * MIB if section.log_max_mib else None,
        log=section.log,
        host_name=section.host_name,
        host=parsed.server.host,
        port=parsed.server.port,
        auth=parsed.server.auth,
        budget_bytes=parsed.budget.bytes,
        spillover=parsed.budget.spillover,
        budget_from=("" if parsed.budget.bytes is None else config_source(str(file.resolve()))),
        arbiter=parsed.arbiter.policy,
        eviction=parsed.pool.eviction,
        default_options={
            name: (f"{file}: engine_defaults.{name}.options", dict(preset.options))
            for name, preset in parsed.engine_defaults.items()
            if preset.options
        },
        discovery=None
        if parsed.discovery is None
        else DiscoverySettings(
            sources=tuple(dict.fromkeys(parsed.discovery.sources)),
            folders=tuple(Path(folder) for folder in parsed.discovery.folders),
            rescan_seconds=parsed.discovery.rescan_seconds,
            template=template,
        ),
    )


def _merge_flags(
    defaults: Mapping[str, str | int | float | bool], own: Mapping[str, str | int | float | bool]
) -> dict[str, str | int | float | bool]:
    """RD5: the engine's default ``extra_args`` with the entry's over them, per flag.

    An entry's ``no-mmap`` replaces a default ``--no-mmap`` in its place; the entry's other
    flags follow in their order.
    """
    mine = {flag_of(key): key for key in own}
    merged: dict[str, str | int | float | bool] = {}
    for key, value in defaults.items():
        if (override := mine.get(flag_of(key))) is not None:
            merged[override] = own[override]
        else:
            merged[key] = value
    return {**merged, **own}


def _engines_of(file: Path, parsed: _ConfigFile) -> tuple[tuple[EngineConfig, ...], EngineConfig]:
    """``[[engines]]`` as written, then each ``[[models]]`` entry's replicas, defaults applied.

    Also the engine a discovered model runs as: a ``[[models]]`` entry of its own defaults
    with ``[engine_defaults.llamacpp]`` applied the same way.

    Raises:
        UsageError: A key or a model id configured twice, or too many engines in all.
    """
    names = [e.key for e in parsed.engines]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})[0]
        raise UsageError(f"{file}: engines: the key {twice!r} is configured twice")
    taken = {key.model: key for key in map(parse_key, names) if key is not None}
    defaults = parsed.engine_defaults
    engines: list[EngineConfig] = []

    def add(
        engine: str, key: str, model: str, entry: _EngineEntry | _ModelEntry, where: str
    ) -> None:
        preset = defaults.get(engine)
        args = _merge_flags(preset.extra_args if preset else {}, entry.extra_args)
        binary = preset.binary if preset else None
        options = {**(preset.options if preset else {}), **entry.options}  # the entry's win
        origin = {name: f"{file}: engine_defaults.{engine}.options" for name in options}
        origin.update({name: f"{file}: {where}.options" for name in entry.options})
        engines.append(
            EngineConfig(
                key=key,
                model=Path(model),
                ctx=entry.ctx,
                slots=entry.slots,
                kv_type=entry.kv_type,
                autostart=entry.autostart,
                extra_args=args,
                pinned=entry.pinned,
                idle_ttl=entry.idle_ttl if isinstance(entry, _ModelEntry) else None,
                engine_idle_timeout=preset.idle_timeout if preset else None,
                startup_timeout=preset.startup_timeout if preset else None,
                binary=Path(binary) if binary else None,
                options=options,
                options_from=origin,
            )
        )

    for index, entry in enumerate(parsed.engines):
        parsed_key = parse_key(entry.key)
        engine_name = parsed_key.engine if parsed_key else ""
        add(engine_name, entry.key, entry.model, entry, f"engines[{index}]")
    seen: set[str] = set()
    for index, model in enumerate(parsed.models):
        where = f"{file}: models[{index}].id"
        if model.id in seen:
            raise UsageError(f"{where}: the model {model.id!r} is configured twice")
        if model.id in taken:
            raise UsageError(
                f"{where}: the model {model.id!r} is also engines key {str(taken[model.id])!r}; "
                "configure it once"
            )
        seen.add(model.id)
        if len(engines) + model.replicas > MAX_ENGINES:
            raise UsageError(f"{where}: more than {MAX_ENGINES} engines in all (replicas count)")
        key = f"{model.engine}:{model.id}:{model.replicas - 1}"
        if len(key) > MAX_KEY_LENGTH:
            raise UsageError(
                f"{where}: its engine keys ({key!r}) are over {MAX_KEY_LENGTH} characters"
            )
        for replica in range(model.replicas):
            key = f"{model.engine}:{model.id}:{replica}"
            add(model.engine, key, model.path, model, f"models[{index}]")
    configured = tuple(engines)
    add("llamacpp", "llamacpp:model:0", "", _ModelEntry(id="model", path="."), "discovery")
    return configured, engines[-1]


def discovered_config(data_dir: Path | None = None) -> DaemonConfig:
    """The config of ``hostler serve`` with no file: discovery on, every source, defaults.

    The models are found once the daemon runs (:mod:`hostler.daemon_parts.catalog`), in the
    places :func:`source_places` names.

    Raises:
        UsageError: The data directory cannot be used.
    """
    try:
        where = user_path(data_dir, resolve=True) if data_dir is not None else default_data_dir()
    except ValueError as exc:
        raise UsageError(f"data directory {os.fspath(data_dir or '')[:200]!r}: {exc}") from None
    return DaemonConfig(data_dir=where, discovery=DiscoverySettings())


def with_places(
    settings: DaemonConfig, environ: Mapping[str, str], *, models_dir: Path | None = None
) -> DaemonConfig:
    """``settings`` with its discovery's places found (:func:`source_places`), if it discovers."""
    if settings.discovery is None:
        return settings
    places = source_places(settings.discovery, settings.data_dir, environ, models_dir=models_dir)
    return dataclasses.replace(
        settings, discovery=dataclasses.replace(settings.discovery, places=places)
    )


def source_places(
    discovery: DiscoverySettings,
    data_dir: Path,
    environ: Mapping[str, str],
    *,
    models_dir: Path | None = None,
) -> tuple[tuple[Source, Path], ...]:
    """Where each of ``discovery``'s sources is, read from ``environ`` as each program does.

    ``models``: ``models_dir`` (``HOSTLER_MODELS_DIR``), else ``DATA_DIR/models``;
    ``huggingface``: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
    ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``; ``ollama``:
    ``$OLLAMA_MODELS``, else ``~/.ollama/models``; ``lmstudio``: ``~/.lmstudio/models``; then
    the config's folders (source ``config``). ``~`` is ``$HOME``: without it, a place that
    needs it is left out. Relative or unusable values are left out too.
    """

    def given(name: str) -> Path | None:
        value = environ.get(name, "").strip()
        return Path(value) if value and "\0" not in value and Path(value).is_absolute() else None

    home = given("HOME")

    def under_home(*parts: str) -> Path | None:
        return home.joinpath(*parts) if home is not None else None

    hf_home = given("HF_HOME")
    xdg = given("XDG_CACHE_HOME")
    where: dict[str, Path | None] = {
        "models": models_dir if models_dir is not None else data_dir / "models",
        "huggingface": given("HF_HUB_CACHE")
        or (hf_home / "hub" if hf_home is not None else None)
        or (xdg / "huggingface" / "hub" if xdg is not None else None)
        or under_home(".cache", "huggingface", "hub"),
        "ollama": given("OLLAMA_MODELS") or under_home(".ollama", "models"),
        "lmstudio": under_home(".lmstudio", "models"),
    }
    places = [(s, path) for s in discovery.sources if (path := where[s]) is not None]
    return (*places, *(("config", folder) for folder in discovery.folders))


def _read_toml(file: Path) -> dict[str, Any]:
    try:
        if not file.is_file():
            raise UsageError(f"{file}: not a config file (missing, or not a regular file)")
        if file.stat().st_size > MAX_CONFIG_BYTES:
            raise UsageError(f"{file}: too large for a config file (over 4 MiB)")
        text = file.read_bytes().decode("utf-8")
    except OSError as exc:
        raise UsageError(f"{file}: cannot read the config ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise UsageError(f"{file}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{file}: not valid TOML ({exc})") from None
    except ValueError:  # tomllib's int() of a number past Python's 4300-digit limit
        raise UsageError(f"{file}: a number has more than 4300 digits") from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise UsageError(f"{file}: arrays or tables nested too deeply") from None


_KNOWN = {
    (): set(_ConfigFile.model_fields),
    ("daemon",): set(_DaemonSection.model_fields),
    ("engines",): set(_EngineEntry.model_fields),
    ("models",): set(_ModelEntry.model_fields),
    ("server",): set(_ServerSection.model_fields),
    ("budget",): set(_BudgetSection.model_fields),
    ("arbiter",): set(_ArbiterSection.model_fields),
    ("pool",): set(_PoolSection.model_fields),
    ("discovery",): set(_DiscoverySection.model_fields),
    ("engine_defaults", "*"): set(_EngineDefaults.model_fields),
}


def _first_problem(file: Path, exc: ValidationError) -> str:
    """The first validation error as one line: file, dotted key, what was expected."""
    error = exc.errors(include_url=False)[0]
    loc = tuple(error["loc"])
    key = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc)
    key = key.lstrip(".") or "(top level)"
    if error["type"] == "extra_forbidden":
        name = str(loc[-1])
        scope = tuple(p for p in loc[:-1] if not isinstance(p, int))
        if scope[:1] == ("engine_defaults",):
            scope = ("engine_defaults", "*")
        close = difflib.get_close_matches(name, sorted(_KNOWN.get(scope, set())), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        known = ", ".join(sorted(_KNOWN.get(scope, set())))
        return f"{file}: {key}: unknown setting{hint} (known here: {known})"[:500]
    given = error.get("input")
    got = repr(masked(given) if isinstance(given, str) else given)
    if len(got) > 60:
        got = got[:57] + "..."
    message = str(error["msg"]).replace("Input should be", "should be")
    message = message.removeprefix("Value error, ")
    return f"{file}: {key}: {message} (got {got})"[:500]
