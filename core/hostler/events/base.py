"""The event base class, the type registry and the upcaster chain."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar, cast

import msgspec

__all__ = [
    "Event",
    "UnknownEvent",
    "decode",
    "encode",
    "event_class",
    "event_type",
    "payload_of",
    "registered_types",
    "typed_decoder",
    "upcaster",
]

JSONDict = dict[str, Any]
Upcaster = Callable[[JSONDict], JSONDict]


class Event:
    """Base of every event: subclasses are frozen dataclasses made with :func:`event_type`.

    Payload fields must be JSON values (str, int, float, bool, None, lists and dicts of them);
    a ``StrEnum`` member is fine since it is a str.
    """

    __slots__ = ()

    TYPE: ClassVar[str] = ""
    SCHEMA_VERSION: ClassVar[int] = 1
    _FIELDS: ClassVar[tuple[str, ...]] = ()


@dataclass(frozen=True, slots=True)
class UnknownEvent:
    """An event whose type this process does not know, kept as a generic record.

    It appears when a log holds events of an uninstalled plugin, or of a newer hostler
    (``schema_version`` above the one this version understands).
    """

    type: str
    schema_version: int
    payload: JSONDict
    reason: str


_REGISTRY: dict[str, type[Event]] = {}
_UPCASTERS: dict[tuple[str, int], Upcaster] = {}
# Per class: a msgspec JSON decoder straight into it, or None where msgspec cannot type it.
_DECODERS: dict[type[Event], msgspec.json.Decoder[Any] | None] = {}
_FITS = (TypeError, msgspec.ValidationError)

E = TypeVar("E", bound=type[Event])


def event_type(name: str, *, schema_version: int = 1) -> Callable[[E], E]:
    """Register an event class under a stable type string.

    Args:
        name: The stable type, dotted and lower case (``engine.spawned``). Never reuse one.
        schema_version: Bump it when the payload changes, and register an :func:`upcaster`
            from the previous version.

    Raises:
        ValueError: The name is taken by another class, or the class is no dataclass.
    """
    if not name or name != name.strip() or " " in name:
        raise ValueError(f"bad event type name {name!r}")

    def register(cls: E) -> E:
        if "__dataclass_fields__" not in vars(cls):
            raise ValueError(f"event {name!r}: {cls.__qualname__} must be a frozen dataclass")
        known = _REGISTRY.get(name)
        if known is not None and known is not cls:
            raise ValueError(f"event type {name!r} is already registered")
        cls.TYPE = name
        cls.SCHEMA_VERSION = schema_version
        cls._FIELDS = tuple(f.name for f in dataclasses.fields(cast("Any", cls)))
        _REGISTRY[name] = cls
        return cls

    return register


def upcaster(name: str, *, from_version: int) -> Callable[[Upcaster], Upcaster]:
    """Register a function that turns a ``from_version`` payload into the next version's.

    Chains apply on read: a v1 payload of a v3 event passes v1→v2, then v2→v3.
    """

    def register(fn: Upcaster) -> Upcaster:
        key = (name, from_version)
        if key in _UPCASTERS:
            raise ValueError(f"upcaster for {name!r} v{from_version} is already registered")
        _UPCASTERS[key] = fn
        return fn

    return register


def registered_types() -> Mapping[str, type[Event]]:
    """Every event type this process knows, by type string (read-only view)."""
    return dict(_REGISTRY)


def event_class(type_name: str) -> type[Event] | None:
    """The class registered under ``type_name``, or None."""
    return _REGISTRY.get(type_name)


def encode(event: Event) -> tuple[str, int, JSONDict]:
    """Return ``(type, schema_version, payload)`` for storing ``event``."""
    cls = type(event)
    if not getattr(cls, "TYPE", ""):
        raise TypeError(f"{cls.__qualname__} is not a registered event type (see event_type)")
    return cls.TYPE, cls.SCHEMA_VERSION, {name: getattr(event, name) for name in cls._FIELDS}


def decode(type_name: str, schema_version: int, payload: JSONDict) -> Event | UnknownEvent:
    """Rebuild an event from its stored form, upcasting old payloads on the way.

    Never raises for data: an unknown type, a newer schema, a missing upcaster or a payload
    that no longer fits the class yields an :class:`UnknownEvent` that keeps everything. A
    payload fits when every field without a default is there with a value of its annotated
    type (checked by msgspec, as replay's typed decoders check it; an int is taken for a float);
    fields the class does not have are ignored.
    """
    cls = _REGISTRY.get(type_name)
    if cls is None:
        return UnknownEvent(type_name, schema_version, payload, "type not registered here")
    current = cls.SCHEMA_VERSION
    if schema_version != current:
        if schema_version > current:
            return UnknownEvent(
                type_name,
                schema_version,
                payload,
                f"written by a newer schema (v{schema_version}; this hostler knows v{current})",
            )
        version, data = schema_version, payload
        while version < current:
            step = _UPCASTERS.get((type_name, version))
            if step is None:
                return UnknownEvent(
                    type_name, schema_version, payload, f"no upcaster from v{version}"
                )
            data, version = step(dict(data)), version + 1
        payload = data
    try:
        if typed_decoder(cls) is None:
            return cls(**payload)
        return msgspec.convert(payload, cls)
    except _FITS as exc:
        return UnknownEvent(type_name, schema_version, payload, f"payload does not fit: {exc}")


def typed_decoder(cls: type[Event]) -> msgspec.json.Decoder[Any] | None:
    """A msgspec decoder from a payload's JSON text straight into ``cls`` (cached).

    None when msgspec cannot type the class's fields (then decoding goes through a dict).
    """
    try:
        return _DECODERS[cls]
    except KeyError:
        pass
    decoder: msgspec.json.Decoder[Any] | None
    try:
        decoder = msgspec.json.Decoder(cls)
    except (TypeError, NameError):
        decoder = None
    _DECODERS[cls] = decoder
    return decoder


def payload_of(value: str | dict[str, Any]) -> dict[str, Any]:
    """A payload from :meth:`EventStore.read_rows`, decoded whatever the driver gave."""
    if isinstance(value, str):
        decoded: dict[str, Any] = msgspec.json.decode(value)
        return decoded
    return value
