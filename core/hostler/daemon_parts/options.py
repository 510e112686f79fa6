"""The configured engines' options against their adapters' schemas (RD6), their slots (S8, S9)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from hostler.capacity.keys import parse_key
from hostler.config import EngineConfig
from hostler.errors import UsageError
from hostler.plugin import validate_options
from hostler.pluginhost import PluginHost

__all__ = ["check_engine_options"]

log = logging.getLogger("hostler.daemon")  # the daemon's records keep its logger's name


def check_engine_options(
    engines: Iterable[EngineConfig],
    plugins: PluginHost,
    defaults: Mapping[str, tuple[str, Mapping[str, object]]] | None = None,
) -> None:
    """RD6: every configured ``options`` table against its engine adapter's schema; S8: slots.

    ``defaults`` are the ``[engine_defaults.<engine>.options]`` tables (engine → where, table),
    checked whether or not a model uses them. An engine whose plugin is not loaded is skipped
    (it fails on its own, naming that); defaults for an engine no plugin provides are said once
    in the log (a misspelled section, or a plugin that did not load).

    Raises:
        UsageError: One line naming the file, the table and the key.
    """
    for name, (where, options) in sorted((defaults or {}).items()):
        adapter = plugins.adapters.get(name)
        if adapter is None:
            log.warning("hostler: %s: no loaded plugin provides engine %r; unused", where, name)
            continue
        for key, value in options.items():
            validate_options(
                {key: value}, adapter.options_schema, where=where, engine=adapter.engine_type
            )
    for engine in engines:
        parsed = parse_key(engine.key)
        cls = plugins.adapters.get(parsed.engine) if parsed else None
        if cls is None:
            continue
        if cls.kv_types is not None and engine.kv_type and engine.kv_type not in cls.kv_types:
            raise UsageError(  # S9
                f"{engine.key}: kv_type = {engine.kv_type!r}, but engine {cls.engine_type!r} "
                f"supports {', '.join(cls.kv_types)} only; set one of them or leave it unset"
            )
        if cls.max_slots is not None and engine.slots > cls.max_slots:  # S8
            raise UsageError(
                f"{engine.key}: slots = {engine.slots}, but engine {cls.engine_type!r} serves at "
                f"most {cls.max_slots} at once; set slots to {cls.max_slots} or fewer"
            )
        for name, value in engine.options.items():
            where = engine.options_from.get(name, f"{engine.key}: options")
            validate_options({name: value}, cls.options_schema, where=where, engine=cls.engine_type)
