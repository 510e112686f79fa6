"""Persist lifecycle models' pending events, and rebuild every model by folding the log."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import IntEnum
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from hostler.events.base import (
    Event,
    UnknownEvent,
    decode,
    event_class,
    payload_of,
    typed_decoder,
)
from hostler.events.fold import fold, fold_step
from hostler.machines import (
    LIFECYCLES,
    Engine,
    Lease,
    LifecycleModel,
    Reservation,
)

if TYPE_CHECKING:  # the store is handed in: replay itself loads no I/O library
    from hostler.store.log import AppendResult, EventStore

__all__ = ["Folded", "World", "WorldFold", "commit", "load", "replay"]

M = TypeVar("M", bound=LifecycleModel)

_BY_PREFIX: dict[str, type[LifecycleModel]] = {cls.STREAM_PREFIX: cls for cls in LIFECYCLES}


@dataclass
class World:
    """Every lifecycle instance the log describes, as of ``last_seq``.

    Attributes:
        models: Each model class's instances, by key.
        last_seq: The seq of the last event folded (0 for an empty log).
        events: How many events were read.
        unknown: Seqs of lifecycle-stream events that were not folded: of a type (or schema)
            this hostler does not know, whose payload does not fit, or of another lifecycle.
            Each still moved its model's ``version``.
        other: How many events belonged to streams of no lifecycle (samples, plugins).
        damaged: ``(seq, why)`` of rows that could not be read at all (payload not JSON, a
            version that is not a number): listed, never folded, never stopping the replay.
    """

    models: dict[type[LifecycleModel], dict[str, LifecycleModel]] = field(
        default_factory=lambda: {cls: {} for cls in LIFECYCLES}
    )
    last_seq: int = 0
    events: int = 0
    unknown: list[int] = field(default_factory=list)
    other: int = 0
    damaged: list[tuple[int, str]] = field(default_factory=list)

    def of(self, cls: type[M]) -> Mapping[str, M]:
        """The instances of one lifecycle class, by key."""
        return self.models[cls]  # type: ignore[return-value]

    @property
    def engines(self) -> Mapping[str, Engine]:
        """Engines by key."""
        return self.of(Engine)

    @property
    def leases(self) -> Mapping[str, Lease]:
        """GPU leases by id."""
        return self.of(Lease)

    @property
    def reservations(self) -> Mapping[str, Reservation]:
        """Memory reservations by engine key."""
        return self.of(Reservation)

    def snapshot(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Every model's folded fields, keyed by stream id (for comparisons and dumps)."""
        return {
            cls.__name__: {key: m.snapshot() for key, m in sorted(models.items())}
            for cls, models in self.models.items()
        }


def replay(
    store: EventStore,
    *,
    until_seq: int | None = None,
    until: datetime | None = None,
    world: World | None = None,
    after_seq: int = 0,
    on_page: Callable[[Sequence[Sequence[Any]]], None] | None = None,
) -> World:
    """Fold the log (up to ``until_seq`` / recorded time ``until``) into a :class:`World`.

    ``world`` and ``after_seq`` continue an earlier fold (a snapshot taken at ``after_seq``)
    instead of starting from an empty world; ``on_page`` sees each page of raw rows after it
    was folded (another fold riding the same read, e.g. the post-mortem's runtime state).

    Every stream of a lifecycle is folded with :func:`~hostler.events.fold.fold_step`, as
    :func:`load` folds one: each model's ``version`` is its stream's last version. Events of
    unknown types, of types that do not belong to the stream's lifecycle, or whose payload no
    longer fits their class are kept in the log and listed in ``World.unknown``; they never
    stop a replay.
    """
    world = World() if world is None else world
    row = WorldFold(world).row
    for page in store.read_rows(after_seq=after_seq, until_seq=until_seq, until=until):
        for seq, stream_id, version, type_name, schema_version, raw in page:
            row(seq, stream_id, version, type_name, schema_version, raw)
        if on_page is not None:
            on_page(page)
    return world


class Folded(IntEnum):
    """What :meth:`WorldFold.row` did with a row."""

    APPLIED = 0  # folded into its stream's model
    SKIPPED = 1  # of a lifecycle stream, not folded (listed in ``World.unknown``)
    DAMAGED = 2  # unreadable (listed in ``World.damaged``)
    OTHER = 3  # of a stream of no lifecycle (counted in ``World.other``)


# module constants: an enum member's lookup through its class costs on every row
_APPLIED, _SKIPPED, _DAMAGED, _OTHER = Folded.APPLIED, Folded.SKIPPED, Folded.DAMAGED, Folded.OTHER


class WorldFold:
    """Folds raw log rows, one at a time and in seq order, into a :class:`World`.

    The one fold of the lifecycle streams: :func:`replay` pages the log through it, and the
    post-mortem's runtime state (:func:`hostler.postmortem.runtime_state.fold_rows`) folds its
    rows through it too. It keeps, per stream, its model and, per (type, schema version), a
    typed decoder.
    """

    def __init__(self, world: World) -> None:
        self.world = world
        # Per stream: its model and the event classes its lifecycle folds (None: no lifecycle).
        self._streams: dict[str, tuple[LifecycleModel, frozenset[type[Event]]] | None] = {}
        # Per (type, schema version): a typed decoder from the payload's JSON text, or None.
        self._decoders: dict[tuple[str, int], Callable[[Any], Any] | None] = {}

    def row(  # noqa: PLR0917 - a row's columns, in the order read_rows gives them
        self,
        seq: int,
        stream_id: str,
        version: Any,
        type_name: str,
        schema_version: Any,
        raw: Any,
    ) -> Folded:
        """Fold one row ``(seq, stream_id, version, type, schema_version, payload)``."""
        world = self.world
        world.last_seq = seq
        world.events += 1
        target = self._streams.get(stream_id, _UNSEEN)
        if target is _UNSEEN:
            target = self._streams[stream_id] = _model_for(world, stream_id)
        if target is None:
            world.other += 1
            return _OTHER
        key = (type_name, schema_version)
        typed = self._decoders.get(key, _UNSEEN)
        if typed is _UNSEEN:
            typed = self._decoders[key] = _typed(type_name, schema_version)
        event = None if typed is None else _fast_event(typed, raw)
        if event is None:
            # an old schema to upcast, an unknown type, a misfit, a damaged row: slow path
            event = _slow_event(type_name, schema_version, version, raw)
        if isinstance(event, str) or version.__class__ is not int:
            _damaged(world, target[0], seq, version, event)
            return _DAMAGED
        if not fold_step(target[0], version, event, target[1]):
            world.unknown.append(seq)
            return _SKIPPED
        return _APPLIED


_UNSEEN: Any = object()
# A typed decode fails with these when the payload must take decode()'s path: a misfit
# (ValidationError), or a payload some PostgreSQL drivers decoded already (TypeError).
_SLOW = (TypeError, msgspec.ValidationError)


def _fast_event(typed: Callable[[Any], Any], raw: Any) -> Event | UnknownEvent | str | None:
    """The typed decode's event, why the row is damaged, or None to take the slow path."""
    try:
        event: Event | UnknownEvent = typed(raw)
    except _SLOW:
        return None  # a misfit, or a payload the driver decoded already
    except msgspec.DecodeError:
        return "payload is not JSON"
    except RecursionError:
        return "payload nests too deep to read"
    return event


def _damaged(world: World, model: LifecycleModel, seq: int, version: Any, why: Any) -> None:
    """Note a row that cannot be folded; a readable version still takes its place."""
    if version.__class__ is int:
        model.version = version
        world.damaged.append((seq, str(why)))
    else:
        world.damaged.append((seq, "version is not a whole number"))


def _slow_event(
    type_name: str, schema_version: Any, version: Any, raw: Any
) -> Event | UnknownEvent | str:
    """The slow path's event (upcast, unknown, misfit), or why the row cannot be folded."""
    if type(version) is not int or type(schema_version) is not int:
        return "version or schema version is not a whole number"
    try:
        decoded: object = payload_of(raw)
    except (msgspec.DecodeError, TypeError):
        return "payload is not JSON"
    except RecursionError:
        return "payload nests too deep to read"
    if not isinstance(decoded, dict):
        return "payload is not a JSON object"
    return decode(type_name, schema_version, decoded)


def _typed(type_name: str, schema_version: int) -> Callable[[Any], Any] | None:
    cls = event_class(type_name)
    if cls is None or schema_version != cls.SCHEMA_VERSION:
        return None
    decoder = typed_decoder(cls)
    return None if decoder is None else decoder.decode


def _model_for(
    world: World, stream_id: str
) -> tuple[LifecycleModel, frozenset[type[Event]]] | None:
    slash = stream_id.find("/") + 1
    cls = _BY_PREFIX.get(stream_id[:slash]) if slash else None
    if cls is None:
        return None
    key = stream_id[slash:]
    model = world.models[cls].setdefault(key, cls(key))
    return model, cls.SPEC.event_types


def load(store: EventStore, cls: type[M], key: str, *, until_version: int | None = None) -> M:
    """One model rebuilt from its own stream (a new model if the stream is empty).

    Folded with :func:`~hostler.events.fold.fold`, as :func:`replay` folds it: the model's
    ``version`` is its stream's last version, whatever that event was.
    """
    model = cls(key)
    records = store.read_stream(model.stream_id, until_version=until_version)
    return fold(model, records, accepts=cls.SPEC.event_types)


def commit(
    store: EventStore, model: LifecycleModel, *, metadata: Mapping[str, Any] | None = None
) -> AppendResult | None:
    """Append a model's pending events at its known version; clear them on success.

    Returns None when nothing was pending. On :class:`~hostler.errors.ConcurrencyError` the
    pending events stay, and the caller should :func:`load` the model again and re-decide.
    """
    if not model.pending:
        return None
    result = store.append(
        model.stream_id, model.pending, expected_version=model.version, metadata=metadata
    )
    model.version = result.version
    model.pending.clear()
    return result
