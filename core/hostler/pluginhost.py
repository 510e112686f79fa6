"""The plugin host: loads engine adapters from the ``hostler`` entry-point group, in isolation.

Built-in adapters are registered exactly as a third party's: through entry points. Each plugin
is imported, validated and asked for its engines on its own; one that fails to import, whose
hook raises, that registers something that is not an adapter, or that claims an engine name
already taken is disabled with a recorded event and a clear message, and the rest keep
working. Built-in plugins (the ``hostler`` distribution's) load first, so no plugin can take
over a built-in engine name. A built-in placeholder that registers no engine holds no name at
all: a third-party plugin of the same entry-point name replaces it (PL1).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import pluggy

from hostler.errors import HostlerError, PluginError, UnknownEngineError
from hostler.events.base import Event
from hostler.events.plugin import PluginFailed, PluginLoaded
from hostler.plugin import (
    PROJECT,
    EngineAdapter,
    Hookspecs,
    engine_name_problem,
    options_schema_problem,
)
from hostler.policies.eviction import (
    BUILTIN_EVICTION_POLICIES,
    EvictionPolicy,
    valid_policy_name,
)

__all__ = [
    "PluginFailed",
    "PluginHost",
    "PluginLoaded",
    "PluginRecord",
    "UnknownEngineError",
    "answer_problem",
    "describe_exception",
    "plugin_fault",
]

log = logging.getLogger(__name__)


@dataclass
class PluginRecord:
    """What ``hostler plugins`` shows for one plugin."""

    name: str
    version: str
    status: str  # "ok", "failed", "blocked"
    engines: list[str] = field(default_factory=list)
    error: str = ""


class PluginHost:
    """Discovers and holds engine adapters.

    Args:
        blocked: Entry-point names an operator disabled.
        record: Receives a ``plugin.loaded`` / ``plugin.failed`` event per plugin.
        entry_points_source: Where entry points come from (tests pass their own).
    """

    def __init__(
        self,
        *,
        blocked: Iterable[str] = (),
        record: Callable[[Event], None] | None = None,
        entry_points_source: Callable[[], Iterable[EntryPoint]] | None = None,
    ) -> None:
        self._blocked = set(blocked)
        self._record = record or (lambda _event: None)
        self._source = entry_points_source or (lambda: entry_points(group=PROJECT))
        self.manager = pluggy.PluginManager(PROJECT)
        self.manager.add_hookspecs(Hookspecs)
        self.adapters: dict[str, type[EngineAdapter]] = {}
        #: Eviction policies plugins registered (EV1), by name; the built-ins are not here.
        self.eviction_policies: dict[str, EvictionPolicy] = {}
        self.owners: dict[str, str] = {}
        self.plugins: dict[str, PluginRecord] = {}
        self._placeholders: set[str] = set()  # built-ins that registered nothing (PL1)

    def load(self) -> PluginHost:
        """Load every plugin (built-ins first); never raises for a plugin's fault."""
        points = list(self._source())
        points.sort(key=lambda ep: (_distribution(ep) != PROJECT, ep.name))
        for point in points:
            self._load_one(point)
        return self

    def _load_one(self, point: EntryPoint) -> None:
        name, version = point.name, _version(point)
        if name in self._placeholders:  # PL1: an empty built-in yields its name
            self._placeholders.discard(name)
            self._unregister(name)
            del self.plugins[name]
        if name in self.plugins:
            self._fail(name, version, "load", f"a second plugin is named {name!r}; ignored")
            return
        if name in self._blocked:
            self.plugins[name] = PluginRecord(name, version, "blocked")
            return
        try:
            module = point.load()
        except Exception as exc:  # noqa: BLE001 - a plugin's import error must not stop the host
            self._fail(name, version, "import", describe_exception(exc))
            return
        try:
            self.manager.register(module, name=name)
            self.manager.check_pending()
        except Exception as exc:  # noqa: BLE001 - invalid hooks disable this plugin only
            self._unregister(name)
            self._fail(name, version, "validate", describe_exception(exc))
            return
        offered = self._collect(name, version, "register_engines", self._check)
        if offered is None:
            return
        policies = self._collect(name, version, "register_eviction_policies", self._check_policies)
        if policies is None:
            return
        for policy in policies:
            self.eviction_policies[policy.name] = policy
        engines = []
        for cls in offered:
            self.adapters[cls.engine_type] = cls
            self.owners[cls.engine_type] = name
            engines.append(cls.engine_type)
        self.plugins[name] = PluginRecord(name, version, "ok", engines)
        if not engines and not policies and _distribution(point) == PROJECT:
            self._placeholders.add(name)
        self._record(PluginLoaded(name, version, engines))

    def _collect(
        self, name: str, version: str, hook: str, check: Callable[[list[Any]], str]
    ) -> list[Any] | None:
        """What plugin ``name``'s ``hook`` registers; None (plugin disabled) when it fails."""
        offered: list[Any] = []
        for impl in getattr(self.manager.hook, hook).get_hookimpls():
            if impl.plugin_name != name:
                continue
            try:
                impl.function(register=offered.append)
            except Exception as exc:  # noqa: BLE001 - one raising hook disables its plugin only
                self._unregister(name)
                self._fail(name, version, hook, describe_exception(exc))
                return None
        problem = check(offered)
        if problem:
            self._unregister(name)
            self._fail(name, version, hook, problem)
            return None
        return offered

    def _check(self, offered: list[Any]) -> str:
        seen: set[str] = set()
        for cls in offered:
            problem = _adapter_class_problem(cls)
            if problem:
                return problem
            engine = cls.engine_type
            if engine in self.adapters:
                return (
                    f"engine {engine!r} is already registered by plugin "
                    f"{self.owners[engine]!r}; this plugin is disabled"
                )
            if engine in seen:
                return f"registers engine {engine!r} twice"
            seen.add(engine)
        return ""

    def _check_policies(self, offered: list[Any]) -> str:
        seen: set[str] = set()
        for policy in offered:
            if not isinstance(policy, EvictionPolicy):
                return (
                    f"registered {policy!r}, which is not an eviction policy (name, version, rank)"
                )
            name = getattr(policy, "name", None)
            if not isinstance(name, str) or not valid_policy_name(name):
                return f"eviction policy name {name!r} is not ^[a-z][a-z0-9-]{{0,39}}$"
            if name in BUILTIN_EVICTION_POLICIES or name in self.eviction_policies or name in seen:
                return f"eviction policy {name!r} is already registered; this plugin is disabled"
            version = getattr(policy, "version", None)
            if type(version) is not int or version < 0:
                return f"eviction policy {name!r} has version {version!r}, not a whole number"
            seen.add(name)
        return ""

    def _unregister(self, name: str) -> None:
        plugin = self.manager.get_plugin(name)
        if plugin is not None:
            self.manager.unregister(plugin, name=name)

    def _fail(self, name: str, version: str, stage: str, error: str) -> None:
        log.warning("hostler: plugin %s disabled (%s): %s", name, stage, error)
        self.plugins[name] = PluginRecord(name, version, "failed", error=f"{stage}: {error}")
        self._record(PluginFailed(name, version, stage, error))

    def adapter(self, engine: str, **options: Any) -> EngineAdapter:
        """An adapter instance for an engine name.

        Raises:
            UnknownEngineError: No loaded plugin provides it.
            PluginError: The plugin's adapter raised while it was built (SG3).
        """
        cls = self.adapters.get(engine)
        if cls is None:
            known = ", ".join(sorted(self.adapters)) or "none"
            raise UnknownEngineError(f"no plugin provides engine {engine!r} (loaded: {known})")
        try:
            return cls(**options)
        except HostlerError:
            raise
        except BaseException as exc:  # a plugin's sys.exit() or worse: its bug, not ours
            raise plugin_fault(
                engine, cls, f"raised {describe_exception(exc)} while its adapter was built"
            ) from exc


def _distribution(point: EntryPoint) -> str:
    dist = getattr(point, "dist", None)
    return str(dist.name) if dist is not None else ""


def _version(point: EntryPoint) -> str:
    dist = getattr(point, "dist", None)
    return str(dist.version) if dist is not None else "unknown"


def plugin_fault(engine: str, cls: type, what: str) -> PluginError:
    """SG3's error: ``the 'ENGINE' engine plugin (module.Class) WHAT``, naming the culprit."""
    return PluginError(f"the {engine!r} engine plugin ({cls.__module__}.{cls.__qualname__}) {what}")


def ask_adapter(
    adapter: EngineAdapter,
    what: str,
    func: Callable[..., object],
    *args: object,
    returns: type,
    optional: bool = False,
    prefix: str = "",
) -> Any:
    """SG3: ``func(*args)`` of ``adapter``'s, its raise or wrong answer the plugin's error.

    A ``HostlerError`` passes through (the plugin's own one-line refusal); any other raise, or
    an answer :func:`answer_problem` refuses, is a :class:`PluginError` naming the plugin and
    ``what``, after ``prefix`` (an engine key, say). For callers outside the supervisor:
    pricing (``hostler preview``) asks the adapter through here.
    """
    try:
        answer = func(*args)
    except HostlerError:
        raise
    except BaseException as exc:  # sys.exit(), KeyboardInterrupt... from plugin code: its bug
        fault = plugin_fault(
            adapter.engine_type, type(adapter), f"raised {describe_exception(exc)} in {what}"
        )
        raise PluginError(f"{prefix}{fault.message}") from exc
    problem = answer_problem(answer, returns, optional=optional)
    if problem is not None:
        fault = plugin_fault(adapter.engine_type, type(adapter), f"{problem} from {what}")
        raise PluginError(f"{prefix}{fault.message}")
    return answer


def describe_exception(exc: BaseException) -> str:
    """``Type: first line of its message``, even for an exception whose ``__str__`` raises."""
    try:
        text = str(exc).strip().splitlines()
    except BaseException:  # noqa: BLE001 - a plugin's broken __str__ must not hide its error
        text = ["(its message could not be read)"]
    return f"{type(exc).__name__}: {text[0][:500] if text else ''}".rstrip(": ")


def _adapter_class_problem(cls: object) -> str:
    """Why ``cls`` cannot be registered as an engine adapter ("" when it can)."""
    if not (isinstance(cls, type) and issubclass(cls, EngineAdapter)):
        return f"registered {cls!r}, which is not an EngineAdapter subclass"
    if not cls.engine_type:
        return f"{cls.__qualname__} has no engine_type"
    problem = engine_name_problem(cls.engine_type)
    if problem is not None:
        return f"{cls.__qualname__}.engine_type {problem}"
    problem = options_schema_problem(cls.options_schema)  # set after the class was made, say
    return f"{cls.__qualname__}.{problem}" if problem is not None else ""


def answer_problem(answer: object, returns: type, *, optional: bool = False) -> str | None:
    """SG3: ``returned <repr>`` when a hook's ``answer`` is not a ``returns``, else None.

    None also fits when ``optional``. ``bool`` and ``int`` are exact (a truthy string is no
    verdict, a bool no count); anything else is an ``isinstance`` check. A coroutine (an
    accidental ``async def`` hook) is closed, so that it is not left "never awaited".
    """
    if answer is None and optional:
        return None
    fits = type(answer) is returns if returns in (bool, int) else isinstance(answer, returns)
    if fits:
        return None
    if inspect.iscoroutine(answer):
        answer.close()
    return f"returned {_safe_repr(answer)}"


def _safe_repr(value: object) -> str:
    """``repr(value)`` cut to 60 characters, even for a plugin object whose ``__repr__`` raises."""
    try:
        text = repr(value)
    except BaseException:  # noqa: BLE001 - a plugin's broken __repr__ must not hide its error
        text = f"<{type(value).__name__} (its repr could not be read)>"
    return text[:60]
